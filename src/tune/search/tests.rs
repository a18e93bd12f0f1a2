use super::*;
use crate::tune::executor::fake::{Outcome, World};
use crate::tune::worlds::{hurting_world, policy, readme_world};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn settings(grid: Option<Vec<u32>>, search: &str, no_skip: bool) -> Settings {
    serde_json::from_value(serde_json::json!({
        "target_vram": 0.9, "vram_budget_bytes": null, "n_ctx": 256, "n_prompt": 64, "n_gen": 16,
        "repetitions": 3, "n_threads": 2, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1,
        "objective": "tg", "grid": grid, "quick": false, "no_skip": no_skip, "trial_timeout_s": 600,
        "sample_interval_ms": 20, "search": search
    }))
    .unwrap()
}

fn plan(full: u32, grid: Vec<u32>, grid_mode: bool, n_max: u32) -> Plan {
    Plan {
        full,
        n_layer: full - 1,
        is_moe: false,
        full_grid: grid,
        grid_mode,
        no_gpu: false,
        predicted_over: Vec::new(),
        n_max,
        top_first: true,
        cpu: CpuInfo { brand: "fake".into(), physical_cores: 2, logical_cores: 2 },
    }
}

/// A world from a (tg, memory) curve; pp is ten times tg, threads do not matter.
fn curve_world(f: fn(u32) -> (f64, f64)) -> World {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    World::new(move |c| {
        let (tg, mem) = f(c.ngl);
        Outcome::Ok { tg, pp: tg * 10.0, mem: mem as u64 }
    })
}

fn search(
    world: &mut World,
    s: &Settings,
    cap: f64,
    p: &Plan,
    resumed: Vec<ProfileTrial>,
) -> (Found, Vec<ProfileTrial>) {
    search_at(world, (s, s.workload.n_ctx), cap, p, resumed)
}

/// As [`search`], at context `n_ctx` of the settings.
fn search_at(
    world: &mut World,
    (s, n_ctx): (&Settings, u32),
    cap: f64,
    p: &Plan,
    resumed: Vec<ProfileTrial>,
) -> (Found, Vec<ProfileTrial>) {
    let dir = tempfile::tempdir().unwrap();
    let mut cp: Checkpoint = serde_json::from_value(serde_json::json!({
        "schema_version": crate::profile::SCHEMA_VERSION, "kind": "checkpoint", "created_at": "2026-11-30T00:00:00Z",
        "model": {"file_name": "m.gguf", "path": "m.gguf", "file_size": 1, "sha256_16m": "0".repeat(64), "mtime": 0,
                  "architecture": "llama", "n_layer": 1, "n_layer_full": 2, "quantization": "F32", "n_params": 1, "n_expert": 0},
        "fingerprint": "f", "settings": s, "trials": []
    }))
    .unwrap();
    cp.trials = resumed;
    let checkpoint = Checkpointing::new(dir.path().join("c.json"), cp);
    let mut search = Search::new(
        s,
        crate::tune::plan::ContextRun::of(s, n_ctx),
        world,
        Some(policy(cap)),
        Progress::hidden(),
        Some(checkpoint),
    );
    let found = search.run(p).unwrap();
    let trials = search.into_trials();
    let saved = store::read_checkpoint(&dir.path().join("c.json")).expect("checkpointed after every trial");
    // The checkpoint holds every context's trials; this search's are those at its own.
    assert_eq!(saved.trials.iter().filter(|t| t.at_ctx(n_ctx)).count(), trials.len());
    (found, trials)
}

fn ngls(w: &World) -> Vec<u32> {
    w.measured.iter().map(|c| c.ngl).collect()
}

/// A whole-layer setting priced at `device` bytes on the device and `host` in a host buffer.
fn host_priced(ngl: u32, device: u64, host: u64) -> Prediction {
    use crate::engine::predict::PredictedBuffer;
    let buffer =
        PredictedBuffer { buffer_type: "CPU_Mapped".into(), is_host: true, model: host, context: 0, compute: 0 };
    Prediction {
        n_gpu_layers: ngl,
        device_bytes: device,
        device_model_bytes: 0,
        buffers: vec![buffer],
        error: None,
        case: None,
        split: Vec::new(),
        devices: Vec::new(),
    }
}

#[test]
fn a_candidate_over_the_host_cap_is_recorded_and_never_run() {
    // The README's curve (memory 0.5 + 0.1 ngl GiB on the device); on the host 1 GiB a CPU layer.
    let s = settings(None, "adaptive", false);
    let mut w = curve_world(readme_world);
    let host = |ngl: u32| f64::from(35 - ngl) * GIB;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let price = |ngl: u32| host_priced(ngl, readme_world(ngl).1 as u64, host(ngl) as u64);
    let mut search = crate::tune::worlds::search(&s, &mut w, 3.75 * GIB);
    search.predicted = (0..=35).map(price).collect();
    // 20.5 GiB: ngl 14 and below need 21 GiB or more.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let cap = (20.5 * GIB) as u64;
    search.host_cap = Some((cap, "--host-budget 20.50 GiB".into()));
    let found = search.run(&plan(35, vec![0, 10, 20, 30, 35], false, 32)).unwrap();
    let trials = search.into_trials();
    let measured = ngls(&w);
    assert!(!measured.is_empty() && measured.iter().all(|n| *n >= 15), "{measured:?}");
    let held: Vec<&ProfileTrial> = trials.iter().filter(|t| t.result.status == TrialStatus::OverHost).collect();
    assert!(held.iter().any(|t| t.result.spec.placement.n_gpu_layers == 0), "ngl 0 recorded, not run");
    let why = held[0].result.reason.as_deref().unwrap_or("");
    assert!(why.contains("over the host cap of 20.50 GiB (--host-budget 20.50 GiB)"), "{why}");
    assert!(found.decision.recommended_ngl >= 15, "{:?}", found.decision);
    // The same search without a host cap starts at ngl 0.
    let mut w = curve_world(readme_world);
    let mut search = crate::tune::worlds::search(&s, &mut w, 3.75 * GIB);
    search.predicted = (0..=35).map(price).collect();
    search.run(&plan(35, vec![0, 10, 20, 30, 35], false, 32)).unwrap();
    drop(search);
    assert!(ngls(&w).contains(&0));
}

#[test]
fn a_host_cap_under_every_placement_that_fits_the_device_is_bad_input() {
    let p = host_priced;
    const MIB: u64 = 1 << 20;
    let preds = [p(0, 0, 900 * MIB), p(10, 500 * MIB, 600 * MIB), p(20, 1000 * MIB, 300 * MIB)];
    // ngl 20 is over the device cap of 800 MiB: the least the host can get is 600 MiB at ngl 10.
    #[allow(clippy::cast_precision_loss)]
    let device = (800 * MIB) as f64;
    let e = super::super::memory::check_host(&preds, device, &(500 * MIB, "--host-budget".into())).unwrap_err();
    assert_eq!(crate::error::exit_code(&e), crate::error::exit::BAD_INPUT, "{e}");
    assert!(e.to_string().contains("the least is 600.00 MiB at ngl 10"), "{e}");
    assert!(super::super::memory::check_host(&preds, device, &(600 * MIB, "x".into())).is_ok());
    assert!(super::super::memory::check_host(&[], 800.0, &(1, "x".into())).is_ok(), "nothing priced");
}

/// The README's curve with a KV cache that grows with the context:
/// 0.5 GiB, and per offloaded layer 0.1 GiB of weights plus 0.05 GiB
/// of cache per 256 tokens of the trial's context; four streams decode
/// nearly four times the tokens (batched decoding is memory-bound).
fn kv_world(s: &Settings) -> World {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let mut w = World::of(|c, spec| {
        let (tg, _) = readme_world(c.ngl);
        let ctx = f64::from(spec.placement.n_ctx.unwrap_or(256));
        let per_layer = 0.1 + 0.05 * ctx / 256.0;
        let streams = f64::from(spec.n_streams);
        let tg = tg * streams * (1.0 - 0.05 * (streams - 1.0));
        Outcome::Ok { tg, pp: tg * 10.0, mem: ((0.5 + per_layer * f64::from(c.ngl)) * GIB) as u64 }
    });
    // The tune's base spec: the settings' context and streams.
    w.base.placement.n_ctx = Some(s.workload.n_ctx);
    w.base.n_streams = s.goal.streams();
    w
}

#[test]
fn four_streams_size_the_cache_for_four_and_the_answer_moves() {
    let grid: Vec<u32> = (0..=35).step_by(2).chain([35]).collect();
    let p = plan(35, grid, true, 35);
    let one = settings(None, "grid", false);
    let mut w = kv_world(&one);
    let (tg, _) = search(&mut w, &one, 3.0 * GIB, &p, Vec::new());
    // 0.5 + 0.15 x 16 = 2.9 GiB: the most under 3 GiB with one stream's cache.
    assert_eq!(tg.decision.recommended_ngl, 16, "{:?}", tg.decision);

    let mut four = one.clone();
    four.goal.objective = crate::types::Objective::Throughput;
    four.decode_together(4);
    assert_eq!(
        (four.workload.n_ctx, four.workload.n_parallel, four.goal.streams()),
        (1024, 4, 4),
        "four slots of 256 tokens"
    );
    let mut w = kv_world(&four);
    let (thr, trials) = search(&mut w, &four, 3.0 * GIB, &p, Vec::new());
    // The cache for four sequences: 0.5 + 0.3 x 8 = 2.9 GiB.
    assert_eq!(thr.decision.recommended_ngl, 8, "{:?}", thr.decision);
    let tg_test = trials.iter().find_map(|t| t.result.test(false)).unwrap();
    assert_eq!(tg_test.n_streams, 4, "the tg tests decode four streams: {tg_test:?}");
    assert!(trials.iter().all(|t| t.result.spec.n_streams == 4 && t.result.spec.placement.n_ctx == Some(1024)));
}

#[test]
fn the_grid_on_the_readme_curve_confirms_a_best_between_grid_points() {
    let s = settings(None, "grid", false);
    let mut w = curve_world(readme_world);
    let grid = vec![0, 10, 20, 30, 35];
    let (found, trials) = search(&mut w, &s, 3.75 * GIB, &plan(35, grid.clone(), true, 35), Vec::new());
    assert_eq!(&ngls(&w)[..4], [0, 10, 20, 30], "35 is over the cap: measured, marked, not chosen");
    assert_eq!(found.decision.recommended_ngl, 32, "0.5 + 0.1 x 32 = 3.7 GiB under 3.75: {:?}", found.decision);
    assert!(!found.decision.needs_confirmation);
    assert!(trials.iter().any(|t| t.role == Role::Confirm && t.result.spec.placement.n_gpu_layers == 32));
    assert!(trials.iter().any(|t| t.result.spec.placement.n_gpu_layers == 35 && t.over_cap));
    // Layers stay on the CPU at 32 of 35: thread counts were measured there.
    assert!(trials.iter().any(|t| t.role == Role::Threads && t.result.spec.placement.n_gpu_layers == 32));
}

#[test]
fn a_resumed_search_measures_only_what_is_missing() {
    let s = settings(None, "grid", false);
    let p = plan(35, vec![0, 10, 20, 30, 35], true, 35);
    let mut first = curve_world(readme_world);
    let (_, all) = search(&mut first, &s, 80.0 * GIB, &p, Vec::new());
    let kept: Vec<ProfileTrial> = all.iter().take(2).cloned().collect();
    let mut again = curve_world(readme_world);
    let (found, trials) = search(&mut again, &s, 80.0 * GIB, &p, kept);
    assert_eq!(ngls(&again), [20, 30, 35], "0 and 10 came from the checkpoint");
    assert_eq!(trials.len(), all.len());
    assert_eq!(found.decision.recommended_ngl, 35);
}

/// With several contexts the settings' `n_ctx` is the largest; a search
/// works at its own (`ContextRun`): it resumes that context's trials and
/// leaves the other context's to its own search.
#[test]
fn a_search_at_the_smaller_of_two_contexts_resumes_its_own_trials_not_the_largests() {
    let mut s = settings(None, "grid", false);
    (s.workload.n_ctx, s.workload.contexts) = (1024, vec![256, 1024]);
    let p = plan(35, vec![0, 10, 20, 30, 35], true, 35);
    let world_at = |ctx| {
        let mut w = kv_world(&s);
        w.base.placement.n_ctx = Some(ctx);
        w
    };
    let mut small = world_at(256);
    let (_, at_256) = search_at(&mut small, (&s, 256), 80.0 * GIB, &p, Vec::new());
    assert!(at_256.iter().all(|t| t.result.spec.placement.n_ctx == Some(256)), "measured at 256");
    let mut again = world_at(256);
    let kept: Vec<ProfileTrial> = at_256.iter().skip(1).cloned().collect();
    assert_eq!(at_256[0].result.spec.placement.n_gpu_layers, 0);
    let (_, resumed) = search_at(&mut again, (&s, 256), 80.0 * GIB, &p, kept);
    assert_eq!(ngls(&again), [0], "the other trials at 256 came from the checkpoint");
    assert_eq!(resumed.len(), at_256.len());
    let mut large = world_at(1024);
    let (_, at_1024) = search_at(&mut large, (&s, 1024), 80.0 * GIB, &p, at_256);
    assert_eq!(&ngls(&large)[..5], [0, 10, 20, 30, 35], "the 256-token trials are not the 1024-token search's");
    assert!(at_1024.iter().all(|t| t.result.spec.placement.n_ctx == Some(1024)));
}

#[test]
fn an_out_of_memory_setting_skips_the_larger_ones_unless_told_otherwise() {
    let oom_from_20 = |c: Candidate| {
        if c.ngl >= 20 {
            Outcome::Oom
        } else {
            Outcome::Ok { tg: 10.0 + f64::from(c.ngl), pp: 100.0, mem: u64::from(c.ngl) << 20 }
        }
    };
    let p = plan(41, vec![0, 10, 20, 30, 40, 41], true, 41);
    let mut w = World::new(oom_from_20);
    let (found, _) = search(&mut w, &settings(None, "grid", false), 80.0 * GIB, &p, Vec::new());
    assert_eq!(&ngls(&w)[..3], [0, 10, 20]);
    assert_eq!(found.skipped, [30, 40, 41]);
    assert!(found.decision.recommended_ngl < 20);
    let mut w = World::new(oom_from_20);
    let (found, _) = search(&mut w, &settings(None, "grid", true), 80.0 * GIB, &p, Vec::new());
    assert_eq!(&ngls(&w)[..6], [0, 10, 20, 30, 40, 41], "--no-skip measures them anyway");
    assert!(found.skipped.is_empty());
}

#[test]
fn a_setting_far_behind_is_raced_and_the_ends_decide_when_offloading_hurts() {
    let s = settings(None, "adaptive", false);
    let mut p = plan(41, crate::tune::plan::default_grid(41, 10), false, 41);
    p.top_first = false;
    let mut w = curve_world(hurting_world);
    let (found, trials) = search(&mut w, &s, 80.0 * GIB, &p, Vec::new());
    assert_eq!(&ngls(&w)[..2], [0, 41], "the two ends");
    assert!(
        found.notes.iter().any(|n| n.to_string().starts_with("adaptive search stopped after the two ends")),
        "{:?}",
        found.notes
    );
    let top = trials.iter().find(|t| t.result.spec.placement.n_gpu_layers == 41).unwrap();
    assert_eq!(top.result.tests.len(), 1, "raced on tg: its pp test never ran");
    assert!(top.result.tests[0].stopped_early && top.result.tests[0].samples_ns.len() == 1);
    assert_eq!(found.decision.recommended_ngl, 0);
    assert!(found.decision.offload_hurts);
}

#[test]
fn confirmations_stop_at_their_cap_and_say_so() {
    // Memory is linear at the grid points, but every other setting takes
    // just over the cap: each confirmation finds its setting over, and
    // the next one down is predicted just under.
    let s = settings(Some(vec![0, 100, 101]), "grid", false);
    let mut w = World::new(|c| {
        let mem = if [0, 100, 101].contains(&c.ngl) { f64::from(c.ngl) * 0.01 * GIB } else { 0.956 * GIB };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Outcome::Ok { tg: 10.0 + f64::from(c.ngl), pp: 100.0, mem: mem as u64 }
    });
    let (found, trials) = search(&mut w, &s, 0.955 * GIB, &plan(101, vec![0, 100, 101], true, 101), Vec::new());
    let confirms = trials.iter().filter(|t| t.role == Role::Confirm).count();
    assert_eq!(confirms, MAX_CONFIRMATIONS, "{:?}", ngls(&w));
    assert!(found.decision.needs_confirmation);
    assert!(
        found.notes.iter().any(|n| n.to_string().contains("confirmation trials the prediction still moved")),
        "{:?}",
        found.notes
    );
}

#[test]
fn the_fastest_thread_count_wins_where_layers_stay_on_the_cpu() {
    let s = settings(None, "grid", false);
    let mut p = plan(19, vec![0, 10, 19], true, 19);
    p.cpu = CpuInfo { brand: "fake".into(), physical_cores: 8, logical_cores: 16 };
    // Offloading hurts; on the CPU 8 threads beat 4, 2 and 16.
    let mut w = World::new(|c| {
        let by_threads = match c.threads {
            8 => 100.0,
            16 => 70.0,
            4 => 80.0,
            _ => 60.0,
        };
        Outcome::Ok { tg: by_threads / (1.0 + f64::from(c.ngl)), pp: 500.0, mem: u64::from(c.ngl) << 20 }
    });
    let (found, trials) = search(&mut w, &s, 80.0 * GIB, &p, Vec::new());
    assert_eq!(found.decision.recommended_ngl, 0);
    assert_eq!(found.threads, 8);
    let tried: Vec<u32> =
        trials.iter().filter(|t| t.role == Role::Threads).map(|t| t.result.spec.placement.n_threads).collect();
    assert_eq!(tried, [4, 8, 16], "2 was measured by the grid already");
    assert!(found.decision.reasons.iter().any(|r| r.contains("-t 8 is fastest there")), "{:?}", found.decision.reasons);
}

#[test]
fn expert_offload_wins_when_every_layer_on_the_gpu_with_experts_on_the_cpu_is_faster() {
    let s = settings(None, "grid", false);
    let mut p = plan(5, vec![0, 5], true, 5);
    p.is_moe = true;
    // Whole layers: full offload (ngl 5) is over the 100 MiB cap, ngl 0 gives 10 t/s.
    // Experts of K layers on the CPU at full offload: 60 MiB + 10 per layer kept, 40 - 5K t/s.
    let mut w = World::new(|c| {
        let (tg, mem) = match (c.ngl, c.n_cpu_moe) {
            (5, 0) => (50.0, 200),
            (5, k) => (40.0 - 5.0 * f64::from(k), 60 + 10 * u64::from(4 - k.min(4))),
            (n, _) => (10.0 + f64::from(n), 20 * u64::from(n)),
        };
        Outcome::Ok { tg, pp: 100.0, mem: mem << 20 }
    });
    let (found, trials) = search(&mut w, &s, 100.0 * 1024.0 * 1024.0, &p, Vec::new());
    let ks: Vec<u32> =
        trials.iter().filter(|t| t.role == Role::Moe).map(|t| t.result.spec.placement.n_cpu_moe).collect();
    assert_eq!(ks, [4, 3, 2, 1, 0], "most experts on the CPU first");
    assert_eq!(found.n_cpu_moe, 1, "K=1: 35 t/s in 90 MiB; K=0 is over the cap");
    assert!(found.decision.reasons.iter().any(|r| r.contains("--n-cpu-moe 1")), "{:?}", found.decision.reasons);
    assert!(found.dense_ngl < 5, "Ollama still gets the best whole-layer split");
}

/// The MoE stage is priced like the search: with every layer on the GPU
/// and no experts on the CPU over the cap by the dry run (K = 0, usually
/// the setting the search already found over it), K = 0 never runs, and
/// the reason says why.
#[test]
fn an_expert_setting_over_the_cap_by_its_dry_run_never_runs() {
    use crate::engine::predict::PredictCase;
    let s = settings(None, "grid", false);
    let mut p = plan(5, vec![0, 5], true, 5);
    p.is_moe = true;
    let mem = |ngl: u32, k: u32| -> u64 {
        match (ngl, k) {
            (5, 0) => 200,
            (5, k) => 60 + 10 * u64::from(4 - k.min(4)),
            (n, _) => 20 * u64::from(n),
        }
    };
    let mut w = World::new(move |c| {
        let tg = match (c.ngl, c.n_cpu_moe) {
            (5, 0) => 50.0,
            (5, k) => 40.0 - 5.0 * f64::from(k),
            (n, _) => 10.0 + f64::from(n),
        };
        Outcome::Ok { tg, pp: 100.0, mem: mem(c.ngl, c.n_cpu_moe) << 20 }
    });
    let price = move |cases: &[PredictCase]| -> Vec<Prediction> {
        cases
            .iter()
            .map(|c| {
                let b = mem(c.ngl, c.n_cpu_moe) << 20;
                Prediction::on_one_device(*c, b, b)
            })
            .collect()
    };
    let mut search = Search::new(
        &s,
        crate::tune::plan::ContextRun::of(&s, s.workload.n_ctx),
        &mut w,
        Some(policy(100.0 * 1024.0 * 1024.0)),
        Progress::hidden(),
        None,
    )
    .with_pricer(Box::new(crate::tune::pricer::fake::Curves::cases(price)));
    let found = search.run(&p).unwrap();
    let trials = search.into_trials();
    let ks: Vec<u32> =
        trials.iter().filter(|t| t.role == Role::Moe).map(|t| t.result.spec.placement.n_cpu_moe).collect();
    assert_eq!(ks, [4, 3, 2, 1], "K=0 priced over the cap: not run");
    assert_eq!(found.n_cpu_moe, 1);
    assert!(
        found.decision.reasons.iter().any(|r| r.contains("K=0 not run: 200.00 MiB by its dry run, over the cap")),
        "{:?}",
        found.decision.reasons
    );
}
