//! `ngl-tune emit`: a stored profile in the form a consumer takes.

use std::io::Write;

use anyhow::Result;

use super::{check_output_path, load_profile, write_extras};
use crate::cli::EmitArgs;
use crate::error::exit;

pub(super) fn cmd_emit(a: &EmitArgs) -> Result<i32> {
    if let Some(c) = &a.files.chart {
        check_output_path(c, "--chart")?;
    }
    if let Some(m) = &a.files.write_modelfile {
        check_output_path(m, "--write-modelfile")?;
    }
    let mut p = load_profile(&a.source, a.store.given())?;
    if let Some(c) = a.ctx {
        p = p.at_context(c)?;
    }
    let format = match a.format {
        Some(f) => Some(f),
        None if a.files.chart.is_some() || a.files.write_modelfile.is_some() => None,
        None => Some(crate::emit::Format::Modelfile),
    };
    let for_ollama = matches!(format, Some(crate::emit::Format::Modelfile | crate::emit::Format::OllamaOptions))
        || a.files.write_modelfile.is_some();
    if for_ollama {
        if let Some(n) = crate::emit::ollama_ctx_note(&p, &|k| p.ollama_var(k)) {
            eprintln!("note: {n}");
        }
    }
    if let Some(f) = format {
        let text = crate::emit::render(&p, f)?;
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()?;
    }
    write_extras(&p, a.files.chart.as_deref(), a.files.write_modelfile.as_deref())?;
    Ok(exit::OK)
}
