//! Several devices by speed, not only by memory. Each device's cost comes
//! from trials with some layers on that device alone (the rest on the CPU)
//! against the trial with every layer on the CPU: time per token is linear
//! in the layers a device holds (the model the search fits for one
//! device). llama.cpp offloads the output layer first (ngl 1 is the output
//! alone) and runs it on the last device that holds layers, so a probe of
//! k layers holds the output and k - 1 repeating layers: two probes of a
//! device give its cost per repeating layer (their difference) and what
//! the output costs there (the rest, with the crossing into the device and
//! back). One probe alone takes the output as `output_layers` layers (its
//! weights over a layer's). A split's time is the CPU's plus each device's
//! layers times its cost, the output's cost on its last device in place of
//! one of its layers.
//!
//! From those costs the fastest split under every device's capacity: for
//! each choice of the last device (it holds the output), the cheapest
//! device per layer first. A device slower than the CPU gets layers only
//! where the layer count is fixed (`--ngl`) and the faster devices cannot
//! hold them.

use crate::types::Objective;

/// One device's change to the time per token against the CPU (negative:
/// faster), in milliseconds: per repeating layer it holds, and for the
/// output layer where it runs there; for tg and pp.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceSpeed {
    pub tg_ms_per_layer: f64,
    pub pp_ms_per_layer: f64,
    pub tg_ms_output: f64,
    pub pp_ms_output: f64,
}

/// The CPU's time per token (every layer there) and each device's costs.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeedModel {
    pub cpu_tg_ms: f64,
    pub cpu_pp_ms: f64,
    pub devices: Vec<DeviceSpeed>,
}

/// A rate (tokens/s) as milliseconds per token.
fn ms(ts: f64) -> f64 {
    1000.0 / ts
}

/// A probe: `layers` on one device alone (the output one of them),
/// measured at these rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    pub layers: u32,
    pub tg_ts: Option<f64>,
    pub pp_ts: Option<f64>,
}

/// Per-layer and output cost from a device's probes (`t` in ms per token
/// of each, against `t0` all on the CPU).
fn costs_of(points: &[(u32, f64)], t0: f64, w: f64) -> (f64, f64) {
    match points {
        [] => (0.0, 0.0),
        [(k, t)] => {
            let per = (t - t0) / (f64::from(*k) - 1.0 + w).max(1e-9);
            (per, per * w)
        }
        [(k1, t1), (k2, t2), ..] => {
            let per = (t2 - t1) / (f64::from(*k2) - f64::from(*k1));
            (per, t1 - t0 - (f64::from(*k1) - 1.0) * per)
        }
    }
}

impl SpeedModel {
    /// The model from the all-CPU rates and each device's probes (in the
    /// devices' order; two of different layer counts, or one, or none for
    /// a device that holds no layer), for a model whose output layer does
    /// the work of `output_layers` repeating ones (used with one probe).
    /// `None` when the CPU's tg rate or a probe's is missing.
    #[must_use]
    pub fn fit(
        cpu_tg_ts: Option<f64>,
        cpu_pp_ts: Option<f64>,
        probes: &[Vec<Probe>],
        output_layers: f64,
    ) -> Option<SpeedModel> {
        let w = output_layers.max(0.0);
        let (t0, p0) = (ms(cpu_tg_ts.filter(|v| *v > 0.0)?), cpu_pp_ts.filter(|v| *v > 0.0).map(ms));
        let devices = probes
            .iter()
            .map(|ps| {
                let mut ps: Vec<&Probe> = ps.iter().filter(|p| p.layers > 0).collect();
                ps.sort_by_key(|p| p.layers);
                ps.dedup_by_key(|p| p.layers);
                let tg: Vec<(u32, f64)> =
                    ps.iter().map(|p| Some((p.layers, ms(p.tg_ts.filter(|v| *v > 0.0)?)))).collect::<Option<_>>()?;
                let pp: Vec<(u32, f64)> =
                    ps.iter().filter_map(|p| Some((p.layers, ms(p.pp_ts.filter(|v| *v > 0.0)?)))).collect();
                let (tg_ms_per_layer, tg_ms_output) = costs_of(&tg, t0, w);
                let (pp_ms_per_layer, pp_ms_output) = match p0 {
                    Some(p0) if pp.len() == tg.len() => costs_of(&pp, p0, w),
                    _ => (0.0, 0.0),
                };
                Some(DeviceSpeed { tg_ms_per_layer, pp_ms_per_layer, tg_ms_output, pp_ms_output })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(SpeedModel { cpu_tg_ms: t0, cpu_pp_ms: p0.unwrap_or(0.0), devices })
    }

    /// Where the output layer runs: llama.cpp offloads it first (ngl 1 is
    /// the output alone), on the last device that holds layers.
    fn output_on(split: &[u32]) -> Option<usize> {
        split.iter().rposition(|k| *k > 0)
    }

    /// Predicted rates (tg, pp in tokens/s) of a split: layers per device.
    #[must_use]
    pub fn predict(&self, split: &[u32]) -> (f64, Option<f64>) {
        let out = Self::output_on(split);
        let sum = |per: fn(&DeviceSpeed) -> f64, output: fn(&DeviceSpeed) -> f64| -> f64 {
            let layers: f64 = self.devices.iter().zip(split).map(|(d, k)| per(d) * f64::from(*k)).sum();
            // The output, one of the last device's layers, costs its own there.
            layers + out.map_or(0.0, |i| output(&self.devices[i]) - per(&self.devices[i]))
        };
        let tg = self.cpu_tg_ms + sum(|d| d.tg_ms_per_layer, |d| d.tg_ms_output);
        let pp = (self.cpu_pp_ms > 0.0).then(|| self.cpu_pp_ms + sum(|d| d.pp_ms_per_layer, |d| d.pp_ms_output));
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

    /// The fastest layers per device under each device's `capacity`, by
    /// the model's prediction over one fill per choice of the last device
    /// (it runs the output): with `ngl` fixed, exactly that many layers on
    /// the devices, cheapest first (`None` when they cannot hold them);
    /// else the devices faster than the CPU filled, cheapest first, up to
    /// `full` layers, or every layer on the CPU where that is fastest.
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
        let score = |x: &[u32]| {
            let (tg, pp) = self.predict(x);
            crate::tune::choose::score(objective, workload.0, workload.1, Some(tg), pp).unwrap_or(0.0)
        };
        // The output runs on the last device that holds layers: each choice
        // of that device is its own fill; with the count free, every layer
        // on the CPU is one more choice.
        let target = ngl.unwrap_or(full).min(full);
        let must = ngl.is_some();
        let mut choices: Vec<Vec<u32>> = (0..cost.len())
            .filter_map(|last| fill(target, &(0..=last).collect::<Vec<_>>(), Some(last), must))
            .collect();
        if !must || target == 0 {
            choices.push(vec![0; cost.len()]);
        }
        choices.into_iter().max_by(|a, b| score(a).total_cmp(&score(b)))
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
        SpeedModel::fit(cpu.tg_ts, cpu.pp_ts, &[vec![slow], vec![fast]], 1.0).unwrap()
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
        let w = SpeedModel::fit(cpu.0, cpu.1, &[vec![fast], vec![slow]], 40.0).unwrap();
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
    fn two_probes_of_a_device_give_its_layers_and_its_output_apart() {
        // A device whose output layer is dear (400 ms there), its layers cheap (2 ms):
        // 10 layers (the output and 9) 20 + 18 + 400 = 438 ms; 5 layers 20 + 8 + 400 = 428 ms.
        let p = |k, ms: f64| Probe { layers: k, tg_ts: Some(1000.0 / ms), pp_ts: None };
        let w = SpeedModel::fit(Some(50.0), None, &[vec![p(10, 438.0), p(5, 428.0)]], 1.0).unwrap();
        let d = w.devices[0];
        assert!((d.tg_ms_per_layer - 2.0).abs() < 1e-9 && (d.tg_ms_output - 400.0).abs() < 1e-6, "{d:?}");
        // 20 layers there: 20 + 19 * 2 + 400.
        assert!((1000.0 / w.predict(&[20]).0 - 458.0).abs() < 1e-6);
    }

    #[test]
    fn the_objective_weighs_the_slopes() {
        // A device that speeds up the prompt but slows generation.
        let cpu = (Some(20.0), Some(200.0));
        let probe = Probe { layers: 10, tg_ts: Some(10.0), pp_ts: Some(250.0) };
        let w = SpeedModel::fit(cpu.0, cpu.1, &[vec![probe]], 1.0).unwrap();
        assert_eq!(w.best(&[20], 20, None, Objective::Tg, (512, 128)), Some(vec![0]));
        assert_eq!(w.best(&[20], 20, None, Objective::Pp, (512, 128)), Some(vec![20]));
        // A request of 4096 prompt tokens and 16 generated: the prompt's saving wins.
        assert_eq!(w.best(&[20], 20, None, Objective::Mixed, (4096, 16)), Some(vec![20]));
        assert_eq!(w.best(&[20], 20, None, Objective::Mixed, (16, 512)), Some(vec![0]));
    }
}
