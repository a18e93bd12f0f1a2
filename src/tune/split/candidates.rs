//! The splits worth pricing: by each device's capacity (rules), by the
//! speed model (the fastest predicted), each priced exactly and trimmed
//! until it fits every cap.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The candidate splits (label, layers per device), without repeats:
/// `full_cap` is each device's capacity at full offload, `partial_cap` at
/// partial offload.
#[must_use]
pub fn candidates(full_cap: &[u32], partial_cap: &[u32], full: u32) -> Vec<(String, Vec<u32>)> {
    let n = full_cap.len();
    let mut out: Vec<(String, Vec<u32>)> = Vec::new();
    let mut add = |label: &str, split: Vec<u32>| {
        if split.iter().sum::<u32>() > 0 && !out.iter().any(|(_, s)| *s == split) {
            out.push((label.to_string(), split));
        }
    };
    if full_cap.iter().sum::<u32>() < full {
        // The output layer goes to the GPU first: the CPU keeps at least one repeating layer.
        let most = full - 1;
        let total: u32 = partial_cap.iter().sum::<u32>().min(most);
        add("every device at its capacity, the rest on the CPU", proportional(total, partial_cap));
        return out;
    }
    add("in proportion to what each device holds", proportional(full, full_cap));
    add("devices filled in llama.cpp's order", fill(full, full_cap, &(0..n).collect::<Vec<_>>()));
    add("devices filled in reverse order", fill(full, full_cap, &(0..n).rev().collect::<Vec<_>>()));
    out
}

/// The fastest splits by each device's measured speed, under the
/// capacities the costs give: every layer offloaded, and (unless `--ngl`
/// fixes the count) only the devices that beat the CPU.
pub(in crate::tune) fn speed_candidates(
    m: &SpeedModel,
    s: &Settings,
    full: u32,
    full_cap: &[u32],
    partial_cap: &[u32],
) -> Vec<Labelled> {
    let fixed = s.policy.grid.as_ref().filter(|g| g.len() == 1).map(|g| g[0].min(full));
    let mut out = Vec::new();
    match fixed {
        Some(n) if n < full => out.extend(m.best(partial_cap, full, Some(n), s.scoring())),
        Some(_) => out.extend(m.best(full_cap, full, Some(full), s.scoring())),
        None => {
            out.extend(m.best(full_cap, full, Some(full), s.scoring()));
            out.extend(m.best(partial_cap, full, None, s.scoring()));
        }
    }
    let mut v: Vec<Labelled> = Vec::new();
    for b in out {
        if b.layers().iter().sum::<u32>() > 0 && !v.iter().any(|(_, x)| *x == b) {
            let label = if b.in_llama_order() {
                "fastest by each device's measured speed".to_string()
            } else {
                "fastest by each device's measured speed, the output's device last".to_string()
            };
            v.push((label, b));
        }
    }
    v
}

/// The objective's score of predicted rates.
pub(in crate::tune) fn predicted_score(m: &SpeedModel, scoring: crate::types::Scoring, x: &Split) -> f64 {
    let (tg, pp) = m.predict(x);
    scoring.speeds(Some(tg), pp).unwrap_or(0.0)
}

/// A split as `(label, layers and order)`.
pub(in crate::tune) type Labelled = (String, Split);

/// Priced exactly; a device over its cap gives up the layers its cost
/// says it must (to the CPU), up to three times. What fits every cap.
pub(in crate::tune) fn price_all(
    mut todo: Vec<Labelled>,
    predict: &mut dyn FnMut(&[Split]) -> Vec<Prediction>,
    devs: &[DeviceCap],
    cost: &[DeviceCost],
) -> Vec<(String, Split, Prediction)> {
    let mut priced: Vec<(String, Split, Prediction)> = Vec::new();
    for _round in 0..4 {
        if todo.is_empty() {
            break;
        }
        let splits: Vec<Split> = todo.iter().map(|(_, s)| *s).collect();
        let answers = predict(&splits);
        let mut next = Vec::new();
        for ((label, split), p) in todo.into_iter().zip(answers) {
            let bytes = per_device(&p, devs);
            if p.error.is_none() && fits(&bytes, devs) {
                if !priced.iter().any(|(_, s, _)| *s == split) {
                    priced.push((label, split, p));
                }
                continue;
            }
            let mut trimmed = split.layers();
            for (d, b) in bytes.iter().enumerate() {
                if *b > devs[d].cap_bytes {
                    trimmed[d] = trimmed[d].saturating_sub(cost[d].layers_for(*b - devs[d].cap_bytes));
                }
            }
            if trimmed != split.layers() && trimmed.iter().sum::<u32>() > 0 {
                next.push((label, Split::ordered(&trimmed, &split.order())));
            }
        }
        todo = next;
    }
    priced
}
