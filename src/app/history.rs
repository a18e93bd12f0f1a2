//! `ngl-tune history`: every stored version of a profile.

use std::io::Write;

use anyhow::Result;

use crate::cli::HistoryArgs;
use crate::error::exit;
use crate::report::listing::{version_contexts, Version};

pub(super) fn cmd_history(a: &HistoryArgs) -> Result<i32> {
    use crate::profile::store;
    let current_path = crate::profile::store::resolve(&a.source, a.store.given())?;
    let current = store::read_profile(&current_path)?;
    let store_dir =
        current_path.parent().and_then(std::path::Path::parent).map(std::path::Path::to_path_buf).unwrap_or_default();
    let hist = store::history_dir(&store_dir, &current.machine_id, &current.model);
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&hist)
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "json")).collect())
        .unwrap_or_default();
    files.sort();
    let mut versions = Vec::new();
    for f in files.iter().chain(std::iter::once(&current_path)) {
        match store::read_profile(f) {
            Ok(p) => versions.push(Version {
                created_at: p.created_at.clone(),
                file: f.clone(),
                fingerprint: p.fingerprint.clone(),
                llama_cpp_revision: p.tool.llama_cpp_revision.clone(),
                n_gpu_layers: p.recommendation.placement.n_gpu_layers,
                n_threads: p.recommendation.placement.n_threads,
                tg_ts: p.recommendation.tg_ts,
                pp_ts: p.recommendation.pp_ts,
                current: f == &current_path,
                contexts: version_contexts(&p),
            }),
            Err(e) => eprintln!("warning: {e:#}; skipped"),
        }
    }
    versions.sort_by(|x, y| x.created_at.cmp(&y.created_at).then(x.current.cmp(&y.current)));
    let mut out = std::io::stdout().lock();
    if a.print.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&versions)?)?;
        return Ok(exit::OK);
    }
    write!(out, "{}", crate::report::listing::history(&current, &versions))?;
    Ok(exit::OK)
}
