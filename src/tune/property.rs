//! Issue 54's property, over random fake worlds and random requests: one
//! context's tune as `tune_context` runs it (the whole-layer search, the
//! escape hatches, llama.cpp's default and fit at the user's run paired
//! with the answer, the gate), in worlds of curves whose speeds are noisy
//! and drift between trials, with a default that wins, ties or loses and
//! caps from a tenth of the model to more than all of it. Whatever the
//! world, the answer the paths hand the gate is admitted as it is (no path
//! forgot a cap), every form written from it reads back to it at the
//! user's context and slots (llama.cpp's flags through `placement::args`, the
//! Modelfile through Ollama's parser), and no trial over the cap ran but
//! a baseline's. A failure names its seed.

use std::cell::RefCell;
use std::rc::Rc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{admit, gate_of};
use crate::engine::predict::{LlamaFit, PredictCase, Prediction};
use crate::placement::KvType;
use crate::tune::executor::fake::{Outcome, World};
use crate::tune::hatch::{self, HatchInputs, Topology};
use crate::tune::plan::{default_grid, Candidate, ContextRun, Plan};
use crate::types::{Objective, Quality, Role};

const MIB: u64 = 1 << 20;

/// A model of `layers` repeating layers and an output one.
#[derive(Debug, Clone, Copy)]
struct Model {
    layers: u32,
    /// Weights per layer (the output layer the same).
    weights: u64,
    /// f16 KV cache bytes per token per layer.
    kv_per_token: f64,
    /// Compute buffers, on the device at every setting.
    fixed: u64,
    /// Seconds per token of a layer on the device, and on the CPU.
    gpu_s: f64,
    cpu_s: f64,
}

impl Model {
    /// Device bytes of `ngl` layers at `ctx` tokens with KV type `kv`
    /// (`None`: f16) and the FFN weights of `ffn` layers on the CPU.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn bytes(&self, ngl: u32, kv: Option<KvType>, ffn: u32, ctx: u32) -> u64 {
        let on = ngl.min(self.layers);
        let share = match kv {
            Some(KvType::Q8_0) => 0.53,
            Some(KvType::Q4_0) => 0.28,
            _ => 1.0,
        };
        let kv_layer = (self.kv_per_token * f64::from(ctx) * share) as u64;
        let spilled = u64::from(ffn.min(on)) * self.weights * 6 / 10;
        let output = if ngl > self.layers { self.weights } else { 0 };
        self.fixed + u64::from(on) * (self.weights + kv_layer) - spilled + output
    }

    /// Seconds per generated token of a candidate.
    fn s_per_token(&self, c: Candidate) -> f64 {
        let on = c.ngl.min(self.layers + 1);
        let off = self.layers + 1 - on;
        let spill = f64::from(c.n_cpu_ffn.min(on)) * (self.cpu_s - self.gpu_s) * 0.6;
        let dequant = match c.kv {
            Some(KvType::Q4_0) => 1.15,
            Some(KvType::Q8_0) => 1.05,
            _ => 1.0,
        };
        (f64::from(on) * self.gpu_s * dequant + f64::from(off) * self.cpu_s + spill).max(1e-6)
    }

    fn price(&self, c: &PredictCase, user_ctx: u32) -> Prediction {
        let ctx = if c.n_ctx == 0 { user_ctx } else { c.n_ctx };
        let all = self.bytes(c.ngl, c.kv_type, c.n_cpu_ffn, ctx);
        let weights = self.bytes(c.ngl, c.kv_type, c.n_cpu_ffn, 0);
        Prediction::on_one_device(*c, all, weights)
    }
}

/// One random world and request.
#[derive(Debug, Clone)]
struct Case {
    model: Model,
    ctx: u32,
    objective: Objective,
    parallel: u32,
    cap: f64,
    /// Trial-to-trial noise (a share of the speed) and drift per trial.
    noise: f64,
    drift: f64,
    grid_mode: bool,
    /// llama.cpp's default: its layers (-1: all) and its own context.
    default_ngl: i32,
    default_ctx: u32,
    /// Its speed against the world's (a default that wins, ties or loses).
    default_speed: f64,
    kl: f64,
}

fn case(seed: u64) -> Case {
    let mut r = StdRng::seed_from_u64(seed);
    let layers = r.random_range(6..=40);
    let model = Model {
        layers,
        weights: r.random_range(20..=200) * MIB,
        kv_per_token: f64::from(r.random_range(2_000..=40_000)),
        fixed: r.random_range(10..=300) * MIB,
        gpu_s: r.random_range(0.0002..0.002),
        cpu_s: r.random_range(0.003..0.03),
    };
    let ctx = [2048, 4096, 8192, 16384][r.random_range(0..4)];
    let (objective, parallel) = match r.random_range(0..4) {
        0 => (Objective::Pp, 1),
        1 => (Objective::Mixed, 1),
        2 => (Objective::Throughput, [2, 4][r.random_range(0..2)]),
        _ => (Objective::Tg, 1),
    };
    #[allow(clippy::cast_precision_loss)]
    let full_bytes = model.bytes(layers + 1, None, 0, ctx) as f64;
    Case {
        model,
        ctx,
        objective,
        parallel,
        // Never below what ngl 0 holds on the device (its compute buffers): nothing fits there.
        #[allow(clippy::cast_precision_loss)]
        cap: (full_bytes * r.random_range(0.12..1.3)).max(model.fixed as f64 * 1.2),
        noise: [0.0, 0.02, 0.1][r.random_range(0..3)],
        drift: [0.0, 0.005, -0.005][r.random_range(0..3)],
        grid_mode: r.random_bool(0.5),
        default_ngl: if r.random_bool(0.5) { -1 } else { r.random_range(0..=i32::try_from(layers).unwrap_or(0) + 1) },
        default_ctx: ctx * [1, 2, 4][r.random_range(0..3)],
        default_speed: [0.5, 1.0, 1.5][r.random_range(0..3)],
        kl: [0.001, 0.02, 0.3][r.random_range(0..3)],
    }
}

fn settings(c: &Case) -> crate::profile::Settings {
    let mut s = crate::tune::worlds::settings();
    s.workload.n_ctx = c.ctx;
    s.goal.objective = c.objective;
    if c.parallel > 1 {
        s.goal.parallel_streams = Some(c.parallel);
        s.workload.n_parallel = c.parallel;
    }
    s
}

/// The world's trials: noisy, drifting, out of memory past 1.4 caps (the
/// card itself); the default's placement (its own context) at its speed.
fn world(c: &Case, seed: u64) -> World {
    let rng = Rc::new(RefCell::new(StdRng::seed_from_u64(seed ^ 0x5eed)));
    let calls = Rc::new(std::cell::Cell::new(0i32));
    let (m, cx) = (c.model, c.clone());
    let mut w = World::of(move |cand: Candidate, spec| {
        let ctx = spec.placement.n_ctx.unwrap_or(cx.ctx);
        let mem = m.bytes(cand.ngl, cand.kv, cand.n_cpu_ffn, ctx);
        #[allow(clippy::cast_precision_loss)]
        if mem as f64 > cx.cap * 1.4 {
            return Outcome::Oom;
        }
        calls.set(calls.get() + 1);
        let noise = 1.0 + cx.noise * rng.borrow_mut().random_range(-1.0..=1.0);
        let drift = (1.0 - cx.drift).powi(calls.get());
        let theirs = if ctx == cx.default_ctx && ctx != cx.ctx { cx.default_speed } else { 1.0 };
        let streams = f64::from(spec.n_streams.max(1));
        let tg = streams.sqrt() / m.s_per_token(cand) * noise * drift * theirs;
        Outcome::Ok { tg, pp: tg * 12.0, mem }
    });
    w.base.placement.n_ctx = Some(c.ctx);
    w.base.placement.n_parallel = c.parallel;
    w.base.n_streams = c.parallel;
    w
}

fn plan(c: &Case, preds: &[Prediction]) -> Plan {
    let full = c.model.layers + 1;
    let grid = default_grid(full, (full / 6).max(1));
    #[allow(clippy::cast_precision_loss)]
    let over: Vec<u32> = preds.iter().filter(|p| p.device_bytes as f64 > c.cap).map(|p| p.n_gpu_layers).collect();
    let n_max = grid.iter().copied().filter(|n| !over.contains(n)).max().unwrap_or(0);
    Plan {
        full,
        n_layer: c.model.layers,
        is_moe: false,
        full_grid: grid,
        grid_mode: c.grid_mode,
        no_gpu: false,
        predicted_over: over,
        n_max,
        top_first: true,
        cpu: crate::types::CpuInfo { brand: "fake".into(), physical_cores: 2, logical_cores: 2 },
    }
}

/// llama.cpp's fit: the most layers under the device less its margin.
fn fit(c: &Case, ctx: u32, ngl: Option<i32>) -> LlamaFit {
    let full = c.model.layers + 1;
    #[allow(clippy::cast_precision_loss)]
    let most = (0..=full).rev().find(|n| c.model.bytes(*n, None, 0, ctx) as f64 <= c.cap * 1.3).unwrap_or(0);
    let n = ngl.unwrap_or(i32::try_from(most).unwrap_or(0));
    let layers = if n < 0 { full } else { u32::try_from(n).unwrap_or(0) };
    LlamaFit {
        n_gpu_layers: Some(n),
        n_ctx: Some(ctx),
        predicted_device_bytes: Some(c.model.bytes(layers, None, 0, ctx)),
        ..LlamaFit::none(1 << 30)
    }
}

/// What one context's tune wrote, and what it ran.
struct Tuned {
    answer: crate::profile::Admitted,
    replaced: Option<crate::types::Note>,
    trials: Vec<crate::profile::ProfileTrial>,
}

/// One context's tune in world `seed`, as `tune_context` runs it.
fn tune(seed: u64, c: &Case, s: &crate::profile::Settings) -> Tuned {
    let at = ContextRun::of(s, c.ctx);
    let mut w = world(c, seed);
    let (m, user_ctx, full) = (c.model, c.ctx, c.model.layers + 1);
    let price = move |cases: &[PredictCase]| cases.iter().map(|x| m.price(x, user_ctx)).collect::<Vec<_>>();
    let grid_prices: Vec<Prediction> = default_grid(full, (full / 6).max(1))
        .iter()
        .map(|n| Prediction { case: None, ..m.price(&PredictCase::layers(*n, 0), user_ctx) })
        .collect();
    let p = plan(c, &grid_prices);
    let policy = crate::tune::worlds::policy(c.cap);
    let mut search =
        crate::tune::search::Search::new(s, at, &mut w, Some(policy), crate::progress::Progress::hidden(), None)
            .with_pricer(Box::new(crate::tune::pricer::fake::Curves::cases(price)));
    search.predicted = grid_prices;
    search.confirmations_priced = true;
    let found = search.run(&p).unwrap_or_else(|e| panic!("seed {seed}: the search failed: {e:#}"));
    let high = crate::profile::Confidence::High;
    let layer_split = crate::tune::summary::recommendation(&found, &search.trials, (s, at), full, true, high);
    let h = HatchInputs {
        full,
        n_layer: c.model.layers,
        is_moe: false,
        cap: c.cap,
        n_ctx: c.ctx,
        kv: KvType::F16,
        threads: s.backend.n_threads,
        op_offload: true,
        rpc: Vec::new(),
        grid: p.full_grid.clone(),
        workload: at.workload((&s.workload, &s.backend)),
    };
    let kl = c.kl;
    let mut assess =
        move |_k: KvType| Ok(Some(Quality { kl_mean: kl, top1_agree: 0.98, tokens: 256, ..Quality::passing() }));
    let hatches = hatch::run(Topology::One { h: &h, layer_split: &layer_split }, &mut search, &mut assess)
        .unwrap_or_else(|e| panic!("seed {seed}: the hatches failed: {e:#}"));
    let mut rec = hatch::recommend(&layer_split, &hatches.options);
    let fits = (fit(c, c.default_ctx, Some(c.default_ngl)), fit(c, c.ctx, None));
    crate::tune::baseline::against::llama_default(&mut search, &mut rec, (Some(&fits.0), Some(&fits.1)), full)
        .unwrap_or_else(|e| panic!("seed {seed}: the default's pairing failed: {e:#}"));
    let predicted = search.predicted.clone();
    let (trials, _) = search.into_parts();
    let gate = gate_of((&trials, &predicted), (Some(c.cap), None), s);
    let (answer, replaced) =
        admit(&gate, rec, &layer_split, KvType::F16).unwrap_or_else(|e| panic!("seed {seed} {c:?}: {e:#}"));
    Tuned { answer, replaced, trials }
}

/// The property in world `seed`; panics naming the seed where it fails.
fn check(seed: u64) {
    let c = case(seed);
    let s = settings(&c);
    let Tuned { answer, replaced, trials } = tune(seed, &c, &s);
    assert!(replaced.is_none(), "seed {seed} {c:?}: a path handed the gate an answer it refused: {replaced:?}");
    // The user's run: their context and slots, whatever won.
    let run = answer.runs();
    assert_eq!((run.n_ctx, run.n_parallel), (Some(c.ctx), c.parallel), "seed {seed}: {run:?}");
    // llama.cpp's flags read back to the placement.
    let flags = answer.llama_cpp_args.clone();
    let back = crate::placement::args::parse_placement(&flags).unwrap_or_else(|e| panic!("seed {seed}: {flags}: {e}"));
    assert_eq!(
        (back.n_gpu_layers, back.n_ctx, back.n_parallel, back.kv_type, back.n_threads),
        (run.n_gpu_layers, run.n_ctx, run.n_parallel, run.kv_type, run.n_threads),
        "seed {seed}: {flags}"
    );
    assert_eq!(back.flags(), flags, "seed {seed}: the flags render as they parse");
    // The Modelfile, through Ollama's parser: num_ctx a slot's, num_gpu as pinned.
    let text = answer.modelfile.join("\n");
    let cmds = crate::consumer::ollama::modelfile::parse(&format!("FROM m.gguf\n{text}\n"))
        .unwrap_or_else(|e| panic!("seed {seed}: {text}: {e:?}"));
    let params = crate::consumer::ollama::modelfile::parameters(&cmds);
    let param = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v[0].clone());
    assert_eq!(param("num_ctx"), Some((c.ctx / c.parallel).to_string()), "seed {seed}: {text}");
    assert_eq!(param("num_gpu"), answer.ollama_num_gpu_param().map(|n| n.to_string()), "seed {seed}: {text}");
    // Nothing over the cap ran but a baseline, and the answer is none of those.
    for t in trials.iter().filter(|t| t.over_cap) {
        assert_eq!(t.role, Role::Paired, "seed {seed} {c:?}: a {:?} trial over the cap ran", t.role);
        assert_ne!(t.result.spec.placement, run, "seed {seed}: the answer itself measured over the cap");
    }
}

#[test]
fn every_answer_in_random_worlds_is_admitted_as_it_is_and_reads_back_as_the_users_run() {
    let seeds: u64 = std::env::var("NGL_TUNE_PROPERTY_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    for seed in 0..seeds {
        check(seed);
    }
}
