//! A neighbour resident beside the trials: another model loaded with its
//! context allocated in a process of its own (`__hold`), idle, as a second
//! model sits loaded in Ollama or in a llama-swap group while the first
//! answers. Ended when dropped (its stdin closed, then killed).

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Result};

use super::live::{Answer, Live};
use crate::types::{BufferLine, TrialSpec};

/// A model held resident.
pub struct Hold {
    _live: Live,
    /// What llama.cpp allocated for it (model and context buffers).
    pub buffers: Vec<BufferLine>,
}

impl Hold {
    /// Loads `spec`'s model and context in a holder and waits until both
    /// are allocated (at most `timeout`).
    ///
    /// # Errors
    /// Why it could not be held (llama.cpp's reason), or an interrupt.
    pub fn start(exe: &Path, spec: &TrialSpec, timeout: Duration) -> Result<Hold> {
        let mut live = Live::start(exe, "__hold", &[], false)?;
        live.send(&serde_json::to_vec(spec)?);
        let name = spec.model.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        match live.answer(super::worker::HELD_PREFIX, timeout, Duration::from_millis(50), || {})? {
            Answer::Line(l) => {
                let v: serde_json::Value = serde_json::from_str(&l)?;
                if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
                    return Err(anyhow!("{name} could not be held resident: {e}"));
                }
                let buffers = serde_json::from_value(v["buffers"].clone())?;
                Ok(Hold { _live: live, buffers })
            }
            Answer::Exited(s) => Err(anyhow!("{name}'s holder ended ({})", super::child::describe_exit(s))),
            Answer::TimedOut => Err(anyhow!("{name} was not loaded within {}s", timeout.as_secs())),
        }
    }

    /// Its bytes on accelerator devices, as llama.cpp accounted them.
    #[must_use]
    pub fn device_bytes(&self) -> u64 {
        self.buffers.iter().filter(|b| b.on_device()).map(|b| b.bytes).sum()
    }
}
