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
pub mod draft;
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
mod request;
pub mod search;
pub mod speed;
pub mod split;
mod start;
pub mod summary;
pub mod together;
pub mod verdict;
#[cfg(test)]
pub(crate) mod worlds;

pub use request::{Machine, TuneRequest};
pub(crate) use start::check_request_power;
pub use start::runner;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;

use crate::profile::Profile;
use crate::types::Note;

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
