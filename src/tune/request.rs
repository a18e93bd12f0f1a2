//! A finished tune request: the model, the machine as probed once, and
//! the settings the tune runs with, contexts and consumer already laid
//! over them. The request room (`crate::request`) builds it from the
//! command line, the re-profile from a stored profile; its fields are
//! private, so nothing changes it once built.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::memory::{self, DeviceCap};
use crate::model::ModelInfo;
use crate::profile::{store, Backend, Caps, Settings};
use crate::types::{Hardware, LlamaDevice};

/// The machine a request runs on, probed once: each offload device's cap,
/// and the hardware with llama.cpp's devices (as its loadability check
/// listed them) and the RPC servers as they answered.
#[derive(Debug, Clone)]
pub struct Machine {
    caps: Vec<DeviceCap>,
    hw: Hardware,
}

impl Machine {
    /// Probes the RPC servers `backend` names (before the check: its child
    /// could only say it cannot load the model), checks that llama.cpp can
    /// load the model (and projector), prices each device's cap from
    /// `caps`, reads the hardware.
    ///
    /// # Errors
    /// `BadInput` naming the server, the model or the budget and the fix.
    pub fn probe(info: &ModelInfo, (backend, caps): (&Backend, &Caps)) -> Result<Machine> {
        let rpc_servers = crate::rpc::probe_all(&backend.rpc)?;
        let exe = crate::engine::child::current_exe()?;
        let devices = crate::engine::child::check_loadable(&exe, info, &backend.rpc, backend.mmproj.as_deref())?;
        if let Some(d) = &backend.draft {
            check_draft(info, d)?;
        }
        let caps = memory::device_caps(&devices, caps)?;
        let mut hw = crate::probe::hardware(devices);
        hw.rpc_servers = rpc_servers;
        hw.fingerprint = crate::probe::fingerprint(&hw);
        Ok(Machine { caps, hw })
    }

    /// llama.cpp's devices, as the loadability check listed them.
    #[must_use]
    pub fn devices(&self) -> &[LlamaDevice] {
        &self.hw.llama_devices
    }

    /// The machine, probed with the request (its memory is read again when
    /// the tune starts).
    #[must_use]
    pub fn hw(&self) -> &Hardware {
        &self.hw
    }
}

/// `--draft`: llama.cpp would draft for the model with it (its vocabulary
/// check, in a child that reads both vocabularies), and the text drafted
/// on can be read. `--mtp`: the model has MTP heads.
///
/// # Errors
/// `BadInput` for a draft that does not suit the model.
fn check_draft(info: &ModelInfo, d: &crate::profile::DraftRequest) -> Result<()> {
    if d.model.is_none() {
        info.require_mtp()?;
    }
    let placement =
        crate::placement::Placement { draft: Some(d.draft(None)), ..crate::placement::Placement::default() };
    crate::engine::spec::check(&crate::engine::spec::SpecAsk {
        model: info.path.clone(),
        placement,
        n_depth: 0,
        n_gen: 1,
        repetitions: 1,
        text_file: d.prompt_file.clone(),
        check_only: true,
    })
}

/// How a tune talks and whether it continues a checkpoint.
#[derive(Debug, Clone, Copy)]
struct Run {
    resume: bool,
    verbose: bool,
    progress: bool,
}

/// A validated tuning request. The command line and the nightly re-tune
/// both build one with [`TuneRequest::new`] from a [`Machine::probe`], so
/// both make the same checks.
#[derive(Debug, Clone)]
pub struct TuneRequest {
    info: ModelInfo,
    settings: Settings,
    store: PathBuf,
    machine: Machine,
    run: Run,
}

impl TuneRequest {
    /// The request for `info` with its finished `settings` on `machine`,
    /// writing to `store`.
    ///
    /// # Errors
    /// `BadInput` for a store that cannot be used.
    pub fn new(info: ModelInfo, settings: Settings, store: PathBuf, machine: Machine) -> Result<TuneRequest> {
        store::check_dir(&store)?;
        let run = Run { resume: false, verbose: false, progress: true };
        Ok(TuneRequest { info, settings, store, machine, run })
    }

    #[must_use]
    pub fn with_resume(mut self, resume: bool) -> Self {
        self.run.resume = resume;
        self
    }

    #[must_use]
    pub fn with_output(mut self, verbose: bool, progress: bool) -> Self {
        self.run.verbose = verbose;
        self.run.progress = progress;
        self
    }

    #[must_use]
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The settings the tune runs with; the profile stores them as they are.
    #[must_use]
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    #[must_use]
    pub fn store(&self) -> &Path {
        &self.store
    }

    #[must_use]
    pub fn hw(&self) -> &Hardware {
        &self.machine.hw
    }

    /// Each offload device's cap, in llama.cpp's device order.
    #[must_use]
    pub fn caps(&self) -> &[DeviceCap] {
        &self.machine.caps
    }

    #[must_use]
    pub fn resume(&self) -> bool {
        self.run.resume
    }

    #[must_use]
    pub fn verbose(&self) -> bool {
        self.run.verbose
    }

    #[must_use]
    pub fn progress(&self) -> bool {
        self.run.progress
    }
}
