//! Speculative decoding measured as llama-server runs it, in a child
//! (hidden `__spec`): the target at the placement's layers, the draft
//! beside it as llama-server loads one, and generation through llama.cpp's
//! own speculative loop (`shim/spec.cpp`). Each repetition generates the
//! same tokens greedily at the depth without the draft and with it, in
//! the Thue-Morse order, so the two speeds are paired within one load.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::placement::{Draft, Placement};

const MAX_REPS: usize = 32;

/// The fewest tokens of text read before generating: a draft drafts on
/// what the context holds, and at depth 0 it would hold nothing to go on.
pub const MIN_PROMPT: u32 = 64;

#[repr(C)]
struct RawContext {
    n_ctx: u32,
    n_batch: u32,
    n_ubatch: u32,
    n_threads: i32,
    flash_attn: i32,
    op_offload: i32,
    type_kv: i32,
}

#[repr(C)]
struct RawDraft {
    /// The draft model; null for the model's own MTP heads (draft-mtp).
    path: *const c_char,
    n_gpu_layers: i32,
    n_max: i32,
    type_kv: i32,
}

#[repr(C)]
struct RawResult {
    n_reps: u32,
    plain_ns: [u64; MAX_REPS],
    spec_ns: [u64; MAX_REPS],
    n_gen: u32,
    n_depth: u32,
    n_drafted: u64,
    n_accepted: u64,
    n_rounds: u64,
    same_prefix: u32,
    error: [c_char; 512],
}

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn ngl_tune_spec_bench(
        path: *const c_char,
        placement: *const crate::engine::placement::RawPlacement,
        context: *const RawContext,
        draft: *const RawDraft,
        text: *const c_char,
        n_depth: u32,
        n_gen: u32,
        n_reps: u32,
        cb: extern "C" fn(*mut c_void, c_int, *const c_char, c_int, u64, u64, u64),
        user: *mut c_void,
        out: *mut RawResult,
    ) -> c_int;
    fn ngl_tune_spec_compatible(target: *const c_char, draft: *const c_char) -> c_int;
}

/// What a speculative run measures: the model at `placement` (its draft
/// among it; without one, the plain runs alone), `n_gen` tokens at
/// `n_depth`, `repetitions` times each side, over `text_file` (the
/// quality check's natural text where `None`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpecAsk {
    pub model: PathBuf,
    pub placement: Placement,
    pub n_depth: u32,
    pub n_gen: u32,
    pub repetitions: u32,
    #[serde(default)]
    pub text_file: Option<PathBuf>,
    /// Only check that the draft suits the model (vocabularies read, nothing loaded).
    #[serde(default)]
    pub check_only: bool,
}

/// One buffer type's bytes in the target's or the draft's context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecBuffer {
    pub draft: bool,
    pub buffer: String,
    pub host: bool,
    pub model: u64,
    pub context: u64,
    pub compute: u64,
}

/// What it measured: each repetition's generation time without the draft
/// and with it, the draft's proposals and the target's acceptances, and
/// the memory of both contexts by llama.cpp's accounting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecRun {
    pub plain_ns: Vec<u64>,
    pub spec_ns: Vec<u64>,
    pub n_gen: u32,
    pub n_depth: u32,
    pub n_drafted: u64,
    pub n_accepted: u64,
    /// Target batches that verified a draft.
    pub n_rounds: u64,
    /// The fewest leading tokens, over the repetitions, that the run with
    /// the draft generated as the run without it did (both greedy; a
    /// batch of the last token and a draft computes the logits in other
    /// kernels than one token, so a near tie may break the other way
    /// later on: a draft loop that is wrong differs at once).
    pub same_prefix: u32,
    pub buffers: Vec<SpecBuffer>,
}

impl SpecRun {
    /// The share of drafted tokens the target accepted.
    #[must_use]
    pub fn acceptance(&self) -> Option<f64> {
        #[allow(clippy::cast_precision_loss)]
        (self.n_drafted > 0).then(|| self.n_accepted as f64 / self.n_drafted as f64)
    }

    /// Tokens one verifying batch yields: the accepted drafts and the target's own.
    #[must_use]
    pub fn tokens_per_round(&self) -> Option<f64> {
        #[allow(clippy::cast_precision_loss)]
        (self.n_rounds > 0).then(|| (self.n_accepted + self.n_rounds) as f64 / self.n_rounds as f64)
    }

    /// Each repetition's generation speed (t/s) without the draft (`draft`
    /// false) or with it.
    #[must_use]
    pub fn speeds(&self, draft: bool) -> Vec<f64> {
        let ns = if draft { &self.spec_ns } else { &self.plain_ns };
        #[allow(clippy::cast_precision_loss)]
        ns.iter().map(|n| f64::from(self.n_gen) * 1e9 / (*n as f64).max(1.0)).collect()
    }

    /// The pairs (with the draft, without) of each repetition.
    #[must_use]
    pub fn pairs(&self) -> Vec<(f64, f64)> {
        self.speeds(true).into_iter().zip(self.speeds(false)).collect()
    }

    /// Bytes off the host (the devices'), of the draft's context or the target's.
    #[must_use]
    pub fn device_bytes(&self, draft: bool) -> u64 {
        let device = |b: &&SpecBuffer| !b.host && crate::types::is_device_buffer_type(&b.buffer);
        self.buffers.iter().filter(|b| b.draft == draft).filter(device).map(|b| b.model + b.context + b.compute).sum()
    }
}

extern "C" fn on_buffer(user: *mut c_void, which: c_int, buft: *const c_char, is_host: c_int, m: u64, c: u64, k: u64) {
    // SAFETY: `user` is the Vec the caller passed, alive for the call; `buft` a C string.
    let (v, name) = unsafe { (&mut *user.cast::<Vec<SpecBuffer>>(), CStr::from_ptr(buft)) };
    v.push(SpecBuffer {
        draft: which == 1,
        buffer: name.to_string_lossy().into_owned(),
        host: is_host != 0,
        model: m,
        context: c,
        compute: k,
    });
}

/// The child's side: reads a [`SpecAsk`] on stdin, prints a [`SpecRun`].
///
/// # Errors
/// A request that is not one, a text that cannot be read, or what the
/// shim refused (its reason).
pub fn spec_main() -> Result<()> {
    use std::io::Read;
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let ask: SpecAsk = serde_json::from_str(&input).context("__spec expects a SpecAsk as JSON on stdin")?;
    let draft = ask.placement.draft.clone();
    let text = match &ask.text_file {
        Some(f) => std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
        None => crate::engine::quality::natural_text().context(
            "no natural text to draft on: install Debian's fortunes (scripts/setup does), or give --prompt-file",
        )?,
    };
    crate::engine::logs::install();
    crate::engine::logs::quiet();
    let _backend = llama_cpp_2::llama_backend::LlamaBackend::init()?;
    crate::engine::placement::add_rpc_servers(&ask.placement.rpc)?;
    if let Some(m) = draft.as_ref().and_then(|d| d.model.as_ref()) {
        compatible(&ask.model, m)?;
    }
    if ask.check_only {
        println!("null");
        return Ok(());
    }
    let run = run_shim(&ask, draft.as_ref(), head(&text, ask.n_depth + ask.n_gen))?;
    println!("{}", serde_json::to_string(&run)?);
    Ok(())
}

/// The outputs (total, per sequence) llama-server sizes a target's
/// context for beside a draft of `n_max` tokens over `slots` slots:
/// `common_speculative_get_output_limits` (a verifying batch a slot: the
/// last token and the draft), capped by the batch.
#[must_use]
pub fn output_limits(n_batch: u32, slots: u32, n_max: u32) -> [u32; 2] {
    let per_seq = u64::from(n_max) + 1;
    let cap = |n: u64| u32::try_from(n.min(u64::from(n_batch.max(1)))).unwrap_or(u32::MAX);
    [cap(per_seq * u64::from(slots.max(1))), cap(per_seq)]
}

/// Bytes of text read for each token the run needs: far more than any
/// tokenizer packs into one, so the head holds the tokens wherever the
/// whole text does.
const BYTES_PER_TOKEN: usize = 64;

/// The part of `text` the run can read: tokenizing all of Debian's
/// fortunes (megabytes) with a small vocabulary takes longer than the run.
fn head(text: &str, tokens: u32) -> &str {
    let n = (tokens as usize + 64).saturating_mul(BYTES_PER_TOKEN);
    if text.len() <= n {
        return text;
    }
    let mut end = n;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `BadInput` where llama.cpp would not draft for `model` with `draft`.
fn compatible(model: &std::path::Path, draft: &std::path::Path) -> Result<()> {
    let (target, dft) =
        (CString::new(model.to_string_lossy().as_bytes())?, CString::new(draft.to_string_lossy().as_bytes())?);
    // SAFETY: two valid C strings; the shim reads the vocabularies only.
    match unsafe { ngl_tune_spec_compatible(target.as_ptr(), dft.as_ptr()) } {
        1 => Ok(()),
        0 => Err(crate::error::bad(format!(
            "--draft {}: its vocabulary does not match {}'s (llama.cpp's check: the same tokenizer, special tokens and token texts); give a draft of the same model family",
            draft.display(),
            model.display()
        ))),
        _ => anyhow::bail!("llama.cpp cannot read the draft {}", draft.display()),
    }
}

/// The shim's run of `ask`: with `draft`, or the plain runs alone.
fn run_shim(ask: &SpecAsk, draft: Option<&Draft>, text: &str) -> Result<SpecRun> {
    let p = &ask.placement;
    let params = crate::engine::placement::ModelParams::of(p);
    let raw = params.raw();
    let ctx = RawContext {
        n_ctx: p.n_ctx.unwrap_or(ask.n_depth + ask.n_gen + 64),
        n_batch: p.n_batch,
        n_ubatch: p.n_ubatch,
        n_threads: i32::try_from(p.n_threads).unwrap_or(1),
        flash_attn: i32::from(p.kv_type.flash_attn(p.flash_attn).value()),
        op_offload: i32::from(p.op_offload != crate::placement::OpOffload::Off),
        type_kv: p.kv_type.ggml_type(),
    };
    let draft_path = draft.and_then(|d| d.model.as_ref()).map(|m| CString::new(m.to_string_lossy().as_bytes()));
    let draft_path = draft_path.transpose()?;
    let raw_draft = draft.map(|d| RawDraft {
        // Null: the model's own MTP heads.
        path: draft_path.as_ref().map_or(std::ptr::null(), |p| p.as_ptr()),
        n_gpu_layers: d.n_gpu_layers.map_or(-1, |n| i32::try_from(n).unwrap_or(i32::MAX)),
        n_max: i32::try_from(d.n_max).unwrap_or(i32::MAX),
        type_kv: d.kv_type.ggml_type(),
    });
    let draft_ptr = raw_draft.as_ref().map_or(std::ptr::null(), std::ptr::from_ref);
    let model = CString::new(ask.model.to_string_lossy().as_bytes())?;
    let text = CString::new(text.replace('\0', " "))?;
    let mut buffers: Vec<SpecBuffer> = Vec::new();
    // SAFETY: plain old data, zeroed, which the shim fills.
    let mut out: RawResult = unsafe { std::mem::zeroed() };
    let reps = ask.repetitions.clamp(1, u32::try_from(MAX_REPS).unwrap_or(32));
    // SAFETY: every pointer is valid for the call; the callback gets `buffers`.
    let rc = unsafe {
        ngl_tune_spec_bench(
            model.as_ptr(),
            &raw const raw,
            &raw const ctx,
            draft_ptr,
            text.as_ptr(),
            ask.n_depth,
            ask.n_gen,
            reps,
            on_buffer,
            (&raw mut buffers).cast(),
            &raw mut out,
        )
    };
    if rc != 0 {
        // SAFETY: the shim writes a NUL-terminated message into the buffer.
        let why = unsafe { CStr::from_ptr(out.error.as_ptr()) }.to_string_lossy().into_owned();
        if rc == 6 {
            return Err(crate::error::bad(format!(
                "{why} ({} + {} tokens); give a longer --prompt-file, or a smaller depth or -n",
                ask.n_depth, ask.n_gen
            )));
        }
        anyhow::bail!("{why}");
    }
    let n = usize::try_from(out.n_reps).unwrap_or(0).min(MAX_REPS);
    Ok(SpecRun {
        plain_ns: out.plain_ns[..n].to_vec(),
        spec_ns: out.spec_ns[..n].to_vec(),
        n_gen: out.n_gen,
        n_depth: out.n_depth,
        n_drafted: out.n_drafted,
        n_accepted: out.n_accepted,
        n_rounds: out.n_rounds,
        same_prefix: out.same_prefix,
        buffers,
    })
}

/// Checks in a child that `ask`'s draft suits its model (llama.cpp's
/// vocabulary check, nothing loaded) and that the text can be read.
///
/// # Errors
/// `BadInput` for a draft that does not suit the model; else as [`measure`].
pub fn check(ask: &SpecAsk) -> Result<()> {
    let ask = SpecAsk { check_only: true, ..ask.clone() };
    call::<Option<SpecRun>>(&ask, Duration::from_secs(120)).map(|_| ())
}

/// Runs `ask` in a child and reads what it measured.
///
/// # Errors
/// A child that cannot start, fails (its last line said), runs past
/// `timeout` or answers nonsense.
pub fn measure(ask: &SpecAsk, timeout: Duration) -> Result<SpecRun> {
    call(ask, timeout)
}

fn call<O: serde::de::DeserializeOwned>(ask: &SpecAsk, timeout: Duration) -> Result<O> {
    use crate::engine::child;
    let exe = child::current_exe()?;
    let spawned = child::spawn(&exe, "__spec", &[], &serde_json::to_vec(ask)?, false)?;
    let done = spawned.wait(timeout, Duration::from_millis(20), || {})?;
    if done.timed_out {
        anyhow::bail!("the speculative run did not end within {} s", timeout.as_secs());
    }
    if !done.status.success() {
        let last = child::telling_line(&done.tail);
        // The child's bad input (a draft that does not suit the model) is the caller's.
        if done.status.code() == Some(crate::error::exit::BAD_INPUT) {
            return Err(crate::error::bad(last.trim_start_matches("error: ").to_string()));
        }
        anyhow::bail!("the speculative run failed ({}): {last}", child::describe_exit(done.status));
    }
    serde_json::from_str(done.stdout.trim()).context("the speculative run printed no valid JSON")
}
