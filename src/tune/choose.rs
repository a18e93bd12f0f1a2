//! The decision, a pure function of measured points: the largest ngl under
//! the memory cap, the best setting for the objective under it (any integer,
//! not only grid points), the knee, and the reasons in words.

use serde::{Deserialize, Serialize};

use super::knee::kneedle;
use crate::curve::Curve;
use crate::model::human_bytes;
use crate::types::{Decision, Fits, Knee, Objective, Point, Scoring};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inputs {
    pub points: Vec<Point>,
    /// ngl of full offload (n_layer + 1).
    pub full: u32,
    /// Memory cap in the same currency as `Point::mem`.
    pub cap: f64,
    pub objective: Objective,
    pub n_prompt: u32,
    pub n_gen: u32,
    /// Name of the offload device, for the reasons ("Vulkan0 (llvmpipe)").
    pub device: String,
    /// `--max-power`: the GPUs' mean power a setting may draw (W).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_power_w: Option<f64>,
}

impl Inputs {
    /// What this decision's scores weigh.
    #[must_use]
    pub fn scoring(&self) -> Scoring {
        Scoring { objective: self.objective, n_prompt: self.n_prompt, n_gen: self.n_gen }
    }
}

/// The models of one decision and what follows from them for any ngl.
struct Fitted<'a> {
    inp: &'a Inputs,
    tg_time: Curve,
    pp_time: Curve,
    mem: Curve,
    /// Watts against ngl: all measured, and the GPUs' (`--max-power`).
    watts: Curve,
    gpu_watts: Curve,
    first_oom: Option<u32>,
}

impl Fitted<'_> {
    fn mem_at(&self, ngl: u32) -> Option<f64> {
        self.mem.extrapolate(ngl)
    }

    /// Under the cap (measured or fitted memory; at or above an OOM: no).
    fn under(&self, ngl: u32) -> Option<bool> {
        if self.first_oom.is_some_and(|o| ngl >= o) {
            return Some(false);
        }
        match self.mem_at(ngl) {
            Some(m) => Some(m <= self.inp.cap),
            // No layer on the device and measured: its weights stay on the host.
            None if ngl == 0 && self.inp.points.iter().any(|p| p.ngl == 0 && p.ok) => Some(true),
            None => None,
        }
    }

    fn tg(&self, n: u32) -> Option<f64> {
        self.tg_time.predict(n).filter(|t| *t > 0.0).map(|t| 1.0 / t)
    }

    fn pp(&self, n: u32) -> Option<f64> {
        self.pp_time.predict(n).filter(|t| *t > 0.0).map(|t| 1.0 / t)
    }

    /// Over `--max-power` by its measured (or interpolated) GPU power.
    fn over_power(&self, n: u32) -> bool {
        self.inp.max_power_w.is_some_and(|max| self.gpu_watts.predict(n).is_some_and(|w| w > max))
    }

    fn score_at(&self, n: u32) -> Option<f64> {
        let i = self.inp;
        i.scoring().with_power((self.tg(n), self.pp(n)), self.watts.predict(n))
    }

    /// The best setting for the objective up to `max`, any integer ngl;
    /// ties go to fewer layers (less memory).
    fn best(&self, max: Option<u32>) -> Option<(u32, f64)> {
        let mut best: Option<(u32, f64)> = None;
        for n in 0..=max? {
            if self.under(n) != Some(true) || self.over_power(n) {
                continue;
            }
            let Some(s) = self.score_at(n) else { continue };
            if best.is_none_or(|(_, b)| s > b * (1.0 + 1e-9)) {
                best = Some((n, s));
            }
        }
        best
    }

    /// Where the data do not follow the model, in words.
    fn fit_notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if let Some(f) = &self.tg_time.fit {
            if f.slope > 0.0 {
                notes.push(format!(
                    "offloading makes generation slower here: each layer moved to {} adds {:.2} ms per token",
                    self.inp.device,
                    f.slope * 1e3
                ));
            }
            if f.n >= 3 && f.r2 < 0.9 {
                notes.push(format!(
                    "time per token does not follow a straight line in ngl (R² {:.2}); the measured points decide, not the fit",
                    f.r2
                ));
            }
        }
        if let Some(f) = &self.mem.fit {
            if f.n >= 3 && f.max_rel_residual() > 0.05 {
                notes.push(format!(
                    "device memory is not linear in ngl (largest residual {:.0}%); predictions between grid points are rough",
                    f.max_rel_residual() * 100.0
                ));
            }
        }
        notes
    }

    /// The knee among measured settings under the cap (throughput against
    /// memory), and what the layers past it buy, in words.
    fn knee(&self, ok: &[&Point], best: Option<(u32, f64)>) -> (Option<Knee>, String) {
        let mut pts: Vec<(f64, f64, u32)> = ok
            .iter()
            .filter(|p| self.under(p.ngl) == Some(true))
            .filter_map(|p| Some((p.mem?, measured_score(self.inp, p)?, p.ngl)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let xy: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, p.1)).collect();
        let increasing = xy.len() >= 2 && xy[xy.len() - 1].1 > xy[0].1;
        let knee = if increasing { kneedle(&xy) } else { None }.map(|i| Knee {
            ngl: pts[i].2,
            tg: ok.iter().find(|p| p.ngl == pts[i].2).and_then(|p| p.tg).unwrap_or(0.0),
            mem: pts[i].0,
        });
        let obj = self.inp.objective.as_str();
        let note = match (&knee, best) {
            (Some(k), Some((bn, bs))) if bn > k.ngl => {
                let ks = pts.iter().find(|p| p.2 == k.ngl).map_or(0.0, |p| p.1);
                let extra = self.mem_at(bn).unwrap_or(k.mem) - k.mem;
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let extra = human_bytes(extra.max(0.0) as u64);
                format!(
                    "knee at ngl {}: the {} layers past it buy {:+.0}% {obj} for {extra} more device memory",
                    k.ngl,
                    bn - k.ngl,
                    (bs / ks - 1.0) * 100.0
                )
            }
            (Some(k), _) => format!("knee at ngl {}: layers past it pay less per byte", k.ngl),
            (None, _) if !increasing && pts.len() >= 2 => {
                "no knee: offloading more layers does not raise throughput here".to_string()
            }
            (None, _) if pts.len() < 3 => "no knee: too few settings under the cap to find one".to_string(),
            (None, _) => {
                "no knee below the cap: every layer offloaded helps at least as much as the last (convex curve)"
                    .to_string()
            }
        };
        (knee, note)
    }
}

/// A measured point's objective value (its own power for `energy`).
fn measured_score(i: &Inputs, p: &Point) -> Option<f64> {
    i.scoring().with_power((p.tg, p.pp), p.power.map(|w| w.total()))
}

/// Why this setting, in two or three lines.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn reasons(m: &Fitted<'_>, d: &Decision, ok: &[&Point], best_offload: Option<(u32, f64)>) -> Vec<String> {
    let (inp, rec, full) = (m.inp, d.recommended_ngl, m.inp.full);
    let bytes = |v: Option<f64>| v.map_or("?".into(), |v| human_bytes(v.max(0.0) as u64));
    let speed = |v: Option<f64>| v.map_or("?".into(), |v| format!("{v:.2} t/s"));
    if d.offload_hurts {
        let (bn, _) = best_offload.unwrap_or((0, 0.0));
        let tg = |n: u32| ok.iter().find(|p| p.ngl == n).and_then(|p| p.tg).unwrap_or(0.0);
        return vec![
            format!(
                "ngl 0: offloading to {} is slower than the CPU here (tg {:.2} t/s at ngl 0, {:.2} t/s at ngl {bn}, the best offloaded setting)",
                inp.device,
                tg(0),
                tg(bn)
            ),
            "keep every layer on the CPU; a faster GPU or a newer driver may change this, so re-tune then".to_string(),
        ];
    }
    let cap_s = human_bytes(inp.cap.max(0.0) as u64);
    let Some(max) = d.max_ngl_under_cap else {
        let zero_over = inp.points.iter().any(|p| p.ngl == 0 && p.mem.is_some_and(|m| m > inp.cap));
        let even = if zero_over { "; even ngl 0 needs more" } else { "" };
        return vec![format!("nothing measured fits under the {cap_s} cap{even}")];
    };
    let what = if d.needs_confirmation { "predicted" } else { "measured" };
    let mut r = vec![format!(
        "ngl {rec}: best {} under the {cap_s} cap ({what} tg {}, pp {}, device memory {})",
        inp.objective.as_str(),
        speed(d.predicted_tg),
        speed(d.predicted_pp),
        bytes(d.predicted_mem),
    )];
    if max >= full && rec == full {
        r.push("everything fits: full offload, output layer included".to_string());
    } else if max < full {
        r.push(format!(
            "ngl {max} is the most that fits under the cap; full offload (ngl {full}) needs {}",
            m.mem_at(full).map_or("more than the cap".into(), |v| human_bytes(v.max(0.0) as u64))
        ));
    }
    r
}

/// Where `--max-power` binds, in words: from which ngl the GPUs draw more.
fn power_reason(m: &Fitted<'_>, max: Option<u32>) -> Option<String> {
    let w = m.inp.max_power_w?;
    let n = (0..=max.unwrap_or(m.inp.full)).find(|n| m.over_power(*n))?;
    Some(format!("--max-power {w} W: the GPUs draw more from ngl {n} (measured, or between measured settings)"))
}

/// The decision: the best setting under the cap for the objective (any
/// integer ngl, predicted where not measured), the knee, and why.
#[must_use]
pub fn decide(inp: &Inputs) -> Decision {
    let (tg_time, pp_time, mem) = Point::curves(&inp.points, inp.full);
    let (watts, gpu_watts) = Point::power_curves(&inp.points, inp.full);
    let first_oom = inp.points.iter().filter(|p| p.oom).map(|p| p.ngl).min();
    let m = Fitted { inp, tg_time, pp_time, mem, watts, gpu_watts, first_oom };
    let max_ngl_under_cap = (0..=inp.full).rev().find(|n| m.under(*n) == Some(true));
    let over_cap: Vec<u32> = inp.points.iter().map(|p| p.ngl).filter(|n| m.under(*n) == Some(false)).collect();
    let best = m.best(max_ngl_under_cap);

    let ok: Vec<&Point> = inp.points.iter().filter(|p| p.ok).collect();
    let zero = ok.iter().find(|p| p.ngl == 0).and_then(|p| measured_score(inp, p));
    let best_offload = ok
        .iter()
        .filter(|p| p.ngl > 0)
        .filter_map(|p| measured_score(inp, p).map(|s| (p.ngl, s)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    // Slower offloaded: a speed's verdict (energy's best may be ngl 0 for its own reason).
    let offload_hurts =
        !inp.objective.weighs_power() && matches!((zero, best_offload), (Some(z), Some((_, b))) if b < z);
    let (rec, needs_confirmation) = match best {
        _ if offload_hurts => (0, false),
        Some((n, _)) => (n, m.tg_time.measured_at(n).is_none() && m.pp_time.measured_at(n).is_none()),
        None => (0, false),
    };
    let (knee, knee_note) = m.knee(&ok, best);
    let mut d = Decision {
        recommended_ngl: rec,
        needs_confirmation,
        max_ngl_under_cap,
        predicted_tg: m.tg(rec),
        predicted_pp: m.pp(rec),
        predicted_mem: m.mem_at(rec),
        over_cap,
        knee,
        knee_note,
        offload_hurts,
        fits: Fits { tg_time: m.tg_time.fit.clone(), pp_time: m.pp_time.fit.clone(), memory: m.mem.fit.clone() },
        fit_notes: m.fit_notes(),
        reasons: Vec::new(),
    };
    d.reasons = reasons(&m, &d, &ok, best_offload);
    d.reasons.extend(power_reason(&m, max_ngl_under_cap));
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

    /// llama-bench README, 7B Q4_0 (35 layers with output): tg at ngl 10/20/30/34/35,
    /// memory 0.5 GiB + 0.1 GiB per layer.
    fn readme_points() -> Vec<Point> {
        [(10, 13.45), (20, 21.36), (30, 40.04), (34, 71.76), (35, 131.66)]
            .iter()
            .map(|&(n, tg)| Point {
                ngl: n,
                ok: true,
                oom: false,
                tg: Some(tg),
                pp: None,
                mem: Some(mem(n)),
                power: None,
            })
            .collect()
    }

    fn mem(ngl: u32) -> f64 {
        0.5 * GIB + 0.1 * GIB * f64::from(ngl)
    }

    fn inputs(points: Vec<Point>, cap: f64) -> Inputs {
        Inputs {
            points,
            full: 35,
            cap,
            objective: Objective::Tg,
            n_prompt: 512,
            n_gen: 128,
            device: "CUDA0".into(),
            max_power_w: None,
        }
    }

    #[test]
    fn energy_picks_fewer_layers_where_power_grows_faster_than_speed_and_max_power_caps_the_gpu() {
        // tg 10, 30, 40 t/s at ngl 0, 20, 35; the GPUs draw 100, 150, 400 W:
        // 0.10, 0.20, 0.10 tokens per joule.
        let pts: Vec<Point> = [(0, 10.0, 100.0), (20, 30.0, 150.0), (35, 40.0, 400.0)]
            .iter()
            .map(|&(n, tg, w)| Point {
                ngl: n,
                ok: true,
                oom: false,
                tg: Some(tg),
                pp: None,
                mem: Some(mem(n)),
                power: Some(crate::types::Power { gpu_w: Some(w), cpu_w: None }),
            })
            .collect();
        let mut i = inputs(pts, 80.0 * GIB);
        assert_eq!(decide(&i).recommended_ngl, 35, "tg: full offload");
        i.objective = Objective::Energy;
        let d = decide(&i);
        assert_eq!(d.recommended_ngl, 20, "energy: fewer layers");
        assert!(!d.offload_hurts && !d.needs_confirmation);
        // --max-power 310: the GPU power line (150 W at 20, 400 at 35) passes it after ngl 29.
        i.objective = Objective::Tg;
        i.max_power_w = Some(310.0);
        let d = decide(&i);
        assert_eq!(d.recommended_ngl, 29, "the most tg under 310 W");
        assert!(d.needs_confirmation, "29 was not measured: it is confirmed first");
        assert!(
            d.reasons.iter().any(|r| r.contains("--max-power 310 W: the GPUs draw more from ngl 30")),
            "{:?}",
            d.reasons
        );
        // Without power readings energy scores nothing: no offloaded setting is chosen for it.
        let mut bare = inputs(readme_points(), 80.0 * GIB);
        bare.objective = Objective::Energy;
        assert_eq!(decide(&bare).recommended_ngl, 0);
    }

    #[test]
    fn everything_fits_means_full_offload() {
        let d = decide(&inputs(readme_points(), 80.0 * GIB));
        assert_eq!(d.recommended_ngl, 35);
        assert!(!d.needs_confirmation);
        assert_eq!(d.max_ngl_under_cap, Some(35));
        assert!(d.over_cap.is_empty());
        assert!(!d.offload_hurts);
        assert!(d.reasons[1].contains("full offload"), "{:?}", d.reasons);
    }

    #[test]
    fn cap_between_grid_points_picks_an_unmeasured_setting_to_confirm() {
        // 3.75 GiB fits ngl <= 32 (0.5 + 3.2 = 3.7 GiB), not 33.
        let d = decide(&inputs(readme_points(), 3.75 * GIB));
        assert_eq!(d.max_ngl_under_cap, Some(32));
        assert_eq!(d.recommended_ngl, 32);
        assert!(d.needs_confirmation, "32 was not measured");
        assert_eq!(d.over_cap, vec![34, 35]);
        let tg = d.predicted_tg.unwrap();
        assert!(tg > 40.04 && tg < 71.76, "predicted between its neighbours: {tg}");
        assert!(d.predicted_mem.unwrap() <= 3.75 * GIB);
        assert!(d.reasons[1].contains("ngl 32 is the most that fits"), "{:?}", d.reasons);
    }

    #[test]
    fn cap_on_a_grid_point_picks_it_measured() {
        let d = decide(&inputs(readme_points(), mem(30) + 1.0));
        assert_eq!(d.recommended_ngl, 30);
        assert!(!d.needs_confirmation);
        let d = decide(&inputs(readme_points(), mem(20) + 1.0));
        assert_eq!(d.recommended_ngl, 20);
    }

    #[test]
    fn ngl_0_measured_without_device_memory_fits_when_every_offloaded_trial_failed() {
        let pts = vec![
            Point { ngl: 0, ok: true, oom: false, tg: Some(40.0), pp: Some(400.0), mem: None, power: None },
            Point { ngl: 19, ok: false, oom: false, tg: None, pp: None, mem: None, power: None },
        ];
        let d = decide(&inputs(pts, 1.0 * GIB));
        assert_eq!((d.max_ngl_under_cap, d.recommended_ngl), (Some(0), 0));
        assert!(d.reasons.iter().all(|r| !r.contains("even ngl 0 needs more")), "{:?}", d.reasons);
    }

    #[test]
    fn nothing_fits() {
        let d = decide(&inputs(readme_points(), 0.1 * GIB));
        assert_eq!(d.max_ngl_under_cap, None);
        assert_eq!(d.recommended_ngl, 0);
        assert!(d.reasons[0].contains("nothing measured fits"), "{:?}", d.reasons);
    }

    #[test]
    fn convex_readme_curve_has_no_knee() {
        let d = decide(&inputs(readme_points(), 80.0 * GIB));
        assert!(d.knee.is_none());
        assert!(d.knee_note.starts_with("no knee below the cap"), "{}", d.knee_note);
    }

    #[test]
    fn concave_curve_gets_its_knee_and_what_past_it_buys() {
        let pts: Vec<Point> = [(0, 10.0), (10, 40.0), (20, 60.0), (30, 64.0), (35, 66.0)]
            .iter()
            .map(|&(n, tg)| Point {
                ngl: n,
                ok: true,
                oom: false,
                tg: Some(tg),
                pp: None,
                mem: Some(mem(n)),
                power: None,
            })
            .collect();
        let d = decide(&inputs(pts, 80.0 * GIB));
        assert_eq!(d.recommended_ngl, 35);
        let k = d.knee.expect("concave curve has a knee");
        assert_eq!(k.ngl, 20);
        assert!(d.knee_note.contains("knee at ngl 20: the 15 layers past it buy +10% tg"), "{}", d.knee_note);
    }

    #[test]
    fn offloading_that_only_hurts_recommends_zero() {
        // llvmpipe: gemma-3-270m tg 40 t/s at ngl 0, 5.5 at ngl 10, 3 at 19.
        let pts: Vec<Point> = [(0, 40.0), (10, 5.5), (19, 3.0)]
            .iter()
            .map(|&(n, tg)| Point {
                ngl: n,
                ok: true,
                oom: false,
                tg: Some(tg),
                pp: None,
                mem: Some(f64::from(n) * 1e6),
                power: None,
            })
            .collect();
        let mut i = inputs(pts, 2.0 * GIB);
        i.full = 19;
        i.device = "Vulkan0 (llvmpipe)".into();
        let d = decide(&i);
        assert_eq!(d.recommended_ngl, 0);
        assert!(d.offload_hurts);
        assert!(!d.needs_confirmation);
        assert!(d.reasons[0].contains("offloading to Vulkan0 (llvmpipe) is slower than the CPU"), "{:?}", d.reasons);
        assert!(d.knee_note.contains("does not raise throughput"), "{}", d.knee_note);
    }

    #[test]
    fn oom_marks_that_setting_and_above_over_the_cap() {
        let mut pts = readme_points();
        pts[3] = Point { ngl: 34, ok: false, oom: true, tg: None, pp: None, mem: None, power: None };
        pts.pop();
        let d = decide(&inputs(pts, 80.0 * GIB));
        assert_eq!(d.max_ngl_under_cap, Some(33));
        assert_eq!(d.over_cap, vec![34]);
        assert_eq!(d.recommended_ngl, 30, "no speed prediction past the last measured point");
    }

    #[test]
    fn slower_with_offload_is_said_in_words() {
        let pts: Vec<Point> = [(0, 40.0), (5, 30.0), (10, 20.0), (15, 10.0)]
            .iter()
            .map(|&(n, tg)| Point {
                ngl: n,
                ok: true,
                oom: false,
                tg: Some(tg),
                pp: None,
                mem: Some(f64::from(n)),
                power: None,
            })
            .collect();
        let mut i = inputs(pts, 1e12);
        i.full = 20;
        let d = decide(&i);
        assert!(d.fit_notes.iter().any(|n| n.contains("offloading makes generation slower")), "{:?}", d.fit_notes);
    }

    #[test]
    fn mixed_and_pp_objectives() {
        // pp prefers full offload, tg is flat: mixed follows pp.
        let pts: Vec<Point> = [(0, 10.0, 100.0), (10, 10.0, 400.0), (20, 10.0, 900.0)]
            .iter()
            .map(|&(n, tg, pp)| Point {
                ngl: n,
                ok: true,
                oom: false,
                tg: Some(tg),
                pp: Some(pp),
                mem: Some(f64::from(n)),
                power: None,
            })
            .collect();
        let mut i = inputs(pts, 1e12);
        i.full = 20;
        i.objective = Objective::Pp;
        assert_eq!(decide(&i).recommended_ngl, 20);
        i.objective = Objective::Mixed;
        assert_eq!(decide(&i).recommended_ngl, 20);
        i.objective = Objective::Tg;
        assert_eq!(decide(&i).recommended_ngl, 0, "ties go to fewer layers");
    }
}
