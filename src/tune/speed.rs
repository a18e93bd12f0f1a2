//! Several devices by speed, not only by memory. A split's time per token
//! is linear in the layers each device holds (the model the search fits
//! for one device): the CPU's time with every layer there, plus each
//! device's cost per layer (negative: faster than the CPU) times its
//! layers. llama.cpp offloads the output layer first (ngl 1 is the output
//! alone) and runs it on the last device that holds layers, so that device
//! holds the output and its other layers; the output does the work of
//! `output_layers` repeating layers (its weights over a layer's). Each
//! boundary between two devices with layers (activations crossing from
//! one to the next: a PCIe hop, an RPC round trip) costs the crossing
//! cost.
//!
//! The devices' costs are solved (least squares) from measured splits
//! (`tune::split` chooses them: one probe per device, that device alone,
//! and llama.cpp's default split, which the search measured, for one
//! device more). What the devices' costs do not explain in multi-device
//! splits measured besides, per boundary, is the crossing cost.
//!
//! From those costs the fastest split under every device's capacity: for
//! each choice of the device that runs the output (the last in the
//! `--device` order that holds layers), the cheapest device per layer
//! first. A device slower than the CPU gets layers only where the layer
//! count is fixed (`--ngl`) and the faster ones cannot hold them.

use crate::placement::Split;
use crate::types::Scoring;

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

/// The CPU's time per token (every layer there), each device's costs, and
/// what one boundary between two devices costs (ms per token).
#[derive(Debug, Clone, PartialEq)]
pub struct SpeedModel {
    /// The time per token with every layer on the CPU; 0 where the costs
    /// are absolute (every split compared offloads every layer).
    pub cpu_tg_ms: f64,
    pub cpu_pp_ms: f64,
    /// Whether the prompt's rates were measured on every side.
    pub has_pp: bool,
    pub devices: Vec<DeviceSpeed>,
    /// Whether a device's costs rest on a measurement (none: it held no
    /// layers in any; it is given none by [`SpeedModel::best`]).
    pub known: Vec<bool>,
    /// What a boundary between two devices costs beyond their links.
    pub crossing_tg_ms: f64,
    pub crossing_pp_ms: f64,
    /// Each device's link, where it has one (empty: local devices).
    pub links: Vec<Link>,
}

/// What a device's link adds to a token wherever the device holds layers
/// (an RPC server's: round trips and bandwidth; zero for a local device):
/// the activations there and back (ms per generated token, per prompt
/// token), and the logits back where it runs the output (ms per generated
/// token).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Link {
    pub tg_ms: f64,
    pub pp_ms: f64,
    pub logits_ms: f64,
}

/// A split as measured (tokens/s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub split: Split,
    pub tg_ts: f64,
    pub pp_ts: Option<f64>,
}

/// A rate (tokens/s) as milliseconds per token.
fn ms(ts: f64) -> f64 {
    1000.0 / ts
}

/// Least squares: `x` minimizing |A x - b| over the columns that are not
/// all zero (the others 0), by the normal equations and Gaussian
/// elimination with partial pivoting; `None` when they do not pin `x`.
fn least_squares(rows: &[(Vec<f64>, f64)], n: usize) -> Option<Vec<f64>> {
    let used: Vec<usize> = (0..n).filter(|j| rows.iter().any(|(a, _)| a[*j].abs() > 0.0)).collect();
    let m = used.len();
    if m == 0 || rows.len() < m {
        return (m == 0).then(|| vec![0.0; n]);
    }
    // The normal equations A^T A x = A^T b, augmented.
    let mut g = vec![vec![0.0; m + 1]; m];
    for (a, b) in rows {
        for (i, &ji) in used.iter().enumerate() {
            for (k, &jk) in used.iter().enumerate() {
                g[i][k] += a[ji] * a[jk];
            }
            g[i][m] += a[ji] * b;
        }
    }
    for c in 0..m {
        let p = (c..m).max_by(|x, y| g[*x][c].abs().total_cmp(&g[*y][c].abs()))?;
        if g[p][c].abs() < 1e-9 {
            return None;
        }
        g.swap(c, p);
        let pivot = g[c].clone();
        for (r, row) in g.iter_mut().enumerate() {
            if r != c {
                let f = row[c] / pivot[c];
                for (x, p) in row.iter_mut().zip(&pivot).skip(c) {
                    *x -= f * p;
                }
            }
        }
    }
    let mut x = vec![0.0; n];
    for (i, &j) in used.iter().enumerate() {
        x[j] = g[i][m] / g[i][i];
    }
    Some(x)
}

impl SpeedModel {
    /// Each device's cost per layer from measured splits (least squares),
    /// against the all-CPU rates, for `n` devices, the output counted as
    /// `output_layers` of its device's layers, each device's link taken off
    /// first ([`SpeedModel::solve_from`]). `None` without the CPU's tg rate,
    /// or where the splits do not pin every device that holds layers in them.
    #[must_use]
    pub fn solve(
        (cpu_tg_ts, cpu_pp_ts): (Option<f64>, Option<f64>),
        measured: &[Measured],
        shape: (usize, f64),
        links: &[Link],
    ) -> Option<SpeedModel> {
        let t0 = ms(cpu_tg_ts.filter(|v| *v > 0.0)?);
        Self::solve_from(t0, cpu_pp_ts.filter(|v| *v > 0.0).map(ms), measured, shape, links)
    }

    /// As [`SpeedModel::solve`], from the all-CPU times per token (ms; 0:
    /// absolute costs, for splits that all offload every layer, where the
    /// CPU's share is the same in each), for `n` devices, the output's work
    /// `output_layers`, each device's link (none: local devices): what the
    /// links add to each measured split is taken off before the solve and
    /// added to each prediction.
    #[must_use]
    pub fn solve_from(
        t0: f64,
        p0: Option<f64>,
        measured: &[Measured],
        (n, output_layers): (usize, f64),
        links: &[Link],
    ) -> Option<SpeedModel> {
        let w = output_layers.max(0.0);
        let linked = |x: &Split, pp: bool| Self::link_time(links, x, pp);
        let coefs = |x: &Split| -> Vec<f64> {
            let l = x.layers();
            let out = x.output_device();
            (0..n)
                .map(|d| f64::from(l.get(d).copied().unwrap_or(0)) + if out == Some(d) { w - 1.0 } else { 0.0 })
                .collect()
        };
        let tg_rows: Vec<(Vec<f64>, f64)> =
            measured.iter().map(|m| (coefs(&m.split), ms(m.tg_ts) - t0 - linked(&m.split, false))).collect();
        let tg = least_squares(&tg_rows, n)?;
        let pp = p0.and_then(|p0| {
            let rows: Vec<(Vec<f64>, f64)> = measured
                .iter()
                .map(|m| Some((coefs(&m.split), ms(m.pp_ts.filter(|v| *v > 0.0)?) - p0 - linked(&m.split, true))))
                .collect::<Option<_>>()?;
            least_squares(&rows, n)
        });
        let devices = (0..n)
            .map(|d| {
                let p = pp.as_ref().map_or(0.0, |v| v[d]);
                DeviceSpeed { tg_ms_per_layer: tg[d], pp_ms_per_layer: p, tg_ms_output: tg[d] * w, pp_ms_output: p * w }
            })
            .collect();
        let known = (0..n).map(|d| tg_rows.iter().any(|(a, _)| a[d] > 0.0)).collect();
        Some(SpeedModel {
            cpu_tg_ms: t0,
            cpu_pp_ms: p0.filter(|_| pp.is_some()).unwrap_or(0.0),
            has_pp: pp.is_some(),
            devices,
            known,
            crossing_tg_ms: 0.0,
            crossing_pp_ms: 0.0,
            links: links.to_vec(),
        })
    }

    /// What the links add to a split's token: each device with layers its
    /// activations' way there and back, the output's device its logits.
    fn link_time(links: &[Link], split: &Split, pp: bool) -> f64 {
        let out = split.output_device();
        let layers = split.layers();
        links
            .iter()
            .enumerate()
            .filter(|(d, _)| layers.get(*d).is_some_and(|k| *k > 0))
            .map(|(d, l)| if pp { l.pp_ms } else { l.tg_ms + if out == Some(d) { l.logits_ms } else { 0.0 } })
            .sum()
    }

    /// Boundaries between devices in a split: devices with layers, less one.
    fn crossings(split: &Split) -> f64 {
        f64::from(u32::try_from(split.layers().iter().filter(|k| **k > 0).count()).unwrap_or(0).saturating_sub(1))
    }

    /// Predicted time per token (ms) of a split, tg or pp, without the crossings.
    fn time_without(&self, split: &Split, pp: bool) -> f64 {
        let layers = split.layers();
        let out = split.output_device();
        let mut t = if pp { self.cpu_pp_ms } else { self.cpu_tg_ms } + Self::link_time(&self.links, split, pp);
        for (i, (d, k)) in self.devices.iter().zip(&layers).enumerate() {
            let (c, o) = if pp { (d.pp_ms_per_layer, d.pp_ms_output) } else { (d.tg_ms_per_layer, d.tg_ms_output) };
            // The output, one of its device's layers, costs its own there.
            t += f64::from(*k) * c + if out == Some(i) { o - c } else { 0.0 };
        }
        t
    }

    /// Predicted rates (tg, pp in tokens/s) of a split.
    #[must_use]
    pub fn predict(&self, split: &Split) -> (f64, Option<f64>) {
        self.rates_with(split, (0.0, 0.0))
    }

    /// The rates of a split whose token takes `extra` ms (tg, pp) more than
    /// its devices, links and boundaries say.
    fn rates_with(&self, split: &Split, extra: (f64, f64)) -> (f64, Option<f64>) {
        let x = Self::crossings(split);
        let tg = self.time_without(split, false) + x * self.crossing_tg_ms + extra.0;
        let pp = self.has_pp.then(|| self.time_without(split, true) + x * self.crossing_pp_ms + extra.1);
        (1000.0 / tg.max(1e-6), pp.map(|p| 1000.0 / p.max(1e-6)))
    }

    /// The crossing costs from measured splits: what the devices alone do
    /// not explain, per boundary, averaged over the splits that cross one;
    /// never below zero (a boundary does not save time).
    pub fn fit_crossings(&mut self, measured: &[Measured]) {
        let fit = |pp: bool| {
            let v: Vec<f64> = measured
                .iter()
                .filter(|m| Self::crossings(&m.split) > 0.0)
                .filter_map(|m| {
                    let ts = if pp { m.pp_ts? } else { m.tg_ts };
                    Some((1000.0 / ts - self.time_without(&m.split, pp)) / Self::crossings(&m.split))
                })
                .collect();
            (!v.is_empty()).then(|| crate::stats::mean(&v).max(0.0))
        };
        let (tg, pp) = (fit(false), fit(true).filter(|_| self.has_pp));
        if let Some(c) = tg {
            self.crossing_tg_ms = c;
        }
        if let Some(c) = pp {
            self.crossing_pp_ms = c;
        }
    }

    /// The known device whose layers cost least for the objective.
    #[must_use]
    pub fn fastest(&self, scoring: Scoring) -> Option<usize> {
        let cost = self.layer_cost(scoring);
        (0..cost.len()).filter(|d| self.known[*d]).min_by(|a, b| cost[*a].total_cmp(&cost[*b]))
    }

    /// Predicted rates (tg, pp) of a split whose device `d` keeps the FFN
    /// weights of `k` of its layers on the CPU (`-ot`): each such layer
    /// gives up the FFN's `share` of what the device saves against the CPU
    /// (`cpu_layer_ms`: the CPU's own time per layer, tg and pp, where the
    /// costs are absolute; 0 where they are relative to the CPU) and sends
    /// its activations to the CPU and back: two boundaries, each at least
    /// what a crossing of the device's link costs.
    #[must_use]
    pub fn predict_spilled(
        &self,
        split: &Split,
        (d, k, share): (usize, u32, f64),
        cpu_layer_ms: (f64, f64),
    ) -> (f64, Option<f64>) {
        let dev = self.devices[d];
        let link = self.links.get(d).copied().unwrap_or_default();
        let k = f64::from(k);
        let tg = k * (share * (cpu_layer_ms.0 - dev.tg_ms_per_layer) + (2.0 * self.crossing_tg_ms).max(link.tg_ms));
        let pp = k * (share * (cpu_layer_ms.1 - dev.pp_ms_per_layer) + (2.0 * self.crossing_pp_ms).max(link.pp_ms));
        self.rates_with(split, (tg, pp))
    }

    /// What a layer on each device costs for the objective: ms per token
    /// (tg, pp), or per request of `n_prompt` + `n_gen` tokens (mixed).
    fn layer_cost(&self, scoring: Scoring) -> Vec<f64> {
        self.devices.iter().map(|d| scoring.layer_cost(d.tg_ms_per_layer, d.pp_ms_per_layer)).collect()
    }

    /// The fastest split under each device's `capacity`, by the model's
    /// prediction over one fill per choice of the device that runs the
    /// output (it goes last in the `--device` order; llama.cpp's order is
    /// kept where it already puts that device last among those with
    /// layers): with `ngl` fixed, exactly that many layers on the devices,
    /// cheapest first (`None` when they cannot hold them); else the devices
    /// faster than the CPU filled, cheapest first, up to `full` layers, or
    /// every layer on the CPU where that is fastest.
    #[must_use]
    pub fn best(&self, capacity: &[u32], full: u32, ngl: Option<u32>, scoring: Scoring) -> Option<Split> {
        let cost = self.layer_cost(scoring);
        let n = cost.len();
        let cap = |i: usize| if self.known[i] { capacity.get(i).copied().unwrap_or(0) } else { 0 };
        // `target` layers, `last` given one layer before the rest, then the
        // cheapest first; without `must`, only devices that beat the CPU.
        let fill = |target: u32, last: usize, must: bool| -> Option<Split> {
            let mut out = vec![0u32; n];
            if cap(last) == 0 || target == 0 {
                return None;
            }
            out[last] = 1;
            let mut left = target - 1;
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|a, b| cost[*a].total_cmp(&cost[*b]));
            for i in order {
                if left == 0 || (!must && cost[i] >= 0.0) {
                    break;
                }
                let more = cap(i).saturating_sub(out[i]).min(left);
                out[i] += more;
                left -= more;
            }
            if must && left > 0 {
                return None;
            }
            // `last` runs the output: the devices after it in llama.cpp's
            // order that hold layers go before it.
            let in_order = out[last + 1..].iter().all(|k| *k == 0);
            let order: Vec<usize> =
                if in_order { (0..n).collect() } else { (0..n).filter(|i| *i != last).chain([last]).collect() };
            Some(Split::ordered(&out, &order))
        };
        let score = |x: &Split| {
            let (tg, pp) = self.predict(x);
            scoring.speeds(Some(tg), pp).unwrap_or(0.0)
        };
        let target = ngl.unwrap_or(full).min(full);
        let must = ngl.is_some();
        let mut choices: Vec<Split> = (0..n).filter_map(|last| fill(target, last, must)).collect();
        if !must || target == 0 {
            choices.push(Split::new(&vec![0; n]));
        }
        choices.into_iter().max_by(|a, b| score(a).total_cmp(&score(b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Objective;

    /// tg at llama-bench's test sizes.
    const TG: Scoring = Scoring { objective: Objective::Tg, n_prompt: 512, n_gen: 128 };

    fn split(layers: &[u32]) -> Split {
        Split::new(layers)
    }

    fn at(layers: &[u32], ms: f64) -> Measured {
        Measured { split: split(layers), tg_ts: 1000.0 / ms, pp_ts: None }
    }

    /// The fake world: the CPU at 20 t/s for a 20-layer model, a fast GPU
    /// (a layer there saves 2 ms a token), a slow one behind a slow link
    /// (each layer there costs 3 ms more than on the CPU).
    fn world() -> SpeedModel {
        // 10 layers (the output one of them) on the fast GPU: 50 - 20 = 30 ms a token; on the slow one: 50 + 30 = 80 ms.
        let fast = Measured { pp_ts: Some(1000.0 / 2.0), ..at(&[0, 10], 30.0) };
        let slow = Measured { pp_ts: Some(1000.0 / 8.0), ..at(&[10, 0], 80.0) };
        SpeedModel::solve((Some(20.0), Some(200.0)), &[slow, fast], (2, 1.0), &[]).unwrap()
    }

    #[test]
    fn a_devices_slope_is_its_probe_against_the_cpu_and_predicts_other_splits() {
        let w = world();
        assert!((w.devices[0].tg_ms_per_layer - 3.0).abs() < 1e-9 && (w.devices[1].tg_ms_per_layer + 2.0).abs() < 1e-9);
        // 20 layers on the fast GPU: 50 - 40 = 10 ms a token.
        assert!((w.predict(&split(&[0, 20])).0 - 100.0).abs() < 1e-6);
        // 5 on the slow one, 15 on the fast one: 50 + 15 - 30 = 35 ms.
        assert!((w.predict(&split(&[5, 15])).0 - 1000.0 / 35.0).abs() < 1e-6);
        assert!(SpeedModel::solve((None, None), &[at(&[0, 10], 30.0)], (2, 1.0), &[]).is_none(), "no CPU rate");
        assert!(SpeedModel::solve((Some(20.0), None), &[], (2, 1.0), &[])
            .unwrap()
            .devices
            .iter()
            .all(|d| d.tg_ms_per_layer == 0.0));
    }

    #[test]
    fn a_links_cost_per_token_is_taken_off_before_the_solve_and_added_to_each_prediction() {
        // D0 behind a link: 4 ms a token for the activations, 1 ms for the
        // logits (it runs the output); a layer there saves 2 ms. Its probe,
        // 10 layers: 50 - 20 + 5 = 35 ms a token.
        let link = Link { tg_ms: 4.0, pp_ms: 0.0, logits_ms: 1.0 };
        let probe = at(&[10, 0], 35.0);
        let w = SpeedModel::solve_from(50.0, None, &[probe], (2, 1.0), &[link, Link::default()]).unwrap();
        assert!((w.devices[0].tg_ms_per_layer + 2.0).abs() < 1e-9, "{:?}", w.devices);
        // 20 layers there: 50 - 40 + 5 = 15 ms, where a model blind to the
        // link (its 5 ms spread over the probe's 10 layers) says 20.
        assert!((w.predict(&split(&[20, 0])).0 - 1000.0 / 15.0).abs() < 1e-6);
        let blind = SpeedModel::solve_from(50.0, None, &[probe], (2, 1.0), &[]).unwrap();
        assert!((blind.predict(&split(&[20, 0])).0 - 1000.0 / 20.0).abs() < 1e-6);
        // FFN spill there: each spilled layer gives 0.6 of its 2 ms back and
        // crosses the link twice more (4 ms): 15 + 4 x 5.2 = 35.8 ms.
        let spilled = w.predict_spilled(&split(&[20, 0]), (0, 4, 0.6), (0.0, 0.0));
        assert!((spilled.0 - 1000.0 / 35.8).abs() < 1e-6, "{spilled:?}");
    }

    #[test]
    fn the_slow_device_is_left_out_when_that_is_faster() {
        let w = world();
        // The fast GPU holds everything: the slow one gets nothing, whatever its memory.
        assert_eq!(w.best(&[20, 21], 21, None, TG), Some(split(&[0, 21])));
        // The fast GPU holds 12: the rest stays on the CPU, not on the slower device.
        assert_eq!(w.best(&[20, 12], 21, None, TG), Some(split(&[0, 12])));
    }

    #[test]
    fn the_slow_device_is_kept_when_its_memory_is_needed() {
        let w = world();
        // Every layer must be offloaded (--ngl 21): the fast GPU takes 12, the slow one the other 9.
        assert_eq!(w.best(&[20, 12], 21, Some(21), TG), Some(split(&[9, 12])));
        // More layers than both hold: no such split.
        assert_eq!(w.best(&[5, 12], 21, Some(21), TG), None);
    }

    #[test]
    fn the_order_puts_the_fast_device_where_the_output_runs() {
        // In llama.cpp's order the slow device comes last: any layer on it
        // brings the output layer (here the work of 40 layers) there too.
        let w =
            SpeedModel::solve((Some(20.0), None), &[at(&[10, 0], 30.0), at(&[0, 10], 80.0)], (2, 40.0), &[]).unwrap();
        // The fast device holds every layer: the slow one gets none, no order needed.
        let all = w.best(&[21, 21], 21, Some(21), TG).unwrap();
        assert_eq!((all.layers(), all.in_llama_order()), (vec![21, 0], true));
        // It holds 15: the slow one must take 6; listed first (--device slow,fast), it
        // takes the first layers and the fast device runs the output.
        let forced = w.best(&[15, 21], 21, Some(21), TG).unwrap();
        assert_eq!((forced.layers(), forced.order(), forced.listed()), (vec![15, 6], vec![1, 0], vec![6, 15]));
        assert_eq!(forced.output_device(), Some(0));
        let names = ["FAST".to_string(), "SLOW".to_string()];
        assert_eq!(forced.device_names(&names), ["SLOW", "FAST"]);
        let llama_order = split(&[15, 6]);
        assert_eq!(llama_order.output_device(), Some(1));
        // The output (40 layers' work) on the slow device instead of the fast one:
        // 39 layers' difference between the two devices more.
        let (reordered, as_listed) = (w.predict(&forced).0, w.predict(&llama_order).0);
        let per = |d: usize| w.devices[d].tg_ms_per_layer;
        assert!(
            (1000.0 / as_listed - 1000.0 / reordered - 39.0 * (per(1) - per(0))).abs() < 1e-6,
            "{reordered} {as_listed}"
        );
        assert!(reordered > 2.0 * as_listed);
    }

    /// CPU 50 ms a token; device 0 costs 3 ms a layer more and its output
    /// `out0` ms (400: a large vocabulary on a slow device, not its
    /// weight's share; 6: its share); device 1 saves 2 ms a layer, its
    /// output counting as 2 layers; `boundary` ms per boundary between the two.
    fn truth(l: &[u32], boundary: f64, out0: f64) -> f64 {
        let both = l[0] > 0 && l[1] > 0;
        let out = if l[1] > 0 {
            -4.0 + 2.0
        } else if l[0] > 0 {
            out0 - 3.0
        } else {
            0.0
        };
        50.0 + 3.0 * f64::from(l[0]) - 2.0 * f64::from(l[1]) + out + if both { boundary } else { 0.0 }
    }

    fn measured(l: &[u32], boundary: f64) -> Measured {
        at(l, truth(l, boundary, 400.0))
    }

    #[test]
    fn a_probe_beside_the_defaults_output_device_gives_a_devices_layers_without_its_output() {
        // llama.cpp's default split (8 and 12, the output on device 1) and a
        // probe of device 0 with the output alone on device 1 (17 + 1).
        let equations = [measured(&[8, 12], 0.0), measured(&[17, 1], 0.0)];
        let w = SpeedModel::solve((Some(20.0), None), &equations, (2, 2.0), &[]).unwrap();
        assert!((w.devices[0].tg_ms_per_layer - 3.0).abs() < 1e-9, "{w:?}");
        assert!((w.devices[1].tg_ms_per_layer + 2.0).abs() < 1e-9, "{w:?}");
        for l in [[10, 9], [3, 16], [0, 19]] {
            assert!((1000.0 / w.predict(&split(&l)).0 - truth(&l, 0.0, 400.0)).abs() < 1e-6, "{l:?}");
        }
        // Device 0 probed alone holds its own dear output: its layers then look 20 times dearer.
        let alone =
            SpeedModel::solve((Some(20.0), None), &[measured(&[8, 12], 0.0), measured(&[18, 0], 0.0)], (2, 2.0), &[])
                .unwrap();
        assert!(alone.devices[0].tg_ms_per_layer > 20.0, "{alone:?}");
    }

    #[test]
    fn a_boundary_costs_what_the_devices_alone_do_not_explain() {
        let m = |l: &[u32], boundary: f64| at(l, truth(l, boundary, 6.0));
        let mut w =
            SpeedModel::solve((Some(20.0), None), &[m(&[10, 0], 4.0), m(&[0, 10], 4.0)], (2, 2.0), &[]).unwrap();
        let other = split(&[4, 16]);
        assert!((1000.0 / w.predict(&other).0 - (truth(&[4, 16], 4.0, 6.0) - 4.0)).abs() < 1e-6, "the devices alone");
        w.fit_crossings(&[m(&[8, 12], 4.0), m(&[12, 8], 4.0)]);
        assert!((w.crossing_tg_ms - 4.0).abs() < 1e-9, "{w:?}");
        assert!((1000.0 / w.predict(&other).0 - truth(&[4, 16], 4.0, 6.0)).abs() < 1e-6);
        assert!((1000.0 / w.predict(&split(&[0, 20])).0 - truth(&[0, 20], 4.0, 6.0)).abs() < 1e-6, "one device: none");
        // A split faster than its devices explain does not make a boundary save time.
        w.fit_crossings(&[m(&[8, 12], -3.0)]);
        assert!(w.crossing_tg_ms.abs() < 1e-12);
    }

    #[test]
    fn the_objective_weighs_the_slopes() {
        // A device that speeds up the prompt but slows generation.
        let probe = Measured { split: split(&[10]), tg_ts: 10.0, pp_ts: Some(250.0) };
        let w = SpeedModel::solve((Some(20.0), Some(200.0)), &[probe], (1, 1.0), &[]).unwrap();
        assert_eq!(w.best(&[20], 20, None, TG), Some(split(&[0])));
        assert_eq!(
            w.best(&[20], 20, None, Scoring { objective: Objective::Pp, n_prompt: 512, n_gen: 128 }),
            Some(split(&[20]))
        );
        // A request of 4096 prompt tokens and 16 generated: the prompt's saving wins.
        assert_eq!(
            w.best(&[20], 20, None, Scoring { objective: Objective::Mixed, n_prompt: 4096, n_gen: 16 }),
            Some(split(&[20]))
        );
        assert_eq!(
            w.best(&[20], 20, None, Scoring { objective: Objective::Mixed, n_prompt: 16, n_gen: 512 }),
            Some(split(&[0]))
        );
    }
}
