//! What a GGUF model is, read from its header without running it:
//! architecture, layers, bytes per layer, experts, trained context.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::bad;
use crate::gguf::{self, Gguf, GgufError};

/// Bytes hashed for a model's identity: enough to tell files apart, cheap
/// enough to do on every run.
pub const ID_PREFIX_BYTES: u64 = 16 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelInfo {
    pub path: PathBuf,
    pub file_name: String,
    pub file_size: u64,
    pub gguf_version: u32,
    pub name: Option<String>,
    pub architecture: String,
    /// Repeating (transformer) layers: `<arch>.block_count`, MTP blocks
    /// included (llama.cpp counts them in `-ngl`: the output first, then
    /// the MTP blocks, then the trunk from the top).
    pub n_layer: u32,
    /// Multi-token-prediction (NextN) blocks, the last of `block_count`
    /// (`<arch>.nextn_predict_layers`): llama.cpp loads them only for
    /// `--spec-type draft-mtp`; otherwise they take a slot of `-ngl` and no memory.
    #[serde(default, skip_serializing_if = "crate::types::is_zero")]
    pub n_layer_nextn: u32,
    /// Their tensor bytes (not in `layer_bytes`, whose slots for them are 0).
    #[serde(default, skip_serializing_if = "crate::types::is_zero_u64")]
    pub nextn_bytes: u64,
    /// ngl value that offloads everything: repeating layers plus the output layer.
    pub n_layer_full: u32,
    pub n_params: u64,
    /// `general.file_type` as llama.cpp names it, else the most common tensor type.
    pub quantization: String,
    /// Bytes by tensor type (e.g. {"Q4_K": .., "Q6_K": ..}).
    pub bytes_by_type: BTreeMap<String, u64>,
    pub n_tensors: u64,
    /// Tensor bytes of each repeating layer, `blk.0` first.
    pub layer_bytes: Vec<u64>,
    /// Input embedding bytes (`token_embd`): stays on the CPU.
    pub token_embd_bytes: u64,
    /// Output layer bytes that go to the device when it is offloaded
    /// (`output_norm` + `output`; with tied embeddings only `output_norm`).
    pub output_bytes: u64,
    pub output_tied: bool,
    pub n_expert: u32,
    pub n_expert_used: u32,
    pub ctx_train: u64,
    pub n_embd: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub n_vocab: u64,
    /// sha256 of the first 16 MiB: the model's identity in profiles.
    pub sha256_16m: String,
}

impl ModelInfo {
    /// Whether the model carries MTP heads llama.cpp can draft with: its
    /// NextN blocks and their weights (a file whose converter dropped them
    /// keeps the key; llama.cpp then loads the trunk alone).
    #[must_use]
    pub fn has_mtp(&self) -> bool {
        self.n_layer_nextn > 0 && self.nextn_bytes > 0
    }

    /// `BadInput` where `--mtp` (or `--spec-type draft-mtp`) asks for heads
    /// the model does not have.
    ///
    /// # Errors
    /// The model has none.
    pub fn require_mtp(&self) -> Result<()> {
        if self.has_mtp() {
            return Ok(());
        }
        Err(bad(format!(
            "--mtp: {} has no MTP heads ({}.nextn_predict_layers is 0 or absent, or its NextN blocks carry no weights); drop --mtp (or --spec-type draft-mtp), or give a draft model with --draft",
            self.path.display(),
            self.architecture
        )))
    }

    /// The trunk's layers' bytes (`layer_bytes` less the MTP blocks' empty slots).
    #[must_use]
    pub fn trunk_layer_bytes(&self) -> &[u64] {
        &self.layer_bytes[..(self.n_layer_trunk() as usize).min(self.layer_bytes.len())]
    }

    /// The trunk's layers: `n_layer` less the MTP blocks.
    #[must_use]
    pub fn n_layer_trunk(&self) -> u32 {
        self.n_layer - self.n_layer_nextn
    }

    /// The output layer's work in repeating layers: its weights over a
    /// layer's mean (the embeddings where they are tied, as llama.cpp then
    /// runs them as the output). 1 when the file says nothing.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn output_work_layers(&self) -> f64 {
        let layers: u64 = self.layer_bytes.iter().sum();
        if layers == 0 || self.layer_bytes.is_empty() {
            return 1.0;
        }
        let mean = layers as f64 / f64::from(self.n_layer_trunk().max(1));
        let out = if self.output_tied { self.token_embd_bytes + self.output_bytes } else { self.output_bytes };
        (out as f64 / mean).max(1.0)
    }

    #[must_use]
    pub fn is_moe(&self) -> bool {
        self.n_expert > 1
    }

    #[must_use]
    pub fn total_layer_bytes(&self) -> u64 {
        self.layer_bytes.iter().sum()
    }

    /// Repeating layers and whether the output layer go to the device at
    /// `ngl`. This llama.cpp places the output layer first: ngl 1 offloads the
    /// output layer only, ngl n means the output layer and n-1 repeating layers.
    #[must_use]
    pub fn placement(&self, ngl: u32) -> (u32, bool) {
        let ngl = ngl.min(self.n_layer_full);
        (ngl.saturating_sub(1), ngl >= 1)
    }

    /// Tensor bytes llama.cpp puts on the device at `ngl` (model buffers only).
    #[must_use]
    pub fn offloaded_bytes(&self, ngl: u32) -> u64 {
        let (n_rep, output) = self.placement(ngl);
        let n = self.layer_bytes.len();
        let rep: u64 = self.layer_bytes[n.saturating_sub(n_rep as usize)..].iter().sum();
        rep + if output { self.output_bytes } else { 0 }
    }

    /// Short description in llama-bench's `model_type` style: "gemma3 270M Q4_K_M".
    #[must_use]
    pub fn model_type(&self) -> String {
        format!("{} {} {}", self.architecture, human_params(self.n_params), self.quantization)
    }
}

#[must_use]
pub fn human_params(n: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let f = n as f64;
    if f >= 1e9 {
        format!("{:.1}B", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.0}M", f / 1e6)
    } else if f >= 1e3 {
        format!("{:.0}K", f / 1e3)
    } else {
        format!("{n}")
    }
}

/// Checks that `path` names a readable regular file, with the error a user
/// can act on.
///
/// # Errors
/// `BadInput` naming the problem.
pub fn check_model_path(path: &Path) -> Result<()> {
    const FIX: &str = "pass the path of a .gguf model";
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(bad(format!("{} is a directory, not a GGUF file; {FIX} inside it", path.display())));
    }
    crate::fsio::open_regular(path, FIX).map(drop)
}

fn gguf_error(path: &Path, e: &GgufError) -> anyhow::Error {
    let fix = match e {
        GgufError::NotGguf { .. } => "pass a .gguf model",
        GgufError::UnsupportedVersion(_) => "re-convert the model with a current llama.cpp",
        GgufError::Io(_) => "check the file's permissions",
        _ => "the download is incomplete or damaged: download the model again",
    };
    bad(format!("{} {e}; {fix}", path.display()))
}

/// Reads the model's header and tensor table.
///
/// # Errors
/// `BadInput` for a path or file that is not a usable GGUF model.
pub fn inspect(path: &Path) -> Result<ModelInfo> {
    check_model_path(path)?;
    let g = Gguf::read(path).map_err(|e| gguf_error(path, &e))?;
    from_gguf(path, &g)
}

fn from_gguf(path: &Path, g: &Gguf) -> Result<ModelInfo> {
    let shown = path.display();
    let arch = g.get_str("general.architecture").ok_or_else(|| {
        bad(format!(
            "{shown} has no general.architecture key, so llama.cpp cannot load it; pass a model GGUF (not an adapter or vocabulary file)"
        ))
    })?;
    let arch = arch.to_string();
    let key = |k: &str| g.get_u64(&format!("{arch}.{k}"));
    let n_layer = key("block_count").unwrap_or(0);
    if n_layer == 0 || g.tensors.is_empty() {
        return Err(bad(format!(
            "{shown} has no layers ({} tensors, {arch}.block_count {n_layer}): it is a vocabulary-only or empty GGUF; pass a model with weights",
            g.tensors.len()
        )));
    }
    let n_layer =
        u32::try_from(n_layer).map_err(|_| bad(format!("{shown} claims {n_layer} layers; the file is corrupt")))?;

    let n_layer_nextn = u32::try_from(key("nextn_predict_layers").unwrap_or(0)).unwrap_or(0).min(n_layer - 1);
    let mut t = TensorBytes::of(g, n_layer);
    // The MTP blocks load only for draft-mtp: their slots weigh nothing otherwise.
    let nextn_bytes: u64 = t.layers[(n_layer - n_layer_nextn) as usize..].iter_mut().map(std::mem::take).sum();
    // With tied embeddings the output layer reuses token_embd; this
    // llama.cpp keeps that tensor in host memory (its log: "token_embd.weight
    // (and 1 others) cannot be used with preferred buffer type ..., using CPU
    // instead"), so only output_norm moves to the device. Measured on
    // gemma-3-270m in the vulkan build: the device model buffer at full
    // offload equals the repeating layers' bytes.
    let output_tied = !t.has_output;
    let quantization = g
        .get_u64("general.file_type")
        .and_then(gguf::file_type_name)
        .map(str::to_string)
        .or_else(|| t.by_type.iter().max_by_key(|(_, b)| **b).map(|(t, _)| t.clone()))
        .unwrap_or_else(|| "unknown".into());

    let file_name = path.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(ModelInfo {
        path: path.to_path_buf(),
        file_name,
        file_size: g.file_size,
        gguf_version: g.version,
        name: g.get_str("general.name").map(str::to_string),
        n_layer,
        n_layer_nextn,
        nextn_bytes,
        n_layer_full: n_layer + 1,
        n_params: t.n_params,
        quantization,
        bytes_by_type: t.by_type,
        n_tensors: g.tensors.len() as u64,
        layer_bytes: t.layers,
        token_embd_bytes: t.token_embd,
        output_bytes: t.output,
        output_tied,
        n_expert: u32::try_from(key("expert_count").unwrap_or(0)).unwrap_or(0),
        n_expert_used: u32::try_from(key("expert_used_count").unwrap_or(0)).unwrap_or(0),
        ctx_train: key("context_length").unwrap_or(0),
        n_embd: key("embedding_length").unwrap_or(0),
        n_head: key("attention.head_count").unwrap_or(0),
        n_head_kv: key("attention.head_count_kv").or_else(|| key("attention.head_count")).unwrap_or(0),
        n_vocab: g.array_len("tokenizer.ggml.tokens").unwrap_or(0),
        sha256_16m: sha256_prefix(path, ID_PREFIX_BYTES).map_err(|e| bad(format!("{shown}: cannot be read ({e})")))?,
        architecture: arch,
    })
}

/// Where a model's bytes are: per repeating layer, per type, the embedding
/// and the output layer.
struct TensorBytes {
    layers: Vec<u64>,
    by_type: BTreeMap<String, u64>,
    n_params: u64,
    token_embd: u64,
    output: u64,
    has_output: bool,
}

impl TensorBytes {
    fn of(g: &Gguf, n_layer: u32) -> TensorBytes {
        let mut b = TensorBytes {
            layers: vec![0u64; n_layer as usize],
            by_type: BTreeMap::new(),
            n_params: 0,
            token_embd: 0,
            output: 0,
            has_output: false,
        };
        for (t, bytes) in g.tensors.iter().zip(&tensor_sizes(g)) {
            b.n_params += t.n_elements();
            *b.by_type.entry(gguf::type_name(t.ggml_type).to_string()).or_default() += bytes;
            if let Some(rest) = t.name.strip_prefix("blk.") {
                let idx = rest.split('.').next().and_then(|s| s.parse::<usize>().ok());
                // blk.N beyond block_count: not a layer llama.cpp places.
                if let Some(slot) = idx.and_then(|i| b.layers.get_mut(i)) {
                    *slot += bytes;
                }
            } else if t.name.starts_with("token_embd.") {
                b.token_embd += bytes;
            } else if t.name.starts_with("output.") {
                b.has_output = true;
                b.output += bytes;
            } else if t.name.starts_with("output_norm.") {
                b.output += bytes;
            }
        }
        b
    }
}

/// Size of each tensor's data: from its type where known, else from the
/// distance to the next tensor (covers types newer than this table).
fn tensor_sizes(g: &Gguf) -> Vec<u64> {
    let data_len = g.file_size.saturating_sub(g.data_offset);
    let mut offsets: Vec<u64> = g.tensors.iter().map(|t| t.offset).collect();
    offsets.sort_unstable();
    g.tensors
        .iter()
        .map(|t| {
            t.n_bytes().unwrap_or_else(|| {
                let next = offsets.iter().find(|o| **o > t.offset).copied().unwrap_or(data_len);
                next - t.offset
            })
        })
        .collect()
}

/// Hex sha256 of the first `n` bytes of a file.
///
/// # Errors
/// I/O errors.
pub fn sha256_prefix(path: &Path, n: u64) -> std::io::Result<String> {
    let f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f.take(n), &mut h)?;
    Ok(format!("{:x}", h.finalize()))
}

/// Human byte sizes the way llama.cpp prints them.
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn human_bytes(b: u64) -> String {
    let f = b as f64;
    if f >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", f / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", f / (1u64 << 20) as f64)
    }
}
