//! The profile: everything a tuning run measured and decided, as versioned
//! JSON (`profiles/profile.schema.json`), keyed by machine and model. This
//! file is the record (what was measured, decided and admitted); the
//! request's settings as stored are `settings`, unfinished work the
//! `checkpoint`, the answer `recommendation` and its gate `admitted`.

pub(crate) mod admitted;
mod checkpoint;
mod comparison;
mod draft;
mod option;
mod recommendation;
mod set;
mod settings;
mod split;
pub use admitted::{Admitted, AdmittedSet, Evidence, Gate, Refused};
pub use checkpoint::*;
pub use comparison::*;
pub use draft::{DraftOption, DraftReport};
pub use option::*;
pub use recommendation::*;
pub use set::*;
pub use settings::*;
pub use split::*;
pub mod lock;
pub mod store;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::model::ModelInfo;
use crate::placement::Placement;
use crate::types::Hardware;
use crate::types::TrialResult;
use crate::types::{Decision, Point, Quality};

/// The profile's schema version. 2: per-context placements, KV cache types,
/// FFN overrides; 3: the typed placement (flattened into each trial's spec)
/// and typed notes; 4: the recommendation's placement is that same typed
/// placement, flattened (its op offload `"off"` where 3 wrote `false`).
/// Versions 1 to 3 are read.
pub const SCHEMA_VERSION: u32 = 4;

/// Who wrote a profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    pub version: String,
    pub llama_cpp_revision: String,
}

impl Tool {
    #[must_use]
    pub fn this() -> Self {
        Tool {
            name: "ngl-tune".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            llama_cpp_revision: crate::types::LLAMA_CPP_REVISION.into(),
        }
    }
}

/// Which model a profile is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelIdentity {
    pub file_name: String,
    pub path: PathBuf,
    pub file_size: u64,
    /// sha256 of the first 16 MiB.
    pub sha256_16m: String,
    /// Modification time (seconds since the epoch), to notice a replaced file.
    pub mtime: u64,
    pub architecture: String,
    pub n_layer: u32,
    pub n_layer_full: u32,
    pub quantization: String,
    pub n_params: u64,
    pub n_expert: u32,
    /// Context the model was trained for (0: unknown, profiles from before the field).
    #[serde(default, skip_serializing_if = "crate::types::is_zero_u64")]
    pub ctx_train: u64,
    /// MTP (NextN) blocks with their weights, the last of `n_layer` (0: none, or a profile from before the field).
    #[serde(default, skip_serializing_if = "crate::types::is_zero")]
    pub n_layer_nextn: u32,
}

impl ModelIdentity {
    #[must_use]
    pub fn of(m: &ModelInfo) -> Self {
        let mtime = std::fs::metadata(&m.path)
            .and_then(|md| md.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        let path = std::fs::canonicalize(&m.path).unwrap_or_else(|_| m.path.clone());
        ModelIdentity {
            file_name: m.file_name.clone(),
            path,
            file_size: m.file_size,
            sha256_16m: m.sha256_16m.clone(),
            mtime,
            architecture: m.architecture.clone(),
            n_layer: m.n_layer,
            n_layer_full: m.n_layer_full,
            quantization: m.quantization.clone(),
            n_params: m.n_params,
            n_expert: m.n_expert,
            ctx_train: m.ctx_train,
            n_layer_nextn: if m.has_mtp() { m.n_layer_nextn } else { 0 },
        }
    }

    /// Whether the model carries MTP heads (`--spec-type draft-mtp`).
    #[must_use]
    pub fn has_mtp(&self) -> bool {
        self.n_layer_nextn > 0
    }

    /// Short id used in file names.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.sha256_16m[..self.sha256_16m.len().min(12)]
    }
}

impl Profile {
    /// The Ollama server's variable: from the environment the tune read
    /// when it found one, else this process's.
    #[must_use]
    pub fn ollama_var(&self, key: &str) -> Option<String> {
        match &self.settings.consumer {
            Some(c) if c.found && c.program == crate::consumer::Program::Ollama => c.var(key),
            _ => std::env::var(key).ok(),
        }
    }
}

/// How much measuring the search took, against what the full grid would have.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchReport {
    pub mode: String,
    /// Trials run for the ngl decision (threads trials not counted).
    pub trials: usize,
    /// Seconds spent in those trials.
    pub trial_wall_s: f64,
    /// Settings the full default grid has.
    pub grid_size: usize,
    /// Trials cut short after one repetition because they were far behind
    /// the best so far (adaptive search only).
    #[serde(default)]
    pub stopped_early: usize,
    /// Adaptive search: what measuring the full grid would have taken,
    /// estimated from the measured speeds and per-trial costs.
    #[serde(default)]
    pub grid_estimate_s: Option<f64>,
    /// The trials after the ngl decision (threads, hatches, splits, the
    /// baselines' pairs): how many and their seconds.
    #[serde(default)]
    pub other_trials: usize,
    #[serde(default)]
    pub other_wall_s: f64,
    /// Seconds the quality checks (a quantized KV cache's KL divergence) took.
    #[serde(default)]
    pub quality_wall_s: f64,
}

/// How device memory was measured and what the cap is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryPolicy {
    /// NVML, llama.cpp's device free/total, or llama.cpp's own allocations ("none" without a GPU).
    pub source: crate::types::Source,
    /// The offload device the cap applies to ("Vulkan0 (llvmpipe)", "nvml0 (NVIDIA H200)").
    pub device: String,
    pub device_total_bytes: Option<u64>,
    /// Device memory in use before the trials (other processes, driver).
    pub baseline_bytes: u64,
    /// What a setting may cost: min(target × total − baseline, budget).
    pub cap_bytes: f64,
    /// How the cap was derived, in words.
    pub cap_reason: String,
}

impl MemoryPolicy {
    /// No GPU device: ngl has no effect and there is nothing to cap.
    #[must_use]
    pub fn no_gpu() -> Self {
        MemoryPolicy {
            source: crate::types::Source::None,
            device: "the CPU (no GPU device)".into(),
            device_total_bytes: None,
            baseline_bytes: 0,
            cap_bytes: 0.0,
            cap_reason: "no GPU device: ngl has no effect".into(),
        }
    }
}

/// One trial and why it was run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileTrial {
    pub role: crate::types::Role,
    /// Memory this setting cost in the policy's currency (bytes), when known.
    pub mem_bytes: Option<f64>,
    /// Device-wide peak (sampled) or baseline + accounted, and its share of the device.
    pub device_peak_bytes: Option<u64>,
    pub device_share: Option<f64>,
    pub over_cap: bool,
    /// Device memory llama.cpp's dry run predicted for this setting.
    #[serde(default)]
    pub predicted_bytes: Option<u64>,
    /// (predicted - accounted) / accounted, in percent.
    #[serde(default)]
    pub prediction_error_pct: Option<f64>,
    /// Sampled own peak minus the prediction (driver overhead and the like),
    /// where a trustworthy sampler exists.
    #[serde(default)]
    pub sampled_minus_predicted_bytes: Option<i64>,
    #[serde(flatten)]
    pub result: TrialResult,
}

impl ProfileTrial {
    /// A trial of the ngl search (grid or adaptive points, confirmations):
    /// what the decision, its fits and the chart are made of; thread-count
    /// and expert-offload trials are measured after it.
    #[must_use]
    pub fn is_search(&self) -> bool {
        self.role.is_search()
    }

    /// Measured at this context size (version-1 trials all are: one context).
    #[must_use]
    pub fn at_ctx(&self, n_ctx: u32) -> bool {
        self.result.spec.placement.n_ctx.is_none_or(|c| c == n_ctx)
    }

    /// The trial reduced to what the decision needs.
    #[must_use]
    pub fn point(&self) -> Point {
        let r = &self.result;
        Point {
            ngl: r.spec.placement.n_gpu_layers,
            ok: r.status == crate::types::TrialStatus::Ok,
            oom: r.status == crate::types::TrialStatus::Oom,
            tg: r.test(false).map(|x| x.avg_ts),
            pp: r.test(true).map(|x| x.avg_ts),
            mem: self.mem_bytes,
            power: r.test(false).and_then(crate::types::Power::of),
        }
    }
}

/// llama.cpp's own view before any trial: the dry-run memory prediction per
/// grid setting and what its `--fit` would choose for the same margin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictionReport {
    pub predictions: Vec<crate::engine::predict::Prediction>,
    pub llama_fit: Option<crate::engine::predict::LlamaFit>,
    /// What llama.cpp does without flags here (its fit with its own defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_fit: Option<crate::engine::predict::LlamaFit>,
    /// What llama-server's fit does when Ollama starts it with num_gpu unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ollama_fit: Option<crate::engine::predict::LlamaFit>,
    /// Grid values not run because their predicted memory is over the cap.
    pub predicted_over_cap: Vec<u32>,
    /// Largest |prediction error| against llama.cpp's accounted memory over the measured settings, percent.
    pub max_error_pct: Option<f64>,
    /// Measured throughput at llama.cpp's fit choice and at ngl-tune's, when both were measured.
    pub llama_fit_tg_ts: Option<f64>,
    pub error: Option<String>,
    /// The projector's share (`--mmproj`), already in every prediction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<crate::engine::predict::ProjectorPrediction>,
}

/// Predicted against measured memory at one grid point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FitCheck {
    pub ngl: u32,
    pub measured_bytes: f64,
    pub fitted_bytes: f64,
    pub error_pct: f64,
}

/// How far the recommendation can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Confidence {
    /// Measured on a machine that was idle enough.
    #[default]
    High,
    /// Some trials ran while other processes took the machine's CPU or GPU.
    Low,
}

/// The answer at one context size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextPlacement {
    pub n_ctx: u32,
    /// Full offload with an f16 KV cache fits under the cap (dry run, or measured).
    pub fits_fully: bool,
    /// The f16 KV cache at full offload, by llama.cpp's dry run.
    pub kv_bytes: Option<u64>,
    /// The answer, admitted under every cap by its evidence ([`Gate`]).
    pub recommendation: Admitted,
    /// The escape hatches in the guide's order (empty when nothing needed one).
    pub options: Vec<PlacementOption>,
    /// The recommendation against what llama.cpp does without flags (its
    /// fit), measured alternately at the same depth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<DefaultComparison>,
    /// The answer's Ollama form (num_gpu) against Ollama's own run with
    /// num_gpu unset, measured alternately at the same depth (Ollama the consumer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ollama: Option<DefaultComparison>,
    /// With several offload devices: the splits priced and measured, and
    /// each device's share of the recommendation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<SplitReport>,
    /// The answer against reading speed for chat (`None`: not measured, or
    /// a profile from before the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reading: Option<ReadingVerdict>,
    /// The hours of `--job` at this answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobVerdict>,
    /// `--draft`: speculative decoding tried beside the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<DraftReport>,
}

/// One offload device's cap and its share of a placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceShare {
    /// llama.cpp's device name ("RPC0", "Vulkan0", "CUDA1").
    pub device: String,
    /// Its buffer type in llama.cpp's log ("RPC0[10.0.0.2:50052]", "CUDA1").
    pub buffer_type: String,
    pub description: String,
    pub cap_bytes: u64,
    pub cap_reason: String,
    /// Layers of the recommendation on this device.
    pub layers: u32,
    /// llama.cpp's dry run for the recommendation.
    pub predicted_bytes: Option<u64>,
    /// What llama.cpp allocated there in the recommendation's trial.
    pub accounted_bytes: Option<u64>,
}

/// The split stage at one context.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SplitReport {
    /// The offload devices in llama.cpp's order (RPC servers first), with
    /// the recommendation's share of each.
    pub devices: Vec<DeviceShare>,
    pub options: Vec<SplitOption>,
    /// What llama.cpp's fit chose for the same per-device caps.
    pub llama_fit: Option<LlamaFitChoice>,
    /// The round trip to each RPC server, measured before the trials.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpc_links: Vec<RpcLink>,
    /// What a boundary between two devices costs per generated token (ms):
    /// what the devices' own costs do not explain in the measured splits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crossing_tg_ms: Option<f64>,
    /// The recommended split measured alternately with llama.cpp's
    /// default split and with its fit for the same caps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub against: Vec<SplitComparison>,
    /// What llama.cpp's dry run says of split modes row and tensor for the
    /// recommended split (priced, not measured).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split_modes: Vec<String>,
}

/// The recommended split paired with one of llama.cpp's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitComparison {
    /// Which of llama.cpp's splits ("llama.cpp's default split", "llama.cpp's fit for the same caps").
    pub against: String,
    /// Its tg rate as the devices' speeds predicted it (a split with proportions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_tg_ts: Option<f64>,
    /// Its tg rate in the pairs (of the tokens timed, where cut short).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tg_ts: Option<f64>,
    /// The pairing, with its placement (its `tensor_split`: layers per
    /// device in llama.cpp's order; empty: by free memory).
    #[serde(flatten)]
    pub result: DefaultComparison,
}

impl SplitComparison {
    /// Its layers per device, in llama.cpp's order (empty: by free memory).
    #[must_use]
    pub fn tensor_split(&self) -> &[u32] {
        self.result.placement.as_ref().map_or(&[], |p| p.tensor_split.as_slice())
    }
}

/// The note of a paired split of llama.cpp's that was raced out: its rate
/// is of the tokens timed, not one to set a prediction against.
pub const CUT_SHORT: &str = "theirs was cut short, far behind: its rate is of the tokens timed";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaFitChoice {
    pub n_gpu_layers: Option<i32>,
    pub tensor_split: Vec<f32>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcLink {
    pub endpoint: String,
    pub protocol: String,
    pub rtt_ms: f64,
    /// The link's bandwidth both ways, where measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<crate::types::Bandwidth>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub schema_version: u32,
    pub tool: Tool,
    pub created_at: String,
    pub machine_id: String,
    pub fingerprint: String,
    pub hardware: Hardware,
    pub model: ModelIdentity,
    pub settings: Settings,
    pub memory: MemoryPolicy,
    /// ngl has no effect (no GPU device in this build or machine): threads were tuned instead.
    pub no_gpu: bool,
    pub trials: Vec<ProfileTrial>,
    /// Grid values not run because a smaller one ran out of memory.
    pub skipped: Vec<u32>,
    pub decision: Decision,
    pub memory_fit_check: Vec<FitCheck>,
    /// The answer at the context asked first, admitted ([`Gate`]).
    pub recommendation: Admitted,
    /// llama.cpp's dry-run prediction and fit choice (absent in profiles made before they existed).
    #[serde(default)]
    pub prediction: Option<PredictionReport>,
    #[serde(default)]
    pub search: Option<SearchReport>,
    pub notes: Vec<crate::types::Note>,
    /// Wall time of the whole tuning, seconds.
    pub wall_s: f64,
    /// The answer per context size, with the escape hatches measured or
    /// predicted (since schema version 2, today [`SCHEMA_VERSION`]; version-1
    /// profiles: empty, `recommendation` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placements: Vec<ContextPlacement>,
    /// Tuned beside other models: this one's quality against the largest
    /// of them (absent for the reference and for a model tuned alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_quality: Option<Quality>,
    /// The llama.cpp backend the trials ran through (`CUDA`, `Vulkan`,
    /// `CPU`): a consumer that runs another (Ollama's CUDA llama-server on
    /// an NVIDIA card) holds other memory beyond llama.cpp's accounting.
    /// `None` in profiles from before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_backend: Option<String>,
}

impl Profile {
    /// The ngl search's trials as the decision saw them.
    #[must_use]
    pub fn search_points(&self) -> Vec<Point> {
        self.search_points_at(self.settings.workload.n_ctx)
    }

    /// The ngl search's trials at one context size.
    #[must_use]
    pub fn search_points_at(&self, n_ctx: u32) -> Vec<Point> {
        self.trials.iter().filter(|t| t.is_search() && t.at_ctx(n_ctx)).map(ProfileTrial::point).collect()
    }

    /// The profile as if only context `n_ctx` had been asked for: its
    /// recommendation becomes the profile's (for `emit --ctx`).
    ///
    /// # Errors
    /// `BadInput` naming the contexts the profile has.
    pub fn at_context(mut self, n_ctx: u32) -> anyhow::Result<Profile> {
        if self.recommendation.n_ctx() == n_ctx {
            return Ok(self);
        }
        let Some(c) = self.placement(n_ctx) else {
            let have: Vec<String> = self.settings.contexts().iter().map(ToString::to_string).collect();
            return Err(crate::error::bad(format!(
                "the profile has no placement for a {n_ctx}-token context (tuned: {}); pick one of those or tune with --ctx {n_ctx}",
                have.join(", ")
            )));
        };
        self.recommendation = c.recommendation.clone();
        Ok(self)
    }

    /// The placement at a context size (version-1 profiles: the recommendation at theirs).
    #[must_use]
    pub fn placement(&self, n_ctx: u32) -> Option<&ContextPlacement> {
        self.placements.iter().find(|p| p.n_ctx == n_ctx)
    }
}
