//! llama-server started by the user as the consumer: its `LLAMA_ARG_*`
//! variables (`--server-env FILE`), read as llama.cpp reads them
//! (`common/arg.cpp`, each flag's environment variable).

use std::path::Path;

use super::{read_env_file, Applied, Consumer, Program, ServerEnv, Workload};
use crate::llama_args::LlamaArgs;

/// llama-server's settings from its environment file.
pub struct LlamaServer {
    pub env: ServerEnv,
    pub args: LlamaArgs,
}

impl LlamaServer {
    /// Reads `--server-env FILE`.
    ///
    /// # Errors
    /// `BadInput` for a file that cannot be read or holds a setting
    /// llama.cpp would refuse.
    pub fn read(path: &Path) -> anyhow::Result<LlamaServer> {
        let env = read_env_file(path, "--server-env")?;
        let args = crate::llama_args::from_env(&env.vars)
            .map_err(|e| crate::error::bad(format!("--server-env {}: {e}; fix that variable", path.display())))?;
        Ok(LlamaServer { env, args })
    }
}

impl Consumer for LlamaServer {
    fn program(&self) -> Program {
        Program::LlamaServer
    }

    fn env(&self) -> &ServerEnv {
        &self.env
    }

    fn vars(&self) -> Vec<(String, String)> {
        super::namespaced(&self.env, &["LLAMA_ARG_"])
    }

    /// Where `LLAMA_ARG_CTX_SIZE` is unset, the context Ollama's rule
    /// gives (without Ollama's variables), as for a profile without a
    /// consumer; [`Consumer::apply`] lays the variable over it.
    fn default_ctx(&self, hw: &crate::types::Hardware, ctx_train: u64) -> (u32, String) {
        super::ollama::Ollama { env: ServerEnv::default() }.default_ctx(hw, ctx_train)
    }

    /// Its context (unless the user gave one), slots, KV type, flash
    /// attention, and batch sizes (unless `-b`/`--ubatch-size` were given).
    fn apply(&self, w: &mut Workload, _arch: &str, user_ctx: bool, _cuda: &[(String, (u32, u32))]) -> Applied {
        let (args, defaults) = (&self.args, w.default_batch());
        let mut said = Vec::new();
        if let Some(c) = args.ctx.filter(|_| !user_ctx) {
            w.n_ctx = c;
            w.ctx_rule = Some(format!("context {c}: LLAMA_ARG_CTX_SIZE of {}", self.env.source));
            said.push(format!("LLAMA_ARG_CTX_SIZE={c}"));
        }
        if let Some(n) = args.n_parallel.filter(|n| *n > 1) {
            w.n_parallel = n;
            said.push(format!("LLAMA_ARG_N_PARALLEL={n}: -np {n}, each slot {} tokens", w.n_ctx / n));
        }
        if let Some(k) = args.kv_type {
            w.kv_type = k;
            said.push(format!("LLAMA_ARG_CACHE_TYPE_K/V={}", k.as_str()));
        }
        if let Some(fa) = args.flash_attn {
            w.flash_attn = fa;
            said.push(format!("LLAMA_ARG_FLASH_ATTN={}", fa.as_str()));
        }
        if let (Some(b), true) = (args.n_batch, defaults) {
            w.n_batch = b;
            said.push(format!("LLAMA_ARG_BATCH={b}"));
        }
        if let (Some(b), true) = (args.n_ubatch, defaults) {
            w.n_ubatch = b;
            said.push(format!("LLAMA_ARG_UBATCH={b}"));
        }
        Applied { said, auto_batch: false }
    }
}
