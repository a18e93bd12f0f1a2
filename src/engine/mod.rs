//! The llama.cpp driver: one trial (one ngl setting) measured the way
//! llama-bench measures, in a child process so a crash is only a result.
//!
//! `worker` runs inside the child (hidden `__trial` subcommand); `runner`
//! spawns it, watches it, and turns whatever happened into a [`TrialResult`].

pub mod interrupt;
pub mod logs;
pub mod predict;
pub mod runner;
pub mod worker;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use logs::BufferLine;

use crate::probe::cpu::Contention;
use crate::probe::{LlamaDevice, MemoryStats};

/// The llama.cpp this binary is built from. llama-cpp-sys-2 vendors one
/// llama.cpp revision per release (its build reports build 0, commit
/// "unknown"), so the crate version is the revision.
pub const LLAMA_CPP_REVISION: &str = "llama-cpp-sys-2 0.1.160";

/// llama.cpp's op offload (`--op-offload` / `--no-op-offload`) as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OpOffload {
    /// On, except where every offload device is a CPU-based Vulkan device
    #[default]
    Auto,
    On,
    Off,
}

impl OpOffload {
    /// Whether trials offload host operations, given whether every offload
    /// device runs on the CPU (moving work there cannot beat the CPU backend).
    #[must_use]
    pub fn resolve(self, only_software_devices: bool) -> bool {
        match self {
            OpOffload::On => true,
            OpOffload::Off => false,
            OpOffload::Auto => !only_software_devices,
        }
    }
}

/// llama-bench's `flash_attn` values: -1 auto, 0 off, 1 on.
pub type FlashAttn = i8;

/// What one trial measures. Serialized to the worker on its stdin.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrialSpec {
    pub model: PathBuf,
    /// As given by the user (99 means "all"); llama.cpp clamps it.
    pub n_gpu_layers: u32,
    pub n_prompt: u32,
    pub n_gen: u32,
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub n_threads: u32,
    /// Context size; `None` sizes each test's context as llama-bench does
    /// (n_prompt + n_gen of that test).
    pub n_ctx: Option<u32>,
    pub repetitions: u32,
    pub warmup: bool,
    pub flash_attn: FlashAttn,
    pub seed: u64,
    /// Memory sampling interval in milliseconds (0: no sampling).
    #[serde(default = "default_interval")]
    pub sample_interval_ms: u64,
    /// Layers (from the first) whose expert tensors stay on the CPU, as
    /// llama.cpp's `--n-cpu-moe`; 0 for dense models.
    #[serde(default)]
    pub n_cpu_moe: u32,
    /// Offload host tensor operations (large-batch matrix products of
    /// layers on the CPU) to the device: llama.cpp's default, and its
    /// `--no-op-offload` when false.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub op_offload: bool,
    /// Cut the trial short where it is clearly losing (adaptive search).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub race: Option<Race>,
}

/// Racing: a test whose first repetition is slower than its threshold
/// stops there; more repetitions would only measure more precisely how
/// far behind it is. The adaptive search sets the thresholds from the best
/// speeds measured so far.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Default)]
pub struct Race {
    /// t/s below which the pp test stops after one repetition.
    pub pp_below_ts: Option<f64>,
    /// t/s below which the tg test stops after one repetition.
    pub tg_below_ts: Option<f64>,
    /// The raced test is the whole objective: it runs first, and once it
    /// falls behind the trial's other tests are not run at all.
    #[serde(default)]
    pub skip_rest: bool,
}

impl Race {
    /// The threshold for a test (pp when it has prompt tokens).
    #[must_use]
    pub fn below(&self, n_prompt: u32) -> Option<f64> {
        if n_prompt > 0 {
            self.pp_below_ts
        } else {
            self.tg_below_ts
        }
    }
}

/// llama.cpp's pattern for one layer's expert tensors (common.h's
/// `LLM_FFN_EXPS_REGEX`), as `--n-cpu-moe` builds it.
#[must_use]
pub fn cpu_moe_pattern(layer: u32) -> String {
    format!("blk\\.{layer}\\.ffn_(up|down|gate|gate_up)_(ch|)exps")
}

fn default_interval() -> u64 {
    20
}

pub(crate) fn yes() -> bool {
    true
}

#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_true(b: &bool) -> bool {
    *b
}

impl TrialSpec {
    /// The tests this trial runs, as llama-bench splits them: a pp test
    /// (n_prompt, 0) and a tg test (0, n_gen), each skipped when zero; a
    /// raced test first (each test has its own context, so the order does
    /// not change what is measured).
    #[must_use]
    pub fn tests(&self) -> Vec<(u32, u32)> {
        let mut t = Vec::new();
        if self.n_prompt > 0 {
            t.push((self.n_prompt, 0));
        }
        if self.n_gen > 0 {
            t.push((0, self.n_gen));
        }
        if let Some(r) = self.race {
            t.sort_by_key(|(p, _)| r.below(*p).is_none());
        }
        t
    }
}

/// How a trial ended.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TrialStatus {
    Ok,
    /// The model or context could not be allocated.
    Oom,
    /// The worker died (signal or non-zero exit without a result).
    Crashed,
    /// The worker ran past its time limit and was killed.
    Timeout,
    /// llama.cpp refused (load error, decode error) without running out of memory.
    Failed,
}

impl TrialStatus {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            TrialStatus::Ok => "ok",
            TrialStatus::Oom => "oom",
            TrialStatus::Crashed => "crashed",
            TrialStatus::Timeout => "timeout",
            TrialStatus::Failed => "failed",
        }
    }
}

/// One llama-bench test (pp or tg) at one setting.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TestResult {
    pub n_prompt: u32,
    pub n_gen: u32,
    pub n_ctx: u32,
    pub samples_ns: Vec<u64>,
    pub avg_ns: u64,
    pub stddev_ns: u64,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ts: Vec<f64>,
    /// Buffers llama.cpp allocated for this test's context (KV, compute, output).
    pub context_buffers: Vec<BufferLine>,
    /// Stopped after one repetition: it was far slower than the best
    /// setting measured so far (see [`Race`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped_early: bool,
}

impl TestResult {
    /// Builds the statistics from raw durations exactly as llama-bench does:
    /// t/s per sample, then mean and sample standard deviation (n-1).
    #[must_use]
    pub fn from_samples(n_prompt: u32, n_gen: u32, n_ctx: u32, samples_ns: Vec<u64>) -> Self {
        let n_tokens = f64::from(n_prompt + n_gen);
        #[allow(clippy::cast_precision_loss)]
        let samples_ts: Vec<f64> = samples_ns.iter().map(|ns| n_tokens * 1e9 / (*ns as f64).max(1.0)).collect();
        #[allow(clippy::cast_precision_loss)]
        let ns_f: Vec<f64> = samples_ns.iter().map(|v| *v as f64).collect();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        TestResult {
            n_prompt,
            n_gen,
            n_ctx,
            avg_ns: crate::stats::mean(&ns_f).round() as u64,
            stddev_ns: crate::stats::stddev(&ns_f).round() as u64,
            avg_ts: crate::stats::mean(&samples_ts),
            stddev_ts: crate::stats::stddev(&samples_ts),
            samples_ts,
            samples_ns,
            context_buffers: Vec::new(),
            stopped_early: false,
        }
    }

    /// "pp512", "tg128": llama-bench's test names.
    #[must_use]
    pub fn name(&self) -> String {
        match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, g) => format!("tg{g}"),
            (p, g) => format!("pp{p}+tg{g}"),
        }
    }
}

/// Everything one trial produced.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrialResult {
    pub spec: TrialSpec,
    pub status: TrialStatus,
    /// Why it did not end `ok`, in words.
    pub reason: Option<String>,
    pub tests: Vec<TestResult>,
    /// Layers llama.cpp reports offloaded, and the total it counts
    /// ("offloaded 10/19 layers to GPU").
    pub layers_offloaded: Option<u32>,
    pub layers_total: Option<u32>,
    /// Model buffers llama.cpp allocated, per buffer type.
    pub model_buffers: Vec<BufferLine>,
    pub flash_attn: FlashAttn,
    pub t_load_ms: f64,
    pub wall_ms: f64,
    /// Last lines the worker wrote to stderr (failures only).
    pub stderr_tail: Vec<String>,
    /// Sampled memory per device over the trial: NVML and host (sampled by
    /// the parent), llama.cpp devices with a memory budget (by the worker).
    #[serde(default)]
    pub sampled: Vec<MemoryStats>,
    /// llama.cpp's devices as the worker saw them.
    #[serde(default)]
    pub devices: Vec<LlamaDevice>,
    /// What other processes took from the machine while the trial ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contention: Option<Contention>,
}

impl TrialResult {
    /// Device memory llama.cpp accounted for: model buffers on devices plus
    /// the largest device context of the trial's tests.
    #[must_use]
    pub fn accounted_device_bytes(&self) -> u64 {
        let model: u64 = self.model_buffers.iter().filter(|b| b.on_device()).map(|b| b.bytes).sum();
        let ctx = self
            .tests
            .iter()
            .map(|t| t.context_buffers.iter().filter(|b| b.on_device()).map(|b| b.bytes).sum::<u64>())
            .max()
            .unwrap_or(0);
        model + ctx
    }

    /// Device model-buffer bytes only (weights).
    #[must_use]
    pub fn device_model_bytes(&self) -> u64 {
        self.model_buffers.iter().filter(|b| b.on_device()).map(|b| b.bytes).sum()
    }

    /// The trustworthy sampled device memory: NVML's device-wide figures
    /// where NVML works, else llama.cpp devices that report a budget.
    /// Empty when no trustworthy sampler exists (accounted memory applies).
    #[must_use]
    pub fn sampled_devices(&self) -> Vec<&MemoryStats> {
        let nvml: Vec<&MemoryStats> = self.sampled.iter().filter(|m| m.source == "nvml").collect();
        if nvml.is_empty() {
            self.sampled.iter().filter(|m| m.source == "ggml").collect()
        } else {
            nvml
        }
    }

    /// Measured while other processes took more than the threshold (and
    /// still so after the one repetition a contended trial gets).
    #[must_use]
    pub fn contended(&self) -> bool {
        self.contention.as_ref().is_some_and(|c| c.contended)
    }

    /// Peak resident memory of the worker process.
    #[must_use]
    pub fn peak_host_rss(&self) -> Option<u64> {
        self.sampled.iter().find(|m| m.source == "host").and_then(|m| m.peak_pid_used)
    }

    #[must_use]
    pub fn test(&self, pp: bool) -> Option<&TestResult> {
        self.tests.iter().find(|t| if pp { t.n_prompt > 0 && t.n_gen == 0 } else { t.n_gen > 0 && t.n_prompt == 0 })
    }

    /// A result for a trial that produced nothing.
    #[must_use]
    pub fn failed(spec: TrialSpec, status: TrialStatus, reason: String) -> Self {
        let flash_attn = spec.flash_attn;
        TrialResult {
            spec,
            status,
            reason: Some(reason),
            tests: Vec::new(),
            layers_offloaded: None,
            layers_total: None,
            model_buffers: Vec::new(),
            flash_attn,
            t_load_ms: 0.0,
            wall_ms: 0.0,
            stderr_tail: Vec::new(),
            sampled: Vec::new(),
            devices: Vec::new(),
            contention: None,
        }
    }
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
        op_offload: true,
        race: None,
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
