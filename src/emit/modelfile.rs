//! An Ollama Modelfile from a profile: a fresh one, or the owned PARAMETER
//! values of an existing one updated in place (the reader and the updater,
//! Ollama's rules, are `consumer::ollama::modelfile`).

use std::path::Path;

use anyhow::Result;

use crate::consumer::ollama::modelfile::WriteOutcome;
use crate::profile::Profile;

pub use crate::profile::MTP_OFF;

/// The owned parameters and their values from a profile, in Modelfile
/// order; `None`: the parameter is left unset (num_gpu where llama.cpp's
/// default placement is recommended), and an existing line of it removed.
#[must_use]
pub fn params(p: &Profile) -> Vec<(&'static str, Option<u32>)> {
    use crate::consumer::ollama::{num_batch, num_ctx, NumBatch};
    let r = &p.recommendation;
    let placement = r.runs();
    let mut v = vec![
        ("num_gpu", r.ollama_num_gpu_param()),
        ("num_thread", Some(r.placement.n_threads)),
        ("num_ctx", num_ctx(&placement)),
    ];
    if let NumBatch::Num(b) = num_batch(&placement) {
        v.push(("num_batch", Some(b)));
    }
    if let Some(n) = draft_num_predict(p) {
        v.push(("draft_num_predict", Some(n)));
    }
    v
}

/// `draft_num_predict` for a model with MTP heads (owned only then): the
/// answer's draft length where it drafts with them, else 0, which keeps
/// Ollama from loading them (`appendDraftArgs` passes nothing at 0), so
/// `num_gpu`, priced without them, holds whatever the Modelfile said
/// before. `None` for a model without heads: a user's own line is theirs.
#[must_use]
pub fn draft_num_predict(p: &Profile) -> Option<u32> {
    let with = crate::consumer::ollama::draft_num_predict(&p.recommendation.ollama_placement());
    (p.model.has_mtp() || with.is_some()).then_some(with.unwrap_or(0))
}

/// A complete Modelfile for the profile's model.
#[must_use]
pub fn render(p: &Profile) -> String {
    let mut s = format!(
        "# ngl-tune {} on {} (fingerprint {}), {}\nFROM {}\n",
        p.tool.version,
        p.machine_id,
        p.fingerprint,
        p.created_at,
        p.model.path.display()
    );
    if p.recommendation.confidence == crate::profile::Confidence::Low {
        s.push_str(
            "# confidence low: measured while other work was running on this machine; re-tune when it is idle\n",
        );
    }
    if p.recommendation.placement.n_cpu_moe > 0 {
        s.push_str(&format!(
            "# llama.cpp is faster with -ngl {n} --n-cpu-moe {k}; a Modelfile cannot say that, so num_gpu is the best whole-layer split. A set num_gpu also stops llama.cpp's fit, which moves experts to the CPU itself when num_gpu is unset.\n# To run the faster one under Ollama, server-wide (every model the server runs gets it): LLAMA_ARG_N_CPU_MOE={k} in the Ollama server's environment (its llama-server inherits it) and PARAMETER num_gpu {n} here\n",
            n = p.recommendation.placement.n_gpu_layers,
            k = p.recommendation.placement.n_cpu_moe
        ));
    }
    let r = &p.recommendation;
    if !r.placement.rpc.is_empty() {
        s.push_str(&format!(
            "# llama.cpp runs this fastest with its RPC servers ({}); Ollama cannot use them: num_gpu is the layers this machine's own devices hold in that split\n",
            r.placement.rpc.join(",")
        ));
    } else if !r.placement.tensor_split.is_empty() {
        s.push_str(&format!(
            "# llama.cpp splits the layers {} (-ts); Ollama takes no proportions per model, only num_gpu: it runs a model on the one GPU that holds it, else llama.cpp's split by free memory{}\n",
            crate::placement::split_list(&r.placement.tensor_split),
            split_gain(p)
        ));
    }
    if !r.ollama_server_env.is_empty() {
        s.push_str(&format!(
            "# set on the Ollama server, not here (they apply to every model it runs): {}\n",
            r.ollama_server_env.join(" ")
        ));
    }
    if r.placement.n_cpu_ffn > 0 {
        s.push_str(&format!(
            "# llama.cpp is faster with -ngl {n} and the FFN weights of {k} layers on the CPU (-ot); Ollama has no tensor overrides per model, so num_gpu is the best whole-layer split.\n# To run the faster one under Ollama, server-wide (every model the server runs gets it): LLAMA_ARG_OVERRIDE_TENSOR='{o}' in the Ollama server's environment (its llama-server inherits it) and PARAMETER num_gpu {n} here\n",
            n = r.placement.n_gpu_layers,
            k = r.placement.n_cpu_ffn,
            o = crate::placement::cpu_ffn_override(r.placement.n_cpu_ffn)
        ));
    }
    if let Some(line) = r.unset_num_gpu_line() {
        s.push_str(&format!("{line}\n"));
    }
    if draft_num_predict(p) == Some(0) {
        s.push_str(&format!("{MTP_OFF}\n"));
    }
    for (k, v) in params(p) {
        if let Some(v) = v {
            s.push_str(&format!("PARAMETER {k} {v}\n"));
        }
    }
    s
}

/// Creates or updates a Modelfile with the profile's values, atomically,
/// keeping the previous version as `PATH.bak` (see
/// [`crate::consumer::ollama::modelfile::write`]).
///
/// # Errors
/// As [`crate::consumer::ollama::modelfile::write`].
pub fn write(path: &Path, p: &Profile) -> Result<WriteOutcome> {
    crate::consumer::ollama::modelfile::write(path, &params(p), &|| render(p))
}

/// What the tuned split buys over a split by free memory (llama.cpp's
/// default, as Ollama splits): both measured at the recommendation's ngl,
/// where they were.
fn split_gain(p: &crate::profile::Profile) -> String {
    let r = &p.recommendation;
    let Some(split) = p.placements.iter().rev().find_map(|c| c.split.as_ref()) else { return String::new() };
    let by_memory = split
        .options
        .iter()
        .find(|o| o.tensor_split.is_empty() && o.placement.n_gpu_layers == r.placement.n_gpu_layers);
    match (r.tg_ts, by_memory.and_then(|o| o.tg_ts)) {
        (Some(mine), Some(theirs)) if theirs > 0.0 => format!(
            ": measured tg {mine:.2} t/s with this split against {theirs:.2} t/s split by free memory at ngl {} (x{:.2})",
            r.placement.n_gpu_layers,
            mine / theirs
        ),
        _ => String::new(),
    }
}
