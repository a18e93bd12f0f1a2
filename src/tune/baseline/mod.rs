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
use crate::profile::{DefaultComparison, ProfileTrial, Recommendation, Settings, Verdict};
use crate::types::{KvType, Placement, Role, TrialStatus};

/// Alternated pairs (A, B) measured: each side loads and runs its
/// repetitions this many times. Three pairs is the fewest whose t interval
/// (2 degrees of freedom, t = 4.30) can call a 10% difference under 2%
/// trial-to-trial noise; two (t = 12.7) almost never could.
pub const PAIRS: u32 = 3;

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
    /// below, else a tie: the t interval's own ends, never the ratio
    /// plus or minus a half width.
    #[must_use]
    pub fn verdict(self) -> Verdict {
        if self.lo > 1.0 {
            Verdict::Faster
        } else if self.hi < 1.0 {
            Verdict::Slower
        } else {
            Verdict::Tie
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
    // Every stream decodes at the depth, all in the default's one cache.
    let needs = (at.depth + s.measure.longest_test()) * s.goal.streams();
    if ctx < needs {
        return Err(format!(
            "without flags llama.cpp would run a {ctx}-token context here: too small for the workload ({needs} tokens), not compared"
        ));
    }
    let pairs = fit.override_pairs();
    let spill = crate::types::FitSpill::of(&pairs).ok_or_else(|| {
        let moved: Vec<String> = pairs.iter().map(|(p, b)| format!("{p}={b}")).collect();
        format!("llama.cpp's fit moves tensors as one trial here cannot ({}): not compared", moved.join(","))
    })?;
    let ngl = if ngl < 0 { full } else { u32::try_from(ngl).unwrap_or(0).min(full) };
    Ok(Candidate { spill, ctx, mmproj_cpu: !fit.mmproj_offload, ..Candidate::layers(ngl, threads) })
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
    Some(match objective {
        // A slower side may draw less power: not cut for speed.
        crate::types::Objective::Energy => return None,
        crate::types::Objective::Pp => {
            crate::types::Race { pp_below_ts: mean(true), tg_below_ts: None, skip_rest: true }
        }
        _ => crate::types::Race { pp_below_ts: None, tg_below_ts: mean(false), skip_rest: true },
    })
}

/// Who the answer is paired against: what users get without ngl-tune.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opponent {
    /// `llama-server -m MODEL`: its fit (`-c 0`, 1 GiB margin), its own
    /// batch and one sequence, llama.cpp's thread rule.
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
/// flash attention and one sequence for its default, the workload's for
/// Ollama's run (`workload`: the context's, `ContextRun::workload`); the
/// base KV type `kv`.
fn default_placement(workload: Placement, kv: KvType, theirs: &Candidate) -> Placement {
    let p = Placement { cpu_overrides: theirs.spill.patterns(), ..workload }
        .with_layers(theirs.ngl, theirs.threads, Some(theirs.ctx))
        .with_kv(kv);
    let p = if theirs.stock { p.with_server_defaults() } else { p };
    Placement { mmproj_offload: !theirs.mmproj_cpu, ..p }
}

/// Why `opponent` is over the cap by its dry run, if it is: not paired.
fn priced_over_cap(opponent: Opponent, predicted: Option<u64>, cap: Option<f64>) -> Option<String> {
    #[allow(clippy::cast_precision_loss)]
    let (p, cap) = predicted.zip(cap).filter(|(p, cap)| *p as f64 > *cap)?;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let cap = crate::model::human_bytes(cap.max(0.0) as u64);
    Some(format!(
        "{} takes {} by its dry run, over the cap of {cap}: reported, not paired as a rival",
        opponent.name(),
        crate::model::human_bytes(p)
    ))
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
    if let Some(why) = priced_over_cap(opponent, out.predicted_bytes, search.cap_bytes()) {
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
            Verdict::Tie => format!("within the noise of {name}: {name} is recommended"),
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
    for i in 0..PAIRS {
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
    }
    out.pairs = u32::try_from(pairs.len()).unwrap_or(PAIRS);
    let ok = |i: usize| Some(&search.trials[i]).filter(|t| t.result.status == TrialStatus::Ok);
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
    // Judged on the objective's score; a side raced out far behind has no
    // pp, so the tg it was raced on judges it.
    let judged = ratio(&|t| s.scoring().trial(&t.result)).or(match s.goal.objective {
        crate::types::Objective::Pp => pp,
        _ => tg,
    });
    out.verdict = judged.map_or(Verdict::NotMeasured, Ratio::verdict);
    // A side cut short in every pair ran below half of the other's speed
    // each time (the race's own test, as the search trusts it): the tokens
    // it timed before the cut are too few for the interval, the cut is not.
    let (n, cut) = cut_short(complete.iter().map(|(_, b)| *b));
    if cut == n && n >= 2 && out.verdict != Verdict::NotMeasured {
        out.by_race = out.verdict != Verdict::Faster;
        out.verdict = Verdict::Faster;
    }
    Ok(cut_short(completed(&search.trials[start..], theirs)).1 > 0)
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
    let spill = crate::types::FitSpill::of(&fit.override_pairs())?;
    let ngl = if ngl < 0 { full } else { u32::try_from(ngl).unwrap_or(0).min(full) };
    Some(Candidate { spill, ..Candidate::layers(ngl, threads) })
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
    #[allow(clippy::cast_precision_loss)]
    if let (Some(p), Some(cap)) = (here.and_then(|f| f.predicted_device_bytes), search.cap_bytes()) {
        if p as f64 > cap {
            return Ok(format!(
                "llama.cpp's fit at your context (-ngl {}) is over the cap by its dry run: the tuned answer stays",
                theirs.ngl
            ));
        }
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
mod tests {
    use super::*;

    /// The pairing's statistic: the trial is the unit. Arms 1% apart under
    /// 2% trial-to-trial noise are a tie; 10% apart under the same noise,
    /// faster; and the order of the pairs does not matter.
    #[test]
    fn paired_trials_call_a_tie_within_their_noise_and_a_difference_beyond_it() {
        // 2% noise between loads: each trial's mean off by up to ±2%.
        let (a_noise, b_noise) = ([1.02, 0.99, 1.00], [0.99, 1.01, 1.02]);
        let arms =
            |by: f64| -> Vec<(f64, f64)> { (0..3).map(|i| (10.0 * by * a_noise[i], 10.0 * b_noise[i])).collect() };
        let close = Ratio::paired(&arms(1.01)).unwrap();
        assert_eq!(close.verdict(), Verdict::Tie, "1% under 2% noise: {close:?}");
        let apart = Ratio::paired(&arms(1.10)).unwrap();
        assert_eq!(apart.verdict(), Verdict::Faster, "10% under 2% noise: {apart:?}");
        assert!((apart.ratio - 1.10).abs() < 0.01, "{apart:?}");
        let slower = Ratio::paired(&arms(0.90)).unwrap();
        assert_eq!(slower.verdict(), Verdict::Slower, "{slower:?}");
        // Two loads a side 1% apart (the pooled repetitions of the statistic before called this
        // faster): with two pairs, t = 12.7.
        let pairs = [(10.1 * 1.005, 10.0 * 0.999), (10.1 * 1.002, 10.0 * 1.001)];
        assert_eq!(Ratio::paired(&pairs).unwrap().verdict(), Verdict::Tie, "two pairs: t = 12.7");
        assert_eq!(Ratio::paired(&pairs[..1]), None, "one pair has no spread");
    }

    #[test]
    fn a_ratio_is_judged_against_its_noise() {
        let pairs = |a: [f64; 4], b: [f64; 4]| a.into_iter().zip(b).collect::<Vec<_>>();
        let r = Ratio::paired(&pairs([30.0, 30.5, 29.5, 30.2], [10.0, 10.1, 9.9, 10.0])).unwrap();
        assert!((r.ratio - 3.0).abs() < 0.05 && r.half_width() < 0.1, "{r:?}");
        assert_eq!(r.verdict(), Verdict::Faster);
        let tie = Ratio::paired(&pairs([10.2, 9.6, 10.4, 9.9], [10.0, 10.3, 9.7, 10.1])).unwrap();
        assert_eq!(tie.verdict(), Verdict::Tie, "{tie:?}");
        let slower = Ratio::paired(&pairs([8.0, 8.1, 7.9, 8.0], [10.0, 10.1, 9.9, 10.0])).unwrap();
        assert_eq!(slower.verdict(), Verdict::Slower);
        assert_eq!(Ratio::paired(&[(1.0, 1.0)]), None, "one pair has no spread");
    }

    /// The t interval's own ends decide. Log ratios -0.40, -0.28, -0.16:
    /// the ratio is x0.756 and the interval [0.56, 1.02] reaches above 1,
    /// so a tie; the ratio plus the half width (x0.986) once called it slower.
    #[test]
    fn the_verdict_is_the_t_intervals_and_the_interval_is_printed_as_one() {
        let pairs: Vec<(f64, f64)> = [-0.4008f64, -0.28, -0.1592].iter().map(|l| (l.exp(), 1.0)).collect();
        let r = Ratio::paired(&pairs).unwrap();
        assert!(r.hi > 1.0 && r.hi < 1.03, "{r:?}");
        assert!(r.ratio + r.half_width() < 1.0, "the half width's reading: {r:?}");
        assert!(r.ratio - r.lo < r.hi - r.ratio, "skewed: {r:?}");
        assert_eq!(r.verdict(), Verdict::Tie, "{r:?}");
        let cmp = DefaultComparison {
            tg_ratio: Some(r.ratio),
            tg_half_width: Some(r.half_width()),
            tg_interval: Some([r.lo, r.hi]),
            ..DefaultComparison::unmeasured(0)
        };
        let line = crate::report::placement::ratios(&cmp).join(", ");
        assert_eq!(line, format!("tg x{:.2} [{:.2}, {:.2}]", r.ratio, r.lo, r.hi));
        assert!(!line.contains('±'), "{line}");
    }

    /// Pair by pair AB BA BA AB BA AB AB BA: trial by trial ABBA BAAB.
    #[test]
    fn pairs_run_in_counterbalanced_order() {
        let order: String = (0..8).map(|i| if answer_first(i) { "AB" } else { "BA" }).collect();
        assert_eq!(order, "ABBABAABBAABABBA");
    }

    /// A machine that slows 1% with every trial, and two sides that are the
    /// same speed: the answer always first read "faster, x1.010 ± 0.0005";
    /// counterbalanced, the drift is noise, not a verdict. Each paired
    /// trial is a load of its own.
    #[test]
    fn drift_between_trials_is_not_a_verdict_and_every_paired_trial_loads_anew() {
        use crate::tune::executor::fake::{Outcome, World};
        use crate::tune::worlds::settings;
        let s = settings();
        let calls = std::rc::Rc::new(std::cell::Cell::new(0i32));
        let seen = calls.clone();
        let mut world = World::new(move |_| {
            seen.set(seen.get() + 1);
            Outcome::Ok { tg: 20.0 * 0.99f64.powi(seen.get()), pp: 100.0 * 0.99f64.powi(seen.get()), mem: 1 << 20 }
        });
        let mut search = crate::tune::worlds::search(&s, &mut world, 1e12);
        let (mine, theirs) = (Candidate::layers(7, 2), Candidate::layers(31, 2));
        let mut out = DefaultComparison::unmeasured(0);
        pair(&mut search, mine, theirs, &mut out).unwrap();
        drop(search);
        assert_eq!(out.pairs, PAIRS);
        assert_ne!(out.verdict, Verdict::Faster, "{out:?}");
        assert_ne!(out.verdict, Verdict::Slower, "{out:?}");
        let ngls: Vec<u32> = world.measured.iter().map(|c| c.ngl).collect();
        assert_eq!(ngls, [7, 31, 31, 7, 31, 7], "AB BA BA");
        assert_eq!(world.releases, (0..6).collect::<Vec<_>>(), "a release before every paired trial");
    }

    /// A pair is its two trials: the answer's first trial out of memory
    /// drops pair 0 whole. Matched by how many completed, the answer's
    /// second trial would pair with the other side's first, across a jump
    /// of the machine's speed between pairs, and read x2.
    #[test]
    fn pairs_are_matched_by_the_pair_not_by_completion() {
        use crate::tune::executor::fake::{Outcome, World};
        use crate::tune::worlds::settings;
        let s = settings();
        let calls = std::rc::Rc::new(std::cell::Cell::new(0u32));
        let seen = calls.clone();
        let mut world = World::new(move |c| {
            let k = seen.get();
            seen.set(k + 1);
            // Trials AB BA BA: pair k / 2 runs at 10, 20, 40 t/s.
            let base = 10.0 * f64::from(1u32 << (k / 2));
            match (k, c.ngl) {
                (0, _) => Outcome::Oom,
                (3, 7) => Outcome::Ok { tg: base * 1.001, pp: base * 10.0 * 1.001, mem: 1 << 20 },
                (5, 7) => Outcome::Ok { tg: base * 0.999, pp: base * 10.0 * 0.999, mem: 1 << 20 },
                _ => Outcome::Ok { tg: base, pp: base * 10.0, mem: 1 << 20 },
            }
        });
        let mut search = crate::tune::worlds::search(&s, &mut world, 1e12);
        let mut out = DefaultComparison::unmeasured(0);
        pair(&mut search, Candidate::layers(7, 2), Candidate::layers(31, 2), &mut out).unwrap();
        assert_eq!(calls.get(), 6);
        let r = out.tg_ratio.unwrap();
        assert!((r - 1.0).abs() < 0.01, "pairs 1 and 2, each x1: {out:?}");
        assert_eq!(out.verdict, Verdict::Tie, "{out:?}");
    }

    /// The rig's first tune: llama.cpp's fit offloads every layer (its
    /// margin is of the device's free memory, not the user's cap), which
    /// is faster and over the cap; the tuned answer under the cap stays.
    #[test]
    fn a_default_over_the_cap_is_measured_and_never_recommended() {
        use crate::tune::executor::fake::{Outcome, World};
        use crate::tune::worlds::{recommendation, settings};
        let s = settings();
        let cap = 200.0 * 1024.0 * 1024.0;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let mut world = World::new(move |c| Outcome::Ok {
            tg: 10.0 + f64::from(c.ngl),
            pp: 100.0,
            mem: (f64::from(c.ngl) * 12.0 * 1024.0 * 1024.0) as u64,
        });
        let mut search = crate::tune::worlds::search(&s, &mut world, cap);
        let fit = LlamaFit { n_gpu_layers: Some(-1), n_ctx: Some(s.workload.n_ctx), ..LlamaFit::none(1 << 30) };
        let mut rec = recommendation();
        let cmp = against::llama_default(&mut search, &mut rec, (Some(&fit), None), 31).unwrap();
        assert_eq!(cmp.n_gpu_layers(), Some(31));
        assert_eq!(cmp.verdict, Verdict::Slower, "the default is faster: {cmp:?}");
        assert!(cmp.over_cap, "{cmp:?}");
        assert!(cmp.note.contains("over the cap of 200.00 MiB"), "{}", cmp.note);
        assert_eq!(rec.placement.n_gpu_layers, 7, "the answer under the cap stays");
        assert!(!rec.llama_default);
        assert!(search.trials.iter().any(|t| t.over_cap && t.result.spec.placement.n_gpu_layers == 31), "measured");
    }

    /// The rig's first report: llama.cpp's default (`-c 0`: here a
    /// 65536-token context, its own threads, one slot) ties with the
    /// answer. It stays the no-flags baseline in the report; the answer
    /// becomes fit's own layers at the user's 32768-token context, on the
    /// tuned threads, paired as such, and every form says that context.
    #[test]
    fn a_tie_with_the_default_never_changes_the_run_the_user_asked_for() {
        use crate::tune::executor::fake::{Outcome, World};
        use crate::tune::worlds::{recommendation, settings};
        let s = settings();
        let mut world = World::new(|_| Outcome::Ok { tg: 10.0, pp: 100.0, mem: 1 << 20 });
        let mut search = crate::tune::worlds::search(&s, &mut world, 1e12);
        let fit = LlamaFit { n_gpu_layers: Some(-1), n_ctx: Some(65536), ..LlamaFit::none(1 << 30) };
        let here = LlamaFit { n_gpu_layers: Some(20), n_ctx: Some(32768), ..LlamaFit::none(1 << 30) };
        let mut rec = recommendation();
        let cmp = against::llama_default(&mut search, &mut rec, (Some(&fit), Some(&here)), 31).unwrap();
        drop(search);
        assert_eq!(cmp.verdict, Verdict::Tie, "{cmp:?}");
        assert_eq!(cmp.placement.as_ref().and_then(|p| p.n_ctx), Some(65536), "the baseline as it ran");
        assert!(!rec.llama_default, "the default is never the answer");
        assert_eq!(
            (rec.placement.n_gpu_layers, rec.placement.n_ctx, rec.placement.n_threads),
            (20, Some(32768), 2),
            "fit's layers at the user's context, on the tuned threads"
        );
        assert!(rec.measured && rec.tg_ts == Some(10.0), "{rec:?}");
        assert!(
            rec.llama_cpp_args.contains("-c 32768") && rec.llama_cpp_args.contains("-t 2"),
            "{}",
            rec.llama_cpp_args
        );
        assert!(rec.modelfile.iter().any(|l| l == "PARAMETER num_ctx 32768"), "{:?}", rec.modelfile);
        assert!(rec.modelfile.iter().any(|l| l == "PARAMETER num_thread 2"), "{:?}", rec.modelfile);
        assert!(cmp.note.contains("fit at your context (-ngl 20)"), "{}", cmp.note);
        // fit's layers there, paired with the answer in counterbalanced pairs.
        let sides: Vec<u32> = world.measured.iter().map(|c| c.ngl).collect();
        assert_eq!(&sides[6..], [7, 20, 20, 7, 20, 7], "{sides:?}");
    }

    /// `--objective throughput --parallel 4`: a tie with the default keeps
    /// the four streams the user tuned (`-np 4`), never the default's one.
    #[test]
    fn a_tie_under_throughput_keeps_the_users_slots() {
        use crate::tune::executor::fake::{Outcome, World};
        use crate::tune::worlds::{recommendation, settings};
        let mut s = settings();
        s.goal.objective = crate::types::Objective::Throughput;
        s.goal.parallel_streams = Some(4);
        s.workload.n_parallel = 4;
        let mut world = World::new(|_| Outcome::Ok { tg: 40.0, pp: 100.0, mem: 1 << 20 });
        world.base.placement.n_parallel = 4;
        world.base.n_streams = 4;
        let mut search = crate::tune::worlds::search(&s, &mut world, 1e12);
        let fit = LlamaFit { n_gpu_layers: Some(-1), n_ctx: Some(65536), ..LlamaFit::none(1 << 30) };
        let here = LlamaFit { n_gpu_layers: Some(20), n_ctx: Some(32768), ..LlamaFit::none(1 << 30) };
        let mut rec = recommendation();
        rec.placement.n_parallel = 4;
        rec.render_forms();
        let cmp = against::llama_default(&mut search, &mut rec, (Some(&fit), Some(&here)), 31).unwrap();
        drop(search);
        assert_eq!(cmp.verdict, Verdict::Tie, "{cmp:?}");
        assert_eq!(cmp.placement.as_ref().map(|p| p.n_parallel), Some(1), "llama-server's own slot");
        assert_eq!((rec.placement.n_parallel, rec.placement.n_ctx), (4, Some(32768)), "{rec:?}");
        assert!(rec.llama_cpp_args.contains("-np 4"), "{}", rec.llama_cpp_args);
    }

    /// A side raced out in every pair (below half the other's speed each
    /// time) is slower, though the few tokens it timed scatter too much for
    /// the interval: the race's own test decides, after two pairs.
    #[test]
    fn a_side_cut_short_in_every_pair_is_slower_whatever_its_few_tokens_say() {
        use crate::tune::executor::fake::{Outcome, World};
        use crate::tune::worlds::{recommendation, settings};
        let s = settings();
        let calls = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let seen = calls.clone();
        let mut world = World::new(move |c| {
            let tg = if c.ngl == 7 {
                100.0
            } else {
                seen.set(seen.get() + 1);
                [10.0, 2.0, 25.0][(seen.get() - 1) % 3]
            };
            Outcome::Ok { tg, pp: 100.0, mem: 1 << 20 }
        });
        let mut search = crate::tune::worlds::search(&s, &mut world, 1e12);
        let fit = LlamaFit { n_gpu_layers: Some(0), n_ctx: Some(s.workload.n_ctx), ..LlamaFit::none(1 << 30) };
        let rec = recommendation();
        let cmp = compare(&mut search, &rec, (Some(&fit), Opponent::LlamaDefault), 31).unwrap();
        assert_eq!((calls.get(), cmp.pairs), (2, 2), "cut short in two pairs: no third");
        let (r, h) = (cmp.tg_ratio.unwrap(), cmp.tg_half_width.unwrap());
        assert!(r - h < 1.0, "the interval alone covers 1: {cmp:?}");
        assert_eq!(cmp.verdict, Verdict::Faster, "{cmp:?}");
        assert!(cmp.note.contains("cut short"), "{}", cmp.note);
    }

    #[test]
    fn the_default_is_fits_placement_at_its_own_context() {
        let s = crate::tune::worlds::settings();
        let at = ContextRun::of(&s, s.workload.n_ctx);
        let fit = |n: i32, ctx: u32| LlamaFit { n_gpu_layers: Some(n), n_ctx: Some(ctx), ..LlamaFit::none(1 << 30) };
        assert_eq!(
            default_candidate(Some(&fit(-1, s.workload.n_ctx)), (&s, at), 19, 4).unwrap().ngl,
            19,
            "-1: every layer"
        );
        let c = default_candidate(Some(&fit(7, 32768)), (&s, at), 19, 4).unwrap();
        assert_eq!((c.ngl, c.ctx, c.threads), (7, 32768, 4), "its layers, its context, llama.cpp's threads");
        let needs = s.depth_at(s.workload.n_ctx) + s.measure.longest_test();
        assert!(needs < s.workload.n_ctx);
        let shrunk = default_candidate(Some(&fit(19, needs)), (&s, at), 19, 4).unwrap();
        assert_eq!(shrunk.ctx, needs, "a smaller context that holds the workload is compared");
        let small = default_candidate(Some(&fit(19, needs - 1)), (&s, at), 19, 4).unwrap_err();
        assert!(small.contains("too small for the workload"), "{small}");
        assert!(default_candidate(None, (&s, at), 19, 4).is_err());
        // Four streams at the depth (--objective throughput --parallel 4) need four times the room.
        let mut four = s.clone();
        four.goal.objective = crate::types::Objective::Throughput;
        four.goal.parallel_streams = Some(4);
        let small = default_candidate(Some(&fit(19, 2 * needs)), (&four, at), 19, 4).unwrap_err();
        assert!(small.contains(&format!("({} tokens)", 4 * needs)), "{small}");
        assert!(default_candidate(Some(&fit(19, 4 * needs)), (&four, at), 19, 4).is_ok());
    }

    /// A MoE model's default: fit keeps every layer on the device and the
    /// last layers' experts on the CPU; the default runs exactly those
    /// overrides and its flags say so.
    #[test]
    fn the_default_runs_fits_expert_overrides() {
        use crate::engine::predict::FitOverride;
        let s = crate::tune::worlds::settings();
        let at = ContextRun::of(&s, s.workload.n_ctx);
        let moe = |il: u32| FitOverride {
            pattern: format!("blk\\.{il}\\.ffn_(up|down|gate_up|gate)_(ch|)exps"),
            buffer_type: "CPU".into(),
        };
        let fit = LlamaFit {
            n_gpu_layers: Some(-1),
            n_ctx: Some(s.workload.n_ctx),
            overrides: (14..18).map(moe).collect(),
            ..LlamaFit::none(1 << 30)
        };
        let c = default_candidate(Some(&fit), (&s, at), 19, 2).unwrap();
        assert_eq!((c.ngl, c.spill.first, c.spill.count), (19, 14, 4));
        assert_eq!(c.spill.patterns(), fit.overrides.iter().map(|o| o.pattern.clone()).collect::<Vec<_>>());
        let spec = crate::tune::executor::spec_of(&crate::engine::test_spec(), &[], c, None);
        assert_eq!(spec.placement.cpu_overrides.len(), 4);
        assert!(c.is(&spec) && !Candidate::layers(19, 2).is(&spec), "the spill is part of what ran");
        let flags = spec.placement.flags();
        assert!(
            flags.contains("-ot ") && flags.contains("blk\\.14\\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU"),
            "{flags}"
        );
        // Moved to another device's buffer: not a placement one device runs.
        let mut other = fit.clone();
        other.overrides[0].buffer_type = "CUDA1".into();
        assert!(default_candidate(Some(&other), (&s, at), 19, 2).unwrap_err().contains("CUDA1"));
    }
}
