//! What a faster placement costs in output quality, measured the way
//! llama.cpp's perplexity tool does with `--kl-divergence`: the reference
//! (an f16 KV cache, or the largest quantization) reads a long natural text
//! up to the depth the placement is tuned at, then generates tokens
//! greedily; every alternative scores the same tokens after the same
//! context, and the token distributions are compared position by position
//! (mean KL divergence from the reference, how often the top token agrees).
//! A KV cache type is judged with the cache as full as the user's. The text
//! is Debian's `fortunes` (plain-text quotations; `scripts/setup` installs
//! it); without it, or at depth 0, fixed prompts are continued instead.
//! Runs in a child process (hidden `__kl`): models load one after another.

use std::num::NonZeroU32;
use std::path::PathBuf;

use anyhow::{Context, Result};
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use serde::{Deserialize, Serialize};

use crate::placement::KvType;
use crate::types::Quality;

/// The fixed prompts the reference continues (prose and code: different
/// token statistics).
pub const PROMPTS: [&str; 2] = [
    "The history of the printing press begins in the fifteenth century, when",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n",
];

/// Where the long natural text lives (Debian's `fortunes`), and the files
/// read, in this order: prose quotations, about 640 KB.
pub const TEXT_DIR: &str = "/usr/share/games/fortunes";
pub const TEXT_FILES: [&str; 5] = ["people", "science", "politics", "wisdom", "work"];

/// The natural text quality is judged on: the fortunes files joined, the
/// `%` lines between fortunes dropped. `NGL_TUNE_TEXT_DIR` points
/// elsewhere (tests). `None` when none of the files is there.
#[must_use]
pub fn natural_text() -> Option<String> {
    let dir = std::env::var_os("NGL_TUNE_TEXT_DIR").map_or_else(|| PathBuf::from(TEXT_DIR), PathBuf::from);
    let mut text = String::new();
    for f in TEXT_FILES {
        let Ok(bytes) = std::fs::read(dir.join(f)) else { continue };
        for line in String::from_utf8_lossy(&bytes).lines().filter(|l| l.trim() != "%") {
            text.push_str(line);
            text.push('\n');
        }
    }
    (!text.is_empty()).then_some(text)
}

/// One configuration to score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KlConfig {
    pub model: PathBuf,
    pub kv_type: KvType,
    pub n_gpu_layers: u32,
    #[serde(default)]
    pub op_offload: bool,
}

/// What `__kl` is asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KlSpec {
    pub reference: KlConfig,
    pub alternatives: Vec<KlConfig>,
    /// Tokens the reference generates per prompt.
    pub n_gen: u32,
    pub n_threads: u32,
    /// Tokens of natural text read before the scored ones (the depth the
    /// placement is tuned at); 0: the fixed prompts, continued.
    #[serde(default)]
    pub depth: u32,
    /// RPC servers (host:port) whose devices take the offloaded layers, as
    /// in the trials: scored where the placement runs, not on this host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpc: Vec<String>,
}

/// Each alternative's score, or why it has none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KlScore {
    pub quality: Option<Quality>,
    pub error: Option<String>,
}

/// All answers of one `__kl` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KlOutput {
    pub scores: Vec<KlScore>,
    pub error: Option<String>,
}

fn load(backend: &LlamaBackend, c: &KlConfig) -> Result<LlamaModel, String> {
    let params = LlamaModelParams::default().with_n_gpu_layers(c.n_gpu_layers);
    let m = LlamaModel::load_from_file(backend, &c.model, &params);
    let log = super::logs::take();
    m.map_err(|e| format!("{} could not be loaded ({e}): {}", c.model.display(), log.lines().last().unwrap_or("")))
}

/// Decode chunk (`n_batch`) of the quality child.
const CHUNK: usize = 1024;

fn context<'a>(
    backend: &LlamaBackend,
    m: &'a LlamaModel,
    c: &KlConfig,
    spec: &KlSpec,
) -> Result<LlamaContext<'a>, String> {
    let kv = super::worker::kv_cache_type(c.kv_type);
    let t = i32::try_from(spec.n_threads).unwrap_or(1);
    let n_ctx = (spec.depth + 2 * spec.n_gen + 64).max(1024);
    let p = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(n_ctx))
        .with_n_batch(1024)
        .with_n_ubatch(512)
        .with_n_threads(t)
        .with_n_threads_batch(t)
        .with_type_k(kv)
        .with_type_v(kv)
        .with_op_offload(c.op_offload)
        .with_flash_attention_policy(llama_cpp_sys_2::llama_flash_attn_type::from(if c.kv_type.is_quantized() {
            1
        } else {
            -1
        }));
    let ctx = m.new_context(backend, p);
    let log = super::logs::take();
    ctx.map_err(|e| format!("context for {} failed ({e}): {}", c.kv_type.as_str(), log.lines().last().unwrap_or("")))
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i)
}

/// The prompts the reference continues: `depth` tokens of the natural
/// text (one sequence), or, at depth 0 or without the text, the fixed prompts.
fn prompts(m: &LlamaModel, depth: u32) -> Vec<Vec<LlamaToken>> {
    let vocab = m.vocab();
    if depth > 0 {
        if let Some(text) = natural_text() {
            // Only as much of the text as the depth needs (about 8 bytes a token, doubled while short),
            // not all 640 KB whatever the depth.
            let mut take = (depth as usize).saturating_mul(8).max(4096);
            loop {
                let mut end = take.min(text.len());
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                let mut t = vocab.tokenize(&text.as_bytes()[..end], true, false);
                // Past the depth by a margin: the last word before the cut may tokenize otherwise.
                if t.len() >= depth as usize + 16 || (end == text.len() && t.len() >= depth as usize) {
                    t.truncate(depth as usize);
                    return vec![t];
                }
                if end == text.len() {
                    break;
                }
                take = take.saturating_mul(2);
            }
        }
    }
    PROMPTS.iter().map(|p| vocab.tokenize(p.as_bytes(), true, false)).collect()
}

/// Decodes `tokens` from position `from`, in chunks; logits where `wanted` says.
fn decode_from(
    ctx: &mut LlamaContext<'_>,
    tokens: &[LlamaToken],
    from: usize,
    wanted: &dyn Fn(usize) -> bool,
) -> Result<LlamaBatch<'static>, String> {
    let mut batch = LlamaBatch::new(CHUNK, 1);
    for (k, chunk) in tokens.chunks(CHUNK).enumerate() {
        batch.clear();
        for (j, t) in chunk.iter().enumerate() {
            let i = from + k * CHUNK + j;
            batch.add(*t, i32::try_from(i).unwrap_or(0), &[0], wanted(i)).map_err(|e| e.to_string())?;
        }
        ctx.decode(&mut batch).map_err(|e| format!("decode failed: {e}"))?;
    }
    Ok(batch)
}

/// Greedy continuation of each prompt by the reference: the sequences to score.
fn generate(ctx: &mut LlamaContext<'_>, m: &LlamaModel, spec: &KlSpec) -> Result<Vec<Read>, String> {
    let vocab = m.vocab();
    let n_gen = if spec.depth > 0 { 2 * spec.n_gen } else { spec.n_gen };
    let mut out = Vec::new();
    for mut seq in prompts(m, spec.depth) {
        let n_prompt = seq.len();
        ctx.clear_kv_cache();
        // The prefix the reference's score reads again: decoded once, its state kept (see `score`).
        let start = n_prompt.saturating_sub(1);
        decode_from(ctx, &seq[..start], 0, &|_| false)?;
        let flags = llama_cpp_2::context::session::LlamaStateSeqFlags::empty();
        let prefix = ctx.state_seq_get(0, flags).ok();
        let mut batch = decode_from(ctx, &seq[start..], start, &|i| i + 1 == n_prompt)?;
        for _ in 0..n_gen {
            let next = LlamaToken::new(i32::try_from(argmax(ctx.get_logits_ith(batch.n_tokens() - 1))).unwrap_or(0));
            if vocab.is_eog(next) {
                break;
            }
            seq.push(next);
            batch.clear();
            batch.add(next, i32::try_from(seq.len() - 1).unwrap_or(0), &[0], true).map_err(|e| e.to_string())?;
            ctx.decode(&mut batch).map_err(|e| format!("decode failed: {e}"))?;
        }
        out.push(Read { n_prompt, seq, prefix });
    }
    Ok(out)
}

/// One text the reference read and continued: its prompt's length, the
/// prompt and what followed it, and the sequence's state after all of the
/// prompt but its last token (what [`score`] would read again).
struct Read {
    n_prompt: usize,
    seq: Vec<LlamaToken>,
    prefix: Option<llama_cpp_2::context::session::SeqState>,
}

/// Log-softmax of one row of logits.
fn log_softmax(v: &[f32]) -> Vec<f32> {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = v.iter().map(|x| f64::from(x - max).exp()).sum();
    #[allow(clippy::cast_possible_truncation)]
    let lse = max + sum.ln() as f32;
    v.iter().map(|x| x - lse).collect()
}

/// Each sequence decoded: the context (the prompt but its last token) in
/// chunks without logits, then the rest in one batch; the log-probabilities
/// at every position that predicts a generated token.
/// The log-probabilities at every generated position, each text read
/// again from its start; the reference (`own`: the context that read them)
/// loads the prefix's saved state instead of reading it a second time, the
/// same tokens in the same batches (on a slow host the read is most of the
/// check's time).
fn score(ctx: &mut LlamaContext<'_>, seqs: &[Read], own: bool) -> Result<Vec<Vec<f32>>, String> {
    let mut rows = Vec::new();
    for Read { n_prompt, seq, prefix } in seqs {
        ctx.clear_kv_cache();
        let start = n_prompt - 1;
        match prefix.as_ref().filter(|_| own) {
            Some(state) => ctx.state_seq_set(state, 0).map_err(|e| format!("restoring the text's state: {e}"))?,
            None => {
                decode_from(ctx, &seq[..start], 0, &|_| false)?;
            }
        }
        let tail = &seq[start..];
        if tail.len() > CHUNK {
            return Err(format!("{} generated tokens do not fit one batch of {CHUNK}", tail.len()));
        }
        decode_from(ctx, tail, start, &|i| i + 1 < seq.len())?;
        for j in 0..tail.len() - 1 {
            rows.push(log_softmax(ctx.get_logits_ith(i32::try_from(j).unwrap_or(0))));
        }
    }
    Ok(rows)
}

/// KL divergence of each position's distribution from the reference's,
/// and top-token agreement.
#[must_use]
pub fn compare(reference: &[Vec<f32>], alt: &[Vec<f32>], name: &str) -> Quality {
    let mut kls: Vec<f64> = Vec::with_capacity(reference.len());
    let mut agree = 0usize;
    let mut non_finite = 0u32;
    for (p, q) in reference.iter().zip(alt) {
        let kl: f64 = p.iter().zip(q).map(|(lp, lq)| f64::from(lp.exp()) * f64::from(lp - lq)).sum();
        if !kl.is_finite() {
            // f64::max would turn a NaN into the other argument: a broken path must not read as perfect.
            non_finite += 1;
            continue;
        }
        // Rounding can make a true 0 slightly negative.
        kls.push(kl.max(0.0));
        agree += usize::from(argmax(p) == argmax(q));
    }
    kls.sort_by(f64::total_cmp);
    #[allow(clippy::cast_precision_loss)]
    let n = kls.len().max(1) as f64;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
    let p99 = kls.get(((kls.len() as f64 * 0.99).ceil() as usize).saturating_sub(1)).copied().unwrap_or(0.0);
    #[allow(clippy::cast_precision_loss)]
    Quality {
        kl_mean: kls.iter().sum::<f64>() / n,
        kl_p99: p99,
        top1_agree: agree as f64 / n,
        tokens: u32::try_from(kls.len()).unwrap_or(u32::MAX),
        reference: name.to_string(),
        non_finite,
        depth: 0,
        depth_asked: 0,
        wall_s: 0.0,
    }
}

fn reference_name(c: &KlConfig) -> String {
    let file = c.model.file_name().map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    format!("{file} with an {} KV cache", c.kv_type.as_str())
}

fn run(spec: &KlSpec) -> Result<Vec<KlScore>, String> {
    let backend = LlamaBackend::init().map_err(|e| format!("llama.cpp backend init failed: {e}"))?;
    crate::engine::placement::add_rpc_servers(&spec.rpc).map_err(|e| format!("{e:#}"))?;
    let (seqs, reference, n_vocab) = {
        let m = load(&backend, &spec.reference)?;
        let mut ctx = context(&backend, &m, &spec.reference, spec)?;
        let seqs = generate(&mut ctx, &m, spec)?;
        let rows = score(&mut ctx, &seqs, true)?;
        (seqs, rows, m.n_vocab())
    };
    let name = reference_name(&spec.reference);
    let mut out = Vec::new();
    for alt in &spec.alternatives {
        let scored = load(&backend, alt).and_then(|m| {
            if m.n_vocab() != n_vocab {
                return Err(format!(
                    "{} has another vocabulary ({} tokens, the reference {n_vocab}): not comparable",
                    alt.model.display(),
                    m.n_vocab()
                ));
            }
            let mut ctx = context(&backend, &m, alt, spec)?;
            score(&mut ctx, &seqs, false)
        });
        // The depth the scored tokens were read at (0: the fixed prompts).
        let depth = if seqs.len() == 1 && spec.depth > 0 { u32::try_from(seqs[0].n_prompt).unwrap_or(0) } else { 0 };
        out.push(match scored {
            Ok(rows) => KlScore { quality: Some(Quality { depth, ..compare(&reference, &rows, &name) }), error: None },
            Err(e) => KlScore { quality: None, error: Some(e) },
        });
    }
    Ok(out)
}

/// Entry point of the hidden `__kl` subcommand: a [`KlSpec`] on stdin, a
/// [`KlOutput`] on stdout.
///
/// # Errors
/// When stdin does not hold a spec.
pub fn kl_main() -> Result<()> {
    use std::io::Read;
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let spec: KlSpec = serde_json::from_str(&input).context("__kl expects a KlSpec as JSON on stdin")?;
    super::logs::install();
    super::logs::quiet();
    let out = match run(&spec) {
        Ok(scores) => KlOutput { scores, error: None },
        Err(e) => KlOutput { scores: Vec::new(), error: Some(e) },
    };
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}

/// Scores the alternatives in a child process (the runner's kept trial
/// worker ended first: a server serves one client at a time).
///
/// # Errors
/// When the child cannot run or answers nonsense.
pub fn kl_in_child(runner: &super::runner::Runner, spec: &KlSpec) -> Result<KlOutput> {
    runner.call("__kl", spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_distributions_score_zero_and_others_more() {
        let p = vec![log_softmax(&[2.0, 1.0, 0.0]), log_softmax(&[0.0, 3.0, 0.0])];
        let same = compare(&p, &p, "ref");
        assert!(same.kl_mean.abs() < 1e-12 && (same.top1_agree - 1.0).abs() < 1e-12);
        let near = vec![log_softmax(&[1.8, 1.1, 0.0]), log_softmax(&[0.0, 2.8, 0.1])];
        let far = vec![log_softmax(&[0.0, 2.0, 0.0]), log_softmax(&[3.0, 0.0, 0.0])];
        let (n, f) = (compare(&p, &near, "ref"), compare(&p, &far, "ref"));
        assert!(n.kl_mean > 0.0 && f.kl_mean > n.kl_mean, "{n:?} {f:?}");
        assert!((n.top1_agree - 1.0).abs() < 1e-12 && f.top1_agree.abs() < 1e-12);
        assert_eq!(f.tokens, 2);
    }
}
