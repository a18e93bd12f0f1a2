//! Several models (one model's quantizations, or different models) tuned
//! under the same cap and workload, ranked: size, bits per weight, best
//! placement, speed, and what each loses against the largest (mean KL
//! divergence and top-token agreement on tokens the largest generated).

use serde::Serialize;

use crate::engine::quality::{KlConfig, KlSpec};
use crate::model::human_bytes;
use crate::placement::KvType;
use crate::profile::Profile;
use crate::types::{Quality, QualityGate};

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
pub fn qualities(
    runner: &crate::engine::runner::Runner,
    profiles: &[Profile],
    threads: u32,
) -> anyhow::Result<Vec<Option<Quality>>> {
    let r = reference(profiles);
    let config = |p: &Profile| KlConfig {
        model: p.model.path.clone(),
        kv_type: KvType::F16,
        n_gpu_layers: p.recommendation.ollama_layers(),
        op_offload: p.recommendation.placement.op_offload != crate::placement::OpOffload::Off,
    };
    let others: Vec<usize> = (0..profiles.len()).filter(|i| *i != r).collect();
    let spec = KlSpec {
        reference: config(&profiles[r]),
        alternatives: others.iter().map(|i| config(&profiles[*i])).collect(),
        n_gen: super::quality::KL_TOKENS,
        n_threads: threads,
        depth: profiles[r].settings.depth_at(profiles[r].settings.workload.n_ctx),
        rpc: profiles[r].settings.backend.rpc.clone(),
    };
    let scores = super::quality::score(runner, &spec)?;
    let mut out = vec![None; profiles.len()];
    for (i, q) in others.into_iter().zip(scores) {
        out[i] = q;
    }
    Ok(out)
}

/// The trial that measured the recommendation.
fn recommendation_trial(p: &Profile) -> Option<&crate::profile::ProfileTrial> {
    let r = &p.recommendation;
    p.trials.iter().filter(|t| t.result.status == crate::types::TrialStatus::Ok).find(|t| {
        let s = &t.result.spec.placement;
        s.n_gpu_layers == r.placement.n_gpu_layers
            && s.n_threads == r.placement.n_threads
            && s.kv_type == r.placement.kv_type
            && s.n_cpu_ffn == r.placement.n_cpu_ffn
            && s.n_ctx == Some(r.n_ctx())
    })
}

/// The standard error of the recommendation's measured tg (or pp, for the
/// pp objective) mean, from the trial that measured it.
fn recommendation_se(p: &Profile) -> f64 {
    let pp = p.settings.goal.objective.reads() == crate::types::Reads::Pp;
    recommendation_trial(p).and_then(|t| t.result.test(pp)).map_or(0.0, |x| {
        #[allow(clippy::cast_precision_loss)]
        let n = x.samples_ts.len().max(1) as f64;
        x.stddev_ts / n.sqrt()
    })
}

/// The ranking, best first by the objective; the best is the fastest whose
/// quality was measured and passes the `gate` (`--max-kl`, `--min-top1`; the
/// reference always may), and a lower quantization only when it is faster
/// than the reference beyond the noise of both.
#[must_use]
pub fn rank(profiles: &[Profile], qualities: &[Option<Quality>], gate: &QualityGate) -> Vec<Ranked> {
    let r = reference(profiles);
    let mut rows: Vec<(f64, f64, Ranked)> = profiles
        .iter()
        .zip(qualities)
        .enumerate()
        .map(|(i, (p, q))| {
            let rec = &p.recommendation;
            let s = &p.settings;
            // Energy: its trial's tokens per joule (the power is the trial's); else its speeds.
            let score = if s.goal.objective.weighs_power() {
                recommendation_trial(p).and_then(|t| s.scoring().trial(&t.result))
            } else {
                s.scoring().speeds(rec.tg_ts, rec.pp_ts)
            };
            let excluded = match q {
                _ if i == r => None,
                None => Some("quality not measured".to_string()),
                Some(q) => q.fails(gate),
            };
            #[allow(clippy::cast_precision_loss)]
            let bpw = if p.model.n_params > 0 { p.model.file_size as f64 * 8.0 / p.model.n_params as f64 } else { 0.0 };
            let row = Ranked {
                file_name: p.model.file_name.clone(),
                size_bytes: p.model.file_size,
                bits_per_weight: bpw,
                n_gpu_layers: rec.placement.n_gpu_layers,
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
pub fn render(rows: &[Ranked], reading_ts: f64) -> String {
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
    if let Some(l) = reading_line(rows, reading_ts) {
        s += &l;
        s.push('\n');
    }
    s
}

/// Reading speed for chat across the set, where the largest model is
/// below it (the guides' "one quantization lower"): the largest that
/// passes the quality gate and reaches it, or that none does.
#[must_use]
pub fn reading_line(rows: &[Ranked], reading_ts: f64) -> Option<String> {
    let reference = rows.iter().find(|r| r.reference)?;
    let tg = reference.tg_ts?;
    if tg >= reading_ts {
        return None;
    }
    let head =
        format!("reading speed ({reading_ts} t/s for chat): {} reaches {tg:.2} t/s, below it", reference.file_name);
    let mut eligible: Vec<&Ranked> = rows
        .iter()
        .filter(|r| !r.reference && r.excluded.is_none() && r.tg_ts.is_some_and(|t| t >= reading_ts))
        .collect();
    eligible.sort_by_key(|r| std::cmp::Reverse(r.size_bytes));
    Some(match eligible.first() {
        Some(r) => format!(
            "{head}; the largest lower quantization that reaches it: {} at {:.2} t/s{} ({})",
            r.file_name,
            r.tg_ts.unwrap_or(0.0),
            r.quality.as_ref().map_or(String::new(), |q| format!(", KL {:.4}", q.kl_mean)),
            r.llama_cpp_args
        ),
        None => format!("{head}; none of the others that pass the quality gate reaches it either"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, size: u64, tg: f64, reference: bool, excluded: Option<&str>) -> Ranked {
        Ranked {
            file_name: name.into(),
            size_bytes: size,
            bits_per_weight: 4.0,
            n_gpu_layers: 20,
            llama_cpp_args: format!("-m {name} -ngl 20"),
            tg_ts: Some(tg),
            pp_ts: None,
            mem_bytes: None,
            quality: None,
            reference,
            excluded: excluded.map(Into::into),
            best: false,
        }
    }

    #[test]
    fn below_reading_speed_the_largest_lower_quantization_that_reaches_it_is_named() {
        let rows = [
            row("q8.gguf", 800, 7.0, true, None),
            row("q4.gguf", 400, 12.0, false, None),
            row("q5.gguf", 500, 10.5, false, None),
            row("q2.gguf", 200, 20.0, false, Some("KL 0.3 over --max-kl")),
        ];
        let l = reading_line(&rows, 10.0).unwrap();
        assert!(l.contains("q8.gguf reaches 7.00 t/s, below it"), "{l}");
        assert!(l.contains("the largest lower quantization that reaches it: q5.gguf at 10.50 t/s"), "{l}");
        assert!(reading_line(&rows, 6.0).is_none(), "the reference is fast enough");
        let l = reading_line(&rows, 25.0).unwrap();
        assert!(l.ends_with("none of the others that pass the quality gate reaches it either"), "{l}");
    }
}
