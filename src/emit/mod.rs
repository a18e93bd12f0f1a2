//! Turns a profile into the bytes people use: an Ollama Modelfile, llama.cpp
//! flags, llama-server environment, Ollama API options, the profile JSON, and
//! the trial table as markdown or CSV. Pure functions of the profile.

pub mod chart;
pub mod modelfile;

use std::fmt::Write as _;

use anyhow::Result;
use serde::Serialize;

use crate::engine::TrialStatus;
use crate::profile::{Profile, Recommendation};

/// Output formats of `ngl-tune emit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// FROM and PARAMETER num_gpu / num_thread / num_ctx lines of an Ollama Modelfile
    Modelfile,
    /// -m PATH -ngl N -t T -c C for llama-cli / llama-server
    LlamaCpp,
    /// LLAMA_ARG_* environment for llama-server
    LlamaServerEnv,
    /// The JSON `options` object of Ollama's API
    OllamaOptions,
    /// The profile itself
    Json,
    /// The trial table as markdown
    Md,
    /// The trial table as CSV
    Csv,
}

/// Shell-quotes a path when it needs it.
#[must_use]
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+:=@%".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn model_path(p: &Profile) -> String {
    p.model.path.display().to_string()
}

/// Ollama's `options` object for its API (`/api/generate`, `/api/chat`).
#[derive(Debug, Serialize)]
pub struct OllamaOptions {
    pub num_gpu: u32,
    pub num_thread: u32,
    pub num_ctx: u32,
}

/// Renders `p` in format `f`.
///
/// # Errors
/// Serialization errors only.
pub fn render(p: &Profile, f: Format) -> Result<String> {
    let r = &p.recommendation;
    Ok(match f {
        Format::Modelfile => modelfile::render(p),
        Format::LlamaCpp => format!(
            "-m {} {}\n",
            shell_quote(&model_path(p)),
            Recommendation::llama_cpp_args(r.n_gpu_layers, r.n_threads, r.n_ctx, r.n_cpu_moe)
        ),
        Format::LlamaServerEnv => format!(
            "LLAMA_ARG_MODEL={}\nLLAMA_ARG_N_GPU_LAYERS={}\nLLAMA_ARG_THREADS={}\nLLAMA_ARG_CTX_SIZE={}\n{}",
            shell_quote(&model_path(p)),
            r.n_gpu_layers,
            r.n_threads,
            r.n_ctx,
            if r.n_cpu_moe > 0 { format!("LLAMA_ARG_N_CPU_MOE={}\n", r.n_cpu_moe) } else { String::new() }
        ),
        Format::OllamaOptions => {
            let num_gpu = r.ollama_num_gpu.unwrap_or(r.n_gpu_layers);
            let o = OllamaOptions { num_gpu, num_thread: r.n_threads, num_ctx: r.n_ctx };
            serde_json::to_string_pretty(&serde_json::json!({ "options": o }))? + "\n"
        }
        Format::Json => serde_json::to_string_pretty(p)? + "\n",
        Format::Md => markdown(p),
        Format::Csv => csv(p),
    })
}

struct TableRow {
    ngl: u32,
    threads: u32,
    n_cpu_moe: u32,
    n_prompt: u32,
    n_gen: u32,
    avg_ts: Option<f64>,
    stddev_ts: Option<f64>,
    device_bytes: Option<u64>,
    share: Option<f64>,
    status: String,
    role: String,
    /// One repetition only: far behind the best (adaptive search's racing).
    stopped_early: bool,
}

fn table_rows(p: &Profile) -> Vec<TableRow> {
    let mut trials: Vec<_> = p.trials.iter().collect();
    trials.sort_by_key(|t| (t.result.spec.n_gpu_layers, t.result.spec.n_threads));
    let mut rows = Vec::new();
    for t in trials {
        let r = &t.result;
        let mut status = r.status.as_str().to_string();
        if t.over_cap {
            status.push_str(" over-cap");
        }
        let base = |n_prompt, n_gen, avg_ts, stddev_ts| TableRow {
            ngl: r.spec.n_gpu_layers,
            threads: r.spec.n_threads,
            n_cpu_moe: r.spec.n_cpu_moe,
            n_prompt,
            n_gen,
            avg_ts,
            stddev_ts,
            device_bytes: t.device_peak_bytes,
            share: t.device_share,
            status: status.clone(),
            role: t.role.clone(),
            stopped_early: false,
        };
        if r.tests.is_empty() || r.status != TrialStatus::Ok {
            for (np, ng) in r.spec.tests() {
                rows.push(base(np, ng, None, None));
            }
        } else {
            for x in &r.tests {
                let mut row = base(x.n_prompt, x.n_gen, Some(x.avg_ts), Some(x.stddev_ts));
                row.stopped_early = x.stopped_early;
                rows.push(row);
            }
        }
    }
    rows
}

fn test_name(n_prompt: u32, n_gen: u32) -> String {
    if n_gen == 0 {
        format!("pp{n_prompt}")
    } else if n_prompt == 0 {
        format!("tg{n_gen}")
    } else {
        format!("pp{n_prompt}+tg{n_gen}")
    }
}

fn markdown(p: &Profile) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| model | n_gpu_layers | n_threads | test | t/s | device memory | status |");
    let _ = writeln!(s, "| ----- | -----------: | --------: | ---- | --: | ------------: | ------ |");
    for r in table_rows(p) {
        let ts = match (r.avg_ts, r.stddev_ts) {
            (Some(a), _) if r.stopped_early => format!("{a:.2}"),
            (Some(a), Some(sd)) => format!("{a:.2} ± {sd:.2}"),
            _ => "-".into(),
        };
        let mem = match (r.device_bytes, r.share) {
            (Some(b), Some(sh)) => format!("{} ({:.1}%)", crate::model::human_bytes(b), sh * 100.0),
            (Some(b), None) => crate::model::human_bytes(b),
            _ => "-".into(),
        };
        let mut status = match r.role.as_str() {
            "grid" => r.status.clone(),
            "moe" => format!("{} (--n-cpu-moe {})", r.status, r.n_cpu_moe),
            role => format!("{} ({role})", r.status),
        };
        if r.stopped_early {
            status.push_str(", cut short after one repetition");
        }
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            p.model.file_name,
            r.ngl,
            r.threads,
            test_name(r.n_prompt, r.n_gen),
            ts,
            mem,
            status
        );
    }
    s
}

fn csv(p: &Profile) -> String {
    let mut s = String::from(
        "model_filename,n_gpu_layers,n_cpu_moe,n_threads,n_ctx,n_prompt,n_gen,avg_ts,stddev_ts,device_bytes,device_share,status,role\n",
    );
    let opt = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.6}"));
    for r in table_rows(p) {
        let _ = writeln!(
            s,
            "\"{}\",{},{},{},{},{},{},{},{},{},{},\"{}\",\"{}\"",
            p.model.file_name.replace('"', "\"\""),
            r.ngl,
            r.n_cpu_moe,
            r.threads,
            p.settings.n_ctx,
            r.n_prompt,
            r.n_gen,
            opt(r.avg_ts),
            opt(r.stddev_ts),
            r.device_bytes.map_or(String::new(), |b| b.to_string()),
            opt(r.share),
            r.status,
            r.role
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/models/a-b_c.gguf"), "/models/a-b_c.gguf");
        assert_eq!(shell_quote("/my models/x.gguf"), "'/my models/x.gguf'");
        assert_eq!(shell_quote("it's.gguf"), "'it'\\''s.gguf'");
    }

    #[test]
    fn a_row_cut_short_says_so_in_markdown() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/example-gemma-3-270m-vulkan-llvmpipe.json");
        let mut p = crate::profile::store::read_profile(&path).unwrap();
        let top = p.trials.iter_mut().max_by_key(|t| t.result.spec.n_gpu_layers).unwrap();
        top.result.tests.retain(|x| x.n_gen > 0);
        for x in &mut top.result.tests {
            x.stopped_early = true;
        }
        let md = markdown(&p);
        let row = md.lines().find(|l| l.contains("| 19 | 2 | tg")).expect(&md);
        assert!(row.ends_with("| ok, cut short after one repetition |"), "{row}");
        assert!(!row.contains('±'), "{row}");
        assert!(!md.contains("| 19 | 2 | pp"), "the pp test that never ran has no row: {md}");
    }
}
