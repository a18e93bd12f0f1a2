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
//! where none is, the report says speculation does not pay here.

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
    // Paired against the answer: only options that keep the answer's own target.
    for o in options.iter_mut().filter(|o| o.fits && own_target(o, inp)) {
        measure(inp, world, o)?;
    }
    let best = options
        .iter()
        .enumerate()
        .filter(|(_, o)| o.fits && o.verdict == Some(Verdict::Faster))
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
/// caps, the most layers that fit with them: priced, not measured (its
/// target is not the answer's, so no pair would compare like with like),
/// to show what MTP costs in target layers.
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
    // The device bytes grow with -ngl: the most layers whose price fits.
    let (mut lo, mut hi, mut most) = (0u32, ngl, None);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let p = Placement { n_gpu_layers: mid, ..inp.with(None) };
        let price = world.price_target(&p)?;
        if price.is_some_and(|x| inp.fits(x)) {
            most = Some((mid, price));
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let mut v = vec![o];
    if let Some((k, price)) = most {
        let label =
            format!("the model's MTP heads at -ngl {k}, the most layers that fit with them ({} fewer)", ngl - k);
        let mut fewer = inp.priced(label, Placement { n_gpu_layers: k, ..inp.with(None) }, price);
        fewer.note = "priced, not measured: MTP would have to win back the target layers it costs".into();
        v.push(fewer);
    }
    Ok(over_cap_notes(v, inp))
}

/// The options, each priced with the target: `--draft-ngl` alone where
/// given; else on the CPU, every layer on the device, and where that is
/// over the cap, the most draft layers that fit beside the target
/// (without an offload device, the CPU alone).
fn priced(inp: &DraftInputs<'_>, world: &mut dyn DraftWorld) -> Result<Vec<DraftOption>> {
    let target = world.price_target(inp.answer)?;
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
    let ask = SpecAsk {
        model: inp.model.to_path_buf(),
        placement: o.placement.clone(),
        n_depth: inp.n_depth.max(MIN_PROMPT),
        n_gen: inp.n_gen,
        repetitions: inp.repetitions.max(MIN_PAIRS),
        text_file: inp.request.prompt_file.clone(),
        check_only: false,
    };
    let run = match world.measure(&ask) {
        Ok(r) => r,
        Err(e) if interrupted(&e) => return Err(e),
        Err(e) => {
            o.note = format!("not measured: {e:#}");
            return Ok(());
        }
    };
    o.loads = 1;
    let device = run.device_bytes(false) + run.device_bytes(true);
    o.device_bytes = Some(device);
    #[allow(clippy::cast_precision_loss)]
    if inp.cap.is_some_and(|c| device as f64 > c) {
        o.fits = false;
        o.note = format!("measured over the cap: {} on the devices by llama.cpp's accounting", human_bytes(device));
    }
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
    if measured.is_empty() && options.iter().any(|o| o.fits && own_target(o, inp)) {
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
        let spec = crate::engine::predict::PredictSpec { cases: vec![case], mtp, ..self.target.clone() };
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
mod tests {
    use super::*;
    use crate::engine::spec::SpecBuffer;

    /// Ollama's CUDA process share counts with the heads' price where one
    /// applies (an NVIDIA card measured through another backend), never otherwise.
    #[test]
    fn the_heads_price_with_ollamas_process_share_must_fit_the_cap() {
        let mib = |n: u64| n << 20;
        #[allow(clippy::cast_precision_loss)]
        let cap = mib(1000) as f64;
        assert!(over_with_share(mib(500), mib(612), cap), "1112 MiB over 1000");
        assert!(!over_with_share(mib(380), mib(612), cap), "992 MiB under it");
        assert!(!over_with_share(mib(1200), 0, cap), "no share: the gate alone decides");
    }

    /// A target of 100 device bytes at the answer, a draft of 4 layers and
    /// its output at 10 bytes each on the device (the rest on the host);
    /// generation takes `ns(ngld)` a repetition with the draft, 1 s without.
    struct Fake {
        ns: fn(Option<u32>) -> u64,
        loads: Vec<Option<u32>>,
    }

    impl DraftWorld for Fake {
        /// 100 device bytes at the answer (20 layers), 4 a layer; MTP adds 30.
        fn price_target(&mut self, p: &Placement) -> Result<Price> {
            let mtp = p.draft.as_ref().is_some_and(crate::placement::Draft::is_mtp);
            let layers = 4 * u64::from(p.n_gpu_layers);
            Ok(Some((20 + layers + if mtp { 30 } else { 0 }, 50)))
        }
        fn price_draft(&mut self, ngld: &[Option<u32>], _n_ctx: u32) -> Result<Vec<Price>> {
            Ok(ngld
                .iter()
                .map(|n| Some((10 * u64::from(n.unwrap_or(5)), 10 * u64::from(5 - n.unwrap_or(5)))))
                .collect())
        }
        fn measure(&mut self, ask: &SpecAsk) -> Result<SpecRun> {
            let ngld = ask.placement.draft.as_ref().and_then(|d| d.n_gpu_layers);
            self.loads.push(ngld);
            let n = ask.repetitions as usize;
            let bytes = |draft: bool, b: u64| SpecBuffer {
                draft,
                buffer: "Vulkan0".into(),
                host: false,
                model: b,
                context: 0,
                compute: 0,
            };
            Ok(SpecRun {
                plain_ns: vec![1_000_000_000; n],
                spec_ns: (0..n).map(|i| (self.ns)(ngld) + i as u64).collect(),
                n_gen: 32,
                n_depth: 64,
                n_drafted: 90,
                n_accepted: 60,
                n_rounds: 30,
                same_prefix: 32,
                buffers: vec![bytes(false, 100), bytes(true, 10 * u64::from(ngld.unwrap_or(5)))],
            })
        }
    }

    fn stage(cap: f64, ns: fn(Option<u32>) -> u64) -> (DraftReport, Vec<Option<u32>>) {
        let request = DraftRequest { model: Some("d.gguf".into()), n_gpu_layers: None, n_max: 3, prompt_file: None };
        staged(&request, cap, ns)
    }

    fn staged(request: &DraftRequest, cap: f64, ns: fn(Option<u32>) -> u64) -> (DraftReport, Vec<Option<u32>>) {
        let answer = Placement { n_ctx: Some(2048), ..Placement::default() }.with_layers(20, 2, Some(2048));
        let inp = DraftInputs {
            model: Path::new("m.gguf"),
            request,
            answer: &answer,
            cap: Some(cap),
            host_cap: None,
            n_depth: 1024,
            n_gen: 32,
            repetitions: 3,
            draft_full: 5,
        };
        let mut world = Fake { ns, loads: Vec::new() };
        (run(&inp, &mut world).unwrap(), world.loads)
    }

    fn chosen(r: &DraftReport) -> Option<Option<u32>> {
        r.chosen().map(|o| o.placement.draft.as_ref().unwrap().n_gpu_layers)
    }

    #[test]
    fn the_draft_on_the_device_is_the_answer_where_it_fits_and_pays() {
        let (r, loads) = stage(200.0, |n| if n.is_none() { 500_000_000 } else { 1_250_000_000 });
        assert_eq!(loads, [Some(0), None], "both measured, each in one load of {MIN_PAIRS} pairs");
        assert_eq!(chosen(&r), Some(None), "{r:#?}");
        assert!(r.summary.starts_with("speculation pays at depth 1024"), "{}", r.summary);
        let o = r.chosen().unwrap();
        assert_eq!((o.device_bytes, o.predicted_device_bytes), (Some(150), Some(150)));
        assert!(o.ratio.unwrap()[1] > 1.0 && o.acceptance == Some(60.0 / 90.0), "{o:?}");
    }

    #[test]
    fn where_the_cap_holds_the_target_and_part_of_the_draft_the_most_draft_layers_that_fit_are_tried() {
        // 100 + 10 k <= 125: two of the draft's layers; every layer (150) is over.
        let (r, loads) = stage(125.0, |n| if n == Some(2) { 800_000_000 } else { 1_250_000_000 });
        assert_eq!(loads, [Some(0), Some(2)], "{r:#?}");
        let all = r.options.iter().find(|o| o.placement.draft.as_ref().unwrap().n_gpu_layers.is_none()).unwrap();
        assert!(!all.fits && all.loads == 0 && all.note.starts_with("over the cap with the target"), "{all:?}");
        assert_eq!(chosen(&r), Some(Some(2)));
    }

    #[test]
    fn mtp_heads_are_priced_with_and_without_them_and_where_they_fit_measured_at_the_answer() {
        // 100 bytes without MTP, 130 with by the dry run (150 by the load): under a cap of 160 both fit.
        let (r, loads) = staged(&DraftRequest::mtp(), 160.0, |_| 500_000_000);
        assert!(r.mtp && r.draft == Path::new("m.gguf"), "{r:#?}");
        assert_eq!(loads, [None], "one option, at the answer, measured once");
        let o = r.chosen().expect("twice as fast beyond the noise");
        assert!(o.placement.draft.as_ref().unwrap().is_mtp() && o.placement.n_gpu_layers == 20, "{o:?}");
        assert_eq!(o.predicted_device_bytes, Some(130));
        assert!(o.note.starts_with("the answer without them: 0.00 MiB"), "{}", o.note);
        assert!(r.summary.starts_with("speculation pays with the model's MTP heads"), "{}", r.summary);
    }

    #[test]
    fn where_mtp_heads_do_not_fit_at_the_answer_the_layers_they_cost_are_priced_not_measured() {
        // 130 > 120: with MTP, 20 + 4 k + 30 <= 120 holds to k = 17, three layers fewer.
        let (r, loads) = staged(&DraftRequest::mtp(), 120.0, |_| 500_000_000);
        assert!(loads.is_empty(), "nothing paired against the answer: {r:#?}");
        assert_eq!(r.options.len(), 2, "{r:#?}");
        assert!(!r.options[0].fits && r.options[0].note.starts_with("over the cap with the target"), "{r:#?}");
        let fewer = &r.options[1];
        assert!(fewer.fits && fewer.loads == 0 && fewer.placement.n_gpu_layers == 17, "{fewer:?}");
        assert!(fewer.label.contains("(3 fewer)") && fewer.note.contains("not measured"), "{fewer:?}");
        assert_eq!(r.chosen(), None);
        assert!(r.summary.contains("not measured"), "{}", r.summary);
    }

    #[test]
    fn a_draft_that_slows_generation_is_not_the_answer_and_the_report_says_so() {
        let (r, _) = stage(200.0, |_| 1_250_000_000);
        assert_eq!(chosen(&r), None);
        assert!(r.summary.contains("does not pay") && r.summary.contains("no draft"), "{}", r.summary);
        assert!(r.options.iter().all(|o| o.verdict == Some(Verdict::Slower)), "{r:#?}");
    }
}
