//! The consumer's own settings, read where they live, so a tune measures
//! the run the user will really make: the Ollama server's environment (its
//! systemd unit and drop-ins, as `systemctl show` reports them, or an env
//! file given with `--ollama-env`) and llama-server's `LLAMA_ARG_*`
//! variables (`--server-env`).
//!
//! Ollama reads a variable with spaces and quotes trimmed
//! (`envconfig.Var`); a number that does not parse is its default; a
//! boolean that does not parse is true (`envconfig.BoolWithDefault`).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::placement::{FlashAttn, KvType, DEFAULT_N_BATCH, DEFAULT_N_UBATCH};
use crate::types::Hardware;

pub mod args;
pub mod llama_server;
pub mod ollama;

/// Environment variables and where they were read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerEnv {
    /// Where they come from, in words ("--ollama-env /etc/ollama.env",
    /// "systemd unit ollama.service (Environment=, /etc/ollama.env)"), or
    /// why nothing was read.
    pub source: String,
    /// Whether a source was found at all.
    pub found: bool,
    /// The variables read, in order (a later one overrides an earlier).
    pub vars: Vec<(String, String)>,
}

impl ServerEnv {
    /// A variable's value as Ollama reads it: the last assignment, spaces
    /// and quotes trimmed; `None` when unset or empty.
    #[must_use]
    pub fn var(&self, key: &str) -> Option<String> {
        var_in(&self.vars, key)
    }
}

/// A variable of `vars` as Ollama reads one (`envconfig.Var`): the last
/// assignment, spaces and quotes trimmed; `None` when unset or empty.
#[must_use]
pub fn var_in(vars: &[(String, String)], key: &str) -> Option<String> {
    let v = vars.iter().rev().find(|(k, _)| k == key)?.1.trim().trim_matches(['"', '\'']).to_string();
    (!v.is_empty()).then_some(v)
}

/// Reads KEY=VALUE lines as docker's `--env-file`, systemd's
/// `EnvironmentFile=` and a shell's `set -a; . FILE` share them: blank
/// lines and `#` comments skipped, an `export ` prefix allowed, a value in
/// double quotes unescaped (`\"`, `\\`, `` \` ``, `\$`), in single quotes
/// taken as is.
///
/// # Errors
/// The first line that is not an assignment, by number.
pub fn parse_env_file(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let line = line.strip_prefix("export ").map_or(line, str::trim_start);
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!("line {}: '{line}' is not KEY=VALUE", i + 1));
        };
        let key = key.trim();
        let valid = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("line {}: '{key}' is not a variable name", i + 1));
        }
        out.push((key.to_string(), unquote(value.trim())));
    }
    Ok(out)
}

fn unquote(v: &str) -> String {
    if v.len() >= 2 && v.starts_with('\'') && v.ends_with('\'') {
        return v[1..v.len() - 1].to_string();
    }
    if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
        let mut s = String::new();
        let mut chars = v[1..v.len() - 1].chars();
        while let Some(c) = chars.next() {
            match (c, chars.clone().next()) {
                ('\\', Some(n)) if "\"\\`$".contains(n) => {
                    s.push(n);
                    chars.next();
                }
                _ => s.push(c),
            }
        }
        return s;
    }
    v.to_string()
}

/// Reads an env file given on the command line.
///
/// # Errors
/// `BadInput` naming the file and the line.
pub fn read_env_file(path: &Path, flag: &str) -> anyhow::Result<ServerEnv> {
    // A FIFO or a device would wait for ever: a regular file only, of an env file's size.
    let bytes = crate::fsio::read_regular(path, 1 << 20, "give a file of KEY=VALUE lines")
        .map_err(|e| crate::error::bad(format!("{flag} {e:#}")))?;
    let text = String::from_utf8(bytes).map_err(|_| {
        crate::error::bad(format!("{flag} {}: not UTF-8 text; give a file of KEY=VALUE lines", path.display()))
    })?;
    let vars = parse_env_file(&text).map_err(|e| {
        crate::error::bad(format!("{flag} {}: {e}; write one KEY=VALUE a line, as docker's --env-file", path.display()))
    })?;
    Ok(ServerEnv { source: format!("{flag} {}", path.display()), found: true, vars })
}

/// The program that will run the model: its rules are the tune's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Program {
    /// The Ollama server (its environment; it starts llama-server).
    Ollama,
    /// llama-server started by the user (`LLAMA_ARG_*`).
    LlamaServer,
}

impl Program {
    /// Every program, in the order `--help` lists their flags.
    pub const ALL: [Program; 2] = [Program::Ollama, Program::LlamaServer];

    /// The flag that names its settings file (`args::ConsumerArgs` adds it
    /// to the tune's command line), its one-line help and the rest.
    #[must_use]
    pub fn flag(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Program::Ollama => (
                "ollama-env",
                "The Ollama server's environment: KEY=VALUE lines [default: the ollama systemd unit's]",
                "Tunes what that server will pass llama-server: OLLAMA_NUM_PARALLEL (-np P, each context \
                 times P), OLLAMA_KV_CACHE_TYPE, OLLAMA_FLASH_ATTENTION, OLLAMA_CONTEXT_LENGTH (the default \
                 context) and Ollama's batch size for the context. The docker --env-file form.",
            ),
            Program::LlamaServer => (
                "server-env",
                "llama-server's LLAMA_ARG_* settings to match: KEY=VALUE lines",
                "LLAMA_ARG_CTX_SIZE, LLAMA_ARG_N_PARALLEL, LLAMA_ARG_BATCH, LLAMA_ARG_UBATCH, \
                 LLAMA_ARG_CACHE_TYPE_K/V and LLAMA_ARG_FLASH_ATTN are measured as set; the rest is tuned.",
            ),
        }
    }

    /// Its settings, in the report's words.
    #[must_use]
    pub fn settings_words(self) -> &'static str {
        match self {
            Program::Ollama => "Ollama server settings",
            Program::LlamaServer => "llama-server settings",
        }
    }
}

/// The consumer whose settings file was given, read (`None`: Ollama, its
/// settings from its systemd unit).
///
/// # Errors
/// `BadInput` for a file that cannot be read or holds a setting its
/// program would refuse.
pub fn read(given: Option<(Program, &Path)>) -> anyhow::Result<Box<dyn Consumer>> {
    Ok(match given {
        Some((Program::LlamaServer, file)) => Box::new(llama_server::LlamaServer::read(file)?),
        Some((Program::Ollama, file)) => Box::new(ollama::Ollama::read(Some(file))?),
        None => Box::new(ollama::Ollama::read(None)?),
    })
}

/// The workload a tune measures, as far as a consumer's server decides it:
/// what [`Consumer::apply`] changes. A group of the tune's settings
/// (`profile::Settings::workload`), stored as plain fields of them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Workload {
    /// The context asked: the largest tuned with several (`contexts`).
    /// A tune's stages read the one they work at from their
    /// `tune::plan::ContextRun`, never from here.
    pub n_ctx: u32,
    /// Every context size tuned, ascending (`n_ctx` is the largest),
    /// where there are several; profiles from before the field: `n_ctx` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub contexts: Vec<u32>,
    /// Which rule chose the context when none was given, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctx_rule: Option<String>,
    /// Parallel slots (`-np`, Ollama's `OLLAMA_NUM_PARALLEL`): each context
    /// tuned is the whole one, split among them; the depth is one slot's.
    #[serde(default = "crate::types::one", skip_serializing_if = "crate::types::is_one")]
    pub n_parallel: u32,
    /// The KV cache type every trial runs with unless a hatch changes it:
    /// f16, or the one the consumer's server forces on every model
    /// (Ollama's `OLLAMA_KV_CACHE_TYPE`).
    #[serde(default, skip_serializing_if = "crate::types::is_f16")]
    pub kv_type: KvType,
    pub flash_attn: FlashAttn,
    /// The batch asked (`-b`, `-ub`, the consumer's); Ollama's own steps
    /// down per context (`ContextRun`, the recommendation's).
    pub n_batch: u32,
    pub n_ubatch: u32,
}

impl Workload {
    /// Each context becomes `n` slots of one slot's context (`-c ctx x n
    /// -np n`, as Ollama starts llama-server); slots set before are replaced.
    pub fn into_slots(&mut self, n: u32) {
        into_slots((&mut self.n_ctx, &mut self.contexts, &mut self.n_parallel), n);
    }

    /// Whether the batch sizes are llama.cpp's defaults (no `-b`/`-ub` given).
    #[must_use]
    pub fn default_batch(&self) -> bool {
        (self.n_batch, self.n_ubatch) == (DEFAULT_N_BATCH, DEFAULT_N_UBATCH)
    }
}

/// Makes each context (the one tuned, and every one of several) `n` slots
/// of one slot's context, where each is `n_parallel` slots now.
pub fn into_slots((n_ctx, contexts, n_parallel): (&mut u32, &mut [u32], &mut u32), n: u32) {
    let per = (*n_parallel).max(1);
    *n_ctx = *n_ctx / per * n;
    for c in contexts {
        *c = *c / per * n;
    }
    *n_parallel = n;
}

/// What a consumer's settings did to the workload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// What was read and what it made the tune measure, a phrase each.
    pub said: Vec<String>,
    /// The batch is the consumer's own choice for each context.
    pub auto_batch: bool,
}

/// A program that runs the model: its settings read where they live, laid
/// over the workload the tune measures, and the context it gives a model.
/// Adding one is a file here and an arm where the command line picks it.
pub trait Consumer {
    fn program(&self) -> Program;

    /// Its settings as read: where from, whether found, the variables of
    /// its own namespace (kept in the profile).
    fn env(&self) -> &ServerEnv;

    /// Its variables in the profile: those of its own namespace (not
    /// PATH, HOME, ...).
    fn vars(&self) -> Vec<(String, String)>;

    /// The context it gives a model trained for `ctx_train` tokens on this
    /// machine when none is set, and that rule in words.
    fn default_ctx(&self, hw: &Hardware, ctx_train: u64) -> (u32, String);

    /// Lays its settings over `w` (after the contexts were chosen; a
    /// context the user gave is kept: `user_ctx`). `arch`: the model's
    /// architecture; `cuda`: the CUDA cards llama.cpp offloads to, with
    /// their compute capability.
    fn apply(&self, w: &mut Workload, arch: &str, user_ctx: bool, cuda: &[(String, (u32, u32))]) -> Applied;
}

/// The variables of `env` whose names start with one of `prefixes`.
#[must_use]
pub fn namespaced(env: &ServerEnv, prefixes: &[&str]) -> Vec<(String, String)> {
    env.vars.iter().filter(|(k, _)| prefixes.iter().any(|p| k.starts_with(p))).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_files_read_as_docker_systemd_and_a_shell_agree() {
        let text = "# ollama\n\nOLLAMA_NUM_PARALLEL=4\nexport OLLAMA_CONTEXT_LENGTH=\"8192\"\nOLLAMA_KV_CACHE_TYPE='q8_0'\nLLAMA_ARG_OVERRIDE_TENSOR=\"a\\\\.b=CPU\"\n";
        let v = parse_env_file(text).unwrap();
        assert_eq!(
            v,
            [
                ("OLLAMA_NUM_PARALLEL".into(), "4".into()),
                ("OLLAMA_CONTEXT_LENGTH".into(), "8192".into()),
                ("OLLAMA_KV_CACHE_TYPE".into(), "q8_0".into()),
                ("LLAMA_ARG_OVERRIDE_TENSOR".into(), "a\\.b=CPU".into()),
            ]
        );
        assert!(parse_env_file("OLLAMA_NUM_PARALLEL 4").unwrap_err().starts_with("line 1:"));
        assert!(parse_env_file("\n1X=2").unwrap_err().contains("line 2: '1X' is not a variable name"));
    }

    /// The profile's words for the program (the schema's enum), both ways.
    #[test]
    fn a_program_is_stored_as_the_schema_names_it() {
        for (p, word) in [(Program::Ollama, "\"ollama\""), (Program::LlamaServer, "\"llama-server\"")] {
            assert_eq!(serde_json::to_string(&p).unwrap(), word);
            assert_eq!(serde_json::from_str::<Program>(word).unwrap(), p);
        }
        assert!(serde_json::from_str::<Program>("\"lm-studio\"").is_err(), "a program we do not know is refused");
    }
}
