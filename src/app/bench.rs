//! `ngl-tune bench`: llama-bench's measurement over the placements asked for.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;

use super::print_notes;
use crate::bench::{self, BenchOptions};
use crate::cli::BenchArgs;
use crate::error::exit;
use crate::model::{self, ModelInfo};
use crate::request::bench_placement;

pub(super) fn cmd_bench(a: &BenchArgs) -> Result<i32> {
    let mut clock = crate::clock::Phases::from_env();
    let info = model::inspect(&a.model)?;
    clock.lap("inspect (GGUF header, sha256 of the first 16 MiB)");
    let (placement, grid) = bench_placement(a, &info)?;
    crate::rpc::probe_all(&placement.rpc)?;
    let w = &a.workload;
    let depths = crate::request::bench_depths(a, &placement)?;
    if placement.draft.is_some() {
        crate::request::bench_draft_alone(a, &placement, &grid)?;
        return super::draft::cmd_bench_draft(a, &info, &placement, &grid.ngl, &depths);
    }
    let opts = BenchOptions {
        model: a.model.clone(),
        placement,
        grid,
        depths,
        n_prompt: w.n_prompt.unwrap_or(512),
        n_gen: w.n_gen.unwrap_or(128),
        repetitions: w.repetitions.unwrap_or(5),
        warmup: !w.no_warmup,
        timeout: Duration::from_secs(w.trial_timeout),
        sample_interval: Duration::from_millis(w.sample_interval_ms),
        busy_threshold: w.busy.threshold,
        verbose: a.talk.verbose,
        progress: !a.talk.quiet,
    };
    clock.lap("options");
    // A neighbour resident for the whole run (dropped, and so ended, at the end).
    let _beside = beside(a, &opts)?;
    // The first trial is the loadability check (its worker loads the model
    // anyway), and its devices are the machine's: no separate child start.
    let results = bench::run(&opts, |r| {
        first_trial_says(&info, r)?;
        let mut notes = crate::probe::hardware(r.devices.clone()).notes;
        if w.op_offload == crate::placement::OpOffload::Auto
            && r.spec.placement.op_offload == crate::placement::OpOffload::Off
        {
            notes.push(crate::probe::op_offload_note(&r.devices));
        }
        print_notes(&notes);
        Ok(())
    })?;
    clock.trials(&results);
    if let Some(n) = crate::report::note::busy(&results) {
        eprintln!("warning: {n}");
    }
    let rows = bench::rows(&info, &results, "");
    let text = bench::render(a.output, &rows, &info)?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    clock.lap("rows and output");
    clock.report();
    let failed = results.iter().filter(|r| r.status != crate::types::TrialStatus::Ok).count();
    if failed > 0 {
        eprintln!("warning: {failed} of {} trials did not complete; their rows say why", results.len());
    }
    Ok(if failed == results.len() { exit::FAILURE } else { exit::OK })
}

/// `--beside`: the other model held resident with its own command line.
fn beside(a: &BenchArgs, opts: &BenchOptions) -> Result<Option<crate::engine::hold::Hold>> {
    let Some(path) = &a.beside else { return Ok(None) };
    let info = model::inspect(path)?;
    let line = a.beside_args.as_deref().unwrap_or("");
    let placement = crate::placement::args::parse_placement(line)
        .map_err(|e| crate::error::bad(format!("--beside-args: {e}")))?
        .with_mmproj(None);
    let other = BenchOptions { model: info.path.clone(), placement, ..opts.clone() };
    let p = &other.placement;
    let spec = other.spec((p.n_gpu_layers, p.n_cpu_moe, p.n_cpu_ffn), 0);
    let exe = crate::engine::child::current_exe()?;
    let hold = crate::engine::hold::Hold::start(&exe, &spec, opts.timeout)?;
    eprintln!(
        "beside: {} held resident ({} on the devices)",
        info.file_name,
        crate::model::human_bytes(hold.device_bytes())
    );
    Ok(Some(hold))
}

/// A first trial whose worker could not load the model at all means
/// llama.cpp cannot run it: bad input, said as the separate check says it.
fn first_trial_says(info: &ModelInfo, r: &crate::types::TrialResult) -> Result<()> {
    let why = r.reason.as_deref().unwrap_or_default();
    if r.status != crate::types::TrialStatus::Failed || !why.starts_with("model load failed") {
        return Ok(());
    }
    let p = &r.spec.placement;
    let offload: Vec<&str> = r.devices.iter().filter(|d| d.is_offload_target()).map(|d| d.name.as_str()).collect();
    if let Some(d) = p.devices.iter().find(|d| !offload.contains(&d.as_str())) {
        let here = if offload.is_empty() { "none".to_string() } else { offload.join(", ") };
        return Err(crate::error::bad(format!(
            "--device {}: {d} is not one of llama.cpp's offload devices here ({here}); name them as `ngl-tune hw` lists them",
            p.devices.join(",")
        )));
    }
    if let Some(dev) = why.split("device ").nth(1).and_then(|x| x.strip_suffix(" does not support split buffers")) {
        return Err(crate::error::bad(format!(
            "-sm {}: {dev} does not support split buffers (row splits need CUDA or SYCL); use -sm layer",
            p.split_mode.as_str()
        )));
    }
    let arch = why.contains("unknown model architecture");
    Err(crate::engine::child::cannot_load(info, why, arch))
}
