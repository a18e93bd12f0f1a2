//! Runs one trial inside the worker process: loads the model at the given
//! ngl and measures pp and tg exactly as llama-bench's `test_prompt` and
//! `test_gen` do.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use rand::{Rng, SeedableRng};

use super::logs;
use crate::probe::ggml::GgmlSource;
use crate::probe::{MemorySource, Sampler};
use crate::types::{TestResult, TrialResult, TrialSpec, TrialStatus};

/// Fault injection for tests of the failure paths, read from
/// `NGL_TUNE_TEST_FAULT`: `KIND` or `KIND@NGL` (only at that ngl), with KIND
/// one of `abort`, `segv`, `hang`, `exit`. Documented in the README; it only
/// affects the hidden worker.
pub const FAULT_ENV: &str = "NGL_TUNE_TEST_FAULT";

/// The fault asked for at this ngl, if any.
fn fault_at(ngl: u32) -> Option<String> {
    let spec = std::env::var(FAULT_ENV).ok()?;
    let (kind, at) = match spec.split_once('@') {
        Some((k, n)) => (k.to_string(), n.parse::<u32>().ok()),
        None => (spec.clone(), None),
    };
    if at.is_some_and(|n| n != ngl) {
        return None;
    }
    Some(kind)
}

/// `oom`: caps the worker's address space a little above what it uses now,
/// so llama.cpp's own allocations for the model really fail.
fn inject_memory_limit(ngl: u32) {
    if fault_at(ngl).as_deref() != Some("oom") {
        return;
    }
    let vm_kib = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmSize:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let limit = (vm_kib + 16 * 1024) * 1024;
    eprintln!("ngl-tune worker: injecting test fault 'oom' at ngl {ngl}: address space capped at {} MiB", limit >> 20);
    let rl = libc::rlimit { rlim_cur: limit, rlim_max: limit };
    // SAFETY: setrlimit with a valid struct only changes this process's limit.
    unsafe {
        libc::setrlimit(libc::RLIMIT_AS, &raw const rl);
    }
}

fn inject_fault(ngl: u32) {
    let Some(kind) = fault_at(ngl) else { return };
    if kind == "oom" {
        return;
    }
    eprintln!("ngl-tune worker: injecting test fault '{kind}' at ngl {ngl}");
    match kind.as_str() {
        "abort" => std::process::abort(),
        // SAFETY: only signal-handling calls; the process is meant to die here.
        // Rust's runtime handles SIGSEGV for stack-overflow reports and
        // returns for a raised one; restore the default so it kills, as a
        // bad pointer inside llama.cpp would.
        "segv" => unsafe {
            libc::signal(libc::SIGSEGV, libc::SIG_DFL);
            libc::raise(libc::SIGSEGV);
        },
        "hang" => loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
        },
        "exit" => std::process::exit(7),
        _ => {}
    }
}

/// What llama.cpp's log says about a failed allocation.
fn looks_like_oom(log: &str) -> bool {
    super::child::mentions_oom(log)
}

/// The most telling line of a failure: the last one that names an error.
fn last_error_line(log: &str) -> String {
    let lines: Vec<&str> = log.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    lines
        .iter()
        .rev()
        .find(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("error") && !l.contains("failed to load model")
        })
        .or_else(|| lines.last())
        .map_or_else(|| "no log output".to_string(), |l| (*l).to_string())
}

/// Runs the trial. Never panics on llama.cpp errors: they become the result's
/// status and reason.
#[must_use]
pub fn run(spec: &TrialSpec) -> TrialResult {
    let started = Instant::now();
    logs::install();
    let mut result = TrialResult::failed(spec.clone(), TrialStatus::Failed, String::new());
    result.reason = None;

    let backend = match LlamaBackend::init() {
        Ok(b) => b,
        Err(e) => return fail(result, TrialStatus::Failed, format!("llama.cpp backend init failed: {e}")),
    };
    if let Err(e) = super::placement::add_rpc_servers(&spec.placement.rpc) {
        return fail(result, TrialStatus::Failed, e.to_string());
    }
    result.devices = crate::probe::ggml::devices();
    // Auto becomes what was used: off where every offload device runs on the CPU.
    let on = spec.placement.op_offload.resolve(crate::probe::only_software_offload(&result.devices));
    let mut spec = spec.clone();
    spec.placement.op_offload = if on { crate::types::OpOffload::On } else { crate::types::OpOffload::Off };
    result.spec = spec.clone();
    let spec = &spec;
    let init_ms = started.elapsed().as_secs_f64() * 1e3;
    let sampler = (spec.sample_interval_ms > 0).then(|| {
        let source: Box<dyn MemorySource> = Box::new(GgmlSource::new());
        Sampler::start(vec![source], Duration::from_millis(spec.sample_interval_ms), None)
    });
    let result = measure_trial(spec, &backend, result);
    let mut result = result;
    if let Some(s) = sampler {
        result.sampled = s.stop();
    }
    result.wall_ms = started.elapsed().as_secs_f64() * 1e3;
    if std::env::var_os("NGL_TUNE_TIMINGS").is_some() {
        let load_ms = result.t_load_ms;
        result.timings = Some(crate::types::WorkerTimings {
            init_ms,
            load_ms,
            measure_ms: (result.wall_ms - init_ms - load_ms).max(0.0),
            worker_ms: result.wall_ms,
        });
    }
    result
}

fn measure_trial(spec: &TrialSpec, backend: &LlamaBackend, mut result: TrialResult) -> TrialResult {
    inject_memory_limit(spec.placement.n_gpu_layers);
    let params = super::placement::ModelParams::of(&spec.placement);
    let t_load = Instant::now();
    let model = params.load(&spec.model).ok_or("llama.cpp returned no model");
    let load_log = logs::take();
    let model = match model {
        Ok(m) => m,
        Err(e) => {
            let status = if looks_like_oom(&load_log) { TrialStatus::Oom } else { TrialStatus::Failed };
            return fail(result, status, format!("model load failed ({e}): {}", last_error_line(&load_log)));
        }
    };
    result.t_load_ms = t_load.elapsed().as_secs_f64() * 1e3;
    result.model_buffers = logs::parse_buffers(&load_log);
    if let Some((a, b)) = logs::parse_offloaded(&load_log) {
        result.layers_offloaded = Some(a);
        result.layers_total = Some(b);
    }
    inject_fault(spec.placement.n_gpu_layers);

    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    for (n_prompt, n_gen) in spec.tests() {
        if result.tests.iter().any(|t| t.stopped_early) && spec.race.is_some_and(|r| r.skip_rest) {
            // Far behind on the objective: the other tests cannot change the decision.
            break;
        }
        let n_ctx = spec.placement.n_ctx.unwrap_or(n_prompt + n_gen).max(1);
        let cparams = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(n_ctx))
            .with_n_batch(spec.placement.n_batch)
            .with_n_ubatch(spec.placement.n_ubatch)
            .with_n_threads(i32::try_from(spec.placement.n_threads).unwrap_or(i32::MAX))
            .with_n_threads_batch(i32::try_from(spec.placement.n_threads).unwrap_or(i32::MAX))
            .with_flash_attention_policy(llama_cpp_sys_2::llama_flash_attn_type::from(
                spec.placement.flash_attn.value(),
            ))
            .with_op_offload(spec.placement.op_offload != crate::types::OpOffload::Off)
            .with_type_k(kv_cache_type(spec.placement.kv_type))
            .with_type_v(kv_cache_type(spec.placement.kv_type));
        let ctx = model.new_context(backend, cparams);
        let ctx_log = logs::take();
        let mut ctx = match ctx {
            Ok(c) => c,
            Err(e) => {
                let status = if looks_like_oom(&ctx_log) { TrialStatus::Oom } else { TrialStatus::Failed };
                return fail(result, status, format!("context creation failed ({e}): {}", last_error_line(&ctx_log)));
            }
        };
        let mut samples = Vec::with_capacity(spec.repetitions as usize);
        let measured = measure(&mut ctx, &model, &mut rng, spec, n_prompt, n_gen, &mut samples);
        let run_log = logs::take();
        let stopped_early = match measured {
            Ok(stopped) => stopped,
            Err(e) => {
                let log = format!("{ctx_log}{run_log}");
                let status = if looks_like_oom(&log) { TrialStatus::Oom } else { TrialStatus::Failed };
                return fail(result, status, format!("{e}: {}", last_error_line(&log)));
            }
        };
        let mut test = TestResult::from_samples(n_prompt, n_gen, n_ctx, samples);
        test.stopped_early = stopped_early;
        test.context_buffers = logs::parse_buffers(&ctx_log);
        result.tests.push(test);
        drop(ctx);
    }
    result.status = TrialStatus::Ok;
    result
}

/// llama-cpp-2's name for a KV cache type.
pub(crate) fn kv_cache_type(k: crate::types::KvType) -> llama_cpp_2::context::params::KvCacheType {
    use llama_cpp_2::context::params::KvCacheType;
    match k {
        crate::types::KvType::F16 => KvCacheType::F16,
        crate::types::KvType::Q8_0 => KvCacheType::Q8_0,
        crate::types::KvType::Q4_0 => KvCacheType::Q4_0,
    }
}

fn fail(mut r: TrialResult, status: TrialStatus, reason: String) -> TrialResult {
    r.status = status;
    r.reason = Some(reason);
    r
}

fn measure(
    ctx: &mut LlamaContext<'_>,
    model: &LlamaModel,
    rng: &mut rand::rngs::StdRng,
    spec: &TrialSpec,
    n_prompt: u32,
    n_gen: u32,
    samples: &mut Vec<u64>,
) -> Result<bool, String> {
    let vocab = model.vocab();
    let n_vocab = model.n_vocab().max(1);
    let bos = if vocab.should_add_bos() { Some(vocab.bos()) } else { None };
    if spec.warmup {
        if n_prompt > 0 {
            test_prompt(ctx, rng, n_vocab, bos, n_prompt, spec.placement.n_batch)?;
        }
        if n_gen > 0 {
            test_gen(ctx, rng, n_vocab, bos, 1)?;
        }
    }
    for _ in 0..spec.repetitions {
        ctx.clear_kv_cache();
        let t0 = Instant::now();
        if n_prompt > 0 {
            test_prompt(ctx, rng, n_vocab, bos, n_prompt, spec.placement.n_batch)?;
        }
        if n_gen > 0 {
            test_gen(ctx, rng, n_vocab, bos, n_gen)?;
        }
        let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        samples.push(ns);
        #[allow(clippy::cast_precision_loss)]
        let ts = f64::from(n_prompt + n_gen) * 1e9 / (ns as f64).max(1.0);
        let below = spec.race.and_then(|r| r.below(n_prompt));
        if samples.len() == 1 && spec.repetitions > 1 && below.is_some_and(|b| ts < b) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// llama-bench's `test_prompt`: random tokens (BOS first when the vocabulary
/// adds one) decoded in `n_batch` chunks, one synchronize at the end.
fn test_prompt(
    ctx: &mut LlamaContext<'_>,
    rng: &mut rand::rngs::StdRng,
    n_vocab: i32,
    bos: Option<LlamaToken>,
    n_prompt: u32,
    n_batch: u32,
) -> Result<(), String> {
    let mut processed = 0u32;
    let mut tokens = Vec::with_capacity(n_batch as usize);
    while processed < n_prompt {
        let n = (n_prompt - processed).min(n_batch.max(1));
        tokens.clear();
        for i in 0..n {
            let t = match bos {
                Some(b) if processed == 0 && i == 0 => b,
                _ => LlamaToken::new(rng.random_range(0..n_vocab)),
            };
            tokens.push(t);
        }
        let mut batch = LlamaBatch::get_one(&tokens).map_err(|e| format!("batch: {e}"))?;
        ctx.decode(&mut batch).map_err(|e| format!("prompt decode failed ({e})"))?;
        processed += n;
    }
    ctx.synchronize();
    Ok(())
}

/// llama-bench's `test_gen`: single-token decodes, synchronize after each.
fn test_gen(
    ctx: &mut LlamaContext<'_>,
    rng: &mut rand::rngs::StdRng,
    n_vocab: i32,
    bos: Option<LlamaToken>,
    n_gen: u32,
) -> Result<(), String> {
    let mut token = bos.unwrap_or_else(|| LlamaToken::new(rng.random_range(0..n_vocab)));
    for _ in 0..n_gen {
        let one = [token];
        let mut batch = LlamaBatch::get_one(&one).map_err(|e| format!("batch: {e}"))?;
        ctx.decode(&mut batch).map_err(|e| format!("generation decode failed ({e})"))?;
        ctx.synchronize();
        token = LlamaToken::new(rng.random_range(0..n_vocab));
    }
    Ok(())
}

/// Loads only the model's vocabulary and hyperparameters: enough for
/// llama.cpp to reject an architecture it does not know, without loading
/// weights. Returns llama.cpp's own error line on failure.
///
/// # Errors
/// The reason llama.cpp gave.
pub fn check_loadable(path: &std::path::Path, rpc: &[String]) -> Result<(), String> {
    logs::install();
    let backend = LlamaBackend::init().map_err(|e| format!("llama.cpp backend init failed: {e}"))?;
    super::placement::add_rpc_servers(rpc).map_err(|e| e.to_string())?;
    let params = LlamaModelParams::default().with_vocab_only(true);
    let loaded = LlamaModel::load_from_file(&backend, path, &params);
    let log = logs::take();
    match loaded {
        Ok(_) => Ok(()),
        Err(e) => Err(log
            .lines()
            .find(|l| l.contains("error loading model"))
            .map_or_else(|| format!("{e}: {}", last_error_line(&log)), |l| l.trim().to_string())),
    }
}
