//! Beyond the whole-layer split: the escape hatches of the guide our users
//! read, in its order, each one file behind one interface ([`Hatch`]):
//! `kv` (a quantized KV cache), `shorter` (a shorter context), `ffn` (the
//! dense FFN weights of K layers on the CPU), `layer_split` (the
//! whole-layer split the search found, the option every other is judged
//! against). A MoE model's experts on the CPU (`--n-cpu-moe`) are searched
//! with the layers (`search::experts`), not here.
//!
//! Each hatch works over a [`Topology`]. With one offload device, when
//! full offload at the requested context does not fit (or the KV cache is
//! a large share of the cap), llama.cpp's dry run prices what each hatch
//! asks; what can fit and win is measured (raced against the best so far),
//! the rest is reported as predicted with the reason, and the best measured
//! option under the cap (and under the quality limit) is recommended
//! (`choose`). With several devices, each hatch that has a form across
//! them adds its split to what the split stage found.

use anyhow::Result;

use super::plan::Candidate;
use super::search::Search;
use super::split::{SplitFound, SplitInputs};
use crate::engine::predict::{PredictCase, Prediction};
use crate::model::human_bytes;
use crate::placement::KvType;
use crate::profile::{HatchKind, PlacementOption, ProfileTrial, Recommendation};
use crate::types::Quality;
use crate::types::{Role, TrialStatus};

mod choose;
pub mod ffn;
pub mod kv;
mod layer_split;
mod shorter;
#[cfg(test)]
mod tests;

pub use choose::{choose, recommend};
pub use ffn::ffn_layers_needed;
pub use shorter::largest_ctx;

/// The KV cache is worth shrinking when it takes at least this share of the cap.
pub const KV_SHARE: f64 = 0.25;

/// What the hatches need to know about the model and the cap (one device).
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
    /// The workload every trial runs ([`crate::tune::plan::ContextRun::workload`]).
    pub workload: crate::placement::Placement,
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
    pub fn placement(&self, case: PredictCase) -> crate::placement::Placement {
        let rpc = if case.ngl > 0 { self.rpc.as_slice() } else { &[] };
        crate::placement::Placement { n_cpu_ffn: case.n_cpu_ffn, ..self.workload.clone() }
            .with_layers(case.ngl, self.threads, Some(case.n_ctx))
            .with_kv(case.kv_type.unwrap_or(self.kv))
            .with_op_offload(self.op_offload)
            .with_split(&[], rpc)
    }
}

/// Where the layers can go, and what the hatches there start from.
pub enum Topology<'t, 'a> {
    /// One offload device: full offload priced, the whole-layer split
    /// (`layer_split`) the option to beat.
    One { h: &'t HatchInputs, layer_split: &'t Recommendation },
    /// Several: the split stage's answer, which each hatch adds to.
    Several { inp: &'t SplitInputs<'a>, found: &'t mut SplitFound },
}

/// An escape hatch: what it prices, what it measures, the options it
/// offers, at one device and across several. With one device the stage
/// calls, in order: [`Hatch::first_cases`] (priced with full offload at the
/// asked context), [`Hatch::solved_cases`] (what that solved, priced exactly),
/// [`Hatch::candidates`] (measured), [`Hatch::options`]. A hatch with no
/// form across devices (another context is another workload; the layer
/// split is the split stage itself) keeps [`Hatch::across_devices`]'s default.
pub trait Hatch {
    /// The cases its first dry run prices (full offload at the asked
    /// context is priced for every hatch).
    fn first_cases(&self, _h: &HatchInputs) -> Vec<PredictCase> {
        Vec::new()
    }

    /// After the first dry run: what it solved, to price exactly.
    fn solved_cases(&mut self, _h: &HatchInputs, _preds: &[Prediction], _fits_fully: bool) -> Vec<PredictCase> {
        Vec::new()
    }

    /// What it measures, beside the whole-layer split (`layer_split`); it
    /// may price more through the search (`preds` gains those answers).
    fn candidates(
        &mut self,
        _h: &HatchInputs,
        _layer_split: &Recommendation,
        _preds: &mut Vec<Prediction>,
        _search: &mut Search<'_>,
    ) -> Vec<Candidate> {
        Vec::new()
    }

    /// The quantized KV caches it measures, whose quality is checked where
    /// one could be chosen.
    fn lossy(&self) -> Vec<KvType> {
        Vec::new()
    }

    /// Its options at one device, from what was priced and measured.
    fn options(&self, w: &HatchWorld<'_>) -> Vec<PlacementOption>;

    /// With several devices: priced, measured where it can win, and added
    /// to `found` (which is chosen again).
    ///
    /// # Errors
    /// What the executor or `assess` returns (an interrupt).
    fn across_devices(
        &mut self,
        _search: &mut Search<'_>,
        _inp: &SplitInputs<'_>,
        _found: &mut SplitFound,
        _assess: &mut Assessor<'_>,
    ) -> Result<()> {
        Ok(())
    }
}

/// The hatches in the guides' order (the order of their options).
fn in_order() -> Vec<Box<dyn Hatch>> {
    vec![
        Box::<kv::KvCache>::default(),
        Box::<shorter::ShorterContext>::default(),
        Box::<ffn::FfnSpill>::default(),
        Box::new(layer_split::LayerSplit),
    ]
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

/// Every hatch over the topology. Measured trials join the search's
/// (role `hatch`). With several devices they join `found`, and what is
/// returned is empty.
///
/// # Errors
/// What the executor or `assess` returns (an interrupt keeps the finished trials).
pub fn run(topology: Topology<'_, '_>, search: &mut Search<'_>, assess: &mut Assessor<'_>) -> Result<Hatches> {
    match topology {
        Topology::One { h, layer_split } => one_device(search, h, assess, layer_split),
        Topology::Several { inp, found } => {
            for mut hatch in in_order() {
                hatch.across_devices(search, inp, found, assess)?;
            }
            Ok(Hatches::default())
        }
    }
}

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

/// Priced under the cap.
#[allow(clippy::cast_precision_loss)]
fn under(preds: &[Prediction], c: PredictCase, cap: f64) -> bool {
    bytes(find(preds, c)).is_some_and(|b| b as f64 <= cap)
}

fn find(preds: &[Prediction], c: PredictCase) -> Option<&Prediction> {
    preds.iter().find(|p| p.case == Some(c))
}

/// Each case once, in the order first asked.
fn once(cases: impl IntoIterator<Item = PredictCase>) -> Vec<PredictCase> {
    let mut v: Vec<PredictCase> = Vec::new();
    for c in cases {
        if !v.contains(&c) {
            v.push(c);
        }
    }
    v
}

/// The hatch stage at one device, at the search's context after the
/// whole-layer search.
fn one_device(
    search: &mut Search<'_>,
    h: &HatchInputs,
    assess: &mut Assessor<'_>,
    layer_split: &Recommendation,
) -> Result<Hatches> {
    // A dry run prices what llama.cpp allocates; a sampler also sees the
    // driver's own share, so a priced case is held to the cap less that.
    let gap = search.unaccounted();
    #[allow(clippy::cast_precision_loss)]
    let held = HatchInputs { cap: h.cap - gap as f64, ..h.clone() };
    let h = &held;
    let mut hatches = in_order();
    let own_case = h.at_full(h.n_ctx, None, 0);
    let first = once(std::iter::once(own_case).chain(hatches.iter().flat_map(|x| x.first_cases(h))));
    let mut preds = search.price_cases(&first);
    let own = find(&preds, own_case);
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
    let second: Vec<PredictCase> = hatches.iter_mut().flat_map(|x| x.solved_cases(h, &preds, fits_fully)).collect();
    preds.extend(search.price_cases(&second));
    search.predicted.extend(preds.iter().cloned());
    // Measure what can fit and win, raced against the best so far.
    let mut to_measure = Vec::new();
    for x in &mut hatches {
        to_measure.extend(x.candidates(h, layer_split, &mut preds, search));
    }
    search.progress.plan(to_measure.len() as u64);
    for c in to_measure {
        if !search.trials.iter().any(|t| t.role == Role::Hatch && c.is(&t.result.spec)) {
            let race = search.race();
            search.measure(Role::Hatch, c, Some(race))?;
        }
    }
    let options_of = |quality| {
        let world = HatchWorld { h, preds: &preds, trials: &search.trials, quality, layer_split };
        hatches.iter().flat_map(|x| x.options(&world)).collect::<Vec<_>>()
    };
    // The quality check reads the text twice (minutes on a slow host): only
    // for a cache that would be chosen if it passed, each type once, until
    // the choice is a lossless option or a cache already checked.
    let lossy_types: Vec<KvType> = hatches.iter().flat_map(|x| x.lossy()).collect();
    let mut checked: Vec<(KvType, Option<Quality>)> = Vec::new();
    let known = |checked: &[(KvType, Option<Quality>)]| -> Vec<(KvType, Quality)> {
        lossy_types
            .iter()
            .filter_map(|kv| match checked.iter().find(|c| c.0 == *kv) {
                Some((_, q)) => q.clone().map(|q| (*kv, q)),
                None => Some((*kv, Quality::passing())),
            })
            .collect()
    };
    loop {
        let mut options = options_of(known(&checked));
        choose(&mut options, search.settings().scoring(), &search.settings().gate);
        let next = options.iter().find(|o| o.recommended && choose::lossy(o)).map(|o| o.placement.kv_type);
        match next.filter(|kv| !checked.iter().any(|c| c.0 == *kv)) {
            Some(kv) => checked.push((kv, assess(kv)?)),
            None => break,
        }
    }
    let quality = checked.iter().filter_map(|(kv, q)| q.clone().map(|q| (*kv, q))).collect();
    let mut options = options_of(quality);
    let mut notes = choose(&mut options, search.settings().scoring(), &search.settings().gate);
    if let Some(note) = paired_choice(search, &mut options)? {
        notes = note.into_iter().collect();
    }
    if gap > 0 {
        notes.push(crate::types::Note::prediction(format!(
            "the escape hatches' dry-run prices were held to the cap less {}: what this context's trials held on the device beyond llama.cpp's accounting (the driver's own memory)",
            human_bytes(gap)
        ))
        .at(h.n_ctx));
    }
    let checked: Vec<KvType> = checked.iter().map(|c| c.0).collect();
    choose::unchecked(&mut options, search.settings().scoring(), &checked);
    Ok(Hatches { fits_fully, kv_bytes, options, notes })
}

/// How close (as a share of the recommendation's score) a lossless
/// runner-up's one trial must come for the two to be paired: within it,
/// one load each cannot tell them apart on a noisy host (loads 10-20%
/// apart in a CPU quota), and a placement a pair of loads would find
/// faster must not lose on one.
pub const CLOSE_SHARE: f64 = 0.85;

/// The chosen option checked against its closest rival by
/// [`crate::tune::baseline::pair`] (counterbalanced, a load a trial, the
/// t interval on the log ratios): the spread of repetitions inside one
/// load, which `choose` reads, is not the noise between loads.
/// - A quantized cache is paired with the best lossless option under the
///   cap and kept only where it is faster beyond that interval; otherwise
///   the lossless option is the answer.
/// - A lossless answer is paired with the best lossless option of
///   another kind (whole layers against the FFN spill, say) whose one
///   trial came within [`CLOSE_SHARE`] of it, and that option becomes the
///   answer where it is faster beyond the interval. Two of one kind (the
///   spill of K and K + 1 layers) are not paired: the one that keeps
///   more on the device is the faster by construction, and a pair costs
///   six loads.
///
/// `Some(notes)` where the choice changed: the hatch notes of the new choice.
///
/// # Errors
/// What the executor returns (an interrupt).
fn paired_choice(search: &mut Search<'_>, options: &mut [PlacementOption]) -> Result<Option<Vec<crate::types::Note>>> {
    let Some(ri) = options.iter().position(|o| o.recommended) else { return Ok(None) };
    let scoring = search.settings().scoring();
    let score = |o: &PlacementOption| scoring.speeds(o.tg_ts, o.pp_ts);
    let lossy = choose::lossy(&options[ri]);
    let best = score(&options[ri]).unwrap_or(0.0);
    let rival = options
        .iter()
        .enumerate()
        .filter(|(i, o)| *i != ri && o.measured && o.fits && o.kind != HatchKind::ShorterContext && !choose::lossy(o))
        .filter(|(_, o)| lossy || o.kind != options[ri].kind)
        .filter_map(|(i, o)| Some((i, score(o)?)))
        .filter(|(_, v)| lossy || *v >= CLOSE_SHARE * best)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|x| x.0);
    // Nothing lossless fits (the quantized cache is the only way under
    // the cap), or no lossless rival came close.
    let Some(bi) = rival else { return Ok(None) };
    let (at, own) = (search.at(), search.settings().workload.kv_type);
    // Each side as its hatch trial ran it (the workload's own cache type as the search names it).
    let side = |o: &PlacementOption| {
        let c = Candidate::from(&o.placement);
        Candidate { ctx: o.placement.n_ctx.unwrap_or(at.n_ctx), kv: c.kv.filter(|k| *k != own), ..c }
    };
    // The challenger is "mine": the cache against the lossless option, the rival against the answer.
    let (ci, di) = if lossy { (ri, bi) } else { (bi, ri) };
    let mut out = crate::profile::DefaultComparison::unmeasured(at.depth);
    crate::tune::baseline::pair(search, side(&options[ci]), side(&options[di]), &mut out)?;
    let ratio = crate::report::placement::ratios(&out).join(", ");
    let against = options[di].describe();
    let which = if lossy { "the best lossless option" } else { "the recommendation, whose one trial it came close to" };
    let said = format!("paired with {which} ({against}): {ratio}, {}", out.verdict.word());
    let won = out.verdict == crate::profile::Verdict::Faster;
    let why = if lossy { ": a lossy cache only when it pays" } else { ": the recommendation stays" };
    let o = &mut options[ci];
    o.note = match (won, o.note.is_empty()) {
        (true, true) => said,
        (true, false) => format!("{}; {said}", o.note),
        (false, _) => format!("{said}{why}"),
    };
    // The cache stays only where it won; the rival becomes the answer only where it won.
    let answer = if won { ci } else { di };
    if answer == ri {
        return Ok(None);
    }
    options[ri].recommended = false;
    options[answer].recommended = true;
    // The cache's own note says why it lost; the old answer's says it lost paired.
    if lossy {
        options[answer].note = String::new();
    } else {
        options[ri].note = "its one trial was ahead, the paired trials were not: see the recommendation".into();
    }
    Ok(Some(choose::hatch_note(&options[answer]).into_iter().collect()))
}

/// What the options at one device are made of.
pub struct HatchWorld<'a> {
    h: &'a HatchInputs,
    preds: &'a [Prediction],
    trials: &'a [ProfileTrial],
    /// The quality of each quantized cache checked (or assumed, to see whether it could win).
    quality: Vec<(KvType, Quality)>,
    layer_split: &'a Recommendation,
}

impl HatchWorld<'_> {
    fn measured(&self, c: Candidate) -> Option<&ProfileTrial> {
        self.trials.iter().rev().find(|t| t.role == Role::Hatch && c.is(&t.result.spec))
    }

    /// Bytes priced for a case.
    fn bytes(&self, case: PredictCase) -> Option<u64> {
        bytes(find(self.preds, case))
    }

    fn option(&self, kind: HatchKind, case: PredictCase) -> PlacementOption {
        let predicted = self.bytes(case);
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
            placement: self.h.placement(case),
            measured: ok.is_some(),
            tg_ts: ok.and_then(|t| t.result.test(false)).map(|x| x.avg_ts),
            pp_ts: ok.and_then(|t| t.result.test(true)).map(|x| x.avg_ts),
            tg_se_ts: ok.and_then(|t| t.result.test(false)).and_then(standard_error),
            pp_se_ts: ok.and_then(|t| t.result.test(true)).and_then(standard_error),
            device_bytes,
            fits,
            quality: self
                .quality
                .iter()
                .find(|(kv, _)| Some(*kv) == case.kv_type && kv.is_quantized())
                .map(|(_, q)| q.clone()),
            recommended: false,
            note,
        }
    }

    fn over(&self, case: PredictCase) -> String {
        self.over_even(case, "")
    }

    /// "over the cap{even}: llama.cpp's dry run predicts ...", `even` saying
    /// what was already tried ("even with q4_0").
    fn over_even(&self, case: PredictCase, even: &str) -> String {
        self.bytes(case).map_or_else(
            || "llama.cpp's dry run could not price it".into(),
            |b| {
                format!("over the cap{even}: llama.cpp's dry run predicts {} > {}", human_bytes(b), cap_str(self.h.cap))
            },
        )
    }
}

fn cap_str(cap: f64) -> String {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    human_bytes(cap.max(0.0) as u64)
}

/// The standard error of a test's mean speed (t/s), from its samples.
fn standard_error(t: &crate::types::TestResult) -> Option<f64> {
    #[allow(clippy::cast_precision_loss)]
    let n = t.samples_ts.len() as f64;
    (n >= 2.0).then(|| t.stddev_ts / n.sqrt())
}
