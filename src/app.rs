//! Runs a parsed command line: validates input, calls the library, prints.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;

use crate::bench::{self, BenchOptions};
use crate::cli::{
    BenchArgs, Cli, Command, EmitArgs, HistoryArgs, HwArgs, InspectArgs, ObjectiveArg, ReprofileArgs, TuneArgs,
    Workload,
};
use crate::error::{bad, exit};
use crate::model::{self, ModelInfo};

/// Runs the command; returns the exit code.
///
/// # Errors
/// Any failure; `BadInput` errors exit 2.
pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Tune(a) => cmd_tune(&a),
        Command::Bench(a) => cmd_bench(&a),
        Command::Inspect(a) => cmd_inspect(&a),
        Command::Trial => crate::engine::runner::worker_main().map(|()| exit::OK),
        Command::Predict => crate::engine::predict::predict_main().map(|()| exit::OK),
        Command::Kl => crate::engine::quality::kl_main().map(|()| exit::OK),
        Command::Devices { rpc } => {
            let _backend = llama_cpp_2::llama_backend::LlamaBackend::init()?;
            crate::engine::placement::add_rpc_servers(&rpc_list(rpc.as_deref())?)?;
            let devices = crate::probe::ggml::devices();
            println!("{}", serde_json::to_string(&devices)?);
            Ok(exit::OK)
        }
        Command::Hw(a) => cmd_hw(&a),
        Command::RpcServer(a) => {
            let threads = a.threads.unwrap_or_else(|| crate::probe::hardware(Vec::new()).cpu.physical_cores.max(1));
            crate::rpc::serve(&a.host, a.port, &a.device, threads).map(|()| exit::OK)
        }
        Command::Emit(a) => cmd_emit(&a),
        Command::Reprofile(a) => cmd_reprofile(&a),
        Command::History(a) => cmd_history(&a),
        Command::Profiles(a) => match a.command {
            crate::cli::ProfilesCommand::List { profiles, json } => cmd_profiles_list(profiles.as_deref(), json),
        },
        Command::Check { model, rpc } => {
            let verdict = crate::engine::worker::check_loadable(&model, &rpc_list(rpc.as_deref())?);
            // The backend is up now: the device list costs nothing more.
            let devices = if verdict.is_ok() { crate::probe::ggml::devices() } else { Vec::new() };
            let check = crate::engine::child::Check { ok: verdict.is_ok(), error: verdict.err(), devices };
            println!("{}", serde_json::to_string(&check)?);
            Ok(exit::OK)
        }
        Command::Quantize { input, output, kind } => {
            crate::synth::quantize(&input, &output, &kind)?;
            Ok(exit::OK)
        }
        Command::Synth(a) => {
            let spec = crate::synth::SynthSpec::default()
                .with_n_layer(a.layers)
                .with_dims(a.n_embd, a.n_ff, a.heads)
                .with_kv_heads(a.kv_heads.unwrap_or(a.heads))
                .with_experts(a.experts, a.experts.min(2))
                .with_q8_0(a.q8_0)
                .with_ctx_train(a.ctx_train);
            crate::synth::write_model(&a.out, &spec)?;
            Ok(exit::OK)
        }
    }
}

/// `--rpc`'s servers (none when not given).
fn rpc_list(s: Option<&str>) -> Result<Vec<String>> {
    s.map_or_else(|| Ok(Vec::new()), crate::rpc::parse_list)
}

/// Parses `--vram-budget`: one size for every device, and/or `DEV=SIZE` per device.
fn parse_budgets(s: &str) -> Result<(Option<u64>, Vec<crate::profile::DeviceBudget>)> {
    let (mut all, mut per) = (None, Vec::new());
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.rsplit_once('=') {
            Some((dev, size)) => per.push(crate::profile::DeviceBudget {
                device: dev.trim().to_string(),
                bytes: crate::tune::parse_size(size.trim())?,
            }),
            None if all.is_none() => all = Some(crate::tune::parse_size(part)?),
            None => {
                return Err(bad(format!(
                    "--vram-budget '{s}' has two sizes for every device; give one, and DEV=SIZE for the others"
                )))
            }
        }
    }
    if all.is_none() && per.is_empty() {
        return Err(bad("--vram-budget is empty; give a size like 8GiB, or DEV=SIZE per device"));
    }
    Ok((all, per))
}

/// Checks workload options, returning the thread count to use.
///
/// # Errors
/// `BadInput` for values llama.cpp cannot run.
pub fn check_workload(w: &Workload, model: &ModelInfo) -> Result<u32> {
    if w.n_prompt == Some(0) && w.n_gen == Some(0) {
        return Err(bad(
            "-p 0 and -n 0 leave nothing to measure; give -p (prompt tokens) or -n (generated tokens) a positive value",
        ));
    }
    if w.repetitions == Some(0) {
        return Err(bad("-r 0 measures nothing; use -r 1 or more"));
    }
    if w.batch_size == 0 || w.ubatch_size == 0 {
        return Err(bad("batch sizes must be positive; use -b 2048 -ub 512 (llama-bench's defaults)"));
    }
    if w.trial_timeout == 0 {
        return Err(bad("--trial-timeout 0 kills every trial; give it seconds, e.g. 900"));
    }
    parse_busy_threshold(&w.busy_threshold)?;
    let threads = match w.threads {
        Some(0) => return Err(bad("-t 0 runs no threads; use -t 1 or more (default: physical cores)")),
        Some(t) => t,
        None => bench::default_threads(),
    };
    if let Some(c) = w.ctx_size {
        if c == 0 {
            return Err(bad("-c 0 is not a context size; use e.g. -c 4096"));
        }
        if model.ctx_train > 0 && u64::from(c) > model.ctx_train {
            eprintln!(
                "warning: -c {c} is larger than the {} tokens {} was trained for; quality past that is not guaranteed",
                model.ctx_train, model.file_name
            );
        }
    }
    Ok(threads)
}

/// Parses `--busy-threshold`: a positive share of a trial's threads.
///
/// # Errors
/// `BadInput` naming the value and the form.
pub fn parse_busy_threshold(s: &str) -> Result<f64> {
    s.trim().parse::<f64>().ok().filter(|f| f.is_finite() && *f > 0.0).ok_or_else(|| {
        bad(format!(
            "--busy-threshold {s} is not a positive share of the trial's threads; give one like 0.1 (others may use a tenth of them)"
        ))
    })
}

/// The tuning settings the command line asks for, checked.
fn tune_settings(
    a: &TuneArgs,
    info: &ModelInfo,
    target_vram: f64,
    vram_budget_bytes: Option<u64>,
) -> Result<crate::profile::Settings> {
    use crate::types::Objective;
    let w = &a.workload;
    let threads = check_workload(w, info)?;
    let (p, n, r) = if a.quick { (128, 32, 2) } else { (512, 128, 3) };
    let contexts = a.ctx.as_deref().map(|l| parse_contexts(l, info)).transpose()?;
    Ok(crate::profile::Settings {
        target_vram,
        vram_budget_bytes,
        n_ctx: contexts.as_ref().and_then(|c| c.last().copied()).or(w.ctx_size).unwrap_or(4096),
        n_prompt: w.n_prompt.unwrap_or(p),
        n_gen: w.n_gen.unwrap_or(n),
        repetitions: w.repetitions.unwrap_or(r),
        n_threads: threads,
        n_batch: w.batch_size,
        n_ubatch: w.ubatch_size,
        flash_attn: w.flash_attn,
        objective: match a.objective {
            ObjectiveArg::Tg => Objective::Tg,
            ObjectiveArg::Pp => Objective::Pp,
            ObjectiveArg::Mixed => Objective::Mixed,
        },
        grid: if a.ngl.is_empty() { None } else { Some(crate::ngl::parse_all(&a.ngl, "--ngl")?) },
        quick: a.quick,
        no_skip: a.no_skip,
        trial_timeout_s: w.trial_timeout,
        sample_interval_ms: w.sample_interval_ms,
        search: a.search,
        busy_threshold: parse_busy_threshold(&w.busy_threshold)?,
        op_offload: w.op_offload,
        contexts: contexts.unwrap_or_default(),
        ctx_rule: None,
        rpc: Vec::new(),
        device_budgets: Vec::new(),
        max_kl: a
            .max_kl
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|k| k.is_finite() && *k >= 0.0)
            .ok_or_else(|| bad(format!("--max-kl {} is not a KL divergence; give nats like 0.05", a.max_kl)))?,
    })
}

/// Parses `--ctx`: context sizes, each positive and at most the trained context.
fn parse_contexts(list: &str, info: &ModelInfo) -> Result<Vec<u32>> {
    let mut v = Vec::new();
    for part in list.split(',').map(str::trim) {
        let c: u32 = part.parse().ok().filter(|c| *c > 0).ok_or_else(|| {
            bad(format!("--ctx {list}: '{part}' is not a context size; give sizes like 4096,16384,32768"))
        })?;
        if info.ctx_train > 0 && u64::from(c) > info.ctx_train {
            return Err(bad(format!(
                "--ctx {c} is larger than the {} tokens {} was trained for; give at most {}",
                info.ctx_train, info.file_name, info.ctx_train
            )));
        }
        v.push(c);
    }
    v.sort_unstable();
    v.dedup();
    Ok(v)
}

/// The contexts to tune and the rule that chose them: `--ctx`, `-c`, the
/// Modelfile's num_ctx, or Ollama's default here.
///
/// # Errors
/// `BadInput` for a Modelfile to update that Ollama would reject (said
/// before anything is measured, not after).
fn choose_contexts(
    a: &TuneArgs,
    s: &mut crate::profile::Settings,
    info: &ModelInfo,
    devices: &[crate::types::LlamaDevice],
) -> Result<()> {
    let existing = a.write_modelfile.as_deref().filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0));
    let cmds = existing.map(crate::emit::modelfile::read).transpose()?;
    if a.ctx.is_some() || a.workload.ctx_size.is_some() {
        return Ok(());
    }
    let from_modelfile = cmds.as_deref().zip(existing).and_then(|(cmds, p)| {
        let params = crate::emit::modelfile::parameters(cmds);
        let v = params.iter().find(|(k, _)| k == "num_ctx")?.1.last()?.trim().parse::<u32>().ok().filter(|v| *v > 0)?;
        // llama.cpp (and Ollama) cap the context at the trained one.
        let v = if info.ctx_train > 0 { v.min(u32::try_from(info.ctx_train).unwrap_or(u32::MAX)) } else { v };
        Some((v, p.display().to_string()))
    });
    let (ctx, rule) = match from_modelfile {
        Some((v, path)) => (v, format!("context {v}: num_ctx of the Modelfile being updated ({path})")),
        None => {
            // Probed only here: the tune probes the machine itself.
            let hw = crate::probe::hardware(devices.to_vec());
            let c = crate::emit::ollama_ctx_here(&hw, info.ctx_train, &|k| std::env::var(k).ok());
            let c = u32::try_from(c).unwrap_or(u32::MAX);
            (c, format!(
                "context {c}: what current Ollama gives this model here without num_ctx (4k under 23 GiB of GPU memory, 32k from 23 GiB, 256k from 47 GiB; OLLAMA_CONTEXT_LENGTH replaces the rule; at most the trained context); --ctx tunes others"
            ))
        }
    };
    s.n_ctx = ctx;
    s.ctx_rule = Some(rule);
    Ok(())
}

fn cmd_tune(a: &TuneArgs) -> Result<i32> {
    // The cap's options are judged first, before the store and the models.
    let target = crate::tune::parse_target(&a.target_vram)?;
    let (budget, device_budgets) = a.vram_budget.as_deref().map(parse_budgets).transpose()?.unwrap_or_default();
    // The servers are probed with the request (tune::TuneRequest::new).
    let rpc = rpc_list(a.workload.rpc.as_deref())?;
    let store = a.profiles.clone().unwrap_or_else(crate::profile::store::default_dir);
    crate::profile::store::check_dir(&store)?;
    if a.models.len() > 1 {
        for (given, flag) in [(a.chart.is_some(), "--chart"), (a.write_modelfile.is_some(), "--write-modelfile")] {
            if given {
                return Err(bad(format!(
                    "{flag} takes one model; tune the models together, then use emit {flag} on the one you pick"
                )));
            }
        }
    }
    // Every model and its settings are checked before anything is measured.
    let mut infos = Vec::new();
    for m in &a.models {
        let info = model::inspect(m)?;
        let mut settings = tune_settings(a, &info, target, budget)?;
        settings.rpc.clone_from(&rpc);
        settings.device_budgets.clone_from(&device_budgets);
        infos.push((info, settings));
    }
    if let Some(c) = &a.chart {
        check_output_path(c, "--chart")?;
    }
    if let Some(m) = &a.write_modelfile {
        check_output_path(m, "--write-modelfile")?;
    }
    let mut reqs = Vec::new();
    for (info, settings) in infos {
        let mut req = crate::tune::TuneRequest::new(info, settings, store.clone())?
            .with_resume(a.resume)
            .with_output(a.verbose, !a.quiet);
        choose_contexts(a, &mut req.settings, &req.info, &req.devices)?;
        reqs.push(req);
    }
    crate::interrupt::install();
    let names: Vec<&str> = reqs.iter().map(|r| r.info.file_name.as_str()).collect();
    let _lock = crate::profile::lock::StoreLock::acquire(
        &store,
        &crate::probe::machine_id(),
        a.no_wait,
        &format!("ngl-tune tune {}", names.join(" ")),
    )?;
    let mut outcomes = Vec::new();
    for req in &reqs {
        outcomes.push(crate::tune::tune(req)?);
    }
    if outcomes.len() > 1 {
        return ranked(a, &mut outcomes);
    }
    let outcome = &outcomes[0];
    write_extras(&outcome.profile, a.chart.as_deref(), a.write_modelfile.as_deref())?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&outcome.profile)?)?;
    } else {
        print_report(&mut out, outcome)?;
    }
    out.flush()?;
    Ok(exit::OK)
}

fn print_report(out: &mut impl Write, outcome: &crate::tune::TuneOutcome) -> Result<()> {
    // The noise warning belongs beside the numbers, in the report.
    let notes: Vec<String> = outcome.notes.iter().filter(|n| !n.is_warning()).map(ToString::to_string).collect();
    print_notes(&notes);
    write!(out, "{}", crate::report::tune_report(&outcome.profile, &outcome.path))?;
    Ok(())
}

/// Several models: each one's report, then the ranking with each one's
/// quality against the largest (stored in its profile).
fn ranked(a: &TuneArgs, outcomes: &mut [crate::tune::TuneOutcome]) -> Result<i32> {
    use crate::tune::rank;
    let profiles: Vec<crate::profile::Profile> = outcomes.iter().map(|o| o.profile.clone()).collect();
    let exe = crate::engine::child::current_exe()?;
    let qualities = rank::qualities(&exe, &profiles, profiles[0].settings.n_threads)?;
    for (o, q) in outcomes.iter_mut().zip(&qualities) {
        if q.is_some() {
            o.profile.model_quality.clone_from(q);
            crate::profile::store::write_profile(&o.path, &o.profile)?;
        }
    }
    let rows = rank::rank(&profiles, &qualities, profiles[0].settings.max_kl);
    let mut out = std::io::stdout().lock();
    if a.json {
        let all: Vec<&crate::profile::Profile> = outcomes.iter().map(|o| &o.profile).collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&serde_json::json!({ "ranking": rows, "profiles": all }))?)?;
    } else {
        for o in outcomes.iter() {
            print_report(&mut out, o)?;
            writeln!(out)?;
        }
        write!(out, "{}", rank::render(&rows))?;
    }
    out.flush()?;
    Ok(exit::OK)
}

/// Bench's placement: the options, with `--llama-args` laid over them;
/// the ngl and `--n-cpu-moe` lists (one value each when the line sets it).
fn bench_placement(a: &BenchArgs, info: &ModelInfo) -> Result<(crate::types::Placement, Vec<u32>, Vec<u32>)> {
    let llama = match &a.llama_args {
        Some(line) => crate::llama_args::parse(line).map_err(|e| bad(format!("--llama-args: {e}")))?,
        None => crate::llama_args::LlamaArgs::default(),
    };
    let mut w = a.workload.clone();
    w.threads = llama.threads.or(w.threads);
    w.ctx_size = llama.ctx.or(w.ctx_size);
    w.batch_size = llama.n_batch.unwrap_or(w.batch_size);
    w.ubatch_size = llama.n_ubatch.unwrap_or(w.ubatch_size);
    let threads = check_workload(&w, info)?;
    let mut cpu_overrides = Vec::new();
    for o in &a.override_tensor {
        match o.split_once('=') {
            Some((p, "CPU")) => cpu_overrides.push(p.to_string()),
            _ => return Err(bad(format!("--override-tensor '{o}': give PATTERN=CPU (tensors stay on the CPU)"))),
        }
    }
    let ngl = match llama.ngl {
        Some(n) => vec![n],
        None => crate::ngl::parse_all(&a.ngl, "-ngl")?,
    };
    let moe = match llama.n_cpu_moe {
        Some(n) => vec![n],
        None => crate::ngl::parse_all(&a.n_cpu_moe, "--n-cpu-moe")?,
    };
    let base = crate::types::Placement {
        n_batch: w.batch_size,
        n_ubatch: w.ubatch_size,
        flash_attn: w.flash_attn,
        kv_type: a.cache_type,
        op_offload: w.op_offload,
        ..crate::types::Placement::default()
    }
    .with_layers(0, threads, w.ctx_size)
    .with_split(&[], &rpc_list(w.rpc.as_deref())?);
    let mut p = llama.over(base);
    // --override-tensor's patterns come first, then the line's.
    cpu_overrides.append(&mut p.cpu_overrides);
    p.cpu_overrides = cpu_overrides;
    Ok((p, ngl, moe))
}

fn cmd_bench(a: &BenchArgs) -> Result<i32> {
    let mut clock = crate::clock::Phases::from_env();
    let info = model::inspect(&a.model)?;
    clock.lap("inspect (GGUF header, sha256 of the first 16 MiB)");
    let (placement, ngl, n_cpu_moe) = bench_placement(a, &info)?;
    crate::rpc::probe_all(&placement.rpc)?;
    let w = &a.workload;
    let opts = BenchOptions {
        model: a.model.clone(),
        placement,
        ngl,
        n_cpu_moe,
        n_prompt: w.n_prompt.unwrap_or(512),
        n_gen: w.n_gen.unwrap_or(128),
        repetitions: w.repetitions.unwrap_or(5),
        warmup: !w.no_warmup,
        timeout: Duration::from_secs(w.trial_timeout),
        sample_interval: Duration::from_millis(w.sample_interval_ms),
        busy_threshold: parse_busy_threshold(&w.busy_threshold)?,
        verbose: a.verbose,
        progress: !a.quiet,
    };
    clock.lap("options");
    // The first trial is the loadability check (its worker loads the model
    // anyway), and its devices are the machine's: no separate child start.
    let results = bench::run(&opts, |r| {
        first_trial_says(&info, r)?;
        let mut notes = crate::probe::hardware(r.devices.clone()).notes;
        if w.op_offload == crate::types::OpOffload::Auto && r.spec.placement.op_offload == crate::types::OpOffload::Off
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

/// A first trial whose worker could not load the model at all means
/// llama.cpp cannot run it: bad input, said as the separate check says it.
fn first_trial_says(info: &ModelInfo, r: &crate::types::TrialResult) -> Result<()> {
    let why = r.reason.as_deref().unwrap_or_default();
    if r.status != crate::types::TrialStatus::Failed || !why.starts_with("model load failed") {
        return Ok(());
    }
    let arch = why.contains("unknown model architecture");
    Err(crate::engine::child::cannot_load(info, why, arch))
}

fn print_notes(notes: &[String]) {
    for n in notes {
        eprintln!("note: {n}");
    }
}

/// `--json` prints the value, otherwise the human rendering.
fn print_json_or_text(json: bool, value: &impl serde::Serialize, text: impl FnOnce() -> String) -> Result<i32> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(value)?)?;
    } else {
        write!(out, "{}", text())?;
    }
    out.flush()?;
    Ok(exit::OK)
}

fn cmd_inspect(a: &InspectArgs) -> Result<i32> {
    let info = model::inspect(&a.model)?;
    print_json_or_text(a.json, &info, || crate::report::render_inspect(&info))
}

fn cmd_hw(a: &HwArgs) -> Result<i32> {
    let exe = std::env::current_exe()?;
    let rpc = rpc_list(a.rpc.as_deref())?;
    let servers = crate::rpc::probe_all(&rpc)?;
    let devices = crate::engine::child::devices(&exe, &rpc)?;
    let mut hw = crate::probe::hardware(devices);
    hw.rpc_servers = servers;
    hw.fingerprint = crate::probe::fingerprint(&hw);
    print_json_or_text(a.json, &hw, || crate::report::render_hw(&hw))
}

/// Refuses an output path that is a directory, a FIFO or a device, or whose
/// directory does not exist.
fn check_output_path(p: &std::path::Path, opt: &str) -> Result<()> {
    crate::fsio::check_output_file(p, opt)
}

/// `--chart` and `--write-modelfile`, shared by the tuner and `emit`.
fn write_extras(
    p: &crate::profile::Profile,
    chart: Option<&std::path::Path>,
    modelfile: Option<&std::path::Path>,
) -> Result<()> {
    use crate::emit::modelfile::WriteOutcome;
    if let Some(c) = chart {
        let svg = crate::emit::chart::svg(p)?;
        crate::profile::store::atomic_write(c, svg.as_bytes())?;
        eprintln!("chart written to {}", c.display());
    }
    if let Some(m) = modelfile {
        match crate::emit::modelfile::write(m, p)? {
            WriteOutcome::Created => eprintln!("{} created", m.display()),
            WriteOutcome::Updated => eprintln!("{} updated (the previous version is {}.bak)", m.display(), m.display()),
            WriteOutcome::Unchanged => eprintln!("{} already has these settings; unchanged", m.display()),
        }
    }
    Ok(())
}

/// A profile named directly, or the store's profile of a model on this machine.
///
/// # Errors
/// `BadInput` when there is none or it is not a profile.
pub fn load_profile(source: &std::path::Path, store: Option<&std::path::Path>) -> Result<crate::profile::Profile> {
    crate::profile::store::read_profile(&crate::profile::store::resolve(source, store)?)
}

fn cmd_emit(a: &EmitArgs) -> Result<i32> {
    if let Some(c) = &a.chart {
        check_output_path(c, "--chart")?;
    }
    if let Some(m) = &a.write_modelfile {
        check_output_path(m, "--write-modelfile")?;
    }
    let mut p = load_profile(&a.source, a.profiles.as_deref())?;
    if let Some(c) = a.ctx {
        p = p.at_context(c)?;
    }
    let format = match a.format {
        Some(f) => Some(f),
        None if a.chart.is_some() || a.write_modelfile.is_some() => None,
        None => Some(crate::emit::Format::Modelfile),
    };
    let for_ollama = matches!(format, Some(crate::emit::Format::Modelfile | crate::emit::Format::OllamaOptions))
        || a.write_modelfile.is_some();
    if for_ollama {
        if let Some(n) = crate::emit::ollama_ctx_note(&p, &|k| std::env::var(k).ok()) {
            eprintln!("note: {n}");
        }
    }
    if let Some(f) = format {
        let text = crate::emit::render(&p, f)?;
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()?;
    }
    write_extras(&p, a.chart.as_deref(), a.write_modelfile.as_deref())?;
    Ok(exit::OK)
}

fn cmd_reprofile(a: &ReprofileArgs) -> Result<i32> {
    let store = a.profiles.clone().unwrap_or_else(crate::profile::store::default_dir);
    crate::profile::store::check_dir(&store)?;
    let max_age = crate::reprofile::parse_duration(&a.max_age, "--max-age")?;
    let wait_idle = crate::reprofile::parse_duration(&a.wait_idle, "--wait-idle")?;
    let busy_threshold = parse_busy_threshold(&a.busy_threshold)?;
    let threshold: f64 =
        a.drift_threshold.trim().parse().ok().filter(|t: &f64| t.is_finite() && *t >= 0.0 && *t < 1.0).ok_or_else(
            || {
                bad(format!(
                    "--drift-threshold {} is not a fraction in [0, 1); give the smallest change that counts, like 0.05",
                    a.drift_threshold
                ))
            },
        )?;
    if let Some(d) = &a.update_modelfiles {
        if !std::fs::metadata(d).is_ok_and(|m| m.is_dir()) {
            return Err(bad(format!(
                "--update-modelfiles {} is not a directory; pass the directory that holds your Modelfiles",
                d.display()
            )));
        }
    }
    crate::interrupt::install();
    let _lock =
        crate::profile::lock::StoreLock::acquire(&store, &crate::probe::machine_id(), a.no_wait, "ngl-tune reprofile")?;
    let opts = crate::reprofile::ReprofileOptions {
        store,
        max_age,
        dry_run: a.dry_run,
        threshold,
        update_modelfiles: a.update_modelfiles.clone(),
        wait_idle,
        busy_threshold,
        verbose: a.verbose,
        progress: !a.quiet && !a.json,
    };
    let json = a.json;
    let mut say = |line: &str| {
        if !json {
            println!("{line}");
        }
    };
    let summary = crate::reprofile::reprofile(&opts, &mut say)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!(
            "summary: {} re-tuned, {} fresh, {} missing, {} invalid, {} failed; {} regressions, {} improvements, {} recommendations changed, {} comparisons not judged (busy machine)",
            summary.retuned,
            summary.fresh,
            summary.missing,
            summary.invalid,
            summary.failed,
            summary.regressions,
            summary.improvements,
            summary.recommendations_changed,
            summary.contended
        );
    }
    Ok(summary.exit_code)
}

/// One version of a profile, for `history`.
#[derive(Debug, serde::Serialize)]
struct Version {
    created_at: String,
    file: std::path::PathBuf,
    fingerprint: String,
    llama_cpp_revision: String,
    n_gpu_layers: u32,
    n_threads: u32,
    tg_ts: Option<f64>,
    pp_ts: Option<f64>,
    current: bool,
    /// Each context tuned: its size, flags and speeds (the largest first is `n_gpu_layers` above).
    contexts: Vec<VersionContext>,
}

#[derive(Debug, serde::Serialize)]
struct VersionContext {
    n_ctx: u32,
    llama_cpp_args: String,
    tg_ts: Option<f64>,
    pp_ts: Option<f64>,
}

fn version_contexts(p: &crate::profile::Profile) -> Vec<VersionContext> {
    let of = |r: &crate::profile::Recommendation| VersionContext {
        n_ctx: r.n_ctx,
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

fn cmd_history(a: &HistoryArgs) -> Result<i32> {
    use crate::profile::store;
    let current_path = crate::profile::store::resolve(&a.source, a.profiles.as_deref())?;
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
                n_gpu_layers: p.recommendation.n_gpu_layers,
                n_threads: p.recommendation.n_threads,
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
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&versions)?)?;
        return Ok(exit::OK);
    }
    writeln!(out, "{} on {}: {} versions", current.model.file_name, current.machine_id, versions.len())?;
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
    for v in &versions {
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
    write!(out, "{}", t.render())?;
    Ok(exit::OK)
}

#[derive(Debug, serde::Serialize)]
struct Listed {
    machine: String,
    model: String,
    file: std::path::PathBuf,
    n_gpu_layers: u32,
    n_threads: u32,
    n_ctx: u32,
    tg_ts: Option<f64>,
    created_at: String,
    age_s: u64,
    this_machine: bool,
}

fn cmd_profiles_list(store: Option<&std::path::Path>, json: bool) -> Result<i32> {
    use crate::profile::store as st;
    let dir = store.map_or_else(st::default_dir, std::path::Path::to_path_buf);
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
                    n_gpu_layers: p.recommendation.n_gpu_layers,
                    n_threads: p.recommendation.n_threads,
                    n_ctx: p.recommendation.n_ctx,
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
    writeln!(out, "| machine | model | ngl | threads | ctx | tg t/s | age |")?;
    writeln!(out, "| ------- | ----- | --: | ------: | --: | -----: | --: |")?;
    for r in &rows {
        writeln!(
            out,
            "| {}{} | {} | {} | {} | {} | {} | {} |",
            r.machine,
            if r.this_machine { " (this machine)" } else { "" },
            r.model,
            r.n_gpu_layers,
            r.n_threads,
            r.n_ctx,
            r.tg_ts.map_or("-".into(), |t| format!("{t:.2}")),
            crate::reprofile::human_age(r.age_s)
        )?;
    }
    Ok(exit::OK)
}
