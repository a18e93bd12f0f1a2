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

/// One model of the set. Its placement is what its trials beside the
/// others ran; the JSON keeps that placement's fields flat beside the
/// member's figures, with its llama.cpp flags rendered from it when
/// written (a set from before the member held its placement is read from
/// those flags).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "StoredMember", try_from = "StoredMember")]
pub struct SetMember {
    pub model: ModelIdentity,
    /// Its share of requests (`--weights`, normalized; equal by default).
    pub weight: f64,
    /// Its layers, threads, context, KV cache and batch, as it ran.
    pub placement: crate::placement::Placement,
    pub n_layer_full: u32,
    /// Its generation speed at that placement, measured with the others resident.
    pub tg_ts: Option<f64>,
    /// Its device memory there, as llama.cpp accounted it (or sampled).
    pub device_bytes: Option<u64>,
    /// What Ollama's scheduler predicts for it before loading it beside
    /// others: its file and an f16 cache at its context, plus its batch's
    /// surcharge (`consumer::ollama::predicted_for_load`).
    pub ollama_predicted_bytes: Option<u64>,
    /// Why it got these layers, in words.
    pub why: String,
    /// Its Modelfile PARAMETER lines (num_gpu always set: see `ollama_note`).
    pub modelfile: Vec<String>,
}

impl SetMember {
    /// Its llama.cpp flags (llama-server, `bench --llama-args`), the model apart.
    #[must_use]
    pub fn llama_cpp_args(&self) -> String {
        self.placement.flags()
    }
}

/// A member as the set's JSON holds it.
#[derive(Serialize, Deserialize)]
struct StoredMember {
    model: ModelIdentity,
    weight: f64,
    #[serde(flatten)]
    placement: serde_json::Map<String, serde_json::Value>,
    n_layer_full: u32,
    tg_ts: Option<f64>,
    device_bytes: Option<u64>,
    #[serde(default)]
    ollama_predicted_bytes: Option<u64>,
    why: String,
    #[serde(default)]
    llama_cpp_args: String,
    modelfile: Vec<String>,
}

impl From<SetMember> for StoredMember {
    fn from(m: SetMember) -> Self {
        StoredMember {
            llama_cpp_args: m.llama_cpp_args(),
            model: m.model,
            weight: m.weight,
            placement: super::option::placement_fields(&m.placement),
            n_layer_full: m.n_layer_full,
            tg_ts: m.tg_ts,
            device_bytes: m.device_bytes,
            ollama_predicted_bytes: m.ollama_predicted_bytes,
            why: m.why,
            modelfile: m.modelfile,
        }
    }
}

impl TryFrom<StoredMember> for SetMember {
    type Error = serde_json::Error;

    fn try_from(s: StoredMember) -> Result<Self, Self::Error> {
        Ok(SetMember {
            placement: super::option::stored_placement(s.placement, &s.llama_cpp_args)?,
            model: s.model,
            weight: s.weight,
            n_layer_full: s.n_layer_full,
            tg_ts: s.tg_ts,
            device_bytes: s.device_bytes,
            ollama_predicted_bytes: s.ollama_predicted_bytes,
            why: s.why,
            modelfile: s.modelfile,
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A member is written with its placement's fields flat and its flags
    /// rendered from them, and read back whole; a member from before (its
    /// layers, threads and context beside its flags) is read from the flags.
    #[test]
    fn a_member_is_written_as_its_placement_and_older_members_read_from_their_flags() {
        let model: ModelIdentity = serde_json::from_value(serde_json::json!({
            "file_name": "a.gguf", "path": "/m/a.gguf", "file_size": 1, "sha256_16m": "0".repeat(64), "mtime": 0,
            "architecture": "llama", "n_layer": 30, "n_layer_full": 31, "quantization": "Q4_0", "n_params": 1, "n_expert": 0
        }))
        .unwrap();
        let p = crate::placement::Placement { n_batch: 1024, n_ubatch: 1024, ..crate::placement::Placement::default() }
            .with_layers(20, 4, Some(8192))
            .with_kv(crate::placement::KvType::Q8_0);
        let m = SetMember {
            model,
            weight: 0.5,
            placement: p.clone(),
            n_layer_full: 31,
            tg_ts: Some(10.0),
            device_bytes: Some(1 << 30),
            ollama_predicted_bytes: Some(3 << 29),
            why: "its share".into(),
            modelfile: vec!["PARAMETER num_gpu 20".into()],
        };
        let mut v = serde_json::to_value(&m).unwrap();
        let shown = (v["n_gpu_layers"].as_u64(), v["n_threads"].as_u64(), v["n_ctx"].as_u64(), v["kv_type"].as_str());
        assert_eq!(shown, (Some(20), Some(4), Some(8192), Some("q8_0")));
        assert_eq!(v["llama_cpp_args"].as_str(), Some(p.flags().as_str()));
        assert!(p.flags().contains("-b 1024 -ub 1024") && p.flags().contains("-ctk q8_0"), "{}", p.flags());
        assert_eq!(serde_json::from_value::<SetMember>(v.clone()).unwrap(), m);
        let o = v.as_object_mut().unwrap();
        for k in ["n_batch", "n_ubatch", "flash_attn", "n_cpu_moe", "kv_type"] {
            o.remove(k);
        }
        assert_eq!(serde_json::from_value::<SetMember>(v).unwrap().placement, p, "read from its flags");
    }
}
