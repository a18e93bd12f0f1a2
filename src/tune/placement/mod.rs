//! Beyond the whole-layer split: the escape hatches of the guide our users
//! read, in its order. When full offload at the requested context does not
//! fit (or the KV cache is a large share of the cap), llama.cpp's dry run
//! prices a quantized KV cache, shorter contexts and the dense FFN weights
//! of K layers kept on the CPU; what can fit and win is measured (raced
//! against the best so far), the rest is reported as predicted with the
//! reason, and the best measured option under the cap (and under the
//! quality limit) is recommended.

use anyhow::Result;

use super::plan::Candidate;
use super::search::Search;
use crate::engine::predict::{PredictCase, Prediction};
use crate::model::human_bytes;
use crate::profile::{HatchKind, PlacementOption, ProfileTrial, Recommendation, Settings};
use crate::types::Quality;
use crate::types::{KvType, Role, TrialStatus};

/// The KV cache is worth shrinking when it takes at least this share of the cap.
pub const KV_SHARE: f64 = 0.25;

/// Contexts are rounded down to a multiple of this.
const CTX_STEP: u32 = 256;

/// What the hatches need to know about the model and the cap.
#[derive(Debug, Clone)]
pub struct HatchInputs {
    pub full: u32,
    pub n_layer: u32,
    pub is_moe: bool,
    pub cap: f64,
    pub n_ctx: u32,
    /// The workload's own KV cache type: what a case that names none runs.
    pub kv: KvType,
    pub threads: u32,
    pub op_offload: bool,
    /// RPC servers whose devices the placements use (`--rpc` in their flags when layers are offloaded).
    pub rpc: Vec<String>,
    /// The whole-layer grid (where a quantized KV cache is priced when it
    /// does not fit at full offload).
    pub grid: Vec<u32>,
}

impl HatchInputs {
    /// Full offload at `n_ctx`, with KV cache type `kv` (`None`: the
    /// workload's own) and the dense FFN weights of the first `n_cpu_ffn`
    /// layers on the CPU: the placements the hatches price.
    #[must_use]
    pub fn at_full(&self, n_ctx: u32, kv: Option<KvType>, n_cpu_ffn: u32) -> PredictCase {
        PredictCase { ngl: self.full, n_ctx, kv_type: kv, n_cpu_ffn, n_cpu_moe: 0 }
    }

    /// What llama.cpp runs for a priced case (the servers only when layers are offloaded).
    #[must_use]
    pub fn placement(&self, case: PredictCase) -> crate::types::Placement {
        let rpc = if case.ngl > 0 { self.rpc.as_slice() } else { &[] };
        crate::types::Placement { n_cpu_ffn: case.n_cpu_ffn, ..crate::types::Placement::default() }
            .with_layers(case.ngl, self.threads, Some(case.n_ctx))
            .with_kv(case.kv_type.unwrap_or(self.kv))
            .with_op_offload(self.op_offload)
            .with_split(&[], rpc)
    }
}

/// What the hatch stage found at one context.
#[derive(Debug, Clone, Default)]
pub struct Hatches {
    pub fits_fully: bool,
    pub kv_bytes: Option<u64>,
    pub options: Vec<PlacementOption>,
    pub notes: Vec<crate::types::Note>,
}

/// Measures the quality of a KV cache type against f16.
pub type Assessor<'a> = dyn FnMut(KvType) -> Result<Option<Quality>> + 'a;

fn bytes(p: Option<&Prediction>) -> Option<u64> {
    p.filter(|p| p.error.is_none()).map(|p| p.device_bytes)
}

/// The device KV cache (the context buffers) of a prediction.
fn kv_of(p: Option<&Prediction>) -> Option<u64> {
    let p = p.filter(|p| p.error.is_none())?;
    Some(
        p.buffers
            .iter()
            .filter(|b| !b.is_host && crate::types::is_device_buffer_type(&b.buffer_type))
            .map(|b| b.context)
            .sum(),
    )
}

/// Where a line through (x0, y0) and (x1, y1) reaches `cap`.
#[allow(clippy::cast_precision_loss)]
fn reach(x0: f64, y0: u64, x1: f64, y1: u64, cap: f64) -> Option<f64> {
    let slope = (y1 as f64 - y0 as f64) / (x1 - x0);
    (slope.abs() > f64::EPSILON).then(|| x0 + (cap - y0 as f64) / slope)
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
    let c = reach(f64::from(ctx / 2), h, f64::from(ctx), a, cap)?;
    let c = (c.max(0.0) as u32 / CTX_STEP) * CTX_STEP;
    (c >= CTX_STEP).then_some(c.min(ctx))
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
    let k = reach(1.0, o, f64::from(n_layer), a, cap)?;
    Some((k.ceil().max(1.0) as u32).min(n_layer))
}

/// The placements the dry run prices first.
fn first_cases(h: &HatchInputs) -> Vec<PredictCase> {
    let mut v = vec![
        h.at_full(h.n_ctx, None, 0),
        h.at_full(h.n_ctx, Some(KvType::Q8_0), 0),
        h.at_full(h.n_ctx, Some(KvType::Q4_0), 0),
        h.at_full(h.n_ctx / 2, None, 0),
        h.at_full(h.n_ctx / 2, Some(KvType::Q8_0), 0),
    ];
    if !h.is_moe && h.n_layer > 0 {
        v.push(h.at_full(h.n_ctx, None, 1));
        v.push(h.at_full(h.n_ctx, None, h.n_layer));
    }
    v
}

/// Priced under the cap.
#[allow(clippy::cast_precision_loss)]
fn under(preds: &[Prediction], c: PredictCase, cap: f64) -> bool {
    bytes(find(preds, c)).is_some_and(|b| b as f64 <= cap)
}

fn find(preds: &[Prediction], c: PredictCase) -> Option<&Prediction> {
    preds.iter().find(|p| p.case == Some(c))
}

/// Runs the hatch stage at the search's context after the whole-layer
/// search. Measured trials join the search's (role `hatch`).
///
/// # Errors
/// What the executor returns (an interrupt keeps the finished trials).
pub fn escape_hatches(
    search: &mut Search<'_>,
    h: &HatchInputs,
    assess: &mut Assessor<'_>,
    layer_split: &Recommendation,
) -> Result<Hatches> {
    let mut preds = search.price_cases(&first_cases(h));
    let own = find(&preds, h.at_full(h.n_ctx, None, 0));
    let Some(own_bytes) = bytes(own) else {
        let why = own.and_then(|p| p.error.clone()).unwrap_or_else(|| "no answer".into());
        return Ok(Hatches {
            notes: vec![crate::types::Note::hatch(format!("escape hatches not priced: {why}"))],
            ..Hatches::default()
        });
    };
    #[allow(clippy::cast_precision_loss)]
    let fits_fully = own_bytes as f64 <= h.cap;
    let kv_bytes = kv_of(own);
    #[allow(clippy::cast_precision_loss)]
    let kv_large = kv_bytes.is_some_and(|k| k as f64 >= KV_SHARE * h.cap);
    if fits_fully && !kv_large {
        return Ok(Hatches { fits_fully, kv_bytes, ..Hatches::default() });
    }
    let second = second_round(h, &preds, fits_fully);
    preds.extend(search.price_cases(&second.cases));
    search.predicted.extend(preds.iter().cloned());
    let Second { shorter, k, spills: priced, partial, .. } = second;
    // The line through K = 1 and K = n_layer is close, not exact (compute
    // buffers move too): the fewest priced K that fits, and its neighbour.
    let spills: Vec<u32> = match priced.iter().position(|k| under(&preds, h.at_full(h.n_ctx, None, *k), h.cap)) {
        Some(i) => priced[i..].iter().take(2).copied().collect(),
        None => priced.last().copied().into_iter().collect(),
    };

    // Measure what can fit and win: one KV type (the lightest that is
    // needed), the FFN spills that fit.
    let kv_pick = if under(&preds, h.at_full(h.n_ctx, Some(KvType::Q8_0), 0), h.cap) {
        Some(KvType::Q8_0)
    } else {
        under(&preds, h.at_full(h.n_ctx, Some(KvType::Q4_0), 0), h.cap).then_some(KvType::Q4_0)
    };
    // Or: the most layers a q8_0 cache lets on, when that is more than the layer split's.
    let kv_at = match kv_pick {
        Some(_) => h.full,
        None => partial_q8(h, &partial, &mut preds, search, layer_split.n_gpu_layers),
    };
    search.predicted.extend(preds.iter().filter(|p| p.case.is_some_and(|c| c.ngl == kv_at && kv_at < h.full)).cloned());
    let kv_pick = kv_pick.or((kv_at > 0).then_some(KvType::Q8_0));
    let base = Candidate::layers(h.full, h.threads);
    let mut to_measure: Vec<Candidate> =
        kv_pick.map(|kv| Candidate { kv: Some(kv), ..Candidate::layers(kv_at, h.threads) }).into_iter().collect();
    to_measure.extend(
        spills
            .iter()
            .filter(|k| under(&preds, h.at_full(h.n_ctx, None, **k), h.cap))
            .map(|k| Candidate { n_cpu_ffn: *k, ..base }),
    );
    search.progress.plan(to_measure.len() as u64);
    for c in to_measure {
        if !search.trials.iter().any(|t| t.role == Role::Hatch && c.is(&t.result.spec)) {
            let race = search.race();
            search.measure(Role::Hatch, c, Some(race))?;
        }
    }
    // The quality check reads the text twice (minutes on a slow host): only
    // where the quantized cache would be chosen if it passed.
    let could_win = kv_pick.is_some_and(|kv| {
        let what_if = World { h, preds: &preds, trials: &search.trials, quality: Some((kv, Quality::passing())) };
        let mut options = what_if.options((kv_pick, kv_at), &shorter, k, &spills, layer_split);
        choose(&mut options, search.settings());
        options.iter().any(|o| o.recommended && lossy(o))
    });
    let quality = match kv_pick {
        Some(kv) if could_win => assess(kv)?.map(|q| (kv, q)),
        _ => None,
    };
    let world = World { h, preds: &preds, trials: &search.trials, quality };
    let mut options = world.options((kv_pick, kv_at), &shorter, k, &spills, layer_split);
    let notes = choose(&mut options, search.settings());
    if kv_pick.is_some() && !could_win {
        unchecked(&mut options, search.settings());
    }
    Ok(Hatches { fits_fully, kv_bytes, options, notes })
}

/// The note of a measured quantized cache whose quality was not checked
/// because it would not be chosen even if it passed: what it measured
/// against the recommendation, and why no check ran.
fn unchecked(options: &mut [PlacementOption], s: &Settings) {
    let best = options.iter().find(|o| o.recommended).and_then(|o| score_with_noise(o, s)).map(|x| x.0);
    for o in options.iter_mut().filter(|o| lossy(o) && o.measured && o.quality.is_none()) {
        let cmp = match (score_with_noise(o, s), best) {
            (Some((v, _)), Some(b)) if b > 0.0 => {
                format!("{:+.0}% {} against the recommendation; ", (v / b - 1.0) * 100.0, s.objective.as_str())
            }
            _ => String::new(),
        };
        o.note = format!("{cmp}quality not checked: not faster than the lossless options beyond the noise, so it could not be chosen");
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
    let q8: Vec<Prediction> = partial.iter().filter_map(|c| find(preds, *c).cloned()).collect();
    let mut n = super::memory::largest_predicted_under(&q8, h.cap, h.full);
    if q8.is_empty() {
        return 0;
    }
    let price = |n: u32, preds: &mut Vec<Prediction>, search: &mut Search<'_>| {
        let case = partial.first().map(|c| PredictCase { ngl: n, ..*c }).expect("q8 is not empty");
        let priced = search.price_cases(&[case]);
        #[allow(clippy::cast_precision_loss)]
        let fits = bytes(priced.first()).is_some_and(|b| b as f64 <= h.cap);
        preds.extend(priced);
        fits
    };
    if n <= split {
        // The grid's first offloaded point is already over: a layer or two past the split may fit.
        let top = (split + super::memory::MAX_PRICE_STEPS).min(h.full.saturating_sub(1));
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

/// How many layers' dense FFN weights must go to the CPU for full offload to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FfnNeed {
    /// Full offload fits, or the model is MoE (its experts are the spill): nothing to spill.
    None,
    /// Not even every layer's FFN on the CPU is enough.
    Beyond,
    /// About this many layers (the line through K = 1 and K = n_layer).
    Layers(u32),
}

/// The second dry run: the solved context sizes and FFN spills, priced exactly.
struct Second {
    /// The largest context that fits fully, per KV type (only those below the asked one).
    shorter: Vec<(Option<KvType>, u32)>,
    /// FFN layers to spill.
    k: FfnNeed,
    /// K from one below the solved value to three above (priced exactly).
    spills: Vec<u32>,
    /// A q8_0 cache over the whole-layer grid (only when none fits at full offload).
    partial: Vec<PredictCase>,
    cases: Vec<PredictCase>,
}

fn second_round(h: &HatchInputs, preds: &[Prediction], fits_fully: bool) -> Second {
    let at = |c| bytes(find(preds, c));
    let shorter: Vec<(Option<KvType>, u32)> = [None, Some(KvType::Q8_0)]
        .into_iter()
        .filter_map(|kv| {
            let c = largest_ctx(at(h.at_full(h.n_ctx / 2, kv, 0)), at(h.at_full(h.n_ctx, kv, 0)), h.n_ctx, h.cap)?;
            (c < h.n_ctx).then_some((kv, c))
        })
        .collect();
    let k = if fits_fully || h.is_moe {
        FfnNeed::None
    } else {
        let one = at(h.at_full(h.n_ctx, None, 1));
        ffn_layers_needed(one, at(h.at_full(h.n_ctx, None, h.n_layer)), h.n_layer, h.cap)
            .map_or(FfnNeed::Beyond, FfnNeed::Layers)
    };
    let spills: Vec<u32> = match k {
        FfnNeed::Layers(k) => (k.saturating_sub(1).max(1)..=(k + 3).min(h.n_layer)).collect(),
        FfnNeed::None | FfnNeed::Beyond => Vec::new(),
    };
    // No quantized cache fits at full offload: a q8_0 cache may still let more layers on.
    #[allow(clippy::cast_precision_loss)]
    let kv_fits = [KvType::Q8_0, KvType::Q4_0]
        .iter()
        .any(|kv| at(h.at_full(h.n_ctx, Some(*kv), 0)).is_some_and(|b| b as f64 <= h.cap));
    let partial: Vec<PredictCase> = if kv_fits {
        Vec::new()
    } else {
        h.grid
            .iter()
            .filter(|n| **n > 0 && **n < h.full)
            .map(|n| PredictCase { ngl: *n, ..h.at_full(h.n_ctx, Some(KvType::Q8_0), 0) })
            .collect()
    };
    let cases = shorter
        .iter()
        .map(|(kv, c)| h.at_full(*c, *kv, 0))
        .chain(spills.iter().map(|k| h.at_full(h.n_ctx, None, *k)))
        .chain(partial.iter().copied())
        .collect();
    Second { shorter, k, spills, partial, cases }
}

/// What the options are made of.
struct World<'a> {
    h: &'a HatchInputs,
    preds: &'a [Prediction],
    trials: &'a [ProfileTrial],
    quality: Option<(KvType, Quality)>,
}

impl World<'_> {
    fn measured(&self, c: Candidate) -> Option<&ProfileTrial> {
        self.trials.iter().rev().find(|t| t.role == Role::Hatch && c.is(&t.result.spec))
    }

    fn option(&self, kind: HatchKind, case: PredictCase) -> PlacementOption {
        let predicted = bytes(find(self.preds, case));
        let c =
            Candidate { kv: case.kv_type, n_cpu_ffn: case.n_cpu_ffn, ..Candidate::layers(case.ngl, self.h.threads) };
        let t = (case.n_ctx == self.h.n_ctx).then(|| self.measured(c)).flatten();
        let ok = t.filter(|t| t.result.status == TrialStatus::Ok);
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let device_bytes = ok.and_then(|t| t.mem_bytes.map(|m| m as u64)).or(predicted);
        #[allow(clippy::cast_precision_loss)]
        let fits = match ok {
            Some(t) => !t.over_cap,
            None => t.is_none() && predicted.is_some_and(|b| b as f64 <= self.h.cap),
        };
        let note = match (t, ok) {
            (Some(t), None) => format!("{}: {}", t.result.status.as_str(), t.result.reason.clone().unwrap_or_default()),
            _ => String::new(),
        };
        PlacementOption {
            kind,
            n_ctx: case.n_ctx,
            n_gpu_layers: case.ngl,
            n_cpu_ffn: case.n_cpu_ffn,
            kv_type: case.kv_type.unwrap_or(self.h.kv),
            measured: ok.is_some(),
            tg_ts: ok.and_then(|t| t.result.test(false)).map(|x| x.avg_ts),
            pp_ts: ok.and_then(|t| t.result.test(true)).map(|x| x.avg_ts),
            tg_se_ts: ok.and_then(|t| t.result.test(false)).and_then(standard_error),
            pp_se_ts: ok.and_then(|t| t.result.test(true)).and_then(standard_error),
            device_bytes,
            fits,
            quality: self
                .quality
                .as_ref()
                .filter(|(kv, _)| Some(*kv) == case.kv_type && kv.is_quantized())
                .map(|(_, q)| q.clone()),
            recommended: false,
            note,
            llama_cpp_args: self.h.placement(case).flags(),
        }
    }

    fn over(&self, case: PredictCase) -> String {
        self.over_even(case, "")
    }

    /// "over the cap{even}: llama.cpp's dry run predicts ...", `even` saying
    /// what was already tried ("even with q4_0").
    fn over_even(&self, case: PredictCase, even: &str) -> String {
        bytes(find(self.preds, case)).map_or_else(
            || "llama.cpp's dry run could not price it".into(),
            |b| {
                format!("over the cap{even}: llama.cpp's dry run predicts {} > {}", human_bytes(b), cap_str(self.h.cap))
            },
        )
    }

    fn options(
        &self,
        (kv_pick, kv_at): (Option<KvType>, u32),
        shorter: &[(Option<KvType>, u32)],
        k: FfnNeed,
        spills: &[u32],
        layer_split: &Recommendation,
    ) -> Vec<PlacementOption> {
        let h = self.h;
        let mut v = Vec::new();
        if kv_pick.is_some() && kv_at < h.full {
            // Over the cap at full offload with either type; the q8_0 cache at the most layers it lets on.
            let q8 = h.at_full(h.n_ctx, Some(KvType::Q8_0), 0);
            let mut o = self.option(HatchKind::KvCache, PredictCase { ngl: kv_at, ..q8 });
            if o.note.is_empty() {
                let q4 = h.at_full(h.n_ctx, Some(KvType::Q4_0), 0);
                o.note = format!("full offload is {}", self.over_even(q4, " even with q4_0"));
            }
            v.push(o);
        }
        for kv in [KvType::Q8_0, KvType::Q4_0].into_iter().filter(|_| kv_at == h.full || kv_pick.is_none()) {
            let mut o = self.option(HatchKind::KvCache, h.at_full(h.n_ctx, Some(kv), 0));
            if Some(kv) != kv_pick {
                if kv == KvType::Q4_0 && kv_pick == Some(KvType::Q8_0) {
                    continue; // q8_0 is enough: q4_0 would only cost quality
                }
                o.note = self.over(h.at_full(h.n_ctx, Some(kv), 0));
            }
            v.push(o);
        }
        for (kv, c) in shorter {
            let mut o = self.option(HatchKind::ShorterContext, h.at_full(*c, *kv, 0));
            o.note = format!(
                "the largest context that fits fully with an {} KV cache; another workload, so predicted by llama.cpp's dry run, not measured",
                kv.unwrap_or(h.kv).as_str()
            );
            v.push(o);
        }
        v.extend(self.spill_options(k, spills));
        v.push(layer_split_option(layer_split, self.trials));
        v
    }

    fn spill_options(&self, k: FfnNeed, spills: &[u32]) -> Vec<PlacementOption> {
        let h = self.h;
        let full = |k| h.at_full(h.n_ctx, None, k);
        match k {
            // Full offload fits, or MoE: the MoE search keeps the experts on the CPU.
            FfnNeed::None => Vec::new(),
            FfnNeed::Beyond => {
                let mut o = self.option(HatchKind::FfnSpill, full(h.n_layer));
                o.note = self.over_even(full(h.n_layer), " even with every layer's FFN weights on the CPU");
                vec![o]
            }
            FfnNeed::Layers(_) => spills.iter().map(|k| self.option(HatchKind::FfnSpill, full(*k))).collect(),
        }
    }
}

fn cap_str(cap: f64) -> String {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    human_bytes(cap.max(0.0) as u64)
}

/// The whole-layer split as an option (measured by the search).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn layer_split_option(r: &Recommendation, trials: &[ProfileTrial]) -> PlacementOption {
    let t = trials.iter().map(|t| &t.result).find(|t| {
        let p = &t.spec.placement;
        t.status == TrialStatus::Ok
            && p.n_gpu_layers == r.n_gpu_layers
            && p.n_threads == r.n_threads
            && p.n_cpu_moe == r.n_cpu_moe
            && p.n_cpu_ffn == 0
            && p.kv_type == r.kv_type
    });
    PlacementOption {
        kind: HatchKind::LayerSplit,
        n_ctx: r.n_ctx,
        n_gpu_layers: r.n_gpu_layers,
        n_cpu_ffn: 0,
        kv_type: r.kv_type,
        measured: r.measured,
        tg_ts: r.tg_ts,
        pp_ts: r.pp_ts,
        tg_se_ts: t.and_then(|t| t.test(false)).and_then(standard_error),
        pp_se_ts: t.and_then(|t| t.test(true)).and_then(standard_error),
        device_bytes: r.mem_bytes.map(|m| m as u64),
        fits: true,
        quality: None,
        recommended: false,
        note: String::new(),
        llama_cpp_args: r.llama_cpp_args.clone(),
    }
}

/// The standard error of a test's mean speed (t/s), from its samples.
fn standard_error(t: &crate::types::TestResult) -> Option<f64> {
    #[allow(clippy::cast_precision_loss)]
    let n = t.samples_ts.len() as f64;
    (n >= 2.0).then(|| t.stddev_ts / n.sqrt())
}

/// The objective's score of an option and its standard error (the larger
/// relative error of the speeds it is made of).
fn score_with_noise(o: &PlacementOption, s: &Settings) -> Option<(f64, f64)> {
    let v = crate::tune::choose::score_for(s, o.tg_ts, o.pp_ts)?;
    let rel = |se: Option<f64>, ts: Option<f64>| match (se, ts) {
        (Some(se), Some(ts)) if ts > 0.0 => se / ts,
        _ => 0.0,
    };
    let r = match s.objective {
        crate::types::Objective::Tg | crate::types::Objective::Energy | crate::types::Objective::Throughput => {
            rel(o.tg_se_ts, o.tg_ts)
        }
        crate::types::Objective::Pp => rel(o.pp_se_ts, o.pp_ts),
        crate::types::Objective::Mixed => rel(o.tg_se_ts, o.tg_ts).max(rel(o.pp_se_ts, o.pp_ts)),
    };
    Some((v, v * r))
}

/// An option that changes the output: a quantized KV cache.
fn lossy(o: &PlacementOption) -> bool {
    o.kv_type.is_quantized()
}

/// Marks the best measured option under the cap and says what each other
/// one costs or gains against it. A quantized KV cache needs its quality
/// measured and passing the gate (`--max-kl`, `--min-top1`, at least 100
/// tokens, nothing broken), and is chosen over a lossless option only when
/// it is faster beyond the noise of both (two standard errors of the
/// difference) or nothing lossless fits. Returns notes for the report.
pub fn choose(options: &mut [PlacementOption], s: &Settings) -> Vec<crate::types::Note> {
    let score = |o: &PlacementOption| score_with_noise(o, s).map(|x| x.0);
    let gate = |o: &PlacementOption| match &o.quality {
        None => Some("quality not measured: not recommended blind".to_string()),
        Some(q) => q.fails(s.max_kl, s.min_top1),
    };
    let eligible = |o: &PlacementOption| {
        o.measured && o.fits && o.kind != HatchKind::ShorterContext && (!lossy(o) || gate(o).is_none())
    };
    let best_of = |lossless_only: bool| {
        options
            .iter()
            .enumerate()
            .filter(|(_, o)| eligible(o) && !(lossless_only && lossy(o)))
            .filter_map(|(i, o)| score_with_noise(o, s).map(|v| (i, v)))
            .max_by(|a, b| a.1 .0.total_cmp(&b.1 .0))
    };
    let Some((mut bi, (mut bv, best_se))) = best_of(false) else { return Vec::new() };
    let mut within_noise = None;
    if lossy(&options[bi]) {
        if let Some((li, (lv, lse))) = best_of(true) {
            let noise = 2.0 * (best_se * best_se + lse * lse).sqrt();
            if bv - lv <= noise {
                within_noise = Some((bv / lv - 1.0) * 100.0);
                (bi, bv) = (li, lv);
            }
        }
    }
    options[bi].recommended = true;
    let mut notes = Vec::new();
    for (i, o) in options.iter_mut().enumerate() {
        if i == bi || !o.note.is_empty() && !o.measured {
            continue;
        }
        let failed = if lossy(o) && o.measured { gate(o) } else { None };
        if let Some(why) = failed {
            o.note = why;
        } else if let (Some(pct), true) = (within_noise, lossy(o) && eligible(o)) {
            o.note = format!(
                "{pct:+.0}% {} against the recommendation, within the noise of the two: a lossy cache only when it pays",
                s.objective.as_str()
            );
        } else if let Some(v) = score(o) {
            let cmp = format!("{:+.0}% {} against the recommendation", (v / bv - 1.0) * 100.0, s.objective.as_str());
            o.note = if o.note.is_empty() { cmp } else { format!("{}; {cmp}", o.note) };
        } else if !o.fits {
            o.note = "over the cap".into();
        }
    }
    if options[bi].kind != HatchKind::LayerSplit {
        let o = &options[bi];
        notes.push(crate::types::Note::hatch(format!("escape hatch at {} context: {}", o.n_ctx, o.describe())));
    }
    notes
}

/// The recommendation at one context: the layer split's, or the chosen
/// hatch's flags (llama.cpp takes each; Ollama takes a quantized KV cache
/// as server settings and has no tensor overrides).
/// `threads` is what the hatch trials ran with.
#[must_use]
pub fn recommend(layer_split: &Recommendation, options: &[PlacementOption], threads: u32) -> Recommendation {
    let Some(o) = options.iter().find(|o| o.recommended && o.kind != HatchKind::LayerSplit) else {
        return layer_split.clone();
    };
    let mut r = layer_split.clone();
    r.n_threads = threads;
    r.n_gpu_layers = o.n_gpu_layers;
    r.n_cpu_moe = 0;
    r.kv_type = o.kv_type;
    r.n_cpu_ffn = o.n_cpu_ffn;
    r.tg_ts = o.tg_ts;
    r.pp_ts = o.pp_ts;
    #[allow(clippy::cast_precision_loss)]
    let mem = o.device_bytes.map(|b| b as f64);
    r.mem_bytes = mem;
    r.measured = o.measured;
    // Ollama takes a quantized cache as a server setting, and has no
    // tensor overrides: its best beside an FFN spill is the whole-layer split.
    r.ollama_num_gpu = (o.kind != HatchKind::KvCache).then(|| layer_split.ollama_layers());
    r.render_forms();
    r
}

#[cfg(test)]
mod tests;
