//! The search over candidate placements: measure (raced), record what each
//! trial cost against the cap, checkpoint after every trial, decide,
//! confirm, then expert offload and thread counts. It reaches the world only
//! through a [`TrialExecutor`], so all of it is tested against curves.

use std::path::PathBuf;

use anyhow::Result;

use super::choose::{decide, Inputs};
use super::executor::TrialExecutor;
use super::memory::{prediction_check, trial_memory};
use super::plan::{adaptive_points, Candidate, ContextRun, Found, Plan};
use super::pricer::Pricer;
use crate::engine::predict::Prediction;
use crate::error::Interrupted;
use crate::profile::store;
use crate::profile::{Checkpoint, FitCheck, MemoryPolicy, ProfileTrial, Settings};
use crate::progress::Progress;
use crate::types::Decision;
use crate::types::{CpuInfo, Race, Role, TrialResult, TrialStatus};

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
    /// The context it works at (the settings' `n_ctx` is the largest asked).
    at: ContextRun,
    executor: &'a mut dyn TrialExecutor,
    policy: Option<MemoryPolicy>,
    pub trials: Vec<ProfileTrial>,
    /// A resumed checkpoint's trials at other context sizes.
    others: Vec<ProfileTrial>,
    pub predicted: Vec<Prediction>,
    /// llama.cpp's dry run of the settings' workload at this context: what
    /// the hatches and the splits price, and the confirmations (see
    /// `priced`) where `confirmations_priced`.
    pricer: Option<Box<dyn Pricer + 'a>>,
    /// A confirmation the fit chose is priced before it runs (the grid's
    /// dry run answered, so a single setting's can too).
    pub confirmations_priced: bool,
    /// The first dry run that failed as a whole, to be said once.
    unpriced: Option<String>,
    /// The dry run of the baseline being paired (llama.cpp's fit's choice,
    /// at its own context and batch): what its trials are priced by.
    pub baseline_bytes: Option<u64>,
    /// The host memory a placement may take (bytes, and how it was set):
    /// a candidate whose dry run needs more is recorded, never run.
    pub host_cap: Option<(u64, String)>,
    /// KV cache types whose cache at depth a trial or a prefill has filled.
    filled: Vec<crate::placement::KvType>,
    pub progress: Progress,
    checkpoint: Option<Checkpointing>,
}

impl<'a> Search<'a> {
    /// A search that starts from `trials` (a resumed checkpoint's).
    #[must_use]
    pub fn new(
        settings: &'a Settings,
        at: ContextRun,
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
            .partition(|t| t.at_ctx(at.n_ctx));
        progress.done_already(trials.len() as u64);
        Search {
            settings,
            at,
            executor,
            policy,
            trials,
            others,
            predicted: Vec::new(),
            pricer: None,
            confirmations_priced: false,
            unpriced: None,
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

    /// The context this search works at.
    #[must_use]
    pub fn at(&self) -> ContextRun {
        self.at
    }

    /// What a setting may cost on the capped device, where there is a cap.
    #[must_use]
    pub fn cap_bytes(&self) -> Option<f64> {
        self.policy.as_ref().map(|p| p.cap_bytes)
    }

    fn candidate(&self, ngl: u32) -> Candidate {
        Candidate::layers(ngl, self.settings.backend.n_threads)
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
        // Energy races nothing: a slower setting may draw less power.
        self.settings.goal.objective.race(best).unwrap_or_default()
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
        if role == Role::Paired {
            // Each paired trial a load of its own: the noise between loads
            // is what a pair's verdict must hold against, so no two paired
            // trials share a kept worker.
            self.executor.release();
        }
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
        let mut threads = self.settings.backend.n_threads;
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
            if oom_below && !self.settings.policy.no_skip {
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
        let mut scoring = self.settings.scoring();
        scoring.objective = scoring.objective.by_speed();
        adaptive_points(n_max, top_first, max_trials, &mut |ngl| {
            let at = |x: &&ProfileTrial| x.is_search() && x.result.spec.placement.n_gpu_layers == ngl;
            if !self.trials.iter().any(|x| at(&x)) {
                self.progress.plan_one_more();
                let race = self.race();
                self.measure(Role::Grid, self.candidate(ngl), Some(race))?;
            }
            Ok(self
                .trials
                .iter()
                .find(|x| at(x) && x.result.status == TrialStatus::Ok)
                .and_then(|x| scoring.trial(&x.result)))
        })
    }

    /// The decision's inputs from the trials so far.
    fn inputs(&self, full: u32) -> Inputs {
        let policy = self.policy.as_ref();
        Inputs {
            points: self.trials.iter().filter(|t| t.is_search()).map(ProfileTrial::point).collect(),
            full,
            cap: policy.map_or(f64::INFINITY, |p| p.cap_bytes),
            objective: self.settings.goal.objective,
            n_prompt: self.settings.measure.n_prompt,
            n_gen: self.settings.measure.n_gen,
            device: policy.map_or_else(String::new, |p| p.device.clone()),
            max_power_w: self.settings.caps.max_power_w,
        }
    }

    /// Before the first trial of a KV cache type (the first of all fills
    /// its own), the whole-layer setting with the fastest prompt processing
    /// measured here fills the cache at that type for the trials to load:
    /// on a machine whose GPU is slower than its CPU the fill of a fully
    /// offloaded q8_0 trial would otherwise take minutes.
    fn prefill_for(&mut self, c: Candidate) -> Result<()> {
        let kv = c.kv.unwrap_or(self.settings.workload.kv_type);
        if self.filled.contains(&kv) {
            return Ok(());
        }
        self.filled.push(kv);
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
        let n_ctx = self.at.n_ctx;
        let known = |p: &&Prediction| {
            p.n_gpu_layers == ngl
                && p.split.is_empty()
                && p.case.is_none_or(|c| c == crate::engine::predict::PredictCase::layers(ngl, n_ctx))
        };
        if let Some(p) = self.predicted.iter().find(known) {
            return p.error.is_none().then_some(p.device_bytes);
        }
        if !self.confirmations_priced {
            return None;
        }
        let p = self.price_layers(&[ngl]).into_iter().next()?;
        let bytes = p.error.is_none().then_some(p.device_bytes);
        self.predicted.push(p);
        bytes
    }

    /// What this context's trials held on the device beyond the dry run
    /// of them ([`unaccounted`]): a price is held to the cap less this.
    #[must_use]
    pub fn unaccounted(&self) -> u64 {
        unaccounted(&self.trials)
    }

    /// The cap a dry-run price is held to: the cap less what this
    /// context's trials held beyond their prices; `None` without a cap.
    fn held_cap(&self) -> Option<f64> {
        #[allow(clippy::cast_precision_loss)]
        self.policy.as_ref().map(|p| p.cap_bytes - self.unaccounted() as f64)
    }

    /// `ngl`, or the largest setting below it that the dry run prices under
    /// the cap less what the trials held beyond their prices (down to the
    /// largest one measured under it).
    fn priced_under_cap(&mut self, ngl: u32) -> u32 {
        let Some(cap) = self.held_cap() else {
            return ngl;
        };
        if !self.confirmations_priced {
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

    /// Measures thread counts (physical cores, logical cores, half the
    /// physical ones, the cores of a CPU quota where one is set, and the
    /// configured count) at `ngl`, raced like search
    /// trials, reusing trials already run there; returns the fastest for the
    /// objective with what was tried, in words.
    fn threads(&mut self, cpu: &CpuInfo, ngl: u32) -> Result<(u32, f64, Vec<String>)> {
        let mut counts = vec![cpu.physical_cores.max(1), cpu.logical_cores.max(1), (cpu.physical_cores / 2).max(1)];
        counts.push(self.settings.backend.n_threads);
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
                let score = s.scoring().trial(&t.result).filter(|_| t.result.status == TrialStatus::Ok);
                (t.result.spec.placement.n_threads, score, t.result.status.as_str())
            })
            .collect();
        let best = measured.iter().filter_map(|(n, sc, _)| sc.map(|v| (*n, v))).max_by(|a, b| a.1.total_cmp(&b.1));
        let (threads, score) = best.unwrap_or((s.backend.n_threads, 0.0));
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

/// What the trials held on the device beyond llama.cpp's dry run of them
/// (a driver's own context: about 30 MiB per process on an H200 through
/// Vulkan): the largest gap a sampler saw, 0 when none did or every trial
/// held less than priced.
#[must_use]
pub fn unaccounted(trials: &[ProfileTrial]) -> u64 {
    trials.iter().filter_map(|t| t.sampled_minus_predicted_bytes).max().and_then(|g| u64::try_from(g).ok()).unwrap_or(0)
}

fn last_tg(trials: &[ProfileTrial]) -> String {
    trials
        .iter()
        .rev()
        .find_map(|t| t.result.test(false))
        .map_or(String::new(), |t| format!(" | last tg {:.2} t/s", t.avg_ts))
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

mod experts;
mod priced;
#[cfg(test)]
mod tests;
