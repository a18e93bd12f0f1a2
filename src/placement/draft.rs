//! A draft model for speculative decoding, as llama-server loads one
//! beside the model (common/speculative.cpp's draft-simple): `-md` with
//! `--spec-type draft-simple` (a plain `-md` alone starts no speculation:
//! llama.cpp infers a type only for an MTP or DFlash draft), its layers
//! on the device (`-ngld`; llama.cpp's auto puts every one there and fit
//! never moves them), the most tokens one draft proposes
//! (`--spec-draft-n-max`, 3 by default) and its cache type (`-ctkd`,
//! `-ctvd`: f16 unless given, never the target's `-ctk`). The draft's
//! context is the target's whole `-c`, one sequence a slot.
//!
//! Or the model's own multi-token-prediction heads (`--spec-type
//! draft-mtp`, no `-md`): llama.cpp then loads the NextN blocks it
//! otherwise skips, on the device where `-ngl` puts them (after the
//! output layer, before the trunk), and a second context over them
//! follows the model's whole context at the draft cache type; `-ngld`
//! does not apply (common/speculative.cpp's `common_base_params_to_speculative`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{is_f16, KvType};

/// llama.cpp's `common_params_speculative_draft::n_max`.
pub const DEFAULT_N_MAX: u32 = 3;

/// The speculative type ngl-tune measures and writes for a draft model (`--spec-type`).
pub const SPEC_TYPE: &str = "draft-simple";

/// The one for the model's own MTP heads.
pub const MTP_TYPE: &str = "draft-mtp";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Draft {
    /// The draft model's GGUF file; `None`: the model's own MTP heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// `-ngld`: the draft's layers on the device; `None` is llama.cpp's
    /// auto (every layer, as `-ngld all`). Always `None` for MTP heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_gpu_layers: Option<u32>,
    /// `--spec-draft-n-max`: the most tokens one draft proposes.
    #[serde(default = "default_n_max", skip_serializing_if = "is_default_n_max")]
    pub n_max: u32,
    /// `-ctkd`/`-ctvd`: the draft's KV cache type.
    #[serde(default, skip_serializing_if = "is_f16")]
    pub kv_type: KvType,
}

fn default_n_max() -> u32 {
    DEFAULT_N_MAX
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_default_n_max(n: &u32) -> bool {
    *n == DEFAULT_N_MAX
}

impl Draft {
    /// A draft of `model` with llama.cpp's defaults (every layer on the device, 3 tokens, f16).
    #[must_use]
    pub fn of(model: PathBuf) -> Draft {
        Draft { model: Some(model), n_gpu_layers: None, n_max: DEFAULT_N_MAX, kv_type: KvType::F16 }
    }

    /// The model's own MTP heads, drafting `n_max` tokens.
    #[must_use]
    pub fn mtp(n_max: u32) -> Draft {
        Draft { model: None, n_gpu_layers: None, n_max, kv_type: KvType::F16 }
    }

    #[must_use]
    pub fn is_mtp(&self) -> bool {
        self.model.is_none()
    }

    /// `--spec-type`'s word for it.
    #[must_use]
    pub fn spec_type(&self) -> &'static str {
        if self.is_mtp() {
            MTP_TYPE
        } else {
            SPEC_TYPE
        }
    }

    /// llama.cpp's flags for it, shell-quoted: the model and the type
    /// always, the rest where not llama.cpp's default.
    #[must_use]
    pub fn flags(&self) -> String {
        let mut f = vec![match &self.model {
            Some(m) => format!("-md {} --spec-type {SPEC_TYPE}", super::shell_quote(&m.to_string_lossy())),
            None => format!("--spec-type {MTP_TYPE}"),
        }];
        if let Some(n) = self.n_gpu_layers {
            f.push(format!("-ngld {n}"));
        }
        if self.n_max != DEFAULT_N_MAX {
            f.push(format!("--spec-draft-n-max {}", self.n_max));
        }
        if self.kv_type != KvType::F16 {
            f.push(format!("-ctkd {0} -ctvd {0}", self.kv_type.as_str()));
        }
        f.join(" ")
    }

    /// llama-server's environment for it (common/arg.cpp's names; `-devd` has none).
    #[must_use]
    pub fn server_env(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        if let Some(m) = &self.model {
            v.push(("LLAMA_ARG_SPEC_DRAFT_MODEL", m.to_string_lossy().into_owned()));
        }
        v.push(("LLAMA_ARG_SPEC_TYPE", self.spec_type().to_string()));
        if let Some(n) = self.n_gpu_layers {
            v.push(("LLAMA_ARG_N_GPU_LAYERS_DRAFT", n.to_string()));
        }
        if self.n_max != DEFAULT_N_MAX {
            v.push(("LLAMA_ARG_SPEC_DRAFT_N_MAX", self.n_max.to_string()));
        }
        if self.kv_type != KvType::F16 {
            v.push(("LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K", self.kv_type.as_str().to_string()));
            v.push(("LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V", self.kv_type.as_str().to_string()));
        }
        v
    }

    /// Where its layers run, in words.
    #[must_use]
    pub fn describe(&self) -> String {
        let Some(model) = &self.model else {
            return format!("the model's own MTP heads, up to {} tokens a draft", self.n_max);
        };
        let name = model.file_name().map_or_else(|| model.to_string_lossy(), |n| n.to_string_lossy());
        let layers = match self.n_gpu_layers {
            None => "every layer on the device".to_string(),
            Some(0) => "on the CPU".to_string(),
            Some(n) => format!("{n} layers on the device"),
        };
        format!("draft {name}, {layers}, up to {} tokens a draft", self.n_max)
    }
}
