//! `ngl-tune bench --draft`: generation with and without a draft model at
//! each `-ngl` and depth, measured as llama-server runs it
//! ([`crate::engine::spec`]): the two speeds paired within one load, the
//! share of drafted tokens the target accepted, and what each model holds
//! on the devices.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use crate::cli::{BenchArgs, OutputFormat};
use crate::engine::spec::{SpecAsk, SpecRun, MIN_PROMPT};
use crate::error::exit;
use crate::model::{human_bytes, ModelInfo};
use crate::placement::Placement;

/// The draft column's word for the model's own MTP heads.
const MTP_HEADS: &str = "MTP heads";

/// One measured setting: where the layers ran, at which depth, and what it measured.
#[derive(Debug, Serialize)]
struct Row {
    model: String,
    draft: String,
    /// The model's own MTP heads, not a draft model.
    mtp: bool,
    n_gpu_layers: u32,
    /// `-ngld`; `None`: llama.cpp's auto, every layer.
    draft_gpu_layers: Option<u32>,
    draft_n_max: u32,
    n_depth: u32,
    n_gen: u32,
    /// Mean generation speed (t/s) without the draft and with it.
    tg_ts: f64,
    tg_draft_ts: f64,
    /// With the draft over without, paired by repetition: geometric mean and 95% interval.
    ratio: Option<[f64; 3]>,
    acceptance: Option<f64>,
    tokens_per_verify: Option<f64>,
    same_prefix: u32,
    /// On the devices by llama.cpp's accounting: the target's context, the draft's.
    device_bytes: u64,
    draft_device_bytes: u64,
    run: SpecRun,
}

/// Runs each `-ngl` of `grid` at each depth with the placement's draft.
pub(super) fn cmd_bench_draft(
    a: &BenchArgs,
    info: &ModelInfo,
    placement: &Placement,
    ngls: &[u32],
    depths: &[u32],
) -> Result<i32> {
    let Some(draft) = placement.draft.clone() else { return Ok(exit::FAILURE) };
    if draft.is_mtp() {
        info.require_mtp()?;
    }
    let w = &a.workload;
    let n_gen = w.n_gen.unwrap_or(128).max(1);
    let mut rows = Vec::new();
    let first = SpecAsk {
        model: info.path.clone(),
        placement: placement.clone(),
        n_depth: MIN_PROMPT,
        n_gen,
        repetitions: 1,
        text_file: a.draft.prompt_file.clone(),
        check_only: true,
    };
    crate::engine::spec::check(&first)?;
    if depths.iter().any(|d| *d < MIN_PROMPT) && !a.talk.quiet {
        eprintln!(
            "bench: a draft drafts on the text it has read: depths under {MIN_PROMPT} read {MIN_PROMPT} tokens first"
        );
    }
    for &ngl in ngls {
        for depth in depths.iter().map(|d| (*d).max(MIN_PROMPT)) {
            let mut p = placement.clone();
            p.n_gpu_layers = ngl;
            p.n_ctx = Some(p.n_ctx.unwrap_or(depth + n_gen + 64));
            let ask = SpecAsk {
                model: info.path.clone(),
                placement: p,
                n_depth: depth,
                n_gen,
                repetitions: w.repetitions.unwrap_or(5),
                text_file: a.draft.prompt_file.clone(),
                check_only: false,
            };
            if !a.talk.quiet {
                eprintln!("bench: -ngl {ngl} at depth {depth}, {}", draft.describe());
            }
            match crate::engine::spec::measure(&ask, Duration::from_secs(w.trial_timeout)) {
                Ok(run) => rows.push(row(info, &ask, run)),
                // An interrupt or bad input ends the run; a failed load (out of memory) is said and skipped.
                Err(e) if failed_load(&e) => eprintln!("warning: -ngl {ngl} at depth {depth}: {e:#}"),
                Err(e) => return Err(e),
            }
        }
    }
    let text = match a.output {
        OutputFormat::Json => format!("{}\n", serde_json::to_string_pretty(&rows)?),
        OutputFormat::Jsonl => {
            rows.iter().map(|r| serde_json::to_string(r).map(|s| s + "\n")).collect::<Result<_, _>>()?
        }
        OutputFormat::Md | OutputFormat::Csv => table(&rows, a.output == OutputFormat::Csv),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    if rows.is_empty() {
        return Ok(exit::FAILURE);
    }
    if rows.iter().any(|r| r.same_prefix == 0) {
        eprintln!(
            "warning: with the draft the target's first generated token differed from its own without it (greedy both): the draft changed the output"
        );
    }
    Ok(exit::OK)
}

/// A load that failed on its own (not an interrupt, not the user's input).
fn failed_load(e: &anyhow::Error) -> bool {
    !crate::error::is_interrupted(e) && !crate::error::is_bad_input(e)
}

fn row(info: &ModelInfo, ask: &SpecAsk, run: SpecRun) -> Row {
    let mean = |v: &[f64]| crate::stats::mean(v);
    let draft = ask.placement.draft.as_ref();
    let ratio = crate::tune::baseline::Ratio::paired(&run.pairs()).map(|r| [r.ratio, r.lo, r.hi]);
    Row {
        model: info.file_name.clone(),
        draft: match draft.map(|d| d.model.as_ref()) {
            Some(Some(m)) => m.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            Some(None) => MTP_HEADS.into(),
            None => String::new(),
        },
        mtp: draft.is_some_and(crate::placement::Draft::is_mtp),
        n_gpu_layers: ask.placement.n_gpu_layers,
        draft_gpu_layers: draft.and_then(|d| d.n_gpu_layers),
        draft_n_max: draft.map_or(0, |d| d.n_max),
        n_depth: ask.n_depth,
        n_gen: ask.n_gen,
        tg_ts: mean(&run.speeds(false)),
        tg_draft_ts: mean(&run.speeds(true)),
        ratio,
        acceptance: run.acceptance(),
        tokens_per_verify: run.tokens_per_round(),
        same_prefix: run.same_prefix,
        device_bytes: run.device_bytes(false),
        draft_device_bytes: run.device_bytes(true),
        run,
    }
}

fn table(rows: &[Row], csv: bool) -> String {
    let head = [
        "model",
        "draft",
        "ngl",
        "ngld",
        "n_max",
        "depth",
        "tg t/s",
        "tg draft t/s",
        "draft / none",
        "accepted",
        "t/verify",
        "same",
        "dev mem",
        "draft dev mem",
    ];
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or_else(|| "-".to_string(), f);
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.model.clone(),
                r.draft.clone(),
                r.n_gpu_layers.to_string(),
                // MTP heads are the model's own blocks: -ngl places them.
                if r.mtp {
                    "-".to_string()
                } else {
                    r.draft_gpu_layers.map_or_else(|| "all".to_string(), |n| n.to_string())
                },
                r.draft_n_max.to_string(),
                r.n_depth.to_string(),
                format!("{:.2}", r.tg_ts),
                format!("{:.2}", r.tg_draft_ts),
                r.ratio.map_or_else(|| "-".to_string(), |[m, lo, hi]| format!("x{m:.2} [{lo:.2}, {hi:.2}]")),
                opt(r.acceptance, &|v| format!("{:.0}%", v * 100.0)),
                opt(r.tokens_per_verify, &|v| format!("{v:.2}")),
                format!("{}/{}", r.same_prefix, r.n_gen),
                human_bytes(r.device_bytes),
                human_bytes(r.draft_device_bytes),
            ]
        })
        .collect();
    if csv {
        let line =
            |v: &[String]| v.iter().map(|c| format!("\"{}\"", c.replace('"', "\"\""))).collect::<Vec<_>>().join(",");
        let mut s = line(&head.map(String::from)) + "\n";
        for b in &body {
            s += &(line(b) + "\n");
        }
        return s;
    }
    let mut t = crate::table::Table::new(&head.map(|h| (h, !matches!(h, "model" | "draft"))));
    for b in body {
        t.row(b);
    }
    t.render()
}
