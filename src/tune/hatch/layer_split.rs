//! The whole-layer split the search found: the option every hatch is
//! judged against. With several devices the split stage is this hatch.

use super::{Hatch, HatchWorld};
use crate::profile::{HatchKind, PlacementOption};
use crate::types::TrialStatus;

/// The whole-layer split as an option (measured by the search).
#[derive(Debug, Default)]
pub struct LayerSplit;

impl Hatch for LayerSplit {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn options(&self, w: &HatchWorld<'_>) -> Vec<PlacementOption> {
        let r = w.layer_split;
        let t = w.trials.iter().map(|t| &t.result).find(|t| {
            let p = &t.spec.placement;
            t.status == TrialStatus::Ok
                && p.n_gpu_layers == r.placement.n_gpu_layers
                && p.n_threads == r.placement.n_threads
                && p.n_cpu_moe == r.placement.n_cpu_moe
                && p.n_cpu_ffn == 0
                && p.kv_type == r.placement.kv_type
        });
        vec![PlacementOption {
            kind: HatchKind::LayerSplit,
            placement: r.runs(),
            measured: r.measured,
            tg_ts: r.tg_ts,
            pp_ts: r.pp_ts,
            tg_se_ts: t.and_then(|t| t.test(false)).and_then(super::standard_error),
            pp_se_ts: t.and_then(|t| t.test(true)).and_then(super::standard_error),
            device_bytes: r.mem_bytes.map(|m| m as u64),
            fits: true,
            quality: None,
            recommended: false,
            note: String::new(),
        }]
    }
}
