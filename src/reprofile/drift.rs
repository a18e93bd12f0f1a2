//! Drift between two profiles of one model on one machine: each measured
//! placement's speeds compared (Welch's test, Holm's correction over all of
//! them), a suspected change measured again before it is called one, and
//! the contexts whose recommended flags changed.

use anyhow::Result;
use serde::Serialize;

use super::{ReprofileOptions, ALPHA};
use crate::profile::{Profile, ProfileTrial};
use crate::stats::{mean, welch};
use crate::types::TrialStatus;

/// One measured quantity compared between the previous and the new profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub n_gpu_layers: u32,
    pub n_threads: u32,
    /// The context size of the trials (profiles before schema 2: their one context).
    pub n_ctx: Option<u32>,
    /// What else the placement holds beside layers: "q8_0 KV", "FFN of 5 layers on CPU",
    /// "experts of 4 layers on CPU"; empty for a whole-layer split.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub placement: String,
    /// "pp512" or "tg128".
    pub test: String,
    pub old_ts: f64,
    pub new_ts: f64,
    pub change_pct: f64,
    pub p_value: Option<f64>,
    /// "regression", "improvement", "same", "contended" (measured while the
    /// machine was busy, then or in the old profile, so not judged), or
    /// "inconclusive": past the threshold, but not significant even after
    /// measuring again.
    pub verdict: String,
    /// Repetitions measured again after a first verdict that noise could
    /// hide (a change past the threshold, not significant).
    #[serde(default, skip_serializing_if = "crate::types::is_zero")]
    pub remeasured: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Drift {
    pub comparisons: Vec<Comparison>,
    pub regressions: usize,
    pub improvements: usize,
    /// (old, new) recommended ngl when it changed.
    pub recommendation_changed: Option<(u32, u32)>,
    pub threads_changed: Option<(u32, u32)>,
    /// Comparisons not judged because a trial ran on a busy machine.
    #[serde(default)]
    pub contended: usize,
    /// Contexts whose recommended flags changed: (context, old flags, new flags).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub placements_changed: Vec<(u32, String, String)>,
}

/// What identifies a measured placement across profiles: layers, threads,
/// context, KV cache type, FFN and expert overrides, layers per device.
type Key = (u32, u32, Option<u32>, crate::placement::KvType, u32, u32, Vec<u32>);

pub(super) fn key(t: &ProfileTrial) -> Key {
    let s = &t.result.spec;
    (
        s.placement.n_gpu_layers,
        s.placement.n_threads,
        s.placement.n_ctx,
        s.placement.kv_type,
        s.placement.n_cpu_ffn,
        s.placement.n_cpu_moe,
        s.placement.tensor_split.clone(),
    )
}

/// The placement beside layers, in words (empty for a whole-layer split).
fn placement_words(s: &crate::types::TrialSpec) -> String {
    let mut v = Vec::new();
    if s.placement.kv_type.is_quantized() {
        v.push(format!("{} KV", s.placement.kv_type.as_str()));
    }
    if s.placement.n_cpu_ffn > 0 {
        v.push(format!("FFN of {} layers on CPU", s.placement.n_cpu_ffn));
    }
    if s.placement.n_cpu_moe > 0 {
        v.push(format!("experts of {} layers on CPU", s.placement.n_cpu_moe));
    }
    if !s.placement.tensor_split.is_empty() {
        v.push(format!("-ts {}", crate::placement::split_list(&s.placement.tensor_split)));
    }
    v.join(", ")
}

/// Contexts tuned in both profiles whose recommended flags changed.
fn placements_changed(old: &Profile, new: &Profile) -> Vec<(u32, String, String)> {
    new.settings
        .contexts()
        .into_iter()
        .filter_map(|c| {
            let rec = |p: &Profile| {
                p.placement(c)
                    .map(|x| x.recommendation.flags())
                    .or_else(|| (p.recommendation.n_ctx() == c).then(|| p.recommendation.flags()))
            };
            let (o, n) = (rec(old)?, rec(new)?);
            (o != n).then_some((c, o, n))
        })
        .collect()
}

/// Compares every setting measured in both profiles, test by test, with
/// Welch's t-test on the raw samples and a minimum effect size. The p-values
/// are judged together (Holm's correction: many comparisons at 5% each
/// would flag noise on a busy night). A test cut short by adaptive search
/// (one repetition of a setting far behind the best) is not compared.
#[must_use]
pub fn drift(old: &Profile, new: &Profile, threshold: f64) -> Drift {
    let mut comparisons = Vec::new();
    for nt in new.trials.iter().filter(|t| t.result.status == TrialStatus::Ok) {
        let Some(ot) = old.trials.iter().find(|o| key(o) == key(nt) && o.result.status == TrialStatus::Ok) else {
            continue;
        };
        for ntest in nt.result.tests.iter().filter(|x| !x.stopped_early) {
            let Some(otest) = ot
                .result
                .tests
                .iter()
                .find(|x| x.n_prompt == ntest.n_prompt && x.n_gen == ntest.n_gen && !x.stopped_early)
            else {
                continue;
            };
            let (om, nm) = (mean(&otest.samples_ts), mean(&ntest.samples_ts));
            if om <= 0.0 {
                continue;
            }
            // A busy machine slows a trial by more than any threshold: no verdict from it.
            let busy = nt.result.contended() || ot.result.contended();
            comparisons.push(Comparison {
                n_gpu_layers: key(nt).0,
                n_threads: key(nt).1,
                n_ctx: nt.result.spec.placement.n_ctx,
                placement: placement_words(&nt.result.spec),
                test: ntest.name(),
                old_ts: om,
                new_ts: nm,
                change_pct: (nm - om) / om * 100.0,
                p_value: if busy { None } else { welch(&otest.samples_ts, &ntest.samples_ts).map(|w| w.2) },
                verdict: if busy { "contended".into() } else { String::new() },
                remeasured: 0,
            });
        }
    }
    let ps: Vec<f64> = comparisons.iter().filter_map(|c| c.p_value).collect();
    let held = holm(&ps, ALPHA);
    let mut next = held.iter();
    for c in comparisons.iter_mut().filter(|c| c.verdict.is_empty()) {
        // Without a p-value (one repetition, or no spread) only the size decides.
        let significant = c.p_value.is_none() || *next.next().unwrap_or(&false);
        let change = c.change_pct / 100.0;
        c.verdict = if change <= -threshold && significant {
            "regression"
        } else if change >= threshold && significant {
            "improvement"
        } else if change.abs() >= threshold {
            // Past the threshold but not significant: noise may hide a real change.
            "inconclusive"
        } else {
            "same"
        }
        .into();
    }
    comparisons.extend(draft_comparisons(old, new, threshold));
    let (o, n) = (&old.recommendation, &new.recommendation);
    Drift {
        regressions: comparisons.iter().filter(|c| c.verdict == "regression").count(),
        improvements: comparisons.iter().filter(|c| c.verdict == "improvement").count(),
        contended: comparisons.iter().filter(|c| c.verdict == "contended").count(),
        comparisons,
        recommendation_changed: (o.placement.n_gpu_layers != n.placement.n_gpu_layers)
            .then_some((o.placement.n_gpu_layers, n.placement.n_gpu_layers)),
        threads_changed: (o.placement.n_threads != n.placement.n_threads)
            .then_some((o.placement.n_threads, n.placement.n_threads)),
        placements_changed: placements_changed(old, new),
    }
}

/// The test name of a draft placement's comparison: its paired ratio,
/// generation with the draft over without, not a speed.
pub const DRAFT_TEST: &str = "tg with the draft / without";

/// Each draft placement measured in both profiles at one context (the same
/// placement, its draft included): the paired ratio's geometric mean old
/// and new. No raw samples are kept for it, so the verdict is the two 95%
/// intervals: a change past the threshold whose intervals do not overlap
/// is a regression or an improvement, one whose intervals overlap is
/// inconclusive (not measured again: the nightly re-tune has just run the
/// draft stage again).
fn draft_comparisons(old: &Profile, new: &Profile, threshold: f64) -> Vec<Comparison> {
    // A busy machine (then or now) slows a load's sides unevenly: no verdict.
    let busy = [old, new].iter().any(|p| p.recommendation.confidence == crate::profile::Confidence::Low);
    let mut v = Vec::new();
    for c in new.settings.contexts() {
        let (Some(od), Some(nd)) =
            (old.placement(c).and_then(|x| x.draft.as_ref()), new.placement(c).and_then(|x| x.draft.as_ref()))
        else {
            continue;
        };
        for n in nd.options.iter().filter(|o| o.loads > 0) {
            let Some(o) = od.options.iter().find(|o| o.loads > 0 && o.placement == n.placement) else { continue };
            let (Some([om, olo, ohi]), Some([nm, nlo, nhi])) = (o.ratio, n.ratio) else { continue };
            if om <= 0.0 {
                continue;
            }
            let change = (nm - om) / om;
            let verdict = if busy {
                "contended"
            } else if change.abs() < threshold {
                "same"
            } else if nlo > ohi {
                "improvement"
            } else if nhi < olo {
                "regression"
            } else {
                "inconclusive"
            };
            let p = &n.placement;
            v.push(Comparison {
                n_gpu_layers: p.n_gpu_layers,
                n_threads: p.n_threads,
                n_ctx: Some(c),
                placement: p.draft.as_ref().map_or_else(String::new, crate::placement::Draft::describe),
                test: DRAFT_TEST.into(),
                old_ts: om,
                new_ts: nm,
                change_pct: change * 100.0,
                p_value: None,
                verdict: verdict.into(),
                remeasured: 0,
            });
        }
    }
    v
}

/// Rounds of measuring again an inconclusive comparison, and the
/// repetitions of each: bounded, so one noisy setting cannot hold up a night.
pub const SETTLE_ROUNDS: u32 = 3;
pub const SETTLE_REPETITIONS: u32 = 5;

/// The old samples and the new trial's spec of a comparison.
fn sides(old: &Profile, new: &Profile, c: &Comparison) -> Option<(Vec<f64>, crate::types::TrialSpec, (u32, u32))> {
    let find = |p: &Profile| {
        p.trials.iter().filter(|t| t.result.status == TrialStatus::Ok).find_map(|t| {
            let k = key(t);
            let same = (k.0, k.1, k.2) == (c.n_gpu_layers, c.n_threads, c.n_ctx)
                && placement_words(&t.result.spec) == c.placement;
            let test = t.result.tests.iter().find(|x| same && x.name() == c.test && !x.stopped_early)?;
            Some((test.samples_ts.clone(), t.result.spec.clone(), (test.n_prompt, test.n_gen)))
        })
    };
    let (old_samples, _, _) = find(old)?;
    let (_, spec, test) = find(new)?;
    Some((old_samples, spec, test))
}

/// Re-judges `c` with `extra` samples of the new side: each look at the
/// data is held to the level divided by the looks (Bonferroni), so
/// measuring until significant does not make noise significant.
pub(super) fn judge_again(c: &mut Comparison, old: &[f64], new: &[f64], threshold: f64) -> bool {
    let (om, nm) = (mean(old), mean(new));
    c.new_ts = nm;
    c.change_pct = (nm - om) / om * 100.0;
    c.p_value = welch(old, new).map(|w| w.2);
    let significant = c.p_value.is_some_and(|p| p < ALPHA / f64::from(SETTLE_ROUNDS));
    let change = c.change_pct / 100.0;
    let settled = if change.abs() < threshold {
        Some("same")
    } else if significant {
        Some(if change < 0.0 { "regression" } else { "improvement" })
    } else {
        None
    };
    match settled {
        Some(v) => {
            c.verdict = v.into();
            true
        }
        None => {
            c.verdict = "inconclusive".into();
            false
        }
    }
}

/// Measures each inconclusive comparison's setting again, more
/// repetitions a round (at most [`SETTLE_ROUNDS`]), until its verdict is
/// clear; what stays unclear stays "inconclusive", with its change and p-value.
///
/// # Errors
/// An interrupt, or a worker that cannot start.
pub(super) fn settle(
    d: &mut Drift,
    old: &Profile,
    new: &Profile,
    opts: &ReprofileOptions,
    say: &mut dyn FnMut(&str),
) -> Result<()> {
    if !d.comparisons.iter().any(|c| c.verdict == "inconclusive") {
        return Ok(());
    }
    let s = &new.settings;
    let runner = crate::tune::runner(&s.policy, opts.verbose)?;
    // A draft's comparison has no samples to add to: the re-tune just measured it.
    for c in d.comparisons.iter_mut().filter(|c| c.verdict == "inconclusive" && c.test != DRAFT_TEST) {
        let Some((old_samples, mut spec, (np, ng))) = sides(old, new, c) else { continue };
        spec.repetitions = SETTLE_REPETITIONS;
        spec.race = None;
        spec.n_prompt = np;
        spec.n_gen = ng;
        let mut samples = Vec::new();
        for _ in 0..SETTLE_ROUNDS {
            say(&format!(
                "           {} at ngl {} changed {:+.1}% (p {}): measuring it again",
                c.test,
                c.n_gpu_layers,
                c.change_pct,
                c.p_value.map_or("n/a".into(), |p| format!("{p:.3}"))
            ));
            let r = runner.run_settled(&spec, |_| {})?;
            if r.contended() {
                c.verdict = "contended".into();
                break;
            }
            let Some(t) = r.test(np > 0).filter(|_| r.status == TrialStatus::Ok) else { break };
            samples.extend(t.samples_ts.iter().copied());
            c.remeasured += SETTLE_REPETITIONS;
            if judge_again(c, &old_samples, &samples, opts.threshold) {
                break;
            }
        }
    }
    d.regressions = d.comparisons.iter().filter(|c| c.verdict == "regression").count();
    d.improvements = d.comparisons.iter().filter(|c| c.verdict == "improvement").count();
    d.contended = d.comparisons.iter().filter(|c| c.verdict == "contended").count();
    Ok(())
}

/// Holm's step-down correction: which of `ps` stay significant at `alpha`
/// when all of them are tested together (same order as `ps`).
#[must_use]
pub fn holm(ps: &[f64], alpha: f64) -> Vec<bool> {
    let mut order: Vec<usize> = (0..ps.len()).collect();
    order.sort_by(|a, b| ps[*a].total_cmp(&ps[*b]));
    let mut held = vec![false; ps.len()];
    for (k, &i) in order.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let level = alpha / (ps.len() - k) as f64;
        if ps[i] >= level {
            break;
        }
        held[i] = true;
    }
    held
}
