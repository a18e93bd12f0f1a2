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
//! every split measured is measured (without probes, every one). Then a
//! q8_0 KV cache where it lets more layers onto the faster devices, split
//! modes row and tensor, and the answer paired with llama.cpp's default and
//! fit splits. The recommendation is the fastest measured split under
//! every device's cap.

use anyhow::Result;

use super::memory::DeviceCap;
use super::plan::{Candidate, Split};
use super::search::Search;
use super::speed::{Link, Measured, SpeedModel};
use crate::engine::predict::Prediction;
use crate::profile::{DeviceShare, Recommendation, Settings, SplitOption, SplitReport};
use crate::types::{KvType, LlamaDevice, Role, TrialStatus};

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

/// Whether bytes by buffer type stay under every cap: per device, or on
/// llama.cpp's meta device (split mode tensor, which does not say its bytes
/// per device) the whole under the caps of the devices `split` uses.
fn under_caps(by_type: &[(String, u64)], split: &Split, devs: &[DeviceCap]) -> bool {
    if by_type.iter().any(|(n, _)| n.starts_with("Meta")) {
        let total: u64 = by_type.iter().map(|(_, b)| *b).sum();
        let used = split.layers().into_iter().zip(devs).filter(|(l, _)| *l > 0);
        total <= used.map(|(_, d)| d.cap_bytes).sum::<u64>()
    } else {
        fits(&in_device_order(by_type, devs), devs)
    }
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

/// Each device's cost, and its capacity at full and at partial offload.
type Capacities = (Vec<DeviceCost>, Vec<u32>, Vec<u32>);

/// Each device's cost and its capacity in layers under its cap, at full
/// and at partial offload, from two dry runs (every device an even share,
/// and half that); `Err` says why the dry run gave no answer.
fn capacities(
    predict: &mut dyn FnMut(&[Split]) -> Vec<Prediction>,
    devs: &[DeviceCap],
    full: u32,
) -> Result<Capacities, String> {
    let even = proportional(full, &vec![full; devs.len()]);
    let half: Vec<u32> = even.iter().map(|l| l / 2).collect();
    let dry = predict(&[Split::new(&even), Split::new(&half)]);
    if dry.len() < 2 || dry.iter().any(|p| p.error.is_some()) {
        return Err(dry.iter().find_map(|p| p.error.clone()).unwrap_or_else(|| "no answer".into()));
    }
    let cost = costs((&even, &parts(&dry[0], devs)), (&half, &parts(&dry[1], devs)));
    let cap_at =
        |f: bool| -> Vec<u32> { cost.iter().zip(devs).map(|(c, d)| c.capacity(d.cap_bytes, f, full)).collect() };
    let (full_cap, partial_cap) = (cap_at(true), cap_at(false));
    Ok((cost, full_cap, partial_cap))
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
    /// Whether the model's FFN is experts (its spill is `--n-cpu-moe`,
    /// not tried across devices).
    pub is_moe: bool,
    /// A repeating layer's weights, mean bytes (what an FFN's share is of).
    pub layer_bytes: f64,
    /// What each device's link adds to a token ([`links`]); zero for a local device.
    pub links: Vec<Link>,
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

/// llama.cpp's flags of a split with a KV cache type (f16: the tune's
/// base) and the FFN of its first `cpu_ffn` layers on the CPU.
fn flags(
    ngl: u32,
    split: &Split,
    (kv, cpu_ffn): (KvType, u32),
    s: &Settings,
    threads: u32,
    inp: &SplitInputs<'_>,
) -> String {
    crate::types::Placement { n_cpu_ffn: cpu_ffn, ..crate::types::Placement::default() }
        .with_layers(ngl, threads, Some(s.n_ctx))
        .with_op_offload(inp.op_offload)
        .with_kv(kv)
        .with_split(&split.listed(), inp.rpc)
        .with_devices(&split.device_names(&names(inp.devs)))
        .with_split_mode(split.mode())
        .flags()
}

/// A split as `(label, layers and order)`.
type Labelled = (String, Split);

/// Priced exactly; a device over its cap gives up the layers its cost
/// says it must (to the CPU), up to three times. What fits every cap.
fn price_all(
    mut todo: Vec<Labelled>,
    predict: &mut dyn FnMut(&[Split]) -> Vec<Prediction>,
    devs: &[DeviceCap],
    cost: &[DeviceCost],
) -> Vec<(String, Split, Prediction)> {
    let mut priced: Vec<(String, Split, Prediction)> = Vec::new();
    for _round in 0..4 {
        if todo.is_empty() {
            break;
        }
        let splits: Vec<Split> = todo.iter().map(|(_, s)| *s).collect();
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
            let mut trimmed = split.layers();
            for (d, b) in bytes.iter().enumerate() {
                if *b > devs[d].cap_bytes {
                    trimmed[d] = trimmed[d].saturating_sub(cost[d].layers_for(*b - devs[d].cap_bytes));
                }
            }
            if trimmed != split.layers() && trimmed.iter().sum::<u32>() > 0 {
                next.push((label, Split::ordered(&trimmed, &split.order())));
            }
        }
        todo = next;
    }
    priced
}

/// Splits the search measures at most, by their predicted speed: the
/// fastest predicted where it is predicted faster than every split
/// measured (probes, llama.cpp's default), then the next only where, with
/// the boundary cost the first gives, it still is.
pub const MEASURED_BY_SPEED: usize = 2;

/// The rates of a trial (tg, pp), where it ran.
fn rates(t: &crate::profile::ProfileTrial) -> (Option<f64>, Option<f64>) {
    (t.result.test(false).map(|x| x.avg_ts), t.result.test(true).map(|x| x.avg_ts))
}

/// Layers per device of a split llama.cpp chose itself (its default, by
/// free memory), told by what each device allocated: its bytes less its
/// fixed cost, over its cost per layer, rounded, the rounding put right
/// on the device with the most.
fn layers_by_bytes(acc: &[u64], cost: &[DeviceCost], ngl: u32, full: u32) -> Option<Vec<u32>> {
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
fn default_splits(search: &Search<'_>, devs: &[DeviceCap], cost: &[DeviceCost], full: u32) -> Vec<Measured> {
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
fn probe_speeds(
    search: &mut Search<'_>,
    inp: &SplitInputs<'_>,
    (full_cap, partial_cap): (&[u32], &[u32]),
    predict: &mut dyn FnMut(&[Split]) -> Vec<Prediction>,
    (cost, defaults): (&[DeviceCost], &[Measured]),
    found: &mut SplitFound,
) -> Result<Option<(SpeedModel, Vec<Split>)>> {
    let (devs, full, threads) = (inp.devs, inp.full, inp.threads);
    let n = devs.len();
    let s = search.settings();
    let fixed_full = s.grid.as_ref().filter(|g| g.len() == 1).is_some_and(|g| g[0] >= full);
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
    for (label, split, p) in price_all(todo, predict, devs, cost) {
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
fn all_cpu(trials: &[crate::profile::ProfileTrial], threads: u32) -> Option<&crate::profile::ProfileTrial> {
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
fn solve(cpu: Option<(Option<f64>, Option<f64>)>, equations: &[Measured], inp: &SplitInputs<'_>) -> Option<SpeedModel> {
    let shape = (inp.devs.len(), inp.output_layers);
    match cpu {
        Some(rates) => SpeedModel::solve(rates, equations, shape, &inp.links),
        None => SpeedModel::solve_from(0.0, Some(0.0), equations, shape, &inp.links),
    }
}

/// The fastest splits by each device's measured speed, under the
/// capacities the costs give: every layer offloaded, and (unless `--ngl`
/// fixes the count) only the devices that beat the CPU.
fn speed_candidates(m: &SpeedModel, s: &Settings, full: u32, full_cap: &[u32], partial_cap: &[u32]) -> Vec<Labelled> {
    let fixed = s.grid.as_ref().filter(|g| g.len() == 1).map(|g| g[0].min(full));
    let w = (s.n_prompt, s.n_gen);
    let mut out = Vec::new();
    match fixed {
        Some(n) if n < full => out.extend(m.best(partial_cap, full, Some(n), s.objective, w)),
        Some(_) => out.extend(m.best(full_cap, full, Some(full), s.objective, w)),
        None => {
            out.extend(m.best(full_cap, full, Some(full), s.objective, w));
            out.extend(m.best(partial_cap, full, None, s.objective, w));
        }
    }
    let mut v: Vec<Labelled> = Vec::new();
    for b in out {
        if b.layers().iter().sum::<u32>() > 0 && !v.iter().any(|(_, x)| *x == b) {
            let label = if b.in_llama_order() {
                "fastest by each device's measured speed".to_string()
            } else {
                "fastest by each device's measured speed, the output's device last".to_string()
            };
            v.push((label, b));
        }
    }
    v
}

/// The objective's score of predicted rates.
fn predicted_score(m: &SpeedModel, s: &Settings, x: &Split) -> f64 {
    let (tg, pp) = m.predict(x);
    crate::tune::choose::score_for(s, Some(tg), pp).unwrap_or(0.0)
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
    predict: &mut dyn FnMut(&[Split]) -> Vec<Prediction>,
) -> Result<SplitFound> {
    let (devs, full) = (inp.devs, inp.full);
    let mut found = SplitFound::default();
    let (cost, full_cap, partial_cap) = match capacities(predict, devs, full) {
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
    let probed = probe_speeds(search, inp, (&full_cap, &partial_cap), predict, (&cost, &defaults), &mut found)?;
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
    let mut priced = price_all(todo, predict, devs, &cost);
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
    let score = |tg, pp| crate::tune::choose::score_for(s, tg, pp);
    let ok = |ngl: u32| eligible(s, full, ngl);
    let mut trials: Vec<Option<MeasuredSplit>> = vec![None; priced.len()];
    let mut measured: Vec<Measured> = defaults.to_vec();
    // What is measured already, under every cap: the probes and llama.cpp's default splits.
    let mut best = found
        .options
        .iter()
        .filter(|o| o.measured && o.fits && ok(o.n_gpu_layers))
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
                .max_by(|a, b| predicted_score(m, s, &priced[*a].1).total_cmp(&predicted_score(m, s, &priced[*b].1)))
                .filter(|i| predicted_score(m, s, &priced[*i].1) > best),
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
        o.n_gpu_layers = ngl;
        o.predicted_bytes.clone_from(&o.accounted_bytes);
        o.llama_cpp_args = flags(ngl, &Split::new(&[]), (KvType::F16, 0), s, t.result.spec.placement.n_threads, inp);
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
    split.with_mode(o.split_mode)
}

fn split_list(l: &[u32]) -> String {
    l.iter().map(u32::to_string).collect::<Vec<_>>().join(" + ")
}

/// Prices splits with a KV cache type and the FFN of the first K layers
/// on the CPU.
pub type HatchPricer<'a> = dyn FnMut(&[Split], crate::types::KvType, u32) -> Vec<Prediction> + 'a;

/// The escape hatch with several devices: a q8_0 KV cache (half an f16
/// cache's bytes per token) where it lets more layers onto the faster
/// devices. Each device's capacity is priced again with that cache (two dry
/// runs), the fastest split by each device's speed under those capacities
/// is priced exactly and, where it differs from every split measured and is
/// predicted faster than the recommendation, measured once, and the
/// cache's quality against f16 measured (`assess`, as for one device: it
/// does not depend on where the layers run). It is recommended only where
/// its quality passes the gate and it is faster than the best lossless
/// split by [`LOSSY_MARGIN`]. Not where the consumer's server fixes the
/// cache type.
///
/// # Errors
/// What the executor or `assess` returns (an interrupt).
pub fn kv_hatch(
    search: &mut Search<'_>,
    inp: &SplitInputs<'_>,
    found: &mut SplitFound,
    predict: &mut HatchPricer<'_>,
    assess: &mut dyn FnMut(crate::types::KvType) -> Result<Option<crate::types::Quality>>,
) -> Result<()> {
    let s = search.settings();
    let (Some(m), Some(best)) = (found.speed.clone(), found.best.map(|i| found.options[i].clone())) else {
        return Ok(());
    };
    if s.kv_type.is_quantized() {
        return Ok(());
    }
    let (devs, full) = (inp.devs, inp.full);
    let q8 = KvType::Q8_0;
    let Ok((cost, full_cap, partial_cap)) = capacities(&mut |x: &[Split]| predict(x, q8, 0), devs, full) else {
        return Ok(());
    };
    let best_score = crate::tune::choose::score_for(s, best.tg_ts, best.pp_ts).unwrap_or(0.0);
    let todo: Vec<Labelled> = speed_candidates(&m, s, full, &full_cap, &partial_cap)
        .into_iter()
        .filter(|(_, x)| !found.options.iter().any(|o| o.measured && split_of(o).layers() == x.layers()))
        .filter(|(_, x)| predicted_score(&m, s, x) > best_score)
        .map(|(_, x)| ("q8_0 KV cache: more layers on the faster devices".to_string(), x))
        .collect();
    let Some((label, split, p)) = price_all(todo, &mut |x: &[Split]| predict(x, q8, 0), devs, &cost).into_iter().next()
    else {
        return Ok(());
    };
    let ngl: u32 = split.layers().iter().sum();
    let c = Candidate { split, kv: q8, ..Candidate::layers(ngl, inp.threads) };
    let race = search.race();
    let t = search.measure(Role::Hatch, c, Some(race))?.clone();
    let quality = if t.result.status == TrialStatus::Ok { assess(q8)? } else { None };
    let mut o = option_of(&label, &split, per_device(&p, devs), Some(&t), s, inp);
    o.quality = quality;
    let (tg, pp) = m.predict(&split);
    (o.predicted_tg_ts, o.predicted_pp_ts) = (Some(tg), pp);
    found.options.push(o);
    choose_again(found, s);
    Ok(())
}

/// The CPU's own time per layer (tg, pp in ms) for a spill's prediction:
/// 0 where the costs are relative to the CPU, else from the search's
/// trial with every layer on the CPU (its time over the layers and the
/// output's work); `None` without one.
fn cpu_layer_ms(search: &Search<'_>, m: &SpeedModel, inp: &SplitInputs<'_>) -> Option<(f64, f64)> {
    if m.cpu_tg_ms > 0.0 {
        return Some((0.0, 0.0));
    }
    let t = all_cpu(&search.trials, inp.threads)?;
    let work = f64::from(inp.full.saturating_sub(1)) + inp.output_layers;
    let per = |ts: Option<f64>| ts.filter(|v| *v > 0.0).map_or(0.0, |v| 1000.0 / v / work);
    let (tg, pp) = rates(t);
    tg.is_some().then(|| (per(tg), per(pp)))
}

/// FFN spill with several devices: the fastest device alone with every
/// layer, the dense FFN weights of its first K layers on the CPU (`-ot`),
/// where the answer leaves it layers short. K is the fewest that fit its
/// cap, solved from two dry runs (K = 1 and every layer) and priced
/// exactly (one more while over, three times at most). The split is
/// measured once where each device's speed predicts it faster than the
/// recommendation (a spilled layer gives the CPU back its FFN's share of
/// the layer and crosses to it and back), or where the costs cannot
/// predict it (absolute, without a trial on the CPU); it is lossless and
/// chosen with the rest. Only where every layer may be offloaded (the
/// spilled layers are the first ones) and the model is dense.
///
/// # Errors
/// What the executor returns (an interrupt).
pub fn ffn_hatch(
    search: &mut Search<'_>,
    inp: &SplitInputs<'_>,
    found: &mut SplitFound,
    predict: &mut HatchPricer<'_>,
) -> Result<()> {
    let s = search.settings();
    let (Some(m), Some(best)) = (found.speed.clone(), found.best.map(|i| found.options[i].clone())) else {
        return Ok(());
    };
    let (devs, full, n_layer) = (inp.devs, inp.full, inp.full.saturating_sub(1));
    let Some(d) = m.fastest(s.objective, (s.n_prompt, s.n_gen)) else { return Ok(()) };
    if inp.is_moe || n_layer < 2 || !eligible(s, full, full) || best.tensor_split.get(d).is_some_and(|l| *l >= full) {
        return Ok(());
    }
    let mut layers = vec![0; devs.len()];
    layers[d] = full;
    let alone = Split::new(&layers);
    let (kv, cap) = (s.kv_type, devs[d].cap_bytes);
    let mut at = |k: u32| predict(&[alone], kv, k).into_iter().next().filter(|p| p.error.is_none());
    let (Some(one), Some(all)) = (at(1), at(n_layer)) else { return Ok(()) };
    let bytes = |p: &Prediction| parts(p, devs)[d].0;
    let dev = &devs[d].device;
    if per_device(&all, devs)[d] > cap {
        found.notes.push(crate::types::Note::split(format!(
            "FFN spill across devices not tried: {dev} does not hold every layer even with every FFN on the CPU"
        )));
        return Ok(());
    }
    #[allow(clippy::cast_precision_loss)]
    let ffn = bytes(&one).saturating_sub(bytes(&all)) as f64 / f64::from(n_layer - 1);
    if ffn <= 0.0 {
        return Ok(());
    }
    #[allow(clippy::cast_precision_loss)]
    let over = per_device(&one, devs)[d].saturating_sub(cap) as f64;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let mut k = (1 + (over / ffn).ceil() as u32).min(n_layer);
    let mut priced = (all, n_layer);
    for _ in 0..3 {
        match at(k) {
            Some(p) if per_device(&p, devs)[d] <= cap => {
                priced = (p, k);
                break;
            }
            _ if k < n_layer => k += 1,
            _ => break,
        }
    }
    let (p, k) = priced;
    let share = (ffn / inp.layer_bytes.max(1.0)).clamp(0.0, 1.0);
    let predicted = cpu_layer_ms(search, &m, inp).map(|cpu| m.predict_spilled(&alone, (d, k, share), cpu));
    let score = |tg: Option<f64>, pp| crate::tune::choose::score_for(s, tg, pp);
    let best_score = score(best.tg_ts, best.pp_ts).unwrap_or(0.0);
    if let Some((tg, pp)) = predicted.filter(|(tg, pp)| score(Some(*tg), *pp).unwrap_or(0.0) <= best_score) {
        let pp = pp.map_or(String::new(), |v| format!(", pp {v:.2}"));
        found.notes.push(crate::types::Note::split(format!(
            "FFN spill across devices not measured: {dev} alone with the FFN of {k} layers on the CPU is predicted slower (tg {tg:.2}{pp} t/s) than the recommendation"
        )));
        return Ok(());
    }
    search.predicted.push(p.clone());
    let c = Candidate { split: alone, n_cpu_ffn: k, ..Candidate::layers(full, inp.threads) };
    let race = search.race();
    let t = search.measure(Role::Hatch, c, Some(race))?.clone();
    let label = format!("FFN spill: {dev} alone, the FFN of its first {k} layers on the CPU");
    let mut o = option_of(&label, &alone, per_device(&p, devs), Some(&t), s, inp);
    (o.predicted_tg_ts, o.predicted_pp_ts) = predicted.map_or((None, None), |(tg, pp)| (Some(tg), pp));
    found.options.push(o);
    choose_again(found, s);
    Ok(())
}

/// The split modes beside layer for the recommended split: row (each
/// matrix's rows across the devices; llama.cpp needs a backend with split
/// buffers, CUDA or SYCL) and tensor (every weight and the KV cache across
/// the devices, llama.cpp's experimental meta device), each priced by
/// llama.cpp's dry run with the recommended proportions and, where it
/// answers and stays under the caps (tensor: its whole under the caps of
/// the devices it uses, as the meta device does not say its bytes per
/// device), measured once and chosen with the rest. What each came to, in
/// words, goes to `found.split_modes`. Where the answer holds layers on one
/// device, there is nothing to split.
///
/// # Errors
/// What the executor returns (an interrupt).
pub fn split_modes(
    search: &mut Search<'_>,
    inp: &SplitInputs<'_>,
    found: &mut SplitFound,
    predict: &mut dyn FnMut(&[Split]) -> Vec<Prediction>,
) -> Result<()> {
    use crate::types::SplitMode;
    let devs = inp.devs;
    let Some(best) = found.best.map(|i| found.options[i].clone()) else { return Ok(()) };
    let layers = &best.tensor_split;
    if layers.iter().filter(|l| **l > 0).count() < 2 {
        found.split_modes = vec!["split modes row and tensor: not tried, the answer holds layers on one device".into()];
        return Ok(());
    }
    let mut measured = false;
    for mode in [SplitMode::Row, SplitMode::Tensor] {
        let split = split_of(&best).with_mode(mode);
        let said = match predict(&[split]).into_iter().next() {
            None => "no answer from llama.cpp's dry run".to_string(),
            Some(p) => match &p.error {
                Some(e) => format!("llama.cpp refuses it: {}", e.split(": ").last().unwrap_or(e)),
                None => {
                    let total: u64 = p.per_device().iter().map(|(_, b)| *b).sum();
                    if !under_caps(&p.per_device(), &split, devs) {
                        format!("priced {} in all: over the caps", crate::model::human_bytes(total))
                    } else {
                        let ngl: u32 = layers.iter().sum();
                        let c = Candidate { split, kv: best.kv_type, ..Candidate::layers(ngl, inp.threads) };
                        let race = search.race();
                        let t = search.measure(Role::Split, c, Some(race))?.clone();
                        let s = search.settings();
                        let label = format!("the same proportions, -sm {}", mode.as_str());
                        let mut o = option_of(&label, &split, per_device(&p, devs), Some(&t), s, inp);
                        o.quality.clone_from(&best.quality);
                        found.options.push(o);
                        measured = true;
                        format!(
                            "priced {} in all, measured: {}",
                            crate::model::human_bytes(total),
                            t.result.status.as_str()
                        )
                    }
                }
            },
        };
        found.split_modes.push(format!("split mode {} with the answer's proportions: {said}", mode.as_str()));
    }
    if measured {
        choose_again(found, search.settings());
    }
    Ok(())
}

/// llama.cpp's fit for the caps as a candidate split: its layers (-1:
/// every layer) and its proportions as whole layers per device (none: its
/// default split by free memory).
fn fit_split(fit: &crate::engine::predict::LlamaFitSplit, full: u32, n_devices: usize) -> Option<Vec<u32>> {
    let ngl = match fit.n_gpu_layers? {
        n if n < 0 => full,
        n => u32::try_from(n).ok()?.min(full),
    };
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let weights: Vec<u32> = fit.tensor_split.iter().map(|v| v.max(0.0).round() as u32).collect();
    if weights.iter().all(|w| *w == 0) || ngl == 0 {
        // Its default split: no -ts, only the layer count.
        return Some(vec![ngl]);
    }
    let mut weights = weights;
    weights.resize(n_devices, 0);
    if weights.iter().sum::<u32>() == ngl {
        return Some(weights);
    }
    let total: u32 = weights.iter().sum();
    Some(proportional(ngl, &weights.iter().map(|w| w * ngl.div_ceil(total.max(1)).max(1)).collect::<Vec<_>>()))
}

/// The recommended split measured alternately with llama.cpp's default
/// split at the same layer count and with llama.cpp's fit for the same
/// caps, at the search's depth. Where llama.cpp's default split is as fast
/// (within the noise), or either is faster beyond it, and stays under
/// every cap, it becomes the recommendation.
///
/// # Errors
/// What the executor returns (an interrupt).
pub fn against_llama(
    search: &mut Search<'_>,
    found: &mut SplitFound,
    inp: &SplitInputs<'_>,
    fit: Option<&crate::engine::predict::LlamaFitSplit>,
) -> Result<Vec<crate::profile::SplitComparison>> {
    use crate::profile::{DefaultComparison, SplitComparison, Verdict};
    let Some(best) = found.best.map(|i| found.options[i].clone()) else { return Ok(Vec::new()) };
    let s = search.settings();
    let threads = inp.threads;
    let candidate = |layers: &[u32]| match layers {
        [ngl] if inp.devs.len() > 1 => Candidate::layers(*ngl, threads),
        l => Candidate { split: Split::new(l), ..Candidate::layers(l.iter().sum(), threads) },
    };
    let mine = if best.tensor_split.is_empty() {
        Candidate::layers(best.n_gpu_layers, threads)
    } else {
        let c = Candidate::layers(best.n_gpu_layers, threads);
        Candidate { split: split_of(&best), kv: best.kv_type, n_cpu_ffn: best.n_cpu_ffn, ..c }
    };
    let mut sides: Vec<(String, Vec<u32>)> =
        vec![("llama.cpp's default split (by free memory)".into(), vec![best.n_gpu_layers])];
    match fit.and_then(|f| fit_split(f, inp.full, inp.devs.len())) {
        Some(l) if l == sides[0].1 => sides[0].0 += ", which llama.cpp's fit for the same caps chooses too",
        Some(l) => sides.push(("llama.cpp's fit for the same caps".into(), l)),
        None => {}
    }
    let mut out = Vec::new();
    let mut switch: Option<(String, Candidate)> = None;
    for (label, layers) in sides {
        let theirs = candidate(&layers);
        let split = if theirs.split == Split::default() { Split::new(&[]) } else { theirs.split };
        let mut r = DefaultComparison {
            n_gpu_layers: Some(theirs.ngl),
            llama_cpp_args: flags(theirs.ngl, &split, (KvType::F16, 0), s, threads, inp),
            pairs: 0,
            n_depth: s.depth_at(s.n_ctx),
            tg_ratio: None,
            tg_half_width: None,
            pp_ratio: None,
            pp_half_width: None,
            verdict: Verdict::Same,
            note: String::new(),
            n_threads: Some(threads),
            over_cap: false,
            n_ctx: None,
            cpu_overrides: Vec::new(),
            predicted_bytes: None,
            mem_bytes: None,
        };
        if theirs == mine {
            r.note = "the recommendation is this split".into();
        } else {
            let cut = super::baseline::pair(search, mine, theirs, &mut r)?;
            let default = label.starts_with("llama.cpp's default");
            r.note = match r.verdict {
                Verdict::Faster if cut => crate::profile::CUT_SHORT.into(),
                Verdict::Tie if default => "within the noise: llama.cpp's default split is recommended".into(),
                Verdict::Tie => "within the noise".into(),
                Verdict::Slower => "theirs was faster beyond the noise: it is recommended".into(),
                Verdict::NotMeasured => "a side of the pairs did not complete: not judged".into(),
                _ => String::new(),
            };
            let wins = r.verdict == Verdict::Slower || (default && r.verdict == Verdict::Tie);
            if wins && switch.is_none() {
                switch = Some((label.clone(), theirs));
            }
        }
        let tensor_split = if layers.len() > 1 || inp.devs.len() == 1 { layers } else { Vec::new() };
        // What the devices' speeds said of a split of llama.cpp's with proportions, before it ran.
        let predicted_tg_ts =
            found.speed.as_ref().filter(|_| !tensor_split.is_empty()).map(|m| m.predict(&Split::new(&tensor_split)).0);
        let tg_ts = super::baseline::paired_mean(&search.trials, theirs, false);
        out.push(SplitComparison { against: label, tensor_split, predicted_tg_ts, tg_ts, result: r });
    }
    if let Some((label, theirs)) = switch {
        recommend_paired(search, found, inp, &label, theirs);
    }
    Ok(out)
}

/// Makes the paired side `theirs` the recommended option, where its
/// paired trials stay under every cap; else says why not.
fn recommend_paired(
    search: &Search<'_>,
    found: &mut SplitFound,
    inp: &SplitInputs<'_>,
    label: &str,
    theirs: Candidate,
) {
    let s = search.settings();
    let Some(t) = search.trials.iter().rev().find(|t| t.role == Role::Paired && theirs.is(&t.result.spec)) else {
        return;
    };
    let split = if theirs.split == Split::default() { Split::new(&[]) } else { theirs.split };
    let acc = accounted(&t.result, inp.devs);
    let mut o = option_of(&format!("{label}, paired"), &split, acc.clone(), Some(t), s, inp);
    o.n_gpu_layers = theirs.ngl;
    o.predicted_bytes = acc;
    if !o.fits {
        found.notes.push(crate::types::Note::split(format!(
            "{label} was as fast or faster, but over a device's cap: the tuned split stays recommended"
        )));
        return;
    }
    for x in &mut found.options {
        x.recommended = false;
    }
    o.recommended = true;
    o.note = "paired with the tuned split: as fast or faster".into();
    found.options.push(o);
    found.best = Some(found.options.len() - 1);
}

/// What llama.cpp allocated on each device in a trial.
#[must_use]
pub fn accounted(r: &crate::types::TrialResult, devs: &[DeviceCap]) -> Vec<u64> {
    in_device_order(&r.accounted_per_device(), devs)
}

fn option_of(
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
    // A cache type other than the tune's base is the q8_0 hatch's.
    let kv = t
        .map(|t| &t.result.spec)
        .filter(|x| x.placement.kv_type != x.kv_base)
        .map_or(KvType::F16, |x| x.placement.kv_type);
    let cpu_ffn = t.map_or(0, |t| t.result.spec.placement.n_cpu_ffn);
    let order = if split.in_llama_order() {
        Vec::new()
    } else {
        split.order().into_iter().map(|d| u32::try_from(d).unwrap_or(0)).collect()
    };
    SplitOption {
        label: label.to_string(),
        n_gpu_layers: ngl,
        tensor_split: layers,
        order,
        split_mode: split.mode(),
        predicted_bytes: predicted,
        accounted_bytes: acc,
        measured: ok.is_some(),
        tg_ts: ok.and_then(|t| t.result.test(false).map(|x| x.avg_ts)),
        pp_ts: ok.and_then(|t| t.result.test(true).map(|x| x.avg_ts)),
        fits,
        recommended: false,
        note,
        llama_cpp_args: flags(ngl, split, (kv, cpu_ffn), s, threads, inp),
        kv_type: kv,
        n_cpu_ffn: cpu_ffn,
        quality: None,
        predicted_tg_ts: None,
        predicted_pp_ts: None,
    }
}

/// [`choose`] again after more options: the notes that compared with the
/// last recommendation go first.
fn choose_again(found: &mut SplitFound, s: &Settings) {
    for x in &mut found.options {
        if x.note.ends_with("against the recommendation") {
            x.note.clear();
        }
    }
    choose(found, s);
}

/// Whether a split of `ngl` layers may be recommended: any, unless
/// `--ngl` fixes the count (`most`: full offload's, as the options have it).
fn eligible(s: &Settings, most: u32, ngl: u32) -> bool {
    s.grid.as_ref().filter(|g| g.len() == 1).is_none_or(|g| g[0].min(most) == ngl)
}

/// Marks the fastest measured option under every cap (by the objective)
/// and says how the others compare.
pub fn choose(found: &mut SplitFound, s: &Settings) {
    let score = |o: &SplitOption| crate::tune::choose::score_for(s, o.tg_ts, o.pp_ts);
    let most = found.options.iter().map(|o| o.n_gpu_layers).max().unwrap_or(0);
    let lossy = |o: &SplitOption| o.kv_type.is_quantized();
    let gate = |o: &SplitOption| match &o.quality {
        None => Some("quality not measured: not recommended blind".to_string()),
        Some(q) => q.fails(s.max_kl, s.min_top1),
    };
    let ok =
        |o: &SplitOption| o.measured && o.fits && eligible(s, most, o.n_gpu_layers) && (!lossy(o) || gate(o).is_none());
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
    let empty = SplitOption::default();
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
                bandwidth: r.bandwidth,
            })
            .collect(),
        crossing_tg_ms: found.crossing_tg_ms,
        against: found.against.clone(),
        split_modes: found.split_modes.clone(),
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
    r.n_cpu_ffn = o.n_cpu_ffn;
    r.kv_type = o.kv_type;
    let split = split_of(o);
    r.tensor_split = split.listed();
    r.devices = split.device_names(&names(devs));
    r.split_mode = split.mode();
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
            measured,
            tg_ts: Some(tg),
            pp_ts: Some(tg * 10.0),
            fits,
            ..SplitOption::default()
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
        split_prediction_kv(split, extra_d1, crate::types::KvType::F16, 0)
    }

    /// As [`split_prediction`], a layer 8 MB with a q8_0 KV cache (its
    /// cache half the size), the FFN (6 MB of a layer) of the first
    /// `cpu_ffn` layers on the CPU (they are on the first device with layers).
    fn split_prediction_kv(split: &[u32], extra_d1: u64, kv: crate::types::KvType, cpu_ffn: u32) -> Prediction {
        let mb = 1_000_000u64;
        let per = if kv.is_quantized() { 8 } else { 10 };
        let first = usize::from(split[0] == 0);
        let spilled = |d: usize| if d == first { u64::from(cpu_ffn.min(split[d])) * 6 * mb } else { 0 };
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
                buf("D0", u64::from(split[0]) * per * mb - spilled(0), 5 * mb),
                buf(
                    "D1",
                    u64::from(split[1]) * per * mb + 10 * mb + d1_extra - spilled(1),
                    if full { 20 * mb } else { 8 * mb },
                ),
            ],
            error: None,
            case: None,
            split: split.to_vec(),
            devices: Vec::new(),
        }
    }

    /// The fake world's inputs: 21 layers (the output one of them), local
    /// devices (no link), a layer 10 MB.
    fn inputs<'a>(devs: &'a [DeviceCap], rpc: &'a [String]) -> SplitInputs<'a> {
        SplitInputs {
            devs,
            full: 21,
            threads: 2,
            rpc,
            op_offload: true,
            output_layers: 1.0,
            is_moe: false,
            layer_bytes: 10e6,
            links: vec![Link::default(); devs.len()],
        }
    }

    /// Measures what the dry run priced: per-device buffers as predicted,
    /// tg faster the more layers D1 holds.
    struct SplitWorld {
        extra_d1: u64,
        measured: Vec<Vec<u32>>,
        /// What `-sm tensor` adds to a token (ms; negative: saves).
        tensor_ms: f64,
    }

    impl crate::tune::executor::TrialExecutor for SplitWorld {
        fn measure(&mut self, c: Candidate, race: Option<crate::types::Race>) -> Result<crate::types::TrialResult> {
            use crate::types::{BufferLine, TestResult, TrialResult};
            let listed = c.split.layers();
            // llama.cpp's default split (no -ts) is recorded as its layer count alone.
            self.measured.push(if listed.is_empty() && c.ngl > 0 { vec![c.ngl] } else { listed.clone() });
            // Without -ts, llama.cpp's default split: by free memory, as much on each.
            let split = if listed.is_empty() { proportional(c.ngl, &[c.ngl, c.ngl]) } else { listed };
            let names: Vec<String> = (0..split.len()).map(|i| format!("D{i}")).collect();
            let spec = crate::tune::executor::spec_of(&crate::engine::test_spec(), &names, c, race);
            let mut r = TrialResult::failed(spec, TrialStatus::Ok, String::new());
            r.reason = None;
            for b in split_prediction_kv(&split, self.extra_d1, c.kv, c.n_cpu_ffn).buffers {
                let bytes = b.model + b.compute;
                r.model_buffers.push(BufferLine { buffer_type: b.buffer_type, kind: "model".into(), bytes });
            }
            // 20 ms a token on the CPU; a layer on D0 adds 1 ms (slower
            // than the CPU), a layer on D1 saves 0.5 ms.
            let tensor = if c.split.mode() == crate::types::SplitMode::Tensor { self.tensor_ms } else { 0.0 };
            // A layer whose FFN (0.6 of its work) runs on the CPU gives that share back.
            let gain = [1.0, -0.5];
            let first = usize::from(split[0] == 0);
            let spill = -0.6 * gain[first] * f64::from(c.n_cpu_ffn.min(split[first]));
            let ms = 20.0 + gain[0] * f64::from(split[0]) + gain[1] * f64::from(split[1]) + tensor + spill;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let ns = (16.0 * ms * 1e6) as u64;
            r.tests.push(TestResult::from_samples(0, 16, 256, vec![ns; 2]));
            r.tests.push(TestResult::from_samples(64, 0, 256, vec![ns / 10; 2]));
            Ok(r)
        }
    }

    fn split_world(extra_d1: u64) -> (SplitFound, Vec<Vec<u32>>) {
        let s = crate::tune::worlds::settings();
        let mut world = SplitWorld { extra_d1, measured: Vec::new(), tensor_ms: 0.0 };
        let progress = crate::progress::Progress::hidden();
        let policy = crate::tune::worlds::policy(255e6);
        let mut search = Search::new(&s, &mut world, Some(policy), progress, None);
        let mb = 1_000_000u64;
        let devs = caps(&[105 * mb, 150 * mb]);
        let inp = inputs(&devs, &[]);
        let mut priced = Vec::new();
        let mut predict = |splits: &[Split]| {
            priced.extend(splits.iter().map(Split::layers));
            splits.iter().map(|s| split_prediction(&s.layers(), extra_d1)).collect()
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
            [vec![], vec![10, 0], vec![0, 13]],
            "every layer on the CPU, each device alone; no split is predicted faster than D1 alone"
        );
        let best = &found.options[found.best.unwrap()];
        assert_eq!(best.tensor_split, [0, 13], "the slow device left out, the rest on the CPU");
        assert!(found.options.iter().all(|o| o.fits));
        let listed: Vec<(Vec<u32>, bool)> =
            found.options.iter().map(|o| (o.tensor_split.clone(), o.measured)).collect();
        assert!(listed.contains(&(vec![9, 12], false)), "priced, not measured: {listed:?}");
        assert_eq!(best.accounted_bytes, best.predicted_bytes);
        // The probes are the model's inputs: no prediction of their own.
        assert!(found.options.iter().filter(|o| o.label.starts_with("probe")).all(|o| o.predicted_tg_ts.is_none()));
        // D1 costs 25 MB more at 12 layers than the probes said: [9, 12]
        // is over its cap, loses the layers that covers, and is priced as [9, 9].
        let (found, _) = split_world(25_000_000);
        let splits: Vec<Vec<u32>> = found.options.iter().map(|o| o.tensor_split.clone()).collect();
        assert!(!splits.contains(&vec![9, 12]) && splits.contains(&vec![9, 9]), "trimmed: {splits:?}");
        assert!(found.options.iter().all(|o| o.fits));
    }

    #[test]
    fn with_every_layer_offloaded_the_fast_device_takes_what_it_holds() {
        // --ngl 21: all layers on the devices, so the slow one must take some.
        let mut s = crate::tune::worlds::settings();
        s.grid = Some(vec![21]);
        let mut world = SplitWorld { extra_d1: 0, measured: Vec::new(), tensor_ms: 0.0 };
        let policy = crate::tune::worlds::policy(255e6);
        let mut search = Search::new(&s, &mut world, Some(policy), crate::progress::Progress::hidden(), None);
        let mb = 1_000_000u64;
        let devs = caps(&[105 * mb, 150 * mb]);
        let inp = inputs(&devs, &[]);
        let mut predict = |splits: &[Split]| splits.iter().map(|s| split_prediction(&s.layers(), 0)).collect();
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

    #[test]
    fn beside_llama_cpps_default_split_one_probe_a_device_and_the_answer_is_paired_with_llama_cpps() {
        // --ngl 21; the search measured llama.cpp's default split (11 + 10, over D0's cap).
        let fit = crate::engine::predict::LlamaFitSplit {
            margins: Vec::new(),
            n_gpu_layers: Some(21),
            tensor_split: vec![10.0, 11.0],
            error: None,
        };
        let (found, measured) = fixed_world(|search, inp, found, _| {
            found.against = against_llama(search, found, inp, Some(&fit)).unwrap();
        });
        // D0 (11 layers in the default) leads, D1 (10) is solved from it: only D0 is probed (it cannot
        // hold all 21 layers: alone with the rest on the CPU, beside every layer on the CPU), then the
        // fastest predicted with every layer offloaded.
        let stage: Vec<Vec<u32>> = measured[..4].to_vec();
        assert_eq!(stage, [vec![21], vec![], vec![10, 0], vec![9, 12]], "3 trials beside the search's");
        let best = &found.options[found.best.unwrap()];
        assert_eq!((best.tensor_split.clone(), best.n_gpu_layers), (vec![9, 12], 21));
        // Every measured split beyond the model's inputs (the probe, the default) was predicted:
        // 20 ms a token on the CPU, +1 ms a layer on D0, -0.5 on D1.
        let predicted: Vec<&SplitOption> =
            found.options.iter().filter(|o| o.measured && o.predicted_tg_ts.is_some()).collect();
        assert_eq!(predicted.iter().map(|o| o.tensor_split.clone()).collect::<Vec<_>>(), [vec![9, 12]]);
        for o in predicted {
            let (p, m) = (o.predicted_tg_ts.unwrap(), o.tg_ts.unwrap());
            assert!((p / m - 1.0).abs() < 0.01, "{}: predicted {p}, measured {m}", o.label);
        }
        // Paired with the default split (26 ms a token) and llama.cpp's fit for the caps (10 + 11: 24.5 ms).
        assert_eq!(measured.len(), 4 + 12, "three pairs of two trials against each");
        let a = &found.against;
        assert_eq!(a.len(), 2);
        assert!(a
            .iter()
            .all(|c| c.result.verdict == crate::profile::Verdict::Faster
                && c.result.pairs == super::super::baseline::PAIRS));
        assert!((a[0].result.tg_ratio.unwrap() - 26.0 / 23.0).abs() < 1e-3, "{:?}", a[0]);
        assert!((a[1].result.tg_ratio.unwrap() - 24.5 / 23.0).abs() < 1e-3, "{:?}", a[1]);
        assert_eq!(a[1].tensor_split, [10, 11]);
    }

    #[test]
    fn a_split_in_another_order_is_run_and_emitted_with_its_device_list() {
        let s = crate::tune::worlds::settings();
        let devs = caps(&[1, 1]);
        let rpc = ["10.0.0.2:50052".to_string()];
        let inp = inputs(&devs, &rpc);
        // 13 layers on D1 first, the output's layer on D0 last.
        let split = Split::ordered(&[1, 13], &[1, 0]);
        let o = option_of("x", &split, vec![0, 0], None, &s, &inp);
        assert_eq!((o.tensor_split.clone(), o.order.clone()), (vec![1, 13], vec![1, 0]));
        assert!(
            o.llama_cpp_args.contains("--device D1,D0") && o.llama_cpp_args.contains("-ts 13,1"),
            "{}",
            o.llama_cpp_args
        );
        assert_eq!(split_of(&o), split);
        let back = crate::llama_args::parse_placement(&o.llama_cpp_args).unwrap();
        assert_eq!((back.devices, back.tensor_split), (vec!["D1".to_string(), "D0".to_string()], vec![13, 1]));
        let c = Candidate { split, ..Candidate::layers(14, 2) };
        let names = ["D0".to_string(), "D1".to_string()];
        let spec = crate::tune::executor::spec_of(&crate::engine::test_spec(), &names, c, None);
        assert_eq!(
            (spec.placement.devices.clone(), spec.placement.tensor_split.clone()),
            (names.iter().rev().cloned().collect(), vec![13, 1])
        );
        assert!(c.is(&spec));
        let base = crate::tune::worlds::recommendation();
        let r = recommendation(&base, &o, &devs, &rpc);
        assert_eq!(
            (r.devices.clone(), r.tensor_split.clone()),
            (vec!["D1".to_string(), "D0".to_string()], vec![13, 1])
        );
        assert!(r.llama_cpp_args.contains("--device D1,D0"), "{}", r.llama_cpp_args);
        assert!(r.placement().server_env().iter().any(|(k, v)| *k == "LLAMA_ARG_DEVICE" && v == "D1,D0"));
    }

    /// --ngl 21 and llama.cpp's default split measured by the search, the
    /// split stage, then `then` (the search, the inputs, what the stage
    /// found, a pricer by KV type); what was found and measured.
    fn fixed_world(
        then: impl FnOnce(&mut Search<'_>, &SplitInputs<'_>, &mut SplitFound, &mut HatchPricer<'_>),
    ) -> (SplitFound, Vec<Vec<u32>>) {
        fixed_world_with(0.0, &[0.0, 0.0], then)
    }

    /// As [`fixed_world`], `-sm tensor` adding `tensor_ms` to a token, each
    /// device's link round trip `link_ms`.
    fn fixed_world_with(
        tensor_ms: f64,
        link_ms: &[f64],
        then: impl FnOnce(&mut Search<'_>, &SplitInputs<'_>, &mut SplitFound, &mut HatchPricer<'_>),
    ) -> (SplitFound, Vec<Vec<u32>>) {
        let mut s = crate::tune::worlds::settings();
        s.grid = Some(vec![21]);
        let mut world = SplitWorld { extra_d1: 0, measured: Vec::new(), tensor_ms };
        let policy = crate::tune::worlds::policy(255e6);
        let mut search = Search::new(&s, &mut world, Some(policy), crate::progress::Progress::hidden(), None);
        search.measure(Role::Grid, Candidate::layers(21, 2), None).unwrap();
        let mb = 1_000_000u64;
        let devs = caps(&[105 * mb, 150 * mb]);
        let mut inp = inputs(&devs, &[]);
        inp.links = link_ms.iter().map(|l| Link { tg_ms: *l, ..Link::default() }).collect();
        let mut predict = |x: &[Split], kv: crate::types::KvType, k: u32| -> Vec<Prediction> {
            x.iter().map(|s| split_prediction_kv(&s.layers(), 0, kv, k)).collect()
        };
        let mut found =
            split_stage(&mut search, &inp, &mut |x: &[Split]| predict(x, crate::types::KvType::F16, 0)).unwrap();
        then(&mut search, &inp, &mut found, &mut predict);
        drop(search);
        (found, world.measured)
    }

    /// The fixed world, then the q8_0 hatch with a cache of this quality
    /// (KL divergence 0.002 passes the default gate, 0.5 not).
    fn with_kv_hatch(kl: f64) -> (SplitFound, Vec<Vec<u32>>) {
        let quality = crate::types::Quality {
            kl_mean: kl,
            kl_p99: kl * 5.0,
            top1_agree: 0.99,
            tokens: 512,
            reference: "f16 KV cache".into(),
            non_finite: 0,
            depth: 0,
        };
        fixed_world(|search, inp, found, predict| {
            let mut assess = |_| Ok(Some(quality.clone()));
            kv_hatch(search, inp, found, predict, &mut assess).unwrap();
        })
    }

    #[test]
    fn a_q8_0_cache_is_measured_where_it_lets_more_layers_onto_the_fast_device() {
        // With a q8_0 cache a layer takes 8 MB: D1 holds 15 at full offload, 3 more than with f16.
        let (found, measured) = with_kv_hatch(0.002);
        assert_eq!(measured.last(), Some(&vec![6, 15]), "{measured:?}");
        let best = &found.options[found.best.unwrap()];
        assert_eq!((best.tensor_split.clone(), best.kv_type), (vec![6, 15], crate::types::KvType::Q8_0));
        // 20 + 6 - 7.5 = 18.5 ms a token, as predicted, against 23 for the f16 split.
        let (p, m) = (best.predicted_tg_ts.unwrap(), best.tg_ts.unwrap());
        assert!((p / m - 1.0).abs() < 0.01 && (m - 1000.0 / 18.5).abs() < 0.5, "{p} {m}");
        assert!(best.fits && best.llama_cpp_args.contains("-ctk q8_0 -ctv q8_0 -fa on"), "{}", best.llama_cpp_args);
        let devs = caps(&[105_000_000, 150_000_000]);
        let r = recommendation(&crate::tune::worlds::recommendation(), best, &devs, &[]);
        assert_eq!(r.kv_type, crate::types::KvType::Q8_0);
        // A cache whose quality fails the gate is measured, not recommended.
        let (found, _) = with_kv_hatch(0.5);
        let best = &found.options[found.best.unwrap()];
        assert_eq!((best.tensor_split.clone(), best.kv_type), (vec![9, 12], crate::types::KvType::F16));
        let q8 = found.options.iter().find(|o| o.kv_type.is_quantized()).unwrap();
        assert!(q8.measured && q8.note.contains("KL"), "{}", q8.note);
    }

    /// The fixed world, then FFN spill with these link costs, then the
    /// pairing with llama.cpp's default split; what was found, measured
    /// (layers), and the FFN layers on the CPU in each paired trial.
    fn with_ffn_hatch(link_ms: &[f64]) -> (SplitFound, Vec<Vec<u32>>, Vec<u32>) {
        let mut paired = Vec::new();
        let (found, measured) = fixed_world_with(0.0, link_ms, |search, inp, found, predict| {
            ffn_hatch(search, inp, found, predict).unwrap();
            found.against = against_llama(search, found, inp, None).unwrap();
            let trials = search.trials.iter().filter(|t| t.role == Role::Paired);
            paired = trials.map(|t| t.result.spec.placement.n_cpu_ffn).collect();
        });
        (found, measured, paired)
    }

    #[test]
    fn ffn_spill_lets_the_fast_device_hold_every_layer_where_it_is_predicted_faster() {
        // D1 (fast) holds 12 of 21 layers in f16; alone with all 21 it is 90 MB
        // over its 150 MB cap; the FFN (6 MB) of 15 layers on the CPU fits.
        let (found, measured, paired) = with_ffn_hatch(&[0.0, 0.0]);
        assert!(measured.contains(&vec![0, 21]), "{measured:?}");
        // Paired with llama.cpp's default split as it is emitted: the spill kept.
        assert_eq!(paired, vec![15, 0, 15, 0, 15, 0], "{measured:?}");
        let best = &found.options[found.best.unwrap()];
        assert_eq!((best.tensor_split.clone(), best.n_cpu_ffn), (vec![0, 21], 15), "{:?}", found.options);
        assert!(best.fits && best.accounted_bytes[1] <= 150_000_000, "{:?}", best.accounted_bytes);
        // 20 - 10.5 + 15 x 0.6 x 0.5 = 14 ms a token, as predicted, against 23 for 9 + 12.
        let (p, m) = (best.predicted_tg_ts.unwrap(), best.tg_ts.unwrap());
        assert!((p / m - 1.0).abs() < 0.01 && (m - 1000.0 / 14.0).abs() < 0.5, "{p} {m}");
        assert!(
            best.llama_cpp_args
                .contains("-ot 'blk\\.(0|1|2|3|4|5|6|7|8|9|10|11|12|13|14)\\.ffn_(up|down|gate)\\.weight=CPU'"),
            "{}",
            best.llama_cpp_args
        );
        assert!(best.llama_cpp_args.contains("-ts 0,21"), "{}", best.llama_cpp_args);
        let devs = caps(&[105_000_000, 150_000_000]);
        let r = recommendation(&crate::tune::worlds::recommendation(), best, &devs, &[]);
        assert_eq!((r.n_cpu_ffn, r.tensor_split.clone()), (15, vec![0, 21]));
        // Behind a link that costs 1 ms a token there and back, each spilled
        // layer crosses it again: 9.5 + 1 + 15 x 1.3 = 30 ms predicted,
        // slower than 23: not measured.
        let (found, measured, _) = with_ffn_hatch(&[0.0, 1.0]);
        assert!(!measured.contains(&vec![0, 21]), "{measured:?}");
        assert_eq!(found.options[found.best.unwrap()].tensor_split, vec![9, 12]);
        assert!(found.notes.iter().any(|n| n.to_string().contains("predicted slower")), "{:?}", found.notes);
    }

    /// Row refused by the dry run, tensor priced on llama.cpp's meta device (200 MiB).
    fn modes_dry_run(x: &[Split]) -> Vec<Prediction> {
        let mut p = split_prediction(&x[0].layers(), 0);
        match x[0].mode() {
            crate::types::SplitMode::Row => {
                p.error = Some("dry-run model load failed: device D0 does not support split buffers".into());
            }
            _ => {
                let meta = crate::engine::predict::PredictedBuffer {
                    buffer_type: "Meta()".into(),
                    is_host: false,
                    model: 200 << 20,
                    context: 0,
                    compute: 0,
                };
                p.buffers = vec![meta];
            }
        }
        vec![p]
    }

    #[test]
    fn split_modes_row_and_tensor_are_priced_measured_where_llama_cpp_can_and_chosen_on_speed() {
        use crate::types::SplitMode;
        // Tensor 2 ms a token slower than the layer split [9, 12]: measured, not recommended.
        let (found, measured) = fixed_world_with(2.0, &[0.0, 0.0], |search, inp, found, _| {
            split_modes(search, inp, found, &mut modes_dry_run).unwrap();
        });
        assert_eq!(measured.last(), Some(&vec![9, 12]), "the tensor trial, the answer's proportions");
        let modes = &found.split_modes;
        assert!(modes[0].contains("row") && modes[0].contains("does not support split buffers"), "{modes:?}");
        assert!(modes[1].contains("tensor") && modes[1].contains("200.00 MiB in all, measured: ok"), "{modes:?}");
        let tensor = found.options.iter().find(|o| o.split_mode == SplitMode::Tensor).unwrap();
        assert!(tensor.measured && tensor.fits && tensor.llama_cpp_args.contains("-sm tensor -ts 9,12"), "{tensor:?}");
        let best = &found.options[found.best.unwrap()];
        assert_eq!((best.split_mode, best.tensor_split.clone()), (SplitMode::Layer, vec![9, 12]));
        // Tensor 5 ms a token faster: recommended, emitted as such.
        let (found, _) = fixed_world_with(-5.0, &[0.0, 0.0], |search, inp, found, _| {
            split_modes(search, inp, found, &mut modes_dry_run).unwrap();
        });
        let best = &found.options[found.best.unwrap()];
        assert_eq!(best.split_mode, SplitMode::Tensor);
        let devs = caps(&[105_000_000, 150_000_000]);
        let r = recommendation(&crate::tune::worlds::recommendation(), best, &devs, &[]);
        assert!(r.split_mode == SplitMode::Tensor && r.llama_cpp_args.contains("-sm tensor"), "{}", r.llama_cpp_args);
        // One device holds the answer: nothing to split, nothing measured.
        let (found, _) = fixed_world(|search, inp, found, _| {
            let one = found.options.iter().position(|o| o.measured && o.tensor_split == [10, 0]).unwrap();
            found.best = Some(one);
            split_modes(search, inp, found, &mut |_| unreachable!()).unwrap();
        });
        assert!(found.split_modes[0].contains("one device"), "{:?}", found.split_modes);
    }
}
