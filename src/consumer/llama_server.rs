//! llama-server started by the user as the consumer: its `LLAMA_ARG_*`
//! variables (`--server-env FILE`), read as llama.cpp reads them
//! (`common/arg.cpp`, each flag's environment variable).

use std::path::Path;

use super::{read_env_file, Applied, Consumer, Program, ServerEnv, Workload};
use crate::placement::args::LlamaArgs;

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
        let args = crate::placement::args::from_env(&env.vars)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::{FlashAttn, KvType, DEFAULT_N_BATCH, DEFAULT_N_UBATCH};

    fn server(vars: &[(&str, &str)]) -> LlamaServer {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect();
        let args = crate::placement::args::from_env(&vars).unwrap();
        LlamaServer { env: ServerEnv { source: "--server-env s.env".into(), found: true, vars }, args }
    }

    fn workload() -> Workload {
        Workload {
            n_ctx: 4096,
            contexts: Vec::new(),
            ctx_rule: None,
            n_parallel: 1,
            kv_type: KvType::F16,
            flash_attn: FlashAttn::Auto,
            n_batch: DEFAULT_N_BATCH,
            n_ubatch: DEFAULT_N_UBATCH,
        }
    }

    #[test]
    fn the_servers_variables_are_the_workload_the_users_flags_kept() {
        let s = server(&[
            ("LLAMA_ARG_CTX_SIZE", "8192"),
            ("LLAMA_ARG_N_PARALLEL", "2"),
            ("LLAMA_ARG_CACHE_TYPE_K", "q8_0"),
            ("LLAMA_ARG_CACHE_TYPE_V", "q8_0"),
            ("LLAMA_ARG_FLASH_ATTN", "on"),
            ("LLAMA_ARG_BATCH", "1024"),
            ("HOME", "/root"),
        ]);
        let mut w = workload();
        let applied = s.apply(&mut w, "gemma3", false, &[]);
        assert_eq!((w.n_ctx, w.n_parallel, w.kv_type, w.flash_attn), (8192, 2, KvType::Q8_0, FlashAttn::On));
        assert_eq!((w.n_batch, w.n_ubatch), (1024, DEFAULT_N_UBATCH));
        assert_eq!(w.ctx_rule.as_deref(), Some("context 8192: LLAMA_ARG_CTX_SIZE of --server-env s.env"));
        assert!(applied.said.contains(&"LLAMA_ARG_N_PARALLEL=2: -np 2, each slot 4096 tokens".to_string()));
        assert!(!applied.auto_batch);
        assert_eq!(s.vars().len(), 6, "its own namespace only: {:?}", s.vars());
        // The user's context and batch sizes are kept.
        let mut w = Workload { n_batch: 512, ..workload() };
        s.apply(&mut w, "gemma3", true, &[]);
        assert_eq!((w.n_ctx, w.ctx_rule, w.n_batch), (4096, None, 512));
    }
}
