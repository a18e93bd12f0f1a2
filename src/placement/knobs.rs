//! The knobs of a placement, each as llama.cpp names and parses it: op
//! offload, the KV cache type, flash attention, the split mode, fit's
//! fractions and spills, and the tensor-override patterns that keep the
//! FFN or the experts of some layers on the CPU.

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
/// llama-server's slots where `-np` is not given (its auto: tools/server
/// sets 4, over one unified cache).
pub const SERVER_SLOTS: u32 = 4;

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
