//! The quality side of a hatch: a quantized KV cache, or another
//! quantization of the model, scored against its reference by the `__kl`
//! child (see [`crate::engine::quality`]).

use std::path::Path;

use crate::engine::quality::{kl_in_child, KlConfig, KlSpec};
use crate::model::ModelInfo;
use crate::profile::Settings;
use crate::types::KvType;
use crate::types::Quality;

/// Tokens the reference generates from each fixed prompt.
pub const KL_TOKENS: u32 = 128;

/// A quantized KV cache against f16, both at `ngl` layers on the GPU
/// (the settings' RPC devices among them: scored where the trials run, so a
/// slow host does not read the text twice at its own speed).
/// `None` when it could not be measured (the reason goes to stderr: the
/// hatch is then not recommended).
///
/// # Errors
/// Only an interrupt.
pub fn kv_quality(
    exe: &Path,
    info: &ModelInfo,
    kv: KvType,
    ngl: u32,
    s: &Settings,
    op_offload: bool,
) -> anyhow::Result<Option<Quality>> {
    let config = |kv_type| KlConfig { model: info.path.clone(), kv_type, n_gpu_layers: ngl, op_offload };
    let spec = KlSpec {
        reference: config(KvType::F16),
        alternatives: vec![config(kv)],
        n_gen: KL_TOKENS,
        n_threads: s.n_threads,
        depth: s.depth_at(s.n_ctx),
        rpc: if ngl > 0 { s.rpc.clone() } else { Vec::new() },
    };
    Ok(score(exe, &spec)?.into_iter().next().flatten())
}

/// Scores every alternative of `spec`; `None` for one that could not be
/// scored, with the reason on stderr.
///
/// # Errors
/// Only an interrupt (the tuning stops; its finished trials are kept).
pub fn score(exe: &Path, spec: &KlSpec) -> anyhow::Result<Vec<Option<Quality>>> {
    if !spec.rpc.is_empty() {
        // A server serves one client at a time: the kept trial worker lets go first.
        crate::engine::live::release();
    }
    Ok(match kl_in_child(exe, spec) {
        Ok(out) => {
            if let Some(e) = &out.error {
                eprintln!("warning: quality not measured: {e}");
                return Ok(vec![None; spec.alternatives.len()]);
            }
            out.scores
                .into_iter()
                .map(|s| {
                    if let Some(e) = &s.error {
                        eprintln!("warning: quality not measured: {e}");
                    }
                    s.quality
                })
                .collect()
        }
        Err(e) if e.is::<crate::error::Interrupted>() => return Err(e),
        Err(e) => {
            eprintln!("warning: quality not measured: {e:#}");
            vec![None; spec.alternatives.len()]
        }
    })
}
