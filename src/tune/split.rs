//! Several offload devices (local GPUs, llama.cpp RPC servers, or both):
//! how many layers each holds. llama.cpp's own split follows free memory
//! only; here each device has its own cap, llama.cpp's dry run prices
//! splits per device, and the few that can win are measured.
//!
//! The stage runs after the whole-layer search (which measured llama.cpp's
//! default split at each ngl): two dry runs give each device's cost per
//! layer and its fixed cost (compute buffer, the output layer on the last
//! device), from which each device's capacity under its cap follows. Then
//! each device's speed is probed (`super::speed`: two trials with layers on
//! that device alone), and the fastest split by those speeds is a
//! candidate beside the splits a user would try: layers in proportion to
//! what each device can hold, and the devices filled in llama.cpp's order
//! and in reverse; or, when the layers do not all fit, every device at its
//! capacity and the rest on the CPU. Each is priced exactly, trimmed a
//! layer at a time while over a cap; the two fastest predicted are
//! measured, raced against the best so far (without probes, every one).
//! The recommendation is the fastest measured split under every device's
//! cap.

use anyhow::Result;

use super::memory::DeviceCap;
use super::plan::{Candidate, Split};
use super::search::Search;
use super::speed::{Probe, SpeedModel};
use crate::engine::predict::Prediction;
use crate::profile::{DeviceShare, Recommendation, Settings, SplitOption, SplitReport};
use crate::types::{LlamaDevice, Role, TrialStatus};

/// Bytes per buffer type, in the devices' order (0 where a device has none).
fn in_device_order(by: &[(String, u64)], devs: &[DeviceCap]) -> Vec<u64> {
    devs.iter().map(|d| by.iter().find(|(n, _)| *n == d.buffer_type).map_or(0, |(_, b)| *b)).collect()
}

/// Bytes a prediction puts on each device, in the devices' order.
#[must_use]
pub fn per_device(p: &Prediction, devs: &[DeviceCap]) -> Vec<u64> {
    in_device_order(&p.per_device(), devs)
}

fn fits(bytes: &[u64], devs: &[DeviceCap]) -> bool {
    bytes.iter().zip(devs).all(|(b, d)| *b <= d.cap_bytes)
}

/// `total` layers spread over `weights` (largest remainder), each at most its weight.
#[must_use]
pub fn proportional(total: u32, weights: &[u32]) -> Vec<u32> {
    let sum: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<f64> = weights.iter().map(|w| f64::from(*w) * f64::from(total) / sum as f64).collect();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let mut out: Vec<u32> = exact.iter().map(|e| e.floor() as u32).collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|a, b| (exact[*b] - exact[*b].floor()).total_cmp(&(exact[*a] - exact[*a].floor())));
    let mut left = total.saturating_sub(out.iter().sum());
    for i in order.into_iter().cycle().take(weights.len() * 2) {
        if left == 0 {
            break;
        }
        if out[i] < weights[i] {
            out[i] += 1;
            left -= 1;
        }
    }
    out
}

/// Devices filled to their capacity one after another in `order`.
#[must_use]
pub fn fill(total: u32, capacity: &[u32], order: &[usize]) -> Vec<u32> {
    let mut out = vec![0; capacity.len()];
    let mut left = total;
    for &i in order {
        out[i] = capacity[i].min(left);
        left -= out[i];
    }
    out
}

/// What a device's share costs: weights and KV cache per layer, plus a
/// fixed part (compute buffer, the output layer on the last device) that
/// differs between full offload and partial offload (where llama.cpp's
/// compute buffers are laid out differently).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceCost {
    pub per_layer: f64,
    pub fixed_full: f64,
    pub fixed_partial: f64,
}

impl DeviceCost {
    /// Layers that fit under `cap` in one regime.
    #[must_use]
    pub fn capacity(&self, cap: u64, full_offload: bool, most: u32) -> u32 {
        let fixed = if full_offload { self.fixed_full } else { self.fixed_partial };
        #[allow(clippy::cast_precision_loss)]
        let room = cap as f64 - fixed;
        if self.per_layer <= 0.0 {
            return if room >= 0.0 { most } else { 0 };
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = (room / self.per_layer).floor().clamp(0.0, f64::from(most)) as u32;
        n
    }

    /// Layers to take off to save `over` bytes.
    #[must_use]
    pub fn layers_for(&self, over: u64) -> u32 {
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = if self.per_layer > 0.0 { (over as f64 / self.per_layer).ceil() as u32 } else { 1 };
        n.max(1)
    }
}

/// Bytes per device as (weights + KV cache, compute buffers).
#[must_use]
pub fn parts(p: &Prediction, devs: &[DeviceCap]) -> Vec<(u64, u64)> {
    devs.iter()
        .map(|d| {
            p.buffers
                .iter()
                .filter(|b| b.buffer_type == d.buffer_type)
                .fold((0, 0), |(w, c), b| (w + b.model + b.context, c + b.compute))
        })
        .collect()
}

/// Each device's cost from two dry runs: `a` at full offload and `b` at
/// partial offload, with different layer counts on every device.
#[must_use]
pub fn costs(a: (&[u32], &[(u64, u64)]), b: (&[u32], &[(u64, u64)])) -> Vec<DeviceCost> {
    (0..a.0.len())
        .map(|d| {
            let (la, lb) = (f64::from(a.0[d]), f64::from(b.0[d]));
            #[allow(clippy::cast_precision_loss)]
            let (wa, ca, wb, cb) = (a.1[d].0 as f64, a.1[d].1 as f64, b.1[d].0 as f64, b.1[d].1 as f64);
            let per_layer = if (la - lb).abs() > 0.0 { ((wa - wb) / (la - lb)).max(0.0) } else { 0.0 };
            DeviceCost { per_layer, fixed_full: wa + ca - la * per_layer, fixed_partial: wb + cb - lb * per_layer }
        })
        .collect()
}

/// The candidate splits (label, layers per device), without repeats:
/// `full_cap` is each device's capacity at full offload, `partial_cap` at
/// partial offload.
#[must_use]
pub fn candidates(full_cap: &[u32], partial_cap: &[u32], full: u32) -> Vec<(String, Vec<u32>)> {
    let n = full_cap.len();
    let mut out: Vec<(String, Vec<u32>)> = Vec::new();
    let mut add = |label: &str, split: Vec<u32>| {
        if split.iter().sum::<u32>() > 0 && !out.iter().any(|(_, s)| *s == split) {
            out.push((label.to_string(), split));
        }
    };
    if full_cap.iter().sum::<u32>() < full {
        // The output layer goes to the GPU first: the CPU keeps at least one repeating layer.
        let most = full - 1;
        let total: u32 = partial_cap.iter().sum::<u32>().min(most);
        add("every device at its capacity, the rest on the CPU", proportional(total, partial_cap));
        return out;
    }
    add("in proportion to what each device holds", proportional(full, full_cap));
    add("devices filled in llama.cpp's order", fill(full, full_cap, &(0..n).collect::<Vec<_>>()));
    add("devices filled in reverse order", fill(full, full_cap, &(0..n).rev().collect::<Vec<_>>()));
    out
}

/// What the stage needs from the tuner.
pub struct SplitInputs<'a> {
    pub devs: &'a [DeviceCap],
    /// Layers of the model plus the output layer (ngl of full offload).
    pub full: u32,
    pub threads: u32,
    pub rpc: &'a [String],
    pub op_offload: bool,
    /// The output layer's work in layers ([`crate::model::ModelInfo::output_work_layers`]).
    pub output_layers: f64,
}

/// What the stage found.
#[derive(Debug, Default)]
pub struct SplitFound {
    pub options: Vec<SplitOption>,
    /// The recommended option's index in `options`.
    pub best: Option<usize>,
    pub notes: Vec<crate::types::Note>,
    /// What the profile keeps (filled by [`report`]).
    pub report: SplitReport,
}

fn flags(ngl: u32, split: &[u32], s: &Settings, threads: u32, rpc: &[String], op_offload: bool) -> String {
    crate::types::Placement::default()
        .with_layers(ngl, threads, Some(s.n_ctx))
        .with_op_offload(op_offload)
        .with_split(split, rpc)
        .flags()
}

/// Priced exactly; a device over its cap gives up the layers its cost
/// says it must (to the CPU), up to three times. What fits every cap.
fn price_all(
    mut todo: Vec<(String, Vec<u32>)>,
    predict: &mut dyn FnMut(&[Vec<u32>]) -> Vec<Prediction>,
    devs: &[DeviceCap],
    cost: &[DeviceCost],
) -> Vec<(String, Vec<u32>, Prediction)> {
    let mut priced: Vec<(String, Vec<u32>, Prediction)> = Vec::new();
    for _round in 0..4 {
        if todo.is_empty() {
            break;
        }
        let splits: Vec<Vec<u32>> = todo.iter().map(|(_, s)| s.clone()).collect();
        let answers = predict(&splits);
        let mut next = Vec::new();
        for ((label, split), p) in todo.into_iter().zip(answers) {
            let bytes = per_device(&p, devs);
            if p.error.is_none() && fits(&bytes, devs) {
                if !priced.iter().any(|(_, s, _)| *s == split) {
                    priced.push((label, split, p));
                }
                continue;
            }
            let mut trimmed = split.clone();
            for (d, b) in bytes.iter().enumerate() {
                if *b > devs[d].cap_bytes {
                    trimmed[d] = trimmed[d].saturating_sub(cost[d].layers_for(*b - devs[d].cap_bytes));
                }
            }
            if trimmed != split && trimmed.iter().sum::<u32>() > 0 {
                next.push((label, trimmed));
            }
        }
        todo = next;
    }
    priced
}

/// Splits the search measures at most, by their predicted speed.
pub const MEASURED_BY_SPEED: usize = 2;

/// The rates of a trial (tg, pp), where it ran.
fn rates(t: &crate::profile::ProfileTrial) -> (Option<f64>, Option<f64>) {
    (t.result.test(false).map(|x| x.avg_ts), t.result.test(true).map(|x| x.avg_ts))
}

/// Each device's speed: every layer on the CPU (the search's trial, else
/// one now), then each device alone with as many layers as its cap holds
/// in a partial offload (one probe each, priced under every cap first).
/// The probes are measured options of their own.
fn probe_speeds(
    search: &mut Search<'_>,
    inp: &SplitInputs<'_>,
    partial_cap: &[u32],
    predict: &mut dyn FnMut(&[Vec<u32>]) -> Vec<Prediction>,
    cost: &[DeviceCost],
    found: &mut SplitFound,
) -> Result<Option<SpeedModel>> {
    let (devs, full, threads) = (inp.devs, inp.full, inp.threads);
    let cpu_ref = |t: &&crate::profile::ProfileTrial| {
        let p = &t.result.spec.placement;
        t.result.status == TrialStatus::Ok
            && p.n_gpu_layers == 0
            && p.n_threads == threads
            && p.n_cpu_moe == 0
            && p.n_cpu_ffn == 0
            && t.result.test(false).is_some_and(|x| !x.stopped_early)
    };
    let cpu = match search.trials.iter().find(cpu_ref) {
        Some(t) => rates(t),
        None => rates(search.measure(Role::Split, Candidate::layers(0, threads), None)?),
    };
    let mut probes: Vec<Vec<Probe>> = vec![Vec::new(); devs.len()];
    // Two layer counts per device: as many as its cap holds, and half that.
    let mut todo: Vec<(String, Vec<u32>)> = Vec::new();
    for d in (0..devs.len()).filter(|d| partial_cap[*d] > 0) {
        let hi = partial_cap[d].min(full.saturating_sub(1)).max(1);
        for k in
            [hi, hi / 2].into_iter().filter(|k| *k > 0).collect::<std::collections::BTreeSet<u32>>().into_iter().rev()
        {
            let mut split = vec![0; devs.len()];
            split[d] = k;
            todo.push((format!("probe: {} alone, the rest on the CPU", devs[d].device), split));
        }
    }
    let s = search.settings();
    for (label, split, p) in price_all(todo, predict, devs, cost) {
        let Some(d) = split.iter().position(|l| *l > 0) else { continue };
        let ngl: u32 = split.iter().sum();
        let c = Candidate { split: Split::new(&split), ..Candidate::layers(ngl, threads) };
        let race = search.race();
        let t = search.measure(Role::Split, c, Some(race))?;
        // A probe that failed (its server crashed, say) says nothing of the device's speed.
        if let (Some(tg), pp) = rates(t) {
            probes[d].push(Probe { layers: ngl, tg_ts: Some(tg), pp_ts: pp });
        }
        found.options.push(option_of(&label, &split, per_device(&p, devs), Some(t), devs, s, inp, inp.op_offload));
    }
    Ok(SpeedModel::fit(cpu.0, cpu.1, &probes, inp.output_layers))
}

/// The fastest splits by each device's measured speed, under the
/// capacities the costs give: every layer offloaded, and (unless `--ngl`
/// fixes the count) only the devices that beat the CPU.
fn speed_candidates(
    m: &SpeedModel,
    s: &Settings,
    full: u32,
    full_cap: &[u32],
    partial_cap: &[u32],
) -> Vec<(String, Vec<u32>)> {
    let fixed = s.grid.as_ref().filter(|g| g.len() == 1).map(|g| g[0].min(full));
    let w = (s.n_prompt, s.n_gen);
    let mut out = Vec::new();
    let label = "fastest by each device's measured speed";
    match fixed {
        Some(n) if n < full => out.extend(m.best(partial_cap, full, Some(n), s.objective, w).map(|b| (label, b))),
        Some(_) => out.extend(m.best(full_cap, full, Some(full), s.objective, w).map(|b| (label, b))),
        None => {
            out.extend(m.best(full_cap, full, Some(full), s.objective, w).map(|b| (label, b)));
            out.extend(m.best(partial_cap, full, None, s.objective, w).map(|b| (label, b)));
        }
    }
    let mut v: Vec<(String, Vec<u32>)> = Vec::new();
    for (l, b) in out {
        if b.iter().sum::<u32>() > 0 && !v.iter().any(|(_, x)| *x == b) {
            v.push((l.to_string(), b));
        }
    }
    v
}

/// Prices, trims and measures the candidate splits; the whole-layer
/// search's trials (llama.cpp's default split) are options too. With each
/// device's speed probed, only the fastest predicted are measured.
///
/// # Errors
/// What the search's executor returns (an interrupt).
pub fn split_stage(
    search: &mut Search<'_>,
    inp: &SplitInputs<'_>,
    predict: &mut dyn FnMut(&[Vec<u32>]) -> Vec<Prediction>,
) -> Result<SplitFound> {
    let (devs, full) = (inp.devs, inp.full);
    let n = u32::try_from(devs.len()).unwrap_or(1);
    let even = proportional(full, &vec![full; devs.len()]);
    let half: Vec<u32> = even.iter().map(|l| l / 2).collect();
    let probes = predict(&[even.clone(), half.clone()]);
    let mut found = SplitFound::default();
    if probes.len() < 2 || probes.iter().any(|p| p.error.is_some()) {
        let why = probes.iter().find_map(|p| p.error.clone()).unwrap_or_else(|| "no answer".into());
        found.notes.push(crate::types::Note::split(format!(
            "the split across {n} devices was not tuned: llama.cpp's dry run failed ({why})"
        )));
        return Ok(found);
    }
    let cost = costs((&even, &parts(&probes[0], devs)), (&half, &parts(&probes[1], devs)));
    let cap_at = |full_offload: bool| -> Vec<u32> {
        cost.iter().zip(devs).map(|(c, d)| c.capacity(d.cap_bytes, full_offload, full)).collect()
    };
    let (full_cap, partial_cap) = (cap_at(true), cap_at(false));
    let speed = probe_speeds(search, inp, &partial_cap, predict, &cost, &mut found)?;
    let s = search.settings();
    let mut todo = candidates(&full_cap, &partial_cap, full);
    if let Some(m) = &speed {
        let mut fast = speed_candidates(m, s, full, &full_cap, &partial_cap);
        fast.extend(todo.into_iter().filter(|(_, x)| !found.options.iter().any(|o| o.tensor_split == *x)));
        todo = fast;
    }
    let mut priced = price_all(todo, predict, devs, &cost);
    priced.retain(|(_, x, _)| !found.options.iter().any(|o| o.tensor_split == *x));
    search.predicted.extend(priced.iter().map(|(_, _, p)| p.clone()));
    let score = |x: &[u32]| {
        speed.as_ref().and_then(|m| {
            let (tg, pp) = m.predict(x);
            crate::tune::choose::score(s.objective, s.n_prompt, s.n_gen, Some(tg), pp)
        })
    };
    if speed.is_some() {
        priced.sort_by(|a, b| score(&b.1).unwrap_or(0.0).total_cmp(&score(&a.1).unwrap_or(0.0)));
    }
    let op_offload = inp.op_offload;
    for (i, (label, split, p)) in priced.iter().enumerate() {
        let ngl: u32 = split.iter().sum();
        let measure = speed.is_none() || i < MEASURED_BY_SPEED;
        let t = if measure {
            let c = Candidate { split: Split::new(split), ..Candidate::layers(ngl, inp.threads) };
            let race = search.race();
            Some(search.measure(Role::Split, c, Some(race))?)
        } else {
            None
        };
        let mut o = option_of(label, split, per_device(p, devs), t, devs, s, inp, op_offload);
        if !measure {
            o.note = "not measured: predicted slower than the ones measured".into();
        }
        found.options.push(o);
    }
    if let Some(m) = &speed {
        for o in found.options.iter_mut().filter(|o| !o.tensor_split.is_empty()) {
            let (tg, pp) = m.predict(&o.tensor_split);
            (o.predicted_tg_ts, o.predicted_pp_ts) = (Some(tg), pp);
        }
    }
    // llama.cpp's default split at each ngl the search measured (ngl 0: every layer on the CPU).
    let defaults: Vec<_> =
        search.trials.iter().filter(|t| t.is_search() && t.result.status == TrialStatus::Ok).cloned().collect();
    for t in &defaults {
        let ngl = t.result.spec.placement.n_gpu_layers;
        let label = if ngl == 0 { "every layer on the CPU" } else { "llama.cpp's default split (by free memory)" };
        let mut o = option_of(label, &[], Vec::new(), Some(t), devs, s, inp, op_offload);
        o.n_gpu_layers = ngl;
        o.predicted_bytes.clone_from(&o.accounted_bytes);
        o.llama_cpp_args = flags(ngl, &[], s, t.result.spec.placement.n_threads, inp.rpc, op_offload);
        found.options.push(o);
    }
    choose(&mut found, s);
    Ok(found)
}

/// What llama.cpp allocated on each device in a trial.
#[must_use]
pub fn accounted(r: &crate::types::TrialResult, devs: &[DeviceCap]) -> Vec<u64> {
    in_device_order(&r.accounted_per_device(), devs)
}

#[allow(clippy::too_many_arguments)]
fn option_of(
    label: &str,
    split: &[u32],
    predicted: Vec<u64>,
    t: Option<&crate::profile::ProfileTrial>,
    devs: &[DeviceCap],
    s: &Settings,
    inp: &SplitInputs<'_>,
    op_offload: bool,
) -> SplitOption {
    let ok = t.filter(|t| t.result.status == TrialStatus::Ok);
    let acc = ok.map(|t| accounted(&t.result, devs)).unwrap_or_default();
    let ngl = split.iter().sum();
    let fits = if acc.is_empty() { fits(&predicted, devs) } else { fits(&acc, devs) };
    let note = match t {
        Some(t) if t.result.status != TrialStatus::Ok => {
            format!("{}: {}", t.result.status.as_str(), t.result.reason.clone().unwrap_or_default())
        }
        _ if !fits => "over a device's cap".to_string(),
        _ => String::new(),
    };
    let threads = t.map_or(inp.threads, |t| t.result.spec.placement.n_threads);
    SplitOption {
        label: label.to_string(),
        n_gpu_layers: ngl,
        tensor_split: split.to_vec(),
        predicted_bytes: predicted,
        accounted_bytes: acc,
        measured: ok.is_some(),
        tg_ts: ok.and_then(|t| t.result.test(false).map(|x| x.avg_ts)),
        pp_ts: ok.and_then(|t| t.result.test(true).map(|x| x.avg_ts)),
        fits,
        recommended: false,
        note,
        llama_cpp_args: flags(ngl, split, s, threads, inp.rpc, op_offload),
        predicted_tg_ts: None,
        predicted_pp_ts: None,
    }
}

/// Marks the fastest measured option under every cap (by the objective)
/// and says how the others compare.
pub fn choose(found: &mut SplitFound, s: &Settings) {
    let score = |o: &SplitOption| crate::tune::choose::score(s.objective, s.n_prompt, s.n_gen, o.tg_ts, o.pp_ts);
    let best = found
        .options
        .iter()
        .enumerate()
        .filter(|(_, o)| o.measured && o.fits)
        .filter_map(|(i, o)| score(o).map(|v| (i, v)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    found.best = best.map(|(i, _)| i);
    let Some((bi, bv)) = best else {
        found.notes.push(crate::types::Note::over_cap("no measured split stays under every device's cap"));
        return;
    };
    for (i, o) in found.options.iter_mut().enumerate() {
        o.recommended = i == bi;
        if i != bi && o.note.is_empty() {
            if let Some(v) = score(o) {
                o.note = format!("{:+.0}% against the recommendation", (v / bv - 1.0) * 100.0);
            }
        }
    }
}

/// Each device's share of the recommended option.
#[must_use]
pub fn shares(devs: &[DeviceCap], o: &SplitOption) -> Vec<DeviceShare> {
    devs.iter()
        .enumerate()
        .map(|(i, d)| DeviceShare {
            device: d.device.clone(),
            buffer_type: d.buffer_type.clone(),
            description: d.description.clone(),
            cap_bytes: d.cap_bytes,
            cap_reason: d.cap_reason.clone(),
            layers: o.tensor_split.get(i).copied().unwrap_or(0),
            predicted_bytes: o.predicted_bytes.get(i).copied(),
            accounted_bytes: o.accounted_bytes.get(i).copied(),
        })
        .collect()
}

/// The margin per device that makes llama.cpp's fit stop at each cap:
/// free memory less the cap.
#[must_use]
pub fn fit_margins(devs: &[DeviceCap], devices: &[LlamaDevice]) -> Vec<u64> {
    devs.iter()
        .map(|c| devices.iter().find(|d| d.name == c.device).map_or(0, |d| d.memory_free.saturating_sub(c.cap_bytes)))
        .collect()
}

/// The stage as the profile keeps it.
#[must_use]
pub fn report(
    devs: &[DeviceCap],
    found: &SplitFound,
    fit: Option<crate::engine::predict::LlamaFitSplit>,
    servers: &[crate::types::RpcServer],
) -> SplitReport {
    let empty = SplitOption {
        label: String::new(),
        n_gpu_layers: 0,
        tensor_split: Vec::new(),
        predicted_bytes: Vec::new(),
        accounted_bytes: Vec::new(),
        measured: false,
        tg_ts: None,
        pp_ts: None,
        fits: false,
        recommended: false,
        note: String::new(),
        llama_cpp_args: String::new(),
        predicted_tg_ts: None,
        predicted_pp_ts: None,
    };
    let best = found.best.map_or(&empty, |i| &found.options[i]);
    SplitReport {
        devices: shares(devs, best),
        options: found.options.clone(),
        llama_fit: fit.map(|f| crate::profile::LlamaFitChoice {
            n_gpu_layers: f.n_gpu_layers,
            tensor_split: f.tensor_split,
            error: f.error,
        }),
        rpc_links: servers
            .iter()
            .map(|r| crate::profile::RpcLink {
                endpoint: r.endpoint.clone(),
                protocol: r.protocol.clone(),
                rtt_ms: r.rtt_ms,
            })
            .collect(),
    }
}

/// The recommendation of a measured split. Ollama cannot use RPC servers
/// and splits its GPUs itself: its `num_gpu` is the layers the local
/// devices hold in this split.
#[must_use]
pub fn recommendation(base: &Recommendation, o: &SplitOption, devs: &[DeviceCap], rpc: &[String]) -> Recommendation {
    let mut r = base.clone();
    r.n_gpu_layers = o.n_gpu_layers;
    r.n_cpu_moe = 0;
    r.n_cpu_ffn = 0;
    r.kv_type = crate::types::KvType::F16;
    r.tensor_split.clone_from(&o.tensor_split);
    // Every layer on the CPU needs no server.
    r.rpc = if o.n_gpu_layers == 0 { Vec::new() } else { rpc.to_vec() };
    r.tg_ts = o.tg_ts;
    r.pp_ts = o.pp_ts;
    #[allow(clippy::cast_precision_loss)]
    let mem = o.accounted_bytes.iter().sum::<u64>() as f64;
    r.mem_bytes = Some(mem);
    r.measured = o.measured;
    let local: u32 = if o.tensor_split.is_empty() {
        o.n_gpu_layers
    } else {
        o.tensor_split.iter().zip(devs).filter(|(_, d)| !d.buffer_type.starts_with("RPC")).map(|(l, _)| *l).sum()
    };
    let ollama = if r.rpc.is_empty() { o.n_gpu_layers } else { local };
    r.ollama_num_gpu = (ollama != r.n_gpu_layers).then_some(ollama);
    r.render_forms(ollama);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::DeviceBudget;
    use crate::tune::memory::{device_caps, offload_devices};

    fn dev(name: &str, backend: &str, desc: &str, kind: &str, total: u64) -> LlamaDevice {
        LlamaDevice {
            index: 0,
            name: name.into(),
            description: desc.into(),
            backend: backend.into(),
            kind: serde_json::from_value(serde_json::json!(kind)).unwrap(),
            memory_total: total,
            memory_free: total,
        }
    }

    fn caps(bytes: &[u64]) -> Vec<DeviceCap> {
        bytes
            .iter()
            .enumerate()
            .map(|(i, b)| DeviceCap {
                device: format!("D{i}"),
                buffer_type: format!("D{i}"),
                description: String::new(),
                cap_bytes: *b,
                cap_reason: String::new(),
            })
            .collect()
    }

    #[test]
    fn devices_come_in_llama_cpps_order_with_their_buffer_types() {
        let devices = vec![
            dev("CPU", "CPU", "EPYC", "cpu", 1 << 34),
            dev("CUDA0", "CUDA", "RTX 3060", "gpu", 12 << 30),
            dev("RPC0", "RPC", "10.0.0.2:50052", "gpu", 8 << 30),
            dev("RPC1", "RPC", "10.0.0.2:50052", "gpu", 8 << 30),
            dev("RPC2", "RPC", "10.0.0.3:50052", "gpu", 24 << 30),
        ];
        let order: Vec<(String, String)> = offload_devices(&devices).into_iter().map(|(d, b)| (d.name, b)).collect();
        let want = [
            ("RPC0", "RPC0[10.0.0.2:50052]"),
            ("RPC1", "RPC1[10.0.0.2:50052]"),
            ("RPC2", "RPC0[10.0.0.3:50052]"),
            ("CUDA0", "CUDA0"),
        ];
        assert_eq!(order, want.map(|(a, b)| (a.to_string(), b.to_string())));
        let budgets = [
            DeviceBudget { device: "10.0.0.3:50052".into(), bytes: 1 << 30 },
            DeviceBudget { device: "CUDA0".into(), bytes: 64 << 30 },
        ];
        let c = device_caps(&devices, 0.5, Some(2 << 30), &budgets).unwrap();
        let got: Vec<u64> = c.iter().map(|c| c.cap_bytes).collect();
        assert_eq!(got, [2 << 30, 2 << 30, 1 << 30, 6 << 30], "the stricter of the budget and the target, per device");
        let unknown = [DeviceBudget { device: "CUDA7".into(), bytes: 1 }];
        let e = device_caps(&devices, 0.9, None, &unknown).unwrap_err().to_string();
        assert!(e.contains("CUDA7") && e.contains("RPC0 (10.0.0.2:50052)"), "{e}");
    }

    #[test]
    fn capacity_follows_cost_per_layer_and_fixed_cost() {
        // Device 0: 10 MB a layer, compute 5 MB; device 1: 20 MB a layer, the
        // output 10 MB, compute 20 MB at full offload and 8 MB at partial.
        let mb = 1_000_000u64;
        let at = |l: &[u32], full: bool| -> Vec<(u64, u64)> {
            vec![
                (u64::from(l[0]) * 10 * mb, 5 * mb),
                (u64::from(l[1]) * 20 * mb + 10 * mb, if full { 20 * mb } else { 8 * mb }),
            ]
        };
        let d = caps(&[105 * mb, 250 * mb]);
        let (a, b) = (vec![21, 20], vec![10, 10]);
        let c = costs((&a, &at(&a, true)), (&b, &at(&b, false)));
        assert_eq!(c[1], DeviceCost { per_layer: 20e6, fixed_full: 30e6, fixed_partial: 18e6 });
        let full: Vec<u32> = c.iter().zip(&d).map(|(c, d)| c.capacity(d.cap_bytes, true, 41)).collect();
        let partial: Vec<u32> = c.iter().zip(&d).map(|(c, d)| c.capacity(d.cap_bytes, false, 41)).collect();
        assert_eq!((full.clone(), partial.clone()), (vec![10, 11], vec![10, 11]));
        assert_eq!(c[1].layers_for(1), 1);
        assert_eq!(c[1].layers_for(41 * mb), 3);
        let cands = candidates(&full, &partial, 41);
        assert_eq!(cands, [("every device at its capacity, the rest on the CPU".to_string(), vec![10, 11])]);
        let wide = candidates(&[30, 20], &[30, 20], 41);
        let splits: Vec<Vec<u32>> = wide.iter().map(|(_, s)| s.clone()).collect();
        assert_eq!(splits, [vec![25, 16], vec![30, 11], vec![21, 20]]);
        for s in &splits {
            assert_eq!(s.iter().sum::<u32>(), 41);
        }
        let most = candidates(&[20, 20], &[30, 30], 41);
        assert_eq!(most[0].1.iter().sum::<u32>(), 40, "the CPU keeps a layer when not everything fits");
    }

    #[test]
    fn proportions_never_exceed_a_devices_capacity() {
        assert_eq!(proportional(41, &[41, 41]), [21, 20]);
        assert_eq!(proportional(10, &[1, 100]), [0, 10]);
        assert_eq!(proportional(5, &[0, 0]), [0, 0]);
        assert_eq!(fill(41, &[30, 20], &[1, 0]), [21, 20]);
    }

    #[test]
    fn the_fastest_split_under_every_cap_is_recommended() {
        let s = crate::tune::worlds::settings();
        let o = |tg: f64, fits: bool, measured: bool| SplitOption {
            label: "x".into(),
            n_gpu_layers: 41,
            tensor_split: vec![20, 21],
            predicted_bytes: vec![1, 1],
            accounted_bytes: vec![],
            measured,
            tg_ts: Some(tg),
            pp_ts: Some(tg * 10.0),
            fits,
            recommended: false,
            note: String::new(),
            llama_cpp_args: String::new(),
            predicted_tg_ts: None,
            predicted_pp_ts: None,
        };
        let mut f = SplitFound {
            options: vec![o(9.0, true, true), o(12.0, false, true), o(10.0, true, true)],
            ..SplitFound::default()
        };
        choose(&mut f, &s);
        assert_eq!(f.best, Some(2), "the faster one over a cap is not eligible");
        assert!(f.options[2].recommended && !f.options[1].recommended);
        assert_eq!(f.options[0].note, "-10% against the recommendation");
        let mut none = SplitFound { options: vec![o(9.0, false, true), o(20.0, true, false)], ..SplitFound::default() };
        choose(&mut none, &s);
        assert_eq!(none.best, None);
        assert!(none.notes[0].to_string().contains("no measured split"));
    }

    /// Two devices "D0" and "D1": 10 MB a layer on either; D0's compute
    /// buffer 5 MB; D1 holds the output (10 MB) and a compute buffer of
    /// 20 MB at full offload, 8 MB at partial. `extra_d1` is what the dry
    /// run adds on D1 beyond that line (a cost the two probes missed).
    fn split_prediction(split: &[u32], extra_d1: u64) -> Prediction {
        let mb = 1_000_000u64;
        let full = split.iter().sum::<u32>() == 21;
        let buf = |name: &str, model: u64, compute: u64| crate::engine::predict::PredictedBuffer {
            buffer_type: name.into(),
            is_host: false,
            model,
            context: 0,
            compute,
        };
        let d1_extra = if split[1] >= 12 { extra_d1 } else { 0 };
        Prediction {
            n_gpu_layers: split.iter().sum(),
            device_bytes: 0,
            device_model_bytes: 0,
            buffers: vec![
                buf("D0", u64::from(split[0]) * 10 * mb, 5 * mb),
                buf("D1", u64::from(split[1]) * 10 * mb + 10 * mb + d1_extra, if full { 20 * mb } else { 8 * mb }),
            ],
            error: None,
            case: None,
            split: split.to_vec(),
        }
    }

    /// Measures what the dry run priced: per-device buffers as predicted,
    /// tg faster the more layers D1 holds.
    struct SplitWorld {
        extra_d1: u64,
        measured: Vec<Vec<u32>>,
    }

    impl crate::tune::executor::TrialExecutor for SplitWorld {
        fn measure(&mut self, c: Candidate, race: Option<crate::types::Race>) -> Result<crate::types::TrialResult> {
            use crate::types::{BufferLine, TestResult, TrialResult};
            let split = c.split.layers();
            self.measured.push(split.clone());
            // Every layer on the CPU (no -ts): nothing on either device.
            let split = if split.is_empty() { vec![0, 0] } else { split };
            let spec = crate::tune::executor::spec_of(&crate::engine::test_spec(), c, race);
            let mut r = TrialResult::failed(spec, TrialStatus::Ok, String::new());
            r.reason = None;
            for b in split_prediction(&split, self.extra_d1).buffers {
                let bytes = b.model + b.compute;
                r.model_buffers.push(BufferLine { buffer_type: b.buffer_type, kind: "model".into(), bytes });
            }
            // 20 ms a token on the CPU; a layer on D0 adds 1 ms (slower
            // than the CPU), a layer on D1 saves 0.5 ms.
            let ms = 20.0 + f64::from(split[0]) - 0.5 * f64::from(split[1]);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let ns = (16.0 * ms * 1e6) as u64;
            r.tests.push(TestResult::from_samples(0, 16, 256, vec![ns; 2]));
            r.tests.push(TestResult::from_samples(64, 0, 256, vec![ns / 10; 2]));
            Ok(r)
        }
    }

    fn split_world(extra_d1: u64) -> (SplitFound, Vec<Vec<u32>>) {
        let s = crate::tune::worlds::settings();
        let mut world = SplitWorld { extra_d1, measured: Vec::new() };
        let progress = crate::progress::Progress::hidden();
        let policy = crate::tune::worlds::policy(255e6);
        let mut search = Search::new(&s, &mut world, Some(policy), progress, None);
        let mb = 1_000_000u64;
        let devs = caps(&[105 * mb, 150 * mb]);
        let inp = SplitInputs { devs: &devs, full: 21, threads: 2, rpc: &[], op_offload: true, output_layers: 1.0 };
        let mut priced = Vec::new();
        let mut predict = |splits: &[Vec<u32>]| {
            priced.extend(splits.iter().cloned());
            splits.iter().map(|s| split_prediction(s, extra_d1)).collect()
        };
        let found = split_stage(&mut search, &inp, &mut predict).unwrap();
        drop(search);
        (found, world.measured)
    }

    #[test]
    fn the_split_stage_prices_trims_and_measures_only_what_fits_every_cap() {
        // Capacities at full offload: D0 (105 - 5) / 10 = 10, D1 (150 - 30) / 10 = 12;
        // at partial offload D1 holds 13. D0 is slower than the CPU, D1 faster.
        let (found, measured) = split_world(0);
        assert_eq!(
            measured,
            [vec![], vec![10, 0], vec![5, 0], vec![0, 13], vec![0, 6], vec![9, 12], vec![10, 11]],
            "every layer on the CPU, each device alone at two layer counts, then the two fastest predicted"
        );
        let best = &found.options[found.best.unwrap()];
        assert_eq!(best.tensor_split, [0, 13], "the slow device left out, the rest on the CPU");
        assert!(found.options.iter().all(|o| o.fits && o.measured));
        assert_eq!(best.accounted_bytes, best.predicted_bytes);
        for o in found.options.iter().filter(|o| !o.tensor_split.is_empty()) {
            let (p, m) = (o.predicted_tg_ts.unwrap(), o.tg_ts.unwrap());
            assert!((p / m - 1.0).abs() < 0.01, "{}: predicted {p}, measured {m}", o.label);
        }
        // D1 costs 25 MB more at 12 layers than the probes said: [9, 12]
        // is over its cap, loses the layers that covers, and is measured as [9, 9].
        let (found, measured) = split_world(25_000_000);
        assert!(!measured.contains(&vec![9, 12]) && measured.contains(&vec![9, 9]), "trimmed: {measured:?}");
        assert!(found.options.iter().all(|o| o.fits));
    }

    #[test]
    fn with_every_layer_offloaded_the_fast_device_takes_what_it_holds() {
        // --ngl 21: all layers on the devices, so the slow one must take some.
        let mut s = crate::tune::worlds::settings();
        s.grid = Some(vec![21]);
        let mut world = SplitWorld { extra_d1: 0, measured: Vec::new() };
        let policy = crate::tune::worlds::policy(255e6);
        let mut search = Search::new(&s, &mut world, Some(policy), crate::progress::Progress::hidden(), None);
        let mb = 1_000_000u64;
        let devs = caps(&[105 * mb, 150 * mb]);
        let inp = SplitInputs { devs: &devs, full: 21, threads: 2, rpc: &[], op_offload: true, output_layers: 1.0 };
        let mut predict = |splits: &[Vec<u32>]| splits.iter().map(|s| split_prediction(s, 0)).collect();
        let found = split_stage(&mut search, &inp, &mut predict).unwrap();
        drop(search);
        let best = &found.options[found.best.unwrap()];
        assert_eq!(
            found.options.iter().find(|o| o.label.starts_with("fastest")).map(|o| o.tensor_split.clone()),
            Some(vec![9, 12]),
            "D1 filled to its 12, D0 the other 9"
        );
        assert!(best.measured && best.fits);
    }
}
