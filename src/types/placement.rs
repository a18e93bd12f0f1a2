//! Where a model's parts run, as llama.cpp takes it: layers, threads, context,
//! KV cache, flash attention, batch sizes, tensor overrides, devices and their split.

use serde::{Deserialize, Serialize};

/// llama.cpp's op offload (`--op-offload` / `--no-op-offload`) as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OpOffload {
    /// On, except where every offload device is a CPU-based Vulkan device
    #[default]
    Auto,
    On,
    Off,
}

impl OpOffload {
    /// Whether trials offload host operations, given whether every offload
    /// device runs on the CPU (moving work there cannot beat the CPU backend).
    #[must_use]
    pub fn resolve(self, only_software_devices: bool) -> bool {
        match self {
            OpOffload::On => true,
            OpOffload::Off => false,
            OpOffload::Auto => !only_software_devices,
        }
    }
}

/// A resolved choice (a trial's, an old profile's boolean) as the setting that asks for it.
impl From<bool> for OpOffload {
    fn from(on: bool) -> Self {
        if on {
            OpOffload::On
        } else {
            OpOffload::Off
        }
    }
}

/// The KV cache's element type (llama.cpp's `-ctk`/`-ctv`, Ollama's
/// `OLLAMA_KV_CACHE_TYPE`). Both caches get the same type.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, PartialOrd, Ord, clap::ValueEnum,
)]
pub enum KvType {
    #[default]
    #[serde(rename = "f16")]
    #[value(name = "f16")]
    F16,
    #[serde(rename = "q8_0")]
    #[value(name = "q8_0")]
    Q8_0,
    #[serde(rename = "q4_0")]
    #[value(name = "q4_0")]
    Q4_0,
    // The rest of llama.cpp's cache types (common/arg.cpp, `kv_cache_types`),
    // which Ollama passes verbatim (lowercased) from OLLAMA_KV_CACHE_TYPE.
    #[serde(rename = "bf16")]
    #[value(name = "bf16")]
    Bf16,
    #[serde(rename = "f32")]
    #[value(name = "f32")]
    F32,
    #[serde(rename = "q4_1")]
    #[value(name = "q4_1")]
    Q4_1,
    #[serde(rename = "q5_0")]
    #[value(name = "q5_0")]
    Q5_0,
    #[serde(rename = "q5_1")]
    #[value(name = "q5_1")]
    Q5_1,
    #[serde(rename = "iq4_nl")]
    #[value(name = "iq4_nl")]
    Iq4Nl,
}

impl KvType {
    /// The name llama.cpp and Ollama take.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
            KvType::Bf16 => "bf16",
            KvType::F32 => "f32",
            KvType::Q4_1 => "q4_1",
            KvType::Q5_0 => "q5_0",
            KvType::Q5_1 => "q5_1",
            KvType::Iq4Nl => "iq4_nl",
        }
    }

    /// Every type llama.cpp's `-ctk`/`-ctv` take.
    pub const ALL: [KvType; 9] = [
        KvType::F32,
        KvType::F16,
        KvType::Bf16,
        KvType::Q8_0,
        KvType::Q4_0,
        KvType::Q4_1,
        KvType::Iq4Nl,
        KvType::Q5_0,
        KvType::Q5_1,
    ];

    /// The type llama.cpp takes by this name (exactly, as its
    /// `kv_cache_type_from_str`).
    #[must_use]
    pub fn from_name(name: &str) -> Option<KvType> {
        KvType::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// ggml's type id (ggml.h's `enum ggml_type`).
    #[must_use]
    pub fn ggml_type(self) -> i32 {
        match self {
            KvType::F16 => 1,
            KvType::Q4_0 => 2,
            KvType::Q8_0 => 8,
            KvType::F32 => 0,
            KvType::Q4_1 => 3,
            KvType::Q5_0 => 6,
            KvType::Q5_1 => 7,
            KvType::Iq4Nl => 20,
            KvType::Bf16 => 30,
        }
    }

    /// A quantized V cache needs flash attention in llama.cpp.
    #[must_use]
    pub fn is_quantized(self) -> bool {
        !matches!(self, KvType::F16 | KvType::Bf16 | KvType::F32)
    }

    /// The flash attention a cache of this type runs with: on where it is
    /// quantized (llama.cpp quantizes the V cache only with flash
    /// attention), else `fa`.
    #[must_use]
    pub fn flash_attn(self, fa: FlashAttn) -> FlashAttn {
        if self.is_quantized() {
            FlashAttn::On
        } else {
            fa
        }
    }
}

/// Layers per device as llama.cpp's `-ts` takes them: "9,13".
#[must_use]
pub fn split_list(split: &[u32]) -> String {
    split.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// llama.cpp's flash attention setting (`-fa on|off|auto`); serialized as
/// llama-bench's numbers (-1 auto, 0 off, 1 on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(into = "i8", try_from = "i8")]
pub enum FlashAttn {
    #[default]
    Auto,
    Off,
    On,
}

impl FlashAttn {
    /// The word llama.cpp's `-fa` and `LLAMA_ARG_FLASH_ATTN` take.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            FlashAttn::Auto => "auto",
            FlashAttn::Off => "off",
            FlashAttn::On => "on",
        }
    }

    /// llama-bench's number (and llama.cpp's `llama_flash_attn_type`).
    #[must_use]
    pub fn value(self) -> i8 {
        self.into()
    }
}

impl From<FlashAttn> for i8 {
    fn from(f: FlashAttn) -> i8 {
        match f {
            FlashAttn::Auto => -1,
            FlashAttn::Off => 0,
            FlashAttn::On => 1,
        }
    }
}

impl TryFrom<i8> for FlashAttn {
    type Error = String;
    fn try_from(v: i8) -> Result<Self, String> {
        match v {
            -1 => Ok(FlashAttn::Auto),
            0 => Ok(FlashAttn::Off),
            1 => Ok(FlashAttn::On),
            other => Err(format!("flash_attn {other}: -1 (auto), 0 (off) or 1 (on)")),
        }
    }
}

/// How llama.cpp spreads a model over several devices (`-sm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    /// Everything on the main device (`-mg`).
    None,
    /// Whole layers per device, by `-ts` (llama.cpp's default).
    #[default]
    Layer,
    /// Rows of each matrix across devices (backends with a split buffer type: CUDA, SYCL).
    Row,
    /// Every weight and the KV cache across the devices, computed in
    /// parallel (llama.cpp's experimental meta device; needs flash attention).
    Tensor,
}

impl SplitMode {
    /// The word `-sm` and `LLAMA_ARG_SPLIT_MODE` take.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            SplitMode::None => "none",
            SplitMode::Layer => "layer",
            SplitMode::Tensor => "tensor",
            SplitMode::Row => "row",
        }
    }

    /// llama.cpp's `enum llama_split_mode`.
    #[must_use]
    pub fn llama_value(self) -> i32 {
        match self {
            SplitMode::None => 0,
            SplitMode::Layer => 1,
            SplitMode::Row => 2,
            SplitMode::Tensor => 3,
        }
    }
}

/// llama.cpp's default physical batch (`-b`).
pub const DEFAULT_N_BATCH: u32 = 2048;
/// llama.cpp's default micro-batch (`-ub`).
pub const DEFAULT_N_UBATCH: u32 = 512;

/// The pattern for one layer's experts (llama.cpp's `LLM_FFN_EXPS_REGEX`),
/// as `--n-cpu-moe` builds it.
#[must_use]
pub fn cpu_moe_pattern(layer: u32) -> String {
    format!("blk\\.{layer}\\.ffn_(up|down|gate|gate_up)_(ch|)exps")
}

/// What part of a layer llama.cpp's fit moves to the CPU where a device's
/// last layers only partly fit (`common/fit.cpp`: `common_layer_fraction_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FitFraction {
    /// Every FFN weight: only attention stays (`LAYER_FRACTION_ATTN`).
    Attn,
    /// FFN gate and down: up stays (`LAYER_FRACTION_UP`).
    Up,
    /// FFN down: up and gate stay (`LAYER_FRACTION_GATE`).
    Gate,
    /// The experts (`LAYER_FRACTION_MOE`).
    #[default]
    Moe,
}

impl FitFraction {
    const ALL: [FitFraction; 4] = [FitFraction::Attn, FitFraction::Up, FitFraction::Gate, FitFraction::Moe];

    /// The pattern fit writes for layer `il` (byte for byte, as `get_overflow_pattern`).
    #[must_use]
    pub fn pattern(self, il: u32) -> String {
        let tail = match self {
            FitFraction::Attn => "ffn_(gate|up|gate_up|down).*",
            FitFraction::Up => "ffn_(gate|gate_up|down).*",
            FitFraction::Gate => "ffn_down.*",
            FitFraction::Moe => "ffn_(up|down|gate_up|gate)_(ch|)exps",
        };
        format!("blk\\.{il}\\.{tail}")
    }
}

/// The tensors llama.cpp's fit keeps on the CPU on one device: layers
/// `first .. first + count` (the device's last offloaded layers), the first
/// of them by `fraction`, the others their experts. `count` 0: none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FitSpill {
    pub first: u16,
    pub count: u16,
    pub fraction: FitFraction,
}

impl FitSpill {
    /// The `-ot PATTERN=CPU` patterns, in fit's order.
    #[must_use]
    pub fn patterns(self) -> Vec<String> {
        let first = u32::from(self.first);
        (first..first + u32::from(self.count))
            .map(|il| if il == first { self.fraction } else { FitFraction::Moe }.pattern(il))
            .collect()
    }

    /// The spill that writes exactly these (pattern, buffer type) pairs,
    /// if one does: every buffer type the CPU's, the layers consecutive.
    #[must_use]
    pub fn of(overrides: &[(String, String)]) -> Option<FitSpill> {
        let Some((p0, _)) = overrides.first() else { return Some(FitSpill::default()) };
        if overrides.iter().any(|(_, b)| b != "CPU") {
            return None;
        }
        let il: u16 = p0.strip_prefix("blk\\.")?.split("\\.").next()?.parse().ok()?;
        let count = u16::try_from(overrides.len()).ok()?;
        FitFraction::ALL
            .into_iter()
            .map(|fraction| FitSpill { first: il, count, fraction })
            .find(|s| s.patterns().iter().zip(overrides).all(|(a, (b, _))| a == b))
    }
}

/// The regular expression that keeps the dense FFN weights of the first
/// `k` layers on the CPU: one pattern (llama.cpp searches each tensor
/// name with it), without the buffer type.
#[must_use]
pub fn cpu_ffn_regex(k: u32) -> String {
    let layers: Vec<String> = (0..k).map(|l| l.to_string()).collect();
    format!("blk\\.({})\\.ffn_(up|down|gate)\\.weight", layers.join("|"))
}

/// llama.cpp's `-ot` value that keeps the dense FFN weights of the first
/// `k` layers on the CPU.
#[must_use]
pub fn cpu_ffn_override(k: u32) -> String {
    format!("{}=CPU", cpu_ffn_regex(k))
}

/// The K of a pattern [`cpu_ffn_regex`] wrote, if `pattern` is one.
#[must_use]
pub fn cpu_ffn_layers(pattern: &str) -> Option<u32> {
    let inner = pattern.strip_prefix("blk\\.(")?.strip_suffix(")\\.ffn_(up|down|gate)\\.weight")?;
    let k = u32::try_from(inner.split('|').count()).ok()?;
    (k > 0 && cpu_ffn_regex(k) == pattern).then_some(k)
}

/// A word for a POSIX shell: as it is when plain, else single-quoted.
#[must_use]
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+:=@%,".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Where each part of a model runs and with which llama.cpp settings: what
/// a trial runs and what is emitted. It renders llama.cpp's own forms
/// (flags, llama-server's `LLAMA_ARG_*` environment), which
/// `llama_args::parse` and `llama_args::from_env` read back; a consumer's
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
    #[serde(default, skip_serializing_if = "super::is_f16")]
    pub kv_type: KvType,
    /// Layers (from the first) whose expert tensors stay on the CPU, as
    /// llama.cpp's `--n-cpu-moe`; 0 for dense models.
    #[serde(default)]
    pub n_cpu_moe: u32,
    /// Layers (from the first) whose dense FFN weights (`ffn_up`, `ffn_gate`,
    /// `ffn_down`) stay on the CPU while the layer, its attention and its
    /// KV cache are offloaded: llama.cpp's `-ot` with a CPU buffer type.
    #[serde(default, skip_serializing_if = "super::is_zero")]
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
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub main_gpu: u32,
    /// Parallel sequences (llama-server's slots, `-np`): `n_ctx` is the
    /// whole context, each slot gets `n_ctx / n_parallel` (as llama-server
    /// splits it, and as Ollama starts it: `-c num_ctx x P -np P`).
    #[serde(default = "super::one", skip_serializing_if = "super::is_one")]
    pub n_parallel: u32,
    /// A multimodal projector (llama-server's `--mmproj`), loaded beside
    /// the model on the first GPU, as llama-server loads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<std::path::PathBuf>,
    /// Whether the projector loads on the GPU (llama.cpp's default); false
    /// is `--no-mmproj-offload`, as Ollama starts it where the GPU has too
    /// little free memory for it.
    #[serde(default = "super::yes", skip_serializing_if = "super::is_true")]
    pub mmproj_offload: bool,
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
            mmproj: None,
            mmproj_offload: true,
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

    /// llama-server's own batch sizes, flash attention and one sequence
    /// (`-b 2048 -ub 512 -fa auto`): what it runs without flags.
    #[must_use]
    pub fn with_server_defaults(mut self) -> Self {
        (self.n_batch, self.n_ubatch, self.n_parallel) = (DEFAULT_N_BATCH, DEFAULT_N_UBATCH, 1);
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
        v
    }
}
