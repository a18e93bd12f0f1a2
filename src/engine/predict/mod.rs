//! Memory prediction by llama.cpp's own dry run: the model is loaded and the
//! context created with no allocation, and llama.cpp reports per buffer type
//! what it would allocate (weights, KV cache, compute buffers). This is what
//! llama.cpp's `--fit` reads. Runs in a child process (hidden `__predict`) so
//! the parent never initializes a GPU backend.

use std::path::PathBuf;

use anyhow::Result;
use serde::{Deserialize, Serialize};

/// What llama.cpp would allocate in one buffer type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PredictedBuffer {
    pub buffer_type: String,
    pub is_host: bool,
    pub model: u64,
    pub context: u64,
    pub compute: u64,
}

/// The dry run's answer at one ngl.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub n_gpu_layers: u32,
    /// Bytes on accelerator devices (not host buffers): model + context + compute.
    pub device_bytes: u64,
    pub device_model_bytes: u64,
    pub buffers: Vec<PredictedBuffer>,
    /// Why llama.cpp could not predict this setting.
    pub error: Option<String>,
    /// The placement, where it is more than a whole-layer split at the spec's context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub case: Option<PredictCase>,
    /// Layers per offload device, where the prediction is for a split.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split: Vec<u32>,
    /// The devices in the order `split` follows (`--device`); empty: llama.cpp's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
}

impl Prediction {
    /// Bytes in host buffers (the CPU's weights, mmap'd or not, its KV
    /// cache and compute buffers, pinned host copies): what this placement
    /// needs of the machine's RAM to run without paging.
    #[must_use]
    pub fn host_bytes(&self) -> u64 {
        let host = self.buffers.iter().filter(|b| b.is_host || !crate::types::is_device_buffer_type(&b.buffer_type));
        host.map(|b| b.model + b.context + b.compute).sum()
    }

    /// Bytes per accelerator buffer type (model + context + compute), in
    /// the order llama.cpp reported them: one buffer type per device in
    /// split mode layer (`Vulkan0`, `CUDA1`, `RPC0[host:port]`).
    #[must_use]
    pub fn per_device(&self) -> Vec<(String, u64)> {
        let device = self.buffers.iter().filter(|b| !b.is_host && crate::types::is_device_buffer_type(&b.buffer_type));
        crate::types::merge_by_name(device.map(|b| (b.buffer_type.clone(), b.model + b.context + b.compute)), |a, b| {
            a + b
        })
    }
}

impl Prediction {
    /// A fake world's price of `case` on one Vulkan device: `all` bytes,
    /// `weights` of them the model's, the rest its context.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn on_one_device(case: PredictCase, all: u64, weights: u64) -> Prediction {
        Prediction {
            devices: Vec::new(),
            n_gpu_layers: case.ngl,
            device_bytes: all,
            device_model_bytes: weights,
            buffers: vec![PredictedBuffer {
                buffer_type: "Vulkan0".into(),
                is_host: false,
                model: weights,
                context: all - weights,
                compute: 0,
            }],
            error: None,
            case: Some(case),
            split: vec![],
        }
    }

    /// Whether this prediction is for the placement `spec` measures (a
    /// whole-layer prediction: at the spec's context with the tune's own
    /// KV cache type, `spec.kv_base`).
    #[must_use]
    pub fn prices(&self, spec: &crate::types::TrialSpec) -> bool {
        self.prices_placement(&spec.placement, spec.kv_base)
    }

    /// Whether this prediction is for placement `p`, `kv_base` being the
    /// cache type a whole-layer prediction names (the tune's own).
    #[must_use]
    pub fn prices_placement(&self, p: &crate::placement::Placement, kv_base: crate::placement::KvType) -> bool {
        let c = self.case.unwrap_or(PredictCase::layers(self.n_gpu_layers, p.n_ctx.unwrap_or(0)));
        c.ngl == p.n_gpu_layers
            && Some(c.n_ctx) == p.n_ctx.or(Some(0))
            && c.kv_type.unwrap_or(kv_base) == p.kv_type
            && c.n_cpu_ffn == p.n_cpu_ffn
            && c.n_cpu_moe == p.n_cpu_moe
            && self.split == p.tensor_split
            && self.devices == p.devices
            // Every prediction counts the projector on its GPU.
            && p.mmproj_offload
    }
}

/// A placement to price beyond the whole-layer grid: another context, KV
/// cache type, or tensors kept on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PredictCase {
    pub ngl: u32,
    pub n_ctx: u32,
    /// The KV cache type of both caches; `None`: the tune's own
    /// ([`PredictSpec::kv_type`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_type: Option<crate::placement::KvType>,
    #[serde(default)]
    pub n_cpu_ffn: u32,
    #[serde(default)]
    pub n_cpu_moe: u32,
}

impl PredictCase {
    /// A whole-layer split at `n_ctx` with the tune's own KV cache type.
    #[must_use]
    pub fn layers(ngl: u32, n_ctx: u32) -> PredictCase {
        PredictCase { ngl, n_ctx, kv_type: None, n_cpu_ffn: 0, n_cpu_moe: 0 }
    }
}

/// What to predict: the tuning settings and the ngl values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictSpec {
    pub model: PathBuf,
    pub ngl: Vec<u32>,
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub flash_attn: crate::placement::FlashAttn,
    /// Offload host tensor operations to the device (llama.cpp's default).
    #[serde(default = "crate::types::yes")]
    pub op_offload: bool,
    /// Also ask llama.cpp's own fit (`common_fit_params`) which ngl it would
    /// choose when this many bytes must stay free on each device.
    #[serde(default)]
    pub fit_margin_bytes: Option<u64>,
    /// The margin the baselines' fit keeps free per device ([`upstream_margin`]).
    #[serde(default = "default_fit_margin")]
    pub upstream_margin_bytes: u64,
    /// More placements to price (answered in `PredictOutput::cases`).
    #[serde(default)]
    pub cases: Vec<PredictCase>,
    /// Splits to price at the spec's context (answered in `PredictOutput::splits`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub splits: Vec<SplitCase>,
    /// RPC servers whose devices join (`--rpc`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpc: Vec<String>,
    /// Also ask what llama.cpp does without flags: its fit with its own
    /// defaults (1 GiB free per device, the context shrunk down to 4096 at most).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default_fit: bool,
    /// Also ask what llama-server's fit does when Ollama starts it with
    /// num_gpu unset (answered in `PredictOutput::ollama_fit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ollama_fit: Option<OllamaFitAsk>,
    /// Per-device margins for llama.cpp's fit, in device order: asks it
    /// for its split (answered in `PredictOutput::llama_fit_split`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fit_split_margins: Vec<u64>,
    /// The tune's own KV cache type, of every case that names none: f16,
    /// `--cache-type`, or the one the consumer's server forces on every model.
    #[serde(default, skip_serializing_if = "crate::types::is_f16")]
    pub kv_type: crate::placement::KvType,
    /// A multimodal projector loaded beside the model (`--mmproj`): priced
    /// once and added to every prediction on the device it loads on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<PathBuf>,
    /// Price every layer list and case with the model's MTP heads on
    /// (`--spec-type draft-mtp`): the MTP blocks loaded, and the MTP
    /// context beside the model's, as common_fit_params's extra model
    /// that shares the model's weights.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mtp: bool,
    /// The outputs the model's context is sized for (llama.cpp's
    /// `n_outputs_max`, `n_outputs_max_per_seq`): with a draft, llama-server
    /// sizes the target's for a verifying batch and the draft's for one
    /// token (`common_speculative_get_output_limits`,
    /// `common_base_params_to_speculative`), where without one it is a
    /// whole batch: the output matrix's compute buffer (vocabulary x
    /// outputs) is most of the difference. `None`: llama.cpp's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<[u32; 2]>,
}

/// One split to price: everything that places it, in one value.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SplitCase {
    /// Layers per offload device, in the order below.
    pub layers: Vec<u32>,
    /// The `--device` order, where it is not llama.cpp's (empty: its order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// `-sm` (llama.cpp's default: layer).
    #[serde(default)]
    pub mode: crate::placement::SplitMode,
    /// The FFN layers kept on the CPU (`-ot`, the first K).
    #[serde(default)]
    pub n_cpu_ffn: u32,
}

/// How Ollama starts llama-server's fit: `-np slots` (not unified), and
/// `LLAMA_ARG_FIT_TARGET` where its environment sets one (else the
/// projector's memory plus 1 GiB, or llama.cpp's 1 GiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OllamaFitAsk {
    pub slots: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_bytes: Option<u64>,
    /// `LLAMA_ARG_FIT=off` in Ollama's environment: llama-server offloads
    /// every layer (`-ngl` auto), priced as such.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub off: bool,
}

/// What a projector adds, as mtmd's dry run reports it: per buffer type,
/// its weights (`model`) and its image encoder's buffers (`compute`),
/// reserved for the largest image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProjectorPrediction {
    pub buffers: Vec<PredictedBuffer>,
    /// Why mtmd could not price it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ProjectorPrediction {
    /// Bytes on accelerator devices.
    #[must_use]
    pub fn device_bytes(&self) -> u64 {
        self.buffers
            .iter()
            .filter(|b| !b.is_host && crate::types::is_device_buffer_type(&b.buffer_type))
            .map(|b| b.model + b.compute)
            .sum()
    }
}

/// What llama.cpp's `--fit` would choose for the same memory margin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaFit {
    pub margin_bytes: u64,
    /// ngl it chose (llama.cpp's -1 means all layers: reported as full offload).
    pub n_gpu_layers: Option<i32>,
    /// The context it left (smaller than asked when it shrank it to fit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_ctx: Option<u32>,
    /// The tensors it moved off the devices (`-ot`): where a device's last
    /// layers only partly fit, and a MoE model's experts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<FitOverride>,
    /// The dry run's device bytes for what it chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_device_bytes: Option<u64>,
    /// Why there is no answer ("could not find allocations that fit", ...).
    pub error: Option<String>,
    /// Whether the projector (`--mmproj`) loads on the GPU: false where
    /// Ollama passes `--no-mmproj-offload` (too little free memory for it).
    #[serde(default = "crate::types::yes", skip_serializing_if = "crate::types::is_true")]
    pub mmproj_offload: bool,
}

impl LlamaFit {
    /// No answer yet, for `margin`.
    #[must_use]
    pub fn none(margin: u64) -> LlamaFit {
        LlamaFit {
            margin_bytes: margin,
            n_gpu_layers: None,
            n_ctx: None,
            overrides: Vec::new(),
            predicted_device_bytes: None,
            error: None,
            mmproj_offload: true,
        }
    }

    /// Its overrides as (pattern, buffer type) pairs.
    #[must_use]
    pub fn override_pairs(&self) -> Vec<(String, String)> {
        self.overrides.iter().map(|o| (o.pattern.clone(), o.buffer_type.clone())).collect()
    }
}

/// All dry-run answers of one `__predict` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictOutput {
    pub predictions: Vec<Prediction>,
    pub llama_fit: Option<LlamaFit>,
    #[serde(default)]
    pub cases: Vec<Prediction>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub splits: Vec<Prediction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llama_fit_split: Option<LlamaFitSplit>,
    /// What llama.cpp does without flags: its fit with its own defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_fit: Option<LlamaFit>,
    /// What llama-server's fit does under Ollama with num_gpu unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ollama_fit: Option<LlamaFit>,
    /// The projector's share, already in every prediction above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<ProjectorPrediction>,
}

/// What llama.cpp's fit chose with a margin per device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaFitSplit {
    pub margins: Vec<u64>,
    pub n_gpu_layers: Option<i32>,
    /// Its `-ts` proportions, one per offload device.
    pub tensor_split: Vec<f32>,
    pub error: Option<String>,
}

/// llama.cpp's defaults for its fit (common.h: `fit_params_target`, `fit_params_min_ctx`).
pub const DEFAULT_FIT_MARGIN: u64 = 1 << 30;
pub const DEFAULT_FIT_MIN_CTX: u32 = 4096;

fn default_fit_margin() -> u64 {
    DEFAULT_FIT_MARGIN
}

/// The rig's stand-in for fit's 1 GiB (MiB): on a rig card of a few
/// hundred MiB, 1 GiB free puts both baselines at ngl 0, where on a real
/// card it is about 4% of 24 GiB; `scripts/rig-gpu` sets it to that share
/// of its card, so the baselines run where they would on one. Unset: 1 GiB.
pub const RIG_FIT_MARGIN_ENV: &str = "NGL_TUNE_RIG_FIT_MARGIN_MIB";

/// The margin llama.cpp's fit keeps free per device for the baselines (the
/// default, and Ollama's run without a fit target): [`DEFAULT_FIT_MARGIN`],
/// or the rig's [`RIG_FIT_MARGIN_ENV`].
#[must_use]
pub fn upstream_margin() -> u64 {
    std::env::var(RIG_FIT_MARGIN_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_FIT_MARGIN, |mib| mib << 20)
}

/// One tensor override llama.cpp's fit set: tensors matching `pattern`
/// go to `buffer_type` (`-ot PATTERN=BUFT`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FitOverride {
    pub pattern: String,
    pub buffer_type: String,
}

mod child;
pub use child::predict_main;

/// Runs the predictions in a child process (the runner's kept trial
/// worker ended first, so the dry run finds the devices as they were).
///
/// # Errors
/// When the child cannot run or answers nonsense.
pub fn predict_in_child(runner: &super::runner::Runner, spec: &PredictSpec) -> Result<PredictOutput> {
    runner.call("__predict", spec)
}

#[cfg(test)]
mod tests;
