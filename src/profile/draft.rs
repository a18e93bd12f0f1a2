//! Speculative decoding in a profile: what `tune --draft` tried beside the
//! answer (the draft on the CPU, on the device, and where the cap binds
//! the target's layers given up for it), what each measured against the
//! answer without a draft, and which became the answer. Or, for a model
//! with MTP heads, the same for drafting with them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::placement::Placement;

/// One draft placement: the answer's target with the draft somewhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftOption {
    /// In words ("the draft on the CPU", "every draft layer on the device").
    pub label: String,
    /// The target and the draft as llama-server would load them (the draft among it).
    pub placement: Placement,
    /// On the devices by llama.cpp's dry run: the target's and the draft's contexts together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_device_bytes: Option<u64>,
    /// In host memory by the dry run: both together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_host_bytes: Option<u64>,
    /// Under the device cap by that price.
    pub fits: bool,
    /// Measured: the loads that ran it, and the most both contexts held
    /// on the devices by llama.cpp's accounting.
    #[serde(default, skip_serializing_if = "crate::types::is_zero")]
    pub loads: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_bytes: Option<u64>,
    /// Generation with the draft (t/s, greedy, at the tune's depth), and
    /// the answer's without it in the same pairs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tg_ts: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plain_tg_ts: Option<f64>,
    /// With the draft over the answer without: geometric mean of the
    /// pairs' ratios and its 95% t interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<[f64; 3]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<super::Verdict>,
    /// The share of drafted tokens the target accepted, and tokens a verifying batch yields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_verify: Option<f64>,
    pub chosen: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

impl DraftOption {
    /// `placement` named `label`, neither priced nor measured yet.
    #[must_use]
    pub fn unmeasured(label: String, placement: Placement) -> DraftOption {
        DraftOption {
            label,
            placement,
            predicted_device_bytes: None,
            predicted_host_bytes: None,
            fits: false,
            loads: 0,
            device_bytes: None,
            tg_ts: None,
            plain_tg_ts: None,
            ratio: None,
            verdict: None,
            acceptance: None,
            tokens_per_verify: None,
            chosen: false,
            note: String::new(),
        }
    }
}

/// The draft stage at one context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftReport {
    /// The draft model's file (the model's own where `mtp`).
    pub draft: PathBuf,
    /// The model's own MTP heads (`--spec-type draft-mtp`), not a draft model.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mtp: bool,
    /// The tokens generated a repetition, at this depth.
    pub n_gen: u32,
    pub n_depth: u32,
    pub options: Vec<DraftOption>,
    /// Whether speculation pays here, in words.
    pub summary: String,
}

impl DraftReport {
    /// The option that became the answer.
    #[must_use]
    pub fn chosen(&self) -> Option<&DraftOption> {
        self.options.iter().find(|o| o.chosen)
    }

    /// None of the options is the answer after all, and `why` says so.
    pub fn unchoose(&mut self, why: String) {
        for o in &mut self.options {
            o.chosen = false;
        }
        self.summary = why;
    }
}
