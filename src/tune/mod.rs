//! The tuner: orchestration only. It probes the machine, resumes or starts a
//! checkpoint, asks llama.cpp's dry run what each setting will cost, hands
//! the search (`search`, measuring through an `executor`) a plan, and turns
//! what it found into a profile. The parts: `plan` (candidates, grid,
//! adaptive points), `memory` (policy, cap, prediction), `search`, `choose`
//! (the decision, pure), `knee`, `summary` (what the search says about
//! itself and the recommendation).

pub mod baseline;
pub mod choose;
mod context;
pub mod executor;
mod finish;
pub mod hatch;
pub mod knee;
pub mod memory;
mod ollama;
pub mod plan;
pub mod pricer;
pub mod quality;
pub mod rank;
pub mod search;
pub mod speed;
pub mod split;
mod start;

pub use start::runner;
pub mod summary;
pub mod together;
pub mod verdict;
#[cfg(test)]
pub(crate) mod worlds;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;

use crate::model::ModelInfo;
use crate::profile::store;
use crate::profile::{Profile, Settings};
use crate::types::Note;

/// A validated tuning request: the model, settings llama.cpp can run, the
/// RPC servers as they answered, the devices the loadability check listed
/// and each one's cap. The command line and the
/// nightly re-tune both build one with [`TuneRequest::new`], so both make
/// the same checks.
#[derive(Debug, Clone)]
pub struct TuneRequest {
    pub info: ModelInfo,
    pub settings: Settings,
    pub store: PathBuf,
    pub resume: bool,
    pub verbose: bool,
    pub progress: bool,
    /// llama.cpp's devices, as the loadability check listed them.
    pub devices: Vec<crate::types::LlamaDevice>,
    /// The settings' RPC servers, probed before the check.
    pub rpc_servers: Vec<crate::types::RpcServer>,
    /// Each offload device's cap, in llama.cpp's device order.
    pub caps: Vec<memory::DeviceCap>,
    /// The machine, probed once with the request (its memory read again
    /// when the tune starts).
    pub hw: crate::types::Hardware,
}

impl TuneRequest {
    /// Checks that the store is usable, that every RPC server answers, that
    /// llama.cpp can load the model, and that each budget names a device.
    ///
    /// # Errors
    /// `BadInput` naming the store, the server, the model or the budget and the fix.
    pub fn new(info: ModelInfo, settings: Settings, store: PathBuf) -> Result<TuneRequest> {
        store::check_dir(&store)?;
        let s = &settings;
        // Before the check: its child could only say it cannot load the model.
        let rpc_servers = crate::rpc::probe_all(&s.rpc)?;
        let exe = crate::engine::child::current_exe()?;
        let devices = crate::engine::child::check_loadable(&exe, &info, &s.rpc, s.mmproj.as_deref())?;
        let caps = memory::device_caps(&devices, s.target_vram, s.vram_budget_bytes, &s.device_budgets)?;
        let mut hw = crate::probe::hardware(devices.clone());
        hw.rpc_servers.clone_from(&rpc_servers);
        hw.fingerprint = crate::probe::fingerprint(&hw);
        Ok(TuneRequest {
            info,
            settings,
            store,
            resume: false,
            verbose: false,
            progress: true,
            devices,
            rpc_servers,
            caps,
            hw,
        })
    }

    #[must_use]
    pub fn with_resume(mut self, resume: bool) -> Self {
        self.resume = resume;
        self
    }

    #[must_use]
    pub fn with_output(mut self, verbose: bool, progress: bool) -> Self {
        self.verbose = verbose;
        self.progress = progress;
        self
    }
}

#[derive(Debug, Clone)]
pub struct TuneOutcome {
    pub profile: Profile,
    pub path: PathBuf,
    /// Said to the user once (missing sources, resumed work, ...); the warnings among them go beside the numbers.
    pub notes: Vec<Note>,
}

/// Runs the whole tuning (each context size, smallest first) and writes the profile.
///
/// # Errors
/// Worker start failures, an interrupt (the checkpoint keeps finished
/// trials), or a profile that cannot be written.
pub fn tune(opts: &TuneRequest) -> Result<TuneOutcome> {
    let started = Instant::now();
    let (sh, checkpoint, notes) = start::start(opts)?;
    let outcomes = context::every_context(&sh, checkpoint)?;
    finish::profile(&sh, outcomes, notes, started)
}
