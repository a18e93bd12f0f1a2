//! The start of a tune: the machine probed once, the memory policy and
//! its cap, the power checks, the checkpoint to continue from, the runner
//! whose worker every context's trials share, and the KV cache kept at
//! each context's depth. What every context's search shares.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use super::search::Checkpointing;
use super::{memory, TuneRequest};
use crate::clock::now_rfc3339;
use crate::engine::runner::Runner;
use crate::probe;
use crate::profile::store;
use crate::profile::{Checkpoint, MemoryPolicy, ModelIdentity, SearchPolicy, SCHEMA_VERSION};
use crate::types::{Hardware, Note};

/// The machine-wide facts every context's search shares.
pub(super) struct Shared<'a> {
    pub opts: &'a TuneRequest,
    pub hw: Hardware,
    pub identity: ModelIdentity,
    pub policy: Option<MemoryPolicy>,
    pub op_offload: bool,
    /// Runs every context's trials and every other llama.cpp child of the
    /// tune (its dry runs, its quality probes); the worker it keeps ends
    /// with the tune (before the depth cache below is removed).
    pub runner: Runner,
    /// Where the trials keep the KV cache filled to each context's depth.
    pub depth_cache: Option<PathBuf>,
    /// Removes that directory at the end.
    _depth_guard: Option<crate::engine::DepthCache>,
}

/// Starts a tune: what it shares, the checkpoint to continue from, and
/// what was said so far.
///
/// # Errors
/// `BadInput` for power settings the machine cannot read; the runner
/// cannot find this binary.
pub(super) fn start(opts: &TuneRequest) -> Result<(Shared<'_>, Checkpointing, Vec<Note>)> {
    let s = opts.settings();
    let mut hw = opts.hw().clone();
    // Minutes may have passed since the request (another model's tune).
    probe::refresh_memory(&mut hw);
    let identity = ModelIdentity::of(opts.info());
    let policy = memory::policy_for(&hw, &s.caps, opts.caps());
    check_request_power(opts)?;
    let mut notes: Vec<Note> = hw.notes.iter().map(Note::hardware).collect();
    let checkpoint = resume(opts, &identity, &hw, &mut notes);
    let op_offload = s.backend.op_offload.resolve(probe::only_software_offload(&hw.llama_devices));
    if !op_offload && s.backend.op_offload == crate::placement::OpOffload::Auto {
        notes.push(Note::op_offload(probe::op_offload_note(&hw.llama_devices)));
    }
    // NGL_TUNE_NO_DEPTH_CACHE: every trial fills its own cache (the benchmark's other side).
    let guard = crate::engine::DepthCache::unless_disabled();
    let runner = runner(&s.policy, opts.verbose())?;
    let depth_cache = guard.as_ref().map(|d| d.0.clone());
    let sh = Shared { opts, hw, identity, policy, op_offload, runner, depth_cache, _depth_guard: guard };
    Ok((sh, checkpoint, notes))
}

/// The power checks of a request (see [`check_power`]), before anything is
/// written: `ngl-tune tune` asks before it takes the store's lock.
///
/// # Errors
/// `BadInput`, as [`check_power`].
pub(crate) fn check_request_power(opts: &TuneRequest) -> Result<()> {
    let s = opts.settings();
    check_power((&s.caps, &s.goal), opts.caps().len(), !opts.hw().gpus.is_empty())
}

/// `--objective energy` and `--max-power` need the power they choose by,
/// and energy chooses whole layers on one device (the hatches and splits
/// are judged by speed): bad input otherwise, before any work. `nvml`:
/// the hardware probe saw NVIDIA cards through NVML.
fn check_power((caps, goal): (&crate::profile::Caps, &crate::types::Goal), devices: usize, nvml: bool) -> Result<()> {
    let energy = goal.objective.weighs_power();
    if caps.max_power_w.is_some() && !nvml {
        return Err(crate::error::bad(
            "--max-power reads an NVIDIA card's power through NVML, and NVML is not available here: drop --max-power",
        ));
    }
    // The CPU's power is half of every partial offload's: scored on the
    // GPUs' power alone, layers moved to the CPU would look free, and the
    // answer would lean the way that costs the user most.
    if energy && crate::probe::rapl::Rapl::open().is_none() {
        let what = if nvml { "the GPUs' power through NVML but not the CPU's" } else { "no power at all" };
        return Err(crate::error::bad(format!(
            "--objective energy needs the CPU's power too, and no RAPL counter under {} can be read here ({what}; energy_uj is root-only on current kernels): run as root or make it readable (sudo chmod a+r {}/intel-rapl:*/energy_uj), or use --objective tg",
            crate::probe::rapl::POWERCAP,
            crate::probe::rapl::POWERCAP
        )));
    }
    if energy && devices >= 2 {
        return Err(crate::error::bad(format!(
            "--objective energy tunes whole layers on one device; with {devices} offload devices use --objective tg"
        )));
    }
    Ok(())
}

/// What runs trials with the settings' limits (time, memory sampling,
/// contention): every context's, a set's, a re-profile's second looks,
/// and the llama.cpp children they start.
///
/// # Errors
/// When the current executable's path cannot be found.
pub fn runner(policy: &SearchPolicy, verbose: bool) -> Result<Runner> {
    Ok(Runner::current(Duration::from_secs(policy.trial_timeout_s), verbose)?
        .with_sample_interval(Duration::from_millis(policy.sample_interval_ms))
        .with_busy_threshold(policy.busy_threshold))
}

/// The checkpoint to continue from: the previous one with `--resume` when
/// it is for the same model, settings and hardware, else a fresh one; what
/// happened is said in `notes`.
fn resume(opts: &TuneRequest, identity: &ModelIdentity, hw: &Hardware, notes: &mut Vec<Note>) -> Checkpointing {
    let s = opts.settings();
    let path = store::checkpoint_path(opts.store(), &hw.machine_id, identity);
    let fresh = Checkpoint {
        schema_version: SCHEMA_VERSION,
        kind: "checkpoint".into(),
        created_at: now_rfc3339(),
        model: identity.clone(),
        fingerprint: hw.fingerprint.clone(),
        settings: s.clone(),
        trials: Vec::new(),
    };
    let same = |c: &Checkpoint| c.model == *identity && c.settings == *s && c.fingerprint == hw.fingerprint;
    let checkpoint = match store::read_checkpoint(&path) {
        Some(c) if opts.resume() && same(&c) => {
            notes.push(Note::resume(format!("resuming: {} finished trials from {}", c.trials.len(), path.display())));
            c
        }
        Some(_) if opts.resume() => {
            notes.push(Note::resume(format!(
                "{} is for other settings, another model file or changed hardware; starting fresh",
                path.display()
            )));
            fresh
        }
        None if opts.resume() => {
            notes.push(Note::resume("nothing to resume (no checkpoint for this model and machine); starting fresh"));
            fresh
        }
        Some(c) => {
            notes.push(Note::resume(format!(
                "an unfinished tuning ({} trials) was replaced; --resume would have continued it",
                c.trials.len()
            )));
            fresh
        }
        None => fresh,
    };
    Checkpointing::new(path, checkpoint)
}
