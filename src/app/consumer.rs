//! The consumer's settings laid over a tune's: what the Ollama server (its
//! environment) or llama-server (`--server-env`) will really run.

use anyhow::Result;

use crate::cli::TuneArgs;
use crate::consumer::{ollama_batch, ollama_run, read_env_file, ServerEnv};
use crate::error::bad;
use crate::profile::{Consumer, Settings};
use crate::types::{DEFAULT_N_BATCH, DEFAULT_N_UBATCH};

/// Where the consumer's settings come from, read once for every model.
pub(super) enum Source {
    Ollama(ServerEnv),
    Server(ServerEnv, crate::llama_args::LlamaArgs),
}

/// Reads `--server-env`, else `--ollama-env`, else the ollama unit.
///
/// # Errors
/// `BadInput` for a file that cannot be read or holds a setting llama.cpp
/// would refuse.
pub(super) fn read(a: &TuneArgs) -> Result<Source> {
    if let Some(p) = &a.server_env {
        let env = read_env_file(p, "--server-env")?;
        let args = crate::llama_args::from_env(&env.vars)
            .map_err(|e| bad(format!("--server-env {}: {e}; fix that variable", p.display())))?;
        return Ok(Source::Server(env, args));
    }
    Ok(Source::Ollama(crate::consumer::ollama_env(a.ollama_env.as_deref())?))
}

impl Source {
    /// The Ollama server's variable, where Ollama is the consumer.
    pub(super) fn ollama_var(&self, key: &str) -> Option<String> {
        match self {
            Source::Ollama(env) => env.var(key),
            Source::Server(..) => None,
        }
    }

    /// Lays the consumer's settings over `s` (after its contexts were
    /// chosen): parallel slots multiply each context, the KV type and
    /// flash attention are the server's, and for Ollama the batch size is
    /// its rule for the context (unless `-b`/`--ubatch-size` were given).
    /// `cuda`: the CUDA cards llama.cpp offloads to, with their compute
    /// capability (Ollama's flash-attention check).
    pub(super) fn apply(&self, s: &mut Settings, arch: &str, user_ctx: bool, cuda: &[(String, (u32, u32))]) {
        let defaults = (s.n_batch, s.n_ubatch) == (DEFAULT_N_BATCH, DEFAULT_N_UBATCH);
        match self {
            Source::Ollama(env) => {
                let run = ollama_run(env, arch, cuda);
                let mut applied = run.applied;
                if env.found {
                    scale_contexts(s, run.parallel);
                    if let Some(k) = run.kv_type {
                        s.kv_type = k;
                    }
                }
                // Its setting where found, or its device check's.
                if let Some(fa) = run.flash_attn {
                    s.flash_attn = fa;
                }
                // Ollama's batch rule holds with or without its settings found.
                if defaults {
                    let b = ollama_batch(s.n_ctx);
                    (s.n_batch, s.n_ubatch) = (b, b);
                    applied.push(format!(
                        "Ollama's batch size, its rule per context (-b {b} -ub {b} at {} tokens before its step-down)",
                        s.n_ctx
                    ));
                }
                s.consumer = Some(Consumer {
                    program: "ollama".into(),
                    source: env.source.clone(),
                    found: env.found,
                    applied,
                    vars: ours(env, &["OLLAMA_", "LLAMA_ARG_"]),
                    auto_batch: defaults,
                });
            }
            Source::Server(env, args) => {
                let mut applied = Vec::new();
                if let Some(c) = args.ctx.filter(|_| !user_ctx) {
                    s.n_ctx = c;
                    s.ctx_rule = Some(format!("context {c}: LLAMA_ARG_CTX_SIZE of {}", env.source));
                    applied.push(format!("LLAMA_ARG_CTX_SIZE={c}"));
                }
                if let Some(n) = args.n_parallel.filter(|n| *n > 1) {
                    s.n_parallel = n;
                    applied.push(format!("LLAMA_ARG_N_PARALLEL={n}: -np {n}, each slot {} tokens", s.n_ctx / n));
                }
                if let Some(k) = args.kv_type {
                    s.kv_type = k;
                    applied.push(format!("LLAMA_ARG_CACHE_TYPE_K/V={}", k.as_str()));
                }
                if let Some(fa) = args.flash_attn {
                    s.flash_attn = fa;
                    applied.push(format!("LLAMA_ARG_FLASH_ATTN={}", fa.as_str()));
                }
                if let (Some(b), true) = (args.n_batch, defaults) {
                    s.n_batch = b;
                    applied.push(format!("LLAMA_ARG_BATCH={b}"));
                }
                if let (Some(b), true) = (args.n_ubatch, defaults) {
                    s.n_ubatch = b;
                    applied.push(format!("LLAMA_ARG_UBATCH={b}"));
                }
                s.consumer = Some(Consumer {
                    program: "llama-server".into(),
                    source: env.source.clone(),
                    found: true,
                    applied,
                    vars: ours(env, &["LLAMA_ARG_"]),
                    auto_batch: false,
                });
            }
        }
    }
}

/// The variables of the server's own namespace (not PATH, HOME, ...).
/// Ollama's include llama-server's `LLAMA_ARG_*`: its child inherits them.
fn ours(env: &ServerEnv, prefixes: &[&str]) -> Vec<(String, String)> {
    env.vars.iter().filter(|(k, _)| prefixes.iter().any(|p| k.starts_with(p))).cloned().collect()
}

/// Each context tuned becomes `parallel` slots of it: Ollama starts
/// llama-server with `-c num_ctx x P -np P`.
fn scale_contexts(s: &mut Settings, parallel: u32) {
    if parallel > 1 {
        s.into_slots(parallel);
    }
}
