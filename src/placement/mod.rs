//! Where a model's parts run, as llama.cpp takes it: layers, threads, context,
//! KV cache, flash attention, batch sizes, tensor overrides, devices and their split.

use serde::{Deserialize, Serialize};

pub mod args;
mod draft;
mod knobs;
mod split;

pub use draft::{Draft, DEFAULT_N_MAX as DRAFT_N_MAX, MTP_TYPE, SPEC_TYPE};
pub use knobs::*;
pub use split::Split;

/// Where each part of a model runs and with which llama.cpp settings: what
/// a trial runs and what is emitted. It renders llama.cpp's own forms
/// (flags, llama-server's `LLAMA_ARG_*` environment), which
/// `args::parse` and `args::from_env` read back; a consumer's
/// forms are its room's (`consumer::ollama::modelfile_lines`,
/// `consumer::ollama::server_settings`).
/// Field names are llama-bench's, and the trial spec's JSON (it is flattened there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// As given by the user (99 means "all"); llama.cpp clamps it.
    pub n_gpu_layers: u32,
    pub n_threads: u32,
    /// Context size; `None` sizes each test's context as llama-bench does
    /// (n_prompt + n_gen of that test), and leaves `-c` to llama.cpp.
    pub n_ctx: Option<u32>,
    /// Batch sizes and flash attention (`-b`, `-ub`, `-fa`); profiles'
    /// recommendations from before the fields: llama.cpp's defaults.
    #[serde(default = "default_n_batch")]
    pub n_batch: u32,
    #[serde(default = "default_n_ubatch")]
    pub n_ubatch: u32,
    #[serde(default)]
    pub flash_attn: FlashAttn,
    /// KV cache type of both caches (`-ctk`/`-ctv`).
    #[serde(default, skip_serializing_if = "is_f16")]
    pub kv_type: KvType,
    /// Layers (from the first) whose expert tensors stay on the CPU, as
    /// llama.cpp's `--n-cpu-moe`; 0 for dense models.
    #[serde(default)]
    pub n_cpu_moe: u32,
    /// Layers (from the first) whose dense FFN weights (`ffn_up`, `ffn_gate`,
    /// `ffn_down`) stay on the CPU while the layer, its attention and its
    /// KV cache are offloaded: llama.cpp's `-ot` with a CPU buffer type.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub n_cpu_ffn: u32,
    /// More tensors kept in the CPU buffer type: regular expressions of
    /// llama.cpp's `-ot PATTERN=CPU` (bench's `--override-tensor`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_overrides: Vec<String>,
    /// Offload host tensor operations (large-batch matrix products of
    /// layers on the CPU) to the device: llama.cpp's default (on), its
    /// `--no-op-offload` (off), or auto, which the worker resolves from its
    /// devices (off where every offload device runs on the CPU). A result's
    /// spec says what was used.
    /// Profiles of schema 3 and before wrote a recommendation's as a
    /// boolean (false: off), which is read as on or off.
    #[serde(default = "op_on", skip_serializing_if = "is_op_on", deserialize_with = "op_offload_or_bool")]
    pub op_offload: OpOffload,
    /// llama.cpp RPC servers (`host:port`) whose devices join this
    /// machine's, as llama.cpp's `--rpc`: listed first among the offload
    /// devices, as llama.cpp orders them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpc: Vec<String>,
    /// `-sm`: llama.cpp's default, layer.
    #[serde(default, skip_serializing_if = "is_layer")]
    pub split_mode: SplitMode,
    /// The offload devices in the order they take layers (llama.cpp's
    /// `--device A,B`, names as `--list-devices` gives them): the first
    /// holds the first offloaded layers, the last the output layer. Empty:
    /// every device, in llama.cpp's order (RPC servers first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// Layers per offload device, in the order of `devices` (llama.cpp's
    /// `-ts` with split mode layer); empty: llama.cpp's default split, by
    /// free memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_split: Vec<u32>,
    /// The device that holds the output and intermediate results in split
    /// mode layer (`-mg`); llama.cpp's default 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub main_gpu: u32,
    /// Parallel sequences (llama-server's slots, `-np`): `n_ctx` is the
    /// whole context, each slot gets `n_ctx / n_parallel` (as llama-server
    /// splits it, and as Ollama starts it: `-c num_ctx x P -np P`).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub n_parallel: u32,
    /// One KV cache shared by the slots (`-kvu`): each sequence may use the
    /// whole context. llama-server's own when the slot count is its auto
    /// (4 slots, unified); off for a given `-np`, as Ollama starts it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub kv_unified: bool,
    /// A multimodal projector (llama-server's `--mmproj`), loaded beside
    /// the model on the first GPU, as llama-server loads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<std::path::PathBuf>,
    /// Whether the projector loads on the GPU (llama.cpp's default); false
    /// is `--no-mmproj-offload`, as Ollama starts it where the GPU has too
    /// little free memory for it.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub mmproj_offload: bool,
    /// A draft model for speculative decoding, loaded beside the model as
    /// llama-server loads it (`-md`, `--spec-type draft-simple`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<Draft>,
}

fn op_on() -> OpOffload {
    OpOffload::On
}

fn default_n_batch() -> u32 {
    DEFAULT_N_BATCH
}

fn default_n_ubatch() -> u32 {
    DEFAULT_N_UBATCH
}

/// Op offload as a word (`"off"`, `"auto"`, `"on"`), or as the boolean a
/// recommendation of schema 3 and before held.
fn op_offload_or_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<OpOffload, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Word(OpOffload),
        Bool(bool),
    }
    Ok(match Either::deserialize(d)? {
        Either::Word(o) => o,
        Either::Bool(on) => OpOffload::from(on),
    })
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_op_on(o: &OpOffload) -> bool {
    *o == OpOffload::On
}

#[allow(clippy::trivially_copy_pass_by_ref)]
#[must_use]
pub fn is_layer(m: &SplitMode) -> bool {
    *m == SplitMode::Layer
}

impl Default for Placement {
    /// llama.cpp's defaults for everything but layers and threads, which
    /// every rendered form states.
    fn default() -> Self {
        Placement {
            n_gpu_layers: 0,
            n_threads: 1,
            n_ctx: None,
            n_batch: DEFAULT_N_BATCH,
            n_ubatch: DEFAULT_N_UBATCH,
            flash_attn: FlashAttn::Auto,
            kv_type: KvType::F16,
            n_cpu_moe: 0,
            n_cpu_ffn: 0,
            cpu_overrides: Vec::new(),
            op_offload: OpOffload::On,
            rpc: Vec::new(),
            split_mode: SplitMode::Layer,
            devices: Vec::new(),
            tensor_split: Vec::new(),
            main_gpu: 0,
            n_parallel: 1,
            kv_unified: false,
            mmproj: None,
            mmproj_offload: true,
            draft: None,
        }
    }
}

impl Placement {
    #[must_use]
    pub fn with_layers(mut self, ngl: u32, threads: u32, n_ctx: Option<u32>) -> Self {
        self.n_gpu_layers = ngl;
        self.n_threads = threads;
        self.n_ctx = n_ctx;
        self
    }

    #[must_use]
    pub fn with_parallel(mut self, n: u32) -> Self {
        self.n_parallel = n.max(1);
        self
    }

    /// A quantized KV cache turns flash attention on (llama.cpp needs it for a quantized V cache).
    #[must_use]
    pub fn with_kv(mut self, kv: KvType) -> Self {
        self.kv_type = kv;
        self.flash_attn = kv.flash_attn(self.flash_attn);
        self
    }

    /// llama-server's own batch sizes, flash attention and slots (`-b 2048
    /// -ub 512 -fa auto`, `-np` auto: 4 over one unified cache, its
    /// tools/server `params.n_parallel = -1` and `-kvu` "enabled if number
    /// of slots is auto"): what it runs without flags.
    #[must_use]
    pub fn with_server_defaults(mut self) -> Self {
        (self.n_batch, self.n_ubatch) = (DEFAULT_N_BATCH, DEFAULT_N_UBATCH);
        (self.n_parallel, self.kv_unified) = (SERVER_SLOTS, true);
        self.flash_attn = self.kv_type.flash_attn(FlashAttn::Auto);
        self
    }

    #[must_use]
    pub fn with_op_offload(mut self, on: bool) -> Self {
        self.op_offload = OpOffload::from(on);
        self
    }

    #[must_use]
    pub fn with_mmproj(mut self, mmproj: Option<&std::path::Path>) -> Self {
        self.mmproj = mmproj.map(std::path::Path::to_path_buf);
        self
    }

    /// Whole layers per device (`-sm layer -ts a,b -mg 0`), on `rpc`'s servers and this machine's devices.
    #[must_use]
    pub fn with_split(mut self, tensor_split: &[u32], rpc: &[String]) -> Self {
        self.tensor_split = tensor_split.to_vec();
        self.rpc = rpc.to_vec();
        self
    }

    /// How the layers' weights are split (`-sm`).
    #[must_use]
    pub fn with_split_mode(mut self, mode: SplitMode) -> Self {
        self.split_mode = mode;
        self
    }

    /// The devices in the order they take layers (`--device`); `tensor_split` follows it.
    #[must_use]
    pub fn with_devices(mut self, devices: &[String]) -> Self {
        self.devices = devices.to_vec();
        self
    }

    /// Every `-ot` pattern whose tensors stay on the CPU: the dense FFN of
    /// the first `n_cpu_ffn` layers, then the others.
    #[must_use]
    pub fn cpu_patterns(&self) -> Vec<String> {
        (self.n_cpu_ffn > 0)
            .then(|| cpu_ffn_regex(self.n_cpu_ffn))
            .into_iter()
            .chain(self.cpu_overrides.iter().cloned())
            .collect()
    }

    /// The `-ot` value: `PATTERN=CPU,...`.
    fn override_value(&self) -> Option<String> {
        let p = self.cpu_patterns();
        (!p.is_empty()).then(|| p.iter().map(|p| format!("{p}=CPU")).collect::<Vec<_>>().join(","))
    }

    /// Split flags are stated once anything differs from llama.cpp's default.
    fn states_split(&self) -> bool {
        !self.tensor_split.is_empty() || self.split_mode != SplitMode::Layer || self.main_gpu != 0
    }

    /// The `--device` value, where the order is not llama.cpp's.
    fn device_value(&self) -> Option<String> {
        (!self.devices.is_empty()).then(|| self.devices.join(","))
    }

    /// llama.cpp's flags, shell-quoted: `-ngl N -t T` always, every other
    /// setting where it is not llama.cpp's default.
    #[must_use]
    pub fn flags(&self) -> String {
        let mut f = Vec::new();
        if !self.rpc.is_empty() {
            f.push(format!("--rpc {}", self.rpc.join(",")));
        }
        if let Some(d) = self.device_value() {
            f.push(format!("--device {}", shell_quote(&d)));
        }
        f.push(format!("-ngl {} -t {}", self.n_gpu_layers, self.n_threads));
        if let Some(c) = self.n_ctx {
            f.push(format!("-c {c}"));
        }
        if self.n_parallel > 1 {
            f.push(format!("-np {}", self.n_parallel));
        }
        if self.kv_unified {
            f.push("-kvu".into());
        }
        if self.n_batch != DEFAULT_N_BATCH {
            f.push(format!("-b {}", self.n_batch));
        }
        if self.n_ubatch != DEFAULT_N_UBATCH {
            f.push(format!("-ub {}", self.n_ubatch));
        }
        if self.n_cpu_moe > 0 {
            f.push(format!("--n-cpu-moe {}", self.n_cpu_moe));
        }
        if self.op_offload == OpOffload::Off {
            f.push("--no-op-offload".into());
        }
        if self.kv_type.is_quantized() {
            f.push(format!("-ctk {0} -ctv {0}", self.kv_type.as_str()));
        }
        if self.flash_attn != FlashAttn::Auto {
            f.push(format!("-fa {}", self.flash_attn.as_str()));
        }
        if let Some(o) = self.override_value() {
            f.push(format!("-ot '{}'", o.replace('\'', "'\\''")));
        }
        if self.states_split() {
            f.push(format!("-sm {}", self.split_mode.as_str()));
            if !self.tensor_split.is_empty() {
                f.push(format!("-ts {}", split_list(&self.tensor_split)));
            }
            f.push(format!("-mg {}", self.main_gpu));
        }
        if let Some(m) = &self.mmproj {
            f.push(format!("--mmproj {}", shell_quote(&m.to_string_lossy())));
            if !self.mmproj_offload {
                f.push("--no-mmproj-offload".into());
            }
        }
        if let Some(d) = &self.draft {
            f.push(d.flags());
        }
        f.join(" ")
    }

    /// `-m MODEL` and the flags.
    #[must_use]
    pub fn command_line(&self, model: &str) -> String {
        format!("-m {} {}", shell_quote(model), self.flags())
    }

    /// llama-server's environment (names from llama.cpp's `common/arg.cpp`),
    /// in a fixed order; `--no-op-offload` has no variable.
    #[must_use]
    pub fn server_env(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("LLAMA_ARG_N_GPU_LAYERS", self.n_gpu_layers.to_string()),
            ("LLAMA_ARG_THREADS", self.n_threads.to_string()),
        ];
        if let Some(c) = self.n_ctx {
            v.push(("LLAMA_ARG_CTX_SIZE", c.to_string()));
        }
        if self.n_parallel > 1 {
            v.push(("LLAMA_ARG_N_PARALLEL", self.n_parallel.to_string()));
        }
        if self.kv_unified {
            v.push(("LLAMA_ARG_KV_UNIFIED", "1".to_string()));
        }
        if self.n_batch != DEFAULT_N_BATCH {
            v.push(("LLAMA_ARG_BATCH", self.n_batch.to_string()));
        }
        if self.n_ubatch != DEFAULT_N_UBATCH {
            v.push(("LLAMA_ARG_UBATCH", self.n_ubatch.to_string()));
        }
        if self.n_cpu_moe > 0 {
            v.push(("LLAMA_ARG_N_CPU_MOE", self.n_cpu_moe.to_string()));
        }
        if self.kv_type.is_quantized() {
            v.push(("LLAMA_ARG_CACHE_TYPE_K", self.kv_type.as_str().to_string()));
            v.push(("LLAMA_ARG_CACHE_TYPE_V", self.kv_type.as_str().to_string()));
        }
        if self.flash_attn != FlashAttn::Auto {
            v.push(("LLAMA_ARG_FLASH_ATTN", self.flash_attn.as_str().to_string()));
        }
        if let Some(o) = self.override_value() {
            v.push(("LLAMA_ARG_OVERRIDE_TENSOR", o));
        }
        if !self.rpc.is_empty() {
            v.push(("LLAMA_ARG_RPC", self.rpc.join(",")));
        }
        if let Some(d) = self.device_value() {
            v.push(("LLAMA_ARG_DEVICE", d));
        }
        if self.states_split() {
            v.push(("LLAMA_ARG_SPLIT_MODE", self.split_mode.as_str().to_string()));
            if !self.tensor_split.is_empty() {
                v.push(("LLAMA_ARG_TENSOR_SPLIT", split_list(&self.tensor_split)));
            }
            v.push(("LLAMA_ARG_MAIN_GPU", self.main_gpu.to_string()));
        }
        if let Some(m) = &self.mmproj {
            v.push(("LLAMA_ARG_MMPROJ", m.to_string_lossy().into_owned()));
            if !self.mmproj_offload {
                v.push(("LLAMA_ARG_MMPROJ_OFFLOAD", "false".into()));
            }
        }
        if let Some(d) = &self.draft {
            v.extend(d.server_env());
        }
        v
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_f16(k: &KvType) -> bool {
    *k == KvType::F16
}

#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_zero(n: &u32) -> bool {
    *n == 0
}

pub(crate) fn yes() -> bool {
    true
}

#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_true(b: &bool) -> bool {
    *b
}

#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}

pub(crate) fn one() -> u32 {
    1
}

#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_one(n: &u32) -> bool {
    *n == 1
}
