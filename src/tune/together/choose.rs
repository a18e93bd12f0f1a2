//! Which layers each resident model gets: every combination of the
//! members' settings whose priced memory fits the shared cap, ranked by
//! the weighted time a generated token takes (each member's share of
//! requests over its speed, the speed between measured settings read off
//! its time-per-token line). Pure: curves in, ranked sets out.

/// One member as the choice sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// Its share of requests.
    pub weight: f64,
    /// Settings it may take, each with its priced device bytes.
    pub priced: Vec<(u32, u64)>,
    /// Measured speeds alone: (ngl, tg t/s).
    pub measured: Vec<(u32, f64)>,
}

impl Member {
    /// Seconds per generated token at `ngl`: measured there, or on the
    /// line between the measured settings around it (`None` outside them).
    #[must_use]
    pub fn s_per_token(&self, ngl: u32) -> Option<f64> {
        let mut pts: Vec<(u32, f64)> =
            self.measured.iter().filter(|(_, t)| *t > 0.0).map(|&(n, t)| (n, 1.0 / t)).collect();
        pts.sort_by_key(|p| p.0);
        if let Some(&(_, s)) = pts.iter().find(|p| p.0 == ngl) {
            return Some(s);
        }
        let w = pts.windows(2).find(|w| w[0].0 < ngl && ngl < w[1].0)?;
        let f = f64::from(ngl - w[0].0) / f64::from(w[1].0 - w[0].0);
        Some(w[0].1 + f * (w[1].1 - w[0].1))
    }
}

/// A set of settings, one per member.
#[derive(Debug, Clone, PartialEq)]
pub struct Set {
    pub ngls: Vec<u32>,
    pub bytes: u64,
    /// Weighted seconds per generated token.
    pub s_per_token: f64,
}

/// The weighted seconds per token of `times` (one per member).
#[must_use]
pub fn weighted(weights: &[f64], times: &[f64]) -> f64 {
    weights.iter().zip(times).map(|(w, t)| w * t).sum()
}

/// Every set under `cap` whose members' speeds are known there, fastest
/// first (fewer bytes first among equals).
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn ranked(members: &[Member], cap: f64) -> Vec<Set> {
    let mut sets = vec![Set { ngls: Vec::new(), bytes: 0, s_per_token: 0.0 }];
    for m in members {
        let mut next = Vec::new();
        for s in &sets {
            for &(n, b) in &m.priced {
                let Some(t) = m.s_per_token(n) else { continue };
                let bytes = s.bytes + b;
                if bytes as f64 > cap {
                    continue;
                }
                let mut ngls = s.ngls.clone();
                ngls.push(n);
                next.push(Set { ngls, bytes, s_per_token: s.s_per_token + m.weight * t });
            }
        }
        sets = next;
    }
    sets.sort_by(|a, b| a.s_per_token.total_cmp(&b.s_per_token).then(a.bytes.cmp(&b.bytes)));
    sets
}

/// Why a member got its layers, in words: `alone` is what it measured
/// alone (ngl, tg t/s), `others` the models it shares the cap with.
#[must_use]
pub fn why(ngl: u32, full: u32, weight: f64, alone: &[(u32, f64)], others: &[String]) -> String {
    let share = format!("{:.0}% of requests", weight * 100.0);
    let ends = (alone.iter().find(|a| a.0 == 0), alone.iter().filter(|a| a.0 > 0).max_by_key(|a| a.0));
    let slower = match ends {
        (Some(z), Some(m)) if m.1 <= z.1 => {
            Some(format!("offloading is slower here (alone: {:.2} t/s at ngl 0, {:.2} at ngl {})", z.1, m.1, m.0))
        }
        _ => None,
    };
    match (ngl, slower) {
        (n, _) if n >= full => format!("fully on the GPU: {share}"),
        (0, Some(why)) => format!("on the CPU: {why}; {share}"),
        (0, None) => format!(
            "on the CPU: {share}; the cap goes to {}, whose layers save more weighted time a byte",
            others.join(", ")
        ),
        (n, _) => format!("{n} of {full} layers on the GPU: {share}; what the cap leaves beside {}", others.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// A model of `layers` layers (`per_layer` GiB each) whose time per
    /// token falls on a line from 1/`cpu` at ngl 0 to 1/`gpu` at full.
    fn member(weight: f64, layers: u32, per_layer: f64, (cpu, gpu): (f64, f64)) -> Member {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let priced = (0..=layers).map(|n| (n, (per_layer * f64::from(n) * GIB as f64) as u64)).collect();
        Member { weight, priced, measured: vec![(0, cpu), (layers, gpu)] }
    }

    #[allow(clippy::cast_precision_loss)]
    fn best(weights: (f64, f64)) -> Vec<u32> {
        // A small model (10 layers of 0.1 GiB, 50 -> 200 t/s) and a large
        // one (30 layers of 0.2 GiB, 5 -> 30 t/s) under one 4 GiB cap.
        let small = member(weights.0, 10, 0.1, (50.0, 200.0));
        let large = member(weights.1, 30, 0.2, (5.0, 30.0));
        ranked(&[small, large], 4.0 * GIB as f64).remove(0).ngls
    }

    #[test]
    fn the_small_high_demand_model_gets_full_offload_and_the_large_one_the_rest() {
        // 80% of requests to the small one: its layers save more weighted time a byte.
        assert_eq!(best((0.8, 0.2)), [10, 15], "1 GiB for the small one, 3 GiB (15 layers) for the large");
        // Equal shares: the large model's layers save more a byte; it takes the whole cap.
        assert_eq!(best((0.5, 0.5)), [0, 20]);
    }

    #[test]
    fn a_set_over_the_cap_or_outside_the_measured_speeds_is_never_ranked() {
        let a = member(0.5, 10, 0.1, (50.0, 200.0));
        let mut b = member(0.5, 10, 0.1, (50.0, 200.0));
        b.measured = vec![(0, 50.0), (4, 100.0)];
        #[allow(clippy::cast_precision_loss)]
        let sets = ranked(&[a, b], 1.2 * GIB as f64);
        assert!(!sets.is_empty());
        #[allow(clippy::cast_precision_loss)]
        let cap = 1.2 * GIB as f64;
        assert!(sets.iter().all(|s| s.bytes as f64 <= cap && s.ngls[1] <= 4), "{:?}", &sets[..3]);
        let t = Member { weight: 1.0, priced: Vec::new(), measured: vec![(0, 10.0), (10, 20.0)] };
        assert!((t.s_per_token(5).unwrap() - 0.075).abs() < 1e-12, "halfway along the time line");
        assert_eq!(t.s_per_token(11), None);
    }
}
