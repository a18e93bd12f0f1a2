//! The tuner: plan a grid, run every trial in its own worker with the memory
//! sampler, checkpoint after each, fit, choose, confirm, write the profile.

pub mod choose;
pub mod knee;
pub mod plan;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};

use crate::clock::now_rfc3339;
use crate::engine::runner::{Interrupted, Runner};
use crate::engine::{Race, TrialResult, TrialSpec, TrialStatus};
use crate::model::{human_bytes, ModelInfo};
use crate::probe::{self, Hardware, LlamaDevice};
use crate::profile::store;
use crate::profile::{
    Checkpoint, FitCheck, MemoryPolicy, ModelIdentity, Profile, ProfileTrial, Recommendation, Settings, Tool,
    SCHEMA_VERSION,
};
use choose::{decide, Decision, Inputs, Objective};

/// Most confirmation trials before the tuner settles for what it measured.
const MAX_CONFIRMATIONS: usize = 5;

#[derive(Debug, Clone)]
pub struct TuneOptions {
    pub settings: Settings,
    pub store: PathBuf,
    pub resume: bool,
    pub verbose: bool,
    pub progress: bool,
    /// llama.cpp's devices, as the loadability check listed them.
    pub devices: Vec<crate::types::LlamaDevice>,
}

#[derive(Debug, Clone)]
pub struct TuneOutcome {
    pub profile: Profile,
    pub path: PathBuf,
    /// Said to the user once (missing sources, resumed work, ...).
    pub notes: Vec<String>,
}

/// How device memory is measured on this machine and the cap that follows.
#[must_use]
pub fn memory_policy(hw: &Hardware, target: f64, budget: Option<u64>) -> Option<MemoryPolicy> {
    #[allow(clippy::cast_precision_loss)]
    let mk = |source: &str, device: String, total: u64, baseline: u64| {
        let by_target = target * total as f64 - baseline as f64;
        let mut cap = by_target;
        let mut reason = format!(
            "{:.0}% of {} on {device}{} = {}",
            target * 100.0,
            human_bytes(total),
            if baseline > 0 { format!(", less {} already in use", human_bytes(baseline)) } else { String::new() },
            human_bytes(by_target.max(0.0) as u64)
        );
        if let Some(b) = budget {
            if (b as f64) < by_target {
                cap = b as f64;
                reason = format!("--vram-budget {} (stricter than {reason})", human_bytes(b));
            }
        }
        MemoryPolicy {
            source: source.to_string(),
            device,
            device_total_bytes: Some(total),
            baseline_bytes: baseline,
            cap_bytes: cap,
            cap_reason: reason,
        }
    };
    // NVML may see a GPU this llama.cpp cannot use (a CPU-only build): then
    // ngl does nothing, whatever the card.
    let offload: Vec<&LlamaDevice> = hw.llama_devices.iter().filter(|d| d.is_offload_target()).collect();
    if offload.is_empty() {
        return None;
    }
    if let Some(g) = hw.gpus.iter().max_by_key(|g| g.memory_total.unwrap_or(0)) {
        let total = g.memory_total.unwrap_or(0);
        let baseline = total.saturating_sub(g.memory_free.unwrap_or(total));
        return Some(mk("nvml", format!("nvml{} ({})", g.index, g.name), total, baseline));
    }
    let dev = offload.iter().max_by_key(|d| d.memory_total)?;
    let short = dev.description.split(" (").next().unwrap_or(&dev.description);
    let name = format!("{} ({short})", dev.name);
    if probe::ggml::has_budget(dev) {
        Some(mk("ggml", name, dev.memory_total, dev.memory_total - dev.memory_free))
    } else {
        Some(mk("accounted", name, dev.memory_total, 0))
    }
}

/// What a trial cost in the policy's currency, and the device-wide peak.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn trial_memory(r: &TrialResult, policy: &MemoryPolicy) -> (Option<f64>, Option<u64>) {
    match policy.source.as_str() {
        "nvml" | "ggml" => {
            let Some(m) = r.sampled.iter().filter(|m| m.source == policy.source).max_by_key(|m| m.peak_used) else {
                return (None, None);
            };
            let own = m.peak_pid_used.unwrap_or_else(|| m.peak_used.saturating_sub(m.baseline_used));
            (Some(own as f64), Some(m.peak_used))
        }
        _ => {
            if r.status != TrialStatus::Ok && r.model_buffers.is_empty() {
                return (None, None);
            }
            let acc = r.accounted_device_bytes();
            (Some(acc as f64), Some(policy.baseline_bytes + acc))
        }
    }
}

/// How a dry-run prediction held up in a finished trial: its error in
/// percent against llama.cpp's accounted memory, and, where a sampler is
/// trustworthy (NVML, or a llama.cpp device that reports its budget), the
/// sampled memory the trial cost minus the prediction: what llama.cpp does
/// not count (driver context, allocator slack).
#[must_use]
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
pub fn prediction_check(
    predicted: Option<u64>,
    r: &TrialResult,
    policy: Option<&MemoryPolicy>,
    mem: Option<f64>,
) -> (Option<f64>, Option<i64>) {
    match predicted {
        Some(pb) if r.status == TrialStatus::Ok => {
            let acc = r.accounted_device_bytes();
            // Nothing predicted and nothing allocated (ngl 0 without op offload) is exact.
            let err =
                if acc > 0 { Some((pb as f64 - acc as f64) / acc as f64 * 100.0) } else { (pb == 0).then_some(0.0) };
            let sampled = policy.filter(|p| p.source != "accounted").and(mem).map(|m| m as i64 - pb as i64);
            (err, sampled)
        }
        _ => (None, None),
    }
}

fn spec(info: &ModelInfo, s: &Settings, ngl: u32, threads: u32, n_cpu_moe: u32, op_offload: bool) -> TrialSpec {
    TrialSpec {
        model: info.path.clone(),
        n_gpu_layers: ngl,
        n_prompt: s.n_prompt,
        n_gen: s.n_gen,
        n_batch: s.n_batch,
        n_ubatch: s.n_ubatch,
        n_threads: threads,
        n_ctx: Some(s.n_ctx),
        repetitions: s.repetitions,
        warmup: true,
        flash_attn: s.flash_attn,
        seed: 1234,
        sample_interval_ms: s.sample_interval_ms,
        n_cpu_moe,
        op_offload,
        race: None,
    }
}

struct Sweep<'a> {
    info: &'a ModelInfo,
    opts: &'a TuneOptions,
    runner: Runner,
    policy: Option<MemoryPolicy>,
    trials: Vec<ProfileTrial>,
    checkpoint: Checkpoint,
    checkpoint_path: PathBuf,
    checkpoint_failed: bool,
    bar: ProgressBar,
    /// One plain line per trial on stderr (no terminal: CI, nohup, the journal).
    plain: bool,
    started: Instant,
    /// Trials offload host operations (llama.cpp's op offload).
    op_offload: bool,
    predicted: Vec<crate::engine::predict::Prediction>,
}

impl Sweep<'_> {
    fn run(&mut self, role: &str, ngl: u32, threads: u32) -> Result<&ProfileTrial> {
        self.run_with(role, ngl, threads, 0, None)
    }

    fn run_moe(&mut self, role: &str, ngl: u32, threads: u32, n_cpu_moe: u32) -> Result<&ProfileTrial> {
        self.run_with(role, ngl, threads, n_cpu_moe, None)
    }

    /// Racing thresholds from the best speeds measured so far: the
    /// objective's test alone decides (tg or pp), or each test for itself
    /// when the objective mixes both.
    fn race(&self) -> Race {
        let best = |pp: bool| {
            self.trials
                .iter()
                .filter(|t| t.is_search() && t.result.status == TrialStatus::Ok)
                .filter_map(|t| t.result.test(pp).map(|x| x.avg_ts))
                .reduce(f64::max)
                .map(|v| v * RACE_SHARE)
        };
        match self.opts.settings.objective {
            Objective::Tg => Race { pp_below_ts: None, tg_below_ts: best(false), skip_rest: true },
            Objective::Pp => Race { pp_below_ts: best(true), tg_below_ts: None, skip_rest: true },
            Objective::Mixed => Race { pp_below_ts: best(true), tg_below_ts: best(false), skip_rest: false },
        }
    }

    fn run_with(
        &mut self,
        role: &str,
        ngl: u32,
        threads: u32,
        n_cpu_moe: u32,
        race: Option<Race>,
    ) -> Result<&ProfileTrial> {
        self.bar.set_message(format!("ngl {ngl}{}", last_tg(&self.trials)));
        let mut spec = spec(self.info, &self.opts.settings, ngl, threads, n_cpu_moe, self.op_offload);
        spec.race = race.filter(|r| r.pp_below_ts.is_some() || r.tg_below_ts.is_some());
        let r = self.runner.run_settled(&spec, |_| {}).map_err(|e| {
            if e.is::<Interrupted>() {
                self.bar.abandon();
                let kept = if self.trials.is_empty() {
                    "no trial had finished".to_string()
                } else {
                    format!(
                        "{} finished trials are kept in {}; run the same command with --resume to continue",
                        self.trials.len(),
                        self.checkpoint_path.display()
                    )
                };
                e.context(format!("stopped at ngl {ngl}: {kept}"))
            } else {
                e
            }
        })?;
        let (mem, peak) = self.policy.as_ref().map_or((None, None), |p| trial_memory(&r, p));
        #[allow(clippy::cast_precision_loss)]
        let share = peak.zip(self.policy.as_ref().and_then(|p| p.device_total_bytes)).map(|(b, t)| b as f64 / t as f64);
        let over_cap = self.policy.as_ref().is_some_and(|p| mem.is_some_and(|m| m > p.cap_bytes));
        let predicted = self
            .predicted
            .iter()
            .find(|p| p.n_gpu_layers == ngl && p.error.is_none() && n_cpu_moe == 0)
            .map(|p| p.device_bytes);
        let (prediction_error_pct, sampled_minus_predicted_bytes) =
            prediction_check(predicted, &r, self.policy.as_ref(), mem);
        self.trials.push(ProfileTrial {
            role: role.to_string(),
            mem_bytes: mem,
            device_peak_bytes: peak,
            device_share: share,
            over_cap,
            predicted_bytes: predicted,
            prediction_error_pct,
            sampled_minus_predicted_bytes,
            result: r,
        });
        self.checkpoint.trials.clone_from(&self.trials);
        if let Err(e) = store::write_checkpoint(&self.checkpoint_path, &self.checkpoint) {
            // Measuring goes on: the trials are in memory and go into the profile.
            if !self.checkpoint_failed {
                self.bar.suspend(|| {
                    eprintln!("warning: {e:#}; tuning goes on, but an interrupt now would lose the finished trials");
                });
                self.checkpoint_failed = true;
            }
        }
        self.bar.inc(1);
        self.bar.set_message(format!("ngl {ngl} done{}", last_tg(&self.trials)));
        let last = self.trials.last().expect("just pushed");
        if self.plain {
            #[allow(clippy::cast_possible_truncation)]
            let (pos, len) = (self.bar.position() as usize, self.bar.length().unwrap_or(0) as usize);
            eprintln!("{}", crate::report::progress_line(pos, len, &last.result, self.started.elapsed()));
        }
        Ok(last)
    }

    fn done(&self, role: &str, ngl: u32, threads: u32) -> bool {
        self.trials.iter().any(|t| {
            t.role == role
                && t.result.spec.n_gpu_layers == ngl
                && t.result.spec.n_threads == threads
                && t.result.spec.n_cpu_moe == 0
        })
    }
}

fn last_tg(trials: &[ProfileTrial]) -> String {
    trials
        .iter()
        .rev()
        .find_map(|t| t.result.test(false))
        .map_or(String::new(), |t| format!(" | last tg {:.2} t/s", t.avg_ts))
}

/// The decision's inputs as a stored profile holds them.
#[must_use]
pub fn profile_inputs(p: &Profile) -> Inputs {
    Inputs {
        points: p.search_points(),
        full: p.model.n_layer_full,
        cap: p.memory.cap_bytes,
        objective: p.settings.objective,
        n_prompt: p.settings.n_prompt,
        n_gen: p.settings.n_gen,
        device: p.memory.device.clone(),
    }
}

fn inputs(trials: &[ProfileTrial], info: &ModelInfo, s: &Settings, policy: &MemoryPolicy) -> Inputs {
    Inputs {
        points: trials.iter().filter(|t| t.is_search()).map(ProfileTrial::point).collect(),
        full: info.n_layer_full,
        cap: policy.cap_bytes,
        objective: s.objective,
        n_prompt: s.n_prompt,
        n_gen: s.n_gen,
        device: policy.device.clone(),
    }
}

/// Runs the whole tuning and writes the profile.
///
/// # Errors
/// Worker start failures, an interrupt (the checkpoint keeps finished
/// trials), or a profile that cannot be written.
#[allow(clippy::too_many_lines)]
pub fn tune(info: &ModelInfo, opts: &TuneOptions) -> Result<TuneOutcome> {
    let started = Instant::now();
    let s = &opts.settings;
    let exe = std::env::current_exe()?;
    let hw = probe::hardware(opts.devices.clone());
    let identity = ModelIdentity::of(info);
    let path = store::profile_path(&opts.store, &hw.machine_id, &identity);
    let checkpoint_path = store::checkpoint_path(&opts.store, &hw.machine_id, &identity);
    let policy = memory_policy(&hw, s.target_vram, s.vram_budget_bytes);
    let mut notes = hw.notes.clone();

    let fresh = Checkpoint {
        schema_version: SCHEMA_VERSION,
        kind: "checkpoint".into(),
        created_at: now_rfc3339(),
        model: identity.clone(),
        fingerprint: hw.fingerprint.clone(),
        settings: s.clone(),
        trials: Vec::new(),
    };
    let previous = store::read_checkpoint(&checkpoint_path);
    let checkpoint = match previous {
        Some(c) if opts.resume && c.model == identity && c.settings == *s && c.fingerprint == hw.fingerprint => {
            notes.push(format!("resuming: {} finished trials from {}", c.trials.len(), checkpoint_path.display()));
            c
        }
        Some(_) if opts.resume => {
            notes.push(format!(
                "{} is for other settings, another model file or changed hardware; starting fresh",
                checkpoint_path.display()
            ));
            fresh
        }
        None if opts.resume => {
            notes.push("nothing to resume (no checkpoint for this model and machine); starting fresh".into());
            fresh
        }
        Some(c) => {
            notes.push(format!(
                "an unfinished tuning ({} trials) was replaced; --resume would have continued it",
                c.trials.len()
            ));
            fresh
        }
        None => fresh,
    };

    let no_gpu = policy.is_none();
    // Without a GPU device ngl does nothing: only thread counts are measured.
    let full_grid = match &s.grid {
        Some(g) => plan::normalize(g, info.n_layer_full),
        None => plan::default_grid(info.n_layer_full, 10),
    };
    let adaptive = s.search == "adaptive" && s.grid.is_none();
    let grid = if no_gpu || adaptive { Vec::new() } else { full_grid.clone() };
    let terminal = std::io::stderr().is_terminal();
    let only_software = probe::only_software_offload(&hw.llama_devices);
    let op_offload = s.op_offload.resolve(only_software);
    if !op_offload && s.op_offload == crate::engine::OpOffload::Auto {
        notes.push(probe::op_offload_note(&hw.llama_devices));
    }
    let bar = if opts.progress && terminal {
        let b = ProgressBar::new(grid.len() as u64);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} {elapsed_precise} [{bar:25}] {pos}/{len} trials, about {eta} left | {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.enable_steady_tick(Duration::from_millis(120));
        b
    } else {
        // Hidden, but still counting trials: the plain progress lines read it.
        ProgressBar::with_draw_target(Some(grid.len() as u64), indicatif::ProgressDrawTarget::hidden())
    };
    let mut sweep = Sweep {
        info,
        opts,
        runner: Runner::current(Duration::from_secs(s.trial_timeout_s), opts.verbose)?
            .with_sample_interval(Duration::from_millis(s.sample_interval_ms))
            .with_busy_threshold(s.busy_threshold),
        policy: policy.clone(),
        trials: checkpoint.trials.clone(),
        checkpoint,
        checkpoint_path: checkpoint_path.clone(),
        checkpoint_failed: false,
        bar,
        plain: opts.progress && !terminal,
        started,
        op_offload,
        predicted: Vec::new(),
    };
    sweep.bar.set_position(sweep.trials.len() as u64);

    let mut prediction = policy.as_ref().map(|p| predict(&exe, info, s, p, &full_grid, op_offload));
    if let Some(pr) = &prediction {
        sweep.predicted.clone_from(&pr.predictions);
        if let Some(e) = &pr.error {
            notes.push(format!(
                "llama.cpp's dry-run memory prediction is unavailable ({e}); every grid value is measured"
            ));
        }
    }
    let predicted_over: Vec<u32> = prediction.as_ref().map(|p| p.predicted_over_cap.clone()).unwrap_or_default();

    let mut skipped = Vec::new();
    for &ngl in &grid {
        if predicted_over.contains(&ngl) {
            sweep.bar.inc(1);
            continue;
        }
        if sweep.done("grid", ngl, s.n_threads) {
            continue;
        }
        let oom_below =
            sweep.trials.iter().any(|t| t.result.status == TrialStatus::Oom && t.result.spec.n_gpu_layers < ngl);
        if oom_below && !s.no_skip {
            skipped.push(ngl);
            sweep.bar.inc(1);
            continue;
        }
        sweep.run("grid", ngl, s.n_threads)?;
    }
    if adaptive && !no_gpu {
        // The two ends are always measured; more only where they can change the answer.
        sweep.bar.set_length(sweep.bar.position().max(2));
        let cap = policy.as_ref().map_or(f64::INFINITY, |p| p.cap_bytes);
        let n_max = largest_predicted_under(&sweep.predicted, cap, info.n_layer_full);
        // Expected faster end first, so the other one can be raced.
        let top_first = hw.llama_devices.iter().any(|d| d.is_offload_target() && !d.is_software_renderer());
        if let Some(note) = adaptive_search(&mut sweep, n_max, top_first, full_grid.len().saturating_sub(1))? {
            notes.push(note);
        }
    }

    let (decision, dense_ngl, rec_threads, rec_moe) = if let Some(policy) = &policy {
        let mut d = decide(&inputs(&sweep.trials, info, s, policy));
        let mut confirmations = 0;
        while d.needs_confirmation && confirmations < MAX_CONFIRMATIONS {
            confirmations += 1;
            sweep.bar.inc_length(1);
            let ngl = d.recommended_ngl;
            if !sweep.done("confirm", ngl, s.n_threads) {
                sweep.run("confirm", ngl, s.n_threads)?;
            }
            d = decide(&inputs(&sweep.trials, info, s, policy));
        }
        if d.needs_confirmation {
            notes.push(format!("after {MAX_CONFIRMATIONS} confirmation trials the prediction still moved; the recommendation is predicted, not measured"));
        }
        // Mixture of experts: all layers on the GPU but the experts of the
        // first K on the CPU (llama.cpp's --n-cpu-moe) often beats any whole-layer split.
        let moe = if info.is_moe() && !d.needs_confirmation && d.recommended_ngl < info.n_layer_full {
            Some(tune_moe(&mut sweep, info, &d)?)
        } else {
            None
        };
        if let Some((_, reason)) = &moe {
            d.reasons.push(reason.clone());
        }
        let moe_k = moe.map_or(0, |m| m.0);
        // Layers left on the CPU make the thread count matter: measure it there.
        let mut threads = s.n_threads;
        if d.recommended_ngl < info.n_layer_full && !d.needs_confirmation && moe_k == 0 {
            let (best, _, tried) = measure_threads(&mut sweep, &hw, d.recommended_ngl)?;
            threads = best;
            d.reasons.push(format!(
                "layers stay on the CPU at ngl {}: -t {best} is fastest there ({})",
                d.recommended_ngl,
                tried.join(", ")
            ));
        }
        (d.clone(), d.recommended_ngl, threads, moe_k)
    } else {
        let (d, n, t) = tune_threads(&mut sweep, &hw)?;
        (d, n, t, 0)
    };
    sweep.bar.finish_and_clear();

    let decision_trials: Vec<&ProfileTrial> = sweep.trials.iter().filter(|t| t.is_search()).collect();
    let search = (!no_gpu).then(|| {
        let runnable: Vec<u32> = full_grid.iter().copied().filter(|n| !predicted_over.contains(n)).collect();
        crate::profile::SearchReport {
            mode: if adaptive { "adaptive".into() } else { "grid".into() },
            trials: decision_trials.len(),
            trial_wall_s: decision_trials.iter().map(|t| t.result.wall_ms).sum::<f64>() / 1e3,
            grid_size: full_grid.len(),
            stopped_early: decision_trials.iter().filter(|t| t.result.tests.iter().any(|x| x.stopped_early)).count(),
            grid_estimate_s: adaptive
                .then(|| estimate_grid_s(&sweep.trials, &runnable, s, info.n_layer_full))
                .flatten(),
        }
    });
    let trials = sweep.trials;
    if let Some(n) = noise_note(&trials) {
        notes.push(n);
    }
    let busy = crate::report::busy_note(trials.iter().map(|t| &t.result));
    let confidence = if busy.is_some() { crate::profile::Confidence::Low } else { crate::profile::Confidence::High };
    notes.extend(busy);
    notes.extend(crate::report::threads_note(trials.iter().map(|t| &t.result)));
    if let Some(pr) = prediction.as_mut() {
        pr.max_error_pct = trials.iter().filter_map(|t| t.prediction_error_pct).map(f64::abs).reduce(f64::max);
        let fit_ngl = pr.llama_fit.as_ref().and_then(|f| f.n_gpu_layers).map(|n| {
            if n < 0 {
                info.n_layer_full
            } else {
                u32::try_from(n).unwrap_or(0).min(info.n_layer_full)
            }
        });
        pr.llama_fit_tg_ts = fit_ngl.and_then(|n| {
            trials
                .iter()
                .find(|t| t.result.spec.n_gpu_layers.min(info.n_layer_full) == n && t.result.status == TrialStatus::Ok)
                .and_then(|t| t.result.test(false))
                .map(|x| x.avg_ts)
        });
    }
    let fit_checks = policy.as_ref().map(|_| fit_check(&trials, &decision, info.n_layer_full)).unwrap_or_default();
    // With expert offload every layer is on the GPU but the first K layers' experts.
    let rec_ngl = if rec_moe > 0 { info.n_layer_full } else { dense_ngl };
    let rec_trial = trials.iter().find(|t| {
        t.result.spec.n_gpu_layers == rec_ngl
            && t.result.spec.n_threads == rec_threads
            && t.result.spec.n_cpu_moe == rec_moe
            && t.result.status == TrialStatus::Ok
    });
    let recommendation = Recommendation {
        n_cpu_moe: rec_moe,
        ollama_num_gpu: (rec_moe > 0).then_some(dense_ngl),
        n_gpu_layers: rec_ngl,
        n_threads: rec_threads,
        n_ctx: s.n_ctx,
        measured: rec_trial.is_some(),
        confidence,
        op_offload,
        tg_ts: rec_trial.and_then(|t| t.result.test(false)).map(|t| t.avg_ts).or(decision.predicted_tg),
        pp_ts: rec_trial.and_then(|t| t.result.test(true)).map(|t| t.avg_ts).or(decision.predicted_pp),
        mem_bytes: rec_trial.and_then(|t| t.mem_bytes).or(decision.predicted_mem),
        modelfile: Recommendation::modelfile_lines(dense_ngl, rec_threads, s.n_ctx),
        llama_cpp_args: Recommendation::llama_cpp_args(rec_ngl, rec_threads, s.n_ctx, rec_moe, op_offload),
    };
    let profile = Profile {
        schema_version: SCHEMA_VERSION,
        tool: Tool::this(),
        created_at: now_rfc3339(),
        machine_id: hw.machine_id.clone(),
        fingerprint: hw.fingerprint.clone(),
        memory: policy.unwrap_or_else(|| MemoryPolicy {
            source: "none".into(),
            device: "the CPU (no GPU device)".into(),
            device_total_bytes: None,
            baseline_bytes: 0,
            cap_bytes: 0.0,
            cap_reason: "no GPU device: ngl has no effect".into(),
        }),
        hardware: hw,
        model: identity,
        settings: s.clone(),
        no_gpu,
        trials,
        skipped,
        decision,
        memory_fit_check: fit_checks,
        recommendation,
        prediction,
        search,
        notes: notes.clone(),
        wall_s: started.elapsed().as_secs_f64(),
    };
    // Keep the version being replaced: history is what re-profiling compares against.
    let archived = store::archive(&path, &store::history_dir(&opts.store, &profile.machine_id, &profile.model));
    let written = archived.and_then(|_| store::write_profile(&path, &profile));
    if let Err(e) = written {
        // Never lose a finished tuning: keep it somewhere, and say where.
        let fallback = std::env::temp_dir().join(format!(
            "ngl-tune-{}-{}-{}.json",
            profile.model.file_name.trim_end_matches(".gguf"),
            profile.model.id(),
            std::process::id()
        ));
        let saved = match store::write_profile(&fallback, &profile) {
            Ok(()) => format!("this run's profile was saved to {}", fallback.display()),
            Err(_) => {
                println!("{}", serde_json::to_string_pretty(&profile)?);
                "this run's profile is printed above".to_string()
            }
        };
        return Err(e.context(format!("the tuning finished but its profile could not be stored; {saved}")));
    }
    let _ = std::fs::remove_file(&checkpoint_path);
    Ok(TuneOutcome { profile, path, notes })
}

/// Share of the mean above which a test's repetitions count as noisy.
pub const NOISY: f64 = 0.10;

/// A warning, in words the user can act on, when repetitions of a test
/// varied so much that something else was probably using the machine.
#[must_use]
pub fn noise_note(trials: &[ProfileTrial]) -> Option<String> {
    let worst = trials
        .iter()
        .filter(|t| t.result.status == TrialStatus::Ok)
        .flat_map(|t| t.result.tests.iter().map(move |x| (t, x)))
        .filter(|(_, x)| x.avg_ts > 0.0 && x.samples_ts.len() > 1)
        .map(|(t, x)| (t, x, x.stddev_ts / x.avg_ts))
        .max_by(|a, b| a.2.total_cmp(&b.2))?;
    let (t, x, cv) = worst;
    (cv > NOISY).then(|| {
        format!(
            "noisy measurement: {} at ngl {} -t {} varied by {:.0}% between repetitions ({:.2} ± {:.2} t/s); something else was probably using the machine: re-run when it is idle, or with more repetitions (-r)",
            x.name(),
            t.result.spec.n_gpu_layers,
            t.result.spec.n_threads,
            cv * 100.0,
            x.avg_ts,
            x.stddev_ts
        )
    })
}

/// Asks llama.cpp, before any trial, what every grid setting will allocate
/// on the device (its dry run) and what its own fit would choose for the
/// same memory margin.
fn predict(
    exe: &std::path::Path,
    info: &ModelInfo,
    s: &Settings,
    policy: &MemoryPolicy,
    grid: &[u32],
    op_offload: bool,
) -> crate::profile::PredictionReport {
    use crate::engine::predict::{predict_in_child, PredictSpec};
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let margin =
        policy.device_total_bytes.map(|t| (t as f64 - policy.baseline_bytes as f64 - policy.cap_bytes).max(0.0) as u64);
    let spec = PredictSpec {
        model: info.path.clone(),
        ngl: grid.to_vec(),
        n_ctx: s.n_ctx,
        n_batch: s.n_batch,
        n_ubatch: s.n_ubatch,
        flash_attn: s.flash_attn,
        op_offload,
        fit_margin_bytes: margin,
    };
    match predict_in_child(exe, &spec) {
        Ok(out) => {
            #[allow(clippy::cast_precision_loss)]
            let predicted_over_cap = out
                .predictions
                .iter()
                .filter(|p| p.n_gpu_layers > 0 && p.error.is_none() && p.device_bytes as f64 > policy.cap_bytes)
                .map(|p| p.n_gpu_layers)
                .collect();
            crate::profile::PredictionReport {
                predictions: out.predictions,
                llama_fit: out.llama_fit,
                predicted_over_cap,
                max_error_pct: None,
                llama_fit_tg_ts: None,
                error: None,
            }
        }
        Err(e) => crate::profile::PredictionReport {
            predictions: Vec::new(),
            llama_fit: None,
            predicted_over_cap: Vec::new(),
            max_error_pct: None,
            llama_fit_tg_ts: None,
            error: Some(format!("{e:#}")),
        },
    }
}

/// The largest ngl whose dry-run prediction stays under the cap, with
/// memory taken as linear between the predicted grid points; full offload
/// when nothing was predicted.
#[must_use]
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn largest_predicted_under(predicted: &[crate::engine::predict::Prediction], cap: f64, full: u32) -> u32 {
    let mut pts: Vec<(u32, f64)> =
        predicted.iter().filter(|p| p.error.is_none()).map(|p| (p.n_gpu_layers, p.device_bytes as f64)).collect();
    pts.sort_by_key(|p| p.0);
    if pts.is_empty() {
        return full;
    }
    let mut best = 0;
    for w in pts.windows(2) {
        let ((n0, m0), (n1, m1)) = (w[0], w[1]);
        if m1 <= cap {
            best = n1;
        } else if m0 <= cap && m1 > m0 {
            let x = f64::from(n0) + (cap - m0) / (m1 - m0) * f64::from(n1 - n0);
            best = best.max(x.floor() as u32);
            break;
        } else {
            break;
        }
    }
    best.min(full)
}

/// A racing trial stops a test after one repetition when it is slower than
/// this share of the best speed measured so far: a gap no repetition noise
/// closes (repetitions varying by more than 10% are already called noisy).
pub const RACE_SHARE: f64 = 0.5;

/// Full offload (or the largest setting under the cap) at least this much
/// slower than ngl 0 means offloading only hurts: no interior point is needed.
pub const HURTS_BY: f64 = 0.25;

/// Adaptive search. Measures the two ends first: ngl 0 and the largest
/// setting predicted under the cap (`n_max`), the one expected to be faster
/// first (`top_first`) so the other can be raced. Time per token is linear in
/// the layers offloaded plus a split cost that is never negative, so no
/// partial setting beats both ends: when the top end is clearly slower than
/// ngl 0 the search stops there and says why. Otherwise one interior point
/// (two when offloading pays) fits the line, as long as the search stays
/// under `max_trials` (one less than the grid); the decision and its
/// confirmation loop do the rest. `measure` runs a setting and returns its
/// objective score (None when it failed).
///
/// # Errors
/// What `measure` returns.
pub fn adaptive_points(
    n_max: u32,
    top_first: bool,
    max_trials: usize,
    measure: &mut dyn FnMut(u32) -> Result<Option<f64>>,
) -> Result<Option<String>> {
    let trials = std::cell::Cell::new(0usize);
    let mut counted = |n: u32| {
        trials.set(trials.get() + 1);
        measure(n)
    };
    let measure: &mut dyn FnMut(u32) -> Result<Option<f64>> = &mut counted;
    if n_max == 0 {
        measure(0)?;
        return Ok(None);
    }
    let mut top = n_max;
    let mut step_down = |measure: &mut dyn FnMut(u32) -> Result<Option<f64>>| -> Result<(u32, Option<f64>)> {
        let mut score = measure(top)?;
        // Out of memory despite the prediction: step down.
        for _ in 0..3 {
            if score.is_some() || top < 2 {
                break;
            }
            top = top * 3 / 4;
            score = measure(top)?;
        }
        Ok((top, score))
    };
    let (zero, (top, at_top)) = if top_first {
        let t = step_down(measure)?;
        (measure(0)?, t)
    } else {
        let z = measure(0)?;
        (z, step_down(measure)?)
    };
    if let (Some(z), Some(t)) = (zero, at_top) {
        if t < z * (1.0 - HURTS_BY) {
            return Ok(Some(format!(
                "adaptive search stopped after the two ends: ngl {top} is {:.0}% slower than ngl 0, and time per token grows linearly with the layers offloaded, so no setting between them can beat ngl 0",
                (1.0 - t / z) * 100.0
            )));
        }
    }
    // Interior points refine the line and find the knee; never as many
    // trials as the grid itself.
    let mut budget = max_trials.saturating_sub(trials.get());
    if top >= 2 && budget > 0 {
        let mid = measure(top / 2)?;
        budget -= 1;
        let pays = matches!((zero, at_top), (Some(a), Some(b)) if b > a);
        if pays && top >= 4 && mid.is_some() && budget > 0 {
            measure(top * 3 / 4)?;
        }
    }
    Ok(None)
}

fn adaptive_search(sweep: &mut Sweep<'_>, n_max: u32, top_first: bool, max_trials: usize) -> Result<Option<String>> {
    let t = sweep.opts.settings.n_threads;
    adaptive_points(n_max, top_first, max_trials, &mut |ngl| {
        let at = |x: &&ProfileTrial| x.is_search() && x.result.spec.n_gpu_layers == ngl;
        if !sweep.trials.iter().any(|x| at(&x)) {
            if sweep.bar.position() >= sweep.bar.length().unwrap_or(0) {
                sweep.bar.inc_length(1);
            }
            let race = sweep.race();
            sweep.run_with("grid", ngl, t, 0, Some(race))?;
        }
        let s = &sweep.opts.settings;
        Ok(sweep.trials.iter().find(|x| at(x) && x.result.status == TrialStatus::Ok).and_then(|x| trial_score(x, s)))
    })
}

/// What the full grid would have cost, from what was measured: a grid
/// setting measured in full counts its own wall time; any other is the
/// trials' mean fixed cost (start, load) plus its warm-ups and repetitions
/// at the speeds the curves give there (for a test never run near a
/// setting, its nearest measured speed).
/// `None` without two measured points.
#[must_use]
pub fn estimate_grid_s(trials: &[ProfileTrial], grid: &[u32], s: &Settings, full: u32) -> Option<f64> {
    let ok: Vec<&ProfileTrial> =
        trials.iter().filter(|t| t.is_search() && t.result.status == TrialStatus::Ok).collect();
    let curve = |pp: bool| {
        let pts = ok
            .iter()
            .filter_map(|t| {
                t.result.test(pp).filter(|x| x.avg_ts > 0.0).map(|x| (t.result.spec.n_gpu_layers, x.avg_ts))
            })
            .map(|(n, ts)| (n.min(full), 1.0 / ts))
            .collect();
        crate::curve::Curve::new(pts, full)
    };
    let (pp_time, tg_time) = (curve(true), curve(false));
    // Where a curve cannot say (the pp of settings whose pp never ran), the
    // nearest measured speed stands in. Scaling it as the other test scales
    // was tried and overshot five-fold on llvmpipe, where pp hardly changes
    // with ngl; the nearest speed errs low, so the savings are not overstated.
    let per_token = |c: &crate::curve::Curve, n: u32| {
        c.predict(n).or_else(|| c.measured.iter().min_by_key(|(m, _)| m.abs_diff(n)).map(|p| p.1))
    };
    // Seconds of measuring at `ngl`: each test run (`Some(repetitions)`) with its warm-up.
    let measuring = |ngl: u32, pp_reps: Option<f64>, tg_reps: Option<f64>| -> Option<f64> {
        let mut secs = 0.0;
        if let Some(r) = pp_reps {
            secs += (r + 1.0) * f64::from(s.n_prompt) * per_token(&pp_time, ngl)?;
        }
        if let Some(r) = tg_reps {
            secs += (r * f64::from(s.n_gen) + 1.0) * per_token(&tg_time, ngl)?;
        }
        Some(secs)
    };
    #[allow(clippy::cast_precision_loss)]
    let reps_run = |t: &ProfileTrial, pp: bool| t.result.test(pp).map(|x| x.samples_ns.len() as f64);
    let fixed: Vec<f64> = ok
        .iter()
        .filter_map(|t| {
            let n = t.result.spec.n_gpu_layers.min(full);
            Some(t.result.wall_ms / 1e3 - measuring(n, reps_run(t, true), reps_run(t, false))?)
        })
        .collect();
    if ok.len() < 2 || fixed.is_empty() {
        return None;
    }
    let fixed = crate::stats::mean(&fixed).max(0.0);
    let reps = f64::from(s.repetitions);
    let (pp_reps, tg_reps) = ((s.n_prompt > 0).then_some(reps), (s.n_gen > 0).then_some(reps));
    grid.iter()
        .map(|&n| {
            let whole = ok.iter().find(|t| {
                t.result.spec.n_gpu_layers.min(full) == n
                    && t.result.tests.iter().all(|x| !x.stopped_early)
                    && t.result.tests.len() == t.result.spec.tests().len()
            });
            match whole {
                Some(t) => Some(t.result.wall_ms / 1e3),
                None => Some(fixed + measuring(n, pp_reps, tg_reps)?),
            }
        })
        .sum()
}

/// A measured trial's value for the tuning objective (higher is better).
fn trial_score(t: &ProfileTrial, s: &Settings) -> Option<f64> {
    let speed = |pp: bool| t.result.test(pp).map(|x| x.avg_ts);
    choose::score(s.objective, s.n_prompt, s.n_gen, speed(false), speed(true))
}

/// The `--n-cpu-moe` values worth measuring: none, a quarter, half, three
/// quarters and all of the layers.
#[must_use]
pub fn moe_grid(n_layer: u32) -> Vec<u32> {
    let mut g: Vec<u32> = [0, n_layer / 4, n_layer / 2, n_layer * 3 / 4, n_layer].to_vec();
    g.sort_unstable();
    g.dedup();
    g
}

/// Measures full offload with the experts of the first K layers on the CPU
/// for K in [`moe_grid`] (most experts on the CPU first: least memory), and
/// returns the K to recommend (0: the whole-layer split stays best) with the
/// reason in words.
fn tune_moe(sweep: &mut Sweep<'_>, info: &ModelInfo, d: &Decision) -> Result<(u32, String)> {
    let s = sweep.opts.settings.clone();
    let full = info.n_layer_full;
    let grid = moe_grid(info.n_layer);
    sweep.bar.inc_length(grid.len() as u64);
    for &k in grid.iter().rev() {
        let exists = sweep
            .trials
            .iter()
            .any(|t| t.role == "moe" && t.result.spec.n_gpu_layers == full && t.result.spec.n_cpu_moe == k);
        if !exists {
            sweep.run_moe("moe", full, s.n_threads, k)?;
        }
    }
    let score = |t: &ProfileTrial| trial_score(t, &s);
    let best_moe = sweep
        .trials
        .iter()
        .filter(|t| t.role == "moe" && t.result.status == TrialStatus::Ok && !t.over_cap)
        .filter_map(|t| score(t).map(|v| (t.result.spec.n_cpu_moe, v, t.mem_bytes)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let dense = sweep
        .trials
        .iter()
        .find(|t| {
            t.role != "moe"
                && t.result.spec.n_gpu_layers == d.recommended_ngl
                && t.result.spec.n_cpu_moe == 0
                && t.result.status == TrialStatus::Ok
        })
        .and_then(score);
    let tried: Vec<String> = sweep
        .trials
        .iter()
        .filter(|t| t.role == "moe")
        .map(|t| {
            let v = score(t).map_or_else(|| t.result.status.as_str().to_string(), |v| format!("{v:.2} t/s"));
            format!("K={} {v}{}", t.result.spec.n_cpu_moe, if t.over_cap { " (over cap)" } else { "" })
        })
        .collect();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(match (best_moe, dense) {
        (Some((k, v, mem)), Some(dv)) if v > dv => (
            k,
            format!(
                "mixture of experts: every layer on the GPU with the experts of the first {k} on the CPU (--n-cpu-moe {k}) is fastest: {v:.2} t/s in {} against {dv:.2} at ngl {} ({})",
                mem.map_or_else(|| "?".to_string(), |m| crate::model::human_bytes(m.max(0.0) as u64)),
                d.recommended_ngl,
                tried.join(", ")
            ),
        ),
        _ => (
            0,
            format!(
                "mixture of experts: --n-cpu-moe at full offload measured ({}); the whole-layer split stays best",
                tried.join(", ")
            ),
        ),
    })
}

/// Measures thread counts (physical cores, logical cores, half the physical
/// ones, and the configured count) at `ngl`, reusing trials already run there,
/// and returns the fastest for the objective with what was tried, in words.
fn measure_threads(sweep: &mut Sweep<'_>, hw: &Hardware, ngl: u32) -> Result<(u32, f64, Vec<String>)> {
    let mut counts =
        vec![hw.cpu.physical_cores.max(1), hw.cpu.logical_cores.max(1), (hw.cpu.physical_cores / 2).max(1)];
    counts.push(sweep.opts.settings.n_threads);
    counts.sort_unstable();
    counts.dedup();
    let at = |t: &ProfileTrial, n: u32| {
        t.result.spec.n_gpu_layers == ngl && t.result.spec.n_threads == n && t.result.spec.n_cpu_moe == 0
    };
    let todo: Vec<u32> = counts.iter().copied().filter(|n| !sweep.trials.iter().any(|t| at(t, *n))).collect();
    sweep.bar.inc_length(todo.len() as u64);
    for t in todo {
        // Raced as search trials are: a thread count far behind on the
        // objective stops after one repetition of its test.
        let race = sweep.race();
        sweep.run_with("threads", ngl, t, 0, Some(race))?;
    }
    let s = &sweep.opts.settings;
    let measured: Vec<(u32, Option<f64>, &str)> = counts
        .iter()
        .filter_map(|n| sweep.trials.iter().find(|t| at(t, *n)))
        .map(|t| {
            let score = trial_score(t, s).filter(|_| t.result.status == TrialStatus::Ok);
            (t.result.spec.n_threads, score, t.result.status.as_str())
        })
        .collect();
    let best = measured.iter().filter_map(|(n, sc, _)| sc.map(|v| (*n, v))).max_by(|a, b| a.1.total_cmp(&b.1));
    let (threads, score) = best.unwrap_or((s.n_threads, 0.0));
    let tried = measured
        .iter()
        .map(|(n, sc, st)| sc.map_or_else(|| format!("-t {n} {st}"), |v| format!("-t {n} {v:.2} t/s")))
        .collect();
    Ok((threads, score, tried))
}

/// No GPU: ngl does nothing, so measure thread counts (physical, logical,
/// half) at ngl 0 and keep the fastest.
fn tune_threads(sweep: &mut Sweep<'_>, hw: &Hardware) -> Result<(Decision, u32, u32)> {
    let (threads, tg, tried) = measure_threads(sweep, hw, 0)?;
    let d = Decision {
        recommended_ngl: 0,
        needs_confirmation: false,
        max_ngl_under_cap: None,
        predicted_tg: Some(tg),
        predicted_pp: None,
        predicted_mem: None,
        over_cap: Vec::new(),
        knee: None,
        knee_note: "no GPU device: no knee to find".into(),
        offload_hurts: false,
        fits: choose::Fits { tg_time: None, pp_time: None, memory: None },
        fit_notes: Vec::new(),
        reasons: vec![
            "ngl has no effect here (no GPU device in this build or on this machine): every layer runs on the CPU"
                .into(),
            format!("tuned threads instead: -t {threads} is fastest ({})", tried.join(", ")),
        ],
    };
    Ok((d, 0, threads))
}

/// The memory fit against each measured grid point (partial offload and
/// full offload predicted from the partial-offload line; ngl 0 is its own point).
#[must_use]
pub fn fit_check(trials: &[ProfileTrial], d: &Decision, full: u32) -> Vec<FitCheck> {
    let Some(fit) = &d.fits.memory else { return Vec::new() };
    trials
        .iter()
        .filter(|t| t.result.status == TrialStatus::Ok && t.result.spec.n_gpu_layers > 0 && t.role != "moe")
        .filter_map(|t| {
            let ngl = t.result.spec.n_gpu_layers.min(full);
            let m = t.mem_bytes?;
            let f = fit.at(f64::from(ngl));
            Some(FitCheck {
                ngl,
                measured_bytes: m,
                fitted_bytes: f,
                error_pct: if m > 0.0 { (f - m) / m * 100.0 } else { 0.0 },
            })
        })
        .collect()
}

/// Parses "8GiB", "512MiB", "8G", "1.5 GB", "123456" (bytes).
///
/// # Errors
/// `BadInput` naming the value and the accepted forms.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| {
        crate::error::bad(format!("--vram-budget '{s}' is not a size; write it like 8GiB, 512MiB or 6G"))
    })?;
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
                "--vram-budget '{s}' has an unknown unit '{unit}'; use B, KiB, MiB, GiB or TiB (8GiB)"
            )))
        }
    };
    let bytes = n * mult;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(crate::error::bad(format!("--vram-budget '{s}' is zero; give a positive size like 8GiB")));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(bytes as u64)
}

/// Parses and checks `--target-vram`.
///
/// # Errors
/// `BadInput` unless 0 < F <= 1.
pub fn parse_target(s: &str) -> Result<f64> {
    let f: f64 = s.trim().parse().map_err(|_| {
        crate::error::bad(format!("--target-vram '{s}' is not a number; give a fraction of device memory like 0.9"))
    })?;
    if f.is_nan() || f <= 0.0 || f > 1.0 {
        return Err(crate::error::bad(format!(
            "--target-vram {s} is outside (0, 1]; give the share of device memory to use, like 0.9"
        )));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn largest_setting_under_the_cap_from_predictions() {
        use crate::engine::predict::Prediction;
        let p = |n: u32, b: u64| Prediction {
            n_gpu_layers: n,
            device_bytes: b,
            device_model_bytes: b,
            buffers: vec![],
            error: None,
        };
        let preds = [p(0, 0), p(10, 100), p(20, 200), p(30, 300), p(35, 400)];
        assert_eq!(largest_predicted_under(&preds, 1000.0, 35), 35);
        assert_eq!(largest_predicted_under(&preds, 250.0, 35), 25);
        assert_eq!(largest_predicted_under(&preds, 100.0, 35), 10);
        assert_eq!(largest_predicted_under(&preds, 50.0, 35), 5);
        assert_eq!(largest_predicted_under(&[], 50.0, 35), 35, "no prediction: try full offload");
    }

    /// A GPU-shaped world: the llama-bench README's 7B Q4_0 (tg 13.45 / 21.36 /
    /// 40.04 / 71.76 / 131.66 at ngl 10 / 20 / 30 / 34 / 35, about 8 at ngl 0),
    /// time per token interpolated between them, memory 0.5 GiB + 0.1 GiB per layer.
    fn readme_world(ngl: u32) -> (f64, f64) {
        let pts = [(0.0, 8.0), (10.0, 13.45), (20.0, 21.36), (30.0, 40.04), (34.0, 71.76), (35.0, 131.66)];
        let x = f64::from(ngl);
        let tg = pts
            .windows(2)
            .find(|w| x >= w[0].0 && x <= w[1].0)
            .map(|w| {
                let (t0, t1) = (1.0 / w[0].1, 1.0 / w[1].1);
                1.0 / (t0 + (x - w[0].0) / (w[1].0 - w[0].0) * (t1 - t0))
            })
            .unwrap_or(8.0);
        (tg, (0.5 + 0.1 * x) * 1024.0 * 1024.0 * 1024.0)
    }

    fn decide_on(ngls: &[u32], cap: f64, full: u32, world: fn(u32) -> (f64, f64)) -> u32 {
        use choose::{decide, Inputs, Objective, Point};
        let mut measured: Vec<u32> = ngls.to_vec();
        loop {
            let points = measured
                .iter()
                .map(|&n| {
                    let (tg, mem) = world(n);
                    Point { ngl: n, ok: true, oom: false, tg: Some(tg), pp: None, mem: Some(mem) }
                })
                .collect();
            let d = decide(&Inputs {
                points,
                full,
                cap,
                objective: Objective::Tg,
                n_prompt: 512,
                n_gen: 128,
                device: "GPU".into(),
            });
            if !d.needs_confirmation || measured.len() > 12 {
                return d.recommended_ngl;
            }
            measured.push(d.recommended_ngl);
        }
    }

    #[test]
    fn adaptive_reaches_the_grids_answer_on_gpu_shaped_curves_with_fewer_trials() {
        const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
        let grid = plan::default_grid(35, 10);
        for top_first in [true, false] {
            for cap in [80.0 * GIB, 3.75 * GIB, 3.05 * GIB, 2.0 * GIB] {
                let n_max = ((cap / GIB - 0.5) / 0.1).floor().clamp(0.0, 35.0) as u32;
                let mut seen = Vec::new();
                let note = adaptive_points(n_max, top_first, grid.len() - 1, &mut |n| {
                    seen.push(n);
                    Ok(Some(readme_world(n).0))
                })
                .unwrap();
                assert_eq!(note, None, "offloading pays on this curve: interior points are measured");
                let by_grid = decide_on(&grid, cap, 35, readme_world);
                let by_adaptive = decide_on(&seen, cap, 35, readme_world);
                assert_eq!(by_adaptive, by_grid, "cap {} GiB: adaptive measured {seen:?}", cap / GIB);
                assert!(seen.len() < grid.len(), "{seen:?}");
                assert_eq!(seen[0], if top_first { n_max } else { 0 }, "{seen:?}");
            }
        }
    }

    /// A CPU-like offload device (llvmpipe): every layer moved costs time.
    fn hurting_world(ngl: u32) -> (f64, f64) {
        (800.0 / (1.0 + f64::from(ngl)), 1e6 * f64::from(ngl))
    }

    #[test]
    fn adaptive_stops_after_the_ends_when_offloading_only_hurts() {
        let mut seen = Vec::new();
        let note = adaptive_points(41, false, 5, &mut |n| {
            seen.push(n);
            Ok(Some(hurting_world(n).0))
        })
        .unwrap();
        assert_eq!(seen, [0, 41], "the two ends decide it");
        let note = note.expect("the skipped interior is explained");
        assert!(note.contains("ngl 41 is 98% slower than ngl 0"), "{note}");
        let grid = plan::default_grid(41, 10);
        assert_eq!(decide_on(&seen, 1e12, 41, hurting_world), 0);
        assert_eq!(decide_on(&grid, 1e12, 41, hurting_world), 0, "the grid agrees");
    }

    #[test]
    fn adaptive_measures_the_interior_when_the_ends_are_close() {
        // Full offload 10% slower than ngl 0: within what noise and a
        // curved line could explain, so the interior is measured.
        let mut seen = Vec::new();
        let note = adaptive_points(19, true, 5, &mut |n| {
            seen.push(n);
            Ok(Some(if n == 19 { 90.0 } else { 100.0 - f64::from(n) }))
        })
        .unwrap();
        assert_eq!(note, None);
        assert_eq!(seen, [19, 0, 9]);
    }

    #[test]
    fn adaptive_steps_down_from_an_out_of_memory_top() {
        let mut seen = Vec::new();
        adaptive_points(40, true, 9, &mut |n| {
            seen.push(n);
            Ok((n <= 22).then(|| 10.0 + f64::from(n)))
        })
        .unwrap();
        assert_eq!(seen, [40, 30, 22, 0, 11, 16], "40 and 30 fail, 22 runs; then 0 and two interior points");
    }

    /// gemma-3-270m on a real GPU, roughly: 19 settings, full offload 4x ngl 0.
    fn small_gpu_world(ngl: u32) -> (f64, f64) {
        let t = |n: f64| 1.0 / 100.0 + (1.0 / 400.0 - 1.0 / 100.0) * n / 19.0;
        (1.0 / t(f64::from(ngl)), 300e6 + 10e6 * f64::from(ngl))
    }

    #[test]
    fn adaptive_never_runs_as_many_trials_as_a_small_grid() {
        let grid = plan::default_grid(19, 10);
        let mut seen = Vec::new();
        let note = adaptive_points(19, true, grid.len() - 1, &mut |n| {
            seen.push(n);
            Ok(Some(small_gpu_world(n).0))
        })
        .unwrap();
        assert_eq!(note, None);
        assert_eq!(seen, [19, 0], "the grid has 3 settings: the two ends only");
        assert_eq!(decide_on(&seen, 1e12, 19, small_gpu_world), 19);
        assert_eq!(decide_on(&grid, 1e12, 19, small_gpu_world), 19);
    }

    fn timed_trial(ngl: u32, pp_ts: f64, tg_ts: f64, reps: usize, wall_s: f64) -> ProfileTrial {
        use crate::engine::{TestResult, TrialResult};
        let mut spec = spec_for_tests();
        spec.n_gpu_layers = ngl;
        let mut r = TrialResult::failed(spec, TrialStatus::Ok, String::new());
        r.reason = None;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ns = |tokens: f64, ts: f64| vec![(tokens / ts * 1e9) as u64; reps];
        r.tests.push(TestResult::from_samples(64, 0, 256, ns(64.0, pp_ts)));
        r.tests.push(TestResult::from_samples(0, 16, 256, ns(16.0, tg_ts)));
        for t in &mut r.tests {
            t.stopped_early = reps == 1;
        }
        r.wall_ms = wall_s * 1e3;
        grid_trial(r)
    }

    fn grid_trial(r: crate::engine::TrialResult) -> ProfileTrial {
        ProfileTrial {
            role: "grid".into(),
            mem_bytes: None,
            device_peak_bytes: None,
            device_share: None,
            over_cap: false,
            predicted_bytes: None,
            prediction_error_pct: None,
            sampled_minus_predicted_bytes: None,
            result: r,
        }
    }

    fn spec_for_tests() -> TrialSpec {
        crate::engine::test_spec()
    }

    #[test]
    fn the_full_grids_time_is_estimated_from_what_was_measured() {
        let settings: Settings = serde_json::from_value(serde_json::json!({
            "target_vram": 0.9, "vram_budget_bytes": null, "n_ctx": 256, "n_prompt": 64, "n_gen": 16,
            "repetitions": 3, "n_threads": 2, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1,
            "objective": "tg", "grid": null, "quick": false, "no_skip": false, "trial_timeout_s": 600,
            "sample_interval_ms": 20
        }))
        .unwrap();
        // Fixed cost 1 s. ngl 0: pp 64 t/s (1 s a run), tg 16 t/s (1 s a run):
        // 1 + (3+1)*1 + (3*16+1)/16 = 8.0625 s. ngl 20 cut short after one
        // repetition: pp 16 t/s (4 s), tg 4 t/s (4 s): 1 + 2*4 + 17/4 = 13.25 s.
        let zero = timed_trial(0, 64.0, 16.0, 3, 8.0625);
        let top = timed_trial(20, 16.0, 4.0, 1, 13.25);
        let trials = [zero, top];
        // ngl 10 halfway in time per token: pp 1/(1/2 * (1/64 + 1/16)) = 25.6 t/s.
        let at10 = 1.0 + 4.0 * 64.0 / 25.6 + 49.0 / 6.4;
        let at20 = 1.0 + 4.0 * 4.0 + 49.0 / 4.0;
        let est = estimate_grid_s(&trials, &[0, 10, 20], &settings, 20).unwrap();
        let want = 8.0625 + at10 + at20;
        assert!((est - want).abs() < 1e-6, "estimated {est}, want {want}");
        assert_eq!(estimate_grid_s(&trials[..1], &[0, 10, 20], &settings, 20), None, "one point says nothing");
        // Raced on tg alone, the top's pp never ran: pp at ngl 0 stands in.
        let mut tg_only = timed_trial(20, 16.0, 4.0, 1, 1.0 + 17.0 / 4.0);
        tg_only.result.tests.retain(|x| x.n_gen > 0);
        let trials = [trials[0].clone(), tg_only];
        let est = estimate_grid_s(&trials, &[0, 10, 20], &settings, 20).unwrap();
        let want = 8.0625 + (1.0 + 4.0 + 49.0 / 6.4) + (1.0 + 4.0 + 49.0 / 4.0);
        assert!((est - want).abs() < 1e-6, "estimated {est}, want {want}");
    }

    #[test]
    fn the_gap_to_the_sampled_peak_is_reported_only_where_a_sampler_is_trusted() {
        use crate::engine::logs::BufferLine;
        let mut r = crate::engine::TrialResult::failed(spec_for_tests(), TrialStatus::Ok, String::new());
        r.reason = None;
        r.model_buffers.push(BufferLine { buffer_type: "CUDA0".into(), kind: "model".into(), bytes: 1000 << 20 });
        let policy = |source: &str| MemoryPolicy {
            source: source.into(),
            device: "nvml0 (NVIDIA H200)".into(),
            device_total_bytes: Some(140 << 30),
            baseline_bytes: 0,
            cap_bytes: 100e9,
            cap_reason: String::new(),
        };
        // NVML saw 1.5 GiB for this trial; llama.cpp predicted and accounted 1000 MiB.
        let sampled = Some(1536.0 * 1024.0 * 1024.0);
        let (err, gap) = prediction_check(Some(1000 << 20), &r, Some(&policy("nvml")), sampled);
        assert_eq!(err, Some(0.0));
        assert_eq!(gap, Some(536 << 20), "the CUDA context and what else llama.cpp does not count");
        let (err, gap) = prediction_check(Some(1010 << 20), &r, Some(&policy("accounted")), sampled);
        assert!((err.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(gap, None, "accounted memory is no sample");
        r.status = TrialStatus::Oom;
        assert_eq!(prediction_check(Some(1000 << 20), &r, Some(&policy("nvml")), sampled), (None, None));
    }

    #[test]
    fn noisy_repetitions_are_said_in_words() {
        use crate::engine::{TestResult, TrialResult};
        let trial = |samples_ns: Vec<u64>| {
            let mut r = TrialResult::failed(spec_for_tests(), TrialStatus::Ok, String::new());
            r.reason = None;
            r.tests.push(TestResult::from_samples(0, 32, 4096, samples_ns));
            grid_trial(r)
        };
        let steady = trial(vec![1_000_000_000, 1_010_000_000, 995_000_000]);
        assert_eq!(noise_note(std::slice::from_ref(&steady)), None);
        let noisy = trial(vec![1_000_000_000, 2_500_000_000, 1_000_000_000]);
        let note = noise_note(&[steady, noisy]).expect("noisy");
        assert!(note.starts_with("noisy measurement: tg32 at ngl 0 -t 2 varied by"), "{note}");
        assert!(note.contains("re-run when it is idle"), "{note}");
    }

    #[test]
    fn targets() {
        assert!((parse_target("0.9").unwrap() - 0.9).abs() < 1e-12);
        assert_eq!(parse_target("1").unwrap(), 1.0);
        for bad in ["0", "-0.5", "1.5", "NaN", "abc", "inf"] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }
}
