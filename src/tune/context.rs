//! One context size's tune: the whole-layer search (planned, priced by
//! llama.cpp's dry run, measured through the executor), then its escape
//! hatches with one offload device or the split with several, then the
//! pairing with the baselines; what it found, for the profile.

use anyhow::Result;

use super::executor::WorkerExecutor;
use super::hatch::{self, Topology};
use super::plan::{self, ContextRun, Plan};
use super::search::{self, Checkpointing, Search};
use super::start::Shared;
use super::{baseline, draft, memory, ollama, pricer, quality, split, summary, verdict};
use crate::model::ModelInfo;
use crate::profile::{Confidence, MemoryPolicy, Settings};
use crate::progress::Progress;
use crate::types::{Hardware, Note, TrialSpec};

/// What one context size's search found.
pub(super) struct ContextOutcome {
    pub found: plan::Found,
    pub trials: Vec<crate::profile::ProfileTrial>,
    pub prediction: Option<crate::profile::PredictionReport>,
    pub search: Option<crate::profile::SearchReport>,
    pub fit_check: Vec<crate::profile::FitCheck>,
    pub placement: crate::profile::ContextPlacement,
    pub no_gpu: bool,
    pub notes: Vec<Note>,
}

/// Every context size's tune, smallest first, each continuing the
/// checkpoint of the one before.
///
/// # Errors
/// Worker start failures, an interrupt (the checkpoint keeps finished trials).
pub(super) fn every_context(sh: &Shared<'_>, checkpoint: Checkpointing) -> Result<Vec<ContextOutcome>> {
    let s = sh.opts.settings();
    let mut checkpoint = Some(checkpoint);
    let mut outcomes = Vec::new();
    for ctx in s.contexts() {
        let mut at = ContextRun::of(s, ctx);
        let batch = ollama::batch_here(sh, &mut at);
        let (mut o, c) = tune_context(sh, at, checkpoint.take())?;
        o.notes.extend(batch);
        checkpoint = c;
        outcomes.push(o);
    }
    Ok(outcomes)
}

/// The whole-layer search at one context size, then its escape hatches.
fn tune_context(
    sh: &Shared<'_>,
    at: ContextRun,
    checkpoint: Option<Checkpointing>,
) -> Result<(ContextOutcome, Option<Checkpointing>)> {
    let (info, policy, s) = (sh.opts.info(), sh.policy.as_ref(), sh.opts.settings());
    let mut plan = plan_for(info, s, &sh.hw, policy.is_none());
    let names = sh.opts.caps().iter().map(|d| d.device.clone()).collect();
    let mut pricer = pricer::ChildPricer::new(&sh.runner, pricer::workload_spec(info, s, at, sh.op_offload), names);
    let (mut prediction, mut notes) = priced_plan(sh, at, &mut plan, &mut pricer);
    let mut executor = executor(sh, at);
    let planned = if plan.grid_mode && !plan.no_gpu { plan.full_grid.len() as u64 } else { 0 };
    let progress = Progress::new(sh.opts.progress(), planned);
    let mut search =
        Search::new(s, at, &mut executor, policy.cloned(), progress, checkpoint).with_pricer(Box::new(pricer));
    search.host_cap = Some(host_cap(sh, prediction.as_ref())?);
    search.predicted = prediction.as_ref().map(|p| p.predictions.clone()).unwrap_or_default();
    search.confirmations_priced = prediction.as_ref().is_some_and(|p| p.error.is_none());
    let found = search.run(&plan)?;
    notes.extend(search.take_unpriced().map(|e| confirmation_unpriced(&e)));
    absorb_confirmations(prediction.as_mut(), &search.predicted);
    notes.extend(found.notes.iter().cloned());
    let layer_split = {
        let t = &search.trials;
        summary::recommendation(&found, t, (s, at), info.n_layer_full, sh.op_offload, Confidence::High)
    };
    let several = sh.opts.caps().len() >= 2 && !plan.no_gpu;
    // A KV type the consumer's server forces leaves Ollama whole layers only.
    let kv_fixed = s.workload.kv_type.is_quantized();
    let priced_ok = prediction.as_ref().is_some_and(|p| p.error.is_none());
    // Energy chooses among whole layers: the hatches are judged by speed alone.
    let energy = s.goal.objective.weighs_power();
    let hatches = match policy.filter(|_| !several && !kv_fixed && !plan.no_gpu && priced_ok && !energy) {
        Some(p) => hatches(sh, p, &plan, &mut search, &layer_split)?,
        None => hatch::Hatches::default(),
    };
    notes.extend(hatches.notes.iter().cloned());
    let split = if several { Some(split(sh, &plan, &mut search)?) } else { None };
    notes.extend(split.iter().flat_map(|f| f.notes.iter().cloned()));
    let mut recommendation = with_rpc(hatch::recommend(&layer_split, &hatches.options), s, info);
    let priced = prediction.as_ref().filter(|pr| pr.error.is_none() && !several && !plan.no_gpu);
    let (default, ollama) = baseline::against::baselines(&mut search, &mut recommendation, priced, plan.full)?;
    notes.extend(for_consumer(sh, several, &mut search, &mut recommendation));
    let quality_wall_s = quality_seconds(&hatches.options, split.as_ref());
    let split = split.and_then(|f| apply_split(&mut recommendation, f, sh.opts.caps(), &s.backend.rpc));
    let (predicted, host_cap) = (search.predicted.clone(), search.host_cap.as_ref().map(|h| h.0));
    let (trials, checkpoint) = search.into_parts();
    let gate = gate_of((&trials, &predicted), (policy.filter(|_| !plan.no_gpu).map(|p| p.cap_bytes), host_cap), s);
    let (recommendation, refused) = admit(&gate, recommendation, &with_rpc(layer_split, s, info), s.workload.kv_type)?;
    notes.extend(refused.into_iter().chain(summary::noise_note(&trials)));
    let (recommendation, draft) = with_draft(sh, at, &gate, recommendation, &mut notes)?;
    if let Some(pr) = prediction.as_mut() {
        summary::finish_prediction(pr, &trials, info.n_layer_full);
    }
    let runnable: Vec<u32> = plan.full_grid.iter().copied().filter(|n| !plan.predicted_over.contains(n)).collect();
    let search_report = (!plan.no_gpu).then(|| crate::profile::SearchReport {
        quality_wall_s,
        ..summary::search_report(&trials, s, &plan.full_grid, &runnable, !plan.grid_mode, info.n_layer_full)
    });
    let fit_check = policy.map(|_| search::fit_check(&trials, &found.decision, info.n_layer_full)).unwrap_or_default();
    let mut placement = crate::profile::ContextPlacement {
        n_ctx: at.n_ctx,
        fits_fully: hatches.fits_fully,
        kv_bytes: hatches.kv_bytes,
        recommendation,
        options: hatches.options,
        default,
        ollama,
        split,
        reading: None,
        job: None,
        draft,
    };
    verdict::judge(&mut placement, &s.goal, &s.gate);
    let (search, no_gpu) = (search_report, plan.no_gpu);
    Ok((ContextOutcome { found, trials, prediction, search, fit_check, placement, no_gpu, notes }, checkpoint))
}

/// What the search priced itself (confirmations) joins the dry run's report.
fn absorb_confirmations(
    prediction: Option<&mut crate::profile::PredictionReport>,
    priced: &[crate::engine::predict::Prediction],
) {
    if let Some(pr) = prediction {
        let new: Vec<_> = priced.iter().filter(|p| !pr.predictions.contains(p)).cloned().collect();
        pr.predictions.extend(new);
    }
}

/// The answer's Ollama lines priced for the engine Ollama runs here (one
/// offload device: [`ollama::priced_for_consumer`]).
fn for_consumer(
    sh: &Shared<'_>,
    several: bool,
    search: &mut Search<'_>,
    rec: &mut crate::profile::Recommendation,
) -> Option<Note> {
    let device = sh.opts.caps().first().filter(|_| !several).map(|c| c.device.as_str());
    ollama::priced_for_consumer((&sh.hw, device), search, rec)
}

/// `r` on the RPC servers the tune ran on, where it puts layers on a device.
/// Its forms rendered again with Ollama's one-slot rule for the model's
/// family ([`crate::consumer::ollama::one_slot`]).
fn with_rpc(
    mut r: crate::profile::Recommendation,
    s: &Settings,
    info: &crate::model::ModelInfo,
) -> crate::profile::Recommendation {
    if !s.backend.rpc.is_empty() && r.placement.n_gpu_layers > 0 {
        r.placement.rpc.clone_from(&s.backend.rpc);
    }
    r.ollama_one_slot = crate::consumer::ollama::one_slot(&info.architecture);
    r.render_forms();
    r
}

/// The gate at one context: its trials and dry runs, the device's cap
/// (`None` without an offload device), the host's, and `--max-power`.
fn gate_of<'a>(
    (trials, predicted): (&'a [crate::profile::ProfileTrial], &'a [crate::engine::predict::Prediction]),
    (cap_bytes, host_bytes): (Option<f64>, Option<u64>),
    s: &Settings,
) -> crate::profile::Gate<'a> {
    let unaccounted = search::unaccounted(trials);
    crate::profile::Gate {
        trials,
        predicted,
        cap_bytes,
        unaccounted,
        host_bytes,
        max_power_w: s.caps.max_power_w,
        drafts: &[],
    }
}

/// The answer through the gate ([`crate::profile::Gate::admit`]): where it
/// is refused, the whole-layer split the search found (its forms, with
/// the RPC servers it ran on) in its place, and a note says why; nothing
/// refused is ever the answer.
///
/// # Errors
/// Where neither is admitted (the search's own answer is measured or
/// priced under the caps, so this is a fault of the tune): what was refused.
fn admit(
    gate: &crate::profile::Gate<'_>,
    answer: crate::profile::Recommendation,
    layer_split: &crate::profile::Recommendation,
    own_kv: crate::placement::KvType,
) -> Result<(crate::profile::Admitted, Option<Note>)> {
    let refused = match gate.admit(answer, own_kv) {
        Ok(a) => return Ok((a, None)),
        Err(r) => r,
    };
    let n_ctx = refused.recommendation.n_ctx();
    let flags = refused.recommendation.flags();
    match gate.admit(layer_split.clone(), own_kv) {
        Ok(a) => {
            let note = Note::search(format!(
                "not the answer: {flags} was refused by the gate ({}); the whole-layer split {} is",
                refused.why,
                a.flags()
            ))
            .at(n_ctx);
            Ok((a, Some(note)))
        }
        Err(again) => Err(anyhow::anyhow!(
            "no answer at the {n_ctx}-token context could be admitted under the caps: {flags}: {}; {}: {}",
            refused.why,
            again.recommendation.flags(),
            again.why
        )),
    }
}

/// `--draft`: the draft stage beside the admitted answer ([`draft::run`])
/// and, where a draft placement pays, the answer with it, admitted by the
/// loads that measured it ([`crate::profile::Gate`]'s draft evidence).
/// Tried for generation speed (`--objective tg`) on one device's whole
/// layers, hatches included; otherwise a note says why not.
///
/// # Errors
/// An interrupt.
fn with_draft(
    sh: &Shared<'_>,
    at: ContextRun,
    gate: &crate::profile::Gate<'_>,
    answer: crate::profile::Admitted,
    notes: &mut Vec<Note>,
) -> Result<(crate::profile::Admitted, Option<crate::profile::DraftReport>)> {
    let s = sh.opts.settings();
    // A model with MTP heads: drafting with them is tried whether asked or not.
    let mtp = crate::profile::DraftRequest::mtp();
    let request = match &s.backend.draft {
        Some(r) => r,
        None if sh.opts.info().has_mtp() => &mtp,
        None => return Ok((answer, None)),
    };
    let what = if request.model.is_some() { "draft" } else { "MTP heads" };
    let p = &answer.placement;
    if let Some(why) = draft::not_tried(s, p) {
        notes.push(Note::search(format!("{what} not tried: {why}")).at(at.n_ctx));
        return Ok((answer, None));
    }
    let draft = match &request.model {
        Some(m) => Some((m.clone(), crate::model::inspect(m)?.n_layer_full)),
        None => None,
    };
    let draft_full = draft.as_ref().map_or(0, |d| d.1);
    #[allow(clippy::cast_precision_loss)]
    let cap = gate.cap_bytes.map(|c| c - gate.unaccounted as f64);
    let inputs = draft::DraftInputs {
        model: &sh.opts.info().path,
        request,
        answer: p,
        cap,
        host_cap: gate.host_bytes,
        n_depth: at.depth,
        n_gen: s.measure.n_gen,
        repetitions: s.measure.repetitions,
        draft_full,
    };
    let mut world = draft::ChildWorld {
        runner: &sh.runner,
        target: pricer::workload_spec(sh.opts.info(), s, at, sh.op_offload),
        draft,
        timeout: std::time::Duration::from_secs(s.policy.trial_timeout_s),
        longest: draft::longest_length(request),
    };
    let mut report = draft::run(&inputs, &mut world)?;
    let Some(chosen) = report.chosen() else {
        notes.push(Note::search(report.summary.clone()).at(at.n_ctx));
        return Ok((answer, Some(report)));
    };
    let device = sh.opts.caps().first().map(|c| c.device.as_str());
    if let Some(why) = draft::ollama_share_refuses((&sh.hw, device), gate.cap_bytes, chosen) {
        report.unchoose(format!("{}; not the answer: {why}", report.summary));
        notes.push(Note::search(report.summary.clone()).at(at.n_ctx));
        return Ok((answer, Some(report)));
    }
    let r = with_chosen(answer.clone().into_inner(), chosen);
    let with_drafts = crate::profile::Gate { drafts: &report.options, ..*gate };
    match with_drafts.admit(r, s.workload.kv_type) {
        Ok(a) => {
            notes.push(Note::search(report.summary.clone()).at(at.n_ctx));
            if request.model.is_some() {
                notes.push(Note::consumer(
                    "Ollama runs a Modelfile DRAFT as draft-mtp or draft-dflash (llm/llama_server.go), never as draft-simple: the Ollama lines carry no draft, llama.cpp's and llama-server's do".to_string(),
                ));
            }
            Ok((a, Some(report)))
        }
        Err(refused) => {
            report.unchoose(format!("the draft was refused by the gate ({}): the answer has none", refused.why));
            notes.push(Note::search(report.summary.clone()).at(at.n_ctx));
            Ok((answer, Some(report)))
        }
    }
}

/// The split stage's answer made the recommendation (its best split, if
/// it found one); its report where it placed layers on devices.
fn apply_split(
    r: &mut crate::profile::Recommendation,
    f: split::SplitFound,
    caps: &[memory::DeviceCap],
    rpc: &[String],
) -> Option<crate::profile::SplitReport> {
    if let Some(best) = f.best.map(|i| &f.options[i]) {
        *r = split::recommendation(r, best, caps, rpc);
    }
    Some(f.report).filter(|r| !r.devices.is_empty())
}

/// The host memory cap, where some placement the device can hold stays
/// under it (else the tune is bad input: it would only swap).
fn host_cap(sh: &Shared<'_>, prediction: Option<&crate::profile::PredictionReport>) -> Result<(u64, String)> {
    let (info, host) = (sh.opts.info(), memory::host_cap(&sh.opts.settings().caps, &sh.hw.ram));
    match (prediction, sh.policy.as_ref()) {
        (Some(pr), Some(p)) => memory::check_host(&pr.predictions, p.cap_bytes, &host)?,
        // Every layer on the CPU, no dry run: the weights alone say it.
        _ if info.file_size > host.0 => return Err(memory::weights_over_host(info.file_size, &host)),
        _ => {}
    }
    Ok(host)
}

/// Seconds the quality checks took: one check a context (every option
/// with its KV type carries a copy of its score: the q8_0 cache and the
/// shorter context at q8_0), and the split's KV hatch once (its other
/// modes carry the same score).
fn quality_seconds(options: &[crate::profile::PlacementOption], split: Option<&split::SplitFound>) -> f64 {
    let wall = |q: Option<&crate::types::Quality>| q.map_or(0.0, |q| q.wall_s);
    options.iter().map(|o| wall(o.quality.as_ref())).fold(0.0, f64::max)
        + split.iter().flat_map(|f| &f.options).map(|o| wall(o.quality.as_ref())).fold(0.0, f64::max)
}

/// llama.cpp's dry run over the grid: what is over the cap, and the
/// adaptive search's top end, priced (it may lie between grid points).
fn priced_plan(
    sh: &Shared<'_>,
    at: ContextRun,
    plan: &mut Plan,
    pricer: &mut dyn pricer::Pricer,
) -> (Option<crate::profile::PredictionReport>, Vec<Note>) {
    let (info, policy, s) = (sh.opts.info(), sh.policy.as_ref(), sh.opts.settings());
    let mut prediction = policy.map(|p| memory::predict(&sh.runner, (info, s, at), p, &plan.full_grid, sh.op_offload));
    let mut notes = Vec::new();
    if let (Some(pr), Some(p)) = (prediction.as_mut(), policy) {
        plan.predicted_over.clone_from(&pr.predicted_over_cap);
        let top = memory::largest_predicted_under(&pr.predictions, p.cap_bytes, info.n_layer_full);
        let floor = plan.full_grid.iter().copied().filter(|n| *n <= top && !plan.predicted_over.contains(n)).max();
        let priced = pr.error.is_none();
        let predictions = &mut pr.predictions;
        let mut failed = None;
        let mut price = |n| {
            memory::price(pricer, predictions, n).unwrap_or_else(|e| crate::tune::pricer::unpriced(&mut failed, &e))
        };
        plan.n_max = if priced { memory::priced_under(&mut price, top, floor.unwrap_or(0), p.cap_bytes) } else { top };
        notes.extend(failed.map(|e| {
            Note::prediction(format!(
                "llama.cpp's dry run of the search's top end failed ({e}): it is measured unpriced"
            ))
        }));
        notes.extend(pr.error.as_ref().map(|e| {
            Note::prediction(format!(
                "llama.cpp's dry-run memory prediction is unavailable ({e}); every grid value is measured"
            ))
        }));
    }
    notes.extend(rig_margin_note(crate::engine::predict::upstream_margin(), policy.and_then(|p| p.device_total_bytes)));
    (prediction, notes)
}

/// Where the rig stands in a margin for fit's 1 GiB, the report says so:
/// both baselines' layers follow from it.
fn rig_margin_note(margin: u64, device_total: Option<u64>) -> Option<Note> {
    use crate::engine::predict::{DEFAULT_FIT_MARGIN, RIG_FIT_MARGIN_ENV};
    (margin != DEFAULT_FIT_MARGIN).then(|| {
        #[allow(clippy::cast_precision_loss)]
        let share = device_total.filter(|t| *t > 0).map_or_else(String::new, |t| {
            format!(", {:.1}% of the device, where 1 GiB is 4.2% of a 24 GiB card", 100.0 * margin as f64 / t as f64)
        });
        Note::prediction(format!(
            "llama.cpp's default and Ollama's run are priced with fit keeping {} free per device ({RIG_FIT_MARGIN_ENV}{share}), not its 1 GiB: the rig's card scaled to a real one",
            crate::model::human_bytes(margin)
        ))
    })
}

/// The worker executor for this context's trials (the depth cache shared).
fn executor<'s>(sh: &'s Shared<'_>, at: ContextRun) -> WorkerExecutor<'s> {
    let mut base = base_spec(sh.opts.info(), sh.opts.settings(), at, sh.op_offload);
    base.depth_cache.clone_from(&sh.depth_cache);
    let devices = sh.opts.caps().iter().map(|d| d.device.clone()).collect();
    WorkerExecutor::new(&sh.runner, base, devices)
}

/// The split across several devices at the search's context, priced by
/// the dry run in a child (with llama.cpp's own fit for the same caps).
fn split(sh: &Shared<'_>, plan: &Plan, search: &mut Search<'_>) -> Result<split::SplitFound> {
    let (info, s, at) = (sh.opts.info(), sh.opts.settings(), search.at());
    let inp = split::SplitInputs {
        n_ctx: at.n_ctx,
        devs: sh.opts.caps(),
        full: plan.full,
        threads: s.backend.n_threads,
        rpc: &s.backend.rpc,
        op_offload: sh.op_offload,
        output_layers: info.output_work_layers(),
        is_moe: info.is_moe(),
        #[allow(clippy::cast_precision_loss)]
        layer_bytes: info.total_layer_bytes() as f64 / f64::from(info.n_layer_trunk().max(1)),
        links: split::links(sh.opts.caps(), &sh.hw.rpc_servers, (info.n_embd, info.n_vocab), at.n_ubatch),
        workload: at.workload((&s.workload, &s.backend)),
    };
    // A kept trial worker holds its connection to each server, and a
    // server serves one client at a time: end it before asking them.
    search.release_worker();
    if let Some(dead) = crate::rpc::dead_server(&s.backend.rpc) {
        let n = sh.opts.caps().len();
        return Ok(split::SplitFound {
            notes: vec![Note::split(format!("the split across {n} devices was not tuned: {dead}"))],
            ..split::SplitFound::default()
        });
    }
    // Splits priced with a KV cache type and FFN layers kept on the CPU; a
    // failed dry run leaves them unpriced, and the first failure is said.
    let mut found = split::split_stage(search, &inp)?;
    // A quantized cache's quality does not depend on where the layers run:
    // scored with every layer on this CPU (the scoring child has no RPC servers).
    let bound = (quality::speeds_at(&search.trials, 0), quality::bound_s(&search.trials));
    let mut assess = |kv| quality::kv_quality(&sh.runner, info, kv, 0, (s, at.depth), sh.op_offload, bound);
    hatch::run(Topology::Several { inp: &inp, found: &mut found }, search, &mut assess)?;
    split::split_modes(search, &inp, &mut found)?;
    found.notes.extend(search.take_unpriced().map(|e| Note::split(dry_run_failed("splits", &e))));
    let margins = split::fit_margins(sh.opts.caps(), &sh.hw.llama_devices);
    // Without llama.cpp's own split the pairing has no default to run: said, not swallowed.
    let fit = match search.price_fit_split(&margins) {
        Ok(fit) => fit,
        Err(e) => {
            found.notes.push(Note::split(dry_run_failed("split llama.cpp's fit would choose", &format!("{e:#}"))));
            None
        }
    };
    found.against = split::against_llama(search, &mut found, &inp, fit.as_ref())?;
    found.report = split::report(sh.opts.caps(), &found, fit, &sh.hw.rpc_servers);
    Ok(found)
}

/// The escape hatches at the search's context: priced by the dry run in a
/// child, the KV cache's quality measured in another.
fn hatches(
    sh: &Shared<'_>,
    policy: &MemoryPolicy,
    plan: &Plan,
    search: &mut Search<'_>,
    layer_split: &crate::profile::Recommendation,
) -> Result<hatch::Hatches> {
    let (info, s, at) = (sh.opts.info(), sh.opts.settings(), search.at());
    let h = hatch::HatchInputs {
        full: plan.full,
        n_layer: plan.n_layer,
        is_moe: plan.is_moe,
        cap: policy.cap_bytes,
        n_ctx: at.n_ctx,
        kv: s.workload.kv_type,
        threads: s.backend.n_threads,
        op_offload: sh.op_offload,
        rpc: s.backend.rpc.clone(),
        grid: plan.full_grid.clone(),
        workload: at.workload((&s.workload, &s.backend)),
    };
    // Quality does not depend on where the layers run: score at the fastest measured split.
    let ngl = layer_split.placement.n_gpu_layers;
    let bound = (quality::speeds_at(&search.trials, ngl), quality::bound_s(&search.trials));
    let mut assess = |kv: crate::placement::KvType| {
        quality::kv_quality(&sh.runner, info, kv, ngl, (s, at.depth), sh.op_offload, bound)
    };
    let mut found = hatch::run(Topology::One { h: &h, layer_split }, search, &mut assess)?;
    let failed = search.take_unpriced();
    found.notes.extend(failed.map(|e| Note::prediction(dry_run_failed("escape hatches", &e)).at(at.n_ctx)));
    Ok(found)
}

/// The answer with the draft option chosen beside it: its placement, and
/// the speed and memory its loads measured.
fn with_chosen(
    mut r: crate::profile::Recommendation,
    chosen: &crate::profile::DraftOption,
) -> crate::profile::Recommendation {
    if chosen.placement.n_gpu_layers != r.placement.n_gpu_layers {
        // A trade (target layers given up for the draft): the verdicts on
        // the old layers (llama.cpp's default or Ollama's own run as fast,
        // Ollama's whole-layer split) are not this answer's.
        (r.llama_default, r.ollama_own_run) = (false, false);
        let p = &chosen.placement;
        if p.n_cpu_moe == 0 && p.n_cpu_ffn == 0 && p.cpu_overrides.is_empty() {
            r.ollama_num_gpu = None;
        }
    }
    r.set_placement(&chosen.placement);
    (r.tg_ts, r.pp_ts, r.measured) = (chosen.tg_ts, None, true);
    #[allow(clippy::cast_precision_loss)]
    let mem = chosen.device_bytes.map(|b| b as f64);
    r.mem_bytes = mem;
    r
}

/// A confirmation whose dry run failed: measured as it was (a trial over
/// the cap is recorded as such, never recommended).
fn confirmation_unpriced(e: &str) -> Note {
    Note::prediction(format!("llama.cpp's dry run of a confirmation failed ({e}): it was measured without a price"))
}

fn dry_run_failed(what: &str, e: &str) -> String {
    format!("llama.cpp's dry run of the {what} failed ({e}): the options it could not price have no price")
}

/// What the search is asked, from the model, the settings and the machine
/// (the dry run's answers are added by the caller).
fn plan_for(info: &ModelInfo, s: &Settings, hw: &Hardware, no_gpu: bool) -> Plan {
    let full_grid = match &s.policy.grid {
        Some(g) => plan::normalize(g, info.n_layer_full),
        None => plan::default_grid(info.n_layer_full, 10),
    };
    Plan {
        full: info.n_layer_full,
        n_layer: info.n_layer,
        is_moe: info.is_moe(),
        full_grid,
        grid_mode: !(s.policy.search == crate::types::SearchMode::Adaptive && s.policy.grid.is_none()),
        no_gpu,
        predicted_over: Vec::new(),
        n_max: info.n_layer_full,
        // The expected faster end first, so the other can be raced.
        top_first: hw.llama_devices.iter().any(|d| d.is_offload_target() && !d.is_software_renderer()),
        cpu: hw.cpu.clone(),
    }
}

/// The trial spec every candidate starts from: the settings' workload at context `at`.
pub(super) fn base_spec(info: &ModelInfo, s: &Settings, at: ContextRun, op_offload: bool) -> TrialSpec {
    TrialSpec {
        model: info.path.clone(),
        placement: at
            .workload((&s.workload, &s.backend))
            .with_layers(0, s.backend.n_threads, Some(at.n_ctx))
            .with_kv(s.workload.kv_type)
            .with_op_offload(op_offload)
            .with_split(&[], &s.backend.rpc),
        n_prompt: s.measure.n_prompt,
        n_gen: s.measure.n_gen,
        n_depth: at.depth,
        depth_cache: None,
        kv_base: s.workload.kv_type,
        repetitions: s.measure.repetitions,
        warmup: s.measure.warmup,
        seed: 1234,
        sample_interval_ms: s.policy.sample_interval_ms,
        race: None,
        baseline: false,
        n_streams: s.goal.streams(),
    }
}

#[cfg(test)]
#[path = "property.rs"]
mod property;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_quality_check_is_counted_once_however_many_options_carry_its_score() {
        let q = crate::types::Quality { wall_s: 35.0, ..crate::types::Quality::passing() };
        let option = |kind| crate::profile::PlacementOption {
            kind,
            placement: crate::placement::Placement::default()
                .with_layers(9, 4, Some(4096))
                .with_kv(crate::placement::KvType::Q8_0),
            measured: kind == crate::profile::HatchKind::KvCache,
            tg_ts: None,
            pp_ts: None,
            tg_se_ts: None,
            pp_se_ts: None,
            device_bytes: None,
            fits: true,
            quality: Some(q.clone()),
            recommended: false,
            note: String::new(),
        };
        let options = [option(crate::profile::HatchKind::KvCache), option(crate::profile::HatchKind::ShorterContext)];
        assert!((quality_seconds(&options, None) - 35.0).abs() < 1e-9);
        assert!(quality_seconds(&[], None).abs() < 1e-9);
    }

    /// An answer measured over the cap (a path that forgot a cap) is never
    /// the answer: the whole-layer split is, and a note says why; with
    /// neither admitted, the tune fails rather than emit either.
    #[test]
    fn an_answer_the_gate_refuses_gives_way_to_the_whole_layer_split() {
        use crate::placement::{KvType, Placement};
        use crate::profile::admitted::tests::trial;
        let mib = 1024.0 * 1024.0;
        let mut hatch = crate::tune::worlds::recommendation();
        hatch.set_placement(&Placement::default().with_layers(19, 2, Some(32768)).with_kv(KvType::Q8_0));
        let split = crate::tune::worlds::recommendation();
        let trials = [trial(&hatch.runs(), 120.0 * mib, true), trial(&split.runs(), 80.0 * mib, false)];
        let gate = crate::profile::Gate {
            trials: &trials,
            predicted: &[],
            cap_bytes: Some(100.0 * mib),
            unaccounted: 0,
            host_bytes: None,
            max_power_w: None,
            drafts: &[],
        };
        let (a, note) = admit(&gate, hatch.clone(), &split, KvType::F16).unwrap();
        assert_eq!(a.placement.n_gpu_layers, 7, "the whole-layer split");
        let note = note.unwrap().to_string();
        assert!(note.contains("refused by the gate (measured at 120.00 MiB, over the cap of 100.00 MiB)"), "{note}");
        let both_over = [trial(&hatch.runs(), 120.0 * mib, true), trial(&split.runs(), 130.0 * mib, true)];
        let gate = crate::profile::Gate { trials: &both_over, ..gate };
        let e = admit(&gate, hatch, &split, KvType::F16).unwrap_err().to_string();
        assert!(e.contains("no answer at the 32768-token context could be admitted"), "{e}");
    }

    /// A failed dry run's note names the stage, its first error, and what it left unpriced.
    #[test]
    fn a_failed_dry_run_is_said_with_its_stage_and_error() {
        let said = dry_run_failed("escape hatches", "worker killed by signal 6");
        assert_eq!(
            said,
            "llama.cpp's dry run of the escape hatches failed (worker killed by signal 6): the options it could not price have no price"
        );
    }

    /// Issue 54 item 9: on the rig, fit's margin for the baselines is the
    /// share of the card 1 GiB is of a 24 GiB one, and the report says so;
    /// at llama.cpp's own 1 GiB nothing is said.
    #[test]
    fn the_rigs_scaled_fit_margin_is_said_and_llama_cpps_own_is_not() {
        use crate::engine::predict::DEFAULT_FIT_MARGIN;
        assert!(rig_margin_note(DEFAULT_FIT_MARGIN, Some(2048 << 20)).is_none());
        let said = rig_margin_note(85 << 20, Some(2048 << 20)).unwrap().to_string();
        assert!(said.contains("keeping 85.00 MiB free per device"), "{said}");
        assert!(said.contains("NGL_TUNE_RIG_FIT_MARGIN_MIB, 4.2% of the device"), "{said}");
    }
}
