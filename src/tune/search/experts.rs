//! The expert stage of a mixture-of-experts model: every layer on the GPU
//! with the experts of the first K layers on the CPU (llama.cpp's
//! `--n-cpu-moe K`), each K priced by the dry run first and measured only
//! under the cap, against the best whole-layer split.

use anyhow::Result;

use super::Search;
use crate::profile::ProfileTrial;
use crate::tune::plan::{moe_grid, Candidate};
use crate::types::{Decision, Role, TrialStatus};

impl Search<'_> {
    /// Measures full offload with the experts of the first K layers on the
    /// CPU for K in [`moe_grid`] (most experts on the CPU first: least
    /// memory), and returns the K to recommend (0: the whole-layer split
    /// stays best) with the reason in words.
    pub(super) fn moe(&mut self, n_layer: u32, full: u32, d: &Decision) -> Result<(u32, String)> {
        let s = self.settings;
        let grid = moe_grid(n_layer);
        self.progress.plan(grid.len() as u64);
        // Priced first, as the search is: a K whose dry run is over the cap
        // (less what the trials held beyond their prices) never runs.
        let over = self.moe_over_cap(&grid, full);
        for &k in grid.iter().rev() {
            let c = Candidate { n_cpu_moe: k, ..Candidate::layers(full, s.backend.n_threads) };
            if over.iter().any(|(o, _)| *o == k) {
                self.progress.skip();
            } else if !self.trials.iter().any(|t| t.role == Role::Moe && c.is(&t.result.spec)) {
                self.measure(Role::Moe, c, None)?;
            }
        }
        let moe: Vec<&ProfileTrial> = self.trials.iter().filter(|t| t.role == Role::Moe).collect();
        let best_moe = moe
            .iter()
            .filter(|t| t.result.status == TrialStatus::Ok && !t.over_cap)
            .filter_map(|t| s.scoring().trial(&t.result).map(|v| (t.result.spec.placement.n_cpu_moe, v, t.mem_bytes)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let dense = self
            .trials
            .iter()
            .find(|t| {
                t.role != Role::Moe
                    && t.result.spec.placement.n_gpu_layers == d.recommended_ngl
                    && t.result.status == TrialStatus::Ok
                    && t.result.spec.placement.n_cpu_moe == 0
            })
            .and_then(|t| s.scoring().trial(&t.result));
        let tried: Vec<String> = moe
            .iter()
            .map(|t| {
                let v = s
                    .scoring()
                    .trial(&t.result)
                    .map_or_else(|| t.result.status.as_str().to_string(), |v| format!("{v:.2} t/s"));
                format!("K={} {v}{}", t.result.spec.placement.n_cpu_moe, if t.over_cap { " (over cap)" } else { "" })
            })
            .chain(
                over.iter().map(|(k, b)| {
                    format!("K={k} not run: {} by its dry run, over the cap", crate::model::human_bytes(*b))
                }),
            )
            .collect();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(match (best_moe, dense) {
            (Some((k, v, mem)), Some(dv)) if v > dv => (
                k,
                format!(
                    "mixture of experts: every layer on the GPU with the experts of the first {k} on the CPU (--n-cpu-moe {k}) is fastest: {v:.2} t/s in {} against {dv:.2} at ngl {} ({})",
                    mem.map_or_else(|| "?".to_string(), |m| crate::model::human_bytes(m.max(0.0) as u64)),
                    d.recommended_ngl,
                    tried.join(", ")
                ),
            ),
            _ => (
                0,
                format!(
                    "mixture of experts: --n-cpu-moe at full offload measured ({}); the whole-layer split stays best",
                    tried.join(", ")
                ),
            ),
        })
    }

    /// The K of `grid` whose full offload with the experts of the first K
    /// layers on the CPU the dry run prices over the cap less what this
    /// context's trials held beyond their prices, with their bytes. None
    /// without a cap or a dry run (the trials' own memory then judges).
    fn moe_over_cap(&mut self, grid: &[u32], full: u32) -> Vec<(u32, u64)> {
        let Some(cap) = self.held_cap() else {
            return Vec::new();
        };
        let n_ctx = self.at.n_ctx;
        let cases: Vec<crate::engine::predict::PredictCase> = grid
            .iter()
            .map(|&k| crate::engine::predict::PredictCase {
                n_cpu_moe: k,
                ..crate::engine::predict::PredictCase::layers(full, n_ctx)
            })
            .collect();
        let priced = self.price_cases(&cases);
        self.predicted.extend(priced.iter().cloned());
        #[allow(clippy::cast_precision_loss)]
        priced
            .iter()
            .filter(|p| p.error.is_none() && p.device_bytes as f64 > cap)
            .filter_map(|p| Some((p.case?.n_cpu_moe, p.device_bytes)))
            .collect()
    }
}
