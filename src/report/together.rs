//! The report of a set tuned to stay resident together (`--together`).

use std::fmt::Write;
use std::path::Path;

use crate::model::human_bytes;
use crate::profile::SetProfile;

fn ts(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |t| format!("{t:.2}"))
}

/// The set's table, the sets measured, and what to paste.
#[must_use]
pub fn set_report(p: &SetProfile, path: &Path) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "together on {}: cap {} [memory: {}]", p.memory.device, p.memory.cap_reason, p.memory.source);
    let _ = writeln!(s);
    let mut t = crate::table::Table::new(&[
        ("model", false),
        ("share", true),
        ("ngl", true),
        ("tg t/s (the others resident)", true),
        ("device memory", true),
        ("why", false),
    ]);
    for m in &p.members {
        t.row(vec![
            m.model.file_name.clone(),
            format!("{:.0}%", m.weight * 100.0),
            format!("{}/{}", m.placement.n_gpu_layers, m.n_layer_full),
            ts(m.tg_ts),
            m.device_bytes.map_or_else(|| "-".into(), human_bytes),
            m.why.clone(),
        ]);
    }
    s.push_str(&t.render());
    let _ =
        writeln!(s, "\nsets measured with every model loaded (each generating in turn while the others sit resident):");
    for set in &p.sets {
        let ngl: Vec<String> = set.n_gpu_layers.iter().map(u32::to_string).collect();
        let measured = set.s_per_token.map_or_else(|| "not measured".into(), |v| format!("{:.2} ms", v * 1e3));
        let _ = writeln!(
            s,
            "  ngl {}: {measured} a generated token, weighted by share (predicted {:.2} ms), {}{}{}",
            ngl.join(" + "),
            set.predicted_s_per_token * 1e3,
            set.device_bytes.map_or_else(|| "memory not measured".into(), human_bytes),
            if set.under_cap { ", under the cap" } else { ", over the cap" },
            if set.recommended { "  <- recommended" } else { "" }
        );
    }
    let _ = writeln!(s, "\nset: {}", path.display());
    let _ = writeln!(s, "\nllama-server, one a model:");
    for m in &p.members {
        let _ = writeln!(s, "  llama-server {}", crate::emit::together::command(m));
    }
    let _ = writeln!(s, "\nOllama Modelfile lines, one block a model:");
    for m in &p.members {
        let _ = writeln!(s, "  # {}", m.model.file_name);
        for l in &m.modelfile {
            let _ = writeln!(s, "  {l}");
        }
    }
    let _ = writeln!(s, "\nOllama server environment: {}", p.ollama_server_env.join(" "));
    let _ = writeln!(s, "note: {}", p.ollama_note);
    let _ = writeln!(s, "\nllama-swap:\n{}", p.llama_swap);
    s
}
