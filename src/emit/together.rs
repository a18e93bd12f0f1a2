//! The forms that keep a set of models loaded together: the Ollama
//! server's settings (server/sched.go) and a llama-swap group (its
//! proxy/config/config.go: `models.<id>.cmd`, `groups.<id>` with
//! `swap: false` so its members run side by side).

use crate::model::human_bytes;
use crate::profile::{MemoryPolicy, SetMember};

/// Models Ollama keeps loaded a GPU where `OLLAMA_MAX_LOADED_MODELS` is
/// unset (server/sched.go: `defaultModelsPerGPU`).
const DEFAULT_MAX_LOADED: usize = 3;

/// The Ollama server's settings for the set, and what its scheduler does
/// with it. `envs`: each member's own server settings (KV type, flash
/// attention, slots), server-wide in Ollama. `process_bytes`: what each
/// of Ollama's llama-server processes holds beyond the members' measured
/// bytes (its CUDA context where the trials ran through another backend).
#[must_use]
pub fn ollama(
    members: &[SetMember],
    envs: &[Vec<String>],
    memory: &MemoryPolicy,
    process_bytes: u64,
) -> (Vec<String>, String) {
    let mut env: Vec<String> = Vec::new();
    for e in envs.iter().flatten() {
        if !env.contains(e) {
            env.push(e.clone());
        }
    }
    // envconfig.KeepAlive: 5 minutes unless set; a negative one is forever.
    // An idle member unloaded would load again at the next request, placed
    // by whatever else is loaded then.
    env.push("OLLAMA_KEEP_ALIVE=-1".into());
    // envconfig.MaxRunners: 0 (unset) means 3 a GPU in server/sched.go;
    // a smaller set needs no setting, and a lower one would cap others.
    let loaded = if members.len() > DEFAULT_MAX_LOADED {
        env.push(format!("OLLAMA_MAX_LOADED_MODELS={}", members.len()));
        format!("with OLLAMA_MAX_LOADED_MODELS={}", members.len())
    } else {
        format!("under its default of {DEFAULT_MAX_LOADED} a GPU (OLLAMA_MAX_LOADED_MODELS unset)")
    };
    // server/sched.go explicitPartialGPUOffload: num_gpu below every layer
    // loads as placed; the pre-flight check is for the others.
    let full: Vec<&SetMember> = members.iter().filter(|m| m.placement.n_gpu_layers >= m.n_layer_full).collect();
    let mut note = format!(
        "Ollama keeps the {} models loaded at once {loaded}, and never unloads them idle with OLLAMA_KEEP_ALIVE=-1 (its default: after 5 minutes); each Modelfile sets num_gpu, so a model below every layer loads as placed, without the scheduler's check",
        members.len(),
    );
    let free = memory.device_total_bytes.map(|t| t.saturating_sub(memory.baseline_bytes));
    let held = |m: &SetMember| m.device_bytes.map(|b| b + process_bytes);
    let set: u64 = members.iter().filter_map(held).sum();
    let share = if process_bytes > 0 {
        format!(", with {} for each of Ollama's CUDA processes", human_bytes(process_bytes))
    } else {
        String::new()
    };
    note.push_str(&format!(
        "; the set takes {} on the device{}{share}",
        human_bytes(set),
        free.map_or_else(String::new, |f| format!(" of {} free", human_bytes(f)))
    ));
    // server/sched.go: a model fully on the GPU loads beside loaded ones only
    // where predictedForLoad (PredictServerVRAM plus the batch's surcharge)
    // is at most 80% of the free memory they leave; else it evicts them.
    if let (Some(free), [one]) = (free, full.as_slice()) {
        let others: u64 = members.iter().filter(|m| !std::ptr::eq(*m, *one)).filter_map(held).sum();
        let left = free.saturating_sub(others) * 8 / 10;
        let predicted = one.ollama_predicted_bytes.or(one.device_bytes).unwrap_or(0);
        let verdict = if predicted <= left {
            "it loads beside them in any order".to_string()
        } else {
            format!(
                "over it, Ollama would evict them: load {} first, and the check does not apply",
                one.model.file_name
            )
        };
        note.push_str(&format!(
            "; a model fully on the GPU loads beside loaded ones only where Ollama's prediction for it (its file and an f16 cache at its context, plus the batch's surcharge) is at most 80% of the free memory they leave (server/sched.go): {} against {} here, so {verdict}",
            human_bytes(predicted),
            human_bytes(left),
        ));
    } else if full.len() > 1 {
        note.push_str("; a model fully on the GPU loads beside loaded ones only where Ollama's prediction for it (its file and an f16 cache at its context, plus the batch's surcharge) is at most 80% of the free memory they leave (server/sched.go): load the largest first");
    }
    (env, note)
}

/// llama-swap's name for each member: its file's stem, made unique.
fn ids(members: &[SetMember]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for m in members {
        let stem: String = m
            .model
            .file_name
            .trim_end_matches(".gguf")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' })
            .collect();
        let mut id = stem.clone();
        let mut k = 2;
        while out.contains(&id) {
            id = format!("{stem}-{k}");
            k += 1;
        }
        out.push(id);
    }
    out
}

/// `-m MODEL FLAGS`: a member's llama-server command line.
#[must_use]
pub fn command(m: &SetMember) -> String {
    format!("-m {} {}", crate::placement::shell_quote(&m.model.path.to_string_lossy()), m.llama_cpp_args())
}

/// A llama-swap config: each member's llama-server command, and one group
/// that runs them together (`swap: false`).
#[must_use]
pub fn llama_swap(members: &[SetMember]) -> String {
    let ids = ids(members);
    let mut y = String::from(
        "# llama-swap config: the group runs its members side by side (swap: false), each as ngl-tune measured it\nmodels:\n",
    );
    for (id, m) in ids.iter().zip(members) {
        y.push_str(&format!("  \"{id}\":\n    cmd: |\n      llama-server --port ${{PORT}} {}\n", command(m)));
    }
    y.push_str("groups:\n  \"ngl-tune\":\n    swap: false\n    exclusive: true\n    members:\n");
    for id in &ids {
        y.push_str(&format!("      - \"{id}\"\n"));
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, ngl: u32, full: u32, bytes: u64) -> SetMember {
        let model: crate::profile::ModelIdentity = serde_json::from_value(serde_json::json!({
            "file_name": name, "path": format!("/m/{name}"), "file_size": 1, "sha256_16m": "0".repeat(64), "mtime": 0,
            "architecture": "llama", "n_layer": full - 1, "n_layer_full": full, "quantization": "Q4_0", "n_params": 1, "n_expert": 0
        }))
        .unwrap();
        SetMember {
            model,
            weight: 0.5,
            placement: crate::placement::Placement::default().with_layers(ngl, 2, Some(4096)),
            n_layer_full: full,
            tg_ts: Some(10.0),
            device_bytes: Some(bytes),
            ollama_predicted_bytes: Some(bytes + (bytes >> 1)),
            why: String::new(),
            modelfile: Vec::new(),
        }
    }

    #[test]
    fn the_swap_group_runs_every_member_and_ollama_keeps_them_loaded() {
        let m = [member("a b.gguf", 31, 31, 1 << 30), member("big.gguf", 9, 41, 3 << 30), member("big.gguf", 0, 41, 0)];
        let y = llama_swap(&m);
        // Unique ids, each member's command with llama-swap's port macro, one group side by side.
        for line in ["  \"a-b\":", "  \"big\":", "  \"big-2\":", "    swap: false", "      - \"big-2\""] {
            assert!(y.lines().any(|l| l == line), "{line} in\n{y}");
        }
        assert!(y.contains("llama-server --port ${PORT} -m '/m/a b.gguf' -ngl 31 -t 2 -c 4096"), "{y}");
        let memory = MemoryPolicy { device_total_bytes: Some(8 << 30), ..MemoryPolicy::no_gpu() };
        let (env, note) = ollama(
            &m,
            &[vec!["OLLAMA_KV_CACHE_TYPE=q8_0".into()], vec!["OLLAMA_KV_CACHE_TYPE=q8_0".into()], vec![]],
            &memory,
            0,
        );
        // Idle members never unloaded; three is Ollama's own default a GPU, not lowered.
        assert_eq!(env, ["OLLAMA_KV_CACHE_TYPE=q8_0", "OLLAMA_KEEP_ALIVE=-1"]);
        assert!(note.contains("under its default of 3 a GPU"), "{note}");
        let four = [&m[..], &m[..1]].concat();
        let (env, _) = ollama(&four, &[], &memory, 0);
        assert_eq!(env, ["OLLAMA_KEEP_ALIVE=-1", "OLLAMA_MAX_LOADED_MODELS=4"]);
        // The one member fully on the GPU is checked as Ollama checks it: its
        // prediction (1.5 GiB), not llama.cpp's 1 GiB, against 80% of the 5 GiB the others leave.
        assert!(note.contains("1.50 GiB against 4.00 GiB here, so it loads beside them"), "{note}");
        assert!(note.contains("the set takes 4.00 GiB on the device of 8.00 GiB free"), "{note}");
        // Each of Ollama's CUDA processes holds its context: 3 x 612 MiB more, and 80% of (8 - 3 - 2 x 0.6) GiB left.
        let (_, note) = ollama(&m, &[], &memory, 612 << 20);
        assert!(
            note.contains("the set takes 5.79 GiB on the device of 8.00 GiB free, with 612.00 MiB for each"),
            "{note}"
        );
        assert!(note.contains("1.50 GiB against 3.04 GiB here"), "{note}");
        // A prediction over what the others leave: load it first.
        let tight = MemoryPolicy { device_total_bytes: Some(5 << 30), ..MemoryPolicy::no_gpu() };
        let (_, note) = ollama(&m, &[], &tight, 0);
        assert!(note.contains("1.50 GiB against 1.60 GiB"), "{note}");
        let tighter = MemoryPolicy { device_total_bytes: Some((4 << 30) + (1 << 29)), ..MemoryPolicy::no_gpu() };
        let (_, note) = ollama(&m, &[], &tighter, 0);
        assert!(
            note.contains("1.50 GiB against 1.20 GiB here, so over it, Ollama would evict them: load a b.gguf first"),
            "{note}"
        );
    }
}
