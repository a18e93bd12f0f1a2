//! The dry run's child side (hidden `__predict`): llama.cpp's own dry run
//! through the shim (`ngl_tune_predict`), llama.cpp's fit asked as
//! llama-server and Ollama run it, and the projector's price, answered as
//! JSON on stdout.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;

use anyhow::{Context, Result};

use super::*;

extern "C" {
    fn ngl_tune_predict(
        path: *const c_char,
        placement: *const crate::engine::placement::RawPlacement,
        n_ctx: u32,
        n_batch: u32,
        n_ubatch: u32,
        flash_attn: i32,
        op_offload: i32,
        type_kv: i32,
        n_outputs_max: u32,
        n_outputs_per_seq: u32,
        cb: extern "C" fn(*mut c_void, *const c_char, c_int, u64, u64, u64),
        user: *mut c_void,
    ) -> c_int;
    fn ngl_tune_mmproj_fit_pad(path: *const c_char, use_gpu: c_int, flash_attn: i32, pad: *mut u64, n: usize) -> c_int;
    fn ngl_tune_mmproj_memory(
        path: *const c_char,
        use_gpu: c_int,
        flash_attn: i32,
        n_threads: u32,
        cb: extern "C" fn(*mut c_void, *const c_char, c_int, u64),
        user: *mut c_void,
    ) -> c_int;
}

/// What llama.cpp's fit (`common_fit_params`, through llama-cpp-sys-2's
/// wrapper) wrote into the parameters it was given.
struct FitRun {
    ok: bool,
    n_gpu_layers: i32,
    n_ctx: u32,
    tensor_split: Vec<f32>,
    overrides: Vec<FitOverride>,
}

/// How a fit is asked: the context (0: the model's training context, which
/// fit may shrink down to `min_ctx`), the slots llama-server gives it, and
/// the KV type it prices.
#[derive(Clone, Copy)]
struct FitAsk {
    n_ctx: u32,
    min_ctx: u32,
    /// Sequences (`-np`) and whether they share one cache (llama-server's
    /// default: 4 over one unified cache; Ollama's: `-np P`, not unified).
    slots: u32,
    unified: bool,
}

impl FitAsk {
    /// At the spec's context, one sequence: the tune's own workload.
    fn at(n_ctx: u32) -> FitAsk {
        FitAsk { n_ctx, min_ctx: n_ctx, slots: 1, unified: false }
    }
}

/// llama.cpp's fit of `spec` as `ask` says, with `margin(i)` bytes to stay free on device `i`.
fn run_fit(spec: &PredictSpec, margin: impl Fn(usize) -> u64, ask: FitAsk) -> FitRun {
    let path = CString::new(spec.model.to_string_lossy().as_bytes()).unwrap_or_default();
    // SAFETY: plain default constructors; the fit writes into buffers sized
    // as llama.cpp asks (max devices, max overrides + 1); the patterns it
    // writes are static strings of fit.cpp and the buffer types live as
    // long as the backend.
    unsafe {
        let n_dev = llama_cpp_sys_2::llama_max_devices();
        let mut mp = llama_cpp_sys_2::llama_model_default_params();
        let mut cp = llama_cpp_sys_2::llama_context_default_params();
        cp.n_ctx = ask.n_ctx;
        cp.n_batch = spec.n_batch;
        cp.n_ubatch = spec.n_ubatch;
        cp.op_offload = spec.op_offload;
        cp.type_k = spec.kv_type.ggml_type().try_into().unwrap_or(1);
        cp.type_v = cp.type_k;
        // A quantized V cache needs flash attention (as the trials run it).
        cp.flash_attn_type = i32::from(spec.kv_type.flash_attn(spec.flash_attn).value());
        cp.n_seq_max = ask.slots.max(1);
        cp.kv_unified = ask.unified;
        let mut split = vec![0f32; n_dev];
        let empty =
            llama_cpp_sys_2::llama_model_tensor_buft_override { pattern: std::ptr::null(), buft: std::ptr::null_mut() };
        let mut overrides = vec![empty; llama_cpp_sys_2::llama_max_tensor_buft_overrides() + 1];
        let mut m: Vec<usize> = (0..n_dev).map(|i| usize::try_from(margin(i)).unwrap_or(usize::MAX)).collect();
        let rc = llama_cpp_sys_2::llama_rs_fit_params(
            path.as_ptr(),
            &raw mut mp,
            &raw mut cp,
            split.as_mut_ptr(),
            overrides.as_mut_ptr(),
            m.as_mut_ptr(),
            ask.min_ctx,
            std::ptr::null(),
            llama_cpp_sys_2::GGML_LOG_LEVEL_ERROR,
        );
        let _ = crate::engine::logs::take();
        let overrides = overrides
            .iter()
            .take_while(|o| !o.pattern.is_null())
            .map(|o| FitOverride {
                pattern: CStr::from_ptr(o.pattern).to_string_lossy().into_owned(),
                buffer_type: if o.buft.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(llama_cpp_sys_2::ggml_backend_buft_name(o.buft)).to_string_lossy().into_owned()
                },
            })
            .collect();
        FitRun { ok: rc == 0, n_gpu_layers: mp.n_gpu_layers, n_ctx: cp.n_ctx, tensor_split: split, overrides }
    }
}

/// llama.cpp's fit with `margin` on every device plus `pad` on the device
/// of each index (what llama-server adds for a projector; empty: none).
fn fit_with(spec: &PredictSpec, (margin, pad): (u64, &[u64]), ask: FitAsk, extra: &[PredictedBuffer]) -> LlamaFit {
    let at = |i: usize| margin + pad.get(i).copied().unwrap_or(0);
    let r = run_fit(spec, at, ask);
    let margin = at(0);
    if !r.ok {
        return LlamaFit {
            margin_bytes: margin,
            error: Some("llama.cpp's fit found no allocation that fits".into()),
            ..LlamaFit::none(margin)
        };
    }
    // What it chose, priced by the same dry run as every trial.
    let cpu_overrides = r.overrides.iter().filter(|o| o.buffer_type == "CPU").map(|o| o.pattern.clone()).collect();
    let all = u32::try_from(r.n_gpu_layers).unwrap_or(u32::MAX);
    let chosen =
        crate::placement::Placement { n_gpu_layers: all, cpu_overrides, ..crate::placement::Placement::default() };
    let p = predict_placement(spec, &chosen, (r.n_ctx, None), extra);
    LlamaFit {
        margin_bytes: margin,
        n_gpu_layers: Some(r.n_gpu_layers),
        n_ctx: Some(r.n_ctx),
        overrides: r.overrides,
        predicted_device_bytes: p.error.is_none().then_some(p.device_bytes),
        error: None,
        mmproj_offload: true,
    }
}

extern "C" fn collect(user: *mut c_void, buft: *const c_char, is_host: c_int, model: u64, context: u64, compute: u64) {
    // SAFETY: `user` is the Vec passed by `predict_one` for the duration of the call.
    let out = unsafe { &mut *user.cast::<Vec<PredictedBuffer>>() };
    let name = if buft.is_null() {
        String::new()
    } else {
        // SAFETY: llama.cpp passes a NUL-terminated buffer-type name.
        unsafe { CStr::from_ptr(buft) }.to_string_lossy().into_owned()
    };
    out.push(PredictedBuffer { buffer_type: name, is_host: is_host != 0, model, context, compute });
}

/// One dry run in this process (the backend must be initialized).
fn predict_one(
    spec: &PredictSpec,
    case: PredictCase,
    (split, devices, split_mode): (&[u32], &[String], crate::placement::SplitMode),
    extra: &[PredictedBuffer],
) -> Prediction {
    let placement = crate::placement::Placement {
        n_gpu_layers: case.ngl,
        n_cpu_ffn: case.n_cpu_ffn,
        n_cpu_moe: case.n_cpu_moe,
        tensor_split: split.to_vec(),
        devices: devices.to_vec(),
        split_mode,
        draft: spec.mtp.then(|| crate::placement::Draft::mtp(crate::placement::DRAFT_N_MAX)),
        ..crate::placement::Placement::default()
    };
    predict_placement(spec, &placement, (case.n_ctx, case.kv_type), extra)
}

/// The dry run of `placement` at context `n_ctx` with KV type `kv` (`None`:
/// the spec's own).
fn predict_placement(
    spec: &PredictSpec,
    placement: &crate::placement::Placement,
    (n_ctx, kv): (u32, Option<crate::placement::KvType>),
    extra: &[PredictedBuffer],
) -> Prediction {
    let kv = kv.unwrap_or(spec.kv_type);
    let mut buffers: Vec<PredictedBuffer> = Vec::new();
    let path = CString::new(spec.model.to_string_lossy().as_bytes()).unwrap_or_default();
    let params = crate::engine::placement::ModelParams::of(placement);
    let raw = params.raw();
    // A quantized V cache needs flash attention (as the trials run it).
    let fa = i32::from(kv.flash_attn(spec.flash_attn).value());
    let outputs = spec.outputs.unwrap_or([0, 0]);
    // SAFETY: valid C strings and a placement that outlive the call, a
    // callback that only touches `buffers`, which outlives the call.
    let rc = unsafe {
        ngl_tune_predict(
            path.as_ptr(),
            &raw const raw,
            n_ctx,
            spec.n_batch,
            spec.n_ubatch,
            fa,
            i32::from(spec.op_offload),
            kv.ggml_type(),
            outputs[0],
            outputs[1],
            collect,
            (&raw mut buffers).cast::<c_void>(),
        )
    };
    let log = crate::engine::logs::take();
    let error = match rc {
        0 => None,
        1 => Some(format!("dry-run model load failed: {}", load_error(&log))),
        _ => Some(format!("dry-run context creation failed: {}", last_line(&log))),
    };
    if error.is_none() {
        buffers.extend_from_slice(extra);
    }
    let device = |f: fn(&PredictedBuffer) -> u64| -> u64 {
        buffers.iter().filter(|b| !b.is_host && crate::types::is_device_buffer_type(&b.buffer_type)).map(f).sum()
    };
    Prediction {
        n_gpu_layers: placement.n_gpu_layers,
        device_bytes: device(|b| b.model + b.context + b.compute),
        device_model_bytes: device(|b| b.model),
        buffers,
        error,
        case: None,
        split: placement.tensor_split.clone(),
        devices: placement.devices.clone(),
    }
}

/// Why llama.cpp could not load the model: its "error loading model" line
/// where it wrote one (the last line is a generic "failed to load model").
fn load_error(log: &str) -> String {
    log.lines()
        .rev()
        .find_map(|l| l.split("error loading model: ").nth(1))
        .map_or_else(|| last_line(log), |e| e.trim().to_string())
}

fn last_line(log: &str) -> String {
    log.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no log output").to_string()
}

/// Entry point of the hidden `__predict` subcommand: spec on stdin, one JSON
/// array of predictions on stdout.
///
/// # Errors
/// When stdin does not hold a spec.
pub fn predict_main() -> Result<()> {
    use crate::placement::SplitMode::Layer;
    use std::io::Read;
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let spec: PredictSpec = serde_json::from_str(&input).context("__predict expects a PredictSpec as JSON on stdin")?;
    crate::engine::logs::install();
    crate::engine::logs::quiet();
    let _backend = llama_cpp_2::llama_backend::LlamaBackend::init()?;
    crate::engine::placement::add_rpc_servers(&spec.rpc)?;
    let mmproj = spec.mmproj.as_deref().map(|m| predict_projector(m, spec.flash_attn));
    let extra = mmproj.as_ref().map_or(&[][..], |m| &m.buffers[..]);
    let predictions: Vec<Prediction> = spec
        .ngl
        .iter()
        .map(|n| predict_one(&spec, PredictCase::layers(*n, spec.n_ctx), (&[], &[], Layer), extra))
        .collect();
    let cases = spec
        .cases
        .iter()
        .map(|c| Prediction { case: Some(*c), ..predict_one(&spec, *c, (&[], &[], Layer), extra) })
        .collect();
    let splits = spec
        .splits
        .iter()
        .map(|x| {
            let case = PredictCase { n_cpu_ffn: x.n_cpu_ffn, ..PredictCase::layers(x.layers.iter().sum(), spec.n_ctx) };
            predict_one(&spec, case, (&x.layers, &x.devices, x.mode), extra)
        })
        .collect();
    let llama_fit = spec.fit_margin_bytes.map(|m| fit_with(&spec, (m, &[]), FitAsk::at(spec.n_ctx), extra));
    let llama_fit_split = (!spec.fit_split_margins.is_empty()).then(|| llama_fit_split(&spec));
    // llama-server without flags: `-c 0` (the training context, which fit
    // shrinks down to 4096 where memory is short), 4 slots over one cache,
    // its own batch sizes, 1 GiB free.
    let server = FitAsk { n_ctx: 0, min_ctx: DEFAULT_FIT_MIN_CTX, slots: 4, unified: true };
    let stock = PredictSpec {
        n_batch: crate::placement::DEFAULT_N_BATCH,
        n_ubatch: crate::placement::DEFAULT_N_UBATCH,
        flash_attn: crate::placement::FlashAttn::Auto,
        op_offload: true,
        ..spec.clone()
    };
    // llama-server with --mmproj adds the projector's estimate to each
    // device's fit target (on the first GPU, --mmproj-offload being its default).
    let pad = |on_gpu: bool, fa: crate::placement::FlashAttn| {
        spec.mmproj.as_deref().map(|m| server_projector_pad(m, on_gpu, fa)).unwrap_or_default()
    };
    let default_fit = spec
        .default_fit
        .then(|| fit_with(&stock, (spec.upstream_margin_bytes, &pad(true, stock.flash_attn)), server, extra));
    // Ollama's run: its context (`-c num_ctx x P -np P`, which fit keeps),
    // its batch and KV type (the spec's), its fit target, llama.cpp's op
    // offload as Ollama leaves it; with its fit off, every layer.
    let ollama_fit = spec.ollama_fit.map(|o| {
        let theirs = PredictSpec { op_offload: true, ..spec.clone() };
        if o.off {
            return every_layer(&theirs, extra);
        }
        let ask = FitAsk { slots: o.slots, ..FitAsk::at(spec.n_ctx) };
        let projector = spec.mmproj.as_deref().map(ollama_projector_bytes);
        let offload = projector.is_none_or(|b| crate::consumer::ollama::offloads_projector(b, &offload_free()));
        // Ollama's own margin is llama.cpp's 1 GiB (the rig's stand-in where set) plus the projector.
        let margin = o.target_bytes.unwrap_or_else(|| {
            crate::consumer::ollama::fit_margin(projector.filter(|_| offload), spec.upstream_margin_bytes)
        });
        // A projector Ollama keeps on the CPU adds nothing on the devices.
        let extra = if offload { extra } else { &[] };
        LlamaFit { mmproj_offload: offload, ..fit_with(&theirs, (margin, &pad(offload, spec.flash_attn)), ask, extra) }
    });
    let out = PredictOutput { predictions, llama_fit, cases, splits, llama_fit_split, default_fit, ollama_fit, mmproj };
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

/// What llama-server adds to each device's fit target for the projector
/// (by ggml's device index; all zero where mtmd cannot price it).
fn server_projector_pad(path: &Path, use_gpu: bool, flash_attn: crate::placement::FlashAttn) -> Vec<u64> {
    // SAFETY: plain query of the device count.
    let n = unsafe { llama_cpp_sys_2::llama_max_devices() };
    let mut pad = vec![0u64; n];
    let c = CString::new(path.to_string_lossy().as_bytes()).unwrap_or_default();
    // SAFETY: a valid C string and a buffer of `n` entries.
    let rc = unsafe {
        ngl_tune_mmproj_fit_pad(c.as_ptr(), c_int::from(use_gpu), i32::from(flash_attn.value()), pad.as_mut_ptr(), n)
    };
    let _ = crate::engine::logs::take();
    if rc != 0 {
        pad.fill(0);
    }
    pad
}

/// The projector's size as Ollama reads it for its fit target: the sum of
/// its tensors (llm/llama_server.go, `mmprojMemoryRequirement`).
fn ollama_projector_bytes(path: &Path) -> u64 {
    crate::gguf::Gguf::read(path).map(|g| g.tensor_bytes()).unwrap_or(0)
}

/// The free memory of each offload device, as Ollama's scheduler reads it.
fn offload_free() -> Vec<u64> {
    crate::probe::ggml::devices().iter().filter(|d| d.is_offload_target()).map(|d| d.memory_free).collect()
}

/// llama-server with its fit off: every layer on the devices, priced.
fn every_layer(spec: &PredictSpec, extra: &[PredictedBuffer]) -> LlamaFit {
    let all = crate::placement::Placement { n_gpu_layers: u32::MAX, ..crate::placement::Placement::default() };
    let p = predict_placement(spec, &all, (spec.n_ctx, None), extra);
    LlamaFit {
        n_gpu_layers: Some(-1),
        n_ctx: Some(spec.n_ctx),
        predicted_device_bytes: p.error.is_none().then_some(p.device_bytes),
        ..LlamaFit::none(0)
    }
}

extern "C" fn collect_mmproj(user: *mut c_void, buft: *const c_char, is_host: c_int, bytes: u64) {
    collect(user, buft, is_host, 0, 0, bytes);
}

/// The projector's dry run (mtmd, with llama-server's defaults: on the
/// first GPU, warmed up for the largest image): its weights (the sum of its
/// tensors, from the file) on the device that holds them, the rest of
/// what mtmd reports there and elsewhere as encoder buffers.
fn predict_projector(path: &Path, flash_attn: crate::placement::FlashAttn) -> ProjectorPrediction {
    let mut buffers: Vec<PredictedBuffer> = Vec::new();
    let c = CString::new(path.to_string_lossy().as_bytes()).unwrap_or_default();
    // SAFETY: a valid C string; the callback only touches `buffers`, which outlives the call.
    let rc = unsafe {
        ngl_tune_mmproj_memory(
            c.as_ptr(),
            1,
            i32::from(flash_attn.value()),
            1,
            collect_mmproj,
            (&raw mut buffers).cast::<c_void>(),
        )
    };
    let log = crate::engine::logs::take();
    if rc != 0 {
        return ProjectorPrediction {
            buffers: Vec::new(),
            error: Some(format!("mtmd could not load the projector: {}", last_line(&log))),
        };
    }
    let weights = crate::gguf::Gguf::read(path).map(|g| g.tensor_bytes()).unwrap_or(0);
    // The weights live on the backend mtmd picked: a device where there is one.
    let holder = buffers
        .iter()
        .position(|b| !b.is_host && crate::types::is_device_buffer_type(&b.buffer_type))
        .or_else(|| buffers.iter().position(|b| b.compute >= weights));
    if let Some(b) = holder.map(|i| &mut buffers[i]) {
        let w = weights.min(b.compute);
        b.model = w;
        b.compute -= w;
    }
    ProjectorPrediction { buffers, error: None }
}

/// llama.cpp's fit with a margin per device, read back with its tensor split.
fn llama_fit_split(spec: &PredictSpec) -> LlamaFitSplit {
    let r = run_fit(spec, |i| spec.fit_split_margins.get(i).copied().unwrap_or(0), FitAsk::at(spec.n_ctx));
    let mut split = r.tensor_split;
    split.truncate(spec.fit_split_margins.len());
    LlamaFitSplit {
        margins: spec.fit_split_margins.clone(),
        n_gpu_layers: r.ok.then_some(r.n_gpu_layers),
        tensor_split: if r.ok { split } else { Vec::new() },
        error: (!r.ok).then(|| "llama.cpp's fit found no allocation that fits".to_string()),
    }
}
