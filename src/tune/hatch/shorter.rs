//! A shorter context: the largest (a multiple of 256) whose full offload
//! fits, with the workload's own KV cache and with q8_0. Another workload,
//! so predicted by llama.cpp's dry run and reported, never measured or
//! chosen.

use super::{Hatch, HatchInputs, HatchWorld};
use crate::engine::predict::{PredictCase, Prediction};
use crate::placement::KvType;
use crate::profile::{HatchKind, PlacementOption};

/// Contexts are rounded down to a multiple of this.
const CTX_STEP: u32 = 256;

/// The largest context that fits fully, per KV type (only those below the asked one).
#[derive(Debug, Default)]
pub struct ShorterContext {
    found: Vec<(Option<KvType>, u32)>,
}

/// The KV types a shorter context is priced with: the workload's own, q8_0.
const TYPES: [Option<KvType>; 2] = [None, Some(KvType::Q8_0)];

impl Hatch for ShorterContext {
    fn first_cases(&self, h: &HatchInputs) -> Vec<PredictCase> {
        // Full offload at the asked context is priced for every hatch.
        TYPES.iter().flat_map(|kv| [h.at_full(h.n_ctx, *kv, 0), h.at_full(h.n_ctx / 2, *kv, 0)]).collect()
    }

    fn solved_cases(&mut self, h: &HatchInputs, preds: &[Prediction], _fits_fully: bool) -> Vec<PredictCase> {
        let at = |c| super::bytes(super::find(preds, c));
        self.found = TYPES
            .into_iter()
            .filter_map(|kv| {
                let c = largest_ctx(at(h.at_full(h.n_ctx / 2, kv, 0)), at(h.at_full(h.n_ctx, kv, 0)), h.n_ctx, h.cap)?;
                (c < h.n_ctx).then_some((kv, c))
            })
            .collect();
        self.found.iter().map(|(kv, c)| h.at_full(*c, *kv, 0)).collect()
    }

    fn options(&self, w: &HatchWorld<'_>) -> Vec<PlacementOption> {
        let h = w.h;
        self.found
            .iter()
            .map(|(kv, c)| {
                let mut o = w.option(HatchKind::ShorterContext, h.at_full(*c, *kv, 0));
                o.note = format!(
                    "the largest context that fits fully with an {} KV cache; another workload, so predicted by llama.cpp's dry run, not measured",
                    kv.unwrap_or(h.kv).as_str()
                );
                o
            })
            .collect()
    }
}

/// The largest context (multiple of 256, at most `ctx`) whose full offload
/// fits, from full offload priced at `ctx / 2` and `ctx` (KV cache and
/// compute buffers grow linearly with the context).
#[must_use]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn largest_ctx(half: Option<u64>, at: Option<u64>, ctx: u32, cap: f64) -> Option<u32> {
    let (h, a) = (half?, at?);
    #[allow(clippy::cast_precision_loss)]
    if a as f64 <= cap {
        return Some(ctx);
    }
    let c = super::reach(f64::from(ctx / 2), h, f64::from(ctx), a, cap)?;
    let c = (c.max(0.0) as u32 / CTX_STEP) * CTX_STEP;
    (c >= CTX_STEP).then_some(c.min(ctx))
}
