//! The command line's strings turned into typed, validated values before
//! any work starts (ripgrep's low-level to high-level arguments): sizes,
//! caps, budgets, contexts, thresholds, the workload, bench's placement.
//! Each check names the flag, the value and the fix; nothing here runs
//! llama.cpp or measures anything.

pub mod finish;

use anyhow::Result;

use crate::cli::{BenchArgs, ObjectiveArg, ReprofileArgs, TuneArgs, WorkloadArgs};
use crate::error::bad;
use crate::model::ModelInfo;

/// `--rpc`'s servers (none when not given).
pub fn rpc_list(s: Option<&str>) -> Result<Vec<String>> {
    s.map_or_else(|| Ok(Vec::new()), crate::placement::args::parse_list)
}

/// Parses `--vram-budget`: one size for every device, and/or `DEV=SIZE` per device.
pub fn parse_budgets(s: &str) -> Result<(Option<u64>, Vec<crate::profile::DeviceBudget>)> {
    let (mut all, mut per) = (None, Vec::new());
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.rsplit_once('=') {
            Some((dev, size)) => per
                .push(crate::profile::DeviceBudget { device: dev.trim().to_string(), bytes: parse_size(size.trim())? }),
            None if all.is_none() => all = Some(parse_size(part)?),
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

/// Parses "8GiB", "512MiB", "8G", "1.5 GB", "123456" (bytes).
///
/// # Errors
/// `BadInput` naming the value and the accepted forms.
pub fn parse_size(s: &str) -> Result<u64> {
    parse_size_for("--vram-budget", s)
}

/// [`parse_size`] for the flag `flag`, named in its errors.
///
/// # Errors
/// `BadInput` naming the flag, the value and the accepted forms.
pub fn parse_size_for(flag: &str, s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| crate::error::bad(format!("{flag} '{s}' is not a size; write it like 8GiB, 512MiB or 6G")))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1024.0 * 1024.0,
        "mb" => 1e6,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "gb" => 1e9,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "tb" => 1e12,
        _ => {
            return Err(crate::error::bad(format!(
                "{flag} '{s}' has an unknown unit '{unit}'; use B, KiB, MiB, GiB or TiB (8GiB)"
            )))
        }
    };
    let bytes = n * mult;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(crate::error::bad(format!("{flag} '{s}' is zero; give a positive size like 8GiB")));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

/// Checks workload options, returning the thread count to use.
///
/// # Errors
/// `BadInput` for values llama.cpp cannot run.
pub fn check_workload(w: &WorkloadArgs, model: &ModelInfo) -> Result<u32> {
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
    let threads = match w.threads {
        Some(0) => return Err(bad("-t 0 runs no threads; use -t 1 or more (default: physical cores)")),
        Some(t) => t,
        None => crate::bench::tune_threads(),
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

/// The tuning settings the command line asks for, checked.
pub fn tune_settings(
    a: &TuneArgs,
    info: &ModelInfo,
    (target_vram, budgets): (f64, &(Option<u64>, Vec<crate::profile::DeviceBudget>)),
    rpc: &[String],
) -> Result<crate::profile::Settings> {
    use crate::types::Objective;
    let w = &a.workload;
    let threads = check_workload(w, info)?;
    let (p, n, r) = if a.quick { (128, 32, 2) } else { (512, 128, 3) };
    let contexts = a.ctx.as_deref().map(|l| parse_contexts(l, info)).transpose()?;
    Ok(crate::profile::Settings {
        caps: crate::profile::Caps {
            target_vram,
            vram_budget_bytes: budgets.0,
            device_budgets: budgets.1.clone(),
            host_budget_bytes: a.host_budget.as_deref().map(|b| parse_size_for("--host-budget", b)).transpose()?,
            max_power_w: a.max_power,
        },
        workload: crate::consumer::Workload {
            n_ctx: contexts.as_ref().and_then(|c| c.last().copied()).or(w.ctx_size).unwrap_or(4096),
            contexts: contexts.unwrap_or_default(),
            ctx_rule: None,
            n_parallel: 1,
            kv_type: crate::placement::KvType::F16,
            flash_attn: w.flash_attn,
            n_batch: w.batch_size,
            n_ubatch: w.ubatch_size,
        },
        measure: crate::profile::Measure {
            n_prompt: w.n_prompt.unwrap_or(p),
            n_gen: w.n_gen.unwrap_or(n),
            repetitions: w.repetitions.unwrap_or(r),
            n_depth: a.depth,
            warmup: !w.no_warmup,
        },
        backend: crate::profile::Backend {
            n_threads: threads,
            op_offload: w.op_offload,
            rpc: rpc.to_vec(),
            mmproj: w.mmproj.as_deref().map(check_projector).transpose()?,
            draft: draft_of(&a.draft, None)?.map(|d| crate::profile::DraftRequest {
                model: d.model,
                n_gpu_layers: a.draft.draft_ngl,
                n_max: d.n_max,
                n_max_fixed: d.n_max != crate::placement::DRAFT_N_MAX || a.draft.draft_max.is_some(),
                prompt_file: a.draft.prompt_file.clone(),
            }),
        },
        policy: crate::profile::SearchPolicy {
            grid: if a.ngl.is_empty() { None } else { Some(crate::ngl::parse_all(&a.ngl, "--ngl")?) },
            quick: a.quick,
            no_skip: a.no_skip,
            trial_timeout_s: w.trial_timeout,
            sample_interval_ms: w.sample_interval_ms,
            search: a.search,
            busy_threshold: w.busy.threshold,
        },
        gate: crate::types::QualityGate { max_kl: a.max_kl, min_top1: a.min_top1 },
        goal: crate::types::Goal {
            objective: match a.objective {
                ObjectiveArg::Tg => Objective::Tg,
                ObjectiveArg::Pp => Objective::Pp,
                ObjectiveArg::Mixed => Objective::Mixed,
                ObjectiveArg::Energy => Objective::Energy,
                ObjectiveArg::Throughput => Objective::Throughput,
            },
            reading_speed: a.reading_speed,
            parallel_streams: check_streams(a)?,
            job: a.job.as_deref().map(parse_job).transpose()?,
        },
        consumer: None,
    })
}

/// `--job REQUESTSxTOKENS`: requests, and the tokens each generates.
fn parse_job(v: &str) -> Result<crate::types::Job> {
    let no = || bad(format!("--job '{v}' is not a job; give requests x generated tokens each, like 500x800"));
    let (r, t) = v.split_once(['x', 'X']).ok_or_else(no)?;
    let n = |s: &str| s.trim().parse::<u32>().ok().filter(|n| *n > 0);
    Ok(crate::types::Job { requests: n(r).ok_or_else(no)?, n_gen: n(t).ok_or_else(no)? })
}

/// `--parallel` goes with `--objective throughput` and the other way round.
fn check_streams(a: &TuneArgs) -> Result<Option<u32>> {
    match (a.objective, a.parallel) {
        (ObjectiveArg::Throughput, Some(n)) => Ok(Some(n)),
        (ObjectiveArg::Throughput, None) => {
            Err(bad("--objective throughput needs --parallel N: the sequences your job decodes together (like 4)"
                .to_string()))
        }
        (_, Some(n)) => Err(bad(format!(
            "--parallel {n} measures {n} sequences decoding together: give --objective throughput with it"
        ))),
        (_, None) => Ok(None),
    }
}

/// Checks `--mmproj`: a GGUF file holding a projector (llama.cpp's `clip`
/// architecture). Whether it goes with the model, mtmd checks when it
/// loads both (the tune's first child).
///
/// # Errors
/// `BadInput` naming the file, what it is, and the fix.
pub fn check_projector(path: &std::path::Path) -> Result<std::path::PathBuf> {
    let fix = "give the projector file (mmproj-*.gguf) that goes with the model";
    // A FIFO or a device would wait for ever: a regular file only.
    crate::fsio::open_regular(path, fix).map_err(|e| bad(format!("--mmproj {e:#}")))?;
    let g = crate::gguf::Gguf::read(path)
        .map_err(|e| bad(format!("--mmproj {}: cannot read it as GGUF ({e}); {fix}", path.display())))?;
    match g.get_str("general.architecture") {
        Some("clip") => Ok(path.to_path_buf()),
        Some(arch) => Err(bad(format!(
            "--mmproj {} is a model of architecture '{arch}', not a projector (architecture 'clip'); {fix}",
            path.display()
        ))),
        None => Err(bad(format!("--mmproj {} names no architecture; {fix}", path.display()))),
    }
}

/// Parses `--ctx`: context sizes, each positive and at most the trained context.
pub fn parse_contexts(list: &str, info: &ModelInfo) -> Result<Vec<u32>> {
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

/// Bench's placement: the options, with `--llama-args` laid over them;
/// the ngl and `--n-cpu-moe` lists (one value each when the line sets it).
pub fn bench_placement(a: &BenchArgs, info: &ModelInfo) -> Result<(crate::placement::Placement, crate::bench::Grid)> {
    let llama = match &a.llama_args {
        Some(line) => crate::placement::args::parse(line).map_err(|e| bad(format!("--llama-args: {e}")))?,
        None => crate::placement::args::LlamaArgs::default(),
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
    let n_cpu_moe = match llama.n_cpu_moe {
        Some(n) => vec![n],
        None => crate::ngl::parse_all(&a.n_cpu_moe, "--n-cpu-moe")?,
    };
    let base = crate::placement::Placement {
        n_batch: w.batch_size,
        n_ubatch: w.ubatch_size,
        flash_attn: w.flash_attn,
        kv_type: a.cache_type,
        op_offload: w.op_offload,
        ..crate::placement::Placement::default()
    }
    .with_layers(0, threads, w.ctx_size)
    .with_split(&[], &rpc_list(w.rpc.servers.as_deref())?)
    .with_mmproj(w.mmproj.as_deref());
    let mut p = llama.over(base);
    p.mmproj = p.mmproj.as_deref().map(check_projector).transpose()?;
    p.draft = draft_of(&a.draft, p.draft.take())?;
    // --override-tensor's patterns come first, then the line's.
    cpu_overrides.append(&mut p.cpu_overrides);
    p.cpu_overrides = cpu_overrides;
    // The line's FFN pattern is its one spill; else --n-cpu-ffn's list.
    let n_cpu_ffn =
        if p.n_cpu_ffn > 0 { vec![p.n_cpu_ffn] } else { crate::ngl::parse_all(&a.n_cpu_ffn, "--n-cpu-ffn")? };
    let layers = info.n_layer;
    if let Some(k) = n_cpu_ffn.iter().find(|k| **k > layers) {
        return Err(bad(format!("--n-cpu-ffn {k}: the model has {layers} layers; give {layers} or less")));
    }
    Ok((p, crate::bench::Grid { ngl, n_cpu_moe, n_cpu_ffn }))
}

/// `bench --draft` measures one placement's layers with its draft: the
/// options it does not run beside one are refused, not ignored.
///
/// # Errors
/// `BadInput` naming the option.
pub fn bench_draft_alone(a: &BenchArgs, p: &crate::placement::Placement, grid: &crate::bench::Grid) -> Result<()> {
    let refused = if grid.n_cpu_moe != [0] || grid.n_cpu_ffn != [0] {
        Some("--n-cpu-moe and --n-cpu-ffn lists")
    } else if a.beside.is_some() {
        Some("--beside")
    } else if p.mmproj.is_some() {
        Some("--mmproj")
    } else if !p.devices.is_empty() || !p.tensor_split.is_empty() || p.split_mode != crate::placement::SplitMode::Layer
    {
        Some("--device, -ts and -sm")
    } else if p.n_parallel > 1 {
        Some("-np")
    } else {
        None
    };
    match refused {
        Some(what) => Err(bad(format!("{what} with a draft: bench --draft (or --mtp) measures the model's -ngl list with its draft beside it (one slot); drop them"))),
        None => Ok(()),
    }
}

/// The draft `--draft` names (or the line's `-md`), with `--draft-ngl`
/// and `--draft-max` laid over it; the file must exist.
///
/// # Errors
/// `BadInput` for a draft option without a draft, or a draft file that is not there.
fn draft_of(
    a: &crate::cli::DraftArgs,
    line: Option<crate::placement::Draft>,
) -> Result<Option<crate::placement::Draft>> {
    if let (Some(d), true) = (&a.draft, a.mtp) {
        return Err(bad(format!(
            "--draft {} and --mtp: one draft at a time; give --draft for a draft model or --mtp for the model's own MTP heads",
            d.display()
        )));
    }
    let asked = a.draft.clone().map(crate::placement::Draft::of);
    let mtp = a.mtp.then(|| crate::placement::Draft::mtp(crate::placement::DRAFT_N_MAX));
    let Some(mut d) = asked.or(mtp).or(line) else {
        if a.draft_ngl.is_some() || a.draft_max.is_some() || a.prompt_file.is_some() {
            return Err(bad(
                "--draft-ngl, --draft-max and --prompt-file measure a draft: give it with --draft MODEL (or --mtp for the model's own MTP heads)",
            ));
        }
        return Ok(None);
    };
    if let Some(m) = d.model.as_ref().filter(|m| !m.is_file()) {
        return Err(bad(format!("--draft {}: no such file; give the draft model's GGUF file", m.display())));
    }
    if let Some(f) = a.prompt_file.as_deref().filter(|f| !f.is_file()) {
        return Err(bad(format!("--prompt-file {}: no such file; give a text file", f.display())));
    }
    if d.is_mtp() && a.draft_ngl.is_some() {
        return Err(bad(
            "--draft-ngl with MTP heads: they are the model's own blocks, placed by -ngl; drop --draft-ngl",
        ));
    }
    d.n_gpu_layers = a.draft_ngl.or(d.n_gpu_layers);
    d.n_max = a.draft_max.unwrap_or(d.n_max);
    if d.n_max == 0 {
        return Err(bad("--draft-max 0 drafts nothing; give 1 or more (llama.cpp's default is 3)"));
    }
    Ok(Some(d))
}

/// A `--depth` every context (each parallel slot of it) can hold with room
/// for its tests, as `bench -c 512 -d 4096` is refused: never a depth
/// silently trimmed to what fits.
///
/// # Errors
/// `BadInput` naming the depth, the context and the fix.
pub fn check_depth(s: &crate::profile::Settings) -> Result<()> {
    let Some(d) = s.measure.n_depth else { return Ok(()) };
    let tests = s.measure.longest_test();
    for c in s.contexts() {
        let slot = c / s.workload.n_parallel.max(1);
        if d + tests > slot {
            let per = if s.workload.n_parallel > 1 {
                format!(" ({} slots of {slot})", s.workload.n_parallel)
            } else {
                String::new()
            };
            return Err(bad(format!(
                "--depth {d} leaves no room in the {c}-token context{per} for a {tests}-token test; give --depth {} or less, or a context of {} or more",
                slot.saturating_sub(tests),
                (d + tests) * s.workload.n_parallel.max(1)
            )));
        }
    }
    Ok(())
}

/// Bench's depths (`-d`), each with room for its tests in the context
/// when `-c` fixes one.
///
/// # Errors
/// `BadInput` for a list that does not parse, or a depth the context cannot hold.
pub fn bench_depths(a: &BenchArgs, p: &crate::placement::Placement) -> Result<Vec<u32>> {
    let depths = crate::ngl::parse_all(&a.n_depth, "-d")?;
    let w = &a.workload;
    let tests = w.n_prompt.unwrap_or(512).max(w.n_gen.unwrap_or(128));
    if let (Some(c), Some(d)) = (p.n_ctx, depths.iter().max()) {
        if d + tests > c {
            return Err(bad(format!(
                "-d {d} leaves no room in -c {c} for a {tests}-token test; give -c {} or more, or drop -c (the context is then sized as llama-bench does)",
                d + tests
            )));
        }
    }
    Ok(depths)
}

/// `reprofile`'s options, checked: the store, the ages, the thresholds, the Modelfile directory.
///
/// # Errors
/// `BadInput` naming the flag, the value and the fix.
pub fn reprofile_options(a: &ReprofileArgs) -> Result<crate::reprofile::ReprofileOptions> {
    let store = crate::profile::store::dir_or_default(a.store.given());
    crate::profile::store::check_dir(&store)?;
    if let Some(d) = &a.update_modelfiles {
        if !std::fs::metadata(d).is_ok_and(|m| m.is_dir()) {
            return Err(bad(format!(
                "--update-modelfiles {} is not a directory; pass the directory that holds your Modelfiles",
                d.display()
            )));
        }
    }
    Ok(crate::reprofile::ReprofileOptions {
        store,
        max_age: a.max_age,
        dry_run: a.dry_run,
        threshold: a.drift_threshold,
        update_modelfiles: a.update_modelfiles.clone(),
        wait_idle: a.wait_idle,
        busy_threshold: a.busy.threshold,
        verbose: a.talk.verbose,
        progress: !a.talk.quiet && !a.print.json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{default_to_tune, normalize_args, Cli, Command};
    use clap::Parser;

    fn cli(args: &[&str]) -> Command {
        let argv = default_to_tune(normalize_args(args.iter().map(|a| (*a).to_string())));
        Cli::try_parse_from(argv).expect("parses").command
    }

    fn tune_args(args: &[&str]) -> TuneArgs {
        match cli(args) {
            Command::Tune(a) => a,
            _ => unreachable!("a tune command line"),
        }
    }

    fn bench_args(args: &[&str]) -> BenchArgs {
        match cli(args) {
            Command::Bench(a) => a,
            _ => unreachable!("a bench command line"),
        }
    }

    /// A small model's facts (trained context 2048), read as the command line reads them.
    fn info() -> (tempfile::TempDir, ModelInfo) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        crate::synth::write_model(&p, &crate::synth::SynthSpec::default().with_n_layer(4).with_ctx_train(2048))
            .unwrap();
        let info = crate::model::inspect(&p).unwrap();
        (dir, info)
    }

    fn says(r: Result<impl std::fmt::Debug>, words: &str) {
        let e = r.expect_err(words);
        assert_eq!(crate::error::exit_code(&e), crate::error::exit::BAD_INPUT, "{e}");
        assert!(e.to_string().contains(words), "{e}");
    }

    #[test]
    fn budgets_are_one_size_and_sizes_per_device() {
        let (all, per) = parse_budgets("8GiB, RPC0=512MiB,CUDA1=2G").unwrap();
        assert_eq!(all, Some(8 << 30));
        assert_eq!(
            per.iter().map(|b| (b.device.as_str(), b.bytes)).collect::<Vec<_>>(),
            [("RPC0", 512 << 20), ("CUDA1", 2 << 30)]
        );
        says(parse_budgets("8GiB,4GiB"), "two sizes for every device");
        says(parse_budgets(" , "), "is empty");
        says(parse_budgets("RPC0=lots"), "not a size");
    }

    #[test]
    fn contexts_are_sorted_deduplicated_and_within_the_trained_context() {
        let (_d, info) = info();
        assert_eq!(parse_contexts("2048, 512,512", &info).unwrap(), [512, 2048]);
        says(parse_contexts("4096", &info), "larger than the 2048 tokens");
        says(parse_contexts("0", &info), "not a context size");
    }

    #[test]
    fn tune_settings_carry_what_the_command_line_asks_for() {
        let (_d, info) = info();
        let none = (None, Vec::new());
        let a = tune_args(&["ngl-tune", "m.gguf", "--no-warmup", "--quick", "-b", "1024", "--ctx", "512,1024"]);
        let s = tune_settings(&a, &info, (0.9, &none), &[]).unwrap();
        assert!(!s.measure.warmup, "--no-warmup is measured without warmup");
        assert_eq!(
            (s.measure.n_prompt, s.measure.n_gen, s.measure.repetitions, s.workload.n_batch),
            (128, 32, 2, 1024)
        );
        assert_eq!((s.workload.contexts.clone(), s.workload.n_ctx), (vec![512, 1024], 1024));
        assert!(tune_settings(&tune_args(&["ngl-tune", "m.gguf"]), &info, (0.9, &none), &[]).unwrap().measure.warmup);
        says(tune_settings(&tune_args(&["ngl-tune", "m.gguf", "-r", "0"]), &info, (0.9, &none), &[]), "-r 0");
        says(tune_settings(&tune_args(&["ngl-tune", "m.gguf", "-t", "0"]), &info, (0.9, &none), &[]), "-t 0");
        // Numbers are refused by the parser itself, each in one line naming the flag.
        for (flag, v) in [("--max-kl", "-1"), ("--busy-threshold", "x"), ("--target-vram", "2")] {
            let argv = default_to_tune(normalize_args(["ngl-tune", "m.gguf", flag, v].map(String::from)));
            let e = Cli::try_parse_from(argv).unwrap_err();
            let line = crate::cli::one_line(&e).expect("a value the parser refused");
            assert!(line.starts_with(&format!("{flag} {v}")), "{line}");
        }
    }

    #[test]
    fn bench_lays_a_llama_cpp_line_over_its_options() {
        let (_d, info) = info();
        let a = bench_args(&[
            "ngl-tune",
            "bench",
            "m.gguf",
            "-t",
            "3",
            "--cache-type",
            "q8_0",
            "--override-tensor",
            "output\\.weight=CPU",
            "--llama-args",
            "-ngl 2 -c 512 -ub 256 -ot 'blk\\.(0|1)\\.ffn_(up|down|gate)\\.weight=CPU'",
        ]);
        let (p, grid) = bench_placement(&a, &info).unwrap();
        assert_eq!((grid.ngl, grid.n_cpu_moe, grid.n_cpu_ffn), (vec![2], vec![0], vec![2]));
        assert_eq!((p.n_threads, p.n_ctx, p.n_ubatch, p.kv_type), (3, Some(512), 256, crate::placement::KvType::Q8_0));
        assert_eq!((p.n_cpu_ffn, p.cpu_overrides), (2, vec!["output\\.weight".to_string()]));
        says(
            bench_placement(&bench_args(&["ngl-tune", "bench", "m.gguf", "--llama-args", "--mlock"]), &info),
            "--mlock",
        );
        // --n-cpu-ffn sweeps like -ngl: each ngl with each spill, in order.
        let a = bench_args(&["ngl-tune", "bench", "m.gguf", "-ngl", "4,2", "--n-cpu-ffn", "0,1-2"]);
        let (_, grid) = bench_placement(&a, &info).unwrap();
        assert_eq!(grid.settings(), vec![(4, 0, 0), (4, 0, 1), (4, 0, 2), (2, 0, 0), (2, 0, 1), (2, 0, 2)]);
        let beyond = bench_args(&["ngl-tune", "bench", "m.gguf", "--n-cpu-ffn", "5"]);
        says(bench_placement(&beyond, &info), "--n-cpu-ffn 5: the model has 4 layers");
        let bad_ot = bench_args(&["ngl-tune", "bench", "m.gguf", "--override-tensor", "x=CUDA0"]);
        says(bench_placement(&bad_ot, &info), "PATTERN=CPU");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("6G").unwrap(), 6 << 30);
        assert_eq!(parse_size("1.5 GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("0").unwrap_err().to_string().contains("zero"));
        assert!(parse_size("lots").unwrap_err().to_string().contains("not a size"));
        assert!(parse_size("8 parsecs").unwrap_err().to_string().contains("unknown unit"));
    }
}
