//! `ngl-tune profiles list`: the profiles in a store.

use std::io::Write;

use anyhow::Result;

use crate::error::exit;
use crate::report::listing::Listed;

pub(super) fn cmd_profiles_list(store: Option<&std::path::Path>, json: bool) -> Result<i32> {
    use crate::profile::store as st;
    let dir = st::dir_or_default(store);
    st::check_dir(&dir)?;
    let me = crate::probe::machine_id();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut rows = Vec::new();
    for m in st::machines(&dir) {
        for f in st::profile_files(&m) {
            match st::read_profile(&f) {
                Ok(p) => rows.push(Listed {
                    machine: p.machine_id.clone(),
                    model: p.model.file_name.clone(),
                    file: f.clone(),
                    n_gpu_layers: p.recommendation.placement.n_gpu_layers,
                    n_threads: p.recommendation.placement.n_threads,
                    n_ctx: p.recommendation.n_ctx(),
                    tg_ts: p.recommendation.tg_ts,
                    age_s: crate::clock::parse_rfc3339(&p.created_at).map_or(0, |t| now.saturating_sub(t)),
                    created_at: p.created_at,
                    this_machine: p.machine_id == me,
                }),
                Err(e) => eprintln!("warning: {e:#}; skipped"),
            }
        }
    }
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(exit::OK);
    }
    write!(out, "{}", crate::report::listing::profiles(&rows))?;
    Ok(exit::OK)
}
