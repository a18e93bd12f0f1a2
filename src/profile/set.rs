//! Several models placed to stay resident together on one device
//! (`tune A.gguf B.gguf --together`): each member's placement, the sets
//! measured with all of them loaded, and the forms that keep them loaded
//! together (Ollama's server settings, a llama-swap group).
//! Stored beside the profiles (`<store>/<machine>/sets/`), validated by
//! `profiles/set.schema.json`.

use serde::{Deserialize, Serialize};

use super::{MemoryPolicy, ModelIdentity, Tool};
use crate::types::TrialResult;

/// What `--together` found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetProfile {
    pub schema_version: u32,
    /// Always "set".
    pub kind: String,
    pub tool: Tool,
    pub created_at: String,
    pub machine_id: String,
    pub fingerprint: String,
    /// The device and the cap every member shares.
    pub memory: MemoryPolicy,
    /// In the order given, each with its share of requests and its answer.
    pub members: Vec<SetMember>,
    /// The sets measured with every member resident, best first.
    pub sets: Vec<MeasuredSet>,
    /// Every trial: each member alone, then each member of each measured
    /// set generating while the others are resident.
    pub trials: Vec<SetTrial>,
    /// The Ollama server's settings that keep the members loaded together.
    pub ollama_server_env: Vec<String>,
    /// What Ollama's scheduler does with this set (server/sched.go), in words.
    pub ollama_note: String,
    /// A llama-swap config whose group runs the members side by side.
    pub llama_swap: String,
    pub wall_s: f64,
}

/// One model of the set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetMember {
    pub model: ModelIdentity,
    /// Its share of requests (`--weights`, normalized; equal by default).
    pub weight: f64,
    pub n_gpu_layers: u32,
    pub n_layer_full: u32,
    pub n_threads: u32,
    pub n_ctx: u32,
    /// Its generation speed at that placement, measured with the others resident.
    pub tg_ts: Option<f64>,
    /// Its device memory there, as llama.cpp accounted it (or sampled).
    pub device_bytes: Option<u64>,
    /// Why it got these layers, in words.
    pub why: String,
    /// Its llama.cpp flags (llama-server, `bench --llama-args`), the model apart.
    pub llama_cpp_args: String,
    /// Its Modelfile PARAMETER lines (num_gpu always set: see `ollama_note`).
    pub modelfile: Vec<String>,
}

/// One set of placements measured together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredSet {
    /// Each member's layers on the device, in member order.
    pub n_gpu_layers: Vec<u32>,
    /// The weighted seconds per generated token predicted from the members alone.
    pub predicted_s_per_token: f64,
    /// Measured: the weighted seconds per generated token (`None`: a member failed).
    pub s_per_token: Option<f64>,
    /// Each member's tg with the others resident.
    pub tg_ts: Vec<Option<f64>>,
    /// The set's device memory, all members resident.
    pub device_bytes: Option<u64>,
    pub under_cap: bool,
    pub recommended: bool,
}

/// A trial of the set's search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetTrial {
    /// The member measured (its index).
    pub member: usize,
    /// The others resident meanwhile: (member, layers on the device).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub beside: Vec<(usize, u32)>,
    /// Their device bytes while resident (llama.cpp's accounting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beside_bytes: Option<u64>,
    pub result: TrialResult,
}
