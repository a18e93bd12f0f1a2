//! The consumer's settings laid over a tune's: what the Ollama server (its
//! environment) or llama-server (`--server-env`) will really run. Each
//! consumer's rules are its own file in `consumer/`; this picks one from
//! the command line and copies the workload in and back.

use anyhow::Result;

use crate::cli::TuneArgs;
use crate::consumer::{llama_server::LlamaServer, ollama::Ollama, Consumer, Workload};
use crate::profile::Settings;

/// Reads `--server-env`, else `--ollama-env`, else the ollama unit.
///
/// # Errors
/// `BadInput` for a file that cannot be read or holds a setting llama.cpp
/// would refuse.
pub(super) fn read(a: &TuneArgs) -> Result<Box<dyn Consumer>> {
    Ok(match &a.server_env {
        Some(p) => Box::new(LlamaServer::read(p)?),
        None => Box::new(Ollama::read(a.ollama_env.as_deref())?),
    })
}

/// Lays the consumer's settings over `s` (after its contexts were chosen)
/// and records them in the settings. `cuda`: the CUDA cards llama.cpp
/// offloads to, with their compute capability.
pub(super) fn apply(c: &dyn Consumer, s: &mut Settings, arch: &str, user_ctx: bool, cuda: &[(String, (u32, u32))]) {
    let mut w = Workload {
        n_ctx: s.n_ctx,
        contexts: s.contexts.clone(),
        ctx_rule: s.ctx_rule.clone(),
        n_parallel: s.n_parallel,
        kv_type: s.kv_type,
        flash_attn: s.flash_attn,
        n_batch: s.n_batch,
        n_ubatch: s.n_ubatch,
    };
    let applied = c.apply(&mut w, arch, user_ctx, cuda);
    (s.n_ctx, s.contexts, s.ctx_rule, s.n_parallel) = (w.n_ctx, w.contexts, w.ctx_rule, w.n_parallel);
    (s.kv_type, s.flash_attn, s.n_batch, s.n_ubatch) = (w.kv_type, w.flash_attn, w.n_batch, w.n_ubatch);
    let env = c.env();
    s.consumer = Some(crate::profile::Consumer {
        program: c.program(),
        source: env.source.clone(),
        found: env.found,
        applied: applied.said,
        vars: c.vars(),
        auto_batch: applied.auto_batch,
    });
}
