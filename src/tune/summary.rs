//! What a finished search says about itself: how much measuring it took
//! against the full grid, whether repetitions were noisy, how llama.cpp's
//! own prediction and fit fared, and the recommendation in pasteable forms.

use super::plan::{ContextRun, Found};
use super::search::NOISY;
use crate::profile::{Confidence, PredictionReport, ProfileTrial, Recommendation, SearchReport, Settings};
use crate::types::TrialStatus;

/// A warning, in words the user can act on, when repetitions of a test
/// varied so much that something else was probably using the machine.
#[must_use]
pub fn noise_note(trials: &[ProfileTrial]) -> Option<crate::types::Note> {
    let worst = trials
        .iter()
        .filter(|t| t.result.status == TrialStatus::Ok)
        .flat_map(|t| t.result.tests.iter().map(move |x| (t, x)))
        .filter(|(_, x)| x.avg_ts > 0.0 && x.samples_ts.len() > 1)
        .map(|(t, x)| (t, x, x.stddev_ts / x.avg_ts))
        .max_by(|a, b| a.2.total_cmp(&b.2))?;
    let (t, x, cv) = worst;
    (cv > NOISY).then(|| {
        crate::types::Note::new(crate::types::NoteKind::Noisy {
            test: x.name(),
            n_gpu_layers: t.result.spec.placement.n_gpu_layers,
            n_threads: t.result.spec.placement.n_threads,
            cv,
            avg_ts: x.avg_ts,
            stddev_ts: x.stddev_ts,
        })
    })
}

/// What the full grid would have cost, from what was measured: a grid
/// setting measured in full counts its own wall time; any other is the
/// trials' mean fixed cost (start, load) plus its warm-ups and repetitions
/// at the speeds the curves give there (for a test never run near a
/// setting, its nearest measured speed).
/// `None` without two measured points.
#[must_use]
pub fn estimate_grid_s(trials: &[ProfileTrial], grid: &[u32], m: &crate::profile::Measure, full: u32) -> Option<f64> {
    let ok: Vec<&ProfileTrial> =
        trials.iter().filter(|t| t.is_search() && t.result.status == TrialStatus::Ok).collect();
    let curve = |pp: bool| {
        let pts = ok
            .iter()
            .filter_map(|t| {
                t.result.test(pp).filter(|x| x.avg_ts > 0.0).map(|x| (t.result.spec.placement.n_gpu_layers, x.avg_ts))
            })
            .map(|(n, ts)| (n.min(full), 1.0 / ts))
            .collect();
        crate::curve::Curve::new(pts, full)
    };
    let (pp_time, tg_time) = (curve(true), curve(false));
    // Where a curve cannot say (the pp of settings whose pp never ran), the
    // nearest measured speed stands in. Scaling it as the other test scales
    // was tried and overshot five-fold on llvmpipe, where pp hardly changes
    // with ngl; the nearest speed errs low, so the savings are not overstated.
    let per_token = |c: &crate::curve::Curve, n: u32| {
        c.predict(n).or_else(|| c.measured.iter().min_by_key(|(m, _)| m.abs_diff(n)).map(|p| p.1))
    };
    // Seconds of measuring at `ngl`: each test run (`Some(repetitions)`) with its warm-up.
    let measuring = |ngl: u32, pp_reps: Option<f64>, tg_reps: Option<f64>| -> Option<f64> {
        let mut secs = 0.0;
        if let Some(r) = pp_reps {
            secs += (r + 1.0) * f64::from(m.n_prompt) * per_token(&pp_time, ngl)?;
        }
        if let Some(r) = tg_reps {
            secs += (r * f64::from(m.n_gen) + 1.0) * per_token(&tg_time, ngl)?;
        }
        Some(secs)
    };
    #[allow(clippy::cast_precision_loss)]
    let reps_run = |t: &ProfileTrial, pp: bool| t.result.test(pp).map(|x| x.samples_ns.len() as f64);
    let fixed: Vec<f64> = ok
        .iter()
        .filter_map(|t| {
            let n = t.result.spec.placement.n_gpu_layers.min(full);
            Some(t.result.wall_ms / 1e3 - measuring(n, reps_run(t, true), reps_run(t, false))?)
        })
        .collect();
    if ok.len() < 2 || fixed.is_empty() {
        return None;
    }
    let fixed = crate::stats::mean(&fixed).max(0.0);
    let reps = f64::from(m.repetitions);
    let (pp_reps, tg_reps) = ((m.n_prompt > 0).then_some(reps), (m.n_gen > 0).then_some(reps));
    grid.iter()
        .map(|&n| {
            let whole = ok.iter().find(|t| {
                t.result.spec.placement.n_gpu_layers.min(full) == n
                    && t.result.tests.iter().all(|x| !x.stopped_early)
                    && t.result.tests.len() == t.result.spec.tests().len()
            });
            match whole {
                Some(t) => Some(t.result.wall_ms / 1e3),
                None => Some(fixed + measuring(n, pp_reps, tg_reps)?),
            }
        })
        .sum()
}

/// How much measuring the ngl search took, and (adaptive) what the full
/// grid would have taken.
#[must_use]
pub fn search_report(
    trials: &[ProfileTrial],
    s: &Settings,
    full_grid: &[u32],
    runnable: &[u32],
    adaptive: bool,
    full: u32,
) -> SearchReport {
    let decision_trials: Vec<&ProfileTrial> = trials.iter().filter(|t| t.is_search()).collect();
    let others: Vec<&ProfileTrial> = trials.iter().filter(|t| !t.is_search()).collect();
    SearchReport {
        other_trials: others.len(),
        other_wall_s: others.iter().map(|t| t.result.wall_ms).sum::<f64>() / 1e3,
        quality_wall_s: 0.0,
        mode: if adaptive { "adaptive".into() } else { "grid".into() },
        trials: decision_trials.len(),
        trial_wall_s: decision_trials.iter().map(|t| t.result.wall_ms).sum::<f64>() / 1e3,
        grid_size: full_grid.len(),
        stopped_early: decision_trials.iter().filter(|t| t.result.tests.iter().any(|x| x.stopped_early)).count(),
        // Only a comparison of like with like: the grid runs nothing over the
        // cap, so a search that measured something over it has no estimate to compare.
        grid_estimate_s: (adaptive && !decision_trials.iter().any(|t| t.over_cap))
            .then(|| estimate_grid_s(trials, runnable, &s.measure, full))
            .flatten(),
    }
}

/// Fills in how the dry run held up over the measured trials, and what
/// llama.cpp's own fit choice measured at.
pub fn finish_prediction(pr: &mut PredictionReport, trials: &[ProfileTrial], full: u32) {
    pr.max_error_pct = trials.iter().filter_map(|t| t.prediction_error_pct).map(f64::abs).reduce(f64::max);
    let fit_ngl = pr.llama_fit.as_ref().and_then(|f| f.n_gpu_layers).map(|n| {
        if n < 0 {
            full
        } else {
            u32::try_from(n).unwrap_or(0).min(full)
        }
    });
    pr.llama_fit_tg_ts = fit_ngl.and_then(|n| {
        trials
            .iter()
            .find(|t| t.result.spec.placement.n_gpu_layers.min(full) == n && t.result.status == TrialStatus::Ok)
            .and_then(|t| t.result.test(false))
            .map(|x| x.avg_ts)
    });
}

/// The answer in the forms people paste, from what the search found.
#[must_use]
pub fn recommendation(
    found: &Found,
    trials: &[ProfileTrial],
    (s, at): (&Settings, ContextRun),
    full: u32,
    op_offload: bool,
    confidence: Confidence,
) -> Recommendation {
    let (dense, threads, moe, d) = (found.dense_ngl, found.threads, found.n_cpu_moe, &found.decision);
    // With expert offload every layer is on the GPU but the first K layers' experts.
    let ngl = if moe > 0 { full } else { dense };
    let rec = trials.iter().find(|t| {
        t.result.spec.placement.n_gpu_layers == ngl
            && t.result.spec.placement.n_threads == threads
            && t.result.spec.placement.n_cpu_moe == moe
            && t.result.spec.placement.n_cpu_ffn == 0
            && t.result.spec.placement.kv_type == s.workload.kv_type
            && t.result.status == TrialStatus::Ok
    });
    let mut r = Recommendation {
        ollama_num_gpu: (moe > 0).then_some(dense),
        measured: rec.is_some(),
        confidence,
        tg_ts: rec.and_then(|t| t.result.test(false)).map(|t| t.avg_ts).or(d.predicted_tg),
        pp_ts: rec.and_then(|t| t.result.test(true)).map(|t| t.avg_ts).or(d.predicted_pp),
        mem_bytes: rec.and_then(|t| t.mem_bytes).or(d.predicted_mem),
        img_ms: rec.and_then(|t| t.result.image.as_ref()).map(crate::types::ImageTest::avg_ms),
        ..Recommendation::default()
    };
    let p = crate::placement::Placement {
        n_cpu_moe: moe,
        kv_type: s.workload.kv_type,
        ..at.workload((&s.workload, &s.backend))
    }
    .with_layers(ngl, threads, Some(at.n_ctx))
    .with_op_offload(op_offload);
    r.set_placement(&p);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Role;

    fn timed_trial(ngl: u32, pp_ts: f64, tg_ts: f64, reps: usize, wall_s: f64) -> ProfileTrial {
        use crate::types::{TestResult, TrialResult};
        let mut spec = crate::engine::test_spec();
        spec.placement.n_gpu_layers = ngl;
        let mut r = TrialResult::failed(spec, TrialStatus::Ok, String::new());
        r.reason = None;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ns = |tokens: f64, ts: f64| vec![(tokens / ts * 1e9) as u64; reps];
        r.tests.push(TestResult::from_samples(64, 0, 256, ns(64.0, pp_ts)));
        r.tests.push(TestResult::from_samples(0, 16, 256, ns(16.0, tg_ts)));
        for t in &mut r.tests {
            t.stopped_early = reps == 1;
        }
        r.wall_ms = wall_s * 1e3;
        grid_trial(r)
    }

    fn grid_trial(r: crate::types::TrialResult) -> ProfileTrial {
        ProfileTrial {
            role: Role::Grid,
            mem_bytes: None,
            device_peak_bytes: None,
            device_share: None,
            over_cap: false,
            predicted_bytes: None,
            prediction_error_pct: None,
            sampled_minus_predicted_bytes: None,
            result: r,
        }
    }

    #[test]
    fn the_full_grids_time_is_estimated_from_what_was_measured() {
        let settings: Settings = serde_json::from_value(serde_json::json!({
            "target_vram": 0.9, "vram_budget_bytes": null, "n_ctx": 256, "n_prompt": 64, "n_gen": 16,
            "repetitions": 3, "n_threads": 2, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1,
            "objective": "tg", "grid": null, "quick": false, "no_skip": false, "trial_timeout_s": 600,
            "sample_interval_ms": 20
        }))
        .unwrap();
        // Fixed cost 1 s. ngl 0: pp 64 t/s (1 s a run), tg 16 t/s (1 s a run):
        // 1 + (3+1)*1 + (3*16+1)/16 = 8.0625 s. ngl 20 cut short after one
        // repetition: pp 16 t/s (4 s), tg 4 t/s (4 s): 1 + 2*4 + 17/4 = 13.25 s.
        let zero = timed_trial(0, 64.0, 16.0, 3, 8.0625);
        let top = timed_trial(20, 16.0, 4.0, 1, 13.25);
        let trials = [zero, top];
        // ngl 10 halfway in time per token: pp 1/(1/2 * (1/64 + 1/16)) = 25.6 t/s.
        let at10 = 1.0 + 4.0 * 64.0 / 25.6 + 49.0 / 6.4;
        let at20 = 1.0 + 4.0 * 4.0 + 49.0 / 4.0;
        let est = estimate_grid_s(&trials, &[0, 10, 20], &settings.measure, 20).unwrap();
        let want = 8.0625 + at10 + at20;
        assert!((est - want).abs() < 1e-6, "estimated {est}, want {want}");
        assert_eq!(estimate_grid_s(&trials[..1], &[0, 10, 20], &settings.measure, 20), None, "one point says nothing");
        // Raced on tg alone, the top's pp never ran: pp at ngl 0 stands in.
        let mut tg_only = timed_trial(20, 16.0, 4.0, 1, 1.0 + 17.0 / 4.0);
        tg_only.result.tests.retain(|x| x.n_gen > 0);
        let trials = [trials[0].clone(), tg_only];
        let est = estimate_grid_s(&trials, &[0, 10, 20], &settings.measure, 20).unwrap();
        let want = 8.0625 + (1.0 + 4.0 + 49.0 / 6.4) + (1.0 + 4.0 + 49.0 / 4.0);
        assert!((est - want).abs() < 1e-6, "estimated {est}, want {want}");
    }

    #[test]
    fn noisy_repetitions_are_said_in_words() {
        use crate::types::{TestResult, TrialResult};
        let trial = |samples_ns: Vec<u64>| {
            let mut r = TrialResult::failed(crate::engine::test_spec(), TrialStatus::Ok, String::new());
            r.reason = None;
            r.tests.push(TestResult::from_samples(0, 32, 4096, samples_ns));
            grid_trial(r)
        };
        let steady = trial(vec![1_000_000_000, 1_010_000_000, 995_000_000]);
        assert_eq!(noise_note(std::slice::from_ref(&steady)), None);
        let noisy = trial(vec![1_000_000_000, 2_500_000_000, 1_000_000_000]);
        let note = noise_note(&[steady, noisy]).expect("noisy");
        assert!(note.is_warning());
        let note = note.to_string();
        assert!(note.starts_with("noisy measurement: tg32 at ngl 0 -t 2 varied by"), "{note}");
        assert!(note.contains("re-run when it is idle"), "{note}");
    }
}
