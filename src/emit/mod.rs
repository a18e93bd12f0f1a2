//! Turns a profile into the bytes people use: an Ollama Modelfile, llama.cpp
//! flags, llama-server environment, Ollama API options, the profile JSON, and
//! the trial table as markdown or CSV. Pure functions of the profile.

pub mod chart;
pub mod modelfile;
pub mod together;

use std::fmt::Write as _;

use anyhow::Result;
use serde::Serialize;

use crate::profile::Profile;
use crate::types::TrialStatus;

/// Output formats of `ngl-tune emit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// FROM and PARAMETER num_gpu / num_thread / num_ctx lines of an Ollama Modelfile
    Modelfile,
    /// -m PATH -ngl N -t T -c C for llama-cli / llama-server
    LlamaCpp,
    /// LLAMA_ARG_* environment for llama-server: a systemd EnvironmentFile, or `set -a; . FILE` in a POSIX shell
    LlamaServerEnv,
    /// LLAMA_ARG_* environment for llama-server in a container: `docker run --env-file FILE` (values unquoted)
    DockerEnv,
    /// The JSON `options` object of Ollama's API
    OllamaOptions,
    /// The profile itself
    Json,
    /// The trial table as markdown
    Md,
    /// The trial table as CSV
    Csv,
}

fn model_path(p: &Profile) -> String {
    p.model.path.display().to_string()
}

/// A value for an environment file read by both systemd (`EnvironmentFile=`,
/// `parse_env_file_internal`) and a POSIX shell (`set -a; . FILE`): plain
/// when it holds nothing either would treat specially, else in double
/// quotes with `"`, `\`, `` ` `` and `$` escaped, which both undo.
#[must_use]
pub fn env_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+:@%,".contains(c)) {
        return s.to_string();
    }
    let mut q = String::from("\"");
    for c in s.chars() {
        if "\"\\`$".contains(c) {
            q.push('\\');
        }
        q.push(c);
    }
    q.push('"');
    q
}

/// llama-server's environment as (name, value) pairs, in a fixed order.
fn server_env(p: &Profile) -> Vec<(&'static str, String)> {
    let mut v = vec![("LLAMA_ARG_MODEL", model_path(p))];
    v.extend(p.recommendation.runs().server_env());
    v
}

/// llama-server has no environment variable for `--no-op-offload`.
fn op_offload_comment(p: &Profile) -> &'static str {
    if p.recommendation.placement.op_offload != crate::placement::OpOffload::Off {
        ""
    } else {
        "# also pass --no-op-offload to llama-server (it has no environment variable)\n"
    }
}

/// One line when pinning `num_ctx` changes what an Ollama user gets: a
/// context smaller than Ollama's default on this machine, or
/// `OLLAMA_NUM_PARALLEL` multiplying it. `env` reads Ollama's variables.
#[must_use]
pub fn ollama_ctx_note(p: &Profile, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let n_ctx =
        u64::from(crate::consumer::ollama::num_ctx(&p.recommendation.runs()).unwrap_or(p.recommendation.n_ctx()));
    let num = |k: &str| env(k).and_then(|v| v.trim().parse::<u64>().ok());
    let default = crate::consumer::ollama::ctx_here(&p.hardware, p.model.ctx_train, env);
    let tuned = u64::from(p.recommendation.placement.n_parallel.max(1));
    let parallel = num("OLLAMA_NUM_PARALLEL").unwrap_or(1).max(1);
    let mut parts = Vec::new();
    if n_ctx < default {
        parts.push(format!(
            "num_ctx {n_ctx} pins the context below the {default} tokens Ollama would give this model here without it; tune with -c {default} to measure that context, or drop num_ctx"
        ));
    }
    if parallel > tuned {
        parts.push(format!(
            "OLLAMA_NUM_PARALLEL={parallel} makes Ollama start llama-server with {parallel} x {n_ctx} = {} tokens of context, more memory than was measured here (tune with -c {})",
            n_ctx * parallel,
            n_ctx * parallel
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// Ollama's `options` object for its API (`/api/generate`, `/api/chat`).
#[derive(Debug, Serialize)]
pub struct OllamaOptions {
    /// Unset where llama.cpp's default placement is recommended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_gpu: Option<u32>,
    pub num_thread: u32,
    /// One slot's context.
    pub num_ctx: u32,
    /// Where the measured batch sizes are one Ollama can pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_batch: Option<u32>,
    /// For a model with MTP heads: the draft length where the answer drafts with them, else 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_num_predict: Option<u32>,
}

/// Renders `p` in format `f`.
///
/// # Errors
/// Serialization errors only.
pub fn render(p: &Profile, f: Format) -> Result<String> {
    let r = &p.recommendation;
    Ok(match f {
        Format::Modelfile => modelfile::render(p),
        Format::LlamaCpp => format!("{}\n", r.runs().command_line(&model_path(p))),
        Format::LlamaServerEnv => {
            let lines: String = server_env(p).into_iter().map(|(k, v)| format!("{k}={}\n", env_quote(&v))).collect();
            format!("{}{lines}", op_offload_comment(p))
        }
        Format::DockerEnv => {
            // docker takes everything after the first '=' literally, quotes
            // included, and cannot carry a newline.
            if let Some((k, _)) = server_env(p).iter().find(|(_, v)| v.contains(['\n', '\r'])) {
                return Err(crate::error::bad(format!(
                    "{k} would hold a line break, which docker's --env-file cannot carry; use --format llama-server-env, or move the model to a path without one"
                )));
            }
            let lines: String = server_env(p).into_iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            format!("{}{lines}", op_offload_comment(p))
        }
        Format::OllamaOptions => {
            let num_gpu = r.ollama_num_gpu_param();
            let pl = r.runs();
            let num_batch = match crate::consumer::ollama::num_batch(&pl) {
                crate::consumer::ollama::NumBatch::Num(b) => Some(b),
                _ => None,
            };
            let o = OllamaOptions {
                num_gpu,
                num_thread: r.placement.n_threads,
                num_ctx: crate::consumer::ollama::num_ctx(&pl).unwrap_or(r.n_ctx()),
                num_batch,
                draft_num_predict: modelfile::draft_num_predict(p),
            };
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
    role: crate::types::Role,
    /// One repetition only: far behind the best (adaptive search's racing).
    stopped_early: bool,
    samples: usize,
}

fn table_rows(p: &Profile) -> Vec<TableRow> {
    let mut trials: Vec<_> = p.trials.iter().collect();
    trials.sort_by_key(|t| (t.result.spec.placement.n_gpu_layers, t.result.spec.placement.n_threads));
    let mut rows = Vec::new();
    for t in trials {
        let r = &t.result;
        let mut status = r.status.as_str().to_string();
        if t.over_cap {
            status.push_str(" over-cap");
        }
        let base = |n_prompt, n_gen, avg_ts, stddev_ts| TableRow {
            ngl: r.spec.placement.n_gpu_layers,
            threads: r.spec.placement.n_threads,
            n_cpu_moe: r.spec.placement.n_cpu_moe,
            n_prompt,
            n_gen,
            avg_ts,
            stddev_ts,
            device_bytes: t.device_peak_bytes,
            share: t.device_share,
            status: status.clone(),
            role: t.role,
            stopped_early: false,
            samples: 0,
        };
        if r.tests.is_empty() || r.status != TrialStatus::Ok {
            for (np, ng) in r.spec.tests() {
                rows.push(base(np, ng, None, None));
            }
        } else {
            for x in &r.tests {
                let mut row = base(x.n_prompt, x.n_gen, Some(x.avg_ts), Some(x.stddev_ts));
                row.stopped_early = x.stopped_early;
                row.samples = x.samples_ns.len();
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
    let mut t = crate::table::Table::new(&[
        ("model", false),
        ("n_gpu_layers", true),
        ("n_threads", true),
        ("test", false),
        ("t/s", true),
        ("device memory", true),
        ("status", false),
    ]);
    for r in table_rows(p) {
        let mem = match (r.device_bytes, r.share) {
            (Some(b), Some(sh)) => format!("{} ({:.1}%)", crate::model::human_bytes(b), sh * 100.0),
            (Some(b), None) => crate::model::human_bytes(b),
            _ => "-".into(),
        };
        let mut status = match r.role {
            crate::types::Role::Grid => r.status.clone(),
            crate::types::Role::Moe => format!("{} (--n-cpu-moe {})", r.status, r.n_cpu_moe),
            role => format!("{} ({})", r.status, role.as_str()),
        };
        if r.stopped_early {
            status.push_str(", cut short after one repetition");
        }
        t.row(vec![
            p.model.file_name.clone(),
            r.ngl.to_string(),
            r.threads.to_string(),
            test_name(r.n_prompt, r.n_gen),
            crate::table::speed_cell(r.avg_ts, r.stddev_ts, r.samples),
            mem,
            status,
        ]);
    }
    t.render()
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
            p.settings.workload.n_ctx,
            r.n_prompt,
            r.n_gen,
            opt(r.avg_ts),
            opt(r.stddev_ts),
            r.device_bytes.map_or(String::new(), |b| b.to_string()),
            opt(r.share),
            r.status,
            r.role.as_str()
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::shell_quote;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("/models/a-b_c.gguf"), "/models/a-b_c.gguf");
        assert_eq!(shell_quote("/my models/x.gguf"), "'/my models/x.gguf'");
        assert_eq!(shell_quote("it's.gguf"), "'it'\\''s.gguf'");
    }

    #[test]
    fn every_emitted_form_reads_back_as_the_measured_settings() {
        use crate::placement::{FlashAttn, KvType};
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/example-gemma-3-270m-cpu.json");
        let mut p = crate::profile::store::read_profile(&path).unwrap();
        let r = p.recommendation.for_test_mut();
        (
            r.placement.n_ctx,
            r.placement.n_parallel,
            r.placement.n_batch,
            r.placement.n_ubatch,
            r.placement.flash_attn,
        ) = (Some(32768), 4, 1024, 1024, FlashAttn::On);
        (r.placement.n_gpu_layers, r.placement.n_threads, r.placement.kv_type) = (7, 2, KvType::Q8_0);
        r.placement.mmproj = Some("/models/Gemma 3/mmproj-F16.gguf".into());
        r.render_forms();
        let measured = r.runs();
        // llama.cpp's flags, as bench --llama-args reads them.
        assert_eq!(
            crate::placement::args::parse_placement(&r.llama_cpp_args).unwrap(),
            measured,
            "{}",
            r.llama_cpp_args
        );
        assert!(r.llama_cpp_args.contains("-c 32768 -np 4 -b 1024 -ub 1024"), "{}", r.llama_cpp_args);
        assert!(r.llama_cpp_args.ends_with("--mmproj '/models/Gemma 3/mmproj-F16.gguf'"), "{}", r.llama_cpp_args);
        // llama-server's env file, read as systemd, docker and a shell read it.
        for f in [Format::LlamaServerEnv, Format::DockerEnv] {
            let text = render(&p, f).unwrap();
            let vars = crate::consumer::parse_env_file(&text).unwrap();
            let back = crate::placement::args::from_env(&vars).unwrap().over(crate::placement::Placement::default());
            assert_eq!(back, measured, "{text}");
        }
        // Ollama: one slot's context and the batch size in the Modelfile,
        // the server-wide settings apart.
        let mf = render(&p, Format::Modelfile).unwrap();
        let cmds = crate::consumer::ollama::modelfile::parse(&mf).unwrap();
        let params = crate::consumer::ollama::modelfile::parameters(&cmds);
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.join(","));
        assert_eq!(
            (get("num_gpu"), get("num_thread"), get("num_ctx"), get("num_batch")),
            (Some("7".into()), Some("2".into()), Some("8192".into()), Some("1024".into())),
            "{mf}"
        );
        assert_eq!(
            p.recommendation.ollama_server_env,
            ["OLLAMA_KV_CACHE_TYPE=q8_0", "OLLAMA_FLASH_ATTENTION=1", "OLLAMA_NUM_PARALLEL=4"]
        );
        assert!(mf.contains("OLLAMA_NUM_PARALLEL=4"), "{mf}");
        let o: serde_json::Value = serde_json::from_str(&render(&p, Format::OllamaOptions).unwrap()).unwrap();
        assert_eq!(
            (o["options"]["num_ctx"].as_u64(), o["options"]["num_batch"].as_u64()),
            (Some(8192), Some(1024)),
            "{o}"
        );
    }

    #[test]
    fn a_local_split_says_what_it_buys_over_ollamas_split_by_free_memory() {
        use crate::profile::{SplitOption, SplitReport};
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/example-gemma-3-270m-cpu.json");
        let mut p = crate::profile::store::read_profile(&path).unwrap();
        let option = |split: Vec<u32>, tg: f64| SplitOption {
            placement: crate::placement::Placement::default().with_layers(19, 2, None),
            tensor_split: split,
            measured: true,
            tg_ts: Some(tg),
            fits: true,
            ..SplitOption::default()
        };
        let report =
            SplitReport { options: vec![option(vec![4, 15], 30.0), option(vec![], 12.0)], ..SplitReport::default() };
        p.placements.push(crate::profile::ContextPlacement {
            n_ctx: p.recommendation.n_ctx(),
            fits_fully: true,
            kv_bytes: None,
            recommendation: p.recommendation.clone(),
            options: Vec::new(),
            default: None,
            ollama: None,
            split: Some(report),
            reading: None,
            job: None,
            draft: None,
        });
        let r = p.recommendation.for_test_mut();
        (r.placement.n_gpu_layers, r.placement.tensor_split, r.tg_ts) = (19, vec![4, 15], Some(30.0));
        let mf = render(&p, Format::Modelfile).unwrap();
        assert!(
            mf.contains(
                "measured tg 30.00 t/s with this split against 12.00 t/s split by free memory at ngl 19 (x2.50)"
            ),
            "{mf}"
        );
    }

    #[test]
    fn where_llama_cpps_default_is_recommended_ollama_gets_no_num_gpu() {
        // A profile from before the default stopped becoming the answer
        // says `llama_default`: read back, its forms still leave num_gpu unset.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/example-gemma-3-270m-cpu.json");
        let mut p = crate::profile::store::read_profile(&path).unwrap();
        p.recommendation.for_test_mut().llama_default = true;
        p.recommendation.for_test_mut().render_forms();
        assert!(p.recommendation.llama_default);
        assert!(
            !p.recommendation.modelfile.iter().any(|l| l.starts_with("PARAMETER num_gpu")),
            "{:?}",
            p.recommendation.modelfile
        );
        let mf = render(&p, Format::Modelfile).unwrap();
        assert!(!mf.contains("PARAMETER num_gpu"), "{mf}");
        assert!(mf.contains(crate::profile::UNSET_NUM_GPU) && mf.contains("PARAMETER num_thread 2"), "{mf}");
        let o: serde_json::Value = serde_json::from_str(&render(&p, Format::OllamaOptions).unwrap()).unwrap();
        assert!(o["options"].get("num_gpu").is_none() && o["options"]["num_thread"] == 2, "{o}");
        let old = "FROM x.gguf\nPARAMETER num_gpu 12\nPARAMETER temperature 0.2\n";
        let new = crate::consumer::ollama::modelfile::update(old, &modelfile::params(&p)).unwrap();
        assert_eq!(
            new,
            format!(
                "FROM x.gguf\nPARAMETER temperature 0.2\nPARAMETER num_thread 2\nPARAMETER num_ctx {}\n",
                p.recommendation.n_ctx()
            )
        );
    }

    #[test]
    fn a_row_cut_short_says_so_in_markdown() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/example-gemma-3-270m-vulkan-llvmpipe.json");
        let mut p = crate::profile::store::read_profile(&path).unwrap();
        let top = p.trials.iter_mut().max_by_key(|t| t.result.spec.placement.n_gpu_layers).unwrap();
        top.result.tests.retain(|x| x.n_gen > 0);
        // As racing leaves it: one repetition, marked.
        for x in &mut top.result.tests {
            x.stopped_early = true;
            x.samples_ns.truncate(1);
            x.samples_ts.truncate(1);
        }
        let md = markdown(&p);
        let row = md.lines().find(|l| l.contains("| 19 | 2 | tg")).expect(&md);
        assert!(row.ends_with("| ok, cut short after one repetition |"), "{row}");
        assert!(!row.contains('±'), "{row}");
        assert!(!md.contains("| 19 | 2 | pp"), "the pp test that never ran has no row: {md}");
    }
}
