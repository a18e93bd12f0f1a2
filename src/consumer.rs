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

use crate::types::{FlashAttn, KvType};

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

    fn number(&self, key: &str) -> Option<u64> {
        self.var(key).and_then(|v| v.parse().ok())
    }

    /// Ollama's boolean: unset is `None`.
    fn flag(&self, key: &str) -> Option<bool> {
        self.var(key).map(|v| ollama_bool(&v))
    }
}

/// A boolean as Ollama reads one (`envconfig.BoolWithDefault`): false only
/// where Go's `strconv.ParseBool` says false, anything unparsable true.
#[must_use]
pub fn ollama_bool(v: &str) -> bool {
    !matches!(v.trim(), "0" | "f" | "F" | "false" | "FALSE" | "False")
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

/// The environment of a systemd unit from `systemctl show UNIT
/// --property=LoadState,Environment,EnvironmentFiles`: `Environment=`
/// (drop-ins merged by systemd) first, then each `EnvironmentFiles=` file,
/// whose assignments override it as systemd applies them. `read` reads a
/// file (`None`: unreadable, skipped as systemd does with a `-` path).
#[must_use]
pub fn parse_systemctl_show(unit: &str, text: &str, read: &dyn Fn(&Path) -> Option<String>) -> Option<ServerEnv> {
    let mut loaded = false;
    let mut vars = Vec::new();
    let mut files = Vec::new();
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else { continue };
        match k {
            "LoadState" => loaded = v.trim() == "loaded",
            "Environment" => {
                for word in shlex::split(v).unwrap_or_default() {
                    if let Some((key, value)) = word.split_once('=') {
                        vars.push((key.to_string(), value.to_string()));
                    }
                }
            }
            "EnvironmentFiles" => {
                if let Some(path) = v.split_whitespace().next() {
                    files.push(path.to_string());
                }
            }
            _ => {}
        }
    }
    if !loaded {
        return None;
    }
    let mut from = vec!["Environment=".to_string()];
    for f in &files {
        if let Some(parsed) = read(Path::new(f)).and_then(|t| parse_env_file(&t).ok()) {
            vars.extend(parsed);
            from.push(f.clone());
        }
    }
    Some(ServerEnv { source: format!("systemd unit {unit} ({})", from.join(", ")), found: true, vars })
}

/// The Ollama server's environment: `--ollama-env FILE`, else the
/// `ollama` systemd unit's, else none (said in words).
///
/// # Errors
/// `BadInput` for a file that cannot be read or is not KEY=VALUE lines.
pub fn ollama_env(file: Option<&Path>) -> anyhow::Result<ServerEnv> {
    if let Some(f) = file {
        return read_env_file(f, "--ollama-env");
    }
    let unit = "ollama.service";
    let shown = std::process::Command::new("systemctl")
        .args(["show", unit, "--property=LoadState", "--property=Environment", "--property=EnvironmentFiles"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    Ok(shown.and_then(|t| parse_systemctl_show(unit, &t, &read)).unwrap_or_else(|| ServerEnv {
        source:
            "none found: no --ollama-env and no ollama systemd unit; Ollama's defaults assumed (1 slot, f16 KV cache)"
                .into(),
        found: false,
        vars: Vec::new(),
    }))
}

/// Model families Ollama runs with one slot whatever `OLLAMA_NUM_PARALLEL`
/// says (server/sched.go).
const ONE_SLOT: [&str; 11] = [
    "mllama",
    "qwen3vl",
    "qwen3vlmoe",
    "qwen35",
    "qwen35moe",
    "qwen3next",
    "lfm2",
    "lfm2moe",
    "nemotron_h",
    "nemotron_h_moe",
    "nemotron_h_omni",
];

/// What the Ollama server will pass llama-server, from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OllamaRun {
    /// `OLLAMA_NUM_PARALLEL` (1 for the families Ollama keeps at one slot).
    pub parallel: u32,
    /// `OLLAMA_KV_CACHE_TYPE`, when one llama.cpp and ngl-tune know.
    pub kv_type: Option<KvType>,
    /// `OLLAMA_FLASH_ATTENTION` when set; unset, off where Ollama's device
    /// check refuses a card (see [`ollama_cuda_flash_attention`]), else
    /// None (Ollama passes auto).
    pub flash_attn: Option<FlashAttn>,
    /// What was read and what it does, a phrase each.
    pub applied: Vec<String>,
}

/// Ollama's automatic batch size for a context (server/sched.go,
/// `generationBatchForContext`): 2048 above 32768 tokens, 1024 above 4096,
/// else 512, passed as both `-b` and `-ub`, before [`ollama_batch_for`]
/// steps it down.
#[must_use]
pub fn ollama_batch(effective_ctx: u32) -> u32 {
    match effective_ctx {
        c if c > 32768 => 2048,
        c if c > 4096 => 1024,
        _ => 512,
    }
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// What Ollama adds to its memory prediction for a batch size
/// (`generationBatchSurcharge`).
fn batch_surcharge(batch: u32) -> u64 {
    match batch {
        b if b >= 2048 => 2 * GIB,
        b if b >= 1024 => 768 * MIB,
        _ => 0,
    }
}

/// Ollama's `generationBatchFits`: the prediction under 80% of the free
/// memory, under 60% (2048) or 75% (1024) of it, and the surcharge inside
/// what the 80% leaves.
fn batch_fits(batch: u32, predicted: u64, available: u64) -> bool {
    if predicted == 0 || available == 0 {
        return true;
    }
    let threshold = available * 80 / 100;
    let headroom = match batch {
        b if b >= 2048 => predicted <= available * 60 / 100,
        b if b >= 1024 => predicted <= available * 75 / 100,
        _ => true,
    };
    predicted <= threshold && headroom && batch_surcharge(batch) <= threshold - predicted
}

/// Ollama's batch for a context on its devices (`automaticGenerationBatch`):
/// on a CUDA device with flash attention off, 512 (256 above 4096 tokens on a
/// card of at most 8 GiB: `cuda_without_fa` gives that card's memory); else
/// the context's batch, stepped down to 1024 and 512 while the predicted
/// memory of the model (`predicted`, bytes) leaves too little of the free
/// memory (`available`).
#[must_use]
pub fn ollama_batch_for(effective_ctx: u32, predicted: u64, available: u64, cuda_without_fa: Option<u64>) -> u32 {
    if let Some(card) = cuda_without_fa {
        return if effective_ctx > 4096 && card > 0 && card <= 8 * GIB { 256 } else { 512 };
    }
    let mut batch = ollama_batch(effective_ctx);
    while batch > 512 && !batch_fits(batch, predicted, available) {
        batch = if batch > 1024 { 1024 } else { 512 };
    }
    batch
}

/// How llama-server's fit runs under Ollama with `num_gpu` unset: on
/// unless `LLAMA_ARG_FIT` (inherited from Ollama's environment) says off;
/// its margin `LLAMA_ARG_FIT_TARGET` where set there (MiB, the first of a
/// list; Ollama keeps an inherited one as it is), else
/// [`ollama_fit_margin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OllamaFit {
    pub on: bool,
    pub target_bytes: Option<u64>,
}

/// [`OllamaFit`] from Ollama's environment.
#[must_use]
pub fn ollama_fit(vars: &[(String, String)]) -> OllamaFit {
    // llama.cpp's is_falsey.
    let on = !var_in(vars, "LLAMA_ARG_FIT").is_some_and(|v| matches!(v.as_str(), "off" | "false" | "0" | "disabled"));
    let target_bytes = var_in(vars, "LLAMA_ARG_FIT_TARGET")
        .and_then(|v| v.split([',', '/']).next().and_then(|x| x.trim().parse::<u64>().ok()))
        .map(|mib| mib * MIB);
    OllamaFit { on, target_bytes }
}

/// The fit margin Ollama sets without `LLAMA_ARG_FIT_TARGET`: with a
/// projector, its memory plus 1 GiB in whole MiB (llm/llama_server.go,
/// `mmprojFitTargetMiB`), which replaces llama.cpp's 1 GiB; else 1 GiB.
#[must_use]
pub fn ollama_fit_margin(projector_bytes: Option<u64>) -> u64 {
    match projector_bytes {
        Some(b) if b > 0 => (b + GIB).div_ceil(MIB) * MIB,
        _ => GIB,
    }
}

/// Whether Ollama loads a projector of `bytes` (its tensors) on the GPU
/// with num_gpu unset: not where a GPU has less free memory than the
/// projector plus 1 GiB (llm/llama_server.go, `mmprojOffloadDisabled`:
/// "limited-vram", then `--no-mmproj-offload` and no fit-target pad).
#[must_use]
pub fn ollama_offloads_projector(bytes: u64, free_per_gpu: &[u64]) -> bool {
    !free_per_gpu.iter().any(|&free| free > 0 && free < bytes + GIB)
}

/// Whether Ollama's device check lets flash attention run on a CUDA card of
/// compute capability `major.minor` (ml/device.go,
/// `cudaFlashAttentionSupported`: 6.0 or newer, except 7.2; the driver
/// check there passes every driver a current llama.cpp runs on).
#[must_use]
pub fn ollama_cuda_flash_attention((major, minor): (u32, u32)) -> bool {
    major >= 6 && (major, minor) != (7, 2)
}

/// What the Ollama server's environment makes it run for a model of
/// architecture `arch`, on CUDA cards `cuda` (name and compute capability,
/// empty where llama.cpp offloads to none).
#[must_use]
pub fn ollama_run(env: &ServerEnv, arch: &str, cuda: &[(String, (u32, u32))]) -> OllamaRun {
    let mut applied = Vec::new();
    let asked = env.number("OLLAMA_NUM_PARALLEL").map_or(1, |n| u32::try_from(n.max(1)).unwrap_or(u32::MAX));
    let parallel = if asked > 1 && ONE_SLOT.contains(&arch) {
        applied.push(format!("OLLAMA_NUM_PARALLEL={asked} (Ollama runs {arch} with one slot)"));
        1
    } else {
        if asked > 1 {
            applied.push(format!("OLLAMA_NUM_PARALLEL={asked}: -np {asked}, the context times {asked}"));
        }
        asked
    };
    // Ollama lowercases it and passes it to llama-server as it is (llm/server.go).
    let kv_type = env.var("OLLAMA_KV_CACHE_TYPE").and_then(|v| KvType::from_name(&v.to_ascii_lowercase()));
    if let Some(raw) = env.var("OLLAMA_KV_CACHE_TYPE") {
        applied.push(match kv_type {
            Some(k) => format!("OLLAMA_KV_CACHE_TYPE={raw}: -ctk {0} -ctv {0}", k.as_str()),
            None => {
                format!("OLLAMA_KV_CACHE_TYPE={raw}: not a cache type llama-server takes (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1): its llama-server would not start; f16 assumed")
            }
        });
    }
    let mut flash_attn = env.flag("OLLAMA_FLASH_ATTENTION").map(|on| if on { FlashAttn::On } else { FlashAttn::Off });
    if let Some(fa) = flash_attn {
        applied.push(format!(
            "OLLAMA_FLASH_ATTENTION={}: -fa {}",
            env.var("OLLAMA_FLASH_ATTENTION").unwrap_or_default(),
            fa.as_str()
        ));
    } else if let Some((name, (major, minor))) = cuda.iter().find(|(_, cc)| !ollama_cuda_flash_attention(*cc)) {
        // llm/llama_server.go: unset, flash attention is off where any card fails the check.
        flash_attn = Some(FlashAttn::Off);
        applied.push(format!(
            "--flash-attn off: Ollama's device check refuses flash attention on {name} (CUDA compute {major}.{minor})"
        ));
    }
    for k in ["OLLAMA_CONTEXT_LENGTH", "OLLAMA_GPU_OVERHEAD", "OLLAMA_IGPU_ENABLE"] {
        if let Some(v) = env.var(k) {
            applied.push(format!("{k}={v}"));
        }
    }
    OllamaRun { parallel, kv_type, flash_attn, applied }
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

    #[test]
    fn a_systemd_unit_gives_environment_then_its_files_over_it() {
        let show = "LoadState=loaded\nEnvironment=OLLAMA_HOST=0.0.0.0 \"OLLAMA_NUM_PARALLEL=2\" OLLAMA_FLASH_ATTENTION=1\nEnvironmentFiles=/etc/ollama.env (ignore_errors=no)\nEnvironmentFiles=/gone.env (ignore_errors=yes)\n";
        let read = |p: &Path| (p == Path::new("/etc/ollama.env")).then(|| "OLLAMA_NUM_PARALLEL=4\n".to_string());
        let env = parse_systemctl_show("ollama.service", show, &read).unwrap();
        assert_eq!(env.var("OLLAMA_NUM_PARALLEL").as_deref(), Some("4"), "the file overrides Environment=");
        assert_eq!(env.var("OLLAMA_FLASH_ATTENTION").as_deref(), Some("1"));
        assert_eq!(env.source, "systemd unit ollama.service (Environment=, /etc/ollama.env)");
        assert!(parse_systemctl_show("ollama.service", "LoadState=not-found\nEnvironment=\n", &read).is_none());
    }

    #[test]
    fn ollama_runs_what_its_environment_says_as_it_reads_it() {
        let env = |pairs: &[(&str, &str)]| ServerEnv {
            source: "test".into(),
            found: true,
            vars: pairs.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect(),
        };
        let r = ollama_run(
            &env(&[
                ("OLLAMA_NUM_PARALLEL", " 4 "),
                ("OLLAMA_KV_CACHE_TYPE", "\"Q8_0\""),
                ("OLLAMA_FLASH_ATTENTION", "yes"),
            ]),
            "gemma3",
            &[],
        );
        assert_eq!((r.parallel, r.kv_type, r.flash_attn), (4, Some(KvType::Q8_0), Some(FlashAttn::On)));
        // Every type llama-server takes, lowercased as Ollama passes it; others would not start.
        for (raw, k) in [("q5_1", Some(KvType::Q5_1)), ("BF16", Some(KvType::Bf16)), ("iq4_nl", Some(KvType::Iq4Nl))] {
            assert_eq!(ollama_run(&env(&[("OLLAMA_KV_CACHE_TYPE", raw)]), "gemma3", &[]).kv_type, k, "{raw}");
        }
        let odd = ollama_run(&env(&[("OLLAMA_KV_CACHE_TYPE", "q6_k")]), "gemma3", &[]);
        assert_eq!(odd.kv_type, None);
        assert!(odd.applied[0].contains("not a cache type llama-server takes"), "{:?}", odd.applied);
        let one = ollama_run(&env(&[("OLLAMA_NUM_PARALLEL", "4")]), "qwen3vl", &[]);
        assert_eq!(one.parallel, 1);
        assert!(one.applied[0].contains("one slot"), "{:?}", one.applied);
        let bad = ollama_run(&env(&[("OLLAMA_NUM_PARALLEL", "four"), ("OLLAMA_FLASH_ATTENTION", "0")]), "gemma3", &[]);
        assert_eq!((bad.parallel, bad.flash_attn), (1, Some(FlashAttn::Off)), "an unparsable number is the default");
        // Unset, Ollama's device check decides: a Maxwell card (5.2) or a Jetson Xavier (7.2) turns it off.
        let cards = |cc: (u32, u32)| vec![("NVIDIA H200".to_string(), (9, 0)), ("old card".to_string(), cc)];
        assert_eq!(ollama_run(&env(&[]), "gemma3", &cards((8, 6))).flash_attn, None, "auto where all pass");
        for cc in [(5, 2), (7, 2)] {
            let off = ollama_run(&env(&[]), "gemma3", &cards(cc));
            assert_eq!(off.flash_attn, Some(FlashAttn::Off), "{cc:?}");
            assert!(off.applied[0].contains("device check refuses flash attention on old card"), "{:?}", off.applied);
        }
        let set = ollama_run(&env(&[("OLLAMA_FLASH_ATTENTION", "1")]), "gemma3", &cards((5, 2)));
        assert_eq!(set.flash_attn, Some(FlashAttn::On), "the user's setting overrides the check");
        assert!(!ollama_bool("False") && !ollama_bool(" F ") && ollama_bool("fAlSe"), "Go's ParseBool, else true");
        assert_eq!(
            [ollama_batch(4096), ollama_batch(8192), ollama_batch(32768), ollama_batch(65536)],
            [512, 1024, 1024, 2048]
        );
    }

    /// server/sched.go's step-down, case by case: headroom 60% for 2048,
    /// 75% for 1024, the surcharge inside 80%; CUDA without flash attention.
    #[test]
    fn ollamas_batch_steps_down_where_the_model_leaves_little_room() {
        let gib = 1u64 << 30;
        assert_eq!(ollama_batch_for(65536, 4 * gib, 24 * gib, None), 2048, "ample room");
        assert_eq!(ollama_batch_for(65536, 16 * gib, 24 * gib, None), 1024, "67% of free: over 60%, under 75%");
        assert_eq!(ollama_batch_for(65536, 19 * gib, 24 * gib, None), 512, "79%: over 75%");
        assert_eq!(ollama_batch_for(8192, 17 * gib, 24 * gib, None), 1024, "1024's surcharge fits: 19.2 - 17 > 0.75");
        assert_eq!(ollama_batch_for(8192, 18 * gib + gib / 2, 24 * gib, None), 512, "0.7 GiB left under 80%");
        assert_eq!(ollama_batch_for(4096, 30 * gib, 24 * gib, None), 512, "never below 512");
        assert_eq!(ollama_batch_for(65536, 0, 0, None), 2048, "nothing predicted: the context's");
        assert_eq!(ollama_batch_for(65536, gib, 24 * gib, Some(8 * gib)), 256, "CUDA, 8 GiB, no flash attention");
        assert_eq!(ollama_batch_for(4096, gib, 24 * gib, Some(8 * gib)), 512);
        assert_eq!(ollama_batch_for(65536, gib, 24 * gib, Some(24 * gib)), 512);
    }

    #[test]
    fn ollamas_fit_target_follows_its_environment_and_the_projector() {
        let v = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect()
        };
        let mib = 1u64 << 20;
        assert_eq!(ollama_fit(&v(&[])), OllamaFit { on: true, target_bytes: None });
        // The projector on the GPU only where every GPU has it plus 1 GiB free.
        assert!(ollama_offloads_projector(300 * mib, &[2048 * mib, 1325 * mib]));
        assert!(!ollama_offloads_projector(300 * mib, &[2048 * mib, 1323 * mib]));
        assert!(ollama_offloads_projector(300 * mib, &[]), "no GPU: nothing to decide");
        assert_eq!((ollama_fit_margin(None), ollama_fit_margin(Some(300 * mib + 1))), (1024 * mib, 1325 * mib));
        assert_eq!(ollama_fit(&v(&[("LLAMA_ARG_FIT_TARGET", "2048,512")])).target_bytes, Some(2048 * mib));
        assert!(!ollama_fit(&v(&[("LLAMA_ARG_FIT", "off")])).on);
        assert!(ollama_fit(&v(&[("LLAMA_ARG_FIT", "on")])).on);
    }
}
