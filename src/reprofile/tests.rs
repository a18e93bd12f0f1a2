//! The nightly re-profile's tests: drift, re-tune decisions, Modelfile updates.

use super::*;

#[test]
fn a_retune_on_another_cpu_starts_from_its_cores_unless_the_user_chose() {
    let then = crate::types::CpuInfo { brand: "old".into(), physical_cores: 2, logical_cores: 4 };
    assert_eq!(threads_now(2, &then, 16), 16, "the old default (its 2 cores) follows the new machine");
    assert_eq!(threads_now(0, &then, 16), 16);
    assert_eq!(threads_now(3, &then, 16), 3, "-t 3 was the user's");
}

#[test]
fn an_unclear_change_is_measured_again_until_clear_or_said_to_stay_unclear() {
    let mut c = Comparison {
        n_gpu_layers: 0,
        n_threads: 2,
        n_ctx: Some(4096),
        placement: String::new(),
        test: "tg32".into(),
        old_ts: 11.25,
        new_ts: 9.0,
        change_pct: -20.0,
        p_value: Some(0.2),
        verdict: "inconclusive".into(),
        remeasured: 0,
    };
    let old = [11.2, 11.3];
    // Five steady samples 20% lower: a regression at the stricter level of repeated looks.
    assert!(judge_again(&mut c, &old, &[9.0, 9.05, 8.95, 9.0, 9.02], 0.05));
    assert_eq!(c.verdict, "regression", "{c:?}");
    // Back within the threshold: the same.
    assert!(judge_again(&mut c, &old, &[11.2, 11.3, 11.1, 11.25, 11.2], 0.05));
    assert_eq!(c.verdict, "same");
    // Still all over the place: unclear, and said so with its change and p-value.
    assert!(!judge_again(&mut c, &old, &[5.0, 14.0, 6.0, 13.0, 7.0], 0.05));
    assert_eq!(c.verdict, "inconclusive");
    assert!(c.p_value.is_some() && c.change_pct < -5.0, "{c:?}");
}

#[test]
fn holm_judges_the_p_values_together() {
    assert_eq!(holm(&[0.01, 0.04, 0.03], 0.05), [true, false, false], "0.03 > 0.05/2: it and all above stop");
    assert_eq!(holm(&[0.001, 0.01], 0.05), [true, true]);
    assert_eq!(holm(&[0.02], 0.05), [true]);
    assert!(holm(&[], 0.05).is_empty());
}

/// One context's placement: its answer and, where given, its draft stage.
fn at(
    n_ctx: u32,
    recommendation: crate::profile::Admitted,
    draft: Option<crate::profile::DraftReport>,
) -> crate::profile::ContextPlacement {
    crate::profile::ContextPlacement {
        n_ctx,
        fits_fully: false,
        kv_bytes: None,
        recommendation,
        options: Vec::new(),
        default: None,
        ollama: None,
        split: None,
        reading: None,
        job: None,
        draft,
    }
}

fn example() -> Profile {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/example-gemma-3-270m-cpu.json");
    crate::profile::store::read_profile(&p).unwrap()
}

fn scale(t: &mut crate::types::TestResult, by: f64) {
    for v in &mut t.samples_ts {
        *v *= by;
    }
    t.avg_ts *= by;
}

#[test]
fn a_slower_setting_is_a_regression_unless_it_was_cut_short() {
    let old = example();
    let mut new = old.clone();
    let tg = new.trials[0].result.tests.iter_mut().find(|x| x.n_gen > 0).unwrap();
    scale(tg, 0.8);
    let d = drift(&old, &new, 0.05);
    assert_eq!(d.regressions, 1, "{:#?}", d.comparisons);
    let c = d.comparisons.iter().find(|c| c.verdict == "regression").unwrap();
    assert!((c.change_pct + 20.0).abs() < 1e-9, "{c:?}");
    // One repetition of a setting far behind the best says nothing about drift.
    new.trials[0].result.tests.iter_mut().find(|x| x.n_gen > 0).unwrap().stopped_early = true;
    let d = drift(&old, &new, 0.05);
    assert_eq!(d.regressions, 0, "{:#?}", d.comparisons);
    assert!(d.comparisons.iter().all(|c| !(c.test.starts_with("tg")
        && c.n_threads == key(&new.trials[0]).1
        && c.n_gpu_layers == key(&new.trials[0]).0)));
}

#[test]
fn drift_is_judged_per_context_and_placement_kind() {
    use crate::placement::KvType;
    use crate::profile::HatchKind;
    let mut old = example();
    // The same ngl and threads at a second context, once with an f16 and once with a q8_0 KV cache.
    let mut at_32k = old.trials[1].clone();
    at_32k.result.spec.placement.n_ctx = Some(32768);
    let mut q8 = at_32k.clone();
    q8.role = crate::types::Role::Hatch;
    q8.result.spec.placement.kv_type = crate::placement::KvType::Q8_0;
    old.trials.extend([at_32k, q8]);
    old.settings.workload.contexts = vec![4096, 32768];
    let place = |p: &Profile, n_ctx: u32, kv| {
        let mut r = p.recommendation.clone();
        let m = r.for_test_mut();
        m.placement.n_ctx = Some(n_ctx);
        m.placement.kv_type = kv;
        m.llama_cpp_args = m.flags();
        at(n_ctx, r, None)
    };
    old.placements = vec![place(&old, 4096, KvType::F16), place(&old, 32768, KvType::F16)];
    let mut new = old.clone();
    // Only the q8_0 trial at 32k got slower; the new answer at 32k is that cache.
    scale(new.trials[3].result.tests.iter_mut().find(|x| x.n_gen > 0).unwrap(), 0.5);
    new.placements[1] = place(&new, 32768, KvType::Q8_0);
    let d = drift(&old, &new, 0.05);
    let bad: Vec<&Comparison> = d.comparisons.iter().filter(|c| c.verdict == "regression").collect();
    assert_eq!(bad.len(), 1, "{:#?}", d.comparisons);
    assert_eq!((bad[0].n_ctx, bad[0].placement.as_str()), (Some(32768), "q8_0 KV"));
    assert!(d.comparisons.iter().filter(|c| c.n_ctx == Some(4096)).all(|c| c.verdict == "same"));
    assert_eq!(d.placements_changed.len(), 1, "{:?}", d.placements_changed);
    assert_eq!(d.placements_changed[0].0, 32768);
    assert!(d.placements_changed[0].2.contains("-ctk q8_0"), "{:?}", d.placements_changed);
    assert!(HatchKind::KvCache < HatchKind::LayerSplit, "the guide's order");
}

#[test]
fn a_split_is_compared_with_the_same_split_only() {
    let mut old = example();
    // At the same ngl and threads: llama.cpp's default split and a -ts split.
    let mut split = old.trials[1].clone();
    split.role = crate::types::Role::Split;
    split.result.spec.placement.tensor_split = vec![9, 13];
    old.trials.push(split);
    let mut new = old.clone();
    // Only the split got slower.
    let last = new.trials.len() - 1;
    scale(new.trials[last].result.tests.iter_mut().find(|x| x.n_gen > 0).unwrap(), 0.5);
    let d = drift(&old, &new, 0.05);
    let bad: Vec<&Comparison> = d.comparisons.iter().filter(|c| c.verdict == "regression").collect();
    assert_eq!(bad.len(), 1, "{:#?}", d.comparisons);
    assert_eq!(bad[0].placement, "-ts 9,13");
}

/// A draft placement measured in both profiles: its paired ratio compared,
/// judged by the two intervals (no raw samples are kept for it); another
/// placement of the same draft is not its match.
#[test]
fn a_drafts_gain_is_compared_by_its_intervals() {
    use crate::profile::{DraftOption, DraftReport};
    let n_ctx = example().recommendation.n_ctx();
    let with = |ratios: &[[f64; 3]]| {
        let mut p = example();
        let answer = p.recommendation.placement.clone();
        let options = ratios
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let ngld = u32::try_from(i).unwrap();
                let draft = crate::placement::Draft {
                    n_gpu_layers: Some(ngld),
                    ..crate::placement::Draft::of("d.gguf".into())
                };
                let placement = crate::placement::Placement { draft: Some(draft), ..answer.clone() };
                DraftOption {
                    loads: 1,
                    ratio: Some(*r),
                    fits: true,
                    ..DraftOption::unmeasured(format!("{i}"), placement)
                }
            })
            .collect();
        let report =
            DraftReport { draft: "d.gguf".into(), mtp: false, n_gen: 32, n_depth: 64, options, summary: String::new() };
        p.placements = vec![at(n_ctx, p.recommendation.clone(), Some(report))];
        p
    };
    let old = with(&[[1.40, 1.30, 1.50], [1.00, 0.90, 1.10], [1.20, 1.00, 1.40]]);
    let new = with(&[[1.00, 0.95, 1.05], [1.02, 0.92, 1.12], [1.40, 1.10, 1.70]]);
    let d = drift(&old, &new, 0.05);
    let draft: Vec<&Comparison> = d.comparisons.iter().filter(|c| c.test == super::drift::DRAFT_TEST).collect();
    let verdicts: Vec<&str> = draft.iter().map(|c| c.verdict.as_str()).collect();
    assert_eq!(verdicts, ["regression", "same", "inconclusive"], "{draft:#?}");
    assert!(draft[0].placement.contains("0 layers") || draft[0].placement.contains("on the CPU"), "{:?}", draft[0]);
    assert_eq!(
        d.regressions,
        1 + d.comparisons.iter().filter(|c| c.test != super::drift::DRAFT_TEST && c.verdict == "regression").count()
    );
    // Measured on a busy machine (the profile's confidence low): not judged.
    let mut busy = new.clone();
    busy.recommendation.for_test_mut().confidence = crate::profile::Confidence::Low;
    let d = drift(&old, &busy, 0.05);
    assert!(d.comparisons.iter().filter(|c| c.test == super::drift::DRAFT_TEST).all(|c| c.verdict == "contended"));
}
