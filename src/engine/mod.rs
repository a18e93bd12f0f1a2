//! The llama.cpp driver: one trial (one ngl setting) measured the way
//! llama-bench measures, in a child process so a crash is only a result.
//!
//! `worker` runs inside the child (hidden `__trial` subcommand); `runner`
//! spawns it, watches it, and turns whatever happened into a [`TrialResult`].

pub mod child;
pub mod logs;
pub mod placement;
pub mod predict;
pub mod quality;
pub mod runner;
pub mod worker;

pub use crate::types::{
    FlashAttn, OpOffload, Race, TestResult, TrialResult, TrialSpec, TrialStatus, LLAMA_CPP_REVISION,
};

/// llama.cpp's pattern for one layer's expert tensors (common.h's
/// `LLM_FFN_EXPS_REGEX`), as `--n-cpu-moe` builds it.
#[must_use]
pub fn cpu_moe_pattern(layer: u32) -> String {
    format!("blk\\.{layer}\\.ffn_(up|down|gate|gate_up)_(ch|)exps")
}

/// The pattern for one layer's dense FFN weights (`ffn_up`, `ffn_gate`,
/// `ffn_down`; not the experts, not the norms), kept on the CPU by `-ot`.
#[must_use]
pub fn cpu_ffn_pattern(layer: u32) -> String {
    format!("blk\\.{layer}\\.ffn_(up|down|gate)\\.weight")
}

/// llama.cpp's `-ot` value that keeps the dense FFN weights of the first
/// `k` layers on the CPU: one regular expression (llama.cpp searches each
/// tensor name with it) and the CPU buffer type.
#[must_use]
pub fn cpu_ffn_override(k: u32) -> String {
    let layers: Vec<String> = (0..k).map(|l| l.to_string()).collect();
    format!("blk\\.({})\\.ffn_(up|down|gate)\\.weight=CPU", layers.join("|"))
}

/// A small spec for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) fn test_spec() -> TrialSpec {
    TrialSpec {
        model: "m.gguf".into(),
        n_gpu_layers: 0,
        n_prompt: 64,
        n_gen: 16,
        n_batch: 2048,
        n_ubatch: 512,
        n_threads: 2,
        n_ctx: Some(256),
        repetitions: 3,
        warmup: true,
        flash_attn: -1,
        seed: 1,
        sample_interval_ms: 20,
        n_cpu_moe: 0,
        n_cpu_ffn: 0,
        cpu_overrides: Vec::new(),
        kv_type: crate::types::KvType::F16,
        op_offload: OpOffload::On,
        race: None,
        rpc: Vec::new(),
        tensor_split: Vec::new(),
        main_gpu: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raced_test_runs_first() {
        let mut spec = TrialSpec { n_prompt: 128, n_gen: 32, ..test_spec() };
        assert_eq!(spec.tests(), [(128, 0), (0, 32)], "llama-bench's order");
        spec.race = Some(Race { pp_below_ts: None, tg_below_ts: Some(20.0), skip_rest: true });
        assert_eq!(spec.tests(), [(0, 32), (128, 0)]);
        spec.race = Some(Race { pp_below_ts: Some(50.0), tg_below_ts: Some(20.0), skip_rest: false });
        assert_eq!(spec.tests(), [(128, 0), (0, 32)]);
        let back: TrialSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(back, spec, "the worker gets the race on its stdin");
    }
}
