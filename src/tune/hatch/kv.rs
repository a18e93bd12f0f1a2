//! A quantized KV cache (q8_0, else q4_0): half or a quarter of an f16
//! cache's bytes per token, so more layers fit, at a cost in quality
//! (measured against f16 before it is chosen). Not where the consumer's
//! server fixes the cache type (the caller does not run the hatches then).

use anyhow::Result;

use super::{Assessor, Hatch, HatchInputs, World};
use crate::engine::predict::{PredictCase, Prediction};
use crate::profile::{HatchKind, PlacementOption, Recommendation};
use crate::tune::plan::{Candidate, Split};
use crate::tune::search::Search;
use crate::tune::split::{self, Labelled, SplitFound, SplitInputs};
use crate::types::{KvType, Role, TrialStatus};

/// The KV cache hatch: with one device, the lightest type whose full
/// offload fits, else q8_0 at the most layers it lets on; with several,
/// q8_0 where it lets more layers onto the faster devices.
#[derive(Debug, Default)]
pub struct KvCache {
    /// The type measured (`None`: none fits, and q8_0 lets no more layers on).
    pick: Option<KvType>,
    /// The layers it runs with: full offload, or fewer with q8_0.
    at: u32,
    /// A q8_0 cache over the whole-layer grid (only when none fits at full offload).
    partial: Vec<PredictCase>,
}

impl Hatch for KvCache {
    fn first_cases(&self, h: &HatchInputs) -> Vec<PredictCase> {
        vec![h.at_full(h.n_ctx, Some(KvType::Q8_0), 0), h.at_full(h.n_ctx, Some(KvType::Q4_0), 0)]
    }

    fn solved_cases(&mut self, h: &HatchInputs, preds: &[Prediction], _fits_fully: bool) -> Vec<PredictCase> {
        // No quantized cache fits at full offload: a q8_0 cache may still let more layers on.
        let kv_fits =
            [KvType::Q8_0, KvType::Q4_0].iter().any(|kv| super::under(preds, h.at_full(h.n_ctx, Some(*kv), 0), h.cap));
        if !kv_fits {
            let q8 = h.at_full(h.n_ctx, Some(KvType::Q8_0), 0);
            self.partial =
                h.grid.iter().filter(|n| **n > 0 && **n < h.full).map(|n| PredictCase { ngl: *n, ..q8 }).collect();
        }
        self.partial.clone()
    }

    fn candidates(
        &mut self,
        h: &HatchInputs,
        layer_split: &Recommendation,
        preds: &mut Vec<Prediction>,
        search: &mut Search<'_>,
    ) -> Vec<Candidate> {
        // One KV type: the lightest that is needed.
        let pick = if super::under(preds, h.at_full(h.n_ctx, Some(KvType::Q8_0), 0), h.cap) {
            Some(KvType::Q8_0)
        } else {
            super::under(preds, h.at_full(h.n_ctx, Some(KvType::Q4_0), 0), h.cap).then_some(KvType::Q4_0)
        };
        // Or: the most layers a q8_0 cache lets on, when that is more than the layer split's.
        self.at = match pick {
            Some(_) => h.full,
            None => partial_q8(h, &self.partial, preds, search, layer_split.placement.n_gpu_layers),
        };
        let at = self.at;
        search.predicted.extend(preds.iter().filter(|p| p.case.is_some_and(|c| c.ngl == at && at < h.full)).cloned());
        self.pick = pick.or((at > 0).then_some(KvType::Q8_0));
        self.pick.map(|kv| Candidate { kv: Some(kv), ..Candidate::layers(at, h.threads) }).into_iter().collect()
    }

    fn lossy(&self) -> Option<KvType> {
        self.pick
    }

    fn options(&self, w: &World<'_>) -> Vec<PlacementOption> {
        let h = w.h;
        let (pick, at) = (self.pick, self.at);
        let mut v = Vec::new();
        if pick.is_some() && at < h.full {
            // Over the cap at full offload with either type; the q8_0 cache at the most layers it lets on.
            let q8 = h.at_full(h.n_ctx, Some(KvType::Q8_0), 0);
            let mut o = w.option(HatchKind::KvCache, PredictCase { ngl: at, ..q8 });
            if o.note.is_empty() {
                let q4 = h.at_full(h.n_ctx, Some(KvType::Q4_0), 0);
                o.note = format!("full offload is {}", w.over_even(q4, " even with q4_0"));
            }
            v.push(o);
        }
        for kv in [KvType::Q8_0, KvType::Q4_0].into_iter().filter(|_| at == h.full || pick.is_none()) {
            let mut o = w.option(HatchKind::KvCache, h.at_full(h.n_ctx, Some(kv), 0));
            if Some(kv) != pick {
                if kv == KvType::Q4_0 && pick == Some(KvType::Q8_0) {
                    continue; // q8_0 is enough: q4_0 would only cost quality
                }
                o.note = w.over(h.at_full(h.n_ctx, Some(kv), 0));
            }
            v.push(o);
        }
        v
    }

    /// With several devices: a q8_0 KV cache (half an f16 cache's bytes
    /// per token) where it lets more layers onto the faster devices. Each
    /// device's capacity is priced again with that cache (two dry runs),
    /// the fastest split by each device's speed under those capacities is
    /// priced exactly and, where it differs from every split measured and
    /// is predicted faster than the recommendation, measured once, and the
    /// cache's quality against f16 measured (`assess`, as for one device:
    /// it does not depend on where the layers run). It is recommended only
    /// where its quality passes the gate and it is faster than the best
    /// lossless split by [`split::LOSSY_MARGIN`].
    fn across_devices(
        &mut self,
        search: &mut Search<'_>,
        inp: &SplitInputs<'_>,
        found: &mut SplitFound,
        assess: &mut Assessor<'_>,
    ) -> Result<()> {
        let s = search.settings();
        let (Some(m), Some(best)) = (found.speed.clone(), found.best.map(|i| found.options[i].clone())) else {
            return Ok(());
        };
        if s.workload.kv_type.is_quantized() {
            return Ok(());
        }
        let (devs, full) = (inp.devs, inp.full);
        let q8 = KvType::Q8_0;
        let price = |search: &mut Search<'_>, x: &[Split]| search.price_splits(x, q8, 0);
        let Ok((cost, full_cap, partial_cap)) = split::capacities(&mut |x: &[Split]| price(search, x), devs, full)
        else {
            return Ok(());
        };
        let best_score = s.scoring().speeds(best.tg_ts, best.pp_ts).unwrap_or(0.0);
        let todo: Vec<Labelled> = split::speed_candidates(&m, s, full, &full_cap, &partial_cap)
            .into_iter()
            .filter(|(_, x)| !found.options.iter().any(|o| o.measured && split::split_of(o).layers() == x.layers()))
            .filter(|(_, x)| split::predicted_score(&m, s.scoring(), x) > best_score)
            .map(|(_, x)| ("q8_0 KV cache: more layers on the faster devices".to_string(), x))
            .collect();
        let priced = split::price_all(todo, &mut |x: &[Split]| price(search, x), devs, &cost);
        let Some((label, split, p)) = priced.into_iter().next() else {
            return Ok(());
        };
        let ngl: u32 = split.layers().iter().sum();
        let c = Candidate { split, kv: Some(q8), ..Candidate::layers(ngl, inp.threads) };
        let race = search.race();
        let t = search.measure(Role::Hatch, c, Some(race))?.clone();
        // The check reads the text twice (minutes on a slow host): only for a cache that measured faster.
        let faster = s.scoring().trial(&t.result).is_some_and(|v| v > best_score);
        let quality = if t.result.status == TrialStatus::Ok && faster { assess(q8)? } else { None };
        let mut o = split::option_of(&label, &split, split::per_device(&p, devs), Some(&t), s, inp);
        o.quality = quality;
        let (tg, pp) = m.predict(&split);
        (o.predicted_tg_ts, o.predicted_pp_ts) = (Some(tg), pp);
        found.options.push(o);
        split::choose_again(found, s);
        Ok(())
    }
}

/// The most layers a q8_0 cache lets on under the cap (interpolated over the
/// grid, then priced exactly, one layer less while over; where that falls
/// below the grid's first offloaded point, priced up from the split a layer
/// at a time), or 0 when that is not more than `split` (the f16 layer split's).
fn partial_q8(
    h: &HatchInputs,
    partial: &[PredictCase],
    preds: &mut Vec<Prediction>,
    search: &mut Search<'_>,
    split: u32,
) -> u32 {
    let q8: Vec<Prediction> = partial.iter().filter_map(|c| super::find(preds, *c).cloned()).collect();
    let mut n = crate::tune::memory::largest_predicted_under(&q8, h.cap, h.full);
    if q8.is_empty() {
        return 0;
    }
    let price = |n: u32, preds: &mut Vec<Prediction>, search: &mut Search<'_>| {
        let case = partial.first().map(|c| PredictCase { ngl: n, ..*c }).expect("q8 is not empty");
        let priced = search.price_cases(&[case]);
        #[allow(clippy::cast_precision_loss)]
        let fits = super::bytes(priced.first()).is_some_and(|b| b as f64 <= h.cap);
        preds.extend(priced);
        fits
    };
    if n <= split {
        // The grid's first offloaded point is already over: a layer or two past the split may fit.
        let top = (split + crate::tune::memory::MAX_PRICE_STEPS).min(h.full.saturating_sub(1));
        return (split + 1..=top).take_while(|m| price(*m, preds, search)).last().unwrap_or(0);
    }
    while n > split {
        if price(n, preds, search) {
            return n;
        }
        n -= 1;
    }
    0
}
