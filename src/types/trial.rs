//! What a trial is and what it measured.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{merge_by_name, BufferLine, Contention, LlamaDevice, MemoryStats, Source};
use crate::placement::{FlashAttn, KvType, OpOffload, Placement};

/// What one trial measures. Serialized to the worker on its stdin.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrialSpec {
    pub model: PathBuf,
    /// Where the model's parts run and with which settings (flattened: the
    /// spec's JSON keeps llama-bench's field names).
    #[serde(flatten)]
    pub placement: Placement,
    pub n_prompt: u32,
    pub n_gen: u32,
    /// Tokens in the KV cache before each test, as llama-bench's `-d`
    /// (filled once, not timed, trimmed back to between repetitions).
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub n_depth: u32,
    /// A directory where the filled cache is kept between trials (one file
    /// per context, depth, KV type and flash attention): the first trial
    /// fills it, the others load it instead of filling again. `None`: every
    /// trial fills its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth_cache: Option<PathBuf>,
    /// The KV type the tune's f16 candidates run with: f16, or the one the
    /// consumer's server forces on every model (then `placement.kv_type`).
    #[serde(default, skip_serializing_if = "super::is_f16")]
    pub kv_base: crate::placement::KvType,
    pub repetitions: u32,
    pub warmup: bool,
    pub seed: u64,
    /// Memory sampling interval in milliseconds (0: no sampling).
    #[serde(default = "default_interval")]
    pub sample_interval_ms: u64,
    /// Cut the trial short where it is clearly losing (adaptive search).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub race: Option<Race>,
    /// A baseline's trial (llama.cpp's default or Ollama's own run, paired
    /// with the answer): run with llama.cpp's op offload (on), as they run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub baseline: bool,
    /// Sequences its tg test decodes together, one token each a step, each
    /// at the depth (llama-batched-bench's S_TG; `--objective throughput
    /// --parallel N`): its rate is their tokens together.
    #[serde(default = "super::one", skip_serializing_if = "super::is_one")]
    pub n_streams: u32,
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

impl TrialSpec {
    /// What the model's load depends on: the file and where its parts go
    /// (layers, split, overrides, devices), not the context's settings
    /// (size, KV type, threads, batch sizes, flash attention, op offload,
    /// depth). Trials with one key can share one loaded model.
    #[must_use]
    pub fn load_key(&self) -> String {
        let p = &self.placement;
        let load = Placement {
            n_threads: 0,
            n_ctx: None,
            n_batch: 0,
            n_ubatch: 0,
            flash_attn: FlashAttn::Auto,
            kv_type: KvType::F16,
            op_offload: OpOffload::On,
            n_parallel: 1,
            kv_unified: false,
            ..p.clone()
        };
        format!("{}\n{}", self.model.display(), serde_json::to_string(&load).unwrap_or_default())
    }

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
    /// The recommendation or llama.cpp's default, alternated (A/B/A/B) to
    /// compare the two with the machine's drift cancelled.
    Paired,
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
            Role::Paired => "paired",
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
    /// Not run: its host part (the CPU's weights, KV cache and compute
    /// buffers, by llama.cpp's dry run) is over the host memory cap: it
    /// would page the model in from disk (swap), not run at its speed.
    OverHost,
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
            TrialStatus::OverHost => "over host memory",
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
    /// Tokens in the KV cache before the test (llama-bench's `n_depth`).
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub n_depth: u32,
    /// Cut inside its first repetition, once its running rate could no
    /// longer reach the race's threshold: the tokens that were timed (the
    /// sample is that rate, over the whole test's tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_measured: Option<u32>,
    /// The NVIDIA GPUs' mean power over the test (W, device-wide, NVML's
    /// energy counter around it; its repetitions and warmup included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_w: Option<f64>,
    /// The CPU packages' mean power over the test (W, RAPL's energy
    /// counters around it, where Linux's powercap can be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_power_w: Option<f64>,
    /// Energy per token (J) at that power and this test's rate
    /// ([`TestResult::joules_per_token`], written with the power).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub j_per_token: Option<f64>,
    /// Sequences decoded together (a tg test of `--objective throughput`):
    /// its rates count every sequence's tokens.
    #[serde(default = "super::one", skip_serializing_if = "super::is_one")]
    pub n_streams: u32,
}

impl TestResult {
    /// Energy per token (J): the GPUs' and CPU packages' mean power (those
    /// measured) over the time one token takes.
    #[must_use]
    pub fn joules_per_token(&self) -> Option<f64> {
        super::Power::of(self).filter(|_| self.avg_ts > 0.0).map(|w| w.total() / self.avg_ts)
    }
}

impl TestResult {
    /// Builds the statistics from raw durations exactly as llama-bench does:
    /// t/s per sample, then mean and sample standard deviation (n-1).
    #[must_use]
    pub fn from_samples(n_prompt: u32, n_gen: u32, n_ctx: u32, samples_ns: Vec<u64>) -> Self {
        let n_tokens = f64::from(n_prompt + n_gen);
        #[allow(clippy::cast_precision_loss)]
        let samples_ts: Vec<f64> = samples_ns.iter().map(|ns| n_tokens * 1e9 / (*ns as f64).max(1.0)).collect();
        let (avg_ns, stddev_ns) = ns_stats(&samples_ns);
        TestResult {
            n_prompt,
            n_gen,
            n_ctx,
            avg_ns,
            stddev_ns,
            avg_ts: crate::stats::mean(&samples_ts),
            stddev_ts: crate::stats::stddev(&samples_ts),
            samples_ts,
            samples_ns,
            context_buffers: Vec::new(),
            stopped_early: false,
            n_depth: 0,
            tokens_measured: None,
            power_w: None,
            cpu_power_w: None,
            j_per_token: None,
            n_streams: 1,
        }
    }

    /// The same test with `n` sequences decoded together: its rates are of
    /// all their tokens (`n` times those of one stream's time).
    #[must_use]
    pub fn with_streams(mut self, n: u32) -> Self {
        if n > 1 {
            self.n_streams = n;
            for ts in &mut self.samples_ts {
                *ts *= f64::from(n);
            }
            self.avg_ts = crate::stats::mean(&self.samples_ts);
            self.stddev_ts = crate::stats::stddev(&self.samples_ts);
        }
        self
    }

    /// The same test, measured at `n_depth` tokens of KV cache.
    #[must_use]
    pub fn at_depth(mut self, n_depth: u32) -> Self {
        self.n_depth = n_depth;
        self
    }

    /// "pp512", "tg128", "tg128 @ d4096": llama-bench's test names.
    #[must_use]
    pub fn name(&self) -> String {
        let base = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, g) => format!("tg{g}"),
            (p, g) => format!("pp{p}+tg{g}"),
        };
        if self.n_depth > 0 {
            format!("{base} @ d{}", self.n_depth)
        } else {
            base
        }
    }
}

/// Mean and sample standard deviation of durations, in whole nanoseconds.
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn ns_stats(samples_ns: &[u64]) -> (u64, u64) {
    let f: Vec<f64> = samples_ns.iter().map(|v| *v as f64).collect();
    (crate::stats::mean(&f).round() as u64, crate::stats::stddev(&f).round() as u64)
}

/// The projector's test: one fixed image encoded (mtmd's `encode_chunk`,
/// what llama-server runs for each image before the prompt), after a
/// warmup, `repetitions` times: llama-bench's statistics per image.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ImageTest {
    /// The image as given (the projector resizes it to its own size).
    pub nx: u32,
    pub ny: u32,
    /// Tokens the image becomes in the text model's context.
    pub n_tokens: u32,
    pub samples_ns: Vec<u64>,
    pub avg_ns: u64,
    pub stddev_ns: u64,
}

impl ImageTest {
    #[must_use]
    pub fn from_samples(nx: u32, ny: u32, n_tokens: u32, samples_ns: Vec<u64>) -> Self {
        let (avg_ns, stddev_ns) = ns_stats(&samples_ns);
        ImageTest { nx, ny, n_tokens, samples_ns, avg_ns, stddev_ns }
    }

    /// Its rates as llama-bench states a test's: image tokens per second.
    #[must_use]
    pub fn as_test(&self) -> TestResult {
        TestResult::from_samples(self.n_tokens, 0, 0, self.samples_ns.clone())
    }

    /// "img 896x896": the row's name beside llama-bench's pp and tg.
    #[must_use]
    pub fn name(&self) -> String {
        format!("img {}x{}", self.nx, self.ny)
    }

    /// Milliseconds per image.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn avg_ms(&self) -> f64 {
        self.avg_ns as f64 / 1e6
    }

    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn stddev_ms(&self) -> f64 {
        self.stddev_ns as f64 / 1e6
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
    /// The model was already loaded by the worker's previous trial, which
    /// loaded it the same way (`t_load_ms` is then 0).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub model_reused: bool,
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
    /// The projector's image test, where the trial loads one (`--mmproj`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageTest>,
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
        let flash_attn = spec.placement.flash_attn;
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
            model_reused: false,
            wall_ms: 0.0,
            stderr_tail: Vec::new(),
            sampled: Vec::new(),
            devices: Vec::new(),
            contention: None,
            timings: None,
            image: None,
        }
    }
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
