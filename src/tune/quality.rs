//! The quality side of a hatch: a quantized KV cache, or another
//! quantization of the model, scored against its reference by the `__kl`
//! child (see [`crate::engine::quality`]).

use crate::engine::quality::{kl_in_child, KlConfig, KlSpec};
use crate::engine::runner::Runner;
use crate::model::ModelInfo;
use crate::placement::KvType;
use crate::profile::Settings;
use crate::types::Quality;

/// Tokens the reference generates from each fixed prompt.
pub const KL_TOKENS: u32 = 128;

/// What a quality check may cost at least, in seconds: below this it is
/// never shortened.
pub const KL_MIN_BOUND_S: f64 = 60.0;

/// What the check may cost before it reads less than the tuned depth: the
/// trials' wall time so far, at least [`KL_MIN_BOUND_S`].
#[must_use]
pub fn bound_s(trials: &[crate::profile::ProfileTrial]) -> f64 {
    (trials.iter().map(|t| t.result.wall_ms).sum::<f64>() / 1e3).max(KL_MIN_BOUND_S)
}

/// Speeds (pp, tg in t/s) measured at whole-layer setting `ngl` by the
/// search, where it ran (the fastest such trial).
#[must_use]
pub fn speeds_at(trials: &[crate::profile::ProfileTrial], ngl: u32) -> Option<(f64, f64)> {
    trials
        .iter()
        .filter(|t| t.is_search() && t.result.spec.placement.n_gpu_layers == ngl)
        .filter(|t| t.result.status == crate::types::TrialStatus::Ok)
        .filter_map(|t| Some((t.result.test(true)?.avg_ts, t.result.test(false)?.avg_ts)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// How long a KV cache check reading `depth` tokens of text takes at
/// speeds `(pp, tg)`: the reference reads the text and generates
/// `2 KL_TOKENS` tokens one by one, scores them in one batch (its read kept,
/// see `engine::quality`), then the alternative reads the text and scores
/// the same tokens. At depth 0, two fixed prompts, `KL_TOKENS` each.
#[must_use]
pub fn kl_seconds(depth: u32, (pp, tg): (f64, f64)) -> f64 {
    let (gen, prompts) = if depth > 0 { (2 * KL_TOKENS, 1) } else { (KL_TOKENS, 2) };
    let read = f64::from(depth) * 2.0 + f64::from(prompts * 2 * (gen + 1));
    read / pp.max(1e-9) + f64::from(prompts * gen) / tg.max(1e-9)
}

/// The depth the check reads: the tuned `depth`, or less where reading all
/// of it at the measured `speed` would take more than `bound_s` (the trials'
/// own time, at least [`KL_MIN_BOUND_S`]), never under a quarter of it or
/// 256 tokens. On a GPU this never binds (a 16k read at 1000 t/s is 33 s);
/// on a slow host the check would otherwise cost more than the search.
#[must_use]
pub fn kl_depth(depth: u32, speed: Option<(f64, f64)>, bound_s: f64) -> u32 {
    let Some((pp, tg)) = speed else { return depth };
    if depth == 0 || kl_seconds(depth, (pp, tg)) <= bound_s {
        return depth;
    }
    // kl_seconds(d) = (2 d + 2 (g + 1)) / pp + g / tg, g = 2 KL_TOKENS: solved for d.
    let g = f64::from(2 * KL_TOKENS);
    let d = ((bound_s - g / tg.max(1e-9)) * pp - 2.0 * (g + 1.0)) / 2.0;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let fits = d.max(0.0) as u32;
    fits.max(depth / 4).max(256.min(depth)).min(depth)
}

/// A quantized KV cache against f16, both at `ngl` layers on the GPU
/// (the settings' RPC devices among them: scored where the trials run, so a
/// slow host does not read the text twice at its own speed), reading the
/// tuned depth (`asked`, the context's) or, where that would cost more
/// than `bound_s` at the speeds measured there, less ([`kl_depth`]).
/// `None` when it could not be measured (the reason goes to stderr: the
/// hatch is then not recommended).
///
/// # Errors
/// Only an interrupt.
#[allow(clippy::too_many_arguments)]
pub fn kv_quality(
    runner: &Runner,
    info: &ModelInfo,
    kv: KvType,
    ngl: u32,
    (s, asked): (&Settings, u32),
    op_offload: bool,
    (speed, bound_s): (Option<(f64, f64)>, f64),
) -> anyhow::Result<Option<Quality>> {
    let config = |kv_type| KlConfig { model: info.path.clone(), kv_type, n_gpu_layers: ngl, op_offload };
    let depth = kl_depth(asked, speed, bound_s);
    let spec = KlSpec {
        reference: config(KvType::F16),
        alternatives: vec![config(kv)],
        n_gen: KL_TOKENS,
        n_threads: s.backend.n_threads,
        depth,
        rpc: if ngl > 0 { s.backend.rpc.clone() } else { Vec::new() },
    };
    let t0 = std::time::Instant::now();
    let q = score(runner, &spec)?.into_iter().next().flatten();
    let wall_s = t0.elapsed().as_secs_f64();
    Ok(q.map(|q| Quality { wall_s, depth_asked: if depth < asked { asked } else { 0 }, ..q }))
}

/// Scores every alternative of `spec`; `None` for one that could not be
/// scored, with the reason on stderr.
///
/// # Errors
/// Only an interrupt (the tuning stops; its finished trials are kept).
pub fn score(runner: &Runner, spec: &KlSpec) -> anyhow::Result<Vec<Option<Quality>>> {
    Ok(match kl_in_child(runner, spec) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_reads_the_tuned_depth_unless_that_costs_more_than_the_trials() {
        // A GPU: 4096 tokens at pp 1000, tg 50 take 8.2 + 5.1 s: read whole.
        let gpu = (1000.0, 50.0);
        assert!((kl_seconds(4096, gpu) - (8706.0 / 1000.0 + 256.0 / 50.0)).abs() < 1e-9);
        assert_eq!(kl_depth(4096, Some(gpu), KL_MIN_BOUND_S), 4096);
        // The rig's host: pp 17, tg 10. 1024 tokens would take 146 s, over a 75 s bound.
        let slow = (17.0, 10.0);
        assert!(kl_seconds(1024, slow) > 140.0);
        let d = kl_depth(1024, Some(slow), 75.0);
        assert!((256..1024).contains(&d), "{d}");
        assert!(kl_seconds(d, slow) <= 75.0 + 1e-6 || d == 256, "{d}: {}", kl_seconds(d, slow));
        // Never under a quarter of the depth (nor 256 tokens), however slow; unknown speeds read all.
        assert_eq!(kl_depth(8192, Some((2.0, 1.0)), 60.0), 2048);
        assert_eq!(kl_depth(300, Some((2.0, 1.0)), 60.0), 256);
        assert_eq!(kl_depth(1024, None, 60.0), 1024);
        assert_eq!(kl_depth(0, Some(slow), 60.0), 0);
    }
}
