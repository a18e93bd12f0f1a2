//! Each device's speed: the default splits the search measured, one probe
//! per device, the speed model solved from them, and the splits it predicts
//! fastest.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Splits the search measures at most, by their predicted speed: the
/// fastest predicted where it is predicted faster than every split
/// measured (probes, llama.cpp's default), then the next only where, with
/// the boundary cost the first gives, it still is.
pub const MEASURED_BY_SPEED: usize = 2;

/// The rates of a trial (tg, pp), where it ran.
pub(in crate::tune) fn rates(t: &crate::profile::ProfileTrial) -> (Option<f64>, Option<f64>) {
    (t.result.test(false).map(|x| x.avg_ts), t.result.test(true).map(|x| x.avg_ts))
}

/// Layers per device of a split llama.cpp chose itself (its default, by
/// free memory), told by what each device allocated: its bytes less its
/// fixed cost, over its cost per layer, rounded, the rounding put right
/// on the device with the most.
pub(super) fn layers_by_bytes(acc: &[u64], cost: &[DeviceCost], ngl: u32, full: u32) -> Option<Vec<u32>> {
    if acc.len() != cost.len() || cost.iter().any(|c| c.per_layer <= 0.0) {
        return None;
    }
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let mut layers: Vec<u32> = acc
        .iter()
        .zip(cost)
        .map(|(b, c)| {
            let fixed = if ngl >= full { c.fixed_full } else { c.fixed_partial };
            if *b == 0 {
                0
            } else {
                ((*b as f64 - fixed) / c.per_layer).round().clamp(0.0, f64::from(ngl)) as u32
            }
        })
        .collect();
    let most = (0..layers.len()).max_by_key(|i| layers[*i])?;
    let sum: u32 = layers.iter().sum();
    layers[most] = (layers[most] + ngl).saturating_sub(sum);
    (layers.iter().sum::<u32>() == ngl).then_some(layers)
}

/// llama.cpp's default split at each ngl the search measured with layers
/// on the devices, as measured splits (their layers by their bytes).
pub(super) fn default_splits(search: &Search<'_>, devs: &[DeviceCap], cost: &[DeviceCost], full: u32) -> Vec<Measured> {
    search
        .trials
        .iter()
        .filter(|t| t.is_search() && t.result.status == TrialStatus::Ok)
        .filter(|t| t.result.spec.placement.n_gpu_layers > 0 && t.result.spec.placement.tensor_split.is_empty())
        .filter_map(|t| {
            let ngl = t.result.spec.placement.n_gpu_layers;
            let layers = layers_by_bytes(&accounted(&t.result, devs), cost, ngl, full)?;
            let (tg, pp) = rates(t);
            Some(Measured { split: Split::new(&layers), tg_ts: tg?, pp_ts: pp })
        })
        .collect()
}

/// Each device's speed ([`SpeedModel::solve`]): one probe per device,
/// that device alone with as many layers as its cap holds (priced under
/// every cap first; a measured option of its own), except the one solved
/// from llama.cpp's default split as the search measured it: the device
/// that split gave most layers after its leader (the device it gave most,
/// a quarter or more). Where `--ngl` offloads every layer and each probed
/// device holds them all, the probes are full offloads (candidates
/// themselves) and the costs absolute: no trial with every layer on the
/// CPU. Else the probes leave the rest on the CPU, and every layer on the
/// CPU is the reference (the search's trial, else one now). The default
/// splits the solve did not use give the boundary cost.
pub(super) fn probe_speeds(
    search: &mut Search<'_>,
    inp: &SplitInputs<'_>,
    (full_cap, partial_cap): (&[u32], &[u32]),
    (cost, defaults): (&[DeviceCost], &[Measured]),
    found: &mut SplitFound,
) -> Result<Option<(SpeedModel, Vec<Split>)>> {
    let (devs, full, threads) = (inp.devs, inp.full, inp.threads);
    let n = devs.len();
    let s = search.settings();
    let fixed_full = s.policy.grid.as_ref().filter(|g| g.len() == 1).is_some_and(|g| g[0] >= full);
    let leader = |m: &Measured| {
        let l = m.split.layers();
        let d = (0..l.len()).max_by_key(|i| l[*i])?;
        (l[d] * 4 >= l.iter().sum::<u32>()).then_some((d, *m))
    };
    let lead = defaults.iter().filter_map(leader).max_by_key(|(_, m)| m.split.layers().iter().sum::<u32>());
    let solved = lead.and_then(|(l, m)| {
        let x = m.split.layers();
        (0..n).filter(|d| *d != l && x[*d] > 0 && partial_cap[*d] > 0).max_by_key(|d| x[*d]).map(|d| (d, m))
    });
    let probed: Vec<usize> = (0..n).filter(|d| partial_cap[*d] > 0 && solved.map(|(u, _)| u) != Some(*d)).collect();
    let absolute = fixed_full && probed.iter().all(|d| full_cap[*d] >= full);
    // The all-CPU rates (tg, pp) the costs are relative to; none: absolute.
    let cpu = if absolute {
        None
    } else {
        let cpu = match all_cpu(&search.trials, threads) {
            Some(t) => rates(t),
            None => rates(search.measure(Role::Split, Candidate::layers(0, threads), None)?),
        };
        if cpu.0.is_none_or(|v| v <= 0.0) {
            return Ok(None);
        }
        Some(cpu)
    };
    let mut equations: Vec<Measured> = solved.iter().map(|(_, m)| *m).collect();
    let todo: Vec<Labelled> = probed
        .iter()
        .map(|&d| {
            let mut layers = vec![0; n];
            if absolute {
                layers[d] = full;
                (format!("probe: {} alone", devs[d].device), Split::new(&layers))
            } else {
                layers[d] = partial_cap[d].min(full.saturating_sub(1)).max(1);
                (format!("probe: {} alone, the rest on the CPU", devs[d].device), Split::new(&layers))
            }
        })
        .collect();
    let priced = price_all(todo, &mut |x: &[Split]| super::dry_run(search, x), devs, cost);
    for (label, split, p) in priced {
        let ngl: u32 = split.layers().iter().sum();
        let c = Candidate { split, ..Candidate::layers(ngl, threads) };
        let race = search.race();
        let mut t = search.measure(Role::Split, c, Some(race))?;
        if t.result.status == TrialStatus::Crashed && !inp.rpc.is_empty() {
            // A server that crashed is back (rpc-server restarts it): once more.
            t = search.measure(Role::Split, c, Some(race))?;
        }
        // A probe that failed again says nothing of the device's speed.
        if let (Some(tg), pp) = rates(t) {
            if t.result.status == TrialStatus::Ok {
                equations.push(Measured { split, tg_ts: tg, pp_ts: pp });
            }
        }
        found.options.push(option_of(&label, &split, per_device(&p, devs), Some(t), s, inp));
    }
    let solved_model = solve(cpu, &equations, inp);
    let Some(mut model) = solved_model else { return Ok(None) };
    let others: Vec<Measured> =
        defaults.iter().filter(|m| solved.is_none_or(|(_, s)| s.split != m.split)).copied().collect();
    model.fit_crossings(&others);
    Ok(Some((model, equations.iter().map(|m| m.split).collect())))
}

/// The search's trial with every layer on the CPU with `threads` threads,
/// measured to the end.
pub(in crate::tune) fn all_cpu(
    trials: &[crate::profile::ProfileTrial],
    threads: u32,
) -> Option<&crate::profile::ProfileTrial> {
    trials.iter().find(|t| {
        let p = &t.result.spec.placement;
        t.result.status == TrialStatus::Ok
            && p.n_gpu_layers == 0
            && p.n_threads == threads
            && p.n_cpu_moe == 0
            && p.n_cpu_ffn == 0
            && t.result.test(false).is_some_and(|x| !x.stopped_early)
    })
}

/// Each device's speed from the measured splits, against the all-CPU
/// rates (tg, pp) where given, else absolute; each link's cost taken off.
pub(super) fn solve(
    cpu: Option<(Option<f64>, Option<f64>)>,
    equations: &[Measured],
    inp: &SplitInputs<'_>,
) -> Option<SpeedModel> {
    let shape = (inp.devs.len(), inp.output_layers);
    match cpu {
        Some(rates) => SpeedModel::solve(rates, equations, shape, &inp.links),
        None => SpeedModel::solve_from(0.0, Some(0.0), equations, shape, &inp.links),
    }
}
