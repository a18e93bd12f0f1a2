//! Several offload devices (local GPUs, llama.cpp RPC servers, or both):
//! how many layers each holds. llama.cpp's own split follows free memory
//! only; here each device has its own cap, llama.cpp's dry run prices
//! splits per device, and the few that can win are measured.
//!
//! The stage runs after the whole-layer search (which measured llama.cpp's
//! default split at each ngl): two dry runs give each device's cost per
//! layer and its fixed cost (compute buffer, the output layer on the last
//! device), from which each device's capacity under its cap follows. Then
//! each device's speed (`super::speed`: one probe per device, that device
//! alone, one device solved from llama.cpp's default split), and the
//! fastest split by those speeds, in its own `--device` order, is a
//! candidate beside the splits a user would try: layers in proportion to
//! what each device can hold, and the devices filled in llama.cpp's order
//! and in reverse; or, when the layers do not all fit, every device at its
//! capacity and the rest on the CPU. Each is priced exactly, trimmed a
//! layer at a time while over a cap; only what is predicted faster than
//! every split measured is measured (without probes, every one). Then the
//! escape hatches that have a form across devices (`tune::hatch`: a q8_0
//! KV cache where it lets more layers onto the faster devices, the FFN
//! spill), split modes row and tensor, and the answer paired with
//! llama.cpp's default and fit splits. The recommendation is the fastest measured split under
//! every device's cap.
//!
//! The parts: `capacity` (each device's cost and capacity, pure but for
//! the dry run it is handed), `candidates` (the splits worth pricing, each
//! priced and trimmed), `probe` (each device's speed), this file (the
//! stage), `modes` (row and tensor), `pairing` (with llama.cpp's own
//! splits), `report`.

use anyhow::Result;

use super::memory::DeviceCap;
use super::plan::Candidate;
use super::search::Search;
use super::speed::{Link, Measured, SpeedModel};
use crate::engine::predict::Prediction;
use crate::placement::KvType;
use crate::placement::Split;
use crate::profile::{DeviceShare, Recommendation, Settings, SplitOption, SplitReport};
use crate::types::{LlamaDevice, Role, TrialStatus};

mod candidates;
mod capacity;
mod modes;
mod pairing;
mod probe;
mod report;
#[cfg(test)]
pub(crate) mod tests;

pub use candidates::*;
pub use capacity::*;
pub use modes::*;
pub use pairing::*;
pub use probe::*;
pub use report::*;

/// What the stage needs from the tuner.
pub struct SplitInputs<'a> {
    /// The context the splits run at.
    pub n_ctx: u32,
    pub devs: &'a [DeviceCap],
    /// Layers of the model plus the output layer (ngl of full offload).
    pub full: u32,
    pub threads: u32,
    pub rpc: &'a [String],
    pub op_offload: bool,
    /// The output layer's work in layers ([`crate::model::ModelInfo::output_work_layers`]).
    pub output_layers: f64,
    /// Whether the model's FFN is experts (its spill is `--n-cpu-moe`,
    /// not tried across devices).
    pub is_moe: bool,
    /// A repeating layer's weights, mean bytes (what an FFN's share is of).
    pub layer_bytes: f64,
    /// What each device's link adds to a token ([`links`]); zero for a local device.
    pub links: Vec<Link>,
    /// The workload every trial runs ([`crate::tune::plan::ContextRun::workload`]).
    pub workload: crate::placement::Placement,
}

/// Each device's link, from its RPC server's round trip and bandwidth (its
/// buffer type names the endpoint): a token's activations (`n_embd` f32
/// values) there and back with a round trip each way per generated token,
/// or per batch of `n_ubatch` prompt tokens; the logits (`n_vocab` f32
/// values) back from the device that runs the output. Zero for a local
/// device, and for the bytes where the bandwidth was not measured.
#[must_use]
pub fn links(
    devs: &[DeviceCap],
    servers: &[crate::types::RpcServer],
    (n_embd, n_vocab): (u64, u64),
    n_ubatch: u32,
) -> Vec<Link> {
    #[allow(clippy::cast_precision_loss)]
    let (act, logits) = ((n_embd * 4) as f64, (n_vocab * 4) as f64);
    devs.iter()
        .map(|d| {
            let served = |r: &&crate::types::RpcServer| d.buffer_type.ends_with(&format!("[{}]", r.endpoint));
            servers.iter().find(served).map_or(Link::default(), |r| {
                let carry = r.bandwidth.map_or(0.0, |b| b.there_and_back_ms(act));
                Link {
                    tg_ms: 2.0 * r.rtt_ms + carry,
                    pp_ms: carry + 2.0 * r.rtt_ms / f64::from(n_ubatch.max(1)),
                    logits_ms: r.bandwidth.map_or(0.0, |b| logits / (b.down_mb_s * 1e3)),
                }
            })
        })
        .collect()
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
    /// What a boundary between two devices costs per generated token (ms), as fitted.
    pub crossing_tg_ms: Option<f64>,
    /// The recommendation paired with llama.cpp's splits ([`against_llama`]).
    pub against: Vec<crate::profile::SplitComparison>,
    /// Each device's speed, as the stage solved it.
    pub speed: Option<SpeedModel>,
    /// What llama.cpp's dry run says of the other split modes ([`split_modes`]).
    pub split_modes: Vec<String>,
}

/// The offload devices' names, in llama.cpp's order.
fn names(devs: &[DeviceCap]) -> Vec<String> {
    devs.iter().map(|d| d.device.clone()).collect()
}

/// llama.cpp's placement of a split at the stage's context with a KV cache
/// type and the FFN of its first `cpu_ffn` layers on the CPU.
fn split_placement(
    ngl: u32,
    split: &Split,
    (kv, cpu_ffn): (KvType, u32),
    threads: u32,
    inp: &SplitInputs<'_>,
) -> crate::placement::Placement {
    crate::placement::Placement { n_cpu_ffn: cpu_ffn, ..inp.workload.clone() }
        .with_layers(ngl, threads, Some(inp.n_ctx))
        .with_op_offload(inp.op_offload)
        .with_kv(kv)
        .with_split(&split.listed(), inp.rpc)
        .with_devices(&split.device_names(&names(inp.devs)))
        .with_split_mode(split.mode())
}

/// Prices, trims and measures the candidate splits; the whole-layer
/// search's trials (llama.cpp's default split) are options too. With each
/// device's speed probed, only the fastest predicted are measured.
///
/// # Errors
/// What the search's executor returns (an interrupt).
pub fn split_stage(search: &mut Search<'_>, inp: &SplitInputs<'_>) -> Result<SplitFound> {
    let (devs, full) = (inp.devs, inp.full);
    let mut found = SplitFound::default();
    let (cost, full_cap, partial_cap) = match capacities(&mut |x: &[Split]| dry_run(search, x), devs, full) {
        Ok(c) => c,
        Err(why) => {
            found.notes.push(crate::types::Note::split(format!(
                "the split across {} devices was not tuned: llama.cpp's dry run failed ({why})",
                devs.len()
            )));
            return Ok(found);
        }
    };
    // llama.cpp's default splits as the search measured them (layers per device by their bytes).
    let defaults = default_splits(search, devs, &cost, full);
    let probed = probe_speeds(search, inp, (&full_cap, &partial_cap), (&cost, &defaults), &mut found)?;
    // The splits the model was solved from: their predictions are their measurements.
    let inputs: Vec<Split> = probed.as_ref().map(|(_, x)| x.clone()).unwrap_or_default();
    let mut speed = probed.map(|(m, _)| m);
    let s = search.settings();
    let rules = candidates(&full_cap, &partial_cap, full).into_iter().map(|(l, x)| (l, Split::new(&x)));
    let mut todo: Vec<Labelled> = rules.collect();
    if let Some(m) = &speed {
        let mut fast = speed_candidates(m, s, full, &full_cap, &partial_cap);
        fast.extend(todo.into_iter().filter(|(_, x)| !found.options.iter().any(|o| split_of(o) == *x)));
        todo = fast;
    }
    let mut priced = price_all(todo, &mut |x: &[Split]| dry_run(search, x), devs, &cost);
    priced.retain(|(_, x, _)| !found.options.iter().any(|o| split_of(o) == *x));
    search.predicted.extend(priced.iter().map(|(_, _, p)| p.clone()));
    let trials = measure_by_speed(search, inp, &priced, &defaults, speed.as_mut(), &found)?;
    for ((label, split, p), t) in priced.iter().zip(&trials) {
        let mut o = option_of(label, split, per_device(p, devs), t.as_ref().map(|(t, _)| t), s, inp);
        // A measured split's prediction is the one made before it ran.
        (o.predicted_tg_ts, o.predicted_pp_ts) = match (t, &speed) {
            (Some((_, before)), _) => (before.map(|b| b.0), before.and_then(|b| b.1)),
            (None, Some(m)) => {
                let (tg, pp) = m.predict(split);
                (Some(tg), pp)
            }
            (None, None) => (None, None),
        };
        if t.is_none() {
            o.note = "not measured: predicted slower than the ones measured".into();
        }
        found.options.push(o);
    }
    default_options(search, inp, &cost, speed.as_ref(), &inputs, &mut found);
    if let Some(m) = &speed {
        // The probes that failed: what their devices' costs say of them.
        let unsolved = found
            .options
            .iter_mut()
            .filter(|o| !o.tensor_split.is_empty() && o.predicted_tg_ts.is_none() && !inputs.contains(&split_of(o)));
        for o in unsolved {
            let (tg, pp) = m.predict(&split_of(o));
            (o.predicted_tg_ts, o.predicted_pp_ts) = (Some(tg), pp);
        }
        found.crossing_tg_ms = Some(m.crossing_tg_ms);
    }
    found.speed = speed;
    choose(&mut found, s);
    Ok(found)
}

/// A measured split and what was predicted of it (tg, pp) before it ran.
type MeasuredSplit = (crate::profile::ProfileTrial, Option<(f64, Option<f64>)>);

/// Measures the priced splits: without a speed model, every one; with
/// it, the fastest predicted while it is predicted faster than every split
/// measured (of the layer count `--ngl` fixes), at most
/// [`MEASURED_BY_SPEED`], the boundary cost fitted again after each.
fn measure_by_speed(
    search: &mut Search<'_>,
    inp: &SplitInputs<'_>,
    priced: &[(String, Split, Prediction)],
    defaults: &[Measured],
    mut speed: Option<&mut SpeedModel>,
    found: &SplitFound,
) -> Result<Vec<Option<MeasuredSplit>>> {
    let (devs, full) = (inp.devs, inp.full);
    let s = search.settings();
    let score = |tg, pp| s.scoring().speeds(tg, pp);
    let ok = |ngl: u32| eligible(&s.policy, full, ngl);
    let mut trials: Vec<Option<MeasuredSplit>> = vec![None; priced.len()];
    let mut measured: Vec<Measured> = defaults.to_vec();
    // What is measured already, under every cap: the probes and llama.cpp's default splits.
    let mut best = found
        .options
        .iter()
        .filter(|o| o.measured && o.fits && ok(o.placement.n_gpu_layers))
        .filter_map(|o| score(o.tg_ts, o.pp_ts))
        .chain(
            search
                .trials
                .iter()
                .filter(|t| t.is_search() && t.result.status == TrialStatus::Ok)
                .filter(|t| t.result.spec.placement.tensor_split.is_empty() && ok(t.result.spec.placement.n_gpu_layers))
                .filter(|t| fits(&accounted(&t.result, devs), devs))
                .filter_map(|t| {
                    let (tg, pp) = rates(t);
                    score(tg, pp)
                }),
        )
        .fold(0.0, f64::max);
    for round in 0..priced.len() {
        let next = match speed.as_deref() {
            None => Some(round),
            Some(m) if round < MEASURED_BY_SPEED => (0..priced.len())
                .filter(|i| trials[*i].is_none())
                .max_by(|a, b| {
                    predicted_score(m, s.scoring(), &priced[*a].1).total_cmp(&predicted_score(
                        m,
                        s.scoring(),
                        &priced[*b].1,
                    ))
                })
                .filter(|i| predicted_score(m, s.scoring(), &priced[*i].1) > best),
            Some(_) => None,
        };
        let Some(i) = next else { break };
        let split = priced[i].1;
        let before = speed.as_deref().map(|m| m.predict(&split));
        let ngl: u32 = split.layers().iter().sum();
        let c = Candidate { split, ..Candidate::layers(ngl, inp.threads) };
        let race = search.race();
        let t = search.measure(Role::Split, c, Some(race))?.clone();
        if let (Some(tg), pp) = rates(&t) {
            if t.result.status == TrialStatus::Ok {
                measured.push(Measured { split, tg_ts: tg, pp_ts: pp });
                if ok(ngl) && fits(&accounted(&t.result, devs), devs) {
                    best = best.max(score(Some(tg), pp).unwrap_or(0.0));
                }
                if let Some(m) = speed.as_deref_mut() {
                    m.fit_crossings(&measured);
                }
            }
        }
        trials[i] = Some((t, before));
    }
    Ok(trials)
}

/// llama.cpp's default split at each ngl the search measured (ngl 0:
/// every layer on the CPU) as options, predicted where the model was not
/// solved from them.
fn default_options(
    search: &Search<'_>,
    inp: &SplitInputs<'_>,
    cost: &[DeviceCost],
    speed: Option<&SpeedModel>,
    inputs: &[Split],
    found: &mut SplitFound,
) {
    let (devs, full, s) = (inp.devs, inp.full, search.settings());
    let searched = search.trials.iter().filter(|t| t.is_search() && t.result.status == TrialStatus::Ok);
    for t in searched {
        let ngl = t.result.spec.placement.n_gpu_layers;
        let by_bytes = layers_by_bytes(&accounted(&t.result, devs), cost, ngl, full).filter(|_| ngl > 0);
        let label = match &by_bytes {
            _ if ngl == 0 => "every layer on the CPU".to_string(),
            Some(l) => format!("llama.cpp's default split (by free memory: {} by its bytes)", split_list(l)),
            None => "llama.cpp's default split (by free memory)".to_string(),
        };
        let mut o = option_of(&label, &Split::new(&[]), Vec::new(), Some(t), s, inp);
        o.predicted_bytes.clone_from(&o.accounted_bytes);
        let p = &t.result.spec.placement;
        o.placement = split_placement(ngl, &Split::new(&[]), (p.kv_type, 0), p.n_threads, inp);
        if let (Some(m), Some(l)) = (speed, by_bytes.as_ref().filter(|l| !inputs.contains(&Split::new(l)))) {
            let (tg, pp) = m.predict(&Split::new(l));
            (o.predicted_tg_ts, o.predicted_pp_ts) = (Some(tg), pp);
        }
        found.options.push(o);
    }
}

/// An option's layers and order.
#[must_use]
pub fn split_of(o: &SplitOption) -> Split {
    let split = if o.order.is_empty() {
        Split::new(&o.tensor_split)
    } else {
        Split::ordered(&o.tensor_split, &o.order.iter().map(|d| *d as usize).collect::<Vec<_>>())
    };
    split.with_mode(o.placement.split_mode)
}

/// The candidate that runs `o` again as it was measured and would be
/// recommended: its layers, split, order and mode, and the KV cache and
/// FFN weights on the CPU its trial ran with. The one way from an option
/// back to a candidate, so a pairing measures what is recommended.
#[must_use]
pub fn candidate_of(o: &SplitOption, threads: u32) -> Candidate {
    Candidate { split: split_of(o), threads, ..Candidate::from(&o.placement) }
}

fn split_list(l: &[u32]) -> String {
    l.iter().map(u32::to_string).collect::<Vec<_>>().join(" + ")
}

/// Splits priced by the search's dry run at the settings' KV type, every
/// tensor of a layer on its device.
pub(super) fn dry_run(search: &mut Search<'_>, splits: &[Split]) -> Vec<Prediction> {
    let kv = search.settings().workload.kv_type;
    search.price_splits(splits, kv, 0)
}

/// What llama.cpp allocated on each device in a trial.
#[must_use]
pub fn accounted(r: &crate::types::TrialResult, devs: &[DeviceCap]) -> Vec<u64> {
    in_device_order(&r.accounted_per_device(), devs)
}

pub(in crate::tune) fn option_of(
    label: &str,
    split: &Split,
    predicted: Vec<u64>,
    t: Option<&crate::profile::ProfileTrial>,
    s: &Settings,
    inp: &SplitInputs<'_>,
) -> SplitOption {
    let devs = inp.devs;
    let ok = t.filter(|t| t.result.status == TrialStatus::Ok);
    let acc = ok.map(|t| accounted(&t.result, devs)).unwrap_or_default();
    let layers = split.layers();
    let ngl = layers.iter().sum();
    let fits = match ok {
        Some(t) => under_caps(&t.result.accounted_per_device(), split, devs),
        None => fits(&predicted, devs),
    };
    let note = match t {
        Some(t) if t.result.status != TrialStatus::Ok => {
            format!("{}: {}", t.result.status.as_str(), t.result.reason.clone().unwrap_or_default())
        }
        _ if !fits => "over a device's cap".to_string(),
        _ => String::new(),
    };
    let threads = t.map_or(inp.threads, |t| t.result.spec.placement.n_threads);
    // What the trial ran (the q8_0 hatch's cache, or the workload's own), else the workload's own.
    let kv = t.map_or(s.workload.kv_type, |t| t.result.spec.placement.kv_type);
    let cpu_ffn = t.map_or(0, |t| t.result.spec.placement.n_cpu_ffn);
    let order = if split.in_llama_order() {
        Vec::new()
    } else {
        split.order().into_iter().map(|d| u32::try_from(d).unwrap_or(0)).collect()
    };
    SplitOption {
        label: label.to_string(),
        placement: split_placement(ngl, split, (kv, cpu_ffn), threads, inp),
        tensor_split: layers,
        order,
        predicted_bytes: predicted,
        accounted_bytes: acc,
        measured: ok.is_some(),
        tg_ts: ok.and_then(|t| t.result.test(false).map(|x| x.avg_ts)),
        pp_ts: ok.and_then(|t| t.result.test(true).map(|x| x.avg_ts)),
        fits,
        recommended: false,
        note,
        quality: None,
        predicted_tg_ts: None,
        predicted_pp_ts: None,
    }
}

/// [`choose`] again after more options: the notes that compared with the
/// last recommendation go first.
pub(in crate::tune) fn choose_again(found: &mut SplitFound, s: &Settings) {
    for x in &mut found.options {
        if x.note.ends_with("against the recommendation") {
            x.note.clear();
        }
    }
    choose(found, s);
}

/// Whether a split of `ngl` layers may be recommended: any, unless
/// `--ngl` fixes the count (`most`: full offload's, as the options have it).
pub(in crate::tune) fn eligible(policy: &crate::profile::SearchPolicy, most: u32, ngl: u32) -> bool {
    policy.grid.as_ref().filter(|g| g.len() == 1).is_none_or(|g| g[0].min(most) == ngl)
}

/// Marks the fastest measured option under every cap (by the objective)
/// and says how the others compare.
pub fn choose(found: &mut SplitFound, s: &Settings) {
    let score = |o: &SplitOption| s.scoring().speeds(o.tg_ts, o.pp_ts);
    let most = found.options.iter().map(|o| o.placement.n_gpu_layers).max().unwrap_or(0);
    // A quantized cache the workload did not ask for (the q8_0 hatch's).
    let lossy = |o: &SplitOption| o.placement.kv_type != s.workload.kv_type && o.placement.kv_type.is_quantized();
    let gate = |o: &SplitOption| match &o.quality {
        None => Some("quality not measured: not recommended blind".to_string()),
        Some(q) => q.fails(&s.gate),
    };
    let ok = |o: &SplitOption| {
        o.measured && o.fits && eligible(&s.policy, most, o.placement.n_gpu_layers) && (!lossy(o) || gate(o).is_none())
    };
    let best_of = |lossless: bool| {
        found
            .options
            .iter()
            .enumerate()
            .filter(|(_, o)| ok(o) && !(lossless && lossy(o)))
            .filter_map(|(i, o)| score(o).map(|v| (i, v)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    };
    // A lossy cache only where it pays: faster than the best lossless split by LOSSY_MARGIN.
    let best = match (best_of(false), best_of(true)) {
        (Some((i, v)), Some(l)) if lossy(&found.options[i]) && v < l.1 * (1.0 + LOSSY_MARGIN) => Some(l),
        (b, _) => b,
    };
    found.best = best.map(|(i, _)| i);
    let Some((bi, bv)) = best else {
        found.notes.push(crate::types::Note::over_cap("no measured split stays under every device's cap"));
        return;
    };
    for (i, o) in found.options.iter_mut().enumerate() {
        o.recommended = i == bi;
        if i == bi || !o.note.is_empty() {
            continue;
        }
        let failed = if lossy(o) && o.measured { gate(o) } else { None };
        if let Some(why) = failed {
            o.note = why;
        } else if let Some(v) = score(o) {
            o.note = format!("{:+.0}% against the recommendation", (v / bv - 1.0) * 100.0);
        }
    }
}

/// How much faster than the best lossless split a quantized KV cache's
/// must measure to be recommended.
pub const LOSSY_MARGIN: f64 = 0.05;
