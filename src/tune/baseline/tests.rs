//! llama.cpp's default and the pairing's statistic, in worlds of curves.

use super::*;

/// The pairing's statistic: the trial is the unit. Arms 1% apart under
/// 2% trial-to-trial noise are a tie; 10% apart under the same noise,
/// faster; and the order of the pairs does not matter.
#[test]
fn paired_trials_call_a_tie_within_their_noise_and_a_difference_beyond_it() {
    // 2% noise between loads: each trial's mean off by up to ±2%.
    let (a_noise, b_noise) = ([1.02, 0.99, 1.00], [0.99, 1.01, 1.02]);
    let arms = |by: f64| -> Vec<(f64, f64)> { (0..3).map(|i| (10.0 * by * a_noise[i], 10.0 * b_noise[i])).collect() };
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
/// so not slower; the ratio plus the half width (x0.986) once called it
/// slower. Nor is it a tie: it reaches far below 1/1.1, so not decided.
#[test]
fn the_verdict_is_the_t_intervals_and_the_interval_is_printed_as_one() {
    let pairs: Vec<(f64, f64)> = [-0.4008f64, -0.28, -0.1592].iter().map(|l| (l.exp(), 1.0)).collect();
    let r = Ratio::paired(&pairs).unwrap();
    assert!(r.hi > 1.0 && r.hi < 1.03, "{r:?}");
    assert!(r.ratio + r.half_width() < 1.0, "the half width's reading: {r:?}");
    assert!(r.ratio - r.lo < r.hi - r.ratio, "skewed: {r:?}");
    assert_eq!(r.verdict(), Verdict::NotDecided, "{r:?}");
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

/// Issue 54 item 5: where three pairs cannot tell (loads 15% apart, the
/// sides 1% apart), the pairing runs more pairs up to [`MAX_PAIRS`] and
/// then says "not decided" rather than "tie"; where the extra pairs
/// decide, it stops there. A tie needs the interval inside [1/1.1, 1.1].
#[test]
fn a_verdict_the_pairs_cannot_reach_is_not_decided() {
    use crate::tune::executor::fake::{Outcome, World};
    use crate::tune::worlds::settings;
    let run = |loads: &'static [f64]| {
        let s = settings();
        let calls = std::rc::Rc::new(std::cell::Cell::new(0usize));
        let seen = calls.clone();
        let mut world = World::new(move |c| {
            let k = seen.get();
            seen.set(k + 1);
            let tg = 10.0 * loads[k % loads.len()] * if c.ngl == 7 { 1.01 } else { 1.0 };
            Outcome::Ok { tg, pp: tg * 10.0, mem: 1 << 20 }
        });
        let mut search = crate::tune::worlds::search(&s, &mut world, 1e12);
        let mut out = DefaultComparison::unmeasured(0);
        pair(&mut search, Candidate::layers(7, 2), Candidate::layers(31, 2), &mut out).unwrap();
        (out, calls.get())
    };
    // Every other load runs 15% faster: in AB BA BA AB BA order the log ratios swing ±0.14.
    static NOISY: [f64; 2] = [1.0, 1.15];
    let (out, calls) = run(&NOISY);
    assert_eq!((out.verdict, out.pairs, calls), (Verdict::NotDecided, MAX_PAIRS, 2 * MAX_PAIRS as usize), "{out:?}");
    assert!(out.verdict.word().contains("not decided"));
    // Steady loads: 1% faster every time, decided in three pairs; no more run.
    static STEADY: [f64; 1] = [1.0];
    let (out, calls) = run(&STEADY);
    assert_eq!((out.verdict, out.pairs, calls), (Verdict::Faster, PAIRS, 6), "{out:?}");
    let r = Ratio { ratio: 1.0, lo: 0.95, hi: 1.06 };
    assert_eq!(r.verdict(), Verdict::Tie);
    assert_eq!(Ratio { lo: 0.9, ..r }.verdict(), Verdict::NotDecided);
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
    assert!(rec.llama_cpp_args.contains("-c 32768") && rec.llama_cpp_args.contains("-t 2"), "{}", rec.llama_cpp_args);
    assert!(rec.modelfile.iter().any(|l| l == "PARAMETER num_ctx 32768"), "{:?}", rec.modelfile);
    assert!(rec.modelfile.iter().any(|l| l == "PARAMETER num_thread 2"), "{:?}", rec.modelfile);
    assert!(cmp.note.contains("fit at your context (-ngl 20)"), "{}", cmp.note);
    // fit's layers there, paired with the answer in counterbalanced pairs.
    let sides: Vec<u32> = world.measured.iter().map(|c| c.ngl).collect();
    assert_eq!(&sides[6..], [7, 20, 20, 7, 20, 7], "{sides:?}");
}

/// `--objective throughput --parallel N`: llama-server without flags
/// serves 4 slots over one unified cache, so its trial decodes at most 4
/// streams in a unified cache (`-np 4 -kvu`), never N non-unified ones;
/// a tie with it keeps the N streams the user tuned (`-np N`).
#[test]
fn a_tie_under_throughput_keeps_the_users_slots() {
    use crate::tune::executor::fake::{Outcome, World};
    use crate::tune::worlds::{recommendation, settings};
    for n in [4u32, 8] {
        let mut s = settings();
        s.goal.objective = crate::types::Objective::Throughput;
        s.goal.parallel_streams = Some(n);
        s.workload.n_parallel = n;
        let ran = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let seen = ran.clone();
        let mut world = World::of(move |_, spec| {
            let p = &spec.placement;
            seen.borrow_mut().push((spec.baseline, p.n_parallel, p.kv_unified, spec.n_streams));
            Outcome::Ok { tg: 40.0, pp: 100.0, mem: 1 << 20 }
        });
        world.base.placement.n_parallel = n;
        world.base.n_streams = n;
        let mut search = crate::tune::worlds::search(&s, &mut world, 1e12);
        let fit = LlamaFit { n_gpu_layers: Some(-1), n_ctx: Some(65536), ..LlamaFit::none(1 << 30) };
        let here = LlamaFit { n_gpu_layers: Some(20), n_ctx: Some(32768), ..LlamaFit::none(1 << 30) };
        let mut rec = recommendation();
        rec.placement.n_parallel = n;
        rec.render_forms();
        let cmp = against::llama_default(&mut search, &mut rec, (Some(&fit), Some(&here)), 31).unwrap();
        drop(search);
        assert_eq!(cmp.verdict, Verdict::Tie, "{cmp:?}");
        let p = cmp.placement.as_ref().unwrap();
        assert_eq!((p.n_parallel, p.kv_unified), (4, true), "llama-server's own slots");
        assert!(p.flags().contains("-np 4 -kvu"), "{}", p.flags());
        let ran = ran.borrow();
        let stock: Vec<_> = ran.iter().filter(|r| r.0 && r.1 == 4 && r.2).collect();
        assert!(!stock.is_empty(), "the default ran as llama-server runs it: {ran:?}");
        assert!(stock.iter().all(|r| r.3 == n.min(4)), "at most its 4 slots' streams at once: {ran:?}");
        assert!(ran.iter().any(|r| !r.0 && r.1 == n && !r.2 && r.3 == n), "the answer: {n} streams, -np {n}: {ran:?}");
        assert_eq!((rec.placement.n_parallel, rec.placement.n_ctx), (n, Some(32768)), "{rec:?}");
        assert!(!rec.placement.kv_unified, "the user's -np {n}: not unified, as llama-server runs a given -np");
        assert!(rec.llama_cpp_args.contains(&format!("-np {n}")), "{}", rec.llama_cpp_args);
    }
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
    assert!(flags.contains("-ot ") && flags.contains("blk\\.14\\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU"), "{flags}");
    // Moved to another device's buffer: not a placement one device runs.
    let mut other = fit.clone();
    other.overrides[0].buffer_type = "CUDA1".into();
    assert!(default_candidate(Some(&other), (&s, at), 19, 2).unwrap_err().contains("CUDA1"));
}
