//! The llama.cpp flags ngl-tune emits, read back: `bench --llama-args`
//! runs a recommendation's flags exactly as pasted, so what we tell
//! llama.cpp users is what was measured. Follows llama.cpp's own parser
//! (common/arg.cpp): `-ot` is a comma-separated list of `PATTERN=BUFFER`,
//! `-fa` takes on/off/auto, `-ctk`/`-ctv` a ggml type name.

use anyhow::Result;

use crate::error::bad;
use crate::placement::{cpu_ffn_layers, FlashAttn, KvType, OpOffload, Placement, SplitMode};

/// What a llama.cpp command line sets, of the flags ngl-tune emits: each
/// `None` (or empty) leaves the setting to whatever it is laid [`over`](LlamaArgs::over).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LlamaArgs {
    pub ngl: Option<u32>,
    pub threads: Option<u32>,
    pub ctx: Option<u32>,
    pub n_batch: Option<u32>,
    pub n_ubatch: Option<u32>,
    pub kv_type: Option<KvType>,
    pub flash_attn: Option<FlashAttn>,
    /// `-ot` patterns whose tensors stay in the CPU buffer type (`None`: no `-ot`).
    pub cpu_overrides: Option<Vec<String>>,
    pub n_cpu_moe: Option<u32>,
    pub op_offload: Option<OpOffload>,
    /// `--rpc` servers.
    pub rpc: Option<Vec<String>>,
    /// `--device`: the offload devices in the order they take layers.
    pub devices: Option<Vec<String>>,
    pub split_mode: Option<SplitMode>,
    /// `-ts` as whole layers per device.
    pub tensor_split: Option<Vec<u32>>,
    pub main_gpu: Option<u32>,
    /// `-np`: parallel sequences (llama-server's slots).
    pub n_parallel: Option<u32>,
    /// `-kvu` / `-no-kvu`: one KV cache shared by the slots.
    pub kv_unified: Option<bool>,
    /// `--mmproj`: the multimodal projector file.
    pub mmproj: Option<std::path::PathBuf>,
    /// `--mmproj-offload` / `--no-mmproj-offload`.
    pub mmproj_offload: Option<bool>,
    /// `-md`: a draft model (with `--spec-type draft-simple`).
    pub draft_model: Option<std::path::PathBuf>,
    /// `-ngld`: the draft's layers on the device (`auto` and `all`: every one, `Some(None)`).
    pub draft_ngl: Option<Option<u32>>,
    /// `--spec-draft-n-max`.
    pub draft_n_max: Option<u32>,
    /// `-ctkd` / `-ctvd`.
    pub draft_kv: Option<KvType>,
    /// `--spec-type`: draft-simple (with `-md`) or draft-mtp (the model's own heads), the two ngl-tune measures.
    pub spec_type: Option<String>,
}

/// The flags this reads.
pub const KNOWN: &str = "-ngl, -t, -c, -np, -kvu, -b, -ub, -ctk, -ctv, -fa, -ot, --n-cpu-moe, --no-op-offload, --rpc, --device, -sm, -ts, -mg, --mmproj, --no-mmproj-offload, -md, --spec-type draft-simple, --spec-type draft-mtp, -ngld, --spec-draft-n-max, -ctkd, -ctvd";

impl LlamaArgs {
    /// `base` with what this command line sets laid over it. An `-ot`
    /// pattern that keeps the dense FFN of the first K layers on the CPU
    /// is read back as those K layers.
    #[must_use]
    pub fn over(self, base: Placement) -> Placement {
        let mut p = base;
        let set = |v: &mut u32, o: Option<u32>| *v = o.unwrap_or(*v);
        set(&mut p.n_gpu_layers, self.ngl);
        set(&mut p.n_threads, self.threads);
        p.n_ctx = self.ctx.or(p.n_ctx);
        set(&mut p.n_batch, self.n_batch);
        set(&mut p.n_ubatch, self.n_ubatch);
        set(&mut p.n_cpu_moe, self.n_cpu_moe);
        set(&mut p.main_gpu, self.main_gpu);
        set(&mut p.n_parallel, self.n_parallel);
        p.kv_unified = self.kv_unified.unwrap_or(p.kv_unified);
        p.kv_type = self.kv_type.unwrap_or(p.kv_type);
        p.flash_attn = self.flash_attn.unwrap_or(p.flash_attn);
        p.op_offload = self.op_offload.unwrap_or(p.op_offload);
        p.split_mode = self.split_mode.unwrap_or(p.split_mode);
        if let Some(v) = self.rpc {
            p.rpc = v;
        }
        if let Some(v) = self.devices {
            p.devices = v;
        }
        if let Some(m) = self.mmproj {
            p.mmproj = Some(m);
        }
        p.mmproj_offload = self.mmproj_offload.unwrap_or(p.mmproj_offload);
        if let Some(v) = self.tensor_split {
            p.tensor_split = v;
        }
        if let Some(m) = self.draft_model {
            p.draft = Some(crate::placement::Draft::of(m));
        } else if self.spec_type.as_deref() == Some(crate::placement::MTP_TYPE) {
            p.draft = Some(crate::placement::Draft::mtp(crate::placement::DRAFT_N_MAX));
        }
        if let Some(d) = p.draft.as_mut() {
            d.n_gpu_layers = self.draft_ngl.unwrap_or(d.n_gpu_layers);
            set(&mut d.n_max, self.draft_n_max);
            d.kv_type = self.draft_kv.unwrap_or(d.kv_type);
        }
        if let Some(patterns) = self.cpu_overrides {
            p.n_cpu_ffn = 0;
            p.cpu_overrides.clear();
            for pat in patterns {
                match cpu_ffn_layers(&pat).filter(|_| p.n_cpu_ffn == 0) {
                    Some(k) => p.n_cpu_ffn = k,
                    None => p.cpu_overrides.push(pat),
                }
            }
        }
        p
    }
}

/// A command line's placement over llama.cpp's defaults: the inverse of
/// [`Placement::flags`].
///
/// # Errors
/// As [`parse`].
pub fn parse_placement(line: &str) -> Result<Placement, String> {
    Ok(parse(line)?.over(Placement::default()))
}

fn kv(flag: &str, v: &str) -> Result<KvType, String> {
    // As llama.cpp's kv_cache_type_from_str: the exact names of its cache types.
    KvType::from_name(v).ok_or_else(|| {
        let names: Vec<&str> = KvType::ALL.iter().map(|k| k.as_str()).collect();
        format!("{flag} {v}: llama.cpp's cache types are {}", names.join(", "))
    })
}

fn number(flag: &str, v: &str) -> Result<u32, String> {
    v.parse().map_err(|_| format!("{flag} '{v}' is not a whole number"))
}

/// Parses a shell-quoted llama.cpp command line (flags only).
///
/// # Errors
/// One line naming the flag or value that cannot be run and what can.
pub fn parse(line: &str) -> Result<LlamaArgs, String> {
    let words = shlex::split(line).ok_or_else(|| format!("'{line}' has an unclosed quote"))?;
    parse_words(&words)
}

/// llama-server's environment variables (`common/arg.cpp`'s `set_env`) for
/// the flags ngl-tune emits.
const ENV_FLAGS: [(&str, &str); 25] = [
    ("LLAMA_ARG_N_GPU_LAYERS", "-ngl"),
    ("LLAMA_ARG_THREADS", "-t"),
    ("LLAMA_ARG_CTX_SIZE", "-c"),
    ("LLAMA_ARG_N_PARALLEL", "-np"),
    ("LLAMA_ARG_KV_UNIFIED", "-kvu"),
    ("LLAMA_ARG_BATCH", "-b"),
    ("LLAMA_ARG_UBATCH", "-ub"),
    ("LLAMA_ARG_N_CPU_MOE", "--n-cpu-moe"),
    ("LLAMA_ARG_CACHE_TYPE_K", "-ctk"),
    ("LLAMA_ARG_CACHE_TYPE_V", "-ctv"),
    ("LLAMA_ARG_FLASH_ATTN", "-fa"),
    ("LLAMA_ARG_OVERRIDE_TENSOR", "-ot"),
    ("LLAMA_ARG_RPC", "--rpc"),
    ("LLAMA_ARG_DEVICE", "--device"),
    ("LLAMA_ARG_SPLIT_MODE", "-sm"),
    ("LLAMA_ARG_TENSOR_SPLIT", "-ts"),
    ("LLAMA_ARG_MAIN_GPU", "-mg"),
    ("LLAMA_ARG_MMPROJ", "--mmproj"),
    ("LLAMA_ARG_MMPROJ_OFFLOAD", "--mmproj-offload"),
    ("LLAMA_ARG_SPEC_DRAFT_MODEL", "-md"),
    ("LLAMA_ARG_SPEC_TYPE", "--spec-type"),
    ("LLAMA_ARG_N_GPU_LAYERS_DRAFT", "-ngld"),
    ("LLAMA_ARG_SPEC_DRAFT_N_MAX", "--spec-draft-n-max"),
    ("LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K", "-ctkd"),
    ("LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V", "-ctvd"),
];

/// What llama-server's `LLAMA_ARG_*` variables set, of the ones ngl-tune
/// emits (the last assignment of each counts; others, like the model, the
/// host or the port, are not placement and are left alone).
///
/// # Errors
/// As [`parse`], naming the variable.
pub fn from_env(vars: &[(String, String)]) -> Result<LlamaArgs, String> {
    let mut words = Vec::new();
    for (name, flag) in ENV_FLAGS {
        if let Some((_, v)) = vars.iter().rev().find(|(k, _)| k == name) {
            words.extend([flag.to_string(), v.clone()]);
        }
    }
    parse_words(&words).map_err(|e| {
        let flag = e.split_whitespace().next().unwrap_or_default().trim_matches('\'');
        match ENV_FLAGS.iter().find(|(_, f)| *f == flag) {
            Some((name, _)) => format!("{name}: {e}"),
            None => e,
        }
    })
}

/// `--device A,B`: names as llama.cpp's `--list-devices` gives them.
fn device_list(flag: &str, v: &str) -> Result<Vec<String>, String> {
    let names: Vec<String> = v.split(',').map(|d| d.trim().to_string()).collect();
    if names.iter().any(String::is_empty) {
        return Err(format!("{flag} needs device names like Vulkan0,RPC0 (llama.cpp --list-devices)"));
    }
    if names == ["none"] {
        return Err(format!("{flag} none: ngl-tune runs every layer on the CPU with -ngl 0"));
    }
    Ok(names)
}

/// `-ts a,b` (or `a/b`) as whole layers per device.
fn layer_split(flag: &str, v: &str) -> Result<Vec<u32>, String> {
    let split: Vec<u32> = v
        .split([',', '/'])
        .map(|p| {
            p.trim()
                .parse::<u32>()
                .map_err(|_| format!("{flag} '{p}': ngl-tune runs whole layers per device (like 20,21)"))
        })
        .collect::<Result<_, _>>()?;
    if split.len() > 15 {
        return Err(format!("{flag}: llama.cpp takes at most 15 proportions"));
    }
    Ok(split)
}

/// A switch given alone on a command line (on), or with its environment
/// variable's value as llama.cpp reads it (is_truthy / is_falsey).
fn switch(it: &mut std::slice::Iter<'_, String>) -> bool {
    let on = match it.clone().next().map(String::as_str) {
        Some("1" | "true" | "on" | "enabled") => Some(true),
        Some("0" | "false" | "off" | "disabled") => Some(false),
        _ => None,
    };
    if on.is_some() {
        it.next();
    }
    on.unwrap_or(true)
}

/// The flags that take no value (or a switch's): true where `flag` was one.
fn toggle(a: &mut LlamaArgs, flag: &str, it: &mut std::slice::Iter<'_, String>) -> bool {
    match flag {
        "--no-op-offload" => a.op_offload = Some(OpOffload::Off),
        "--op-offload" => a.op_offload = Some(OpOffload::On),
        "-kvu" | "--kv-unified" => a.kv_unified = Some(switch(it)),
        "-no-kvu" | "--no-kv-unified" => a.kv_unified = Some(false),
        "--no-mmproj-offload" => a.mmproj_offload = Some(false),
        _ => return false,
    }
    true
}

fn parse_words(words: &[String]) -> Result<LlamaArgs, String> {
    let mut a = LlamaArgs::default();
    let (mut k, mut v, mut dk, mut dv) = (None, None, None, None);
    let mut it = words.iter();
    while let Some(flag) = it.next() {
        if toggle(&mut a, flag, &mut it) {
            continue;
        }
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-ngl" | "--n-gpu-layers" | "--gpu-layers" => a.ngl = Some(number(flag, value()?)?),
            "-t" | "--threads" => a.threads = Some(number(flag, value()?)?),
            "-c" | "--ctx-size" => a.ctx = Some(number(flag, value()?)?),
            "-np" | "--parallel" => a.n_parallel = Some(number(flag, value()?)?).filter(|n| *n > 0),
            "-b" | "--batch-size" => a.n_batch = Some(number(flag, value()?)?),
            "-ub" | "--ubatch-size" => a.n_ubatch = Some(number(flag, value()?)?),
            "-ctk" | "--cache-type-k" => k = Some(kv(flag, value()?)?),
            "-ctv" | "--cache-type-v" => v = Some(kv(flag, value()?)?),
            "--n-cpu-moe" | "-ncmoe" => a.n_cpu_moe = Some(number(flag, value()?)?),
            "-fa" | "--flash-attn" => {
                a.flash_attn = Some(match value()?.as_str() {
                    "on" | "1" | "true" | "enabled" => FlashAttn::On,
                    "off" | "0" | "false" | "disabled" => FlashAttn::Off,
                    "auto" | "-1" => FlashAttn::Auto,
                    other => return Err(format!("{flag} '{other}': llama.cpp takes on, off or auto")),
                });
            }
            "-ot" | "--override-tensor" => {
                let list = a.cpu_overrides.get_or_insert_with(Vec::new);
                for o in value()?.split(',') {
                    let (pattern, buft) = o.split_once('=').ok_or_else(|| format!("{flag} '{o}' has no '=BUFFER'"))?;
                    if buft != "CPU" {
                        return Err(format!(
                            "{flag} '{o}': ngl-tune bench keeps overridden tensors on the CPU only (=CPU)"
                        ));
                    }
                    list.push(pattern.to_string());
                }
            }
            "--rpc" => {
                a.rpc = Some(crate::placement::args::parse_list(value()?).map_err(|e| e.to_string())?);
            }
            // common/arg.cpp's parse_device_list: names split at ','; "none" offloads nothing.
            "-dev" | "--device" => a.devices = Some(device_list(flag, value()?)?),
            // common/arg.cpp splits -ts at ',' or '/'; ngl-tune measures whole layers per device.
            "-ts" | "--tensor-split" => a.tensor_split = Some(layer_split(flag, value()?)?),
            "-sm" | "--split-mode" => {
                a.split_mode = Some(match value()?.as_str() {
                    "none" => SplitMode::None,
                    "layer" => SplitMode::Layer,
                    "row" => SplitMode::Row,
                    "tensor" => SplitMode::Tensor,
                    other => return Err(format!("{flag} {other}: llama.cpp takes none, layer, row or tensor")),
                });
            }
            "-mg" | "--main-gpu" => a.main_gpu = Some(number(flag, value()?)?),
            "-mm" | "--mmproj" => a.mmproj = Some(std::path::PathBuf::from(value()?)),
            "--mmproj-offload" => a.mmproj_offload = Some(switch(&mut it)),
            other if draft_word(&mut a, (&mut dk, &mut dv), other, &mut value)? => {}
            other => return Err(format!("'{other}' is not a flag ngl-tune bench runs; it runs {KNOWN}")),
        }
    }
    match (k, v) {
        (Some(k), Some(v)) if k != v => {
            return Err(format!("-ctk {} -ctv {}: ngl-tune measures one type for both caches", k.as_str(), v.as_str()))
        }
        (k, v) => a.kv_type = k.or(v),
    }
    draft_done(&mut a, dk, dv)?;
    Ok(a)
}

/// A draft model's flag (llama.cpp's speculative ones ngl-tune emits):
/// true where `flag` was one. `-ctkd` and `-ctvd` are kept apart until the end ([`draft_done`]).
fn draft_word<'w>(
    a: &mut LlamaArgs,
    (dk, dv): (&mut Option<KvType>, &mut Option<KvType>),
    flag: &str,
    value: &mut dyn FnMut() -> Result<&'w String, String>,
) -> Result<bool, String> {
    match flag {
        "-md" | "--spec-draft-model" | "--model-draft" => {
            a.draft_model = Some(std::path::PathBuf::from(value()?));
        }
        // common/arg.cpp: a number, or auto (-1) and all (-2), both every layer for a draft.
        "-ngld" | "--spec-draft-ngl" | "--gpu-layers-draft" | "--n-gpu-layers-draft" => {
            a.draft_ngl = Some(match value()?.as_str() {
                "auto" | "all" | "-1" | "-2" => None,
                v => Some(number(flag, v)?),
            });
        }
        "--spec-draft-n-max" => a.draft_n_max = Some(number(flag, value()?)?),
        "-ctkd" | "--spec-draft-type-k" | "--cache-type-k-draft" => *dk = Some(kv(flag, value()?)?),
        "-ctvd" | "--spec-draft-type-v" | "--cache-type-v-draft" => *dv = Some(kv(flag, value()?)?),
        "--spec-type" => {
            let v = value()?;
            if v != crate::placement::SPEC_TYPE && v != crate::placement::MTP_TYPE {
                return Err(format!(
                    "{flag} {v}: ngl-tune measures a draft model as {} and a model's own MTP heads as {} (EAGLE3, DFlash and n-gram types are not measured)",
                    crate::placement::SPEC_TYPE,
                    crate::placement::MTP_TYPE
                ));
            }
            a.spec_type = Some(v.clone());
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The draft's cache types (one for both) and a draft setting without `-md`.
fn draft_done(a: &mut LlamaArgs, dk: Option<KvType>, dv: Option<KvType>) -> Result<(), String> {
    match (dk, dv) {
        (Some(k), Some(v)) if k != v => {
            return Err(format!(
                "-ctkd {} -ctvd {}: ngl-tune measures one type for both draft caches",
                k.as_str(),
                v.as_str()
            ))
        }
        (k, v) => a.draft_kv = k.or(v),
    }
    let draft_set = a.draft_ngl.is_some() || a.draft_n_max.is_some() || a.draft_kv.is_some() || a.spec_type.is_some();
    let mtp = a.spec_type.as_deref() == Some(crate::placement::MTP_TYPE);
    match (&a.draft_model, &a.spec_type) {
        (Some(m), _) if mtp => Err(format!(
            "-md {} --spec-type draft-mtp: an MTP-only draft file is not measured; use --spec-type draft-simple for a draft model, or drop -md for the model's own MTP heads",
            m.display()
        )),
        // common_base_params_to_speculative applies -ngld to a draft model only.
        (None, _) if mtp && a.draft_ngl.is_some() => {
            Err("-ngld with --spec-type draft-mtp: the MTP heads are the model's own blocks, placed by -ngl; drop -ngld".into())
        }
        // The dry run prices the MTP context's cache as llama.cpp's default.
        (None, _) if mtp && a.draft_kv.is_some_and(|k| k != KvType::F16) => Err(
            "-ctkd/-ctvd with --spec-type draft-mtp: ngl-tune prices the MTP context's cache at llama.cpp's default, f16; drop them".into(),
        ),
        (None, _) if draft_set && !mtp => Err(
            "-ngld, --spec-draft-n-max, -ctkd, -ctvd and --spec-type set a draft model's placement: give it with -md (or --spec-type draft-mtp for the model's own MTP heads)".into(),
        ),
        // common/arg.cpp infers a type from the draft's file only for MTP and DFlash drafts.
        (Some(m), None) => Err(format!(
            "-md {}: llama.cpp starts no speculation from -md alone (it infers a type only for MTP and DFlash drafts); add --spec-type draft-simple",
            m.display()
        )),
        _ => Ok(()),
    }
}

/// Splits "host:port" as ggml-rpc does (at the first ':').
///
/// # Errors
/// Not `host:port` with a port number.
pub fn parse_endpoint(e: &str) -> Result<(String, u16)> {
    let fix = "write it as host:port, like 192.168.1.20:50052";
    let (host, port) = e.split_once(':').ok_or_else(|| bad(format!("--rpc '{e}' is not host:port; {fix}")))?;
    let port: u16 = port.parse().map_err(|_| bad(format!("--rpc '{e}' has no port number; {fix}")))?;
    if host.is_empty() || port == 0 {
        return Err(bad(format!("--rpc '{e}' needs a host and a port; {fix}")));
    }
    Ok((host.to_string(), port))
}

/// Parses `--rpc host:port,host:port`.
///
/// # Errors
/// An endpoint that is not `host:port`, or one named twice.
pub fn parse_list(s: &str) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for e in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        parse_endpoint(e)?;
        if out.iter().any(|o| o == e) {
            return Err(bad(format!("--rpc names {e} twice; give each server once")));
        }
        out.push(e.to_string());
    }
    if out.is_empty() {
        return Err(bad("--rpc is empty; give host:port of each llama.cpp RPC server, comma-separated"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_parsed_as_ggml_rpc_does() {
        assert_eq!(parse_endpoint("10.0.0.2:50052").unwrap(), ("10.0.0.2".into(), 50052));
        assert_eq!(parse_list("a:1, b:2").unwrap(), ["a:1", "b:2"]);
        for bad in ["host", "host:", ":50052", "host:port", "h:0", "h:70000"] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
        assert!(parse_list("a:1,a:1").is_err());
        assert!(parse_list(",").is_err());
    }

    #[test]
    fn reads_what_ngl_tune_emits() {
        let line = format!(
            "-ngl 19 -t 2 -c 32768 -ctk q8_0 -ctv q8_0 -fa on -ot '{}' --no-op-offload",
            crate::placement::cpu_ffn_override(3)
        );
        let p = parse_placement(&line).unwrap();
        assert_eq!((p.n_gpu_layers, p.n_threads, p.n_ctx), (19, 2, Some(32768)));
        assert_eq!((p.kv_type, p.flash_attn, p.op_offload), (KvType::Q8_0, FlashAttn::On, OpOffload::Off));
        assert_eq!((p.n_cpu_ffn, p.cpu_overrides.len()), (3, 0), "the FFN pattern reads back as its layers");
        assert_eq!(parse("--n-cpu-moe 4").unwrap().n_cpu_moe, Some(4));
        let split = parse_placement("--rpc 10.0.0.2:50052,10.0.0.3:50052 -ngl 41 -sm layer -ts 20/21 -mg 0").unwrap();
        assert_eq!(split.rpc, ["10.0.0.2:50052", "10.0.0.3:50052"]);
        assert_eq!((split.tensor_split, split.main_gpu, split.split_mode), (vec![20, 21], 0, SplitMode::Layer));
        let ordered = parse_placement("--rpc 10.0.0.2:50052 --device RPC0,Vulkan0 -ngl 41 -ts 0,41").unwrap();
        assert_eq!(
            (ordered.devices, ordered.tensor_split),
            (vec!["RPC0".to_string(), "Vulkan0".to_string()], vec![0, 41])
        );
        let other = parse_placement(r"-ngl 3 -t 1 -ot 'token_embd\.weight=CPU'").unwrap();
        assert_eq!((other.n_cpu_ffn, other.cpu_overrides), (0, vec![r"token_embd\.weight".to_string()]));
    }

    #[test]
    fn a_projector_kept_on_the_cpu_reads_back_from_its_flag_and_its_variable() {
        let p = Placement { mmproj: Some("mm.gguf".into()), mmproj_offload: false, ..Placement::default() };
        assert!(p.flags().ends_with("--mmproj mm.gguf --no-mmproj-offload"), "{}", p.flags());
        assert_eq!(parse_placement(&p.flags()).unwrap(), p);
        let env: Vec<(String, String)> = p.server_env().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        assert!(env.contains(&("LLAMA_ARG_MMPROJ_OFFLOAD".into(), "false".into())), "{env:?}");
        assert_eq!(from_env(&env).unwrap().over(Placement::default()), p);
        // The positive flag takes no value on a command line.
        let on = parse("--mmproj mm.gguf --mmproj-offload -ngl 3").unwrap();
        assert_eq!((on.mmproj_offload, on.ngl), (Some(true), Some(3)));
    }

    #[test]
    fn what_a_line_leaves_out_stays_as_laid() {
        let base = Placement::default().with_layers(10, 4, Some(4096)).with_kv(KvType::Q8_0);
        let p = parse("-ngl 20").unwrap().over(base.clone());
        assert_eq!(p, Placement { n_gpu_layers: 20, ..base });
    }

    fn placements() -> impl proptest::strategy::Strategy<Value = Placement> {
        use proptest::prelude::*;
        let kv = prop_oneof![Just(KvType::F16), Just(KvType::Q8_0), Just(KvType::Q4_0)];
        let fa = prop_oneof![Just(FlashAttn::Auto), Just(FlashAttn::On), Just(FlashAttn::Off)];
        let sm =
            prop_oneof![Just(SplitMode::Layer), Just(SplitMode::Row), Just(SplitMode::None), Just(SplitMode::Tensor)];
        let devices = prop_oneof![
            Just(Vec::new()),
            Just(vec!["RPC1".to_string(), "RPC0".to_string()]),
            Just(vec!["Vulkan0".to_string()]),
        ];
        let op = prop_oneof![Just(OpOffload::On), Just(OpOffload::Off)];
        let other = prop_oneof![
            Just(r"token_embd\.weight".to_string()),
            Just(r"output\.weight".to_string()),
            Just(r"blk\.3\.attn_q\.weight".to_string()),
            Just(r"blk\.(2|7)\.ffn_up\.weight".to_string()),
        ];
        let endpoint = (1u8..=254, 1024u16..=65535).prop_map(|(h, port)| format!("10.0.0.{h}:{port}"));
        (
            (0u32..200, 1u32..64, proptest::option::of(1u32..300_000), 1u32..8192, 1u32..4096),
            (kv, fa, 0u32..60, 0u32..60, proptest::collection::vec(other, 0..3)),
            (op, proptest::collection::vec(endpoint, 0..3), sm, proptest::collection::vec(0u32..99, 0..6), 0u32..4),
            (1u32..9, devices, proptest::bool::ANY),
            proptest::option::of(prop_oneof![
                Just("mmproj-F16.gguf".to_string()),
                Just("/models/My Model's/mmproj.gguf".to_string()),
            ]),
            proptest::bool::ANY,
            proptest::option::of((
                // None: the model's own MTP heads.
                prop_oneof![
                    Just(None),
                    Just(Some("draft-Q4_0.gguf".to_string())),
                    Just(Some("/models/a draft's/d.gguf".to_string()))
                ],
                proptest::option::of(0u32..99),
                1u32..16,
                prop_oneof![Just(KvType::F16), Just(KvType::Q8_0)],
            )),
        )
            .prop_map(|(a, b, c, (np, devices, kvu), mm, on_gpu, draft)| Placement {
                n_gpu_layers: a.0,
                n_threads: a.1,
                n_ctx: a.2,
                n_batch: a.3,
                n_ubatch: a.4,
                kv_type: b.0,
                flash_attn: b.1,
                n_cpu_moe: b.2,
                n_cpu_ffn: b.3,
                cpu_overrides: b.4,
                op_offload: c.0,
                rpc: c.1,
                split_mode: c.2,
                devices,
                tensor_split: c.3,
                main_gpu: c.4,
                n_parallel: np,
                kv_unified: kvu,
                mmproj_offload: on_gpu || mm.is_none(),
                mmproj: mm.map(std::path::PathBuf::from),
                draft: draft.map(|(m, n_gpu_layers, n_max, kv_type)| crate::placement::Draft {
                    n_gpu_layers: n_gpu_layers.filter(|_| m.is_some()),
                    kv_type: if m.is_some() { kv_type } else { KvType::F16 },
                    model: m.map(std::path::PathBuf::from),
                    n_max,
                }),
            })
    }

    #[test]
    fn a_draft_reads_back_from_its_flags_and_its_variables() {
        let draft =
            crate::placement::Draft { n_gpu_layers: Some(0), n_max: 8, ..crate::placement::Draft::of("d.gguf".into()) };
        let p = Placement { draft: Some(draft), ..Placement::default() };
        assert!(
            p.flags().ends_with("-md d.gguf --spec-type draft-simple -ngld 0 --spec-draft-n-max 8"),
            "{}",
            p.flags()
        );
        let env: Vec<(String, String)> = p.server_env().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        assert!(env.contains(&("LLAMA_ARG_SPEC_TYPE".into(), "draft-simple".into())), "{env:?}");
        assert_eq!(from_env(&env).unwrap().over(Placement::default()), p);
        // llama.cpp's auto and all are every layer, as no -ngld.
        let all = parse_placement("-ngl 9 -md d.gguf --spec-type draft-simple -ngld all").unwrap();
        assert_eq!(all.draft.unwrap().n_gpu_layers, None);
    }

    #[test]
    fn mtp_heads_read_back_from_their_flags_and_their_variables() {
        let p = Placement { draft: Some(crate::placement::Draft::mtp(2)), ..Placement::default() };
        assert!(p.flags().ends_with("--spec-type draft-mtp --spec-draft-n-max 2"), "{}", p.flags());
        assert!(!p.flags().contains("-md"), "{}", p.flags());
        let env: Vec<(String, String)> = p.server_env().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        assert!(env.contains(&("LLAMA_ARG_SPEC_TYPE".into(), "draft-mtp".into())), "{env:?}");
        assert!(!env.iter().any(|(k, _)| k == "LLAMA_ARG_SPEC_DRAFT_MODEL"), "{env:?}");
        assert_eq!(from_env(&env).unwrap().over(Placement::default()), p);
        assert_eq!(parse_placement(&p.flags()).unwrap(), p);
    }

    proptest::proptest! {
        #[test]
        fn parse_reads_back_every_placement_render_writes(p in placements()) {
            let flags = p.flags();
            let back = parse_placement(&flags).map_err(proptest::test_runner::TestCaseError::fail)?;
            proptest::prop_assert_eq!(back, p, "{}", flags);
        }
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        for (line, says) in [
            ("-ngl", "needs a value"),
            ("-ngl x", "not a whole number"),
            ("-ctk q8_0 -ctv f16", "one type for both"),
            ("-ctk q6_k", "llama.cpp's cache types are f32, f16, bf16"),
            ("-ot 'x=CUDA0'", "on the CPU only"),
            ("-ot x", "no '=BUFFER'"),
            ("-fa maybe", "on, off or auto"),
            ("--mlock", "not a flag"),
            ("-ts 0.5,0.5", "whole layers"),
            ("-ngld 3", "give it with -md"),
            ("--spec-type draft-simple", "give it with -md"),
            ("-md d.gguf -ngld 2", "add --spec-type draft-simple"),
            ("-md d.gguf --spec-type draft-mtp", "MTP-only draft file"),
            ("--spec-type draft-mtp -ngld 2", "drop -ngld"),
            ("--spec-type draft-mtp -ctkd q8_0 -ctvd q8_0", "f16"),
            ("--spec-type draft-eagle3", "not measured"),
            ("-md d.gguf --spec-type draft-simple -ctkd q8_0 -ctvd f16", "both draft caches"),
            ("-sm graph", "none, layer, row or tensor"),
            ("--device none", "-ngl 0"),
            ("--device Vulkan0,", "device names"),
            ("--rpc host", "host:port"),
            ("-ot 'x", "unclosed quote"),
        ] {
            let e = parse(line).unwrap_err();
            assert!(e.contains(says), "{line}: {e}");
        }
    }
}
