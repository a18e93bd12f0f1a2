//! The search over candidate placements: measure (raced), record what each
//! trial cost against the cap, checkpoint after every trial, decide,
//! confirm, then expert offload and thread counts. It reaches the world only
//! through a [`TrialExecutor`], so all of it is tested against curves.

use std::path::PathBuf;

use anyhow::Result;

use super::choose::{self, decide, Inputs};
use super::executor::TrialExecutor;
use super::memory::{prediction_check, trial_memory};
use super::plan::{adaptive_points, moe_grid, Candidate, Found, Plan};
use crate::engine::predict::Prediction;
use crate::error::Interrupted;
use crate::profile::store;
use crate::profile::{Checkpoint, FitCheck, MemoryPolicy, ProfileTrial, Settings};
use crate::progress::Progress;
use crate::types::{CpuInfo, Race, Role, TrialResult, TrialStatus};
use crate::types::{Decision, Objective};

/// Most confirmation trials before the tuner settles for what it measured.
pub const MAX_CONFIRMATIONS: usize = 5;

/// A racing trial stops a test after one repetition when it is slower than
/// this share of the best speed measured so far: a gap no repetition noise
/// closes (repetitions varying by more than 10% are already called noisy).
pub const RACE_SHARE: f64 = 0.5;

/// Share of the mean above which a test's repetitions count as noisy.
pub const NOISY: f64 = 0.10;

/// Where finished trials are kept so that an interrupt loses none.
pub struct Checkpointing {
    pub path: PathBuf,
    pub checkpoint: Checkpoint,
    failed: bool,
}

impl Checkpointing {
    #[must_use]
    pub fn new(path: PathBuf, checkpoint: Checkpoint) -> Self {
        Checkpointing { path, checkpoint, failed: false }
    }
}

pub struct Search<'a> {
    settings: &'a Settings,
    executor: &'a mut dyn TrialExecutor,
    policy: Option<MemoryPolicy>,
    pub trials: Vec<ProfileTrial>,
    /// A resumed checkpoint's trials at other context sizes.
    others: Vec<ProfileTrial>,
    pub predicted: Vec<Prediction>,
    /// Prices a whole-layer setting with llama.cpp's dry run (the settings'
    /// workload): a confirmation the fit chose is priced before it runs.
    pub pricer: Option<Box<dyn FnMut(u32) -> Option<Prediction> + 'a>>,
    /// The dry run of the baseline being paired (llama.cpp's fit's choice,
    /// at its own context and batch): what its trials are priced by.
    pub baseline_bytes: Option<u64>,
    /// The host memory a placement may take (bytes, and how it was set):
    /// a candidate whose dry run needs more is recorded, never run.
    pub host_cap: Option<(u64, String)>,
    /// KV cache types whose cache at depth a trial or a prefill has filled.
    filled: Vec<crate::types::KvType>,
    pub progress: Progress,
    checkpoint: Option<Checkpointing>,
}

impl<'a> Search<'a> {
    /// A search that starts from `trials` (a resumed checkpoint's).
    #[must_use]
    pub fn new(
        settings: &'a Settings,
        executor: &'a mut dyn TrialExecutor,
        policy: Option<MemoryPolicy>,
        progress: Progress,
        checkpoint: Option<Checkpointing>,
    ) -> Self {
        // Trials at other context sizes belong to their own searches: kept, not seen.
        let (trials, others): (Vec<ProfileTrial>, Vec<ProfileTrial>) = checkpoint
            .as_ref()
            .map(|c| c.checkpoint.trials.clone())
            .unwrap_or_default()
            .into_iter()
            .partition(|t| t.at_ctx(settings.n_ctx));
        progress.done_already(trials.len() as u64);
        Search {
            settings,
            executor,
            policy,
            trials,
            others,
            predicted: Vec::new(),
            pricer: None,
            baseline_bytes: None,
            host_cap: None,
            filled: Vec::new(),
            progress,
            checkpoint,
        }
    }

    #[must_use]
    pub fn into_trials(self) -> Vec<ProfileTrial> {
        self.into_parts().0
    }

    /// This search's trials and the checkpoint (holding every context's trials).
    #[must_use]
    pub fn into_parts(self) -> (Vec<ProfileTrial>, Option<Checkpointing>) {
        self.progress.clear();
        (self.trials, self.checkpoint)
    }

    #[must_use]
    pub fn settings(&self) -> &'a Settings {
        self.settings
    }

    /// What a setting may cost on the capped device, where there is a cap.
    #[must_use]
    pub fn cap_bytes(&self) -> Option<f64> {
        self.policy.as_ref().map(|p| p.cap_bytes)
    }

    fn candidate(&self, ngl: u32) -> Candidate {
        Candidate::layers(ngl, self.settings.n_threads)
    }

    /// Racing thresholds from the best speeds measured so far: the
    /// objective's test alone decides (tg or pp), or each test for itself
    /// when the objective mixes both.
    pub fn race(&self) -> Race {
        let best = |pp: bool| {
            self.trials
                .iter()
                .filter(|t| t.is_search() && t.result.status == TrialStatus::Ok)
                .filter_map(|t| t.result.test(pp).map(|x| x.avg_ts))
                .reduce(f64::max)
                .map(|v| v * RACE_SHARE)
        };
        match self.settings.objective {
            Objective::Tg | Objective::Throughput => {
                Race { pp_below_ts: None, tg_below_ts: best(false), skip_rest: true }
            }
            Objective::Pp => Race { pp_below_ts: best(true), tg_below_ts: None, skip_rest: true },
            Objective::Mixed => Race { pp_below_ts: best(true), tg_below_ts: best(false), skip_rest: false },
            // A slower setting may draw less power: nothing is cut for speed.
            Objective::Energy => Race { pp_below_ts: None, tg_below_ts: None, skip_rest: false },
        }
    }

    /// Whether `c` was already measured in this role (a resumed run).
    fn done(&self, role: Role, c: Candidate) -> bool {
        // (self.trials are at this search's context only)
        self.trials.iter().any(|t| t.role == role && c.is(&t.result.spec))
    }

    /// Measures `c`, records it against the cap and the prediction, and
    /// checkpoints.
    ///
    /// # Errors
    /// What the executor returns; an interrupt says what was kept.
    pub fn measure(&mut self, role: Role, c: Candidate, race: Option<Race>) -> Result<&ProfileTrial> {
        if let Some(why) = self.over_host(c) {
            // It would page the model in from disk: recorded as not run, never started.
            let trial = self.record(role, TrialResult::failed(self.executor.spec(c), TrialStatus::OverHost, why));
            self.trials.push(trial);
            self.save();
            self.progress.skip();
            return Ok(self.trials.last().expect("just pushed"));
        }
        self.progress.starting(format!("ngl {}{}", c.ngl, last_tg(&self.trials)));
        self.prefill_for(c).map_err(|e| self.stopped(e, c.ngl))?;
        let r = self.executor.measure(c, race).map_err(|e| self.stopped(e, c.ngl))?;
        let trial = self.record(role, r);
        self.trials.push(trial);
        self.save();
        let last = self.trials.last().expect("just pushed");
        self.progress.finished(
            &last.result,
            format!("ngl {} done{}", last.result.spec.placement.n_gpu_layers, last_tg(&self.trials)),
        );
        Ok(last)
    }

    /// Why `c` may not run: its host part by the dry run (where one priced
    /// it) over the host cap. A baseline runs at its own context and batch,
    /// which the search's dry runs do not price: it is not held back here.
    fn over_host(&self, c: Candidate) -> Option<String> {
        let (cap, reason) = self.host_cap.as_ref()?;
        let spec = self.executor.spec(c);
        let p = self.predicted.iter().find(|p| p.error.is_none() && !spec.baseline && p.prices(&spec))?;
        let need = p.host_bytes();
        (need > *cap).then(|| {
            format!(
                "not run: its host part needs {} by llama.cpp's dry run, over the host cap of {} ({reason}): it would swap",
                crate::model::human_bytes(need),
                crate::model::human_bytes(*cap)
            )
        })
    }

    fn stopped(&self, e: anyhow::Error, ngl: u32) -> anyhow::Error {
        if !e.is::<Interrupted>() {
            return e;
        }
        self.progress.abandon();
        let kept = match &self.checkpoint {
            Some(c) if !self.trials.is_empty() || !self.others.is_empty() => format!(
                "{} finished trials are kept in {}; run the same command with --resume to continue",
                self.trials.len() + self.others.len(),
                c.path.display()
            ),
            _ => "no trial had finished".to_string(),
        };
        e.context(format!("stopped at ngl {ngl}: {kept}"))
    }

    /// What a trial cost in the policy's currency, against the cap and llama.cpp's prediction.
    fn record(&self, role: Role, r: TrialResult) -> ProfileTrial {
        let (mem, peak) = self.policy.as_ref().map_or((None, None), |p| trial_memory(&r, p));
        #[allow(clippy::cast_precision_loss)]
        let share = peak.zip(self.policy.as_ref().and_then(|p| p.device_total_bytes)).map(|(b, t)| b as f64 / t as f64);
        let over_cap = self.policy.as_ref().is_some_and(|p| mem.is_some_and(|m| m > p.cap_bytes));
        // The search's dry runs are at its batch and context: a baseline,
        // at its own, is priced by the dry run of what its fit chose.
        let predicted = if r.spec.baseline {
            self.baseline_bytes
        } else {
            self.predicted.iter().find(|p| p.error.is_none() && p.prices(&r.spec)).map(|p| p.device_bytes)
        };
        let (prediction_error_pct, sampled_minus_predicted_bytes) =
            prediction_check(predicted, &r, self.policy.as_ref(), mem);
        ProfileTrial {
            role,
            mem_bytes: mem,
            device_peak_bytes: peak,
            device_share: share,
            over_cap,
            predicted_bytes: predicted,
            prediction_error_pct,
            sampled_minus_predicted_bytes,
            result: r,
        }
    }

    fn save(&mut self) {
        let Some(c) = self.checkpoint.as_mut() else { return };
        c.checkpoint.trials = self.others.iter().chain(&self.trials).cloned().collect();
        if let Err(e) = store::write_checkpoint(&c.path, &c.checkpoint) {
            // Measuring goes on: the trials are in memory and go into the profile.
            if !c.failed {
                self.progress.warn(&format!(
                    "warning: {e:#}; tuning goes on, but an interrupt now would lose the finished trials"
                ));
                c.failed = true;
            }
        }
    }

    /// The whole search: the ngl search (grid or adaptive), confirmation,
    /// expert offload, thread counts; with no GPU device, thread counts only.
    ///
    /// # Errors
    /// What the executor returns.
    pub fn run(&mut self, plan: &Plan) -> Result<Found> {
        if plan.no_gpu {
            let (decision, threads) = self.threads_only(&plan.cpu)?;
            return Ok(Found { decision, dense_ngl: 0, threads, n_cpu_moe: 0, skipped: Vec::new(), notes: Vec::new() });
        }
        let mut notes = Vec::new();
        let skipped = if plan.grid_mode { self.grid(&plan.full_grid, &plan.predicted_over)? } else { Vec::new() };
        if !plan.grid_mode {
            // The two ends are always measured; more only where they can change the answer.
            self.progress.length_at_least(2);
            let note = self.adaptive(plan.n_max, plan.top_first, plan.full_grid.len().saturating_sub(1))?;
            notes.extend(note.map(crate::types::Note::search));
        }
        let (mut d, note) = self.confirm(plan.full)?;
        notes.extend(note.map(crate::types::Note::search));
        // Mixture of experts: all layers on the GPU but the experts of the
        // first K on the CPU (llama.cpp's --n-cpu-moe) often beats any whole-layer split.
        let mut n_cpu_moe = 0;
        if plan.is_moe && !d.needs_confirmation && d.recommended_ngl < plan.full {
            let (k, reason) = self.moe(plan.n_layer, plan.full, &d)?;
            d.reasons.push(reason);
            n_cpu_moe = k;
        }
        // Layers left on the CPU make the thread count matter: measure it there.
        let mut threads = self.settings.n_threads;
        if d.recommended_ngl < plan.full && !d.needs_confirmation && n_cpu_moe == 0 {
            let (best, _, tried) = self.threads(&plan.cpu, d.recommended_ngl)?;
            threads = best;
            d.reasons.push(format!(
                "layers stay on the CPU at ngl {}: -t {best} is fastest there ({})",
                d.recommended_ngl,
                tried.join(", ")
            ));
        }
        Ok(Found { dense_ngl: d.recommended_ngl, decision: d, threads, n_cpu_moe, skipped, notes })
    }

    /// Every grid value in full, except those predicted over the cap and
    /// those above one that ran out of memory (unless `--no-skip`).
    fn grid(&mut self, grid: &[u32], predicted_over: &[u32]) -> Result<Vec<u32>> {
        let mut skipped = Vec::new();
        for &ngl in grid {
            let c = self.candidate(ngl);
            if predicted_over.contains(&ngl) {
                self.progress.skip();
                continue;
            }
            if self.done(Role::Grid, c) {
                continue;
            }
            let oom_below = self
                .trials
                .iter()
                .any(|t| t.result.status == TrialStatus::Oom && t.result.spec.placement.n_gpu_layers < ngl);
            if oom_below && !self.settings.no_skip {
                skipped.push(ngl);
                self.progress.skip();
                continue;
            }
            self.measure(Role::Grid, c, None)?;
        }
        Ok(skipped)
    }

    /// The adaptive search's points (see [`adaptive_points`]), raced.
    fn adaptive(&mut self, n_max: u32, top_first: bool, max_trials: usize) -> Result<Option<String>> {
        // Its early stop reasons from time per token being linear in ngl: a speed's
        // argument, so energy's search walks by tg (its decision then weighs the watts).
        let by_speed = Settings { objective: Objective::Tg, ..self.settings.clone() };
        adaptive_points(n_max, top_first, max_trials, &mut |ngl| {
            let at = |x: &&ProfileTrial| x.is_search() && x.result.spec.placement.n_gpu_layers == ngl;
            if !self.trials.iter().any(|x| at(&x)) {
                self.progress.plan_one_more();
                let race = self.race();
                self.measure(Role::Grid, self.candidate(ngl), Some(race))?;
            }
            let s = if self.settings.objective == Objective::Energy { &by_speed } else { self.settings };
            Ok(self.trials.iter().find(|x| at(x) && x.result.status == TrialStatus::Ok).and_then(|x| trial_score(x, s)))
        })
    }

    /// The decision's inputs from the trials so far.
    fn inputs(&self, full: u32) -> Inputs {
        let policy = self.policy.as_ref();
        Inputs {
            points: self.trials.iter().filter(|t| t.is_search()).map(ProfileTrial::point).collect(),
            full,
            cap: policy.map_or(f64::INFINITY, |p| p.cap_bytes),
            objective: self.settings.objective,
            n_prompt: self.settings.n_prompt,
            n_gen: self.settings.n_gen,
            device: policy.map_or_else(String::new, |p| p.device.clone()),
            max_power_w: self.settings.max_power_w,
        }
    }

    /// Before the first trial of a KV cache type (the first of all fills
    /// its own), the whole-layer setting with the fastest prompt processing
    /// measured here fills the cache at that type for the trials to load:
    /// on a machine whose GPU is slower than its CPU the fill of a fully
    /// offloaded q8_0 trial would otherwise take minutes.
    fn prefill_for(&mut self, c: Candidate) -> Result<()> {
        if self.filled.contains(&c.kv) {
            return Ok(());
        }
        self.filled.push(c.kv);
        let fastest = self
            .trials
            .iter()
            .filter(|t| t.is_search() && t.result.status == TrialStatus::Ok)
            .filter_map(|t| t.result.test(true).map(|x| (t, x.avg_ts)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(t, _)| Candidate::layers(t.result.spec.placement.n_gpu_layers, t.result.spec.placement.n_threads));
        match fastest {
            Some(f) if f.ngl != c.ngl => self.executor.prefill(Candidate { kv: c.kv, ..f }),
            _ => Ok(()),
        }
    }

    /// The dry run's device bytes of whole-layer setting `ngl` at this
    /// context: known, or priced now (and kept).
    fn price(&mut self, ngl: u32) -> Option<u64> {
        let n_ctx = self.settings.n_ctx;
        let known = |p: &&Prediction| {
            p.n_gpu_layers == ngl
                && p.split.is_empty()
                && p.case.is_none_or(|c| c == crate::engine::predict::PredictCase::layers(ngl, n_ctx))
        };
        if let Some(p) = self.predicted.iter().find(known) {
            return p.error.is_none().then_some(p.device_bytes);
        }
        let p = self.pricer.as_mut()?(ngl)?;
        let bytes = p.error.is_none().then_some(p.device_bytes);
        self.predicted.push(p);
        bytes
    }

    /// `ngl`, or the largest setting below it that the dry run prices under
    /// the cap (down to the largest one measured under it).
    fn priced_under_cap(&mut self, ngl: u32) -> u32 {
        let Some(cap) = self.policy.as_ref().map(|p| p.cap_bytes) else { return ngl };
        if self.pricer.is_none() {
            return ngl;
        }
        let floor = self
            .trials
            .iter()
            .filter(|t| t.is_search() && t.result.status == TrialStatus::Ok && !t.over_cap)
            .map(|t| t.result.spec.placement.n_gpu_layers)
            .filter(|n| *n <= ngl)
            .max()
            .unwrap_or(0);
        super::memory::priced_under(&mut |n| self.price(n), ngl, floor, cap)
    }

    /// Decides; while the best setting is only predicted, measures it (at
    /// most [`MAX_CONFIRMATIONS`] times) and decides again.
    fn confirm(&mut self, full: u32) -> Result<(Decision, Option<String>)> {
        let mut d = decide(&self.inputs(full));
        let mut confirmations = 0;
        while d.needs_confirmation && confirmations < MAX_CONFIRMATIONS {
            confirmations += 1;
            self.progress.plan(1);
            let ngl = self.priced_under_cap(d.recommended_ngl);
            let c = self.candidate(ngl);
            if !self.done(Role::Confirm, c) {
                self.measure(Role::Confirm, c, None)?;
            }
            d = decide(&self.inputs(full));
        }
        let note = d.needs_confirmation.then(|| {
            format!("after {MAX_CONFIRMATIONS} confirmation trials the prediction still moved; the recommendation is predicted, not measured")
        });
        Ok((d, note))
    }

    /// Measures full offload with the experts of the first K layers on the
    /// CPU for K in [`moe_grid`] (most experts on the CPU first: least
    /// memory), and returns the K to recommend (0: the whole-layer split
    /// stays best) with the reason in words.
    fn moe(&mut self, n_layer: u32, full: u32, d: &Decision) -> Result<(u32, String)> {
        let s = self.settings;
        let grid = moe_grid(n_layer);
        self.progress.plan(grid.len() as u64);
        for &k in grid.iter().rev() {
            let c = Candidate { n_cpu_moe: k, ..Candidate::layers(full, s.n_threads) };
            if !self.trials.iter().any(|t| t.role == Role::Moe && c.is(&t.result.spec)) {
                self.measure(Role::Moe, c, None)?;
            }
        }
        let moe: Vec<&ProfileTrial> = self.trials.iter().filter(|t| t.role == Role::Moe).collect();
        let best_moe = moe
            .iter()
            .filter(|t| t.result.status == TrialStatus::Ok && !t.over_cap)
            .filter_map(|t| trial_score(t, s).map(|v| (t.result.spec.placement.n_cpu_moe, v, t.mem_bytes)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let dense = self
            .trials
            .iter()
            .find(|t| {
                t.role != Role::Moe
                    && t.result.spec.placement.n_gpu_layers == d.recommended_ngl
                    && t.result.status == TrialStatus::Ok
                    && t.result.spec.placement.n_cpu_moe == 0
            })
            .and_then(|t| trial_score(t, s));
        let tried: Vec<String> = moe
            .iter()
            .map(|t| {
                let v =
                    trial_score(t, s).map_or_else(|| t.result.status.as_str().to_string(), |v| format!("{v:.2} t/s"));
                format!("K={} {v}{}", t.result.spec.placement.n_cpu_moe, if t.over_cap { " (over cap)" } else { "" })
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

    /// Measures thread counts (physical cores, logical cores, half the
    /// physical ones, the cores of a CPU quota where one is set, and the
    /// configured count) at `ngl`, raced like search
    /// trials, reusing trials already run there; returns the fastest for the
    /// objective with what was tried, in words.
    fn threads(&mut self, cpu: &CpuInfo, ngl: u32) -> Result<(u32, f64, Vec<String>)> {
        let mut counts = vec![cpu.physical_cores.max(1), cpu.logical_cores.max(1), (cpu.physical_cores / 2).max(1)];
        counts.push(self.settings.n_threads);
        if crate::probe::cpu::cpu_quota_cores().is_some() {
            // What a CPU quota gives this process, where that is fewer cores.
            counts.push(crate::bench::tune_threads());
        }
        counts.sort_unstable();
        counts.dedup();
        let base = Candidate::layers(ngl, 0);
        let at = |t: &ProfileTrial, n: u32| base.with_threads(n).is(&t.result.spec);
        let todo: Vec<u32> = counts.iter().copied().filter(|n| !self.trials.iter().any(|t| at(t, *n))).collect();
        self.progress.plan(todo.len() as u64);
        for t in todo {
            // A thread count far behind on the objective stops after one repetition.
            let race = self.race();
            self.measure(Role::Threads, base.with_threads(t), Some(race))?;
        }
        let s = self.settings;
        let measured: Vec<(u32, Option<f64>, &str)> = counts
            .iter()
            .filter_map(|n| self.trials.iter().find(|t| at(t, *n)))
            .map(|t| {
                let score = trial_score(t, s).filter(|_| t.result.status == TrialStatus::Ok);
                (t.result.spec.placement.n_threads, score, t.result.status.as_str())
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

    /// No GPU: ngl does nothing, so measure thread counts at ngl 0 and keep the fastest.
    fn threads_only(&mut self, cpu: &CpuInfo) -> Result<(Decision, u32)> {
        let (threads, tg, tried) = self.threads(cpu, 0)?;
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
            fits: crate::types::Fits { tg_time: None, pp_time: None, memory: None },
            fit_notes: Vec::new(),
            reasons: vec![
                "ngl has no effect here (no GPU device in this build or on this machine): every layer runs on the CPU"
                    .into(),
                format!("tuned threads instead: -t {threads} is fastest ({})", tried.join(", ")),
            ],
        };
        Ok((d, threads))
    }
}

fn last_tg(trials: &[ProfileTrial]) -> String {
    trials
        .iter()
        .rev()
        .find_map(|t| t.result.test(false))
        .map_or(String::new(), |t| format!(" | last tg {:.2} t/s", t.avg_ts))
}

/// A measured trial's value for the tuning objective (higher is better).
#[must_use]
pub fn trial_score(t: &ProfileTrial, s: &Settings) -> Option<f64> {
    let speed = |pp: bool| t.result.test(pp).map(|x| x.avg_ts);
    let watts = t.result.test(false).and_then(crate::types::Power::of).map(|w| w.total());
    choose::score_with_power(s.objective, (s.n_prompt, s.n_gen), (speed(false), speed(true)), watts)
}

/// The memory fit against each measured grid point (partial offload and
/// full offload predicted from the partial-offload line; ngl 0 is its own point).
#[must_use]
pub fn fit_check(trials: &[ProfileTrial], d: &Decision, full: u32) -> Vec<FitCheck> {
    let Some(fit) = &d.fits.memory else { return Vec::new() };
    trials
        .iter()
        .filter(|t| {
            t.result.status == TrialStatus::Ok
                && t.result.spec.placement.n_gpu_layers > 0
                && !matches!(t.role, Role::Moe | Role::Hatch)
        })
        .filter_map(|t| {
            let ngl = t.result.spec.placement.n_gpu_layers.min(full);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::executor::fake::{Outcome, World};
    use crate::tune::worlds::{hurting_world, policy, readme_world};

    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

    fn settings(grid: Option<Vec<u32>>, search: &str, no_skip: bool) -> Settings {
        serde_json::from_value(serde_json::json!({
            "target_vram": 0.9, "vram_budget_bytes": null, "n_ctx": 256, "n_prompt": 64, "n_gen": 16,
            "repetitions": 3, "n_threads": 2, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1,
            "objective": "tg", "grid": grid, "quick": false, "no_skip": no_skip, "trial_timeout_s": 600,
            "sample_interval_ms": 20, "search": search
        }))
        .unwrap()
    }

    fn plan(full: u32, grid: Vec<u32>, grid_mode: bool, n_max: u32) -> Plan {
        Plan {
            full,
            n_layer: full - 1,
            is_moe: false,
            full_grid: grid,
            grid_mode,
            no_gpu: false,
            predicted_over: Vec::new(),
            n_max,
            top_first: true,
            cpu: CpuInfo { brand: "fake".into(), physical_cores: 2, logical_cores: 2 },
        }
    }

    /// A world from a (tg, memory) curve; pp is ten times tg, threads do not matter.
    fn curve_world(f: fn(u32) -> (f64, f64)) -> World {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        World::new(move |c| {
            let (tg, mem) = f(c.ngl);
            Outcome::Ok { tg, pp: tg * 10.0, mem: mem as u64 }
        })
    }

    fn search(
        world: &mut World,
        s: &Settings,
        cap: f64,
        p: &Plan,
        resumed: Vec<ProfileTrial>,
    ) -> (Found, Vec<ProfileTrial>) {
        let dir = tempfile::tempdir().unwrap();
        let mut cp: Checkpoint = serde_json::from_value(serde_json::json!({
            "schema_version": crate::profile::SCHEMA_VERSION, "kind": "checkpoint", "created_at": "2026-11-30T00:00:00Z",
            "model": {"file_name": "m.gguf", "path": "m.gguf", "file_size": 1, "sha256_16m": "0".repeat(64), "mtime": 0,
                      "architecture": "llama", "n_layer": 1, "n_layer_full": 2, "quantization": "F32", "n_params": 1, "n_expert": 0},
            "fingerprint": "f", "settings": s, "trials": []
        }))
        .unwrap();
        cp.trials = resumed;
        let checkpoint = Checkpointing::new(dir.path().join("c.json"), cp);
        let mut search = Search::new(s, world, Some(policy(cap)), Progress::hidden(), Some(checkpoint));
        let found = search.run(p).unwrap();
        let trials = search.into_trials();
        let saved = store::read_checkpoint(&dir.path().join("c.json")).expect("checkpointed after every trial");
        assert_eq!(saved.trials.len(), trials.len());
        (found, trials)
    }

    fn ngls(w: &World) -> Vec<u32> {
        w.measured.iter().map(|c| c.ngl).collect()
    }

    /// A whole-layer setting priced at `device` bytes on the device and `host` in a host buffer.
    fn host_priced(ngl: u32, device: u64, host: u64) -> Prediction {
        use crate::engine::predict::PredictedBuffer;
        let buffer =
            PredictedBuffer { buffer_type: "CPU_Mapped".into(), is_host: true, model: host, context: 0, compute: 0 };
        Prediction {
            n_gpu_layers: ngl,
            device_bytes: device,
            device_model_bytes: 0,
            buffers: vec![buffer],
            error: None,
            case: None,
            split: Vec::new(),
            devices: Vec::new(),
        }
    }

    #[test]
    fn a_candidate_over_the_host_cap_is_recorded_and_never_run() {
        // The README's curve (memory 0.5 + 0.1 ngl GiB on the device); on the host 1 GiB a CPU layer.
        let s = settings(None, "adaptive", false);
        let mut w = curve_world(readme_world);
        let host = |ngl: u32| f64::from(35 - ngl) * GIB;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let price = |ngl: u32| host_priced(ngl, readme_world(ngl).1 as u64, host(ngl) as u64);
        let mut search = Search::new(&s, &mut w, Some(policy(3.75 * GIB)), Progress::hidden(), None);
        search.predicted = (0..=35).map(price).collect();
        // 20.5 GiB: ngl 14 and below need 21 GiB or more.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let cap = (20.5 * GIB) as u64;
        search.host_cap = Some((cap, "--host-budget 20.50 GiB".into()));
        let found = search.run(&plan(35, vec![0, 10, 20, 30, 35], false, 32)).unwrap();
        let trials = search.into_trials();
        let measured = ngls(&w);
        assert!(!measured.is_empty() && measured.iter().all(|n| *n >= 15), "{measured:?}");
        let held: Vec<&ProfileTrial> = trials.iter().filter(|t| t.result.status == TrialStatus::OverHost).collect();
        assert!(held.iter().any(|t| t.result.spec.placement.n_gpu_layers == 0), "ngl 0 recorded, not run");
        let why = held[0].result.reason.as_deref().unwrap_or("");
        assert!(why.contains("over the host cap of 20.50 GiB (--host-budget 20.50 GiB)"), "{why}");
        assert!(found.decision.recommended_ngl >= 15, "{:?}", found.decision);
        // The same search without a host cap starts at ngl 0.
        let mut w = curve_world(readme_world);
        let mut search = Search::new(&s, &mut w, Some(policy(3.75 * GIB)), Progress::hidden(), None);
        search.predicted = (0..=35).map(price).collect();
        search.run(&plan(35, vec![0, 10, 20, 30, 35], false, 32)).unwrap();
        drop(search);
        assert!(ngls(&w).contains(&0));
    }

    #[test]
    fn a_host_cap_under_every_placement_that_fits_the_device_is_bad_input() {
        let p = host_priced;
        const MIB: u64 = 1 << 20;
        let preds = [p(0, 0, 900 * MIB), p(10, 500 * MIB, 600 * MIB), p(20, 1000 * MIB, 300 * MIB)];
        // ngl 20 is over the device cap of 800 MiB: the least the host can get is 600 MiB at ngl 10.
        #[allow(clippy::cast_precision_loss)]
        let device = (800 * MIB) as f64;
        let e = super::super::memory::check_host(&preds, device, &(500 * MIB, "--host-budget".into())).unwrap_err();
        assert_eq!(crate::error::exit_code(&e), crate::error::exit::BAD_INPUT, "{e}");
        assert!(e.to_string().contains("the least is 600.00 MiB at ngl 10"), "{e}");
        assert!(super::super::memory::check_host(&preds, device, &(600 * MIB, "x".into())).is_ok());
        assert!(super::super::memory::check_host(&[], 800.0, &(1, "x".into())).is_ok(), "nothing priced");
    }

    /// The README's curve with a KV cache that grows with the context:
    /// 0.5 GiB, and per offloaded layer 0.1 GiB of weights plus 0.05 GiB
    /// of cache per 256 tokens of the trial's context; four streams decode
    /// nearly four times the tokens (batched decoding is memory-bound).
    fn kv_world(s: &Settings) -> World {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let mut w = World::of(|c, spec| {
            let (tg, _) = readme_world(c.ngl);
            let ctx = f64::from(spec.placement.n_ctx.unwrap_or(256));
            let per_layer = 0.1 + 0.05 * ctx / 256.0;
            let streams = f64::from(spec.n_streams);
            let tg = tg * streams * (1.0 - 0.05 * (streams - 1.0));
            Outcome::Ok { tg, pp: tg * 10.0, mem: ((0.5 + per_layer * f64::from(c.ngl)) * GIB) as u64 }
        });
        // The tune's base spec: the settings' context and streams.
        w.base.placement.n_ctx = Some(s.n_ctx);
        w.base.n_streams = s.streams();
        w
    }

    #[test]
    fn four_streams_size_the_cache_for_four_and_the_answer_moves() {
        let grid: Vec<u32> = (0..=35).step_by(2).chain([35]).collect();
        let p = plan(35, grid, true, 35);
        let one = settings(None, "grid", false);
        let mut w = kv_world(&one);
        let (tg, _) = search(&mut w, &one, 3.0 * GIB, &p, Vec::new());
        // 0.5 + 0.15 x 16 = 2.9 GiB: the most under 3 GiB with one stream's cache.
        assert_eq!(tg.decision.recommended_ngl, 16, "{:?}", tg.decision);

        let mut four = Settings { objective: crate::types::Objective::Throughput, ..one.clone() };
        four.decode_together(4);
        assert_eq!((four.n_ctx, four.n_parallel, four.streams()), (1024, 4, 4), "four slots of 256 tokens");
        let mut w = kv_world(&four);
        let (thr, trials) = search(&mut w, &four, 3.0 * GIB, &p, Vec::new());
        // The cache for four sequences: 0.5 + 0.3 x 8 = 2.9 GiB.
        assert_eq!(thr.decision.recommended_ngl, 8, "{:?}", thr.decision);
        let tg_test = trials.iter().find_map(|t| t.result.test(false)).unwrap();
        assert_eq!(tg_test.n_streams, 4, "the tg tests decode four streams: {tg_test:?}");
        assert!(trials.iter().all(|t| t.result.spec.n_streams == 4 && t.result.spec.placement.n_ctx == Some(1024)));
    }

    #[test]
    fn the_grid_on_the_readme_curve_confirms_a_best_between_grid_points() {
        let s = settings(None, "grid", false);
        let mut w = curve_world(readme_world);
        let grid = vec![0, 10, 20, 30, 35];
        let (found, trials) = search(&mut w, &s, 3.75 * GIB, &plan(35, grid.clone(), true, 35), Vec::new());
        assert_eq!(&ngls(&w)[..4], [0, 10, 20, 30], "35 is over the cap: measured, marked, not chosen");
        assert_eq!(found.decision.recommended_ngl, 32, "0.5 + 0.1 x 32 = 3.7 GiB under 3.75: {:?}", found.decision);
        assert!(!found.decision.needs_confirmation);
        assert!(trials.iter().any(|t| t.role == Role::Confirm && t.result.spec.placement.n_gpu_layers == 32));
        assert!(trials.iter().any(|t| t.result.spec.placement.n_gpu_layers == 35 && t.over_cap));
        // Layers stay on the CPU at 32 of 35: thread counts were measured there.
        assert!(trials.iter().any(|t| t.role == Role::Threads && t.result.spec.placement.n_gpu_layers == 32));
    }

    #[test]
    fn a_resumed_search_measures_only_what_is_missing() {
        let s = settings(None, "grid", false);
        let p = plan(35, vec![0, 10, 20, 30, 35], true, 35);
        let mut first = curve_world(readme_world);
        let (_, all) = search(&mut first, &s, 80.0 * GIB, &p, Vec::new());
        let kept: Vec<ProfileTrial> = all.iter().take(2).cloned().collect();
        let mut again = curve_world(readme_world);
        let (found, trials) = search(&mut again, &s, 80.0 * GIB, &p, kept);
        assert_eq!(ngls(&again), [20, 30, 35], "0 and 10 came from the checkpoint");
        assert_eq!(trials.len(), all.len());
        assert_eq!(found.decision.recommended_ngl, 35);
    }

    #[test]
    fn an_out_of_memory_setting_skips_the_larger_ones_unless_told_otherwise() {
        let oom_from_20 = |c: Candidate| {
            if c.ngl >= 20 {
                Outcome::Oom
            } else {
                Outcome::Ok { tg: 10.0 + f64::from(c.ngl), pp: 100.0, mem: u64::from(c.ngl) << 20 }
            }
        };
        let p = plan(41, vec![0, 10, 20, 30, 40, 41], true, 41);
        let mut w = World::new(oom_from_20);
        let (found, _) = search(&mut w, &settings(None, "grid", false), 80.0 * GIB, &p, Vec::new());
        assert_eq!(&ngls(&w)[..3], [0, 10, 20]);
        assert_eq!(found.skipped, [30, 40, 41]);
        assert!(found.decision.recommended_ngl < 20);
        let mut w = World::new(oom_from_20);
        let (found, _) = search(&mut w, &settings(None, "grid", true), 80.0 * GIB, &p, Vec::new());
        assert_eq!(&ngls(&w)[..6], [0, 10, 20, 30, 40, 41], "--no-skip measures them anyway");
        assert!(found.skipped.is_empty());
    }

    #[test]
    fn a_setting_far_behind_is_raced_and_the_ends_decide_when_offloading_hurts() {
        let s = settings(None, "adaptive", false);
        let mut p = plan(41, crate::tune::plan::default_grid(41, 10), false, 41);
        p.top_first = false;
        let mut w = curve_world(hurting_world);
        let (found, trials) = search(&mut w, &s, 80.0 * GIB, &p, Vec::new());
        assert_eq!(&ngls(&w)[..2], [0, 41], "the two ends");
        assert!(
            found.notes.iter().any(|n| n.to_string().starts_with("adaptive search stopped after the two ends")),
            "{:?}",
            found.notes
        );
        let top = trials.iter().find(|t| t.result.spec.placement.n_gpu_layers == 41).unwrap();
        assert_eq!(top.result.tests.len(), 1, "raced on tg: its pp test never ran");
        assert!(top.result.tests[0].stopped_early && top.result.tests[0].samples_ns.len() == 1);
        assert_eq!(found.decision.recommended_ngl, 0);
        assert!(found.decision.offload_hurts);
    }

    #[test]
    fn confirmations_stop_at_their_cap_and_say_so() {
        // Memory is linear at the grid points, but every other setting takes
        // just over the cap: each confirmation finds its setting over, and
        // the next one down is predicted just under.
        let s = settings(Some(vec![0, 100, 101]), "grid", false);
        let mut w = World::new(|c| {
            let mem = if [0, 100, 101].contains(&c.ngl) { f64::from(c.ngl) * 0.01 * GIB } else { 0.956 * GIB };
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Outcome::Ok { tg: 10.0 + f64::from(c.ngl), pp: 100.0, mem: mem as u64 }
        });
        let (found, trials) = search(&mut w, &s, 0.955 * GIB, &plan(101, vec![0, 100, 101], true, 101), Vec::new());
        let confirms = trials.iter().filter(|t| t.role == Role::Confirm).count();
        assert_eq!(confirms, MAX_CONFIRMATIONS, "{:?}", ngls(&w));
        assert!(found.decision.needs_confirmation);
        assert!(
            found.notes.iter().any(|n| n.to_string().contains("confirmation trials the prediction still moved")),
            "{:?}",
            found.notes
        );
    }

    #[test]
    fn the_fastest_thread_count_wins_where_layers_stay_on_the_cpu() {
        let s = settings(None, "grid", false);
        let mut p = plan(19, vec![0, 10, 19], true, 19);
        p.cpu = CpuInfo { brand: "fake".into(), physical_cores: 8, logical_cores: 16 };
        // Offloading hurts; on the CPU 8 threads beat 4, 2 and 16.
        let mut w = World::new(|c| {
            let by_threads = match c.threads {
                8 => 100.0,
                16 => 70.0,
                4 => 80.0,
                _ => 60.0,
            };
            Outcome::Ok { tg: by_threads / (1.0 + f64::from(c.ngl)), pp: 500.0, mem: u64::from(c.ngl) << 20 }
        });
        let (found, trials) = search(&mut w, &s, 80.0 * GIB, &p, Vec::new());
        assert_eq!(found.decision.recommended_ngl, 0);
        assert_eq!(found.threads, 8);
        let tried: Vec<u32> =
            trials.iter().filter(|t| t.role == Role::Threads).map(|t| t.result.spec.placement.n_threads).collect();
        assert_eq!(tried, [4, 8, 16], "2 was measured by the grid already");
        assert!(
            found.decision.reasons.iter().any(|r| r.contains("-t 8 is fastest there")),
            "{:?}",
            found.decision.reasons
        );
    }

    #[test]
    fn expert_offload_wins_when_every_layer_on_the_gpu_with_experts_on_the_cpu_is_faster() {
        let s = settings(None, "grid", false);
        let mut p = plan(5, vec![0, 5], true, 5);
        p.is_moe = true;
        // Whole layers: full offload (ngl 5) is over the 100 MiB cap, ngl 0 gives 10 t/s.
        // Experts of K layers on the CPU at full offload: 60 MiB + 10 per layer kept, 40 - 5K t/s.
        let mut w = World::new(|c| {
            let (tg, mem) = match (c.ngl, c.n_cpu_moe) {
                (5, 0) => (50.0, 200),
                (5, k) => (40.0 - 5.0 * f64::from(k), 60 + 10 * u64::from(4 - k.min(4))),
                (n, _) => (10.0 + f64::from(n), 20 * u64::from(n)),
            };
            Outcome::Ok { tg, pp: 100.0, mem: mem << 20 }
        });
        let (found, trials) = search(&mut w, &s, 100.0 * 1024.0 * 1024.0, &p, Vec::new());
        let ks: Vec<u32> =
            trials.iter().filter(|t| t.role == Role::Moe).map(|t| t.result.spec.placement.n_cpu_moe).collect();
        assert_eq!(ks, [4, 3, 2, 1, 0], "most experts on the CPU first");
        assert_eq!(found.n_cpu_moe, 1, "K=1: 35 t/s in 90 MiB; K=0 is over the cap");
        assert!(found.decision.reasons.iter().any(|r| r.contains("--n-cpu-moe 1")), "{:?}", found.decision.reasons);
        assert!(found.dense_ngl < 5, "Ollama still gets the best whole-layer split");
    }
}
