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
use llama_cpp_2::mtmd::{
    mtmd_default_marker, MtmdBitmap, MtmdContext, MtmdContextParams, MtmdInputChunkType, MtmdInputText,
};
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
/// so llama.cpp's own allocations for the model really fail. The offload
/// devices are started first: a Vulkan driver starting under the cap (Mesa's
/// llvmpipe: its threads and compiler) may crash on an unchecked allocation
/// instead of reporting one, which is not the model's memory running out.
fn inject_memory_limit(ngl: u32) {
    if fault_at(ngl).as_deref() != Some("oom") {
        return;
    }
    start_offload_devices();
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

/// Starts every GPU-type device llama.cpp lists (asking for its buffer type
/// creates the device: Vulkan's logical device and its queues).
fn start_offload_devices() {
    use llama_cpp_sys_2 as sys;
    // SAFETY: indices below ggml_backend_dev_count(); a null device is skipped.
    unsafe {
        for i in 0..sys::ggml_backend_dev_count() {
            let dev = sys::ggml_backend_dev_get(i);
            if dev.is_null() {
                continue;
            }
            let kind = sys::ggml_backend_dev_type(dev);
            if kind == sys::GGML_BACKEND_DEVICE_TYPE_GPU || kind == sys::GGML_BACKEND_DEVICE_TYPE_IGPU {
                sys::ggml_backend_dev_buffer_type(dev);
            }
        }
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

/// How a failure ended, by llama.cpp's log: out of memory where it says
/// an allocation failed, else failed.
fn status_of(log: &str) -> TrialStatus {
    if super::child::mentions_oom(log) {
        TrialStatus::Oom
    } else {
        TrialStatus::Failed
    }
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

/// A worker's state across its trials: llama.cpp's backend (started once
/// per process) and the model its last trial loaded, kept while the next
/// trial loads it the same way ([`TrialSpec::load_key`]).
#[derive(Default)]
pub struct Session {
    backend: Option<LlamaBackend>,
    /// The RPC servers registered (once per process).
    rpc: Option<Vec<String>>,
    loaded: Option<Loaded>,
    /// Device memory before the first trial loaded anything: the baseline
    /// of every later trial's samples.
    baselines: Vec<crate::types::MemoryStats>,
}

/// A loaded model and what llama.cpp said while loading it.
struct Loaded {
    key: String,
    /// The projector (`--mmproj`), freed before the model it was made for.
    mtmd: Option<MtmdContext>,
    model: LlamaModel,
    buffers: Vec<crate::types::BufferLine>,
    offloaded: Option<(u32, u32)>,
}

impl Session {
    /// Runs the trial. Never panics on llama.cpp errors: they become the
    /// result's status and reason.
    pub fn run(&mut self, spec: &TrialSpec) -> TrialResult {
        let started = Instant::now();
        logs::install();
        let mut result = TrialResult::failed(spec.clone(), TrialStatus::Failed, String::new());
        result.reason = None;
        if self.backend.is_none() {
            match LlamaBackend::init() {
                Ok(b) => self.backend = Some(b),
                Err(e) => return fail(result, TrialStatus::Failed, format!("llama.cpp backend init failed: {e}")),
            }
        }
        if self.rpc.as_ref() != Some(&spec.placement.rpc) {
            if self.rpc.is_some() {
                return fail(result, TrialStatus::Failed, "a worker serves one set of RPC servers".into());
            }
            if let Err(e) = super::placement::add_rpc_servers(&spec.placement.rpc) {
                return fail(result, TrialStatus::Failed, e.to_string());
            }
            self.rpc = Some(spec.placement.rpc.clone());
        }
        result.devices = crate::probe::ggml::devices();
        // Auto becomes what was used: off where every offload device runs on the CPU.
        let on = spec.placement.op_offload.resolve(crate::probe::only_software_offload(&result.devices));
        let mut spec = spec.clone();
        spec.placement.op_offload = crate::placement::OpOffload::from(on);
        result.spec = spec.clone();
        let spec = &spec;
        let init_ms = started.elapsed().as_secs_f64() * 1e3;
        let sampler = (spec.sample_interval_ms > 0).then(|| {
            let source: Box<dyn MemorySource> = Box::new(GgmlSource::new());
            Sampler::start(vec![source], Duration::from_millis(spec.sample_interval_ms), None)
        });
        let mut result = self.measure_trial(spec, result);
        if let Some(s) = sampler {
            result.sampled = s.stop();
            crate::probe::keep_first_baselines(&mut self.baselines, &mut result.sampled);
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

    /// The model loaded the way `spec` loads it: the one kept from the
    /// last trial when it was loaded the same way, else loaded now.
    fn load(&mut self, spec: &TrialSpec, result: &mut TrialResult) -> Result<(), (TrialStatus, String)> {
        let key = spec.load_key();
        if self.loaded.as_ref().is_some_and(|l| l.key == key) {
            result.model_reused = true;
            return Ok(());
        }
        // The last model goes first: its device memory is not this trial's.
        drop(self.loaded.take());
        inject_memory_limit(spec.placement.n_gpu_layers);
        let params = super::placement::ModelParams::of(&spec.placement);
        let t_load = Instant::now();
        let model = params.load(&spec.model).ok_or("llama.cpp returned no model");
        let load_log = logs::take();
        let model = match model {
            Ok(m) => m,
            Err(e) => {
                return Err((status_of(&load_log), format!("model load failed ({e}): {}", last_error_line(&load_log))));
            }
        };
        let mut buffers = logs::parse_buffers(&load_log);
        let offloaded = logs::parse_offloaded(&load_log);
        let mtmd = match spec.placement.mmproj.as_deref() {
            Some(path) => {
                let (ctx, lines) =
                    load_projector(path, &model, spec.placement.n_threads, spec.placement.mmproj_offload)?;
                buffers.extend(lines);
                Some(ctx)
            }
            None => None,
        };
        result.t_load_ms = t_load.elapsed().as_secs_f64() * 1e3;
        self.loaded = Some(Loaded { key, mtmd, model, buffers, offloaded });
        Ok(())
    }

    fn measure_trial(&mut self, spec: &TrialSpec, mut result: TrialResult) -> TrialResult {
        if let Err((status, why)) = self.load(spec, &mut result) {
            return fail(result, status, why);
        }
        let (Some(backend), Some(loaded)) = (self.backend.as_ref(), self.loaded.as_mut()) else {
            unreachable!("loaded above")
        };
        result.model_buffers.clone_from(&loaded.buffers);
        if let Some((a, b)) = loaded.offloaded {
            result.layers_offloaded = Some(a);
            result.layers_total = Some(b);
        }
        inject_fault(spec.placement.n_gpu_layers);
        let mut result = measure_tests(spec, backend, &loaded.model, result);
        let behind = result.tests.iter().any(|t| t.stopped_early);
        if let (Some(mtmd), TrialStatus::Ok, false) = (loaded.mtmd.as_mut(), result.status, behind) {
            match measure_image(mtmd, spec) {
                Ok(img) => result.image = Some(img),
                Err(e) => {
                    let log = logs::take();
                    return fail(result, status_of(&log), format!("{e}: {}", last_error_line(&log)));
                }
            }
        }
        result
    }
}

impl Session {
    /// Loads the model and opens its context the way `spec` runs them (the
    /// KV cache allocated, not filled), says what llama.cpp allocated, then
    /// keeps both until `until` returns: a neighbour resident beside a
    /// trial, as a second model loaded in Ollama or llama-swap sits idle.
    ///
    /// # Errors
    /// Why llama.cpp could not load or open it.
    pub fn hold(&mut self, spec: &TrialSpec, until: impl FnOnce(&[crate::types::BufferLine])) -> Result<(), String> {
        logs::install();
        if self.backend.is_none() {
            self.backend = Some(LlamaBackend::init().map_err(|e| format!("llama.cpp backend init failed: {e}"))?);
        }
        super::placement::add_rpc_servers(&spec.placement.rpc).map_err(|e| e.to_string())?;
        let mut result = TrialResult::failed(spec.clone(), TrialStatus::Failed, String::new());
        self.load(spec, &mut result).map_err(|(_, why)| why)?;
        let (Some(backend), Some(loaded)) = (self.backend.as_ref(), self.loaded.as_ref()) else {
            unreachable!("loaded above")
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
        let n_ctx = spec.placement.n_ctx.unwrap_or(spec.n_prompt + spec.n_gen).max(1);
        let (ctx, log) = open_context(&loaded.model, backend, spec, n_ctx, &mut rng).map_err(|(_, why)| why)?;
        let mut buffers = loaded.buffers.clone();
        buffers.extend(logs::parse_buffers(&log));
        until(&buffers);
        drop(ctx);
        Ok(())
    }
}

/// The prefix of a holder's line once its model and context are allocated.
pub const HELD_PREFIX: &str = "HELD ";

/// Entry point of the hidden `__hold` subcommand: one [`TrialSpec`] on
/// stdin's first line; its model and context stay allocated until stdin
/// closes. Prints `HELD [buffers]` once allocated, or `HELD {"error": ...}`.
///
/// # Errors
/// When the line is not a spec.
pub fn hold_main() -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let mut lines = std::io::stdin().lock().lines();
    let line = lines.next().transpose()?.unwrap_or_default();
    let spec: TrialSpec =
        serde_json::from_str(&line).map_err(|e| anyhow::anyhow!("__hold expects a TrialSpec: {e}"))?;
    let say = |v: serde_json::Value| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{HELD_PREFIX}{v}").and_then(|()| out.flush());
    };
    let mut session = Session::default();
    let held = session.hold(&spec, |buffers| {
        say(serde_json::json!({ "buffers": buffers }));
        // Resident until the parent closes stdin (or ends).
        for _ in lines.by_ref() {}
    });
    if let Err(e) = held {
        say(serde_json::json!({ "error": format!("{e}: {}", last_error_line(&logs::take())) }));
    }
    Ok(())
}

/// The projector for `model`, as llama-server loads it (`--mmproj`: on
/// the first GPU unless `--no-mmproj-offload`, warmed up for the largest
/// image, which reserves its encoder's buffers), and what mtmd said it allocated.
fn load_projector(
    path: &std::path::Path,
    model: &LlamaModel,
    n_threads: u32,
    on_gpu: bool,
) -> Result<(MtmdContext, Vec<crate::types::BufferLine>), (TrialStatus, String)> {
    let params = MtmdContextParams {
        use_gpu: on_gpu,
        print_timings: false,
        n_threads: i32::try_from(n_threads).unwrap_or(i32::MAX),
        ..MtmdContextParams::default()
    };
    let ctx = MtmdContext::init_from_file(&path.to_string_lossy(), model, &params);
    let log = logs::take();
    match ctx {
        Ok(c) => Ok((c, logs::parse_projector(&log))),
        Err(e) => Err((status_of(&log), format!("projector load failed ({e}): {}", last_error_line(&log)))),
    }
}

/// The fixed image every trial encodes: 896x896 (Gemma 3's size), a
/// deterministic pattern; the projector resizes it to its own.
pub const IMAGE_SIDE: u32 = 896;

fn fixed_image() -> Vec<u8> {
    let n = IMAGE_SIDE as usize;
    let mut data = Vec::with_capacity(n * n * 3);
    for y in 0..n {
        for x in 0..n {
            for c in 0..3 {
                data.push(u8::try_from((x * 7 + y * 13 + c * 61) % 256).unwrap_or(0));
            }
        }
    }
    data
}

/// The `img` test: the fixed image tokenized (preprocessing, not timed)
/// and encoded after a warmup, `repetitions` times.
fn measure_image(mtmd: &mut MtmdContext, spec: &TrialSpec) -> Result<crate::types::ImageTest, String> {
    let bitmap = MtmdBitmap::from_image_data(IMAGE_SIDE, IMAGE_SIDE, &fixed_image())
        .map_err(|e| format!("image bitmap: {e}"))?;
    let text = MtmdInputText { text: mtmd_default_marker().to_string(), add_special: false, parse_special: true };
    let chunks = mtmd.tokenize(text, &[&bitmap]).map_err(|e| format!("image tokenize failed ({e})"))?;
    let chunk = (0..chunks.len())
        .filter_map(|i| chunks.get(i))
        .find(|c| c.chunk_type() == MtmdInputChunkType::Image)
        .ok_or("the projector made no image chunk of the image")?;
    let n_tokens = u32::try_from(chunk.n_tokens()).unwrap_or(u32::MAX);
    if spec.warmup {
        mtmd.encode_chunk(&chunk).map_err(|e| format!("image encode failed ({e})"))?;
    }
    let mut samples = Vec::with_capacity(spec.repetitions as usize);
    for _ in 0..spec.repetitions.max(1) {
        let t0 = Instant::now();
        mtmd.encode_chunk(&chunk).map_err(|e| format!("image encode failed ({e})"))?;
        samples.push(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    Ok(crate::types::ImageTest::from_samples(IMAGE_SIDE, IMAGE_SIDE, n_tokens, samples))
}

fn measure_tests(spec: &TrialSpec, backend: &LlamaBackend, model: &LlamaModel, mut result: TrialResult) -> TrialResult {
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    // Tests of one context size share one context: the depth is filled once.
    let mut open: Option<(u32, LlamaContext<'_>, String, Depth)> = None;
    // NVML opened once a worker (a kept worker runs many trials): its init is not free.
    static METER: std::sync::OnceLock<Option<crate::probe::nvml::EnergyMeter>> = std::sync::OnceLock::new();
    let meter = METER.get_or_init(crate::probe::nvml::EnergyMeter::open).as_ref();
    let rapl = crate::probe::rapl::Rapl::open();
    for (n_prompt, n_gen) in spec.tests() {
        if result.tests.iter().any(|t| t.stopped_early) && spec.race.is_some_and(|r| r.skip_rest) {
            // Far behind on the objective: the other tests cannot change the decision.
            break;
        }
        let n_ctx = spec.placement.n_ctx.unwrap_or(spec.n_depth + n_prompt + n_gen).max(1);
        if open.as_ref().map(|o| o.0) != Some(n_ctx) {
            drop(open.take());
            match open_context(model, backend, spec, n_ctx, &mut rng) {
                Ok((ctx, log)) => {
                    let depth = Depth::filled(&ctx, spec.n_depth);
                    open = Some((n_ctx, ctx, log, depth));
                }
                Err((status, why)) => return fail(result, status, why),
            }
        }
        let Some((_, ctx, ctx_log, depth)) = open.as_mut() else { unreachable!("opened above") };
        let mut samples = Vec::with_capacity(spec.repetitions as usize);
        // Power over the timed tokens only: not the warmup, not the depth restores.
        let mut energy = crate::probe::energy::Timed::new(meter, rapl.as_ref());
        let measured = measure((ctx, depth), model, &mut rng, spec, (n_prompt, n_gen), (&mut samples, &mut energy));
        let (power_w, cpu_power_w) = energy.watts();
        let run_log = logs::take();
        let ended = match measured {
            Ok(ended) => ended,
            Err(e) => {
                let log = format!("{ctx_log}{run_log}");
                return fail(result, status_of(&log), format!("{e}: {}", last_error_line(&log)));
            }
        };
        let streams = if n_prompt == 0 { spec.n_streams } else { 1 };
        let mut test =
            TestResult::from_samples(n_prompt, n_gen, n_ctx, samples).at_depth(spec.n_depth).with_streams(streams);
        test.stopped_early = ended != Ended::Ran;
        test.tokens_measured = match ended {
            Ended::CutAt(n) => Some(n),
            Ended::Ran | Ended::CutAfterFirst => None,
        };
        (test.power_w, test.cpu_power_w) = (power_w, cpu_power_w);
        test.j_per_token = test.joules_per_token();
        test.context_buffers = logs::parse_buffers(ctx_log);
        result.tests.push(test);
    }
    drop(open);
    result.status = TrialStatus::Ok;
    result
}

/// A context of `n_ctx` tokens for the spec's settings, its KV cache filled
/// to the spec's depth (not timed), and llama.cpp's log of its buffers.
fn open_context<'m>(
    model: &'m LlamaModel,
    backend: &LlamaBackend,
    spec: &TrialSpec,
    n_ctx: u32,
    rng: &mut rand::rngs::StdRng,
) -> Result<(LlamaContext<'m>, String), (TrialStatus, String)> {
    let p = &spec.placement;
    let threads = i32::try_from(p.n_threads).unwrap_or(i32::MAX);
    let cparams = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(n_ctx))
        .with_n_seq_max(p.n_parallel.max(spec.n_streams).max(1))
        .with_kv_unified(p.kv_unified)
        .with_n_batch(p.n_batch)
        .with_n_ubatch(p.n_ubatch)
        .with_n_threads(threads)
        .with_n_threads_batch(threads)
        .with_flash_attention_policy(llama_cpp_sys_2::llama_flash_attn_type::from(p.flash_attn.value()))
        .with_op_offload(p.op_offload != crate::placement::OpOffload::Off)
        .with_type_k(kv_cache_type(p.kv_type))
        .with_type_v(kv_cache_type(p.kv_type));
    let ctx = model.new_context(backend, cparams);
    let ctx_log = logs::take();
    let mut ctx = match ctx {
        Ok(c) => c,
        Err(e) => {
            return Err((status_of(&ctx_log), format!("context creation failed ({e}): {}", last_error_line(&ctx_log))))
        }
    };
    if spec.n_depth > 0 {
        if let Err(e) = fill_depth(&mut ctx, model, rng, spec) {
            let log = format!("{ctx_log}{}", logs::take());
            return Err((
                status_of(&log),
                format!("filling the KV cache to depth {}: {e}: {}", spec.n_depth, last_error_line(&log)),
            ));
        }
    }
    Ok((ctx, ctx_log))
}

/// The file a filled cache of this context is kept in, in `dir`.
/// The context size is not in the name: the same tokens at the same
/// positions load into any context that holds them (llama.cpp's default
/// runs at another context than the tune's).
fn depth_file(dir: &std::path::Path, spec: &TrialSpec) -> std::path::PathBuf {
    let p = &spec.placement;
    dir.join(format!("d{}-{}-fa{}-s{}.kv", spec.n_depth, p.kv_type.as_str(), p.flash_attn.as_str(), spec.seed))
}

/// Puts `spec.n_depth` tokens in the KV cache (not timed): loaded from the
/// spec's depth cache when an earlier trial kept one there (the contents
/// do not depend on where the layers run), else decoded as llama-bench's
/// prompt test does, and kept there for the next trial.
fn fill_depth(
    ctx: &mut LlamaContext<'_>,
    model: &LlamaModel,
    rng: &mut rand::rngs::StdRng,
    spec: &TrialSpec,
) -> Result<(), String> {
    let depth = spec.n_depth as usize;
    let file = spec.depth_cache.as_deref().map(|d| depth_file(d, spec));
    if let Some(f) = file.as_ref().filter(|f| f.is_file()) {
        let last = i32::try_from(depth).unwrap_or(i32::MAX) - 1;
        match ctx.state_seq_load_file(f, 0, depth) {
            Ok((tokens, _)) if tokens.len() == depth && ctx.kv_cache_seq_pos_max(0) == last => return Ok(()),
            // Not loadable here (another layout): fill as if there were none.
            _ => ctx.clear_kv_cache(),
        }
    }
    let vocab = model.vocab();
    let n_vocab = model.n_vocab().max(1);
    let mut tokens = Vec::with_capacity(depth);
    if vocab.should_add_bos() {
        tokens.push(vocab.bos());
    }
    while tokens.len() < depth {
        tokens.push(LlamaToken::new(rng.random_range(0..n_vocab)));
    }
    ctx.clear_kv_cache();
    for chunk in tokens.chunks(spec.placement.n_batch.max(1) as usize) {
        let mut batch = LlamaBatch::get_one(chunk).map_err(|e| format!("batch: {e}"))?;
        ctx.decode(&mut batch).map_err(|e| format!("decode failed ({e})"))?;
    }
    ctx.synchronize();
    if let Some(f) = file {
        // Written aside and renamed: a trial killed mid-write leaves no half file.
        let tmp = f.with_extension(format!("tmp{}", std::process::id()));
        if ctx.state_seq_save_file(&tmp, 0, &tokens).is_ok() {
            let _ = std::fs::rename(&tmp, &f);
        } else {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(())
}

/// llama-cpp-2's name for a KV cache type.
pub(crate) fn kv_cache_type(k: crate::placement::KvType) -> llama_cpp_2::context::params::KvCacheType {
    use llama_cpp_2::context::params::KvCacheType;
    match k {
        crate::placement::KvType::F16 => KvCacheType::F16,
        crate::placement::KvType::Q8_0 => KvCacheType::Q8_0,
        crate::placement::KvType::Q4_0 => KvCacheType::Q4_0,
        crate::placement::KvType::Bf16 => KvCacheType::BF16,
        crate::placement::KvType::F32 => KvCacheType::F32,
        crate::placement::KvType::Q4_1 => KvCacheType::Q4_1,
        crate::placement::KvType::Q5_0 => KvCacheType::Q5_0,
        crate::placement::KvType::Q5_1 => KvCacheType::Q5_1,
        crate::placement::KvType::Iq4Nl => KvCacheType::IQ4_NL,
    }
}

fn fail(mut r: TrialResult, status: TrialStatus, reason: String) -> TrialResult {
    r.status = status;
    r.reason = Some(reason);
    r
}

mod bench;
use bench::{measure, Depth, Ended};

/// Loads only the model's vocabulary: enough for llama.cpp to reject an
/// architecture it does not know, without loading weights; with a
/// projector, the model mapped on the CPU and the projector checked
/// against it by mtmd. Returns llama.cpp's own error line on failure.
///
/// # Errors
/// The reason llama.cpp gave.
pub fn check_loadable(path: &std::path::Path, rpc: &[String], mmproj: Option<&std::path::Path>) -> Result<(), String> {
    logs::install();
    let backend = LlamaBackend::init().map_err(|e| format!("llama.cpp backend init failed: {e}"))?;
    super::placement::add_rpc_servers(rpc).map_err(|e| e.to_string())?;
    // With a projector, mtmd checks it against the model's hyperparameters,
    // which a vocabulary-only load leaves out: then the model is mapped
    // (every layer on the CPU, nothing read that a check does not touch).
    let params = if mmproj.is_some() {
        LlamaModelParams::default().with_n_gpu_layers(0)
    } else {
        LlamaModelParams::default().with_vocab_only(true)
    };
    let loaded = LlamaModel::load_from_file(&backend, path, &params);
    let log = logs::take();
    match loaded {
        Ok(model) => match mmproj {
            // The projector as mtmd checks it against this model (on the CPU: a check, not a trial).
            Some(m) => {
                let params = MtmdContextParams { use_gpu: false, print_timings: false, ..MtmdContextParams::default() };
                let ctx = MtmdContext::init_from_file(&m.to_string_lossy(), &model, &params);
                let log = logs::take();
                ctx.map(drop).map_err(|e| {
                    let why = log
                        .lines()
                        .rev()
                        .find(|l| l.contains("error"))
                        .map_or_else(|| e.to_string(), |l| l.split("error: ").last().unwrap_or(l).trim().to_string());
                    format!("{} {why}", super::child::PROJECTOR_FAILED)
                })
            }
            None => Ok(()),
        },
        Err(e) => Err(log
            .lines()
            .find(|l| l.contains("error loading model"))
            .map_or_else(|| format!("{e}: {}", last_error_line(&log)), |l| l.trim().to_string())),
    }
}
