//! Speculative decoding as a placement (`tune --draft MODEL`): the admitted
//! answer's target with the draft beside it, as llama-server loads one.
//! Tried: the draft on the CPU (`-ngld 0`), every draft layer on the
//! device, and where the cap leaves room for the target or the whole draft
//! but not both, the most draft layers that fit beside the target's (the
//! split that keeps every target layer). Each is priced first (target and
//! draft by llama.cpp's dry run, together, as fit's extra-model path adds
//! them), and one under every cap is measured in one load: the answer's
//! generation without the draft and with it, greedily at the tune's depth
//! on natural text, alternated by repetition, and judged by the paired
//! t interval every other "faster" claim uses. The best faster beyond it
//! becomes the answer (through the gate, by the loads that measured it);
//! where none is, the report says speculation does not pay here. The
//! model's own MTP heads are priced at the answer's layers and, where they
//! do not fit there, at the most layers that fit with them: that trade is
//! measured load against load with the answer. Where no draft length is
//! given, the best option that keeps the answer's target is measured
//! again at two other lengths.

use std::path::Path;

use anyhow::Result;

use crate::engine::spec::{SpecAsk, SpecRun, MIN_PROMPT};
use crate::error::is_interrupted as interrupted;
use crate::model::human_bytes;
use crate::placement::Placement;
use crate::profile::{DraftOption, DraftReport, DraftRequest, Verdict};
use crate::tune::baseline::Ratio;

/// Repetitions (pairs) one load runs at least: a t interval needs a few.
pub const MIN_PAIRS: u32 = 5;

/// Bytes (device, host) of a placement by llama.cpp's dry run.
pub type Price = Option<(u64, u64)>;

/// What the stage reads from the machine (a seam: fake worlds in tests).
pub trait DraftWorld {
    /// The target at `p` (its draft aside), by the dry run.
    ///
    /// # Errors
    /// An interrupt; a dry run that fails is `Ok(None)`.
    fn price_target(&mut self, p: &Placement) -> Result<Price>;
    /// The draft with each of `ngld` layers on the device (`None`: every
    /// one), its context `n_ctx`: one price each.
    ///
    /// # Errors
    /// An interrupt; a dry run that fails prices nothing.
    fn price_draft(&mut self, ngld: &[Option<u32>], n_ctx: u32) -> Result<Vec<Price>>;
    /// One load of `ask`.
    ///
    /// # Errors
    /// An interrupt; a run that fails is an `Err` the stage reports.
    fn measure(&mut self, ask: &SpecAsk) -> Result<SpecRun>;
}

/// What the stage works from.
pub struct DraftInputs<'a> {
    pub model: &'a Path,
    pub request: &'a DraftRequest,
    /// The admitted answer, without a draft.
    pub answer: &'a Placement,
    /// The device cap (bytes) less what trials held beyond llama.cpp's accounting.
    pub cap: Option<f64>,
    pub host_cap: Option<u64>,
    pub n_depth: u32,
    pub n_gen: u32,
    pub repetitions: u32,
    /// The draft's layers and its output (`-ngld` for every one).
    pub draft_full: u32,
}

impl DraftInputs<'_> {
    fn with(&self, ngld: Option<u32>) -> Placement {
        Placement { draft: Some(self.request.draft(ngld)), ..self.answer.clone() }
    }

    /// `placement` named `label`, priced at `price` (under the caps or not), not measured.
    fn priced(&self, label: String, placement: Placement, price: Price) -> DraftOption {
        DraftOption {
            predicted_device_bytes: price.map(|x| x.0),
            predicted_host_bytes: price.map(|x| x.1),
            fits: price.is_some_and(|x| self.fits(x)),
            ..DraftOption::unmeasured(label, placement)
        }
    }

    /// One load of `placement` at the stage's depth, text and tokens, at
    /// least `repetitions` times.
    fn ask(&self, placement: Placement, repetitions: u32) -> SpecAsk {
        SpecAsk {
            model: self.model.to_path_buf(),
            placement,
            n_depth: self.n_depth.max(MIN_PROMPT),
            n_gen: self.n_gen,
            repetitions: self.repetitions.max(repetitions),
            text_file: self.request.prompt_file.clone(),
            check_only: false,
        }
    }

    /// What `o`'s loads held on the devices (the most of them), and the
    /// option over the cap where that is.
    fn held(&self, o: &mut DraftOption, device: u64) {
        o.device_bytes = Some(device);
        #[allow(clippy::cast_precision_loss)]
        if self.cap.is_some_and(|c| device as f64 > c) {
            o.fits = false;
            o.note = format!("measured over the cap: {} on the devices by llama.cpp's accounting", human_bytes(device));
        }
    }

    #[allow(clippy::cast_precision_loss)]
    fn fits(&self, (device, host): (u64, u64)) -> bool {
        self.cap.is_none_or(|c| device as f64 <= c) && self.host_cap.is_none_or(|h| host <= h)
    }
}

/// The draft stage: options priced, those under the caps measured, the
/// best faster beyond the noise marked chosen.
///
/// # Errors
/// What the world's measurement returns as fatal (an interrupt).
pub fn run(inp: &DraftInputs<'_>, world: &mut dyn DraftWorld) -> Result<DraftReport> {
    let mut options = if inp.request.model.is_some() { priced(inp, world)? } else { mtp_priced(inp, world)? };
    // Paired against the answer: an option that keeps the answer's own
    // target in one load (with and without its draft); one that gives
    // target layers up, load against load with the answer.
    for o in options.iter_mut().filter(|o| o.fits) {
        if own_target(o, inp) {
            measure(inp, world, o)?;
        } else {
            measure_trade(inp, world, o)?;
        }
    }
    options.extend(lengths(inp, world, &options)?);
    // The highest paired ratio among those faster beyond the noise; on a
    // tie, the first (llama-server's default length before the others).
    let best = options
        .iter()
        .enumerate()
        .filter(|(_, o)| o.fits && o.verdict == Some(Verdict::Faster))
        .rev()
        .max_by(|a, b| a.1.ratio.map_or(0.0, |r| r[0]).total_cmp(&b.1.ratio.map_or(0.0, |r| r[0])))
        .map(|x| x.0);
    if let Some(i) = best {
        options[i].chosen = true;
    }
    let summary = summary(&options, inp);
    Ok(DraftReport {
        draft: inp.request.model.clone().unwrap_or_else(|| inp.model.to_path_buf()),
        mtp: inp.request.model.is_none(),
        n_gen: inp.n_gen,
        n_depth: inp.n_depth,
        options,
        summary,
    })
}

/// The model's own MTP heads at the answer's layers, priced with them on
/// (the MTP blocks loaded where `-ngl` puts them, after the output layer,
/// and the MTP context beside the model's), and where that is over the
/// caps, the most layers that fit with them: what MTP costs in target
/// layers, measured against the answer load by load ([`measure_trade`]).
fn mtp_priced(inp: &DraftInputs<'_>, world: &mut dyn DraftWorld) -> Result<Vec<DraftOption>> {
    let without = world.price_target(inp.answer)?;
    let at = inp.with(None);
    let ngl = at.n_gpu_layers;
    let price = world.price_target(&at)?;
    let mut o = inp.priced(format!("the model's MTP heads at the answer's -ngl {ngl}"), at, price);
    let plain = without.map_or_else(|| "not priced".into(), |w| human_bytes(w.0));
    o.note = format!("the answer without them: {plain} on the devices by llama.cpp's dry run");
    if o.fits || inp.cap.is_none() || price.is_none() {
        return Ok(over_cap_notes(vec![o], inp));
    }
    let mut v = vec![o];
    if let Some((k, price)) = most_layers(inp, world, &inp.with(None), Some((0, 0)))? {
        let label =
            format!("the model's MTP heads at -ngl {k}, the most layers that fit with them ({} fewer)", ngl - k);
        v.push(inp.priced(label, Placement { n_gpu_layers: k, ..inp.with(None) }, price));
    }
    Ok(over_cap_notes(v, inp))
}

/// The most target layers below the answer's at which `with` (those
/// layers, its draft) priced with `add` (a draft model's own price; the
/// MTP heads are in the target's) is under the caps: a binary search, the
/// device bytes growing with `-ngl`. `None` where not even `-ngl 0` fits.
///
/// # Errors
/// An interrupt.
fn most_layers(
    inp: &DraftInputs<'_>,
    world: &mut dyn DraftWorld,
    with: &Placement,
    add: Price,
) -> Result<Option<(u32, Price)>> {
    let (mut lo, mut hi, mut most) = (0u32, inp.answer.n_gpu_layers, None);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let p = Placement { n_gpu_layers: mid, ..with.clone() };
        let target = world.price_target(&p)?;
        let price = target.zip(add).map(|(t, a)| (t.0 + a.0, t.1 + a.1));
        if price.is_some_and(|x| inp.fits(x)) {
            most = Some((mid, price));
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(most)
}

/// The options, each priced with the target: `--draft-ngl` alone where
/// given; else on the CPU, every layer on the device, and where that is
/// over the cap, the most draft layers that fit beside the target and the
/// most target layers that fit beside the whole draft (without an offload
/// device, the CPU alone).
fn priced(inp: &DraftInputs<'_>, world: &mut dyn DraftWorld) -> Result<Vec<DraftOption>> {
    // The target as it runs beside a draft (its outputs a verifying batch's).
    let target = world.price_target(&inp.with(Some(0)))?;
    let n_ctx = inp.answer.n_ctx.unwrap_or(0);
    let asked: Vec<Option<u32>> = match inp.request.n_gpu_layers {
        Some(n) => vec![Some(n)],
        None => (0..inp.draft_full).map(Some).chain(std::iter::once(None)).collect(),
    };
    let prices = world.price_draft(&asked, n_ctx)?;
    let price_of = |k: usize| prices.get(k).copied().flatten();
    let both = |p: Price| Some((target?.0 + p?.0, target?.1 + p?.1));
    let option = |label: String, ngld: Option<u32>, price: Price| inp.priced(label, inp.with(ngld), both(price));
    let cpu = option("the draft on the CPU (-ngld 0)".into(), Some(0), price_of(0));
    let mut v = match inp.request.n_gpu_layers {
        Some(n) => vec![option(format!("{n} draft layers on the device (--draft-ngl)"), Some(n), price_of(0))],
        // No offload device (no cap): the CPU is the only place for it.
        None if inp.cap.is_none() => vec![cpu],
        None => vec![cpu, option("every draft layer on the device".into(), None, price_of(asked.len() - 1))],
    };
    // The cap holds the target and part of the draft: its most layers that fit.
    if v.len() == 2 && !v[1].fits && v[0].fits {
        let most = (1..inp.draft_full as usize).rev().find(|k| both(price_of(*k)).is_some_and(|x| inp.fits(x)));
        match most {
            Some(k) => {
                let n = u32::try_from(k).unwrap_or(0);
                let label = format!("{n} of the draft's {} layers on the device, the most that fit", inp.draft_full);
                v.push(option(label, Some(n), price_of(k)));
            }
            // llama.cpp offloads the output layer first: the least on the device is -ngld 1.
            None => {
                let one = both(price_of(1)).map_or_else(|| "not priced".into(), |x| human_bytes(x.0));
                v[1].note =
                    format!("no part of the draft fits beside the target either (-ngld 1, its output layer: {one})");
            }
        }
        // The other side of the trade: target layers given up for the whole draft.
        let whole = inp.with(None);
        if let Some((k, price)) = most_layers(inp, world, &whole, price_of(asked.len() - 1))? {
            let fewer = inp.answer.n_gpu_layers - k;
            let label = format!(
                "every draft layer on the device, the target at -ngl {k}, the most that fit beside it ({fewer} fewer)"
            );
            v.push(inp.priced(label, Placement { n_gpu_layers: k, ..whole }, price));
        }
    }
    Ok(over_cap_notes(v, inp))
}

/// Says why each option over the caps is.
fn over_cap_notes(mut v: Vec<DraftOption>, inp: &DraftInputs<'_>) -> Vec<DraftOption> {
    for o in v.iter_mut().filter(|o| !o.fits) {
        let also = std::mem::take(&mut o.note);
        o.note = match (o.predicted_device_bytes, inp.cap) {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            (Some(b), Some(c)) => format!(
                "over the cap with the target: {} by llama.cpp's dry run, against {}",
                human_bytes(b),
                human_bytes(c.max(0.0) as u64)
            ),
            (Some(_), None) => "over the host cap by llama.cpp's dry run".into(),
            (None, _) => "not priced: llama.cpp's dry run gave no answer".into(),
        };
        if !also.is_empty() {
            o.note = format!("{}; {also}", o.note);
        }
    }
    v
}

/// One load of `o`: the answer's generation without the draft and with
/// it, alternated by repetition, judged by the paired interval.
fn measure(inp: &DraftInputs<'_>, world: &mut dyn DraftWorld, o: &mut DraftOption) -> Result<()> {
    let run = match load(world, &inp.ask(o.placement.clone(), MIN_PAIRS))? {
        Ok(r) => r,
        Err(e) => {
            o.note = format!("not measured: {e}");
            return Ok(());
        }
    };
    o.loads = 1;
    inp.held(o, run.device_bytes(false) + run.device_bytes(true));
    let mean = |v: Vec<f64>| (!v.is_empty()).then(|| crate::stats::mean(&v));
    (o.tg_ts, o.plain_tg_ts) = (mean(run.speeds(true)), mean(run.speeds(false)));
    let ratio = Ratio::paired(&run.pairs());
    o.ratio = ratio.map(|r| [r.ratio, r.lo, r.hi]);
    o.verdict = Some(ratio.map_or(Verdict::NotMeasured, Ratio::verdict));
    (o.acceptance, o.tokens_per_verify) = (run.acceptance(), run.tokens_per_round());
    if run.same_prefix == 0 {
        o.note = "with the draft the first token differed from the answer's own (greedy both): not chosen".into();
        o.verdict = Some(Verdict::NotDecided);
    }
    Ok(())
}

/// The draft lengths (`--spec-draft-n-max`) tried beside llama-server's
/// default of 3: one token a draft (the least a rejection wastes) and 8
/// (the most an accepted run gains).
pub const OTHER_LENGTHS: [u32; 2] = [1, LONGEST_LENGTH];

/// The longest draft the stage measures where no length is given: the
/// target is priced for its verifying batch, so every length is.
pub const LONGEST_LENGTH: u32 = 8;

/// Where the request's draft length is llama-server's default, the
/// measured option with the highest paired ratio that keeps the answer's
/// target (one load a length; a trade is many) measured again at each
/// of [`OTHER_LENGTHS`], one load each: the length changes what a draft
/// costs and wins, not where anything is held (the same price). A length
/// the user set (`--draft-max`, or `--spec-draft-n-max` in a pasted
/// line) is kept as asked.
///
/// # Errors
/// An interrupt.
fn lengths(inp: &DraftInputs<'_>, world: &mut dyn DraftWorld, options: &[DraftOption]) -> Result<Vec<DraftOption>> {
    if !length_searched(inp.request) {
        return Ok(Vec::new());
    }
    let ratio = |o: &DraftOption| o.ratio.map_or(0.0, |r| r[0]);
    let Some(best) = options
        .iter()
        .filter(|o| o.fits && o.loads > 0 && o.ratio.is_some() && own_target(o, inp))
        .max_by(|a, b| ratio(a).total_cmp(&ratio(b)))
    else {
        return Ok(Vec::new());
    };
    let mut v = Vec::new();
    for n in OTHER_LENGTHS {
        let mut placement = best.placement.clone();
        let Some(d) = placement.draft.as_mut() else { return Ok(v) };
        d.n_max = n;
        let label =
            format!("{}, {n} token{} a draft (--spec-draft-n-max {n})", best.label, if n == 1 { "" } else { "s" });
        let mut o = DraftOption {
            predicted_device_bytes: best.predicted_device_bytes,
            predicted_host_bytes: best.predicted_host_bytes,
            fits: true,
            ..DraftOption::unmeasured(label, placement)
        };
        measure(inp, world, &mut o)?;
        v.push(o);
    }
    Ok(v)
}

/// The outcome of one load: `Err` an interrupt; `Ok(Err(why))` a load that failed.
fn load(world: &mut dyn DraftWorld, ask: &SpecAsk) -> Result<std::result::Result<SpecRun, String>> {
    match world.measure(ask) {
        Ok(r) => Ok(Ok(r)),
        Err(e) if interrupted(&e) => Err(e),
        Err(e) => Ok(Err(format!("{e:#}"))),
    }
}

/// An option that gives target layers up for its draft (the MTP heads
/// where they do not fit beside the answer): its generation with the
/// draft against the answer's own without one, each side a load of its
/// own, in the order and number of pairs every other paired claim uses
/// ([`crate::tune::baseline::answer_first`], [`crate::tune::baseline::PAIRS`]
/// while decided, up to [`crate::tune::baseline::MAX_PAIRS`]), a pair being
/// the two loads it ran. Both sides generate greedily on the same text at
/// the same depth, so the ratio says what the layers given up cost and
/// what the draft wins back, together.
///
/// # Errors
/// An interrupt.
fn measure_trade(inp: &DraftInputs<'_>, world: &mut dyn DraftWorld, o: &mut DraftOption) -> Result<()> {
    use crate::tune::baseline::{answer_first, MAX_PAIRS, PAIRS};
    let (mine, theirs) = (inp.ask(o.placement.clone(), 2), inp.ask(inp.answer.clone(), 2));
    let mean = |v: Vec<f64>| (!v.is_empty()).then(|| crate::stats::mean(&v));
    let (mut pairs, mut runs, mut answers) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ratio, mut failed) = (None, false);
    for i in 0..MAX_PAIRS {
        // The answer first where baseline::pair runs its answer first.
        let (a, b) = if answer_first(i) {
            let b = load(world, &theirs)?;
            (load(world, &mine)?, b)
        } else {
            let a = load(world, &mine)?;
            (a, load(world, &theirs)?)
        };
        let (a, b) = match (a, b) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                o.note = format!("not measured: a load failed ({e})");
                failed = true;
                break;
            }
        };
        if let (Some(x), Some(y)) = (mean(a.speeds(true)), mean(b.speeds(false))) {
            pairs.push((x, y));
            answers.push(y);
        }
        runs.push(a);
        ratio = Ratio::paired(&pairs);
        if i + 1 >= PAIRS && ratio.is_some_and(|r| r.verdict() != Verdict::NotDecided) {
            break;
        }
    }
    o.loads = u32::try_from(runs.len()).unwrap_or(u32::MAX);
    if runs.is_empty() {
        return Ok(());
    }
    let device = runs.iter().map(|r| r.device_bytes(false) + r.device_bytes(true)).max().unwrap_or(0);
    o.tg_ts = mean(pairs.iter().map(|p| p.0).collect());
    o.plain_tg_ts = mean(answers);
    o.ratio = ratio.map(|r| [r.ratio, r.lo, r.hi]);
    // A load that failed (out of memory near the cap, say) leaves no verdict, as in baseline::pair.
    o.verdict = Some(if failed { Verdict::NotMeasured } else { ratio.map_or(Verdict::NotMeasured, Ratio::verdict) });
    let (drafted, accepted, rounds) =
        runs.iter().fold((0, 0, 0), |s, r| (s.0 + r.n_drafted, s.1 + r.n_accepted, s.2 + r.n_rounds));
    #[allow(clippy::cast_precision_loss)]
    {
        o.acceptance = (drafted > 0).then(|| accepted as f64 / drafted as f64);
        o.tokens_per_verify = (rounds > 0).then(|| (accepted + rounds) as f64 / rounds as f64);
    }
    let fewer = inp.answer.n_gpu_layers.saturating_sub(o.placement.n_gpu_layers);
    let said = format!(
        "paired load against load with the answer (-ngl {}, no draft), {} pairs: {fewer} target layers fewer",
        inp.answer.n_gpu_layers,
        pairs.len()
    );
    o.note = if o.note.is_empty() { said } else { format!("{said}; {}", o.note) };
    inp.held(o, device);
    if runs.iter().any(|r| r.same_prefix == 0) {
        o.note = format!(
            "{}; with the draft the first token differed from the answer's own (greedy both): not chosen",
            o.note
        );
        o.verdict = Some(Verdict::NotDecided);
    }
    Ok(())
}

/// Whether `o` keeps the answer's own target (only its draft added).
fn own_target(o: &DraftOption, inp: &DraftInputs<'_>) -> bool {
    Placement { draft: None, ..o.placement.clone() } == *inp.answer
}

/// Whether speculation pays here, in words.
fn summary(options: &[DraftOption], inp: &DraftInputs<'_>) -> String {
    let with = if inp.request.model.is_none() { " with the model's MTP heads" } else { "" };
    let at = format!("{with} at depth {}", inp.n_depth.max(MIN_PROMPT));
    let ratio = |o: &DraftOption| o.ratio.map_or_else(String::new, |[m, lo, hi]| format!("x{m:.2} [{lo:.2}, {hi:.2}]"));
    if let Some(o) = options.iter().find(|o| o.chosen) {
        return format!("speculation pays{at}: {} is the answer, tg {}", o.label, ratio(o));
    }
    let measured: Vec<String> =
        options.iter().filter(|o| o.loads > 0).map(|o| format!("{} {}", o.label, ratio(o))).collect();
    if measured.is_empty()
        && options.iter().any(|o| o.fits && (own_target(o, inp) || o.note.starts_with("not measured")))
    {
        return format!("speculation not measured{at}: the loads of the draft placements under the caps failed (their lines say why)");
    }
    if let Some(o) = options.iter().find(|o| measured.is_empty() && o.fits) {
        return format!(
            "speculation not measured{at}: beside the answer it is over the caps; {} (priced), and the answer has no draft",
            o.label
        );
    }
    if measured.is_empty() {
        return format!("speculation not measured{at}: no draft placement beside the answer fits under the caps");
    }
    format!("speculation does not pay{at} beyond the noise: {}; the answer has no draft", measured.join(", "))
}

/// Why the model's MTP heads, faster here, cannot be the answer: on an
/// NVIDIA card measured through another backend, Ollama's CUDA process
/// holds a share the trials did not ([`crate::tune::ollama::priced_for_consumer`]
/// prices num_gpu with it); the heads' price with that share must be
/// under the cap too, as Ollama would load them with `draft_num_predict`.
pub fn ollama_share_refuses(
    (hw, device): (&crate::types::Hardware, Option<&str>),
    cap: Option<f64>,
    chosen: &DraftOption,
) -> Option<String> {
    let mtp = chosen.placement.draft.as_ref().is_some_and(crate::placement::Draft::is_mtp);
    let share = crate::consumer::ollama::process::consumer_process_bytes(hw, device);
    let (cap, priced) = (cap?, chosen.predicted_device_bytes?);
    (mtp && over_with_share(priced, share, cap)).then(|| {
        format!(
            "with Ollama's CUDA process share ({} MiB) the heads' price is over the cap, and Ollama would load them with draft_num_predict",
            share >> 20
        )
    })
}

/// Whether `priced` bytes and a consumer's process `share` (0: none) are over `cap`.
#[allow(clippy::cast_precision_loss)]
fn over_with_share(priced: u64, share: u64, cap: f64) -> bool {
    share > 0 && (priced + share) as f64 > cap
}

/// Why the draft stage does not run beside `p`, if it does not.
pub fn not_tried(s: &crate::profile::Settings, p: &crate::placement::Placement) -> Option<String> {
    if s.goal.objective != crate::types::Objective::Tg {
        Some(format!("--objective {}: a draft speeds up generation alone", s.goal.objective.as_str()))
    } else if s.caps.max_power_w.is_some() {
        Some("--max-power: a draft's power is not measured".into())
    } else if !p.tensor_split.is_empty() || !p.devices.is_empty() || !p.cpu_overrides.is_empty() || p.n_parallel > 1 {
        Some(
            "the answer splits over devices, names its devices, keeps fit's tensors on the CPU or runs several slots"
                .into(),
        )
    } else if p.mmproj.is_some() {
        Some("--mmproj: the speculative load does not load the projector, so it could not be held under the cap".into())
    } else {
        None
    }
}

/// The real world: llama.cpp's dry run in a child (the target's and the
/// draft's specs), and each load a child of its own (`__spec`), started
/// once the runner's kept trial worker has ended.
pub struct ChildWorld<'r> {
    pub runner: &'r crate::engine::runner::Runner,
    /// The target's dry run at this context (the tune's workload spec).
    pub target: crate::engine::predict::PredictSpec,
    /// The draft's file and layers with its output (`-ngld` for every one);
    /// `None` for the model's own MTP heads.
    pub draft: Option<(std::path::PathBuf, u32)>,
    pub timeout: std::time::Duration,
    /// The longest draft the stage measures ([`longest_length`]).
    pub longest: u32,
}

/// Whether the stage searches the draft length: none was given (a stored
/// request from before `n_max_fixed` with a length other than
/// llama-server's 3 had one given).
fn length_searched(request: &DraftRequest) -> bool {
    !request.n_max_fixed && request.n_max == crate::placement::DRAFT_N_MAX
}

/// The longest draft length the stage measures for `request`: the one
/// asked where it is not searched, else [`LONGEST_LENGTH`].
#[must_use]
pub fn longest_length(request: &DraftRequest) -> u32 {
    if length_searched(request) {
        request.n_max.max(LONGEST_LENGTH)
    } else {
        request.n_max
    }
}

/// The slots llama-server runs a pasted line with: `-np` where the
/// placement gives one (more than 1), else its own 4.
fn server_slots(p: &Placement) -> u32 {
    if p.n_parallel > 1 {
        p.n_parallel
    } else {
        crate::placement::SERVER_SLOTS
    }
}

impl DraftWorld for ChildWorld<'_> {
    fn price_target(&mut self, p: &Placement) -> Result<Price> {
        let case = crate::engine::predict::PredictCase {
            ngl: p.n_gpu_layers,
            n_ctx: p.n_ctx.unwrap_or(self.target.n_ctx),
            kv_type: Some(p.kv_type),
            n_cpu_ffn: p.n_cpu_ffn,
            n_cpu_moe: p.n_cpu_moe,
        };
        let mtp = p.draft.as_ref().is_some_and(crate::placement::Draft::is_mtp);
        // With a draft, the target's outputs are a verifying batch's a
        // slot, at the longest length the stage may measure, for the slots
        // llama-server runs the pasted line with.
        let outputs = p
            .draft
            .as_ref()
            .map(|d| crate::engine::spec::output_limits(p.n_batch, server_slots(p), d.n_max.max(self.longest)));
        let spec = crate::engine::predict::PredictSpec { cases: vec![case], mtp, outputs, ..self.target.clone() };
        let out = match crate::engine::predict::predict_in_child(self.runner, &spec) {
            Ok(out) => out,
            Err(e) if interrupted(&e) => return Err(e),
            Err(_) => return Ok(None),
        };
        Ok(out.cases.first().filter(|c| c.error.is_none()).map(|c| (c.device_bytes, c.host_bytes())))
    }

    fn price_draft(&mut self, ngld: &[Option<u32>], n_ctx: u32) -> Result<Vec<Price>> {
        let Some((model, full)) = self.draft.clone() else { return Ok(vec![None; ngld.len()]) };
        let spec = crate::engine::predict::PredictSpec {
            model,
            ngl: ngld.iter().map(|n| n.unwrap_or(full)).collect(),
            // The draft's context is the target's whole context.
            n_ctx: if n_ctx > 0 { n_ctx } else { self.target.n_ctx },
            kv_type: crate::placement::KvType::F16,
            mmproj: None,
            cases: Vec::new(),
            // One output a slot (common_base_params_to_speculative): drafts
            // are tried at one slot only (`not_tried`), and a pasted line
            // without -np runs llama-server's own slots.
            outputs: Some([crate::placement::SERVER_SLOTS.min(self.target.n_batch.max(1)), 1]),
            ..self.target.clone()
        };
        match crate::engine::predict::predict_in_child(self.runner, &spec) {
            Ok(out) => Ok(out
                .predictions
                .iter()
                .map(|p| p.error.is_none().then(|| (p.device_bytes, p.host_bytes())))
                .collect()),
            Err(e) if interrupted(&e) => Err(e),
            Err(_) => Ok(vec![None; ngld.len()]),
        }
    }

    fn measure(&mut self, ask: &SpecAsk) -> Result<SpecRun> {
        self.runner.release();
        crate::engine::spec::measure(ask, self.timeout)
    }
}

#[cfg(test)]
mod tests;
