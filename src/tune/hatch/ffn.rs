//! The dense FFN weights of K layers on the CPU (`-ot`), the rest of each
//! layer on the device: lossless, slower per spilled layer than a whole
//! layer kept on the device, faster than that layer on the CPU. Only for a
//! dense model (a MoE model's experts are the spill, `--n-cpu-moe`,
//! searched with the layers).

use anyhow::Result;

use super::{Assessor, Hatch, HatchInputs, HatchWorld};
use crate::engine::predict::{PredictCase, Prediction};
use crate::placement::Split;
use crate::profile::{HatchKind, PlacementOption, Recommendation};
use crate::tune::plan::Candidate;
use crate::tune::search::Search;
use crate::tune::speed::SpeedModel;
use crate::tune::split::{self, SplitFound, SplitInputs};
use crate::types::Role;

/// How many layers' dense FFN weights must go to the CPU for full offload to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum FfnNeed {
    /// Full offload fits, or the model is MoE (its experts are the spill): nothing to spill.
    #[default]
    None,
    /// Not even every layer's FFN on the CPU is enough.
    Beyond,
    /// About this many layers (the line through K = 1 and K = n_layer).
    Layers(u32),
}

/// The FFN spill hatch: with one device, the fewest K whose full offload
/// fits and its neighbour, measured; with several, the fastest device
/// alone with every layer, its first K layers' FFN on the CPU.
#[derive(Debug, Default)]
pub struct FfnSpill {
    need: FfnNeed,
    /// K from one below the solved value to three above (priced exactly).
    priced: Vec<u32>,
    /// The fewest priced K that fits, and its neighbour (measured where under the cap).
    chosen: Vec<u32>,
}

impl Hatch for FfnSpill {
    fn first_cases(&self, h: &HatchInputs) -> Vec<PredictCase> {
        if h.is_moe || h.n_layer == 0 {
            return Vec::new();
        }
        vec![h.at_full(h.n_ctx, None, 1), h.at_full(h.n_ctx, None, h.n_layer)]
    }

    fn solved_cases(&mut self, h: &HatchInputs, preds: &[Prediction], fits_fully: bool) -> Vec<PredictCase> {
        let at = |c| super::bytes(super::find(preds, c));
        self.need = if fits_fully || h.is_moe {
            FfnNeed::None
        } else {
            let one = at(h.at_full(h.n_ctx, None, 1));
            ffn_layers_needed(one, at(h.at_full(h.n_ctx, None, h.n_layer)), h.n_layer, h.cap)
                .map_or(FfnNeed::Beyond, FfnNeed::Layers)
        };
        self.priced = match self.need {
            FfnNeed::Layers(k) => (k.saturating_sub(1).max(1)..=(k + 3).min(h.n_layer)).collect(),
            FfnNeed::None | FfnNeed::Beyond => Vec::new(),
        };
        self.priced.iter().map(|k| h.at_full(h.n_ctx, None, *k)).collect()
    }

    fn candidates(
        &mut self,
        h: &HatchInputs,
        _layer_split: &Recommendation,
        preds: &mut Vec<Prediction>,
        _search: &mut Search<'_>,
    ) -> Vec<Candidate> {
        // The line through K = 1 and K = n_layer is close, not exact (compute
        // buffers move too): the fewest priced K that fits, and its neighbour.
        let fits = |k: u32| super::under(preds, h.at_full(h.n_ctx, None, k), h.cap);
        self.chosen = match self.priced.iter().position(|k| fits(*k)) {
            Some(i) => self.priced[i..].iter().take(2).copied().collect(),
            None => self.priced.last().copied().into_iter().collect(),
        };
        let base = Candidate::layers(h.full, h.threads);
        self.chosen.iter().filter(|k| fits(**k)).map(|k| Candidate { n_cpu_ffn: *k, ..base }).collect()
    }

    fn options(&self, w: &HatchWorld<'_>) -> Vec<PlacementOption> {
        let h = w.h;
        let full = |k| h.at_full(h.n_ctx, None, k);
        match self.need {
            // Full offload fits, or MoE: the MoE search keeps the experts on the CPU.
            FfnNeed::None => Vec::new(),
            FfnNeed::Beyond => {
                let mut o = w.option(HatchKind::FfnSpill, full(h.n_layer));
                o.note = w.over_even(full(h.n_layer), " even with every layer's FFN weights on the CPU");
                vec![o]
            }
            FfnNeed::Layers(_) => self.chosen.iter().map(|k| w.option(HatchKind::FfnSpill, full(*k))).collect(),
        }
    }

    /// With several devices: the fastest device alone with every layer,
    /// the dense FFN weights of its first K layers on the CPU, where the
    /// answer leaves it layers short. K is the fewest that fit its cap,
    /// solved from two dry runs (K = 1 and every layer) and priced exactly
    /// (one more while over, three times at most). The split is measured
    /// once where each device's speed predicts it faster than the
    /// recommendation (a spilled layer gives the CPU back its FFN's share
    /// of the layer and crosses to it and back), or where the costs cannot
    /// predict it (absolute, without a trial on the CPU); it is lossless
    /// and chosen with the rest. Only where every layer may be offloaded
    /// (the spilled layers are the first ones) and the model is dense.
    fn across_devices(
        &mut self,
        search: &mut Search<'_>,
        inp: &SplitInputs<'_>,
        found: &mut SplitFound,
        _assess: &mut Assessor<'_>,
    ) -> Result<()> {
        let s = search.settings();
        let (Some(m), Some(best)) = (found.speed.clone(), found.best.map(|i| found.options[i].clone())) else {
            return Ok(());
        };
        let (devs, full, n_layer) = (inp.devs, inp.full, inp.full.saturating_sub(1));
        let Some(d) = m.fastest(s.scoring()) else { return Ok(()) };
        let eligible = split::eligible(&s.policy, full, full);
        if inp.is_moe || n_layer < 2 || !eligible || best.tensor_split.get(d).is_some_and(|l| *l >= full) {
            return Ok(());
        }
        let mut layers = vec![0; devs.len()];
        layers[d] = full;
        let alone = Split::new(&layers);
        let (kv, cap) = (s.workload.kv_type, devs[d].cap_bytes);
        let mut at = |k: u32| search.price_splits(&[alone], kv, k).into_iter().next().filter(|p| p.error.is_none());
        let (Some(one), Some(all)) = (at(1), at(n_layer)) else { return Ok(()) };
        let on_device = |p: &Prediction| split::per_device(p, devs)[d];
        let dev = &devs[d].device;
        if on_device(&all) > cap {
            found.notes.push(crate::types::Note::split(format!(
                "FFN spill across devices not tried: {dev} does not hold every layer even with every FFN on the CPU"
            )));
            return Ok(());
        }
        let weights = |p: &Prediction| split::parts(p, devs)[d].0;
        #[allow(clippy::cast_precision_loss)]
        let ffn = weights(&one).saturating_sub(weights(&all)) as f64 / f64::from(n_layer - 1);
        if ffn <= 0.0 {
            return Ok(());
        }
        #[allow(clippy::cast_precision_loss)]
        let over = on_device(&one).saturating_sub(cap) as f64;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let mut k = (1 + (over / ffn).ceil() as u32).min(n_layer);
        let mut priced = (all, n_layer);
        for _ in 0..3 {
            match at(k) {
                Some(p) if on_device(&p) <= cap => {
                    priced = (p, k);
                    break;
                }
                _ if k < n_layer => k += 1,
                _ => break,
            }
        }
        let (p, k) = priced;
        let share = (ffn / inp.layer_bytes.max(1.0)).clamp(0.0, 1.0);
        let predicted = cpu_layer_ms(search, &m, inp).map(|cpu| m.predict_spilled(&alone, (d, k, share), cpu));
        let score = |tg: Option<f64>, pp| s.scoring().speeds(tg, pp);
        let best_score = score(best.tg_ts, best.pp_ts).unwrap_or(0.0);
        if let Some((tg, pp)) = predicted.filter(|(tg, pp)| score(Some(*tg), *pp).unwrap_or(0.0) <= best_score) {
            let pp = pp.map_or(String::new(), |v| format!(", pp {v:.2}"));
            found.notes.push(crate::types::Note::split(format!(
                "FFN spill across devices not measured: {dev} alone with the FFN of {k} layers on the CPU is predicted slower (tg {tg:.2}{pp} t/s) than the recommendation"
            )));
            return Ok(());
        }
        search.predicted.push(p.clone());
        let c = Candidate { split: alone, n_cpu_ffn: k, ..Candidate::layers(full, inp.threads) };
        let race = search.race();
        let t = search.measure(Role::Hatch, c, Some(race))?.clone();
        let label = format!("FFN spill: {dev} alone, the FFN of its first {k} layers on the CPU");
        let mut o = split::option_of(&label, &alone, split::per_device(&p, devs), Some(&t), s, inp);
        (o.predicted_tg_ts, o.predicted_pp_ts) = predicted.map_or((None, None), |(tg, pp)| (Some(tg), pp));
        found.options.push(o);
        split::choose_again(found, s);
        Ok(())
    }
}

/// The CPU's own time per layer (tg, pp in ms) for a spill's prediction:
/// 0 where the costs are relative to the CPU, else from the search's
/// trial with every layer on the CPU (its time over the layers and the
/// output's work); `None` without one.
fn cpu_layer_ms(search: &Search<'_>, m: &SpeedModel, inp: &SplitInputs<'_>) -> Option<(f64, f64)> {
    if m.cpu_tg_ms > 0.0 {
        return Some((0.0, 0.0));
    }
    let t = split::all_cpu(&search.trials, inp.threads)?;
    let work = f64::from(inp.full.saturating_sub(1)) + inp.output_layers;
    let per = |ts: Option<f64>| ts.filter(|v| *v > 0.0).map_or(0.0, |v| 1000.0 / v / work);
    let (tg, pp) = split::rates(t);
    tg.is_some().then(|| (per(tg), per(pp)))
}

/// The fewest layers whose FFN weights must stay on the CPU for full
/// offload to fit, from K = 1 and K = n_layer priced (each layer's FFN
/// weights weigh the same); `None` when even all of them are not enough.
#[must_use]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
pub fn ffn_layers_needed(one: Option<u64>, all: Option<u64>, n_layer: u32, cap: f64) -> Option<u32> {
    let (o, a) = (one?, all?);
    if a as f64 > cap {
        return None;
    }
    if o as f64 <= cap || n_layer <= 1 {
        return Some(1);
    }
    let k = super::reach(1.0, o, f64::from(n_layer), a, cap)?;
    Some((k.ceil().max(1.0) as u32).min(n_layer))
}
