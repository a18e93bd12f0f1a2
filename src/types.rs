//! The plain data every module shares: what a trial is and what it
//! measured, memory and contention readings, devices and hardware, the
//! objective and the decision. Serde types with small helpers; no I/O and
//! no llama.cpp. Everything else imports these; these import nothing of
//! ours but the pure math of `stats` and `curve`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::curve::{Curve, LinearFit};

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

/// The KV cache's element type (llama.cpp's `-ctk`/`-ctv`, Ollama's
/// `OLLAMA_KV_CACHE_TYPE`). Both caches get the same type.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, PartialOrd, Ord, clap::ValueEnum,
)]
pub enum KvType {
    #[default]
    #[serde(rename = "f16")]
    #[value(name = "f16")]
    F16,
    #[serde(rename = "q8_0")]
    #[value(name = "q8_0")]
    Q8_0,
    #[serde(rename = "q4_0")]
    #[value(name = "q4_0")]
    Q4_0,
}

impl KvType {
    /// The name llama.cpp and Ollama take.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// ggml's type id (ggml.h's `enum ggml_type`).
    #[must_use]
    pub fn ggml_type(self) -> i32 {
        match self {
            KvType::F16 => 1,
            KvType::Q4_0 => 2,
            KvType::Q8_0 => 8,
        }
    }

    /// A quantized V cache needs flash attention in llama.cpp.
    #[must_use]
    pub fn is_quantized(self) -> bool {
        self != KvType::F16
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_f16(k: &KvType) -> bool {
    *k == KvType::F16
}

#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_zero(n: &u32) -> bool {
    *n == 0
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
    /// Layers (from the first) whose dense FFN weights (`ffn_up`, `ffn_gate`,
    /// `ffn_down`) stay on the CPU while the layer, its attention and its
    /// KV cache are offloaded: llama.cpp's `-ot` with a CPU buffer type.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub n_cpu_ffn: u32,
    /// More tensors kept in the CPU buffer type: regular expressions of
    /// llama.cpp's `-ot PATTERN=CPU` (bench's `--override-tensor`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_overrides: Vec<String>,
    /// KV cache type of both caches (`-ctk`/`-ctv`).
    #[serde(default, skip_serializing_if = "is_f16")]
    pub kv_type: KvType,
    /// Offload host tensor operations (large-batch matrix products of
    /// layers on the CPU) to the device: llama.cpp's default (on), its
    /// `--no-op-offload` (off), or auto, which the worker resolves from its
    /// devices (off where every offload device runs on the CPU). A result's
    /// spec says what was used.
    #[serde(default = "op_on", skip_serializing_if = "is_op_on")]
    pub op_offload: OpOffload,
    /// Cut the trial short where it is clearly losing (adaptive search).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub race: Option<Race>,
    /// llama.cpp RPC servers (`host:port`) whose devices join this
    /// machine's, as llama.cpp's `--rpc`: listed first among the offload
    /// devices, as llama.cpp orders them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpc: Vec<String>,
    /// Layers per offload device, in llama.cpp's device order (llama.cpp's
    /// `-ts` with split mode layer); empty: llama.cpp's default split, by
    /// free memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_split: Vec<u32>,
    /// The device that holds the output and intermediate results in split
    /// mode layer (`-mg`); llama.cpp's default 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub main_gpu: u32,
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

fn default_interval() -> u64 {
    20
}

fn op_on() -> OpOffload {
    OpOffload::On
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_op_on(o: &OpOffload) -> bool {
    *o == OpOffload::On
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

/// Why a trial was run.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A point of the ngl search (grid value or adaptive point).
    Grid,
    /// The decision's unmeasured best, measured.
    Confirm,
    /// A thread count at the chosen setting.
    Threads,
    /// Full offload with the experts of the first K layers on the CPU.
    Moe,
    /// An escape hatch at the same context: another KV cache type, or the
    /// FFN weights of some layers on the CPU.
    Hatch,
    /// Layers split across several devices by a chosen proportion (`-ts`).
    Split,
}

impl Role {
    /// A trial of the ngl search: what the decision, its fits and the chart
    /// are made of (thread and expert trials are measured after it).
    #[must_use]
    pub fn is_search(self) -> bool {
        matches!(self, Role::Grid | Role::Confirm)
    }

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Grid => "grid",
            Role::Confirm => "confirm",
            Role::Threads => "threads",
            Role::Moe => "moe",
            Role::Hatch => "hatch",
            Role::Split => "split",
        }
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
    /// Where the worker's time went (only with `NGL_TUNE_TIMINGS` set:
    /// `scripts/bench-overhead`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<WorkerTimings>,
}

/// Where a worker's time went, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorkerTimings {
    /// llama.cpp's backend start (device discovery).
    pub init_ms: f64,
    /// Loading the model.
    pub load_ms: f64,
    /// Contexts, warm-ups and the timed repetitions.
    pub measure_ms: f64,
    /// From the worker's main to its result line.
    pub worker_ms: f64,
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

    /// What llama.cpp accounted per device buffer type: model buffers plus
    /// the largest context of the trial's tests on that device.
    #[must_use]
    pub fn accounted_per_device(&self) -> Vec<(String, u64)> {
        let on_device = |lines: &[BufferLine]| -> Vec<(String, u64)> {
            merge_by_name(lines.iter().filter(|b| b.on_device()).map(|b| (b.buffer_type.clone(), b.bytes)), |a, b| {
                a + b
            })
        };
        let largest_context = merge_by_name(self.tests.iter().flat_map(|t| on_device(&t.context_buffers)), u64::max);
        merge_by_name(on_device(&self.model_buffers).into_iter().chain(largest_context), |a, b| a + b)
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
        let nvml: Vec<&MemoryStats> = self.sampled.iter().filter(|m| m.source == Source::Nvml).collect();
        if nvml.is_empty() {
            self.sampled.iter().filter(|m| m.source == Source::Ggml).collect()
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
        self.sampled.iter().find(|m| m.source == Source::Host).and_then(|m| m.peak_pid_used)
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
            timings: None,
        }
    }
}

/// Layers per device as llama.cpp's `-ts` takes them: "9,13".
#[must_use]
pub fn split_list(split: &[u32]) -> String {
    split.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Bytes per name, in the order the names first come, the bytes of one
/// name combined by `merge` (a sum, or the largest).
#[must_use]
pub fn merge_by_name(items: impl IntoIterator<Item = (String, u64)>, merge: fn(u64, u64) -> u64) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for (name, bytes) in items {
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => *v = merge(*v, bytes),
            None => out.push((name, bytes)),
        }
    }
    out
}

/// One "<buffer type> <kind> buffer size = N MiB" line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BufferLine {
    /// llama.cpp's buffer type name: "CPU_Mapped", "Vulkan0", "CUDA_Host", ...
    pub buffer_type: String,
    /// "model", "KV", "compute", "output", "RS", ...
    pub kind: String,
    pub bytes: u64,
}

impl BufferLine {
    /// True for memory that lives on an accelerator (not host or pinned host memory).
    #[must_use]
    pub fn on_device(&self) -> bool {
        is_device_buffer_type(&self.buffer_type)
    }
}

#[must_use]
pub fn is_device_buffer_type(name: &str) -> bool {
    !(name.starts_with("CPU") || name.ends_with("_Host") || name.is_empty())
}

/// Where a memory figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// NVIDIA's management library: device-wide and per process.
    Nvml,
    /// llama.cpp's device free/total (devices with a memory budget).
    Ggml,
    /// The machine's RAM and the worker's resident set.
    Host,
    /// What llama.cpp itself allocated, from its log.
    Accounted,
    /// No GPU device: nothing to measure.
    None,
}

impl Source {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Nvml => "nvml",
            Source::Ggml => "ggml",
            Source::Host => "host",
            Source::Accounted => "accounted",
            Source::None => "none",
        }
    }

    /// A sampler that sees what the device holds (not llama.cpp's own accounting).
    #[must_use]
    pub fn is_sampled(self) -> bool {
        matches!(self, Source::Nvml | Source::Ggml)
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Baseline, peak and mean of one device over a trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryStats {
    pub source: Source,
    pub device: String,
    pub total: u64,
    /// Used before the trial started.
    pub baseline_used: u64,
    pub peak_used: u64,
    pub mean_used: u64,
    /// Peak bytes held by the trial's process, where attributable.
    pub peak_pid_used: Option<u64>,
    pub n_samples: u64,
}

impl MemoryStats {
    /// Peak use as a share of the device's total.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn peak_share(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.peak_used as f64 / self.total as f64
        }
    }
}

/// One NVIDIA GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub driver_version: Option<String>,
    pub memory_total: Option<u64>,
    pub memory_free: Option<u64>,
    pub pcie_gen_current: Option<u32>,
    pub pcie_gen_max: Option<u32>,
    pub pcie_width_current: Option<u32>,
    pub pcie_width_max: Option<u32>,
    pub memory_bus_width_bits: Option<u32>,
    pub memory_clock_max_mhz: Option<u32>,
    /// Theoretical memory bandwidth (GB/s) from bus width and memory clock.
    pub bandwidth_gbs: Option<f64>,
}

/// One llama.cpp (ggml) backend device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaDevice {
    pub index: usize,
    pub name: String,
    pub description: String,
    pub backend: String,
    /// "cpu", "gpu", "igpu", "accel".
    pub kind: String,
    pub memory_total: u64,
    pub memory_free: u64,
}

impl LlamaDevice {
    #[must_use]
    pub fn is_offload_target(&self) -> bool {
        self.kind == "gpu" || self.kind == "igpu"
    }

    /// A device of a llama.cpp RPC server (its description is the endpoint).
    #[must_use]
    pub fn is_remote(&self) -> bool {
        self.backend == "RPC"
    }

    /// A Vulkan implementation that runs on the CPU (Mesa's llvmpipe and
    /// lavapipe, Google's SwiftShader): ggml lists it as a GPU, but
    /// offloading to it cannot beat the CPU backend.
    #[must_use]
    pub fn is_software_renderer(&self) -> bool {
        let d = self.description.to_ascii_lowercase();
        ["llvmpipe", "lavapipe", "swiftshader"].iter().any(|n| d.contains(n))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuInfo {
    pub brand: String,
    pub physical_cores: u32,
    pub logical_cores: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RamInfo {
    pub total: u64,
    pub available: u64,
    /// Memory limit of this process's cgroup, when one is set.
    pub cgroup_limit: Option<u64>,
}

/// The `hw` report. Stable, documented JSON (see README).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hardware {
    /// Stable id of this host (survives driver updates); the profile store's directory.
    pub machine_id: String,
    pub gpus: Vec<GpuInfo>,
    /// Why there is no NVML data, when there is none.
    pub nvml: Option<String>,
    pub llama_devices: Vec<LlamaDevice>,
    pub cpu: CpuInfo,
    pub ram: RamInfo,
    pub os: String,
    pub kernel: String,
    pub llama_cpp_revision: String,
    /// Backends compiled into this build: "CPU", "Vulkan", "CUDA", "Metal".
    pub backends: Vec<String>,
    /// llama.cpp RPC servers whose devices join this machine's (`--rpc`),
    /// as they answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpc_servers: Vec<RpcServer>,
    /// Short hash of what changes a tuning answer.
    pub fingerprint: String,
    /// Plain-words notes about missing or untrustworthy sources.
    pub notes: Vec<String>,
}

/// A process that used CPU while a trial ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BusyProcess {
    pub pid: u32,
    pub name: String,
    /// Cores' worth of CPU it used on average over the trial.
    pub cores: f64,
}

/// What other processes took while a trial ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Contention {
    /// Cores' worth of CPU that other processes used, on average over the
    /// trial and at the busiest half second.
    pub others_cores_mean: f64,
    pub others_cores_peak: f64,
    /// The same as a share of the machine's CPU time (all logical cores).
    pub others_share_mean: f64,
    pub others_share_peak: f64,
    pub logical_cores: u32,
    /// Largest 1-minute load average seen (it counts the trial's own threads).
    pub load_avg_1m: Option<f64>,
    /// The processes that took the most CPU, at most three.
    pub top: Vec<BusyProcess>,
    /// GPU utilization (percent) before the worker started, and the other
    /// processes holding GPU memory then (NVIDIA, through NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_util_before_pct: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_others: Vec<GpuProcess>,
    /// Others used more than `threshold_cores`, or the GPU was busy before the trial.
    pub contended: bool,
    pub threshold_cores: f64,
    /// The trial was measured again after a contended first attempt; this
    /// is the second attempt, and `first_others_cores` what the first saw.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repeated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_others_cores: Option<f64>,
}

/// Another process on the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub bytes: Option<u64>,
}

impl Contention {
    /// "cc1plus (pid 123) 0.95 cores, make (pid 99) 0.10 cores".
    #[must_use]
    pub fn top_words(&self) -> String {
        self.top
            .iter()
            .map(|p| format!("{} (pid {}) {:.2} cores", p.name, p.pid, p.cores))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Cores the trial could have had to itself, on average.
    #[must_use]
    pub fn free_cores(&self) -> f64 {
        (f64::from(self.logical_cores) - self.others_cores_mean).max(0.0)
    }
}

/// What "best" means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Token generation speed (chat, the default).
    Tg,
    /// Prompt processing speed (long prompts, RAG).
    Pp,
    /// Time for one request of n_prompt + n_gen tokens.
    Mixed,
}

impl Objective {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Objective::Tg => "tg",
            Objective::Pp => "pp",
            Objective::Mixed => "mixed",
        }
    }
}

/// One measured setting, reduced to what the decision needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub ngl: u32,
    /// Completed (false for oom, crashed, timeout, failed).
    pub ok: bool,
    /// Out of memory: this and every larger ngl are over the cap.
    pub oom: bool,
    pub tg: Option<f64>,
    pub pp: Option<f64>,
    /// Memory this setting costs, in the currency the cap is in (bytes).
    pub mem: Option<f64>,
}

impl Point {
    /// The three models decisions and charts use, each against ngl: seconds
    /// per generated token, seconds per prompt token (time per token is
    /// what is linear in ngl; speeds are its inverse), and memory.
    #[must_use]
    pub fn curves(points: &[Point], full: u32) -> (Curve, Curve, Curve) {
        let curve = |f: &dyn Fn(&Point) -> Option<f64>| {
            Curve::new(points.iter().filter(|p| p.ok).filter_map(|p| f(p).map(|v| (p.ngl, v))).collect(), full)
        };
        (
            curve(&|p| p.tg.filter(|v| *v > 0.0).map(|v| 1.0 / v)),
            curve(&|p| p.pp.filter(|v| *v > 0.0).map(|v| 1.0 / v)),
            curve(&|p| p.mem),
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fits {
    /// Seconds per generated token against ngl (partial offload).
    pub tg_time: Option<LinearFit>,
    /// Seconds per prompt token against ngl (partial offload).
    pub pp_time: Option<LinearFit>,
    /// Memory against ngl (partial offload).
    pub memory: Option<LinearFit>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Knee {
    pub ngl: u32,
    pub tg: f64,
    pub mem: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub recommended_ngl: u32,
    /// The recommendation was predicted, not measured: confirm it.
    pub needs_confirmation: bool,
    /// Largest ngl whose (measured or fitted) memory stays under the cap.
    pub max_ngl_under_cap: Option<u32>,
    pub predicted_tg: Option<f64>,
    pub predicted_pp: Option<f64>,
    pub predicted_mem: Option<f64>,
    /// Grid or confirmation settings over the cap (measured or predicted).
    pub over_cap: Vec<u32>,
    pub knee: Option<Knee>,
    pub knee_note: String,
    /// Offloading only made things slower.
    pub offload_hurts: bool,
    pub fits: Fits,
    /// Where the data do not follow the model, in words.
    pub fit_notes: Vec<String>,
    /// Why this setting, in two or three lines.
    pub reasons: Vec<String>,
}

/// A quantization's cost in quality, measured as llama.cpp's perplexity
/// tool does with `--kl-divergence`, on tokens the reference generated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quality {
    /// Mean KL divergence (nats) of the token distributions from the reference's.
    pub kl_mean: f64,
    /// 99th percentile of the per-token KL divergence.
    pub kl_p99: f64,
    /// Share of positions whose most likely token is the reference's.
    pub top1_agree: f64,
    pub tokens: u32,
    /// What it was compared with ("f16 KV cache", a model file).
    pub reference: String,
}

/// One device of an RPC server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcDevice {
    /// The server's device index (the `N` of llama.cpp's `RPC<N>[host:port]` buffers is a client-wide count).
    pub index: u32,
    pub memory_total: u64,
    pub memory_free: u64,
}

/// What one server answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcServer {
    pub endpoint: String,
    /// Its RPC protocol version ("7.0.0").
    pub protocol: String,
    pub devices: Vec<RpcDevice>,
    /// Median round trip of a small request, in milliseconds.
    pub rtt_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounted_memory_per_device_is_the_weights_and_the_largest_context() {
        let line = |buffer_type: &str, kind: &str, bytes: u64| BufferLine {
            buffer_type: buffer_type.into(),
            kind: kind.into(),
            bytes,
        };
        let mut r = TrialResult::failed(crate::engine::test_spec(), TrialStatus::Ok, String::new());
        r.model_buffers =
            vec![line("RPC0[a:1]", "model", 100), line("CPU_Mapped", "model", 7), line("CUDA0", "model", 50)];
        let mut pp = TestResult::from_samples(64, 0, 256, vec![1]);
        pp.context_buffers =
            vec![line("RPC0[a:1]", "KV", 10), line("RPC0[a:1]", "compute", 30), line("CUDA0", "KV", 5)];
        let mut tg = TestResult::from_samples(0, 16, 256, vec![1]);
        tg.context_buffers = vec![line("RPC0[a:1]", "KV", 10), line("CUDA0", "compute", 9)];
        r.tests = vec![pp, tg];
        // RPC0: 100 + max(10 + 30, 10); CUDA0: 50 + max(5, 9); host memory is not a device's.
        assert_eq!(r.accounted_per_device(), [("RPC0[a:1]".to_string(), 140), ("CUDA0".to_string(), 59)]);
    }
}
