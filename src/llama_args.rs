//! The llama.cpp flags ngl-tune emits, read back: `bench --llama-args`
//! runs a recommendation's flags exactly as pasted, so what we tell
//! llama.cpp users is what was measured. Follows llama.cpp's own parser
//! (common/arg.cpp): `-ot` is a comma-separated list of `PATTERN=BUFFER`,
//! `-fa` takes on/off/auto, `-ctk`/`-ctv` a ggml type name.

use crate::types::KvType;

/// What a llama.cpp command line sets, of the flags ngl-tune emits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LlamaArgs {
    pub ngl: Option<u32>,
    pub threads: Option<u32>,
    pub ctx: Option<u32>,
    pub kv_type: Option<KvType>,
    /// llama-bench's values: -1 auto, 0 off, 1 on.
    pub flash_attn: Option<i8>,
    /// `-ot` patterns whose tensors stay in the CPU buffer type.
    pub cpu_overrides: Vec<String>,
    pub n_cpu_moe: Option<u32>,
    pub no_op_offload: bool,
    /// `--rpc` servers.
    pub rpc: Vec<String>,
    /// `-ts` as whole layers per device.
    pub tensor_split: Vec<u32>,
    pub main_gpu: Option<u32>,
}

/// The flags this reads.
pub const KNOWN: &str = "-ngl, -t, -c, -ctk, -ctv, -fa, -ot, --n-cpu-moe, --no-op-offload, --rpc, -ts, -sm layer, -mg";

fn kv(flag: &str, v: &str) -> Result<KvType, String> {
    match v {
        "f16" => Ok(KvType::F16),
        "q8_0" => Ok(KvType::Q8_0),
        "q4_0" => Ok(KvType::Q4_0),
        _ => Err(format!("{flag} {v}: ngl-tune runs the KV cache types f16, q8_0 and q4_0")),
    }
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
    let mut a = LlamaArgs::default();
    let (mut k, mut v) = (None, None);
    let mut it = words.iter();
    while let Some(flag) = it.next() {
        if flag == "--no-op-offload" {
            a.no_op_offload = true;
            continue;
        }
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "-ngl" | "--n-gpu-layers" | "--gpu-layers" => a.ngl = Some(number(flag, value()?)?),
            "-t" | "--threads" => a.threads = Some(number(flag, value()?)?),
            "-c" | "--ctx-size" => a.ctx = Some(number(flag, value()?)?),
            "-ctk" | "--cache-type-k" => k = Some(kv(flag, value()?)?),
            "-ctv" | "--cache-type-v" => v = Some(kv(flag, value()?)?),
            "--n-cpu-moe" | "-ncmoe" => a.n_cpu_moe = Some(number(flag, value()?)?),
            "-fa" | "--flash-attn" => {
                a.flash_attn = Some(match value()?.as_str() {
                    "on" | "1" | "true" | "enabled" => 1,
                    "off" | "0" | "false" | "disabled" => 0,
                    "auto" | "-1" => -1,
                    other => return Err(format!("{flag} '{other}': llama.cpp takes on, off or auto")),
                });
            }
            "-ot" | "--override-tensor" => {
                for o in value()?.split(',') {
                    let (pattern, buft) = o.split_once('=').ok_or_else(|| format!("{flag} '{o}' has no '=BUFFER'"))?;
                    if buft != "CPU" {
                        return Err(format!(
                            "{flag} '{o}': ngl-tune bench keeps overridden tensors on the CPU only (=CPU)"
                        ));
                    }
                    a.cpu_overrides.push(pattern.to_string());
                }
            }
            "--rpc" => {
                a.rpc = crate::rpc::parse_list(value()?).map_err(|e| e.to_string())?;
            }
            // common/arg.cpp splits -ts at ',' or '/'; ngl-tune measures whole layers per device.
            "-ts" | "--tensor-split" => {
                a.tensor_split = value()?
                    .split([',', '/'])
                    .map(|p| {
                        p.trim()
                            .parse::<u32>()
                            .map_err(|_| format!("{flag} '{p}': ngl-tune runs whole layers per device (like 20,21)"))
                    })
                    .collect::<Result<_, _>>()?;
                if a.tensor_split.len() > 15 {
                    return Err(format!("{flag}: llama.cpp takes at most 15 proportions"));
                }
            }
            "-sm" | "--split-mode" => match value()?.as_str() {
                "layer" => {}
                other => return Err(format!("{flag} {other}: ngl-tune measures split mode layer only")),
            },
            "-mg" | "--main-gpu" => a.main_gpu = Some(number(flag, value()?)?),
            other => return Err(format!("'{other}' is not a flag ngl-tune bench runs; it runs {KNOWN}")),
        }
    }
    match (k, v) {
        (Some(k), Some(v)) if k != v => {
            return Err(format!("-ctk {} -ctv {}: ngl-tune measures one type for both caches", k.as_str(), v.as_str()))
        }
        (k, v) => a.kv_type = k.or(v),
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_ngl_tune_emits() {
        let line = format!(
            "-ngl 19 -t 2 -c 32768 -ctk q8_0 -ctv q8_0 -fa on -ot '{}' --no-op-offload",
            crate::engine::cpu_ffn_override(3)
        );
        let a = parse(&line).unwrap();
        assert_eq!((a.ngl, a.threads, a.ctx), (Some(19), Some(2), Some(32768)));
        assert_eq!((a.kv_type, a.flash_attn, a.no_op_offload), (Some(KvType::Q8_0), Some(1), true));
        assert_eq!(a.cpu_overrides, [r"blk\.(0|1|2)\.ffn_(up|down|gate)\.weight"]);
        assert_eq!(parse("--n-cpu-moe 4").unwrap().n_cpu_moe, Some(4));
        let split = parse("--rpc 10.0.0.2:50052,10.0.0.3:50052 -ngl 41 -sm layer -ts 20/21 -mg 0").unwrap();
        assert_eq!(split.rpc, ["10.0.0.2:50052", "10.0.0.3:50052"]);
        assert_eq!((split.tensor_split, split.main_gpu), (vec![20, 21], Some(0)));
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        for (line, says) in [
            ("-ngl", "needs a value"),
            ("-ngl x", "not a whole number"),
            ("-ctk q8_0 -ctv f16", "one type for both"),
            ("-ctk iq4_nl", "f16, q8_0 and q4_0"),
            ("-ot 'x=CUDA0'", "on the CPU only"),
            ("-ot x", "no '=BUFFER'"),
            ("-fa maybe", "on, off or auto"),
            ("--mlock", "not a flag"),
            ("-ts 0.5,0.5", "whole layers"),
            ("-sm row", "split mode layer only"),
            ("--rpc host", "host:port"),
            ("-ot 'x", "unclosed quote"),
        ] {
            let e = parse(line).unwrap_err();
            assert!(e.contains(says), "{line}: {e}");
        }
    }
}
