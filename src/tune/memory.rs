//! Device memory in the tuner's currency: how it is measured on this
//! machine and the cap that follows, what a trial cost, llama.cpp's dry-run
//! prediction before any trial and how it held up.

use crate::engine::predict::Prediction;
use crate::model::{human_bytes, ModelInfo};
use crate::probe;
use crate::profile::{Caps, MemoryPolicy, PredictionReport, Settings};
use crate::types::{Hardware, LlamaDevice};
use crate::types::{Source, TrialResult, TrialStatus};

/// The one cap of a device: `target` of its `total` memory less what is
/// already in use there (`in_use`: other processes' memory, where the
/// memory source sees it; 0 where it does not), or `budget`
/// (`--vram-budget`) where that is stricter; and the reason in words
/// (`on`: the device, where the reason names it).
#[must_use]
pub fn cap_of(target: f64, total: u64, in_use: u64, budget: Option<u64>, on: Option<&str>) -> (f64, String) {
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let by_target = target * total as f64 - in_use as f64;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let reason = format!(
        "{:.0}% of {}{}{} = {}",
        target * 100.0,
        human_bytes(total),
        on.map(|d| format!(" on {d}")).unwrap_or_default(),
        if in_use > 0 { format!(", less {} already in use", human_bytes(in_use)) } else { String::new() },
        human_bytes(by_target.max(0.0) as u64)
    );
    match budget {
        #[allow(clippy::cast_precision_loss)]
        Some(b) if (b as f64) < by_target => {
            (b as f64, format!("--vram-budget {} (stricter than {reason})", human_bytes(b)))
        }
        _ => (by_target, reason),
    }
}

/// What other processes hold on a llama.cpp device, where its figures
/// move with use (see [`probe::ggml::has_budget`]); else 0.
#[must_use]
pub fn in_use(d: &LlamaDevice) -> u64 {
    if probe::ggml::has_budget(d) {
        d.memory_total.saturating_sub(d.memory_free)
    } else {
        0
    }
}

/// How device memory is measured on this machine and the cap that follows.
#[must_use]
pub fn memory_policy(hw: &Hardware, target: f64, budget: Option<u64>) -> Option<MemoryPolicy> {
    let mk = |source: Source, device: String, total: u64, baseline: u64| {
        let (cap, reason) = cap_of(target, total, baseline, budget, Some(&device));
        MemoryPolicy {
            source,
            device,
            device_total_bytes: Some(total),
            baseline_bytes: baseline,
            cap_bytes: cap,
            cap_reason: reason,
        }
    };
    // NVML may see a GPU this llama.cpp cannot use (a CPU-only build): then
    // ngl does nothing, whatever the card.
    let offload: Vec<&LlamaDevice> = hw.llama_devices.iter().filter(|d| d.is_offload_target()).collect();
    if offload.is_empty() {
        return None;
    }
    if let Some(g) = hw.gpus.iter().max_by_key(|g| g.memory_total.unwrap_or(0)) {
        let total = g.memory_total.unwrap_or(0);
        let baseline = total.saturating_sub(g.memory_free.unwrap_or(total));
        return Some(mk(Source::Nvml, format!("nvml{} ({})", g.index, g.name), total, baseline));
    }
    let dev = offload.iter().max_by_key(|d| d.memory_total)?;
    let short = dev.description.split(" (").next().unwrap_or(&dev.description);
    let name = format!("{} ({short})", dev.name);
    if probe::ggml::has_budget(dev) {
        Some(mk(Source::Ggml, name, dev.memory_total, in_use(dev)))
    } else {
        Some(mk(Source::Accounted, name, dev.memory_total, 0))
    }
}

/// The policy of a tuning: one device's (its `--vram-budget DEV=SIZE` as
/// its budget), or with several offload devices the sum of their caps in
/// llama.cpp's accounted memory for the whole-layer search, each device's
/// own cap being the split stage's to keep.
#[must_use]
pub fn policy_for(hw: &Hardware, asked: &Caps, caps: &[DeviceCap]) -> Option<MemoryPolicy> {
    if caps.len() < 2 {
        let named = asked.device_budgets.first().map(|b| b.bytes);
        let budget = named.into_iter().chain(asked.vram_budget_bytes).min();
        return memory_policy(hw, asked.target_vram, budget);
    }
    let names: Vec<String> = caps.iter().map(|c| format!("{} {}", c.device, human_bytes(c.cap_bytes))).collect();
    #[allow(clippy::cast_precision_loss)]
    let cap = caps.iter().map(|c| c.cap_bytes).sum::<u64>() as f64;
    Some(MemoryPolicy {
        source: Source::Accounted,
        device: format!(
            "{} devices ({})",
            caps.len(),
            caps.iter().map(|c| c.device.as_str()).collect::<Vec<_>>().join(", ")
        ),
        device_total_bytes: None,
        baseline_bytes: 0,
        cap_bytes: cap,
        cap_reason: format!(
            "each device's own cap ({}), checked per device on llama.cpp's accounted memory",
            names.join(", ")
        ),
    })
}

/// The share of the RAM free at the start a placement's host part may
/// take without `--host-budget` (the device's `--target-vram` default).
pub const HOST_SHARE: f64 = 0.9;

/// The host memory cap: `--host-budget`, else [`HOST_SHARE`] of the RAM
/// free when the tune started (or of the cgroup's limit, if lower), with
/// how it was set.
#[must_use]
pub fn host_cap(asked: &Caps, ram: &crate::types::RamInfo) -> (u64, String) {
    if let Some(b) = asked.host_budget_bytes {
        return (b, format!("--host-budget {}", human_bytes(b)));
    }
    let free = ram.cgroup_limit.map_or(ram.available, |l| l.min(ram.available));
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let cap = (free as f64 * HOST_SHARE) as u64;
    (
        cap,
        format!(
            "{:.0}% of the {} of RAM free at the start; --host-budget sets it",
            HOST_SHARE * 100.0,
            human_bytes(free)
        ),
    )
}

/// Refuses a tune where every whole-layer setting the device can hold
/// needs more host memory than the cap (it would only thrash): the least
/// it needs, and at which ngl. Nothing priced: nothing to refuse.
///
/// # Errors
/// `BadInput` naming the cap, the least need and the fix.
pub fn check_host(predictions: &[Prediction], device_cap: f64, host: &(u64, String)) -> anyhow::Result<()> {
    #[allow(clippy::cast_precision_loss)]
    let fitting: Vec<&Prediction> = predictions
        .iter()
        .filter(|p| p.error.is_none() && p.case.is_none() && p.split.is_empty())
        .filter(|p| p.n_gpu_layers == 0 || p.device_bytes as f64 <= device_cap)
        .collect();
    let Some(least) = fitting.iter().min_by_key(|p| p.host_bytes()) else { return Ok(()) };
    if least.host_bytes() <= host.0 {
        return Ok(());
    }
    Err(crate::error::bad(format!(
        "every placement that fits the device needs more host memory than the cap of {} ({}): the least is {} at ngl {}; free RAM, raise --host-budget, or use a smaller model",
        human_bytes(host.0),
        host.1,
        human_bytes(least.host_bytes()),
        least.n_gpu_layers
    )))
}

/// A model whose weights alone are over the host cap, with every layer
/// on the CPU (no offload device): it would page its weights from disk.
#[must_use]
pub fn weights_over_host(weights: u64, host: &(u64, String)) -> anyhow::Error {
    crate::error::bad(format!(
        "the model's weights alone ({}) are over the host memory cap of {} ({}) and every layer runs on the CPU here: free RAM, raise --host-budget, or use a smaller model",
        human_bytes(weights),
        human_bytes(host.0),
        host.1
    ))
}

/// What a trial cost in the policy's currency, and the device-wide peak.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn trial_memory(r: &TrialResult, policy: &MemoryPolicy) -> (Option<f64>, Option<u64>) {
    match policy.source {
        Source::Nvml | Source::Ggml => {
            let Some(m) = r.sampled.iter().filter(|m| m.source == policy.source).max_by_key(|m| m.peak_used) else {
                return (None, None);
            };
            let own = m.peak_pid_used.unwrap_or_else(|| m.peak_used.saturating_sub(m.baseline_used));
            (Some(own as f64), Some(m.peak_used))
        }
        _ => {
            if r.status != TrialStatus::Ok && r.model_buffers.is_empty() {
                return (None, None);
            }
            let acc = r.accounted_device_bytes();
            (Some(acc as f64), Some(policy.baseline_bytes + acc))
        }
    }
}

/// How a dry-run prediction held up in a finished trial: its error in
/// percent against llama.cpp's accounted memory, and, where a sampler is
/// trustworthy (NVML, or a llama.cpp device that reports its budget), the
/// sampled memory the trial cost minus the prediction: what llama.cpp does
/// not count (driver context, allocator slack).
#[must_use]
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
pub fn prediction_check(
    predicted: Option<u64>,
    r: &TrialResult,
    policy: Option<&MemoryPolicy>,
    mem: Option<f64>,
) -> (Option<f64>, Option<i64>) {
    match predicted {
        Some(pb) if r.status == TrialStatus::Ok => {
            let acc = r.accounted_device_bytes();
            // Nothing predicted and nothing allocated (ngl 0 without op offload) is exact.
            let err =
                if acc > 0 { Some((pb as f64 - acc as f64) / acc as f64 * 100.0) } else { (pb == 0).then_some(0.0) };
            let sampled = policy.filter(|p| p.source.is_sampled()).and(mem).map(|m| m as i64 - pb as i64);
            (err, sampled)
        }
        _ => (None, None),
    }
}

/// How Ollama starts llama-server's fit for this workload, where Ollama is
/// the consumer (with its fit off: every layer, priced).
fn ollama_ask(
    ollama: Option<&crate::profile::ConsumerRead>,
    slots: u32,
) -> Option<crate::engine::predict::OllamaFitAsk> {
    let c = ollama?;
    let fit = crate::consumer::ollama::fit(&c.vars);
    Some(crate::engine::predict::OllamaFitAsk { slots, target_bytes: fit.target_bytes, off: !fit.on })
}

/// Asks llama.cpp, before any trial, what every grid setting will allocate
/// on the device (its dry run) and what its own fit would choose for the
/// same memory margin.
pub fn predict(
    runner: &crate::engine::runner::Runner,
    (info, s, at): (&ModelInfo, &Settings, super::plan::ContextRun),
    policy: &MemoryPolicy,
    grid: &[u32],
    op_offload: bool,
) -> PredictionReport {
    use crate::engine::predict::{predict_in_child, PredictSpec};
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let margin =
        policy.device_total_bytes.map(|t| (t as f64 - policy.baseline_bytes as f64 - policy.cap_bytes).max(0.0) as u64);
    let spec = PredictSpec {
        ngl: grid.to_vec(),
        fit_margin_bytes: margin,
        default_fit: true,
        ollama_fit: ollama_ask(s.ollama(), s.workload.n_parallel),
        ..super::pricer::workload_spec(info, s, at, op_offload)
    };
    match predict_in_child(runner, &spec) {
        Ok(out) => {
            #[allow(clippy::cast_precision_loss)]
            let predicted_over_cap = out
                .predictions
                .iter()
                .filter(|p| p.n_gpu_layers > 0 && p.error.is_none() && p.device_bytes as f64 > policy.cap_bytes)
                .map(|p| p.n_gpu_layers)
                .collect();
            PredictionReport {
                predictions: out.predictions,
                llama_fit: out.llama_fit,
                default_fit: out.default_fit,
                ollama_fit: out.ollama_fit,
                predicted_over_cap,
                max_error_pct: None,
                llama_fit_tg_ts: None,
                error: None,
                mmproj: out.mmproj,
            }
        }
        Err(e) => PredictionReport {
            predictions: Vec::new(),
            llama_fit: None,
            default_fit: None,
            ollama_fit: None,
            predicted_over_cap: Vec::new(),
            max_error_pct: None,
            llama_fit_tg_ts: None,
            error: Some(format!("{e:#}")),
            mmproj: None,
        },
    }
}

/// The largest ngl whose dry-run prediction stays under the cap, with
/// memory taken as linear between the predicted grid points; full offload
/// when nothing was predicted.
#[must_use]
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn largest_predicted_under(predicted: &[Prediction], cap: f64, full: u32) -> u32 {
    let mut pts: Vec<(u32, f64)> =
        predicted.iter().filter(|p| p.error.is_none()).map(|p| (p.n_gpu_layers, p.device_bytes as f64)).collect();
    pts.sort_by_key(|p| p.0);
    if pts.is_empty() {
        return full;
    }
    let mut best = 0;
    for w in pts.windows(2) {
        let ((n0, m0), (n1, m1)) = (w[0], w[1]);
        if m1 <= cap {
            best = n1;
        } else if m0 <= cap && m1 > m0 {
            let x = f64::from(n0) + (cap - m0) / (m1 - m0) * f64::from(n1 - n0);
            best = best.max(x.floor() as u32);
            break;
        } else {
            break;
        }
    }
    best.min(full)
}

/// How many one-layer steps down a priced end point may take before the
/// grid point below it (known to fit) is used instead.
pub const MAX_PRICE_STEPS: u32 = 8;

/// The largest ngl at or below `n` whose dry-run price stays under `cap`:
/// an end point interpolated between grid points, or a confirmation the
/// fit chose, is priced before anything runs, and stepped down a layer at
/// a time while over (at most [`MAX_PRICE_STEPS`]; then `floor`, a setting
/// known to fit). A setting that cannot be priced is taken as it is.
pub fn priced_under(price: &mut dyn FnMut(u32) -> Option<u64>, n: u32, floor: u32, cap: f64) -> u32 {
    let mut ngl = n;
    for _ in 0..=MAX_PRICE_STEPS {
        if ngl <= floor {
            return floor.min(n);
        }
        #[allow(clippy::cast_precision_loss)]
        match price(ngl) {
            Some(b) if b as f64 > cap => ngl -= 1,
            _ => return ngl,
        }
    }
    floor.min(n)
}

/// llama.cpp's dry-run price of a whole-layer split at the settings'
/// workload (the device bytes), kept in `predictions`; priced once.
///
/// # Errors
/// When the dry run failed as a whole (a setting llama.cpp refuses is `None`).
pub fn price(
    pricer: &mut dyn super::pricer::Pricer,
    predictions: &mut Vec<Prediction>,
    ngl: u32,
) -> anyhow::Result<Option<u64>> {
    if let Some(p) = predictions.iter().find(|p| p.n_gpu_layers == ngl && p.case.is_none() && p.split.is_empty()) {
        return Ok(p.error.is_none().then_some(p.device_bytes));
    }
    let Some(p) = pricer.layers(&[ngl])?.into_iter().next() else { return Ok(None) };
    let bytes = p.error.is_none().then_some(p.device_bytes);
    predictions.push(p);
    Ok(bytes)
}

/// One offload device and its cap.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceCap {
    pub device: String,
    pub buffer_type: String,
    pub description: String,
    pub cap_bytes: u64,
    pub cap_reason: String,
}

/// The offload devices in llama.cpp's order (`llama_model_load`'s default
/// selection: RPC servers first, then GPUs, then integrated GPUs when no
/// GPU), with the buffer type each allocates in.
#[must_use]
pub fn offload_devices(devices: &[LlamaDevice]) -> Vec<(LlamaDevice, String)> {
    let rpc: Vec<&LlamaDevice> = devices.iter().filter(|d| d.is_offload_target() && d.is_remote()).collect();
    let gpus: Vec<&LlamaDevice> =
        devices.iter().filter(|d| d.kind == crate::types::DeviceKind::Gpu && !d.is_remote()).collect();
    let igpus: Vec<&LlamaDevice> =
        devices.iter().filter(|d| d.kind == crate::types::DeviceKind::Igpu && !d.is_remote()).collect();
    let mut out = Vec::new();
    for (i, d) in rpc.iter().enumerate() {
        // ggml-rpc names a buffer type by the server's device index and endpoint.
        let k = rpc[..i].iter().filter(|o| o.description == d.description).count();
        out.push(((*d).clone(), format!("RPC{k}[{}]", d.description)));
    }
    let local = if gpus.is_empty() { igpus } else { gpus };
    out.extend(local.into_iter().map(|d| (d.clone(), d.name.clone())));
    out
}

/// Each offload device's cap ([`cap_of`]: `--target-vram` of its memory
/// less what others hold there, or a budget of `--vram-budget`, one size
/// for all or `DEV=SIZE` naming it by its llama.cpp name or its RPC
/// server's host:port, the stricter).
///
/// # Errors
/// `BadInput` for a budget that names no device here.
pub fn device_caps(devices: &[LlamaDevice], asked: &Caps) -> anyhow::Result<Vec<DeviceCap>> {
    let (target, all, per) = (asked.target_vram, asked.vram_budget_bytes, &asked.device_budgets);
    let offload = offload_devices(devices);
    if let Some(b) = per.iter().find(|b| !offload.iter().any(|(d, _)| d.name == b.device || d.description == b.device))
    {
        let names: Vec<String> = offload.iter().map(|(d, _)| format!("{} ({})", d.name, d.description)).collect();
        return Err(crate::error::bad(format!(
            "--vram-budget {}={}: no offload device is called {}; name one of {}",
            b.device,
            human_bytes(b.bytes),
            b.device,
            if names.is_empty() { "none (no offload device here)".to_string() } else { names.join(", ") }
        )));
    }
    Ok(offload
        .into_iter()
        .map(|(d, buffer_type)| {
            let named = per.iter().find(|b| b.device == d.name || b.device == d.description).map(|b| b.bytes);
            let (cap, cap_reason) = cap_of(target, d.memory_total, in_use(&d), named.or(all), None);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let cap_bytes = cap.max(0.0) as u64;
            DeviceCap { device: d.name, buffer_type, description: d.description, cap_bytes, cap_reason }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cap_takes_what_others_hold_off_the_target_on_every_device() {
        const GIB: u64 = 1 << 30;
        let (cap, why) = cap_of(0.9, 10 * GIB, 2 * GIB, None, Some("nvml0 (A)"));
        #[allow(clippy::cast_precision_loss)]
        let want = 0.9 * (10 * GIB) as f64 - (2 * GIB) as f64;
        assert!((cap - want).abs() < 1.0, "{cap}");
        assert_eq!(why, "90% of 10.00 GiB on nvml0 (A), less 2.00 GiB already in use = 7.00 GiB");
        let (cap, why) = cap_of(0.9, 10 * GIB, 0, Some(4 * GIB), None);
        #[allow(clippy::cast_precision_loss)]
        let four = (4 * GIB) as f64;
        assert!((cap - four).abs() < 1.0);
        assert_eq!(why, "--vram-budget 4.00 GiB (stricter than 90% of 10.00 GiB = 9.00 GiB)");
        // Each device of a split the same way: a card whose figures move with use
        // loses what others hold; an RPC device (accounted memory) does not.
        let dev = |name: &str, backend: &str, desc: &str, free: u64| LlamaDevice {
            index: 0,
            name: name.into(),
            description: desc.into(),
            backend: backend.into(),
            kind: crate::types::DeviceKind::Gpu,
            memory_total: 10 * GIB,
            memory_free: free,
        };
        let devices = [dev("CUDA0", "CUDA", "NVIDIA L4", 8 * GIB), dev("RPC0", "RPC", "10.0.0.2:50052", 8 * GIB)];
        let caps = device_caps(&devices, &Caps::target(0.9)).unwrap();
        let by_name = |n: &str| caps.iter().find(|c| c.device == n).unwrap();
        assert_eq!(by_name("CUDA0").cap_bytes, 7 * GIB, "{}", by_name("CUDA0").cap_reason);
        assert!(by_name("CUDA0").cap_reason.contains("less 2.00 GiB already in use"));
        assert_eq!(by_name("RPC0").cap_bytes, 9 * GIB, "{}", by_name("RPC0").cap_reason);
    }

    #[test]
    fn an_interpolated_end_is_priced_and_stepped_down_while_over_the_cap() {
        // 10 MB a layer from 100 MB: under a 185 MB cap the most is ngl 8.
        let mut asked = Vec::new();
        let mut price = |n: u32| {
            asked.push(n);
            Some(100_000_000 + u64::from(n) * 10_000_000)
        };
        assert_eq!(priced_under(&mut price, 9, 0, 185e6), 8);
        assert_eq!(asked, [9, 8]);
        // Within the cap: priced once, kept.
        assert_eq!(priced_under(&mut |n| Some(u64::from(n)), 9, 0, 185e6), 9);
        // Far over: at most MAX_PRICE_STEPS, then the grid point known to fit.
        let mut n = 0;
        assert_eq!(
            priced_under(
                &mut |_| {
                    n += 1;
                    Some(u64::MAX)
                },
                40,
                10,
                1e6
            ),
            10
        );
        assert!(n <= MAX_PRICE_STEPS as usize + 1);
        // Not priceable: measured as interpolated (the trial's own memory decides).
        assert_eq!(priced_under(&mut |_| None, 9, 0, 1.0), 9);
    }

    #[test]
    fn largest_setting_under_the_cap_from_predictions() {
        let p = |n: u32, b: u64| Prediction {
            devices: Vec::new(),
            n_gpu_layers: n,
            device_bytes: b,
            device_model_bytes: b,
            buffers: vec![],
            error: None,
            case: None,
            split: vec![],
        };
        let preds = [p(0, 0), p(10, 100), p(20, 200), p(30, 300), p(35, 400)];
        assert_eq!(largest_predicted_under(&preds, 1000.0, 35), 35);
        assert_eq!(largest_predicted_under(&preds, 250.0, 35), 25);
        assert_eq!(largest_predicted_under(&preds, 100.0, 35), 10);
        assert_eq!(largest_predicted_under(&preds, 50.0, 35), 5);
        assert_eq!(largest_predicted_under(&[], 50.0, 35), 35, "no prediction: try full offload");
    }

    #[test]
    fn the_gap_to_the_sampled_peak_is_reported_only_where_a_sampler_is_trusted() {
        use crate::types::BufferLine;
        let mut r = crate::types::TrialResult::failed(crate::engine::test_spec(), TrialStatus::Ok, String::new());
        r.reason = None;
        r.model_buffers.push(BufferLine { buffer_type: "CUDA0".into(), kind: "model".into(), bytes: 1000 << 20 });
        let policy = |source: Source| MemoryPolicy {
            source,
            device: "nvml0 (NVIDIA H200)".into(),
            device_total_bytes: Some(140 << 30),
            baseline_bytes: 0,
            cap_bytes: 100e9,
            cap_reason: String::new(),
        };
        // NVML saw 1.5 GiB for this trial; llama.cpp predicted and accounted 1000 MiB.
        let sampled = Some(1536.0 * 1024.0 * 1024.0);
        let (err, gap) = prediction_check(Some(1000 << 20), &r, Some(&policy(Source::Nvml)), sampled);
        assert_eq!(err, Some(0.0));
        assert_eq!(gap, Some(536 << 20), "the CUDA context and what else llama.cpp does not count");
        let (err, gap) = prediction_check(Some(1010 << 20), &r, Some(&policy(Source::Accounted)), sampled);
        assert!((err.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(gap, None, "accounted memory is no sample");
        r.status = TrialStatus::Oom;
        assert_eq!(prediction_check(Some(1000 << 20), &r, Some(&policy(Source::Nvml)), sampled), (None, None));
    }
}
