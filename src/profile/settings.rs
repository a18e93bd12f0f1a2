//! The tune's settings, as asked and as stored in a profile (and its
//! checkpoint): its groups (caps, search policy, workload, measure, gate,
//! goal, backend), the consumer's settings as read, and what they say
//! beyond their fields: the consumer, the depth of each context, the
//! streams decoded together. What the tune made of them is the record
//! (`profile/mod.rs`); unfinished work is the checkpoint.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A cap for one device (`--vram-budget DEV=SIZE`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceBudget {
    pub device: String,
    pub bytes: u64,
}

/// The caps a placement is held under, as asked: `--target-vram`,
/// `--vram-budget` (all devices, or one by name), `--host-budget`,
/// `--max-power`. `tune::memory` turns them into bytes on a machine
/// (`device_caps`, `policy_for`, `host_cap`); the profile stores them as
/// fields of its settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Caps {
    pub target_vram: f64,
    pub vram_budget_bytes: Option<u64>,
    /// Per-device caps from `--vram-budget DEV=SIZE` (a device name like
    /// RPC0 or CUDA1, or an RPC server's host:port).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_budgets: Vec<DeviceBudget>,
    /// `--host-budget`: the host memory a placement may take (`None`: 90%
    /// of the RAM free when the tune started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_budget_bytes: Option<u64>,
    /// `--max-power`: the GPUs' mean power (W) a setting may draw over its tg test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_power_w: Option<f64>,
}

/// How a tune searches and measures: the grid or adaptive search, what
/// an out-of-memory trial skips, a trial's time limit, the memory
/// sampling and the busy-machine threshold. Plain fields of the stored
/// settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchPolicy {
    /// The grid asked for (`None`: the default grid).
    pub grid: Option<Vec<u32>>,
    pub quick: bool,
    pub no_skip: bool,
    pub trial_timeout_s: u64,
    pub sample_interval_ms: u64,
    /// Adaptive (the default: 0, the largest setting predicted under the
    /// cap, interior points unless those two decide it, confirmation)
    /// or grid (every grid value). Profiles from before the field: grid.
    #[serde(default)]
    pub search: crate::types::SearchMode,
    /// A trial is contended when other processes use more than this share
    /// of its threads (profiles from before the field: 0.1).
    #[serde(default = "default_busy_threshold")]
    pub busy_threshold: f64,
}

/// How llama.cpp runs the model, whatever the placement: the threads
/// asked (`-t`; the tune may measure others), op offload, the RPC servers
/// whose devices join this machine's, the projector loaded beside the
/// model. Plain fields of the stored settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backend {
    pub n_threads: u32,
    /// llama.cpp's op offload as asked (auto: off where every offload
    /// device is CPU-based).
    #[serde(default)]
    pub op_offload: crate::placement::OpOffload,
    /// llama.cpp RPC servers whose devices join this machine's (`--rpc`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpc: Vec<String>,
    /// The multimodal projector every trial loads beside the model (`--mmproj`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<PathBuf>,
    /// `--draft`: a draft model tried beside the answer (speculative decoding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<DraftRequest>,
}

/// A draft model the tune tries beside its answer: its file, its layers
/// on the device where given (`--draft-ngl`; else on the CPU, on the
/// device, and the split the cap allows are tried), the draft length
/// (`--draft-max`) and the text drafted on (`--prompt-file`; else the
/// quality check's natural text). Without a model file: the model's own
/// MTP heads (`--mtp`, and what a tune of a model with them tries).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraftRequest {
    /// The draft model's file; `None`: the model's own MTP heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_gpu_layers: Option<u32>,
    pub n_max: u32,
    /// `--draft-max` given: the length is the user's, not searched.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub n_max_fixed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_file: Option<PathBuf>,
}

impl DraftRequest {
    /// The model's own MTP heads at llama.cpp's draft length.
    #[must_use]
    pub fn mtp() -> DraftRequest {
        DraftRequest {
            model: None,
            n_gpu_layers: None,
            n_max: crate::placement::DRAFT_N_MAX,
            n_max_fixed: false,
            prompt_file: None,
        }
    }

    /// The draft these ask for, at `ngld` layers on the device.
    #[must_use]
    pub fn draft(&self, ngld: Option<u32>) -> crate::placement::Draft {
        match &self.model {
            Some(m) => crate::placement::Draft {
                n_gpu_layers: ngld,
                n_max: self.n_max,
                ..crate::placement::Draft::of(m.clone())
            },
            None => crate::placement::Draft::mtp(self.n_max),
        }
    }
}

/// What each trial measures, as llama-bench's test parameters: a prompt
/// of `n_prompt` tokens and `n_gen` generated (`-p`, `-n`), each
/// `repetitions` times (`-r`), at a depth (`-d`), after a warmup run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Measure {
    pub n_prompt: u32,
    pub n_gen: u32,
    pub repetitions: u32,
    /// Tokens in the KV cache before each test: `None` (null) is the rule,
    /// half of each context (of one slot); a number is `--depth`. Profiles from before
    /// the field were measured with an empty cache: 0.
    #[serde(default = "empty_cache")]
    pub n_depth: Option<u32>,
    /// A warmup run before each test, as llama-bench does (`--no-warmup`: none).
    #[serde(default = "crate::types::yes", skip_serializing_if = "crate::types::is_true")]
    pub warmup: bool,
}

impl Measure {
    /// Tokens the longer of the two tests adds to the KV cache past the
    /// depth: what a context must hold beyond it.
    #[must_use]
    pub fn longest_test(&self) -> u32 {
        self.n_prompt.max(self.n_gen)
    }
}

/// The settings a tuning ran with; a re-tune reuses them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// What a placement may take: device memory, host memory, power.
    #[serde(flatten)]
    pub caps: Caps,
    /// The contexts, slots, KV cache and batch, as asked and as the
    /// consumer's server decides them.
    #[serde(flatten)]
    pub workload: crate::consumer::Workload,
    /// What each trial measures: llama-bench's test sizes, repetitions,
    /// depth and warmup.
    #[serde(flatten)]
    pub measure: Measure,
    /// How llama.cpp runs the model beside the placement searched: the
    /// threads asked, op offload, the RPC servers, the projector.
    #[serde(flatten)]
    pub backend: Backend,
    /// How the placements are searched and each trial measured.
    #[serde(flatten)]
    pub policy: SearchPolicy,
    /// The quality gate an option that changes the output must pass
    /// (`--max-kl`, `--min-top1`).
    #[serde(flatten)]
    pub gate: crate::types::QualityGate,
    /// What the tune serves: the objective, the reading speed, the
    /// streams decoded together, a batch job.
    #[serde(flatten)]
    pub goal: crate::types::Goal,
    /// The consumer's server settings the tune matched, where they were
    /// read, and what each did (`None`: profiles from before the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<ConsumerRead>,
}

/// The settings of the program that will run the model, as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerRead {
    /// Ollama (its server's environment) or llama-server (`LLAMA_ARG_*`).
    pub program: crate::consumer::Program,
    /// Where they were read, or why nothing was.
    pub source: String,
    pub found: bool,
    /// What was read and what it made the tune measure, a phrase each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied: Vec<String>,
    /// The server's own variables as read (`OLLAMA_*` and the `LLAMA_ARG_*`
    /// its llama-server inherits, or `LLAMA_ARG_*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vars: Vec<(String, String)>,
    /// The batch is Ollama's own choice for each context (no `-b`/`-ub`
    /// given): its rule and step-down, decided per context.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_batch: bool,
}

impl ConsumerRead {
    /// A variable of the consumer's server as it reads it; `None` when
    /// unset there.
    #[must_use]
    pub fn var(&self, key: &str) -> Option<String> {
        crate::consumer::var_in(&self.vars, key)
    }
}

#[allow(clippy::unnecessary_wraps)]
fn empty_cache() -> Option<u32> {
    Some(0)
}

fn default_busy_threshold() -> f64 {
    crate::probe::cpu::DEFAULT_BUSY_THRESHOLD
}

impl Settings {
    /// The consumer's settings where Ollama is the consumer (its server's
    /// environment, found or its defaults).
    #[must_use]
    pub fn ollama(&self) -> Option<&ConsumerRead> {
        self.consumer.as_ref().filter(|c| c.program == crate::consumer::Program::Ollama)
    }

    /// What the tune's scores weigh: its objective and test sizes.
    #[must_use]
    pub fn scoring(&self) -> crate::types::Scoring {
        crate::types::Scoring {
            objective: self.goal.objective,
            n_prompt: self.measure.n_prompt,
            n_gen: self.measure.n_gen,
        }
    }

    /// Makes each context `n` slots of itself, decoded together
    /// (`--objective throughput --parallel N`): the KV cache sized for `n`
    /// sequences, `-np n`; a consumer's own slots are replaced.
    pub fn decode_together(&mut self, n: u32) {
        self.into_slots(n);
        self.goal.parallel_streams = Some(n);
    }

    /// Makes each context `n` slots of one slot's context (`-c ctx x n
    /// -np n`, as llama-server splits it and Ollama starts it); slots set
    /// before are replaced.
    pub fn into_slots(&mut self, n: u32) {
        self.workload.into_slots(n);
    }

    /// The depth a context is measured at: `--depth`, else half the
    /// context (where tg equals its mean over a filled window), always
    /// leaving room for the longer test.
    #[must_use]
    pub fn depth_at(&self, n_ctx: u32) -> u32 {
        let slot = n_ctx / self.workload.n_parallel.max(1);
        let room = slot.saturating_sub(self.measure.longest_test());
        self.measure.n_depth.unwrap_or(slot / 2).min(room)
    }

    /// The depth rule in words, for the report.
    #[must_use]
    pub fn depth_rule(&self) -> String {
        let at: Vec<String> = self.contexts().iter().map(|c| format!("{} at {c}", self.depth_at(*c))).collect();
        match self.measure.n_depth {
            None => format!(
                "depth: half of each context ({}): each test runs with that many tokens already in the KV cache, where tg equals its mean over a filled window; --depth sets it",
                at.join(", ")
            ),
            Some(0) => "depth: 0 (an empty KV cache before each test)".to_string(),
            Some(_) => format!("depth: --depth ({}) tokens in the KV cache before each test", at.join(", ")),
        }
    }

    /// The context sizes tuned, ascending.
    #[must_use]
    pub fn contexts(&self) -> Vec<u32> {
        if self.workload.contexts.is_empty() {
            vec![self.workload.n_ctx]
        } else {
            self.workload.contexts.clone()
        }
    }
}

impl Caps {
    /// `--target-vram` alone: no budgets, no power cap.
    #[must_use]
    pub fn target(target_vram: f64) -> Caps {
        Caps {
            target_vram,
            vram_budget_bytes: None,
            device_budgets: Vec::new(),
            host_budget_bytes: None,
            max_power_w: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The caps, the search policy and the workload are groups in the code
    /// and plain fields of `settings` in the profile, where readers of the
    /// JSON and older profiles have them.
    #[test]
    fn groups_are_fields_of_the_stored_settings() {
        let mut v = serde_json::json!({
            "target_vram": 0.8, "vram_budget_bytes": 1000, "n_ctx": 4096, "n_prompt": 64, "n_gen": 16,
            "repetitions": 2, "n_threads": 2, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1,
            "objective": "tg", "grid": null, "quick": false, "no_skip": false, "trial_timeout_s": 60,
            "sample_interval_ms": 20
        });
        let s: Settings = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(s.caps, Caps { vram_budget_bytes: Some(1000), ..Caps::target(0.8) });
        let out = serde_json::to_value(&s).unwrap();
        assert!(
            ["caps", "policy", "workload", "gate", "measure", "goal", "backend"].iter().all(|g| out.get(g).is_none()),
            "{out}"
        );
        assert_eq!((s.measure.n_prompt, s.measure.n_depth, s.measure.warmup), (64, Some(0), true), "older profiles");
        assert!(out["n_depth"] == 0 && out.get("warmup").is_none(), "{out}");
        assert_eq!(s.gate, crate::types::QualityGate::default(), "profiles from before the gate: its defaults");
        assert_eq!(
            (s.goal.objective, s.goal.reading_speed, s.goal.parallel_streams, s.goal.job),
            (crate::types::Objective::Tg, crate::types::DEFAULT_READING_SPEED, None, None),
            "profiles from before the reading speed, streams and job"
        );
        assert!(out["objective"] == "tg" && out.get("reading_speed").is_none() && out.get("job").is_none(), "{out}");
        assert!(out.get("max_kl").is_none() && out.get("min_top1").is_none(), "the defaults: not written");
        assert_eq!(
            (s.workload.n_ctx, s.workload.n_parallel, s.workload.kv_type),
            (4096, 1, crate::placement::KvType::F16)
        );
        assert!(out.get("contexts").is_none() && out.get("n_parallel").is_none(), "defaults: not written");
        assert_eq!(out["n_ubatch"], 512);
        assert_eq!(
            (s.backend.n_threads, s.backend.op_offload, s.backend.rpc.len(), &s.backend.mmproj),
            (2, crate::placement::OpOffload::default(), 0, &None),
            "profiles from before op offload, RPC and the projector"
        );
        assert!(out["n_threads"] == 2 && out.get("rpc").is_none() && out.get("mmproj").is_none(), "{out}");
        assert_eq!(
            (&out["trial_timeout_s"], &out["grid"], &out["busy_threshold"]),
            (&60.into(), &serde_json::Value::Null, &0.1.into())
        );
        assert_eq!(s.policy.search, crate::types::SearchMode::Grid, "profiles from before the field: grid");
        assert!(out.get("host_budget_bytes").is_none() && out.get("device_budgets").is_none(), "unset: not written");

        v["device_budgets"] = serde_json::json!([{ "device": "RPC0", "bytes": 5 }]);
        v["host_budget_bytes"] = 7.into();
        v["max_power_w"] = 250.0.into();
        v["max_kl"] = 0.01.into();
        v["objective"] = "throughput".into();
        v["parallel_streams"] = 4.into();
        v["job"] = serde_json::json!({ "requests": 500, "n_gen": 800 });
        v["rpc"] = serde_json::json!(["10.0.0.2:50052"]);
        v["mmproj"] = "mmproj-f16.gguf".into();
        let s: Settings = serde_json::from_value(v).unwrap();
        assert_eq!((s.gate.max_kl, s.gate.min_top1), (0.01, crate::types::DEFAULT_MIN_TOP1));
        assert_eq!((s.goal.streams(), s.goal.job.map(|j| j.requests)), (4, Some(500)));
        assert_eq!(
            (s.backend.rpc[0].as_str(), s.backend.mmproj.as_deref()),
            ("10.0.0.2:50052", Some("mmproj-f16.gguf".as_ref()))
        );
        assert_eq!(
            (s.caps.device_budgets[0].bytes, s.caps.host_budget_bytes, s.caps.max_power_w),
            (5, Some(7), Some(250.0))
        );
        let out = serde_json::to_value(&s).unwrap();
        assert_eq!(
            (&out["device_budgets"][0]["device"], &out["host_budget_bytes"], &out["max_power_w"]),
            (&"RPC0".into(), &7.into(), &250.0.into())
        );
        assert_eq!(
            (&out["max_kl"], &out["parallel_streams"], &out["job"]["n_gen"]),
            (&0.01.into(), &4.into(), &800.into())
        );
        assert_eq!(serde_json::from_value::<Settings>(out).unwrap(), s, "read back as written");
    }
}
