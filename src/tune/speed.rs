//! Several devices by speed, not only by memory. Each device's time per
//! layer comes from one trial with some layers on that device alone (the
//! rest on the CPU), against the trial with every layer on the CPU: time
//! per token is linear in the layers a device holds (the model the search
//! fits for one device), so a split's time is the CPU's plus what each
//! device's layers change. The crossing into a device and back is in its
//! probe, spread over its layers.
//!
//! From those slopes the fastest split under every device's capacity is a
//! greedy fill: the cheapest device per layer first. A device slower than
//! the CPU gets layers only where the layer count is fixed (`--ngl`) and
//! the faster devices cannot hold them; a device faster than the CPU is
//! filled to its capacity.

use crate::types::Objective;

/// One device's change to the time per token for each layer it holds,
/// against the CPU (negative: faster), for tg and pp, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceSpeed {
    pub tg_ms_per_layer: f64,
    pub pp_ms_per_layer: f64,
}

/// The CPU's time per token (every layer there) and each device's slope.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeedModel {
    pub cpu_tg_ms: f64,
    pub cpu_pp_ms: f64,
    pub devices: Vec<DeviceSpeed>,
    /// ngl of full offload (the repeating layers and the output layer).
    pub full: u32,
    /// The output layer's work in layers (its weights over a layer's: the
    /// embeddings where they are tied). At full offload it runs on the
    /// last device that holds layers, as llama.cpp's layer split puts it.
    pub output_layers: f64,
}

/// A rate (tokens/s) as milliseconds per token.
fn ms(ts: f64) -> f64 {
    1000.0 / ts
}

/// A probe: `layers` on one device alone, measured at these rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    pub layers: u32,
    pub tg_ts: Option<f64>,
    pub pp_ts: Option<f64>,
}

impl SpeedModel {
    /// The model from the all-CPU rates and one probe per device (in the
    /// devices' order). `None` when the CPU's rates or a probe are missing.
    #[must_use]
    pub fn fit(cpu_tg_ts: Option<f64>, cpu_pp_ts: Option<f64>, probes: &[Probe]) -> Option<SpeedModel> {
        let (t0, p0) = (ms(cpu_tg_ts.filter(|v| *v > 0.0)?), cpu_pp_ts.filter(|v| *v > 0.0).map(ms));
        let devices = probes
            .iter()
            .map(|p| {
                if p.layers == 0 {
                    // A device that holds no layer under its cap: its speed never matters.
                    return Some(DeviceSpeed { tg_ms_per_layer: 0.0, pp_ms_per_layer: 0.0 });
                }
                let k = f64::from(p.layers);
                let tg = (ms(p.tg_ts.filter(|v| *v > 0.0)?) - t0) / k;
                let pp = match (p0, p.pp_ts.filter(|v| *v > 0.0)) {
                    (Some(p0), Some(pp)) => (ms(pp) - p0) / k,
                    _ => 0.0,
                };
                Some(DeviceSpeed { tg_ms_per_layer: tg, pp_ms_per_layer: pp })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(SpeedModel { cpu_tg_ms: t0, cpu_pp_ms: p0.unwrap_or(0.0), devices, full: u32::MAX, output_layers: 1.0 })
    }

    /// With the model's full offload and its output layer's weight in layers.
    #[must_use]
    pub fn with_output(mut self, full: u32, output_layers: f64) -> Self {
        self.full = full;
        self.output_layers = output_layers.max(0.0);
        self
    }

    /// Where the output layer runs: the last device holding layers at full offload.
    fn output_on(&self, split: &[u32]) -> Option<usize> {
        (split.iter().sum::<u32>() >= self.full).then(|| split.iter().rposition(|k| *k > 0)).flatten()
    }

    /// Predicted rates (tg, pp in tokens/s) of a split: layers per device.
    #[must_use]
    pub fn predict(&self, split: &[u32]) -> (f64, Option<f64>) {
        let out = self.output_on(split);
        let sum = |f: fn(&DeviceSpeed) -> f64| -> f64 {
            let layers: f64 = self.devices.iter().zip(split).map(|(d, k)| f(d) * f64::from(*k)).sum();
            // The output counted as one of the last device's layers weighs output_layers.
            layers + out.map_or(0.0, |i| f(&self.devices[i]) * (self.output_layers - 1.0))
        };
        let tg = self.cpu_tg_ms + sum(|d| d.tg_ms_per_layer);
        let pp = (self.cpu_pp_ms > 0.0).then(|| self.cpu_pp_ms + sum(|d| d.pp_ms_per_layer));
        (1000.0 / tg.max(1e-6), pp.map(|p| 1000.0 / p.max(1e-6)))
    }

    /// What a layer on each device costs for the objective: ms per token
    /// (tg, pp), or per request of `n_prompt` + `n_gen` tokens (mixed).
    fn layer_cost(&self, objective: Objective, n_prompt: u32, n_gen: u32) -> Vec<f64> {
        self.devices
            .iter()
            .map(|d| match objective {
                Objective::Tg => d.tg_ms_per_layer,
                Objective::Pp => d.pp_ms_per_layer,
                Objective::Mixed => f64::from(n_prompt) * d.pp_ms_per_layer + f64::from(n_gen) * d.tg_ms_per_layer,
            })
            .collect()
    }

    /// The fastest layers per device under each device's `capacity`: with
    /// `ngl` fixed, exactly that many layers on the devices, cheapest
    /// first (`None` when they cannot hold them); else every device faster
    /// than the CPU filled, cheapest first, to at most `full` layers.
    #[must_use]
    pub fn best(
        &self,
        capacity: &[u32],
        full: u32,
        ngl: Option<u32>,
        objective: Objective,
        workload: (u32, u32),
    ) -> Option<Vec<u32>> {
        let cost = self.layer_cost(objective, workload.0, workload.1);
        let cap = |i: usize| capacity.get(i).copied().unwrap_or(0);
        // `target` layers, cheapest first among `allowed` (`first` given one
        // layer before the rest); without `must`, only devices that beat the CPU.
        let fill = |target: u32, allowed: &[usize], first: Option<usize>, must: bool| -> Option<Vec<u32>> {
            let mut out = vec![0u32; cost.len()];
            let mut left = target;
            if let Some(f) = first {
                if cap(f) == 0 || left == 0 {
                    return None;
                }
                out[f] = 1;
                left -= 1;
            }
            let mut order = allowed.to_vec();
            order.sort_by(|a, b| cost[*a].total_cmp(&cost[*b]));
            for i in order {
                if left == 0 || (!must && cost[i] >= 0.0) {
                    break;
                }
                let more = cap(i).saturating_sub(out[i]).min(left);
                out[i] += more;
                left -= more;
            }
            (!must || left == 0).then_some(out)
        };
        let all: Vec<usize> = (0..cost.len()).collect();
        let score = |x: &[u32]| {
            let (tg, pp) = self.predict(x);
            crate::tune::choose::score(objective, workload.0, workload.1, Some(tg), pp).unwrap_or(0.0)
        };
        // Every layer offloaded: the output runs on the last device that
        // holds layers, so each choice of that device is its own fill.
        let whole = || {
            (0..cost.len())
                .filter_map(|last| fill(full, &(0..=last).collect::<Vec<_>>(), Some(last), true))
                .max_by(|a, b| score(a).total_cmp(&score(b)))
        };
        match ngl.map(|n| n.min(full)) {
            Some(n) if n < full => fill(n, &all, None, true),
            Some(_) => whole(),
            None => {
                // The output on the CPU (a partial offload), or everything offloaded.
                let partial = fill(full.saturating_sub(1), &all, None, false);
                [partial, whole()].into_iter().flatten().max_by(|a, b| score(a).total_cmp(&score(b)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fake world: the CPU at 20 t/s for a 20-layer model, a fast GPU
    /// (a layer there saves 2 ms a token), a slow one behind a slow link
    /// (each layer there costs 3 ms more than on the CPU).
    fn world() -> SpeedModel {
        let cpu = Probe { layers: 0, tg_ts: Some(20.0), pp_ts: Some(200.0) };
        // 10 layers on the fast GPU: 50 - 20 = 30 ms a token; on the slow one: 50 + 30 = 80 ms.
        let fast = Probe { layers: 10, tg_ts: Some(1000.0 / 30.0), pp_ts: Some(1000.0 / 2.0) };
        let slow = Probe { layers: 10, tg_ts: Some(1000.0 / 80.0), pp_ts: Some(1000.0 / 8.0) };
        SpeedModel::fit(cpu.tg_ts, cpu.pp_ts, &[slow, fast]).unwrap()
    }

    #[test]
    fn a_devices_slope_is_its_probe_against_the_cpu_and_predicts_other_splits() {
        let w = world();
        assert!((w.devices[0].tg_ms_per_layer - 3.0).abs() < 1e-9 && (w.devices[1].tg_ms_per_layer + 2.0).abs() < 1e-9);
        // 20 layers on the fast GPU: 50 - 40 = 10 ms a token.
        assert!((w.predict(&[0, 20]).0 - 100.0).abs() < 1e-6);
        // 5 on the slow one, 15 on the fast one: 50 + 15 - 30 = 35 ms.
        assert!((w.predict(&[5, 15]).0 - 1000.0 / 35.0).abs() < 1e-6);
    }

    #[test]
    fn the_slow_device_is_left_out_when_that_is_faster() {
        let w = world();
        // The fast GPU holds everything: the slow one gets nothing, whatever its memory.
        assert_eq!(w.best(&[20, 21], 21, None, Objective::Tg, (512, 128)), Some(vec![0, 21]));
        // The fast GPU holds 12: the rest stays on the CPU, not on the slower device.
        assert_eq!(w.best(&[20, 12], 21, None, Objective::Tg, (512, 128)), Some(vec![0, 12]));
    }

    #[test]
    fn the_slow_device_is_kept_when_its_memory_is_needed() {
        let w = world();
        // Every layer must be offloaded (--ngl 21): the fast GPU takes 12, the slow one the other 9.
        assert_eq!(w.best(&[20, 12], 21, Some(21), Objective::Tg, (512, 128)), Some(vec![9, 12]));
        // More layers than both hold: no such split.
        assert_eq!(w.best(&[5, 12], 21, Some(21), Objective::Tg, (512, 128)), None);
    }

    #[test]
    fn at_full_offload_the_output_lands_on_the_fast_device() {
        // In llama.cpp's order the slow device comes last: any layer on it
        // brings the output layer (here the work of 40 layers) there too.
        let cpu = (Some(20.0), Some(200.0));
        let fast = Probe { layers: 10, tg_ts: Some(1000.0 / 30.0), pp_ts: None };
        let slow = Probe { layers: 10, tg_ts: Some(1000.0 / 80.0), pp_ts: None };
        let w = SpeedModel::fit(cpu.0, cpu.1, &[fast, slow]).unwrap().with_output(21, 40.0);
        // The fast device holds every layer: the slow one gets none, the output stays fast.
        assert_eq!(w.best(&[21, 21], 21, Some(21), Objective::Tg, (512, 128)), Some(vec![21, 0]));
        // It holds 15: the slow one must take 6, and the output goes with them.
        let forced = w.best(&[15, 21], 21, Some(21), Objective::Tg, (512, 128)).unwrap();
        assert_eq!(forced, [15, 6]);
        assert!(
            w.predict(&forced).0 < w.predict(&[15, 0]).0,
            "the output on the slow device costs 39 layers' more there"
        );
        // Free to leave layers on the CPU: the 15 on the fast device and the rest (the output too) on the CPU
        // beat sending the output to the slow device.
        assert_eq!(w.best(&[15, 21], 21, None, Objective::Tg, (512, 128)), Some(vec![15, 0]));
    }

    #[test]
    fn the_objective_weighs_the_slopes() {
        // A device that speeds up the prompt but slows generation.
        let cpu = (Some(20.0), Some(200.0));
        let probe = Probe { layers: 10, tg_ts: Some(10.0), pp_ts: Some(250.0) };
        let w = SpeedModel::fit(cpu.0, cpu.1, &[probe]).unwrap();
        assert_eq!(w.best(&[20], 20, None, Objective::Tg, (512, 128)), Some(vec![0]));
        assert_eq!(w.best(&[20], 20, None, Objective::Pp, (512, 128)), Some(vec![20]));
        // A request of 4096 prompt tokens and 16 generated: the prompt's saving wins.
        assert_eq!(w.best(&[20], 20, None, Objective::Mixed, (4096, 16)), Some(vec![20]));
        assert_eq!(w.best(&[20], 20, None, Objective::Mixed, (16, 512)), Some(vec![0]));
    }
}
