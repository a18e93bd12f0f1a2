//! The split part of the tune report: each offload device's cap and share,
//! the splits priced and measured, llama.cpp's own fit for the same caps,
//! and the round trip to each RPC server.

use std::fmt::Write as _;

use crate::model::human_bytes;
use crate::profile::{ContextPlacement, SplitReport};

fn speed(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// A predicted rate, and how far the measurement fell from it.
fn predicted(p: Option<f64>, measured: Option<f64>) -> String {
    match (p, measured) {
        (Some(p), Some(m)) if m > 0.0 => format!("{p:.2} ({:+.0}%)", (p / m - 1.0) * 100.0),
        (Some(p), _) => format!("{p:.2}"),
        _ => "-".into(),
    }
}

/// Bytes per device as "30.5 MiB / 49.6 MiB".
fn per_device(bytes: &[u64]) -> String {
    if bytes.is_empty() {
        return "-".into();
    }
    bytes.iter().map(|b| human_bytes(*b)).collect::<Vec<_>>().join(" / ")
}

/// `ngl N, -ts a,b` in llama.cpp's device order, and where the devices
/// take layers in another order, that order (`--device`).
fn split_words(ngl: u32, ts: &[u32], order: &[u32], names: &[&str]) -> String {
    if ts.is_empty() {
        return format!("ngl {ngl}");
    }
    let mut w = format!("ngl {ngl}, -ts {}", crate::placement::split_list(ts));
    if !order.is_empty() {
        let listed: Vec<&str> = order.iter().map(|d| names.get(*d as usize).copied().unwrap_or("?")).collect();
        w += &format!(" (--device {})", listed.join(","));
    }
    w
}

/// The devices, the options and the figures of one context's split stage.
#[must_use]
pub fn split_lines(c: &ContextPlacement, r: &SplitReport) -> String {
    let mut s = String::new();
    let names: Vec<&str> = r.devices.iter().map(|d| d.device.as_str()).collect();
    let _ = writeln!(s, "split across {} devices at {} context (llama.cpp's device order):", r.devices.len(), c.n_ctx);
    let mut t = crate::table::Table::new(&[
        ("device", false),
        ("where", false),
        ("cap", true),
        ("layers", true),
        ("predicted", true),
        ("allocated", true),
    ]);
    for d in &r.devices {
        t.row(vec![
            d.device.clone(),
            d.description.clone(),
            format!("{} ({})", human_bytes(d.cap_bytes), d.cap_reason),
            d.layers.to_string(),
            d.predicted_bytes.map_or_else(|| "-".into(), human_bytes),
            d.accounted_bytes.map_or_else(|| "-".into(), human_bytes),
        ]);
    }
    s.push_str(&t.render());
    if r.options.is_empty() {
        return s;
    }
    let by_speed = r.options.iter().any(|o| o.predicted_tg_ts.is_some());
    let mut columns = vec![("split", false), ("placement", false), ("tg t/s", true)];
    if by_speed {
        columns.push(("predicted tg", true));
    }
    columns.extend([("pp t/s", true), ("memory per device", true), ("note", false)]);
    let mut t = crate::table::Table::new(&columns);
    for o in &r.options {
        let mark = if o.recommended { " <- recommended" } else { "" };
        let mem = if o.accounted_bytes.is_empty() { &o.predicted_bytes } else { &o.accounted_bytes };
        let fits = if o.fits { "" } else { " (over a cap)" };
        let mut row = vec![
            o.label.clone(),
            split_words(o.placement.n_gpu_layers, &o.tensor_split, &o.order, &names),
            speed(o.tg_ts),
        ];
        if by_speed {
            row.push(predicted(o.predicted_tg_ts, o.tg_ts));
        }
        row.extend([speed(o.pp_ts), format!("{}{fits}", per_device(mem)), format!("{}{mark}", o.note)]);
        t.row(row);
    }
    let _ = writeln!(s, "memory per device in the order {}:", names.join(" / "));
    s.push_str(&t.render());
    s += &fit_and_links(r);
    s += &against_lines(r);
    s
}

/// The recommended split against llama.cpp's, paired.
fn against_lines(r: &SplitReport) -> String {
    use crate::profile::Verdict;
    let mut s = String::new();
    for m in &r.split_modes {
        let _ = writeln!(s, "{m}");
    }
    if let Some(c) = r.crossing_tg_ms {
        let _ = writeln!(
            s,
            "a boundary between two devices costs {c:.2} ms per generated token (what the devices' own costs leave unexplained)"
        );
    }
    for a in &r.against {
        let c = &a.result;
        let figures = super::placement::ratios(c);
        let mut verdict = match c.verdict {
            Verdict::Faster if c.note.is_empty() => "faster beyond the noise".to_string(),
            Verdict::Faster => format!("faster beyond the noise; {}", c.note),
            _ => c.note.clone(),
        };
        if let Some(m) = a.tg_ts {
            verdict += &format!("; theirs tg {m:.2} t/s");
            match a.predicted_tg_ts {
                Some(p) if c.note == crate::profile::CUT_SHORT => {
                    verdict += &format!(", predicted {p:.2} (not set against a rate cut short)");
                }
                Some(p) => verdict += &format!(", predicted {}", predicted(Some(p), Some(m))),
                None => {}
            }
        }
        let _ = match c.verdict {
            Verdict::Same | Verdict::NotMeasured => {
                writeln!(s, "against {} ({}): {verdict}", a.against, c.llama_cpp_args())
            }
            _ => writeln!(
                s,
                "against {} ({}), depth {}: {} ({} alternated pairs, 95% intervals): {verdict}",
                a.against,
                c.llama_cpp_args(),
                c.n_depth,
                figures.join(", "),
                c.pairs
            ),
        };
    }
    s
}
fn fit_and_links(r: &SplitReport) -> String {
    let mut s = String::new();
    if let Some(f) = &r.llama_fit {
        let ts: Vec<String> = f.tensor_split.iter().map(|v| format!("{v:.0}")).collect();
        // No proportions: its default split by free memory, measured as that row where the search ran it.
        let default_row = f.tensor_split.iter().all(|v| *v == 0.0).then(|| {
            let most = r.options.iter().map(|o| o.placement.n_gpu_layers).max().unwrap_or(0);
            let ngl = f.n_gpu_layers.map_or(most, |n| u32::try_from(n).unwrap_or(most));
            r.options.iter().find(|o| o.tensor_split.is_empty() && o.placement.n_gpu_layers == ngl && o.measured)
        });
        let measured = match default_row.flatten() {
            Some(o) => format!(
                " (no proportions: llama.cpp's default split by free memory, measured above at ngl {}: tg {})",
                o.placement.n_gpu_layers,
                speed(o.tg_ts)
            ),
            None => String::new(),
        };
        let _ = match (f.n_gpu_layers, &f.error) {
            (Some(n), _) => writeln!(s, "llama.cpp's fit for the same caps: ngl {n}, -ts {}{measured}", ts.join(",")),
            (None, Some(e)) => writeln!(s, "llama.cpp's fit for the same caps: {e}"),
            (None, None) => Ok(()),
        };
    }
    for l in &r.rpc_links {
        let _ = writeln!(
            s,
            "RPC server {} (protocol {}): {}; a device boundary costs at least this per token",
            l.endpoint,
            l.protocol,
            crate::report::link(l.rtt_ms, l.bandwidth)
        );
    }
    s
}
