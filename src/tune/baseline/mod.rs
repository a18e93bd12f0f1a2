//! The answer against what users get without flags: llama.cpp's default
//! placement (its fit, with its own 1 GiB margin per device) measured at
//! the same depth, alternated with the recommendation (A/B/A/B, as
//! hyperfine compares commands) so the machine's drift cancels. The unit
//! of the statistic is the trial (one load): each pair gives one log ratio
//! of the two trials' speeds, and a Student t interval over the pairs says
//! faster, slower or a tie. The recommendation is kept only when it is
//! faster beyond that interval; otherwise llama.cpp's default is
//! recommended (unless it is over the user's cap).

pub mod against;

use anyhow::Result;

use super::plan::{Candidate, ContextRun};
use super::search::Search;
use crate::engine::predict::LlamaFit;
use crate::placement::{KvType, Placement};
use crate::profile::{DefaultComparison, ProfileTrial, Recommendation, Settings, Verdict};
use crate::types::{Role, Scoring, TrialStatus};

/// Alternated pairs (A, B) measured: each side loads and runs its
/// repetitions this many times. Three pairs is the fewest whose t interval
/// (2 degrees of freedom, t = 4.30) can call a 10% difference under 2%
/// trial-to-trial noise; two (t = 12.7) almost never could.
pub const PAIRS: u32 = 3;

/// The most pairs a comparison runs: where [`PAIRS`] leave it not decided,
/// one more pair at a time up to this many.
pub const MAX_PAIRS: u32 = 5;

/// The resolution of a tie: the interval inside [1/1.1, 1.1] rules out a
/// 10% difference either way. An interval that covers 1 and reaches past
/// it is not decided: the pairs could not tell (a noisy machine), which is
/// not the same as "the same speed".
pub const TIE_RESOLUTION: f64 = 1.1;

/// A ratio of two mean speeds and its 95% interval, as the interval
/// itself: the t interval on the log ratios mapped back, so it is not
/// symmetric about the ratio (a half width would misstate one end).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    pub ratio: f64,
    /// The interval's lower end.
    pub lo: f64,
    /// The interval's upper end.
    pub hi: f64,
}

impl Ratio {
    /// The ratio of `a` over `b` from paired measurements `(a_i, b_i)`
    /// (each a trial's mean speed or score): the geometric mean of the
    /// per-pair ratios and its 95% Student t interval (on the log ratios,
    /// mapped back). `None` without two complete pairs.
    #[must_use]
    pub fn paired(pairs: &[(f64, f64)]) -> Option<Ratio> {
        use statrs::distribution::{ContinuousCDF, StudentsT};
        let logs: Vec<f64> = pairs.iter().filter(|(a, b)| *a > 0.0 && *b > 0.0).map(|(a, b)| (a / b).ln()).collect();
        if logs.len() < 2 {
            return None;
        }
        #[allow(clippy::cast_precision_loss)]
        let n = logs.len() as f64;
        let (m, sd) = (crate::stats::mean(&logs), crate::stats::stddev(&logs));
        let t = StudentsT::new(0.0, 1.0, n - 1.0).ok()?.inverse_cdf(0.975);
        let h = t * sd / n.sqrt();
        Some(Ratio { ratio: m.exp(), lo: (m - h).exp(), hi: (m + h).exp() })
    }

    /// Half the interval's width: what profiles before the interval kept.
    #[must_use]
    pub fn half_width(self) -> f64 {
        (self.hi - self.lo) / 2.0
    }

    /// Faster where the whole interval is above 1, slower where it is all
    /// below, a tie where it covers 1 within [`TIE_RESOLUTION`], else not
    /// decided: the t interval's own ends, never the ratio plus or minus a
    /// half width.
    #[must_use]
    pub fn verdict(self) -> Verdict {
        if self.lo > 1.0 {
            Verdict::Faster
        } else if self.hi < 1.0 {
            Verdict::Slower
        } else if self.lo >= 1.0 / TIE_RESOLUTION && self.hi <= TIE_RESOLUTION {
            Verdict::Tie
        } else {
            Verdict::NotDecided
        }
    }
}

/// llama.cpp's default placement here, as `llama-server -m MODEL` runs
/// it: its fit's layers (all as full offload), the tensors it keeps on the
/// CPU, the context it leaves (`-c 0`: the training context, shrunk where
/// memory is short), llama.cpp's thread rule (`threads`), the base KV type.
/// `Err` says why it cannot be compared (no answer, a context too small
/// for the workload's depth, or tensors moved where one device's trial
/// cannot put them).
///
/// # Errors
/// The reason, in words.
pub fn default_candidate(
    fit: Option<&LlamaFit>,
    (s, at): (&Settings, ContextRun),
    full: u32,
    threads: u32,
) -> Result<Candidate, String> {
    let fit = fit.ok_or("llama.cpp's dry run gave no default placement")?;
    if let Some(e) = &fit.error {
        return Err(format!("llama.cpp's fit found no default placement ({e})"));
    }
    let ngl = fit.n_gpu_layers.ok_or("llama.cpp's fit gave no layer count")?;
    let ctx = fit.n_ctx.unwrap_or(at.n_ctx);
    // Every stream it serves at once (at most its 4 slots) decodes at the
    // depth, all in its one unified cache.
    let needs = (at.depth + s.measure.longest_test()) * s.goal.streams().min(crate::placement::SERVER_SLOTS);
    if ctx < needs {
        return Err(format!(
            "without flags llama.cpp would run a {ctx}-token context here: too small for the workload ({needs} tokens), not compared"
        ));
    }
    let pairs = fit.override_pairs();
    let spill = crate::placement::FitSpill::of(&pairs).ok_or_else(|| {
        let moved: Vec<String> = pairs.iter().map(|(p, b)| format!("{p}={b}")).collect();
        format!("llama.cpp's fit moves tensors as one trial here cannot ({}): not compared", moved.join(","))
    })?;
    Ok(Candidate { spill, ctx, mmproj_cpu: !fit.mmproj_offload, ..Candidate::layers(fit_ngl(ngl, full), threads) })
}

/// fit's layer count as a candidate's: -1 (every layer) as full offload.
fn fit_ngl(ngl: i32, full: u32) -> u32 {
    if ngl < 0 {
        full
    } else {
        u32::try_from(ngl).unwrap_or(0).min(full)
    }
}

/// Why `theirs` is over the user's cap in these paired trials (more
/// memory than the cap, or out of memory on the device), if it is: such a
/// default is measured and reported, never recommended.
#[must_use]
pub fn over_cap(trials: &[ProfileTrial], theirs: Candidate, cap: Option<f64>, name: &str) -> Option<String> {
    let mine: Vec<&ProfileTrial> =
        trials.iter().filter(|t| t.role == Role::Paired && theirs.is(&t.result.spec)).collect();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let bytes = |b: f64| crate::model::human_bytes(b.max(0.0) as u64);
    let over = mine.iter().filter(|t| t.over_cap).filter_map(|t| t.mem_bytes).reduce(f64::max);
    let cap = cap.map_or(String::new(), |c| format!(" of {}", bytes(c)));
    if let Some(b) = over {
        return Some(format!("{name} takes {}, over the cap{cap}: measured and reported, never recommended", bytes(b)));
    }
    mine.iter()
        .any(|t| t.result.status == TrialStatus::Oom)
        .then(|| format!("{name} ran out of device memory here: reported, never recommended"))
}

/// One side's completed paired trials, in the order they ran.
fn completed(trials: &[ProfileTrial], c: Candidate) -> impl Iterator<Item = &ProfileTrial> {
    trials.iter().filter(move |t| t.role == Role::Paired && t.result.status == TrialStatus::Ok && c.is(&t.result.spec))
}

/// The samples (t/s) of one side's paired trials, for pp or tg.
fn samples(trials: &[ProfileTrial], c: Candidate, pp: bool) -> Vec<f64> {
    completed(trials, c).filter_map(|t| t.result.test(pp)).flat_map(|x| x.samples_ts.iter().copied()).collect()
}

/// The mean rate (t/s) of a candidate's paired trials, pp or tg, where measured.
#[must_use]
pub fn paired_mean(trials: &[ProfileTrial], c: Candidate, pp: bool) -> Option<f64> {
    let v = samples(trials, c, pp);
    (!v.is_empty()).then(|| crate::stats::mean(&v))
}

/// Mean milliseconds per image of a candidate's paired trials, where measured.
fn image_ms(trials: &[ProfileTrial], c: Candidate) -> Option<f64> {
    let v: Vec<f64> =
        completed(trials, c).filter_map(|t| t.result.image.as_ref().map(crate::types::ImageTest::avg_ms)).collect();
    (!v.is_empty()).then(|| crate::stats::mean(&v))
}

/// Racing thresholds for the default from the recommendation's paired
/// speeds so far: the objective's test alone, at the search's share.
fn race_against(
    trials: &[ProfileTrial],
    mine: Candidate,
    objective: crate::types::Objective,
) -> Option<crate::types::Race> {
    let mean = |pp: bool| {
        let v = samples(trials, mine, pp);
        (!v.is_empty()).then(|| crate::stats::mean(&v) * super::search::RACE_SHARE)
    };
    objective.race(mean)
}

/// Who the answer is paired against: what users get without ngl-tune.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opponent {
    /// `llama-server -m MODEL`: its fit (`-c 0`, 1 GiB margin), its own
    /// batch and 4 slots over one unified cache, llama.cpp's thread rule.
    LlamaDefault,
    /// What Ollama starts llama-server with, `num_gpu` unset: its fit at
    /// Ollama's context, batch, slots and fit target. The answer's Ollama
    /// form (its whole layers, `num_gpu`) is what is paired with it.
    OllamaRun,
}

impl Opponent {
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Opponent::LlamaDefault => "llama.cpp's default",
            Opponent::OllamaRun => "Ollama's own run (num_gpu unset)",
        }
    }

    /// The side of the answer paired with it: its Ollama form runs the
    /// cache Ollama's server runs (`server_kv`, the workload's), never a
    /// quantized one only the server's environment could set.
    fn mine(self, rec: &Recommendation, n_ctx: u32, server_kv: KvType) -> Candidate {
        match self {
            Opponent::LlamaDefault => Candidate { ctx: n_ctx, ..Candidate::from(&rec.placement) },
            Opponent::OllamaRun => Candidate {
                ctx: n_ctx,
                kv: Some(server_kv),
                ..Candidate::layers(rec.ollama_layers(), rec.placement.n_threads)
            },
        }
    }
}

/// The opponent's placement as it runs: its layers, threads, context,
/// fit's CPU tensors and where the projector loads; llama.cpp's own batch,
/// flash attention and slots (4, unified) for its default, the workload's for
/// Ollama's run (`workload`: the context's, `ContextRun::workload`); the
/// base KV type `kv`.
fn default_placement(workload: Placement, kv: KvType, theirs: &Candidate) -> Placement {
    let p = Placement { cpu_overrides: theirs.spill.patterns(), ..workload }
        .with_layers(theirs.ngl, theirs.threads, Some(theirs.ctx))
        .with_kv(kv);
    let p = if theirs.stock { p.with_server_defaults() } else { p };
    Placement { mmproj_offload: !theirs.mmproj_cpu, ..p }
}

/// Why `name` is over the cap by its dry run, if it is, and what follows
/// (`then`): it is not paired.
fn priced_over_cap(name: &str, predicted: Option<u64>, cap: Option<f64>, then: &str) -> Option<String> {
    #[allow(clippy::cast_precision_loss)]
    let (p, cap) = predicted.zip(cap).filter(|(p, cap)| *p as f64 > *cap)?;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let cap = crate::model::human_bytes(cap.max(0.0) as u64);
    Some(format!("{name} takes {} by its dry run, over the cap of {cap}: {then}", crate::model::human_bytes(p)))
}

/// Measures the answer (its form `opponent` pairs) and `opponent`
/// alternately at the search's context and depth, and judges the difference.
///
/// # Errors
/// What the executor returns (an interrupt).
pub fn compare(
    search: &mut Search<'_>,
    rec: &Recommendation,
    (fit, opponent): (Option<&LlamaFit>, Opponent),
    full: u32,
) -> Result<DefaultComparison> {
    let (s, at) = (search.settings(), search.at());
    let mut mine = opponent.mine(rec, at.n_ctx, s.workload.kv_type);
    // Ollama with num_gpu below every layer keeps the projector on the CPU
    // (llm/llama_server.go, `shouldDisableMMProjOffload`: "partial-text-offload").
    mine.mmproj_cpu = opponent == Opponent::OllamaRun && s.backend.mmproj.is_some() && mine.ngl < full;
    let mut out = DefaultComparison::unmeasured(at.depth);
    let stock = opponent == Opponent::LlamaDefault;
    let theirs = match default_candidate(fit, (s, at), full, crate::engine::llama_default_threads()) {
        Ok(c) => Candidate { stock, upstream: true, ..c },
        Err(why) => {
            out.note = why;
            return Ok(out);
        }
    };
    out.placement = Some(default_placement(at.workload((&s.workload, &s.backend)), s.workload.kv_type, &theirs));
    out.predicted_bytes = fit.and_then(|f| f.predicted_device_bytes);
    let rival = "reported, not paired as a rival";
    if let Some(why) = priced_over_cap(opponent.name(), out.predicted_bytes, search.cap_bytes(), rival) {
        out.over_cap = true;
        out.note = why;
        return Ok(out);
    }
    if theirs == mine {
        out.verdict = Verdict::Same;
        out.note = format!("the answer is what {} runs here", opponent.name());
        return Ok(out);
    }
    let start = search.trials.len();
    search.baseline_bytes = out.predicted_bytes;
    let cut = pair(search, mine, theirs, &mut out)?;
    search.baseline_bytes = None;
    out.mem_bytes = completed(&search.trials[start..], theirs).filter_map(|t| t.mem_bytes).reduce(f64::max);
    let name = opponent.name();
    if let Some(why) = over_cap(&search.trials[start..], theirs, search.cap_bytes(), name) {
        out.over_cap = true;
        out.note = why;
    } else {
        out.note = match out.verdict {
            Verdict::Faster if out.by_race => format!(
                "{name} was cut short in every pair, below half the answer's speed each time (the race's test; the interval of the few tokens it timed is too wide to say it)"
            ),
            Verdict::Faster if cut => format!("{name} was cut short, far behind: its rate is of the tokens timed"),
            Verdict::Faster => String::new(),
            Verdict::Tie if opponent == Opponent::LlamaDefault => {
                format!("within the noise of {name}, which runs its own context, slots and threads")
            }
            Verdict::Slower if opponent == Opponent::LlamaDefault => {
                format!("{name} was faster, at its own context, slots and threads")
            }
            Verdict::NotDecided if opponent == Opponent::LlamaDefault => format!(
                "not decided against {name} in {} pairs (the interval covers 1 and reaches past a 10% difference)",
                out.pairs
            ),
            Verdict::Tie => format!("within the noise of {name}: {name} is recommended"),
            Verdict::NotDecided => format!(
                "not decided against {name} in {} pairs (the interval covers 1 and reaches past a 10% difference): {name} is recommended",
                out.pairs
            ),
            Verdict::Slower => format!("{name} was faster: it is recommended"),
            _ => "a side of the pairs did not complete: not judged".into(),
        };
    }
    Ok(out)
}

/// Whether pair `i` runs the answer first: pair by pair AB BA BA AB BA AB
/// AB BA (the Thue-Morse order, ABBA BAAB trial by trial), so that a
/// steady drift of the machine (a card warming, a neighbour's load
/// fading) adds to one side in as many pairs as it adds to the other.
#[must_use]
pub fn answer_first(i: u32) -> bool {
    i.count_ones().is_multiple_of(2)
}

/// Measures `mine` and `theirs` in [`PAIRS`] pairs, each in the order
/// [`answer_first`] gives it and each trial in a load of its own (`theirs`
/// raced against `mine`'s speed in the pairs before), and writes the
/// ratios, their intervals and the verdict by the objective into `out`
/// (not measured where a side did not complete). A pair is the two
/// trials it ran, matched by the pair, never by how many completed. True
/// where `theirs` was cut short.
///
/// # Errors
/// What the executor returns (an interrupt).
pub fn pair(search: &mut Search<'_>, mine: Candidate, theirs: Candidate, out: &mut DefaultComparison) -> Result<bool> {
    let s = search.settings();
    search.progress.plan(u64::from(2 * PAIRS));
    // This comparison's trials only (the same side may be paired with another before).
    let start = search.trials.len();
    // A side that crashed (an RPC server that died and came back, say)
    // runs once more; the pair holds the side's last trial.
    let measure = |search: &mut Search<'_>, c: Candidate, race: Option<crate::types::Race>| -> Result<usize> {
        if search.measure(Role::Paired, c, race)?.result.status == TrialStatus::Crashed {
            search.measure(Role::Paired, c, race)?;
        }
        Ok(search.trials.len() - 1)
    };
    // Each pair's two trials, by index into `search.trials` (mine, theirs).
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    for i in 0..MAX_PAIRS {
        if i >= PAIRS {
            search.progress.plan(2);
        }
        // The other side far behind is cut short inside its first
        // repetition, as the search races: its verdict is clear at once.
        let (a, b) = if answer_first(i) {
            let a = measure(search, mine, None)?;
            let race = race_against(&search.trials[start..], mine, s.goal.objective);
            (a, measure(search, theirs, race)?)
        } else {
            let race = race_against(&search.trials[start..], mine, s.goal.objective);
            let b = measure(search, theirs, race)?;
            (measure(search, mine, None)?, b)
        };
        pairs.push((a, b));
        // Cut short in each of two pairs: the verdict below is already "faster"; a third changes nothing.
        let (done, cut) = cut_short(completed(&search.trials[start..], theirs));
        if pairs.len() >= 2 && done == pairs.len() && cut == done {
            search.progress.skip();
            search.progress.skip();
            break;
        }
        // Not decided after the pairs planned: one more pair, up to the most.
        if i + 1 >= PAIRS && judge(&search.trials, &pairs, s.scoring(), out) != Verdict::NotDecided {
            break;
        }
    }
    judge(&search.trials, &pairs, s.scoring(), out);
    // A side cut short in every pair ran below half of the other's speed
    // each time (the race's own test, as the search trusts it): the tokens
    // it timed before the cut are too few for the interval, the cut is not.
    let ok = |i: usize| Some(&search.trials[i]).filter(|t| t.result.status == TrialStatus::Ok);
    let (n, cut) = cut_short(pairs.iter().filter_map(|&(a, b)| ok(a).and(ok(b))));
    if cut == n && n >= 2 && out.verdict != Verdict::NotMeasured {
        out.by_race = out.verdict != Verdict::Faster;
        out.verdict = Verdict::Faster;
    }
    Ok(cut_short(completed(&search.trials[start..], theirs)).1 > 0)
}

/// The ratios of the `pairs` (indices into `trials`: mine, theirs) and
/// their intervals written into `out`, with the verdict by the objective
/// (`scoring`'s score; a side raced out far behind has no pp, so the tg
/// it was raced on judges it). A pair counts where both its trials completed.
fn judge(trials: &[ProfileTrial], pairs: &[(usize, usize)], scoring: Scoring, out: &mut DefaultComparison) -> Verdict {
    out.pairs = u32::try_from(pairs.len()).unwrap_or(MAX_PAIRS);
    let ok = |i: usize| Some(&trials[i]).filter(|t| t.result.status == TrialStatus::Ok);
    let complete: Vec<(&ProfileTrial, &ProfileTrial)> =
        pairs.iter().filter_map(|&(a, b)| Some((ok(a)?, ok(b)?))).collect();
    let ratio = |f: &dyn Fn(&ProfileTrial) -> Option<f64>| {
        let pairs: Vec<(f64, f64)> = complete.iter().filter_map(|(x, y)| Some((f(x)?, f(y)?))).collect();
        Ratio::paired(&pairs)
    };
    let (tg, pp) =
        (ratio(&|t| t.result.test(false).map(|x| x.avg_ts)), ratio(&|t| t.result.test(true).map(|x| x.avg_ts)));
    (out.tg_ratio, out.tg_half_width, out.tg_interval) =
        (tg.map(|r| r.ratio), tg.map(Ratio::half_width), tg.map(|r| [r.lo, r.hi]));
    (out.pp_ratio, out.pp_half_width, out.pp_interval) =
        (pp.map(|r| r.ratio), pp.map(Ratio::half_width), pp.map(|r| [r.lo, r.hi]));
    let judged = ratio(&|t| scoring.trial(&t.result)).or(scoring.single_test(tg, pp));
    out.verdict = judged.map_or(Verdict::NotMeasured, Ratio::verdict);
    out.verdict
}

/// How many of `trials` there are, and how many were cut short by the race.
fn cut_short<'t>(trials: impl Iterator<Item = &'t ProfileTrial>) -> (usize, usize) {
    trials.fold((0, 0), |(n, cut), t| (n + 1, cut + usize::from(t.result.tests.iter().any(|x| x.stopped_early))))
}

/// fit's own placement at the user's context: the layers llama.cpp's fit
/// chooses for the user's cap there (`here`, its CPU tensors included),
/// at the user's context, slots, batch and KV type, on the tuned threads
/// (the fastest measured). `None` where fit gave none.
fn fit_candidate(here: Option<&LlamaFit>, threads: u32, full: u32) -> Option<Candidate> {
    let fit = here.filter(|f| f.error.is_none())?;
    let ngl = fit.n_gpu_layers?;
    let spill = crate::placement::FitSpill::of(&fit.override_pairs())?;
    Some(Candidate { spill, ..Candidate::layers(fit_ngl(ngl, full), threads) })
}

/// Where llama.cpp's default tied with the answer or beat it: fit's own
/// placement at the user's context ([`fit_candidate`]) paired with the
/// answer, and made the answer where it ties or wins, with the speeds
/// and memory its paired trials measured. The user's context, slots and
/// KV type stay as asked whatever wins. Returns what happened, in words.
///
/// # Errors
/// What the executor returns (an interrupt).
pub fn fit_here(
    search: &mut Search<'_>,
    rec: &mut Recommendation,
    here: Option<&LlamaFit>,
    full: u32,
) -> Result<String> {
    let at = search.at();
    let mine = Opponent::LlamaDefault.mine(rec, at.n_ctx, search.settings().workload.kv_type);
    let kv = Some(search.settings().workload.kv_type);
    let Some(theirs) = fit_candidate(here, rec.placement.n_threads, full).map(|c| Candidate { ctx: at.n_ctx, kv, ..c })
    else {
        return Ok("llama.cpp's fit gave no placement at your context: the tuned answer stays".into());
    };
    if theirs == mine {
        return Ok(format!("the answer is llama.cpp's fit at your context (-ngl {})", theirs.ngl));
    }
    let name = format!("llama.cpp's fit at your context (-ngl {})", theirs.ngl);
    let priced = here.and_then(|f| f.predicted_device_bytes);
    if let Some(why) = priced_over_cap(&name, priced, search.cap_bytes(), "not paired; the tuned answer stays") {
        return Ok(why);
    }
    let start = search.trials.len();
    let mut out = DefaultComparison::unmeasured(at.depth);
    pair(search, mine, theirs, &mut out)?;
    let trials = &search.trials[start..];
    let ratio = crate::report::placement::ratios(&out).join(", ");
    if let Some(why) = over_cap(trials, theirs, search.cap_bytes(), "llama.cpp's fit at your context") {
        return Ok(why);
    }
    if !matches!(out.verdict, Verdict::Tie | Verdict::Slower) {
        return Ok(format!(
            "llama.cpp's fit at your context (-ngl {}) paired with the answer: {ratio}, {}; the tuned answer stays",
            theirs.ngl,
            out.verdict.word()
        ));
    }
    let Some(ran) = completed(trials, theirs).last().map(|t| t.result.spec.placement.clone()) else {
        return Ok("llama.cpp's fit at your context did not complete: the tuned answer stays".into());
    };
    let mean = |pp: bool| paired_mean(trials, theirs, pp);
    let mem = completed(trials, theirs).filter_map(|t| t.mem_bytes).reduce(f64::max);
    *rec = Recommendation {
        ollama_num_gpu: None,
        tg_ts: mean(false),
        pp_ts: mean(true),
        img_ms: image_ms(trials, theirs),
        mem_bytes: mem,
        measured: true,
        ..rec.clone()
    };
    rec.set_placement(&ran);
    Ok(format!(
        "llama.cpp's fit at your context (-ngl {}) paired with the tuned answer: {ratio}, {}; it is the answer, at your context, slots and KV type",
        theirs.ngl,
        out.verdict.word()
    ))
}

#[cfg(test)]
mod tests;
