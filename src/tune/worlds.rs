//! Worlds made of curves, shaped like real GPU data, for the tuner's tests:
//! the llama-bench README's 7B curve, gemma on a GPU, a device where
//! offloading only hurts.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

/// A GPU-shaped world: the llama-bench README's 7B Q4_0 (tg 13.45 / 21.36 /
/// 40.04 / 71.76 / 131.66 at ngl 10 / 20 / 30 / 34 / 35, about 8 at ngl 0),
/// time per token interpolated between them, memory 0.5 GiB + 0.1 GiB per layer.
pub fn readme_world(ngl: u32) -> (f64, f64) {
    let pts = [(0.0, 8.0), (10.0, 13.45), (20.0, 21.36), (30.0, 40.04), (34.0, 71.76), (35.0, 131.66)];
    let x = f64::from(ngl);
    let tg = pts
        .windows(2)
        .find(|w| x >= w[0].0 && x <= w[1].0)
        .map(|w| {
            let (t0, t1) = (1.0 / w[0].1, 1.0 / w[1].1);
            1.0 / (t0 + (x - w[0].0) / (w[1].0 - w[0].0) * (t1 - t0))
        })
        .unwrap_or(8.0);
    (tg, (0.5 + 0.1 * x) * 1024.0 * 1024.0 * 1024.0)
}

/// A CPU-like offload device (llvmpipe): every layer moved costs time.
pub fn hurting_world(ngl: u32) -> (f64, f64) {
    (800.0 / (1.0 + f64::from(ngl)), 1e6 * f64::from(ngl))
}

/// gemma-3-270m on a real GPU, roughly: 19 settings, full offload 4x ngl 0.
pub fn small_gpu_world(ngl: u32) -> (f64, f64) {
    let t = |n: f64| 1.0 / 100.0 + (1.0 / 400.0 - 1.0 / 100.0) * n / 19.0;
    (1.0 / t(f64::from(ngl)), 300e6 + 10e6 * f64::from(ngl))
}

/// The decision on `ngls` measured in `world`, confirmations included.
pub fn decide_on(ngls: &[u32], cap: f64, full: u32, world: fn(u32) -> (f64, f64)) -> u32 {
    use super::choose::{decide, Inputs};
    use crate::types::{Objective, Point};
    let mut measured: Vec<u32> = ngls.to_vec();
    loop {
        let points = measured
            .iter()
            .map(|&n| {
                let (tg, mem) = world(n);
                Point { ngl: n, ok: true, oom: false, tg: Some(tg), pp: None, mem: Some(mem), power: None }
            })
            .collect();
        let d = decide(&Inputs {
            points,
            full,
            cap,
            objective: Objective::Tg,
            n_prompt: 512,
            n_gen: 128,
            device: "GPU".into(),
            max_power_w: None,
        });
        if !d.needs_confirmation || measured.len() > 12 {
            return d.recommended_ngl;
        }
        measured.push(d.recommended_ngl);
    }
}

/// The memory policy of a fake device with a cap of `cap` bytes (llama.cpp's accounted memory).
pub fn policy(cap: f64) -> crate::profile::MemoryPolicy {
    crate::profile::MemoryPolicy {
        source: crate::types::Source::Accounted,
        device: "Vulkan0 (fake)".into(),
        device_total_bytes: Some(1 << 40),
        baseline_bytes: 0,
        cap_bytes: cap,
        cap_reason: "test".into(),
    }
}

/// Settings for unit tests: 32k context, tg objective, two threads.
pub fn settings() -> crate::profile::Settings {
    let mut s: crate::profile::Settings = serde_json::from_value(serde_json::json!({
        "target_vram": 0.9, "vram_budget_bytes": null, "n_ctx": 32768, "n_prompt": 64, "n_gen": 16,
        "repetitions": 2, "n_threads": 2, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1,
        "objective": "tg", "grid": null, "quick": false, "no_skip": false, "trial_timeout_s": 60,
        "sample_interval_ms": 20
    }))
    .unwrap();
    s.gate.max_kl = 0.05;
    s.measure.n_depth = None;
    s
}

/// A whole-layer recommendation: ngl 7 of a 32768-token context, 2 threads, measured.
#[must_use]
pub fn recommendation() -> crate::profile::Recommendation {
    let placement = crate::placement::Placement::default().with_layers(7, 2, Some(32768));
    crate::profile::Recommendation {
        modelfile: crate::consumer::ollama::modelfile_lines(&placement),
        llama_cpp_args: placement.flags(),
        placement,
        ollama_num_gpu: None,
        llama_default: false,
        ollama_own_run: false,
        ollama_one_slot: false,
        mtp_heads: false,
        measured: true,
        confidence: crate::profile::Confidence::High,
        tg_ts: Some(3.0),
        pp_ts: Some(30.0),
        mem_bytes: Some(100.0),
        img_ms: None,
        ollama_server_env: Vec::new(),
    }
}

/// A search at the settings' context with a cap of `cap` bytes, no
/// checkpoint, nothing shown.
pub fn search<'a>(
    s: &'a crate::profile::Settings,
    world: &'a mut dyn crate::tune::executor::TrialExecutor,
    cap: f64,
) -> crate::tune::search::Search<'a> {
    let at = crate::tune::plan::ContextRun::of(s, s.workload.n_ctx);
    crate::tune::search::Search::new(s, at, world, Some(policy(cap)), crate::progress::Progress::hidden(), None)
}
