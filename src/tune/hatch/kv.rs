//! A quantized KV cache (q8_0, else q4_0): half or a quarter of an f16
//! cache's bytes per token, so more layers fit, at a cost in quality
//! (measured against f16 before it is chosen). Not where the consumer's
//! server fixes the cache type (the caller does not run the hatches then).

use anyhow::Result;

use super::{Assessor, Hatch, HatchInputs, HatchWorld};
use crate::engine::predict::{PredictCase, Prediction};
use crate::placement::KvType;
use crate::placement::Split;
use crate::profile::{HatchKind, PlacementOption, Recommendation};
use crate::tune::plan::Candidate;
use crate::tune::search::Search;
use crate::tune::split::{self, Labelled, SplitFound, SplitInputs};
use crate::types::{Role, TrialStatus};

/// The KV cache hatch. With one device, each quantized type at the most
/// layers it lets on under the cap (full offload where it fits), wherever
/// that is more than the f16 split's and more than a less lossy type's:
/// the types and the layers are one search, so a q8_0 cache a few layers
/// short of full offload is measured beside a q4_0 cache that fits fully
/// (on a card, each spilled layer is read from system RAM; a lighter cache
/// costs quality and, on some backends, speed). With several devices,
/// q8_0 where it lets more layers onto the faster devices.
#[derive(Debug, Default)]
pub struct KvCache {
    /// The types measured, each with the layers it runs with (lightest loss first).
    picks: Vec<(KvType, u32)>,
    /// Each type that does not fit at full offload, over the whole-layer grid.
    partial: Vec<PredictCase>,
}

/// The quantized types the hatch tries, the least lossy first.
const TYPES: [KvType; 2] = [KvType::Q8_0, KvType::Q4_0];

impl Hatch for KvCache {
    fn first_cases(&self, h: &HatchInputs) -> Vec<PredictCase> {
        TYPES.iter().map(|kv| h.at_full(h.n_ctx, Some(*kv), 0)).collect()
    }

    fn solved_cases(&mut self, h: &HatchInputs, preds: &[Prediction], _fits_fully: bool) -> Vec<PredictCase> {
        // q8_0 at full offload is as many layers as any type gives, at the least loss: nothing else to price.
        if super::under(preds, h.at_full(h.n_ctx, Some(KvType::Q8_0), 0), h.cap) {
            return Vec::new();
        }
        // Each type over the cap at full offload may still let more layers on than f16.
        self.partial = TYPES
            .iter()
            .filter(|kv| !super::under(preds, h.at_full(h.n_ctx, Some(**kv), 0), h.cap))
            .flat_map(|kv| {
                let at = h.at_full(h.n_ctx, Some(*kv), 0);
                h.grid.iter().filter(|n| **n > 0 && **n < h.full).map(move |n| PredictCase { ngl: *n, ..at })
            })
            .collect();
        self.partial.clone()
    }

    fn candidates(
        &mut self,
        h: &HatchInputs,
        layer_split: &Recommendation,
        preds: &mut Vec<Prediction>,
        search: &mut Search<'_>,
    ) -> Vec<Candidate> {
        let mut most = layer_split.placement.n_gpu_layers;
        for kv in TYPES {
            let at = if super::under(preds, h.at_full(h.n_ctx, Some(kv), 0), h.cap) {
                h.full
            } else {
                let grid: Vec<PredictCase> = self.partial.iter().filter(|c| c.kv_type == Some(kv)).copied().collect();
                partial_at(h, &grid, preds, search, most)
            };
            // A lossier type earns a trial only with more layers than every less lossy one.
            if at > most {
                search.predicted.extend(
                    preds.iter().filter(|p| p.case.is_some_and(|c| c.ngl == at && c.kv_type == Some(kv))).cloned(),
                );
                self.picks.push((kv, at));
                most = at;
            }
            if most == h.full {
                break;
            }
        }
        if let Some(at) = same_layers(h, &self.picks, layer_split, preds, search) {
            self.picks.push((KvType::Q8_0, at));
        }
        self.picks.iter().map(|(kv, at)| Candidate { kv: Some(*kv), ..Candidate::layers(*at, h.threads) }).collect()
    }

    fn lossy(&self) -> Vec<KvType> {
        self.picks.iter().map(|p| p.0).collect()
    }

    fn options(&self, w: &HatchWorld<'_>) -> Vec<PlacementOption> {
        let h = w.h;
        let mut v = Vec::new();
        for kv in TYPES {
            let full = h.at_full(h.n_ctx, Some(kv), 0);
            match self.picks.iter().find(|p| p.0 == kv) {
                Some((_, at)) if *at == w.layer_split.placement.n_gpu_layers => {
                    // No more layers than f16: the same split, a smaller cache to read at depth.
                    let mut o = w.option(HatchKind::KvCache, PredictCase { ngl: *at, ..full });
                    if o.note.is_empty() {
                        o.note = format!("at the whole-layer split's {at} layers: half the cache to read at depth");
                    }
                    v.push(o);
                }
                Some((_, at)) if *at < h.full => {
                    // Over the cap at full offload: the most layers this cache lets on.
                    let mut o = w.option(HatchKind::KvCache, PredictCase { ngl: *at, ..full });
                    if o.note.is_empty() {
                        let with = if kv == KvType::Q8_0 { " with q8_0" } else { " even with q4_0" };
                        o.note = format!("full offload is {}", w.over_even(full, with));
                    }
                    v.push(o);
                }
                Some(_) => v.push(w.option(HatchKind::KvCache, full)),
                None if self.picks.iter().any(|(_, at)| *at == h.full) => {} // a less lossy cache already fits fully
                None => {
                    let mut o = w.option(HatchKind::KvCache, full);
                    o.note = w.over(full);
                    v.push(o);
                }
            }
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

/// A q8_0 cache at the whole-layer split's own layers, where no quantized
/// cache lets more on and the workload's cache is f16: the same weights in
/// the same places, half the cache read for each token at depth (the CPU
/// layers' cache is read from system RAM). Docs/truth.md's smol tight cell
/// measured it 13.8% [6.0%, 20.9%] faster than f16 at ngl 2. It is lossy,
/// so it is measured once, checked for quality only where its trial is
/// ahead, and kept only where the pairs find it faster than the lossless
/// answer ([`super::paired_choice`]). `Some(ngl)` where it is priced under
/// the cap.
fn same_layers(
    h: &HatchInputs,
    picks: &[(KvType, u32)],
    layer_split: &Recommendation,
    preds: &mut Vec<Prediction>,
    search: &mut Search<'_>,
) -> Option<u32> {
    if h.kv != KvType::F16 || !picks.is_empty() {
        return None;
    }
    let at = layer_split.placement.n_gpu_layers;
    let case = PredictCase { ngl: at, ..h.at_full(h.n_ctx, Some(KvType::Q8_0), 0) };
    price_once(case, preds, search);
    let fits = super::under(preds, case, h.cap);
    if fits && !search.predicted.iter().any(|q| q.case == Some(case)) {
        search.predicted.extend(super::find(preds, case).cloned());
    }
    fits.then_some(at)
}

/// `case` priced by the dry run into `preds`, where it is not there yet.
fn price_once(case: PredictCase, preds: &mut Vec<Prediction>, search: &mut Search<'_>) {
    if super::find(preds, case).is_none() {
        preds.extend(search.price_cases(&[case]));
    }
}

/// The most layers a quantized cache lets on under the cap (interpolated
/// over its `grid`, then priced exactly, one layer less while over; where
/// that falls below the grid's first offloaded point, priced up from
/// `split` a layer at a time), or 0 when that is not more than `split`.
fn partial_at(
    h: &HatchInputs,
    grid: &[PredictCase],
    preds: &mut Vec<Prediction>,
    search: &mut Search<'_>,
    split: u32,
) -> u32 {
    let priced: Vec<Prediction> = grid.iter().filter_map(|c| super::find(preds, *c).cloned()).collect();
    let mut n = crate::tune::memory::largest_predicted_under(&priced, h.cap, h.full);
    let Some(first) = grid.first().copied() else { return 0 };
    if priced.is_empty() {
        return 0;
    }
    let price = |n: u32, preds: &mut Vec<Prediction>, search: &mut Search<'_>| {
        let case = PredictCase { ngl: n, ..first };
        price_once(case, preds, search);
        super::under(preds, case, h.cap)
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
