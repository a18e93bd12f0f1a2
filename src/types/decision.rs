//! What the measurements decide: the objective, the points, fits, knee, decision, quality.

use serde::{Deserialize, Serialize};

use super::Objective;
use crate::curve::{Curve, LinearFit};

/// A batch job (`--job 500x800`): requests, and the tokens each generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub requests: u32,
    pub n_gen: u32,
}

/// What the tune is asked to serve: what "best" means (`--objective`),
/// the reading speed a chat answer is judged against, the streams decoded
/// together under `--objective throughput`, a batch job whose hours each
/// answer states. Flattened into the stored settings (its fields keep
/// their names there).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Goal {
    pub objective: Objective,
    /// Reading speed for chat (t/s of generation, `--reading-speed`): each
    /// context's answer is judged against it, with the hatch that reaches it.
    #[serde(default = "default_reading_speed", skip_serializing_if = "is_default_reading_speed")]
    pub reading_speed: f64,
    /// `--parallel N` of `--objective throughput`: sequences decoding
    /// together in each tg test (the placement's slots, `-np N`, each
    /// slot a context of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_streams: Option<u32>,
    /// `--job`: a batch job whose hours each context's answer states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<Job>,
}

impl Goal {
    /// Sequences each tg test decodes together: `--parallel` under
    /// `--objective throughput`, else one.
    #[must_use]
    pub fn streams(&self) -> u32 {
        match (self.objective, self.parallel_streams) {
            (Objective::Throughput, Some(n)) => n.max(1),
            _ => 1,
        }
    }
}

/// `--reading-speed`'s default (t/s of generation): the top of the guides'
/// 8-10 t/s, so an answer called fast enough is so for every reader.
pub const DEFAULT_READING_SPEED: f64 = 10.0;

fn default_reading_speed() -> f64 {
    DEFAULT_READING_SPEED
}

#[allow(clippy::trivially_copy_pass_by_ref, clippy::float_cmp)]
fn is_default_reading_speed(k: &f64) -> bool {
    *k == DEFAULT_READING_SPEED
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
    /// Mean power over its tg test, where measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<Power>,
}

/// Mean power over a test: the NVIDIA GPUs' (NVML) and the CPU packages' (RAPL), those measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Power {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_w: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_w: Option<f64>,
}

impl Power {
    /// Of a test: `None` where neither was measured.
    #[must_use]
    pub fn of(t: &super::TestResult) -> Option<Power> {
        (t.power_w.is_some() || t.cpu_power_w.is_some()).then_some(Power { gpu_w: t.power_w, cpu_w: t.cpu_power_w })
    }

    /// Both together (W).
    #[must_use]
    pub fn total(&self) -> f64 {
        self.gpu_w.unwrap_or(0.0) + self.cpu_w.unwrap_or(0.0)
    }
}

impl Point {
    /// Watts against ngl (the objective `energy`, the `--max-power` cap):
    /// total, and the GPUs' alone.
    #[must_use]
    pub fn power_curves(points: &[Point], full: u32) -> (Curve, Curve) {
        let curve = |f: &dyn Fn(&Power) -> Option<f64>| {
            let measured = points.iter().filter(|p| p.ok).filter_map(|p| Some((p.ngl, f(p.power.as_ref()?)?)));
            Curve::new(measured.collect(), full)
        };
        (curve(&|w| Some(w.total())), curve(&|w| w.gpu_w))
    }

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
    /// Positions whose KL divergence was not a number or infinite (a broken
    /// path); they are left out of the mean and make the option ineligible.
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub non_finite: u32,
    /// Tokens of natural text read before the scored ones: the depth the
    /// quality was judged at (0: fixed prompts on an empty cache).
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub depth: u32,
    /// The depth the placement is tuned at, where the check read less
    /// (bounded: reading all of it on this host would have cost more than
    /// the trials; see `tune::quality::kl_depth`); 0 when it read all.
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub depth_asked: u32,
    /// Seconds the check took (its child's wall time).
    #[serde(default, skip_serializing_if = "super::is_zero_f64")]
    pub wall_s: f64,
}

/// Fewer scored tokens than this say nothing (llama.cpp's perplexity tool
/// prints no KL divergence under 100 tokens).
pub const MIN_QUALITY_TOKENS: u32 = 100;

impl Quality {
    /// A score that passes every gate: what a lossy option would be worth
    /// if it cost nothing, asked before paying for its check (never stored).
    #[must_use]
    pub fn passing() -> Self {
        Self {
            kl_mean: 0.0,
            kl_p99: 0.0,
            top1_agree: 1.0,
            tokens: u32::MAX,
            reference: String::new(),
            non_finite: 0,
            depth: 0,
            depth_asked: 0,
            wall_s: 0.0,
        }
    }

    /// Why this option may not be recommended on its quality, if so: a
    /// broken path, too few tokens scored, a mean KL divergence over the
    /// gate's `max_kl`, or the top token agreeing less often than its `min_top1`.
    #[must_use]
    pub fn fails(&self, gate: &QualityGate) -> Option<String> {
        let QualityGate { max_kl, min_top1 } = *gate;
        if self.non_finite > 0 || !self.kl_mean.is_finite() || !self.top1_agree.is_finite() {
            return Some(format!(
                "quality unusable: {} of {} positions gave a KL divergence that is not a number (a broken path)",
                self.non_finite.max(1),
                self.tokens + self.non_finite
            ));
        }
        if self.tokens < MIN_QUALITY_TOKENS {
            return Some(format!(
                "quality unknown: only {} tokens scored (at least {MIN_QUALITY_TOKENS} are needed)",
                self.tokens
            ));
        }
        if self.kl_mean > max_kl {
            return Some(format!("KL divergence {:.4} over --max-kl {max_kl}", self.kl_mean));
        }
        if self.top1_agree < min_top1 {
            return Some(format!(
                "top token agrees {:.1}% of the time, under --min-top1 {:.0}%",
                self.top1_agree * 100.0,
                min_top1 * 100.0
            ));
        }
        None
    }
}

/// The quality gate an option that changes the output (a quantized KV
/// cache, a lower quantization) must pass to be recommended: `--max-kl`
/// and `--min-top1`. Flattened into the stored settings (its fields keep
/// their names there).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QualityGate {
    /// Mean KL divergence from the reference at most this (nats).
    #[serde(default = "default_max_kl", skip_serializing_if = "is_default_max_kl")]
    pub max_kl: f64,
    /// The top token agrees with the reference's at least this often.
    #[serde(default = "default_min_top1", skip_serializing_if = "is_default_min_top1")]
    pub min_top1: f64,
}

impl Default for QualityGate {
    fn default() -> Self {
        QualityGate { max_kl: DEFAULT_MAX_KL, min_top1: DEFAULT_MIN_TOP1 }
    }
}

/// `--max-kl`'s default: llama.cpp's q8_0 KV cache scores about 0.001
/// nats, q4_0 about 0.01-0.03; 0.05 admits both on most models and stops
/// the ones that lose their way.
pub const DEFAULT_MAX_KL: f64 = 0.05;

/// `--min-top1`'s default: q8_0 and q4_0 KV caches keep the top token
/// 97-99% of the time; a quantization that loses it one time in ten is lost.
pub const DEFAULT_MIN_TOP1: f64 = 0.9;

fn default_max_kl() -> f64 {
    DEFAULT_MAX_KL
}

#[allow(clippy::trivially_copy_pass_by_ref, clippy::float_cmp)]
fn is_default_max_kl(k: &f64) -> bool {
    *k == DEFAULT_MAX_KL
}

fn default_min_top1() -> f64 {
    DEFAULT_MIN_TOP1
}

#[allow(clippy::trivially_copy_pass_by_ref, clippy::float_cmp)]
fn is_default_min_top1(k: &f64) -> bool {
    *k == DEFAULT_MIN_TOP1
}

/// How the ngl search measures: every grid value, or adaptively (the two
/// ends, then only points that can change the answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SearchMode {
    /// Every grid value in full (also what profiles from before the field ran)
    #[default]
    Grid,
    /// The two ends, then only the points that can change the answer
    Adaptive,
}
