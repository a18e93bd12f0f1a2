//! Several models (one model's quantizations, or different models) tuned
//! under the same cap and workload, ranked: size, bits per weight, best
//! placement, speed, and what each loses against the largest (mean KL
//! divergence and top-token agreement on tokens the largest generated).

use std::path::Path;

use serde::Serialize;

use crate::engine::quality::{KlConfig, KlSpec};
use crate::model::human_bytes;
use crate::profile::Profile;
use crate::types::KvType;
use crate::types::Quality;

/// One model's line of the ranking.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ranked {
    pub file_name: String,
    pub size_bytes: u64,
    pub bits_per_weight: f64,
    pub n_gpu_layers: u32,
    pub llama_cpp_args: String,
    pub tg_ts: Option<f64>,
    pub pp_ts: Option<f64>,
    pub mem_bytes: Option<f64>,
    /// Against the reference; `None` for the reference itself.
    pub quality: Option<Quality>,
    pub reference: bool,
    /// Why it cannot be the pick (quality unknown or over --max-kl).
    pub excluded: Option<String>,
    pub best: bool,
}

/// The reference: the largest file (the least quantized).
#[must_use]
pub fn reference(profiles: &[Profile]) -> usize {
    profiles.iter().enumerate().max_by_key(|(_, p)| p.model.file_size).map_or(0, |(i, _)| i)
}

/// Scores every model against the reference at its recommended layers
/// with an f16 KV cache (the quantization alone), in the `__kl` child.
///
/// # Errors
/// Only an interrupt.
pub fn qualities(exe: &Path, profiles: &[Profile], threads: u32) -> anyhow::Result<Vec<Option<Quality>>> {
    let r = reference(profiles);
    let config = |p: &Profile| KlConfig {
        model: p.model.path.clone(),
        kv_type: KvType::F16,
        n_gpu_layers: p.recommendation.ollama_num_gpu.unwrap_or(p.recommendation.n_gpu_layers),
        op_offload: p.recommendation.op_offload,
    };
    let others: Vec<usize> = (0..profiles.len()).filter(|i| *i != r).collect();
    let spec = KlSpec {
        reference: config(&profiles[r]),
        alternatives: others.iter().map(|i| config(&profiles[*i])).collect(),
        n_gen: super::quality::KL_TOKENS,
        n_threads: threads,
        depth: profiles[r].settings.depth_at(profiles[r].settings.n_ctx),
        rpc: profiles[r].settings.rpc.clone(),
    };
    let scores = super::quality::score(exe, &spec)?;
    let mut out = vec![None; profiles.len()];
    for (i, q) in others.into_iter().zip(scores) {
        out[i] = q;
    }
    Ok(out)
}

/// The standard error of the recommendation's measured tg (or pp, for the
/// pp objective) mean, from the trial that measured it.
fn recommendation_se(p: &Profile) -> f64 {
    let r = &p.recommendation;
    let pp = p.settings.objective == crate::types::Objective::Pp;
    p.trials
        .iter()
        .filter(|t| t.result.status == crate::types::TrialStatus::Ok)
        .map(|t| &t.result)
        .find(|t| {
            let s = &t.spec.placement;
            s.n_gpu_layers == r.n_gpu_layers
                && s.n_threads == r.n_threads
                && s.kv_type == r.kv_type
                && s.n_cpu_ffn == r.n_cpu_ffn
                && s.n_ctx == Some(r.n_ctx)
        })
        .and_then(|t| t.test(pp))
        .map_or(0.0, |x| {
            #[allow(clippy::cast_precision_loss)]
            let n = x.samples_ts.len().max(1) as f64;
            x.stddev_ts / n.sqrt()
        })
}

/// The ranking, best first by the objective; the best is the fastest whose
/// quality was measured and passes the gate (`max_kl`, `min_top1`; the
/// reference always may), and a lower quantization only when it is faster
/// than the reference beyond the noise of both.
#[must_use]
pub fn rank(profiles: &[Profile], qualities: &[Option<Quality>], max_kl: f64, min_top1: f64) -> Vec<Ranked> {
    let r = reference(profiles);
    let mut rows: Vec<(f64, f64, Ranked)> = profiles
        .iter()
        .zip(qualities)
        .enumerate()
        .map(|(i, (p, q))| {
            let rec = &p.recommendation;
            let s = &p.settings;
            let score = crate::tune::choose::score_for(s, rec.tg_ts, rec.pp_ts);
            let excluded = match q {
                _ if i == r => None,
                None => Some("quality not measured".to_string()),
                Some(q) => q.fails(max_kl, min_top1),
            };
            #[allow(clippy::cast_precision_loss)]
            let bpw = if p.model.n_params > 0 { p.model.file_size as f64 * 8.0 / p.model.n_params as f64 } else { 0.0 };
            let row = Ranked {
                file_name: p.model.file_name.clone(),
                size_bytes: p.model.file_size,
                bits_per_weight: bpw,
                n_gpu_layers: rec.n_gpu_layers,
                llama_cpp_args: rec.llama_cpp_args.clone(),
                tg_ts: rec.tg_ts,
                pp_ts: rec.pp_ts,
                mem_bytes: rec.mem_bytes,
                quality: q.clone(),
                reference: i == r,
                excluded,
                best: false,
            };
            (score.unwrap_or(f64::NEG_INFINITY), recommendation_se(p), row)
        })
        .collect();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    let pick = rows.iter().position(|(v, _, row)| v.is_finite() && row.excluded.is_none());
    let reference_row = rows.iter().position(|(v, _, row)| row.reference && v.is_finite());
    let pick = match (pick, reference_row) {
        (Some(b), Some(r)) if b != r => {
            let (bv, bse, _) = &rows[b];
            let (rv, rse, _) = &rows[r];
            if bv - rv <= 2.0 * (bse * bse + rse * rse).sqrt() {
                rows[b].2.excluded = Some(format!(
                    "{:+.0}% against {}, within the noise of the two: a lower quantization only when it pays",
                    (bv / rv - 1.0) * 100.0,
                    rows[r].2.file_name
                ));
                Some(r)
            } else {
                Some(b)
            }
        }
        (p, _) => p,
    };
    if let Some(i) = pick {
        rows[i].2.best = true;
    }
    rows.into_iter().map(|(_, _, r)| r).collect()
}

/// The ranking as a table and the pick in words.
#[must_use]
pub fn render(rows: &[Ranked]) -> String {
    let reference = rows.iter().find(|r| r.reference).map_or("", |r| r.file_name.as_str());
    let kl_head = format!("KL vs {reference}");
    let mut t = crate::table::Table::new(&[
        ("model", false),
        ("size", true),
        ("bits/weight", true),
        ("ngl", true),
        ("tg t/s", true),
        ("pp t/s", true),
        ("device memory", true),
        (kl_head.as_str(), true),
        ("top token agrees", true),
        ("verdict", false),
    ]);
    let speed = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
    for r in rows {
        let (kl, agree) = match (&r.quality, r.reference) {
            (_, true) => ("reference".to_string(), "-".to_string()),
            (Some(q), _) => (format!("{:.4}", q.kl_mean), format!("{:.1}%", q.top1_agree * 100.0)),
            (None, _) => ("-".into(), "-".into()),
        };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let mem = r.mem_bytes.map_or_else(|| "-".into(), |m| human_bytes(m as u64));
        let mark = if r.best { "best".to_string() } else { r.excluded.clone().unwrap_or_default() };
        t.row(vec![
            r.file_name.clone(),
            human_bytes(r.size_bytes),
            format!("{:.2}", r.bits_per_weight),
            r.n_gpu_layers.to_string(),
            speed(r.tg_ts),
            speed(r.pp_ts),
            mem,
            kl,
            agree,
            mark,
        ]);
    }
    let mut s = t.render();
    if let Some(b) = rows.iter().find(|r| r.best) {
        s += &format!("best under the cap: {} ({})\n", b.file_name, b.llama_cpp_args);
    }
    s
}
