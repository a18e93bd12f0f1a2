//! Unfinished work: the trials of a tune so far, saved after every trial.

use serde::{Deserialize, Serialize};

use super::{ModelIdentity, ProfileTrial, Settings};

/// Unfinished work, saved after every trial so an interrupt loses nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub schema_version: u32,
    pub kind: String,
    pub created_at: String,
    pub model: ModelIdentity,
    pub fingerprint: String,
    pub settings: Settings,
    pub trials: Vec<ProfileTrial>,
}
