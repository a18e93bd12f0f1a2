//! The split stage's answer for the profile: each device's share, the
//! margins llama.cpp's own fit is asked with, the report, and the
//! recommendation made of the best split.

#[allow(clippy::wildcard_imports)]
use super::*;

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
    let split = split_of(o);
    // Every layer on the CPU needs no server.
    let servers = if o.placement.n_gpu_layers == 0 { &[] } else { rpc };
    // The split's whole placement, as its trial ran (its layers per device,
    // their order, its mode, cache and spill), without servers where no layer needs one.
    let p = o.placement.clone().with_split(&split.listed(), servers);
    r.tg_ts = o.tg_ts;
    r.pp_ts = o.pp_ts;
    #[allow(clippy::cast_precision_loss)]
    let mem = o.accounted_bytes.iter().sum::<u64>() as f64;
    r.mem_bytes = Some(mem);
    r.measured = o.measured;
    let local: u32 = if o.tensor_split.is_empty() {
        o.placement.n_gpu_layers
    } else {
        o.tensor_split.iter().zip(devs).filter(|(_, d)| !d.buffer_type.starts_with("RPC")).map(|(l, _)| *l).sum()
    };
    let ollama = if servers.is_empty() { o.placement.n_gpu_layers } else { local };
    r.ollama_num_gpu = (ollama != o.placement.n_gpu_layers).then_some(ollama);
    r.set_placement(&p);
    r
}
