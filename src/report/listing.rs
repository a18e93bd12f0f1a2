//! What `history` and `profiles list` print: one row per stored version or profile.

use std::fmt::Write as _;

use crate::profile::Profile;

/// One version of a profile, for `history`.
#[derive(Debug, serde::Serialize)]
pub struct Version {
    pub created_at: String,
    pub file: std::path::PathBuf,
    pub fingerprint: String,
    pub llama_cpp_revision: String,
    pub n_gpu_layers: u32,
    pub n_threads: u32,
    pub tg_ts: Option<f64>,
    pub pp_ts: Option<f64>,
    pub current: bool,
    /// Each context tuned: its size, flags and speeds (the largest first is `n_gpu_layers` above).
    pub contexts: Vec<VersionContext>,
}

#[derive(Debug, serde::Serialize)]
pub struct VersionContext {
    pub n_ctx: u32,
    pub llama_cpp_args: String,
    pub tg_ts: Option<f64>,
    pub pp_ts: Option<f64>,
}

pub fn version_contexts(p: &crate::profile::Profile) -> Vec<VersionContext> {
    let of = |r: &crate::profile::Recommendation| VersionContext {
        n_ctx: r.n_ctx(),
        llama_cpp_args: r.llama_cpp_args.clone(),
        tg_ts: r.tg_ts,
        pp_ts: r.pp_ts,
    };
    if p.placements.is_empty() {
        vec![of(&p.recommendation)]
    } else {
        p.placements.iter().map(|c| of(&c.recommendation)).collect()
    }
}

#[derive(Debug, serde::Serialize)]
pub struct Listed {
    pub machine: String,
    pub model: String,
    pub file: std::path::PathBuf,
    pub n_gpu_layers: u32,
    pub n_threads: u32,
    pub n_ctx: u32,
    pub tg_ts: Option<f64>,
    pub created_at: String,
    pub age_s: u64,
    pub this_machine: bool,
}

/// `history`'s table: one row per version and context, oldest first.
#[must_use]
pub fn history(current: &Profile, versions: &[Version]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{} on {}: {} versions", current.model.file_name, current.machine_id, versions.len());
    let mut t = crate::table::Table::new(&[
        ("made", false),
        ("fingerprint", false),
        ("llama.cpp", false),
        ("ctx", true),
        ("llama.cpp flags", false),
        ("tg t/s", true),
        ("pp t/s", true),
        ("version", false),
    ]);
    let f = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.2}"));
    for v in versions {
        for c in &v.contexts {
            t.row(vec![
                v.created_at.clone(),
                v.fingerprint.clone(),
                v.llama_cpp_revision.clone(),
                c.n_ctx.to_string(),
                c.llama_cpp_args.clone(),
                f(c.tg_ts),
                f(c.pp_ts),
                if v.current { "current".into() } else { String::new() },
            ]);
        }
    }
    s.push_str(&t.render());
    s
}

/// `profiles list`'s table.
#[must_use]
pub fn profiles(rows: &[Listed]) -> String {
    let mut t = crate::table::Table::new(&[
        ("machine", false),
        ("model", false),
        ("ngl", true),
        ("threads", true),
        ("ctx", true),
        ("tg t/s", true),
        ("age", true),
    ]);
    for r in rows {
        t.row(vec![
            format!("{}{}", r.machine, if r.this_machine { " (this machine)" } else { "" }),
            r.model.clone(),
            r.n_gpu_layers.to_string(),
            r.n_threads.to_string(),
            r.n_ctx.to_string(),
            r.tg_ts.map_or("-".into(), |t| format!("{t:.2}")),
            crate::clock::human_age(r.age_s),
        ]);
    }
    t.render()
}
