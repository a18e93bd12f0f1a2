//! The escape hatches' tests, in worlds of curves.

use super::*;
use crate::profile::Settings;
use crate::tune::pricer::fake::Curves;

fn option(kind: HatchKind, kv: KvType, tg: f64, fits: bool, kl: Option<f64>) -> PlacementOption {
    PlacementOption {
        kind,
        placement: crate::placement::Placement {
            n_cpu_ffn: u32::from(kind == HatchKind::FfnSpill) * 4,
            ..crate::placement::Placement::default()
        }
        .with_layers(19, 4, Some(32768))
        .with_kv(kv),
        measured: kind != HatchKind::ShorterContext,
        tg_ts: Some(tg),
        pp_ts: Some(tg * 10.0),
        tg_se_ts: Some(tg * 0.01),
        pp_se_ts: Some(tg * 0.1),
        device_bytes: Some(100),
        fits,
        quality: kl.map(|k| Quality {
            kl_mean: k,
            kl_p99: k * 5.0,
            top1_agree: 0.99,
            tokens: 256,
            reference: "f16".into(),
            non_finite: 0,
            depth: 0,
            depth_asked: 0,
            wall_s: 0.0,
        }),
        recommended: false,
        note: String::new(),
    }
}

fn settings() -> Settings {
    crate::tune::worlds::settings()
}

fn picked(options: &[PlacementOption]) -> Vec<HatchKind> {
    options.iter().filter(|o| o.recommended).map(|o| o.kind).collect()
}

#[test]
fn the_fastest_measured_option_under_the_cap_and_the_quality_limit_is_recommended() {
    let s = settings();
    // The guide's worked example: a q8_0 KV cache keeps every layer on the GPU at ~37 t/s,
    // offloading gives ~3 t/s.
    let mut v = vec![
        option(HatchKind::KvCache, KvType::Q8_0, 37.0, true, Some(0.002)),
        option(HatchKind::ShorterContext, KvType::F16, 40.0, true, None),
        option(HatchKind::FfnSpill, KvType::F16, 13.6, true, None),
        option(HatchKind::LayerSplit, KvType::F16, 3.0, true, None),
    ];
    let notes = choose(&mut v, s.scoring(), &s.gate);
    assert_eq!(picked(&v), [HatchKind::KvCache], "a shorter context is another workload: never picked");
    assert!(notes[0].to_string().contains("q8_0 KV cache"), "{notes:?}");
    assert!(v[3].note.contains("-92% tg"), "{}", v[3].note);
    let r = recommend(&Recommendation { ..layer_split() }, &v);
    assert_eq!((r.placement.n_gpu_layers, r.placement.kv_type), (19, KvType::Q8_0));
    assert!(r.llama_cpp_args.ends_with("-ctk q8_0 -ctv q8_0 -fa on"), "{}", r.llama_cpp_args);
    assert_eq!(r.ollama_server_env, ["OLLAMA_KV_CACHE_TYPE=q8_0", "OLLAMA_FLASH_ATTENTION=1"]);
    // A Modelfile cannot carry the server's cache type: num_gpu is the whole-layer split, which
    // fits with the cache the server runs; a comment says what OLLAMA_KV_CACHE_TYPE=q8_0 allows.
    assert_eq!(r.ollama_num_gpu, Some(7));
    assert!(r.modelfile.contains(&"PARAMETER num_gpu 7".to_string()), "{:?}", r.modelfile);
    let comment = &r.modelfile[0];
    assert!(
        comment.contains("with OLLAMA_KV_CACHE_TYPE=q8_0 on the server") && comment.contains("num_gpu 19"),
        "{comment}"
    );
    // What the in-place Modelfile writers pin (emit::modelfile::params reads it).
    assert_eq!(r.ollama_num_gpu_param(), Some(7));

    // Over --max-kl, or quality unknown: not recommended blind; the FFN spill wins.
    for kl in [Some(0.2), None] {
        let mut v = vec![
            option(HatchKind::KvCache, KvType::Q4_0, 37.0, true, kl),
            option(HatchKind::FfnSpill, KvType::F16, 13.6, true, None),
            option(HatchKind::LayerSplit, KvType::F16, 3.0, true, None),
        ];
        choose(&mut v, s.scoring(), &s.gate);
        assert_eq!(picked(&v), [HatchKind::FfnSpill], "{kl:?}");
        assert!(v[0].note.contains("max-kl") || v[0].note.contains("blind"), "{}", v[0].note);
        let r = recommend(&layer_split(), &v);
        assert_eq!(r.ollama_num_gpu, Some(7), "Ollama gets the whole-layer split");
        // Every form is rendered from the fields: the Modelfile's layers are Ollama's, the flags the spill's.
        assert!(r.modelfile.contains(&"PARAMETER num_gpu 7".to_string()), "{:?}", r.modelfile);
        assert!(r.ollama_server_env.is_empty(), "{:?}", r.ollama_server_env);
        assert!(r.llama_cpp_args.contains("-ot 'blk"), "{}", r.llama_cpp_args);
    }

    // Over the cap when measured: out, whatever its speed.
    let mut v = vec![
        option(HatchKind::FfnSpill, KvType::F16, 13.6, false, None),
        option(HatchKind::LayerSplit, KvType::F16, 3.0, true, None),
    ];
    choose(&mut v, s.scoring(), &s.gate);
    assert_eq!(picked(&v), [HatchKind::LayerSplit]);
    assert_eq!(recommend(&layer_split(), &v), layer_split());
}

#[test]
fn a_broken_or_unknown_quality_is_ineligible_with_its_reason() {
    let s = settings();
    let quality = |f: &dyn Fn(&mut Quality)| {
        let mut o = option(HatchKind::KvCache, KvType::Q8_0, 37.0, true, Some(0.001));
        f(o.quality.as_mut().unwrap());
        let mut v = vec![o, option(HatchKind::LayerSplit, KvType::F16, 3.0, true, None)];
        choose(&mut v, s.scoring(), &s.gate);
        assert_eq!(picked(&v), [HatchKind::LayerSplit]);
        v[0].note.clone()
    };
    // A NaN KL divergence (a broken quantized path) never reads as perfect quality.
    let nan = crate::engine::quality::compare(&[vec![0.0, f32::NEG_INFINITY]], &[vec![f32::NAN, 0.0]], "f16");
    assert_eq!((nan.non_finite, nan.tokens), (1, 0));
    let q = nan.clone();
    assert!(quality(&move |x| *x = q.clone()).contains("not a number"));
    assert!(quality(&|q| q.kl_mean = f64::NAN).contains("not a number"));
    assert!(quality(&|q| q.tokens = 99).contains("only 99 tokens"));
    assert!(quality(&|q| q.top1_agree = 0.5).contains("--min-top1"));
}

#[test]
fn a_lossy_cache_within_noise_of_a_lossless_option_is_not_recommended() {
    let s = settings();
    // q8_0 KV measured 2% faster than the FFN spill, each ±3% (standard error): a tie.
    let mut q8 = option(HatchKind::KvCache, KvType::Q8_0, 13.9, true, Some(0.001));
    let mut spill = option(HatchKind::FfnSpill, KvType::F16, 13.6, true, None);
    q8.tg_se_ts = Some(0.4);
    spill.tg_se_ts = Some(0.4);
    let mut v = vec![q8.clone(), spill.clone(), option(HatchKind::LayerSplit, KvType::F16, 3.0, true, None)];
    choose(&mut v, s.scoring(), &s.gate);
    assert_eq!(picked(&v), [HatchKind::FfnSpill]);
    assert!(v[0].note.contains("within the noise"), "{}", v[0].note);
    // Beyond the noise it pays, and is recommended.
    q8.tg_ts = Some(20.0);
    let mut v = vec![q8.clone(), spill, option(HatchKind::LayerSplit, KvType::F16, 3.0, true, None)];
    choose(&mut v, s.scoring(), &s.gate);
    assert_eq!(picked(&v), [HatchKind::KvCache]);
    // The only way to fit: recommended within any noise.
    let mut v = vec![q8, option(HatchKind::LayerSplit, KvType::F16, 3.0, false, None)];
    choose(&mut v, s.scoring(), &s.gate);
    assert_eq!(picked(&v), [HatchKind::KvCache]);
}

fn layer_split() -> Recommendation {
    crate::tune::worlds::recommendation()
}

/// A model of 10 layers + output: each layer 100 bytes of weights, 60
/// of them FFN; the KV cache 0.01 bytes per token per layer in f16
/// (half in q8_0, a quarter in q4_0); the output layer 100.
fn bytes_at(c: Candidate, n_ctx: u32) -> u64 {
    let layers = u64::from(c.ngl.min(10));
    // The workload's own type is f16 here.
    let per_token = match c.kv {
        None => 1.0,
        Some(KvType::Q8_0) => 0.5,
        Some(KvType::Q4_0) => 0.25,
        Some(other) => unreachable!("the hatches here measure q8_0 and q4_0 beside the own type, not {other:?}"),
    };
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let kv = (f64::from(n_ctx) * 0.01 * per_token) as u64 * layers;
    layers * 100 - u64::from(c.n_cpu_ffn.min(c.ngl)) * 60 + kv + if c.ngl > 10 { 100 } else { 0 }
}

fn predictor(cases: &[PredictCase]) -> Vec<Prediction> {
    cases
        .iter()
        .map(|c| {
            let cand = Candidate { n_cpu_ffn: c.n_cpu_ffn, kv: c.kv_type, ..Candidate::layers(c.ngl, 2) };
            let all = bytes_at(cand, c.n_ctx);
            let weights = bytes_at(Candidate { kv: None, ..cand }, 0);
            Prediction::on_one_device(*c, all, weights)
        })
        .collect()
}

/// Runs the hatch stage in a world where full offload is fastest (40
/// t/s), a q8_0 cache costs a little (37), FFN weights on the CPU cost
/// more (13.6), and whole layers on the CPU cost most (3 + 0.3 per layer
/// on the GPU).
fn guide_tg(c: Candidate, _depth: u32) -> f64 {
    match (c.ngl, c.kv, c.n_cpu_ffn) {
        (11, None, 0) => 40.0,
        (11, None, _) => 13.6,
        (11, _, _) => 37.0,
        (n, _, _) => 3.0 + 0.3 * f64::from(n),
    }
}

fn hatch_world(cap: f64, split_ngl: u32) -> (Hatches, Vec<Candidate>) {
    hatch_world_at(cap, split_ngl, 0, guide_tg)
}

/// The hatch stage at `depth` in a world whose tg is `tg` (the layer
/// split measured there too).
fn hatch_world_at(cap: f64, split_ngl: u32, depth: u32, tg: fn(Candidate, u32) -> f64) -> (Hatches, Vec<Candidate>) {
    let (hatches, measured, unpriced) = hatch_world_priced(cap, split_ngl, depth, tg, Curves::cases(predictor));
    assert_eq!(unpriced, None, "every dry run answered");
    (hatches, measured)
}

/// As [`hatch_world_at`], priced by `pricer`; also the dry run's first failure.
fn hatch_world_priced(
    cap: f64,
    split_ngl: u32,
    depth: u32,
    tg: fn(Candidate, u32) -> f64,
    pricer: Curves<'static>,
) -> (Hatches, Vec<Candidate>, Option<String>) {
    use crate::tune::executor::fake::{Outcome, World};
    let s = settings();
    let mut world =
        World::at_depth(move |c: Candidate, d| Outcome::Ok { tg: tg(c, d), pp: 100.0, mem: bytes_at(c, 32768) });
    world.base.placement.n_ctx = Some(32768);
    world.base.n_depth = depth;
    let mut search = crate::tune::worlds::search(&s, &mut world, cap).with_pricer(Box::new(pricer));
    let h = inputs(cap);
    let mut split = layer_split();
    split.placement.n_gpu_layers = split_ngl;
    split.tg_ts = Some(tg(Candidate::layers(split_ngl, 2), depth));
    let quality = |k: KvType| Quality {
        kl_mean: if k == KvType::Q8_0 { 0.002 } else { 0.02 },
        kl_p99: 0.01,
        top1_agree: 0.98,
        tokens: 256,
        reference: "f16".into(),
        non_finite: 0,
        depth: 0,
        depth_asked: 0,
        wall_s: 0.0,
    };
    let one = Topology::One { h: &h, layer_split: &split };
    let hatches = run(one, &mut search, &mut |k| Ok(Some(quality(k)))).unwrap();
    let unpriced = search.take_unpriced();
    drop(search);
    (hatches, world.measured, unpriced)
}

/// The fake world's model at 32k: 10 layers and the output one, f16 KV cache, two threads.
/// The hatch stage's own trials among `measured`: a lossy cache paired
/// with the lossless answer runs each side at its context, named.
fn hatch_trials(measured: &[Candidate]) -> impl Iterator<Item = &Candidate> {
    measured.iter().filter(|c| c.ctx == 0)
}

fn inputs(cap: f64) -> HatchInputs {
    HatchInputs {
        full: 11,
        n_layer: 10,
        is_moe: false,
        cap,
        n_ctx: 32768,
        kv: KvType::F16,
        threads: 2,
        op_offload: true,
        rpc: Vec::new(),
        grid: vec![0, 5, 10, 11],
        workload: crate::placement::Placement::default(),
    }
}

/// The hatch stage where NVML sees every trial hold `driver` bytes beyond
/// llama.cpp's accounting (its dry run prices the accounted bytes).
fn hatch_world_sampled(cap: f64, driver: u64) -> Hatches {
    use crate::tune::executor::fake::{Outcome, World};
    let s = settings();
    let mut world = World::new(|c: Candidate| Outcome::Ok { tg: guide_tg(c, 0), pp: 100.0, mem: bytes_at(c, 32768) });
    world.base.placement.n_ctx = Some(32768);
    world.driver_bytes = Some(driver);
    let policy =
        crate::profile::MemoryPolicy { source: crate::types::Source::Nvml, ..crate::tune::worlds::policy(cap) };
    let at = crate::tune::plan::ContextRun::of(&s, s.workload.n_ctx);
    let mut search =
        crate::tune::search::Search::new(&s, at, &mut world, Some(policy), crate::progress::Progress::hidden(), None)
            .with_pricer(Box::new(Curves::cases(predictor)));
    // The whole-layer search ran before the hatches: one trial, priced and sampled.
    search.predicted.extend(predictor(&[PredictCase {
        ngl: 6,
        n_ctx: 32768,
        kv_type: None,
        n_cpu_ffn: 0,
        n_cpu_moe: 0,
    }]));
    search.measure(Role::Grid, Candidate::layers(6, 2), None).unwrap();
    let h = inputs(cap);
    let mut split = layer_split();
    split.placement.n_gpu_layers = 6;
    let quality = |_| Ok(Some(Quality { top1_agree: 0.98, tokens: 256, ..Quality::passing() }));
    run(Topology::One { h: &h, layer_split: &split }, &mut search, &mut { quality }).unwrap()
}

#[test]
fn what_the_driver_holds_beyond_the_dry_run_is_kept_out_of_every_predicted_option() {
    // f16 full offload prices 4370 at 32k; the cap is 4400, so by the dry run
    // alone it fits, and the largest f16 context that fits fully is 32768.
    assert_eq!(crate::tune::search::unaccounted(&[]), 0);
    let blind = hatch_world_sampled(4400.0, 0);
    assert!(blind.fits_fully, "{:?}", blind.options);
    // A driver that holds 100 more: full offload really takes 4470 > 4400.
    let seen = hatch_world_sampled(4400.0, 100);
    assert!(!seen.fits_fully, "held to 4300, 4370 is over");
    let shorter: Vec<&PlacementOption> = seen
        .options
        .iter()
        .filter(|o| o.kind == HatchKind::ShorterContext && o.placement.kv_type == KvType::F16)
        .collect();
    assert_eq!(shorter.len(), 1, "{:?}", seen.options);
    let o = shorter[0];
    assert!(o.n_ctx() < 32768 && o.fits, "{o:?}");
    #[allow(clippy::cast_precision_loss)]
    let real = (o.device_bytes.unwrap() + 100) as f64;
    assert!(real <= 4400.0, "the predicted option plus what the driver holds stays under the cap: {real}");
    let said: Vec<String> = seen.notes.iter().map(ToString::to_string).collect();
    assert!(said.iter().any(|n| n.contains("held to the cap less")), "{said:?}");
}

#[test]
fn an_options_flags_say_the_batch_and_slots_its_trial_ran_with() {
    // Ollama's batch at 32k (-b 1024 -ub 1024) and two slots: what every trial runs.
    let mut s = settings();
    (s.workload.n_batch, s.workload.n_ubatch, s.workload.n_parallel) = (1024, 1024, 2);
    let at = crate::tune::plan::ContextRun::of(&s, 32768);
    let h = HatchInputs { workload: at.workload((&s.workload, &s.backend)), ..inputs(4000.0) };
    let flags = h.placement(h.at_full(32768, Some(KvType::Q8_0), 0)).flags();
    assert!(flags.contains("-b 1024 -ub 1024") && flags.contains("-np 2"), "{flags}");
    assert!(flags.contains("-ctk q8_0") && flags.contains("-fa on"), "{flags}");
}

#[test]
fn a_dry_run_that_fails_leaves_the_hatches_unpriced_unmeasured_and_said() {
    let (hatches, measured, unpriced) =
        hatch_world_priced(4000.0, 6, 0, guide_tg, Curves::failing("worker killed by signal 6"));
    assert_eq!(unpriced.as_deref(), Some("worker killed by signal 6"), "kept for the tune to say");
    assert!(measured.is_empty(), "nothing priced, nothing run: {measured:?}");
    assert!(hatches.options.is_empty(), "{:?}", hatches.options);
    let said: Vec<String> = hatches.notes.iter().map(ToString::to_string).collect();
    assert!(said.iter().any(|n| n.contains("escape hatches not priced")), "{said:?}");
}

#[test]
fn where_whole_layers_lose_only_at_depth_the_spill_is_recommended_when_tuned_at_depth() {
    // Whole layers on the CPU move their KV cache and attention there: tied with an FFN
    // spill on an empty cache, far behind once the cache is full (the guide's 13.6 vs 1.03 t/s).
    fn tg(c: Candidate, depth: u32) -> f64 {
        let filled = f64::from(depth) / 16384.0;
        match (c.ngl, c.kv, c.n_cpu_ffn) {
            (11, None, 0) => 40.0,
            (11, None, _) => 13.6,
            (11, _, _) => 1.0,
            (n, _, _) => 13.7 + f64::from(n) * 0.01 - 12.6 * filled,
        }
    }
    // f16 full offload (4370) is over 4000; an FFN spill of 7 layers (3950) fits.
    let (empty, _) = hatch_world_at(4000.0, 6, 0, tg);
    let (deep, _) = hatch_world_at(4000.0, 6, settings().depth_at(32768), tg);
    assert_eq!(settings().depth_at(32768), 16384, "half the context");
    let pick = |h: &Hatches| h.options.iter().find(|o| o.recommended).map(|o| o.kind);
    assert_eq!(pick(&empty), Some(HatchKind::LayerSplit), "{:?}", empty.options);
    assert_eq!(pick(&deep), Some(HatchKind::FfnSpill), "{:?}", deep.options);
    // The q8_0 cache at full offload (1 t/s) could not win: its quality is not checked.
    for h in [&empty, &deep] {
        let kv = h.options.iter().find(|o| o.kind == HatchKind::KvCache && o.measured).unwrap();
        assert!(kv.quality.is_none() && !kv.recommended, "{kv:?}");
        assert!(kv.note.contains("quality not checked") && kv.note.contains("% tg against"), "{}", kv.note);
    }
}

#[test]
fn the_guides_example_a_q8_0_cache_keeps_every_layer_on_the_gpu() {
    // f16 full offload: 10 x (100 + 327) + 100 = 4370; q8_0: 10 x (100 + 163) + 100 = 2730.
    let (h, measured) = hatch_world(3000.0, 6);
    assert!(!h.fits_fully);
    let kinds: Vec<(HatchKind, bool)> = h.options.iter().map(|o| (o.kind, o.measured)).collect();
    assert_eq!(kinds[0], (HatchKind::KvCache, true));
    assert!(kinds.contains(&(HatchKind::ShorterContext, false)));
    assert_eq!(kinds.last(), Some(&(HatchKind::LayerSplit, true)));
    let picked: Vec<&PlacementOption> = h.options.iter().filter(|o| o.recommended).collect();
    assert_eq!(
        (picked[0].kind, picked[0].placement.kv_type, picked[0].placement.n_gpu_layers),
        (HatchKind::KvCache, KvType::Q8_0, 11)
    );
    assert_eq!(picked[0].quality.as_ref().map(|q| q.kl_mean), Some(0.002));
    // Attention and KV alone are over 3000: no FFN spill can fit, so none is measured.
    assert!(measured.iter().all(|c| c.n_cpu_ffn == 0), "{measured:?}");
    assert!(h.options.iter().any(|o| o.kind == HatchKind::FfnSpill && !o.measured && !o.fits));
}

#[test]
fn ffn_weights_on_the_cpu_are_measured_where_they_fit_and_a_partial_q8_0_cache_where_nothing_fits_fully() {
    // 4370 at full offload; the FFN of K layers saves 60 each: K = 3 gives 4190.
    let (h, measured) = hatch_world(4200.0, 8);
    let spills: Vec<u32> = hatch_trials(&measured).filter(|c| c.n_cpu_ffn > 0).map(|c| c.n_cpu_ffn).collect();
    assert_eq!(spills, [3, 4], "the fewest that fit and one more");
    // q8_0 fits at full offload here and wins (37 against 13.6), paired with the spill.
    assert!(h.options.iter().any(|o| o.recommended && o.kind == HatchKind::KvCache));

    // 1500: not even q4_0 fits at full offload (10 x 181 + 100 = 1910). Each type at the most
    // layers it lets on: q8_0 at 5 (5 x 263 = 1315), q4_0 at 8 (8 x 181 = 1448).
    let (h, measured) = hatch_world(1500.0, 3);
    let kv: Vec<(Option<KvType>, u32)> =
        hatch_trials(&measured).filter(|c| c.kv.is_some()).map(|c| (c.kv, c.ngl)).collect();
    assert_eq!(kv, [(Some(KvType::Q8_0), 5), (Some(KvType::Q4_0), 8)], "{measured:?}");
    let o = |kv: KvType| h.options.iter().find(|o| o.kind == HatchKind::KvCache && o.placement.kv_type == kv).unwrap();
    // q8_0 could not win (4.5 against 5.4 t/s): its quality was never read.
    assert!(o(KvType::Q8_0).note.contains("quality not checked"), "{}", o(KvType::Q8_0).note);
    // q4_0's three more layers run faster here (5.4 against 4.5 t/s), and its quality passes.
    let q4 = o(KvType::Q4_0);
    assert!(q4.fits && q4.recommended && q4.placement.n_gpu_layers == 8, "{q4:?}");
    assert!(
        q4.note.contains("full offload is over the cap even with q4_0: llama.cpp's dry run predicts"),
        "{}",
        q4.note
    );
    // Every layer's FFN on the CPU is not enough either: one option says so, from the price.
    let ffn: Vec<&PlacementOption> = h.options.iter().filter(|o| o.kind == HatchKind::FfnSpill).collect();
    assert_eq!(ffn.len(), 1, "{ffn:?}");
    assert!(
        ffn[0]
            .note
            .starts_with("over the cap even with every layer's FFN weights on the CPU: llama.cpp's dry run predicts"),
        "{}",
        ffn[0].note
    );
}

#[test]
fn a_q8_0_cache_that_fits_only_below_the_grids_first_point_is_found_from_the_split_up() {
    // 800: f16 fits one layer (427), q8_0 three (3 x 263 = 789); the grid's 5 is over either way.
    let (h, measured) = hatch_world(800.0, 1);
    let kv: Vec<&Candidate> = hatch_trials(&measured).filter(|c| c.kv == Some(KvType::Q8_0)).collect();
    assert_eq!(kv.iter().map(|c| c.ngl).collect::<Vec<_>>(), [3], "{measured:?}");
    assert!(h.options.iter().any(|o| o.kind == HatchKind::KvCache && o.measured && o.placement.n_gpu_layers == 3));
}

/// Issue 54 item 8: q4_0 fits at full offload (1910 under 2500) and q8_0
/// does not (2730), yet q8_0 at 9 layers (9 x 263 = 2367) is a candidate:
/// on a card, where q4_0's dequantization costs more than two layers'
/// reads, it is the faster one. Before, the hatch measured q4_0 alone.
#[test]
fn the_kv_types_and_the_layers_are_one_search() {
    fn tg(c: Candidate, _depth: u32) -> f64 {
        match (c.ngl, c.kv) {
            (9, Some(KvType::Q8_0)) => 30.0,
            (11, Some(KvType::Q4_0)) => 20.0,
            (n, _) => 3.0 + 0.3 * f64::from(n),
        }
    }
    let (h, measured) = hatch_world_at(2500.0, 5, 0, tg);
    let kv: Vec<(Option<KvType>, u32)> =
        hatch_trials(&measured).filter(|c| c.kv.is_some()).map(|c| (c.kv, c.ngl)).collect();
    assert_eq!(kv, [(Some(KvType::Q8_0), 9), (Some(KvType::Q4_0), 11)], "{measured:?}");
    let pick = h.options.iter().find(|o| o.recommended).unwrap();
    assert_eq!((pick.kind, pick.placement.kv_type, pick.placement.n_gpu_layers), (HatchKind::KvCache, KvType::Q8_0, 9));
    assert_eq!(pick.quality.as_ref().map(|q| q.kl_mean), Some(0.002), "q8_0's own quality, checked");
    // q4_0 could not win: its quality was never read.
    let q4 = h.options.iter().find(|o| o.placement.kv_type == KvType::Q4_0).unwrap();
    assert!(q4.measured && q4.quality.is_none() && q4.note.contains("quality not checked"), "{q4:?}");
    // Where q4_0 at full offload is the faster, it wins, with its own quality checked.
    fn q4_faster(c: Candidate, d: u32) -> f64 {
        if c.kv == Some(KvType::Q4_0) {
            40.0
        } else {
            tg(c, d)
        }
    }
    let (h, _) = hatch_world_at(2500.0, 5, 0, q4_faster);
    let pick = h.options.iter().find(|o| o.recommended).unwrap();
    assert_eq!((pick.placement.kv_type, pick.placement.n_gpu_layers), (KvType::Q4_0, 11));
    assert_eq!(pick.quality.as_ref().map(|q| q.kl_mean), Some(0.02));
}

#[test]
fn largest_context_that_fits() {
    // 100 MB at 8k, 180 MB at 16k: 10 MB per 1k tokens.
    let mb = 1_000_000;
    assert_eq!(largest_ctx(Some(100 * mb), Some(180 * mb), 16384, 500e6), Some(16384), "fits");
    let c = largest_ctx(Some(100 * mb), Some(180 * mb), 16384, 150e6).unwrap();
    assert!(c.is_multiple_of(256) && c < 16384 && c > 8192, "{c}");
    assert_eq!(largest_ctx(Some(100 * mb), Some(180 * mb), 16384, 1e6), None, "nothing fits");
    assert_eq!(largest_ctx(None, Some(1), 16384, 1e9), None);
}

#[test]
fn ffn_layers_to_spill() {
    // 1000 bytes with one layer's FFN on the CPU, 100 with all 10: 100 per layer.
    assert_eq!(ffn_layers_needed(Some(1000), Some(100), 10, 2000.0), Some(1));
    assert_eq!(ffn_layers_needed(Some(1000), Some(100), 10, 750.0), Some(4));
    assert_eq!(ffn_layers_needed(Some(1000), Some(100), 10, 99.0), None, "attention and KV alone are over");
}

/// The hatches across several devices, in the split stage's fixed world.
mod several {
    use crate::tune::hatch::ffn::FfnSpill;
    use crate::tune::hatch::kv::KvCache;
    use crate::tune::hatch::Hatch;
    use crate::tune::split::tests::{caps, fixed_world, fixed_world_with};
    use crate::tune::split::{against_llama, recommendation, SplitFound};
    use crate::types::Role;

    /// The fixed world, then the q8_0 hatch with a cache of this quality
    /// (KL divergence 0.002 passes the default gate, 0.5 not).
    fn with_kv_hatch(kl: f64) -> (SplitFound, Vec<Vec<u32>>) {
        let quality = crate::types::Quality {
            kl_mean: kl,
            kl_p99: kl * 5.0,
            top1_agree: 0.99,
            tokens: 512,
            reference: "f16 KV cache".into(),
            non_finite: 0,
            depth: 0,
            depth_asked: 0,
            wall_s: 0.0,
        };
        fixed_world(|search, inp, found| {
            let mut assess = |_| Ok(Some(quality.clone()));
            KvCache::default().across_devices(search, inp, found, &mut assess).unwrap();
        })
    }

    #[test]
    fn a_q8_0_cache_is_measured_where_it_lets_more_layers_onto_the_fast_device() {
        // With a q8_0 cache a layer takes 8 MB: D1 holds 15 at full offload, 3 more than with f16.
        let (found, measured) = with_kv_hatch(0.002);
        assert_eq!(measured.last(), Some(&vec![6, 15]), "{measured:?}");
        let best = &found.options[found.best.unwrap()];
        assert_eq!((best.tensor_split.clone(), best.placement.kv_type), (vec![6, 15], crate::placement::KvType::Q8_0));
        // 20 + 6 - 7.5 = 18.5 ms a token, as predicted, against 23 for the f16 split.
        let (p, m) = (best.predicted_tg_ts.unwrap(), best.tg_ts.unwrap());
        assert!((p / m - 1.0).abs() < 0.01 && (m - 1000.0 / 18.5).abs() < 0.5, "{p} {m}");
        assert!(best.fits && best.llama_cpp_args().contains("-ctk q8_0 -ctv q8_0 -fa on"), "{}", best.llama_cpp_args());
        let devs = caps(&[105_000_000, 150_000_000]);
        let r = recommendation(&crate::tune::worlds::recommendation(), best, &devs, &[]);
        assert_eq!(r.placement.kv_type, crate::placement::KvType::Q8_0);
        // A cache whose quality fails the gate is measured, not recommended.
        let (found, _) = with_kv_hatch(0.5);
        let best = &found.options[found.best.unwrap()];
        assert_eq!((best.tensor_split.clone(), best.placement.kv_type), (vec![9, 12], crate::placement::KvType::F16));
        let q8 = found.options.iter().find(|o| o.placement.kv_type.is_quantized()).unwrap();
        assert!(q8.measured && q8.note.contains("KL"), "{}", q8.note);
    }

    /// The fixed world, then FFN spill with these link costs, then the
    /// pairing with llama.cpp's default split; what was found, measured
    /// (layers), and the FFN layers on the CPU in each paired trial.
    fn with_ffn_hatch(link_ms: &[f64]) -> (SplitFound, Vec<Vec<u32>>, Vec<u32>) {
        let mut paired = Vec::new();
        let (found, measured) = fixed_world_with(0.0, link_ms, |search, inp, found| {
            FfnSpill::default().across_devices(search, inp, found, &mut |_| Ok(None)).unwrap();
            found.against = against_llama(search, found, inp, None).unwrap();
            let trials = search.trials.iter().filter(|t| t.role == Role::Paired);
            paired = trials.map(|t| t.result.spec.placement.n_cpu_ffn).collect();
        });
        (found, measured, paired)
    }

    #[test]
    fn ffn_spill_lets_the_fast_device_hold_every_layer_where_it_is_predicted_faster() {
        // D1 (fast) holds 12 of 21 layers in f16; alone with all 21 it is 90 MB
        // over its 150 MB cap; the FFN (6 MB) of 15 layers on the CPU fits.
        let (found, measured, paired) = with_ffn_hatch(&[0.0, 0.0]);
        assert!(measured.contains(&vec![0, 21]), "{measured:?}");
        // Paired with llama.cpp's default split as it is emitted: the spill kept (AB BA BA).
        assert_eq!(paired, vec![15, 0, 0, 15, 0, 15], "{measured:?}");
        let best = &found.options[found.best.unwrap()];
        assert_eq!((best.tensor_split.clone(), best.placement.n_cpu_ffn), (vec![0, 21], 15), "{:?}", found.options);
        assert!(best.fits && best.accounted_bytes[1] <= 150_000_000, "{:?}", best.accounted_bytes);
        // 20 - 10.5 + 15 x 0.6 x 0.5 = 14 ms a token, as predicted, against 23 for 9 + 12.
        let (p, m) = (best.predicted_tg_ts.unwrap(), best.tg_ts.unwrap());
        assert!((p / m - 1.0).abs() < 0.01 && (m - 1000.0 / 14.0).abs() < 0.5, "{p} {m}");
        assert!(
            best.llama_cpp_args()
                .contains("-ot 'blk\\.(0|1|2|3|4|5|6|7|8|9|10|11|12|13|14)\\.ffn_(up|down|gate)\\.weight=CPU'"),
            "{}",
            best.llama_cpp_args()
        );
        assert!(best.llama_cpp_args().contains("-ts 0,21"), "{}", best.llama_cpp_args());
        let devs = caps(&[105_000_000, 150_000_000]);
        let r = recommendation(&crate::tune::worlds::recommendation(), best, &devs, &[]);
        assert_eq!((r.placement.n_cpu_ffn, r.placement.tensor_split.clone()), (15, vec![0, 21]));
        // Behind a link that costs 1 ms a token there and back, each spilled
        // layer crosses it again: 9.5 + 1 + 15 x 1.3 = 30 ms predicted,
        // slower than 23: not measured.
        let (found, measured, _) = with_ffn_hatch(&[0.0, 1.0]);
        assert!(!measured.contains(&vec![0, 21]), "{measured:?}");
        assert_eq!(found.options[found.best.unwrap()].tensor_split, vec![9, 12]);
        assert!(found.notes.iter().any(|n| n.to_string().contains("predicted slower")), "{:?}", found.notes);
    }
}

/// The choices paired across loads (`paired_choice`).
mod paired;
