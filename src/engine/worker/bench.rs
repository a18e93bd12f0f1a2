//! llama-bench's tests inside a worker: each repetition back at the
//! depth (the filled sequence's state loaded again), `test_prompt` and
//! `test_gen` as llama-bench runs them, raced where a threshold is given.

use std::time::{Duration, Instant};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use rand::Rng;

use crate::types::TrialSpec;

/// How each repetition gets back to the depth. As llama-bench does: the
/// memory cleared, then the filled sequence's state (saved once after the
/// fill) loaded again; this holds for every memory, recurrent state
/// (Mamba, LFM2, Qwen3-Next) and sliding windows included, which trimming
/// cannot bring back. Trimmed past the depth instead
/// (`llama_memory_seq_rm(0, d, -1)`) where the state cannot be saved, or
/// with `NGL_TUNE_DEPTH_TRIM=1` (the benchmark's other side).
pub(super) struct Depth {
    pub(super) n: u32,
    saved: Option<llama_cpp_2::context::session::SeqState>,
}

impl Depth {
    /// The depth `n` of a context just filled to it.
    pub(super) fn filled(ctx: &LlamaContext<'_>, n: u32) -> Depth {
        let trim = std::env::var_os("NGL_TUNE_DEPTH_TRIM").is_some();
        let flags = llama_cpp_2::context::session::LlamaStateSeqFlags::empty();
        let saved = if n > 0 && !trim { ctx.state_seq_get(0, flags).ok() } else { None };
        Depth { n, saved }
    }

    /// Back to the depth (at depth 0, the cache cleared), so a repetition
    /// starts where the last did; with `streams` sequences, each of them
    /// at the depth (copies of the first).
    pub(super) fn restore(&self, ctx: &mut LlamaContext<'_>, streams: u32) -> Result<(), String> {
        let depth = self.n;
        if depth == 0 {
            ctx.clear_kv_cache();
            return Ok(());
        }
        if let Some(s) = &self.saved {
            ctx.clear_kv_cache();
            for seq in 0..streams.max(1) {
                let seq = i32::try_from(seq).unwrap_or(i32::MAX);
                ctx.state_seq_set(s, seq).map_err(|e| format!("restoring the KV cache at depth {depth}: {e}"))?;
            }
            return Ok(());
        }
        match ctx.clear_kv_cache_seq(Some(0), Some(depth), None) {
            Ok(true) => {}
            Ok(false) => return Err(format!("llama.cpp could not trim the KV cache back to depth {depth}")),
            Err(e) => return Err(format!("trimming the KV cache to depth {depth}: {e}")),
        }
        for seq in 1..streams {
            let _ = ctx.clear_kv_cache_seq(Some(seq), None, None);
            let seq = i32::try_from(seq).unwrap_or(i32::MAX);
            ctx.copy_kv_cache_seq(0, seq, None, None)
                .map_err(|e| format!("copying the depth to sequence {seq}: {e}"))?;
        }
        Ok(())
    }
}

/// How a test's repetitions ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// Every repetition ran.
    Ran,
    /// Raced and cut inside its first repetition after this many tokens
    /// (its sample is the rate of the tokens timed, over the whole test).
    CutAt(u32),
    /// Raced and cut after its first repetition.
    CutAfterFirst,
}

/// llama-bench's repetitions of one test, and how they ended.
pub(super) fn measure(
    (ctx, depth): (&mut LlamaContext<'_>, &Depth),
    model: &LlamaModel,
    rng: &mut rand::rngs::StdRng,
    spec: &TrialSpec,
    (n_prompt, n_gen): (u32, u32),
    (samples, energy): (&mut Vec<u64>, &mut crate::probe::energy::Timed<'_>),
) -> Result<Ended, String> {
    let vocab = model.vocab();
    let n_vocab = model.n_vocab().max(1);
    let bos = if vocab.should_add_bos() { Some(vocab.bos()) } else { None };
    let n_batch = spec.placement.n_batch;
    // A tg test of --objective throughput decodes its streams together.
    let streams = if n_prompt == 0 { spec.n_streams.max(1) } else { 1 };
    let gen = Gen { n_vocab, bos, streams, depth: depth.n };
    if spec.warmup {
        depth.restore(ctx, streams)?;
        if n_prompt > 0 {
            test_prompt(ctx, rng, n_vocab, bos, n_prompt, n_batch, None)?;
        }
        if n_gen > 0 {
            test_gen(ctx, rng, &gen, 1, None)?;
        }
    }
    let below = spec.race.and_then(|r| r.below(n_prompt)).filter(|b| *b > 0.0);
    let n_tokens = n_prompt + n_gen;
    // Every stream's tokens count in the rate the race compares.
    let counted = f64::from(n_tokens * streams);
    for _ in 0..spec.repetitions {
        depth.restore(ctx, streams)?;
        energy.begin();
        let t0 = Instant::now();
        // The first repetition stops as soon as its rate cannot reach the threshold.
        let limit = below.filter(|_| samples.is_empty()).map(|b| (t0, Duration::from_secs_f64(counted / b)));
        let mut timed = None;
        if n_prompt > 0 {
            timed = test_prompt(ctx, rng, n_vocab, bos, n_prompt, n_batch, limit)?;
        }
        if n_gen > 0 && timed.is_none() {
            timed = test_gen(ctx, rng, &gen, n_gen, limit)?.map(|g| n_prompt + g);
        }
        let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        energy.end();
        if let Some(done) = timed {
            // The rate of what was timed, as if the test had run to its end at it.
            let whole = u128::from(ns) * u128::from(n_tokens) / u128::from(done.max(1));
            samples.push(u64::try_from(whole).unwrap_or(u64::MAX));
            return Ok(Ended::CutAt(done));
        }
        samples.push(ns);
        #[allow(clippy::cast_precision_loss)]
        let ts = counted * 1e9 / (ns as f64).max(1.0);
        if samples.len() == 1 && spec.repetitions > 1 && below.is_some_and(|b| ts < b) {
            return Ok(Ended::CutAfterFirst);
        }
    }
    Ok(Ended::Ran)
}

/// Whether a test timed since `limit.0` can no longer reach its threshold:
/// even if the rest took no time, its rate would stay below it.
fn hopeless(limit: Option<(Instant, Duration)>) -> bool {
    limit.is_some_and(|(t0, most)| t0.elapsed() > most)
}

/// llama-bench's `test_prompt`: random tokens (BOS first when the vocabulary
/// adds one) decoded in `n_batch` chunks, one synchronize at the end.
/// With a race `limit`, stops after a chunk once the test cannot reach its
/// threshold: `Some(tokens decoded)`.
fn test_prompt(
    ctx: &mut LlamaContext<'_>,
    rng: &mut rand::rngs::StdRng,
    n_vocab: i32,
    bos: Option<LlamaToken>,
    n_prompt: u32,
    n_batch: u32,
    limit: Option<(Instant, Duration)>,
) -> Result<Option<u32>, String> {
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
        if processed < n_prompt && limit.is_some() {
            ctx.synchronize();
            if hopeless(limit) {
                return Ok(Some(processed));
            }
        }
    }
    ctx.synchronize();
    Ok(None)
}

/// What a tg test decodes: random tokens of the vocabulary (BOS first
/// where it adds one), `streams` sequences together, each after `depth`.
struct Gen {
    n_vocab: i32,
    bos: Option<LlamaToken>,
    streams: u32,
    depth: u32,
}

/// llama-bench's `test_gen`: single-token decodes, synchronize after each;
/// with several streams, one token of each a step (llama-batched-bench's
/// generation loop). With a race `limit`, stops after a step once the test
/// cannot reach its threshold: `Some(steps done)`.
fn test_gen(
    ctx: &mut LlamaContext<'_>,
    rng: &mut rand::rngs::StdRng,
    g: &Gen,
    n_gen: u32,
    limit: Option<(Instant, Duration)>,
) -> Result<Option<u32>, String> {
    let mut token = g.bos.unwrap_or_else(|| LlamaToken::new(rng.random_range(0..g.n_vocab)));
    let mut batch = (g.streams > 1).then(|| LlamaBatch::new(g.streams as usize, i32::try_from(g.streams).unwrap_or(1)));
    for i in 0..n_gen {
        match batch.as_mut() {
            Some(b) => {
                b.clear();
                let pos = i32::try_from(g.depth + i).map_err(|e| format!("position: {e}"))?;
                for seq in 0..i32::try_from(g.streams).unwrap_or(1) {
                    let t = if i == 0 { token } else { LlamaToken::new(rng.random_range(0..g.n_vocab)) };
                    b.add(t, pos, &[seq], true).map_err(|e| format!("batch: {e}"))?;
                }
                ctx.decode(b).map_err(|e| format!("generation decode failed ({e})"))?;
            }
            None => {
                let one = [token];
                let mut one = LlamaBatch::get_one(&one).map_err(|e| format!("batch: {e}"))?;
                ctx.decode(&mut one).map_err(|e| format!("generation decode failed ({e})"))?;
            }
        }
        ctx.synchronize();
        token = LlamaToken::new(rng.random_range(0..g.n_vocab));
        if i + 1 < n_gen && hopeless(limit) {
            return Ok(Some(i + 1));
        }
    }
    Ok(None)
}
