//! Each device's share in bytes and its capacity under its cap, from two
//! dry runs (cost per layer, fixed cost), and the splits a user would try
//! (in proportion, filled in an order). Pure.

#[allow(clippy::wildcard_imports)]
use super::*;

/// Bytes per buffer type, in the devices' order (0 where a device has none).
pub(super) fn in_device_order(by: &[(String, u64)], devs: &[DeviceCap]) -> Vec<u64> {
    devs.iter().map(|d| by.iter().find(|(n, _)| *n == d.buffer_type).map_or(0, |(_, b)| *b)).collect()
}

/// Bytes a prediction puts on each device, in the devices' order.
#[must_use]
pub fn per_device(p: &Prediction, devs: &[DeviceCap]) -> Vec<u64> {
    in_device_order(&p.per_device(), devs)
}

pub(super) fn fits(bytes: &[u64], devs: &[DeviceCap]) -> bool {
    bytes.iter().zip(devs).all(|(b, d)| *b <= d.cap_bytes)
}

/// Whether bytes by buffer type stay under every cap: per device, or on
/// llama.cpp's meta device (split mode tensor, which does not say its bytes
/// per device) the whole under the caps of the devices `split` uses.
pub(super) fn under_caps(by_type: &[(String, u64)], split: &Split, devs: &[DeviceCap]) -> bool {
    if by_type.iter().any(|(n, _)| n.starts_with("Meta")) {
        let total: u64 = by_type.iter().map(|(_, b)| *b).sum();
        let used = split.layers().into_iter().zip(devs).filter(|(l, _)| *l > 0);
        total <= used.map(|(_, d)| d.cap_bytes).sum::<u64>()
    } else {
        fits(&in_device_order(by_type, devs), devs)
    }
}

/// `total` layers spread over `weights` (largest remainder), each at most its weight.
#[must_use]
pub fn proportional(total: u32, weights: &[u32]) -> Vec<u32> {
    let sum: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<f64> = weights.iter().map(|w| f64::from(*w) * f64::from(total) / sum as f64).collect();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let mut out: Vec<u32> = exact.iter().map(|e| e.floor() as u32).collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|a, b| (exact[*b] - exact[*b].floor()).total_cmp(&(exact[*a] - exact[*a].floor())));
    let mut left = total.saturating_sub(out.iter().sum());
    for i in order.into_iter().cycle().take(weights.len() * 2) {
        if left == 0 {
            break;
        }
        if out[i] < weights[i] {
            out[i] += 1;
            left -= 1;
        }
    }
    out
}

/// Devices filled to their capacity one after another in `order`.
#[must_use]
pub fn fill(total: u32, capacity: &[u32], order: &[usize]) -> Vec<u32> {
    let mut out = vec![0; capacity.len()];
    let mut left = total;
    for &i in order {
        out[i] = capacity[i].min(left);
        left -= out[i];
    }
    out
}

/// What a device's share costs: weights and KV cache per layer, plus a
/// fixed part (compute buffer, the output layer on the last device) that
/// differs between full offload and partial offload (where llama.cpp's
/// compute buffers are laid out differently).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceCost {
    pub per_layer: f64,
    pub fixed_full: f64,
    pub fixed_partial: f64,
}

impl DeviceCost {
    /// Layers that fit under `cap` in one regime.
    #[must_use]
    pub fn capacity(&self, cap: u64, full_offload: bool, most: u32) -> u32 {
        let fixed = if full_offload { self.fixed_full } else { self.fixed_partial };
        #[allow(clippy::cast_precision_loss)]
        let room = cap as f64 - fixed;
        if self.per_layer <= 0.0 {
            return if room >= 0.0 { most } else { 0 };
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = (room / self.per_layer).floor().clamp(0.0, f64::from(most)) as u32;
        n
    }

    /// Layers to take off to save `over` bytes.
    #[must_use]
    pub fn layers_for(&self, over: u64) -> u32 {
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = if self.per_layer > 0.0 { (over as f64 / self.per_layer).ceil() as u32 } else { 1 };
        n.max(1)
    }
}

/// Bytes per device as (weights + KV cache, compute buffers).
#[must_use]
pub fn parts(p: &Prediction, devs: &[DeviceCap]) -> Vec<(u64, u64)> {
    devs.iter()
        .map(|d| {
            p.buffers
                .iter()
                .filter(|b| b.buffer_type == d.buffer_type)
                .fold((0, 0), |(w, c), b| (w + b.model + b.context, c + b.compute))
        })
        .collect()
}

/// Each device's cost from two dry runs: `a` at full offload and `b` at
/// partial offload, with different layer counts on every device.
#[must_use]
pub fn costs(a: (&[u32], &[(u64, u64)]), b: (&[u32], &[(u64, u64)])) -> Vec<DeviceCost> {
    (0..a.0.len())
        .map(|d| {
            let (la, lb) = (f64::from(a.0[d]), f64::from(b.0[d]));
            #[allow(clippy::cast_precision_loss)]
            let (wa, ca, wb, cb) = (a.1[d].0 as f64, a.1[d].1 as f64, b.1[d].0 as f64, b.1[d].1 as f64);
            let per_layer = if (la - lb).abs() > 0.0 { ((wa - wb) / (la - lb)).max(0.0) } else { 0.0 };
            DeviceCost { per_layer, fixed_full: wa + ca - la * per_layer, fixed_partial: wb + cb - lb * per_layer }
        })
        .collect()
}

/// Each device's cost, and its capacity at full and at partial offload.
pub(super) type Capacities = (Vec<DeviceCost>, Vec<u32>, Vec<u32>);

/// Each device's cost and its capacity in layers under its cap, at full
/// and at partial offload, from two dry runs (every device an even share,
/// and half that); `Err` says why the dry run gave no answer.
pub(in crate::tune) fn capacities(
    predict: &mut dyn FnMut(&[Split]) -> Vec<Prediction>,
    devs: &[DeviceCap],
    full: u32,
) -> Result<Capacities, String> {
    let even = proportional(full, &vec![full; devs.len()]);
    let half: Vec<u32> = even.iter().map(|l| l / 2).collect();
    let dry = predict(&[Split::new(&even), Split::new(&half)]);
    if dry.len() < 2 || dry.iter().any(|p| p.error.is_some()) {
        return Err(dry.iter().find_map(|p| p.error.clone()).unwrap_or_else(|| "no answer".into()));
    }
    let cost = costs((&even, &parts(&dry[0], devs)), (&half, &parts(&dry[1], devs)));
    let cap_at =
        |f: bool| -> Vec<u32> { cost.iter().zip(devs).map(|(c, d)| c.capacity(d.cap_bytes, f, full)).collect() };
    let (full_cap, partial_cap) = (cap_at(true), cap_at(false));
    Ok((cost, full_cap, partial_cap))
}
