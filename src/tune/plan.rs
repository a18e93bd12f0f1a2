//! What to measure: candidate placements, the grid of ngl values, the
//! adaptive search's points, the expert-offload values.

use anyhow::Result;

use crate::placement::{KvType, Split};
use crate::profile::Settings;
use crate::types::{CpuInfo, Decision};

/// The context one stage works on: its size, the depth its tests run at
/// and the batch it runs with (Ollama's batch steps down per context).
/// The settings' own `n_ctx` is the request's record (the largest context
/// tuned); a stage reads its context here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextRun {
    pub n_ctx: u32,
    /// Tokens in the KV cache before each test ([`Settings::depth_at`]).
    pub depth: u32,
    pub n_batch: u32,
    pub n_ubatch: u32,
}

impl ContextRun {
    /// Context `n_ctx` of the settings: its depth by their rule, their batch.
    #[must_use]
    pub fn of(s: &Settings, n_ctx: u32) -> ContextRun {
        ContextRun { n_ctx, depth: s.depth_at(n_ctx), n_batch: s.workload.n_batch, n_ubatch: s.workload.n_ubatch }
    }

    /// What every trial at this context runs beside where the layers go:
    /// its batch sizes, flash attention, slots and projector. An option's
    /// paste-ready flags start from it, so they say what its trial ran.
    #[must_use]
    pub fn workload(
        &self,
        (w, backend): (&crate::consumer::Workload, &crate::profile::Backend),
    ) -> crate::placement::Placement {
        crate::placement::Placement {
            n_batch: self.n_batch,
            n_ubatch: self.n_ubatch,
            flash_attn: w.flash_attn,
            ..crate::placement::Placement::default()
        }
        .with_parallel(w.n_parallel)
        .with_mmproj(backend.mmproj.as_deref())
    }
}

/// The default grid: 0, 10, 20, ... below full offload, then full offload
/// (n_layer + 1: this llama.cpp counts the output layer, which goes first).
#[must_use]
pub fn default_grid(n_layer_full: u32, step: u32) -> Vec<u32> {
    let step = step.max(1);
    let mut g: Vec<u32> = (0..n_layer_full).step_by(step as usize).collect();
    g.push(n_layer_full);
    g
}

/// Normalizes a user grid: 99 (or anything above full) means full offload;
/// sorted ascending, duplicates dropped.
#[must_use]
pub fn normalize(values: &[u32], n_layer_full: u32) -> Vec<u32> {
    let mut g: Vec<u32> = values.iter().map(|v| (*v).min(n_layer_full)).collect();
    g.sort_unstable();
    g.dedup();
    g
}

/// A whole placement to measure at the workload's context: layers on the
/// GPU, layers whose experts or dense FFN weights stay on the CPU, the KV
/// cache type, CPU threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Candidate {
    pub ngl: u32,
    pub n_cpu_moe: u32,
    pub n_cpu_ffn: u32,
    /// The KV cache type of both caches; `None`: the workload's own (f16,
    /// `--cache-type`, or the one the consumer's server forces).
    pub kv: Option<KvType>,
    pub threads: u32,
    /// Layers per offload device (`-ts`); empty: llama.cpp's default split.
    pub split: Split,
    /// The tensors llama.cpp's fit keeps on the CPU (its default placement's `-ot`).
    pub spill: crate::placement::FitSpill,
    /// The context it runs at; 0: the workload's.
    pub ctx: u32,
    /// llama-server's own batch sizes, flash attention and one sequence
    /// (`-b 2048 -ub 512 -fa auto`), not the consumer's: llama.cpp's default.
    pub stock: bool,
    /// A baseline (llama.cpp's default, Ollama's own run): llama.cpp's op
    /// offload, and its trials marked so no other candidate takes them.
    pub upstream: bool,
    /// The projector on the CPU (`--no-mmproj-offload`: Ollama's run where
    /// the GPU has too little free memory for it).
    pub mmproj_cpu: bool,
}

/// What a placement runs as a candidate: its layers, threads, experts and
/// FFN weights on the CPU, and its KV cache type; its split, context and
/// workload are the caller's (one device, the search's context).
impl From<&crate::placement::Placement> for Candidate {
    fn from(p: &crate::placement::Placement) -> Candidate {
        Candidate {
            n_cpu_moe: p.n_cpu_moe,
            n_cpu_ffn: p.n_cpu_ffn,
            kv: Some(p.kv_type),
            ..Candidate::layers(p.n_gpu_layers, p.n_threads)
        }
    }
}

impl Candidate {
    /// A whole-layer split with `threads` threads and the workload's KV cache type.
    #[must_use]
    pub fn layers(ngl: u32, threads: u32) -> Candidate {
        Candidate {
            ngl,
            n_cpu_moe: 0,
            n_cpu_ffn: 0,
            kv: None,
            threads,
            split: Split::default(),
            spill: crate::placement::FitSpill::default(),
            ctx: 0,
            stock: false,
            upstream: false,
            mmproj_cpu: false,
        }
    }

    /// The same placement with another thread count.
    #[must_use]
    pub fn with_threads(self, threads: u32) -> Candidate {
        Candidate { threads, ..self }
    }

    /// Whether a trial measured this placement.
    #[must_use]
    pub fn is(&self, spec: &crate::types::TrialSpec) -> bool {
        spec.placement.n_gpu_layers == self.ngl
            && spec.placement.n_cpu_moe == self.n_cpu_moe
            && spec.placement.n_cpu_ffn == self.n_cpu_ffn
            && spec.placement.kv_type == self.kv.unwrap_or(spec.kv_base)
            && spec.placement.n_threads == self.threads
            && spec.placement.tensor_split == self.split.listed()
            && spec.placement.devices.is_empty() == self.split.in_llama_order()
            && spec.placement.split_mode == self.split.mode()
            && spec.placement.cpu_overrides == self.spill.patterns()
            && (self.ctx == 0 || spec.placement.n_ctx == Some(self.ctx))
            && spec.baseline == self.upstream
            && spec.placement.mmproj_offload != self.mmproj_cpu
            && (!self.stock || {
                let stock = crate::placement::Placement::default().with_server_defaults();
                let p = &spec.placement;
                (p.n_batch, p.n_ubatch, p.n_parallel, p.kv_unified)
                    == (stock.n_batch, stock.n_ubatch, stock.n_parallel, stock.kv_unified)
            })
    }
}

/// Full offload (or the largest setting under the cap) at least this much
/// slower than ngl 0 means offloading only hurts: no interior point is needed.
pub const HURTS_BY: f64 = 0.25;

/// Adaptive search. Measures the two ends first: ngl 0 and the largest
/// setting predicted under the cap (`n_max`), the one expected to be faster
/// first (`top_first`) so the other can be raced. Time per token is linear in
/// the layers offloaded plus a split cost that is never negative, so no
/// partial setting beats both ends: when the top end is clearly slower than
/// ngl 0 the search stops there and says why. Otherwise one interior point
/// (two when offloading pays) fits the line, as long as the search stays
/// under `max_trials` (one less than the grid); the decision and its
/// confirmation loop do the rest. `measure` runs a setting and returns its
/// objective score (None when it failed).
///
/// # Errors
/// What `measure` returns.
pub fn adaptive_points(
    n_max: u32,
    top_first: bool,
    max_trials: usize,
    measure: &mut dyn FnMut(u32) -> Result<Option<f64>>,
) -> Result<Option<String>> {
    let trials = std::cell::Cell::new(0usize);
    let mut counted = |n: u32| {
        trials.set(trials.get() + 1);
        measure(n)
    };
    let measure: &mut dyn FnMut(u32) -> Result<Option<f64>> = &mut counted;
    if n_max == 0 {
        measure(0)?;
        return Ok(None);
    }
    let mut top = n_max;
    let mut step_down = |measure: &mut dyn FnMut(u32) -> Result<Option<f64>>| -> Result<(u32, Option<f64>)> {
        let mut score = measure(top)?;
        // Out of memory despite the prediction: step down.
        for _ in 0..3 {
            if score.is_some() || top < 2 {
                break;
            }
            top = top * 3 / 4;
            score = measure(top)?;
        }
        Ok((top, score))
    };
    let (zero, (top, at_top)) = if top_first {
        let t = step_down(measure)?;
        (measure(0)?, t)
    } else {
        let z = measure(0)?;
        (z, step_down(measure)?)
    };
    if let (Some(z), Some(t)) = (zero, at_top) {
        if t < z * (1.0 - HURTS_BY) {
            return Ok(Some(format!(
                "adaptive search stopped after the two ends: ngl {top} is {:.0}% slower than ngl 0, and time per token grows linearly with the layers offloaded, so no setting between them can beat ngl 0",
                (1.0 - t / z) * 100.0
            )));
        }
    }
    // Interior points refine the line and find the knee; never as many
    // trials as the grid itself.
    let mut budget = max_trials.saturating_sub(trials.get());
    if top >= 2 && budget > 0 {
        let mid = measure(top / 2)?;
        budget -= 1;
        let pays = matches!((zero, at_top), (Some(a), Some(b)) if b > a);
        if pays && top >= 4 && mid.is_some() && budget > 0 {
            measure(top * 3 / 4)?;
        }
    }
    Ok(None)
}

/// The `--n-cpu-moe` values worth measuring: none, a quarter, half, three
/// quarters and all of the layers.
#[must_use]
pub fn moe_grid(n_layer: u32) -> Vec<u32> {
    let mut g: Vec<u32> = [0, n_layer / 4, n_layer / 2, n_layer * 3 / 4, n_layer].to_vec();
    g.sort_unstable();
    g.dedup();
    g
}

/// What the search found.
#[derive(Debug, Clone)]
pub struct Found {
    pub decision: Decision,
    /// The best whole-layer split (Ollama's `num_gpu`).
    pub dense_ngl: u32,
    pub threads: u32,
    /// Layers whose experts stay on the CPU at full offload (0: none).
    pub n_cpu_moe: u32,
    /// Grid values not run because a smaller one ran out of memory.
    pub skipped: Vec<u32>,
    pub notes: Vec<crate::types::Note>,
}

/// What the search is asked: the model's layers, the grid, and how to walk it.
#[derive(Debug, Clone)]
pub struct Plan {
    /// ngl of full offload.
    pub full: u32,
    /// Repeating layers (expert offload is per layer).
    pub n_layer: u32,
    pub is_moe: bool,
    /// The full grid (the adaptive search's yardstick).
    pub full_grid: Vec<u32>,
    /// Measure every value of `full_grid` (not predicted over the cap).
    pub grid_mode: bool,
    /// No GPU device: only thread counts matter.
    pub no_gpu: bool,
    /// Grid values llama.cpp's dry run predicts over the cap.
    pub predicted_over: Vec<u32>,
    /// Largest setting predicted under the cap (adaptive search's top end).
    pub n_max: u32,
    /// The top end is expected to be faster than ngl 0 (a real GPU).
    pub top_first: bool,
    pub cpu: CpuInfo,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::worlds::*;

    /// A placement's layers, threads, experts, FFN spill and cache type are
    /// its candidate's; the split and context are left to the caller.
    #[test]
    fn a_placement_is_its_candidate() {
        let p = crate::placement::Placement { n_cpu_moe: 3, n_cpu_ffn: 2, ..crate::placement::Placement::default() }
            .with_layers(20, 6, Some(8192))
            .with_kv(KvType::Q8_0);
        let c = Candidate::from(&p);
        assert_eq!((c.ngl, c.threads, c.n_cpu_moe, c.n_cpu_ffn, c.kv), (20, 6, 3, 2, Some(KvType::Q8_0)));
        assert_eq!((c.split, c.ctx, c.stock, c.upstream), (Split::default(), 0, false, false));
    }

    #[test]
    fn a_candidate_of_the_own_kv_type_is_the_trial_at_the_workloads_type_whatever_it_is() {
        let c = Candidate::layers(5, 2);
        let spec = |base: KvType, kv: KvType| {
            let mut spec = crate::engine::test_spec();
            spec.kv_base = base;
            crate::tune::executor::spec_of(
                &crate::types::TrialSpec { placement: spec.placement.with_kv(kv), ..spec },
                &[],
                c,
                None,
            )
        };
        // A server that forces q8_0 on every model: the own type is q8_0, and an f16 trial is another placement.
        assert!(c.is(&spec(KvType::Q8_0, KvType::Q8_0)));
        assert!(!c.is(&spec(KvType::Q8_0, KvType::F16)));
        assert!(c.is(&spec(KvType::F16, KvType::F16)));
        // A hatch's q8_0 cache is itself at either base, and never the f16 trial.
        let q8 = Candidate { kv: Some(KvType::Q8_0), ..c };
        let run = crate::tune::executor::spec_of(&crate::engine::test_spec(), &[], q8, None);
        assert_eq!(run.placement.kv_type, KvType::Q8_0);
        assert!(q8.is(&run) && !c.is(&run));
        assert!(!q8.is(&spec(KvType::F16, KvType::F16)));
    }

    #[test]
    fn grid_has_zero_and_full_offload() {
        assert_eq!(default_grid(19, 10), vec![0, 10, 19]);
        assert_eq!(default_grid(33, 10), vec![0, 10, 20, 30, 33]);
        assert_eq!(default_grid(30, 10), vec![0, 10, 20, 30]);
        assert_eq!(default_grid(5, 10), vec![0, 5]);
        assert_eq!(default_grid(41, 10), vec![0, 10, 20, 30, 40, 41]);
    }

    #[test]
    fn user_values_are_clamped_and_deduplicated() {
        assert_eq!(normalize(&[99, 0, 10, 10, 19, 25], 19), vec![0, 10, 19]);
        assert_eq!(normalize(&[5, 3], 19), vec![3, 5]);
    }

    #[test]
    fn adaptive_reaches_the_grids_answer_on_gpu_shaped_curves_with_fewer_trials() {
        const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
        let grid = default_grid(35, 10);
        for top_first in [true, false] {
            for cap in [80.0 * GIB, 3.75 * GIB, 3.05 * GIB, 2.0 * GIB] {
                let n_max = ((cap / GIB - 0.5) / 0.1).floor().clamp(0.0, 35.0) as u32;
                let mut seen = Vec::new();
                let note = adaptive_points(n_max, top_first, grid.len() - 1, &mut |n| {
                    seen.push(n);
                    Ok(Some(readme_world(n).0))
                })
                .unwrap();
                assert_eq!(note, None, "offloading pays on this curve: interior points are measured");
                let by_grid = decide_on(&grid, cap, 35, readme_world);
                let by_adaptive = decide_on(&seen, cap, 35, readme_world);
                assert_eq!(by_adaptive, by_grid, "cap {} GiB: adaptive measured {seen:?}", cap / GIB);
                assert!(seen.len() < grid.len(), "{seen:?}");
                assert_eq!(seen[0], if top_first { n_max } else { 0 }, "{seen:?}");
            }
        }
    }

    #[test]
    fn adaptive_stops_after_the_ends_when_offloading_only_hurts() {
        let mut seen = Vec::new();
        let note = adaptive_points(41, false, 5, &mut |n| {
            seen.push(n);
            Ok(Some(hurting_world(n).0))
        })
        .unwrap();
        assert_eq!(seen, [0, 41], "the two ends decide it");
        let note = note.expect("the skipped interior is explained");
        assert!(note.contains("ngl 41 is 98% slower than ngl 0"), "{note}");
        let grid = default_grid(41, 10);
        assert_eq!(decide_on(&seen, 1e12, 41, hurting_world), 0);
        assert_eq!(decide_on(&grid, 1e12, 41, hurting_world), 0, "the grid agrees");
    }

    #[test]
    fn adaptive_measures_the_interior_when_the_ends_are_close() {
        // Full offload 10% slower than ngl 0: within what noise and a
        // curved line could explain, so the interior is measured.
        let mut seen = Vec::new();
        let note = adaptive_points(19, true, 5, &mut |n| {
            seen.push(n);
            Ok(Some(if n == 19 { 90.0 } else { 100.0 - f64::from(n) }))
        })
        .unwrap();
        assert_eq!(note, None);
        assert_eq!(seen, [19, 0, 9]);
    }

    #[test]
    fn adaptive_steps_down_from_an_out_of_memory_top() {
        let mut seen = Vec::new();
        adaptive_points(40, true, 9, &mut |n| {
            seen.push(n);
            Ok((n <= 22).then(|| 10.0 + f64::from(n)))
        })
        .unwrap();
        assert_eq!(seen, [40, 30, 22, 0, 11, 16], "40 and 30 fail, 22 runs; then 0 and two interior points");
    }

    #[test]
    fn adaptive_never_runs_as_many_trials_as_a_small_grid() {
        let grid = default_grid(19, 10);
        let mut seen = Vec::new();
        let note = adaptive_points(19, true, grid.len() - 1, &mut |n| {
            seen.push(n);
            Ok(Some(small_gpu_world(n).0))
        })
        .unwrap();
        assert_eq!(note, None);
        assert_eq!(seen, [19, 0], "the grid has 3 settings: the two ends only");
        assert_eq!(decide_on(&seen, 1e12, 19, small_gpu_world), 19);
        assert_eq!(decide_on(&grid, 1e12, 19, small_gpu_world), 19);
    }
}
