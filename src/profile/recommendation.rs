//! The answer, in the forms people paste: what llama.cpp runs, Ollama's
//! num_gpu (or why it is left unset), and the rendered lines.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The answer, in the forms people paste. `Default` is an empty answer
/// whose placement [`Recommendation::set_placement`] writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Recommendation {
    /// ngl for llama.cpp (full offload when `n_cpu_moe` > 0).
    pub n_gpu_layers: u32,
    /// Layers whose experts stay on the CPU (llama.cpp's --n-cpu-moe); 0 for none.
    #[serde(default)]
    pub n_cpu_moe: u32,
    /// A Modelfile cannot give expert or FFN overrides: the best whole-layer
    /// split, when it differs from `n_gpu_layers` (a set `num_gpu` also
    /// stops llama.cpp's fit, which spills experts itself when it is unset).
    #[serde(default)]
    pub ollama_num_gpu: Option<u32>,
    /// The recommendation is llama.cpp's default placement (as fast as the
    /// tuned one within the paired noise, or faster): Ollama's `num_gpu`
    /// is left unset, so Ollama places the layers as llama.cpp's fit does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub llama_default: bool,
    /// Ollama's own run (num_gpu unset: llama-server's fit at Ollama's
    /// settings) was as fast as the answer's whole layers, paired: the
    /// Modelfile leaves num_gpu unset.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ollama_own_run: bool,
    pub n_threads: u32,
    pub n_ctx: u32,
    /// The recommended setting was measured (not only predicted).
    pub measured: bool,
    /// Low when trials ran on a busy machine (profiles from before the field: high).
    #[serde(default)]
    pub confidence: Confidence,
    /// llama.cpp's op offload was on in the trials (off: `--no-op-offload`).
    #[serde(default = "crate::types::yes", skip_serializing_if = "crate::types::is_true")]
    pub op_offload: bool,
    pub tg_ts: Option<f64>,
    pub pp_ts: Option<f64>,
    pub mem_bytes: Option<f64>,
    /// Ollama Modelfile lines.
    pub modelfile: Vec<String>,
    /// llama.cpp flags.
    pub llama_cpp_args: String,
    /// KV cache type of both caches (quantized: with flash attention on).
    #[serde(default, skip_serializing_if = "crate::types::is_f16")]
    pub kv_type: KvType,
    /// Layers whose dense FFN weights stay on the CPU at full offload (`-ot`).
    #[serde(default, skip_serializing_if = "crate::types::is_zero")]
    pub n_cpu_ffn: u32,
    /// Ollama server settings the recommendation needs (`OLLAMA_KV_CACHE_TYPE`,
    /// `OLLAMA_FLASH_ATTENTION`): they apply to every model that server runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ollama_server_env: Vec<String>,
    /// llama.cpp RPC servers whose devices the placement uses (`--rpc`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpc: Vec<String>,
    /// The offload devices in the order they take layers (`--device`);
    /// empty: llama.cpp's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// `-sm` of a split: layer (llama.cpp's default), row or tensor.
    #[serde(default, skip_serializing_if = "crate::types::is_layer")]
    pub split_mode: crate::types::SplitMode,
    /// Layers per offload device, in the order of `devices` (`-sm layer
    /// -ts a,b,.. -mg 0`); empty: one device, or llama.cpp's default split.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_split: Vec<u32>,
    /// The batch sizes and flash attention every trial ran with (`-b`,
    /// `-ub`, `-fa`); profiles from before the fields: llama.cpp's defaults.
    #[serde(default = "default_n_batch")]
    pub n_batch: u32,
    #[serde(default = "default_n_ubatch")]
    pub n_ubatch: u32,
    #[serde(default)]
    pub flash_attn: crate::types::FlashAttn,
    /// Parallel slots (`-np`): `n_ctx` is the whole context, each slot gets
    /// `n_ctx / n_parallel` (Ollama's `num_ctx`; Ollama starts llama-server
    /// with `-c num_ctx x P -np P`).
    #[serde(default = "crate::types::one", skip_serializing_if = "crate::types::is_one")]
    pub n_parallel: u32,
    /// The multimodal projector loaded beside the model (`--mmproj`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<PathBuf>,
    /// Milliseconds to encode the fixed image at this setting (the `img` test), where measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub img_ms: Option<f64>,
    /// More tensors kept on the CPU (`-ot PATTERN=CPU`): llama.cpp's fit's,
    /// where its default placement is the answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_overrides: Vec<String>,
}

pub(super) fn default_n_batch() -> u32 {
    crate::types::DEFAULT_N_BATCH
}

pub(super) fn default_n_ubatch() -> u32 {
    crate::types::DEFAULT_N_UBATCH
}

impl Recommendation {
    /// What llama.cpp runs for this recommendation: every setting the
    /// trials ran with (flash attention on for a quantized cache).
    #[must_use]
    pub fn placement(&self) -> Placement {
        self.stored_placement().with_kv(self.kv_type)
    }

    /// The placement as the fields hold it (flash attention as asked):
    /// what [`Self::set_placement`] writes, so a stage that changes where
    /// the layers go starts from it.
    #[must_use]
    pub fn stored_placement(&self) -> Placement {
        Placement {
            n_cpu_moe: self.n_cpu_moe,
            n_cpu_ffn: self.n_cpu_ffn,
            n_batch: self.n_batch,
            n_ubatch: self.n_ubatch,
            flash_attn: self.flash_attn,
            n_parallel: self.n_parallel,
            kv_type: self.kv_type,
            cpu_overrides: self.cpu_overrides.clone(),
            ..Placement::default()
        }
        .with_layers(self.n_gpu_layers, self.n_threads, Some(self.n_ctx))
        .with_op_offload(self.op_offload)
        .with_split(&self.tensor_split, &self.rpc)
        .with_devices(&self.devices)
        .with_split_mode(self.split_mode)
        .with_mmproj(self.mmproj.as_deref())
    }

    /// This answer's placement with its layers moved: `ngl` layers on
    /// `threads`, the KV cache `kv`, the FFN weights of the first `n_cpu_ffn`
    /// layers on the CPU and no experts there; its context and workload kept.
    /// What a hatch or a split that replaces the answer starts from.
    #[must_use]
    pub fn moved_to(&self, ngl: u32, threads: u32, (kv_type, n_cpu_ffn): (KvType, u32)) -> Placement {
        Placement { n_cpu_moe: 0, n_cpu_ffn, kv_type, ..self.stored_placement() }.with_layers(
            ngl,
            threads,
            Some(self.n_ctx),
        )
    }

    /// The one place a recommendation's placement is written: every field
    /// of `p` a recommendation holds (the inverse of
    /// [`Self::stored_placement`]; `-mg` and `--no-mmproj-offload` are not
    /// held: an answer runs with main device 0 and the projector on the
    /// GPU), then the paste-ready forms rendered again from them.
    pub fn set_placement(&mut self, p: &Placement) {
        self.n_gpu_layers = p.n_gpu_layers;
        self.n_threads = p.n_threads;
        if let Some(c) = p.n_ctx {
            self.n_ctx = c;
        }
        (self.n_batch, self.n_ubatch, self.flash_attn, self.n_parallel) =
            (p.n_batch, p.n_ubatch, p.flash_attn, p.n_parallel);
        (self.kv_type, self.n_cpu_moe, self.n_cpu_ffn) = (p.kv_type, p.n_cpu_moe, p.n_cpu_ffn);
        self.cpu_overrides.clone_from(&p.cpu_overrides);
        self.op_offload = p.op_offload != crate::types::OpOffload::Off;
        self.rpc.clone_from(&p.rpc);
        self.devices.clone_from(&p.devices);
        self.tensor_split.clone_from(&p.tensor_split);
        self.split_mode = p.split_mode;
        self.mmproj.clone_from(&p.mmproj);
        self.render_forms();
    }

    /// The whole layers Ollama can run of this answer: `ollama_num_gpu`
    /// where it differs (experts, FFN weights or an RPC server's layers
    /// Ollama cannot place), else `n_gpu_layers`.
    #[must_use]
    pub fn ollama_layers(&self) -> u32 {
        self.ollama_num_gpu.unwrap_or(self.n_gpu_layers)
    }

    /// Ollama's `num_gpu`: `None` (left unset) where llama.cpp's default is
    /// recommended, else the layers Ollama can run.
    #[must_use]
    pub fn ollama_num_gpu_param(&self) -> Option<u32> {
        (!self.llama_default && !self.ollama_own_run).then(|| self.ollama_layers())
    }

    /// The Modelfile's comment where num_gpu is left unset, and why.
    #[must_use]
    pub fn unset_num_gpu_line(&self) -> Option<&'static str> {
        if self.llama_default {
            Some(UNSET_NUM_GPU)
        } else if self.ollama_own_run {
            Some(OLLAMA_OWN_RUN)
        } else {
            None
        }
    }

    /// Renders the paste-ready forms from the fields, and only from them:
    /// llama.cpp's flags, Ollama's server settings, and the Modelfile lines
    /// with [`Self::ollama_layers`] (no `num_gpu` where it is left unset).
    /// Every stage that changes an answer calls this after, so the stored
    /// forms never say other than the fields.
    pub fn render_forms(&mut self) {
        let placement = self.placement();
        self.llama_cpp_args = placement.flags();
        self.ollama_server_env = crate::consumer::ollama::server_settings(&placement);
        self.modelfile = crate::consumer::ollama::modelfile_lines(&self.ollama_placement());
        if let Some(line) = self.unset_num_gpu_line() {
            self.modelfile.retain(|l| !l.starts_with("PARAMETER num_gpu "));
            self.modelfile.insert(0, line.to_string());
        }
    }

    /// This recommendation's llama.cpp flags.
    #[must_use]
    pub fn flags(&self) -> String {
        self.placement().flags()
    }

    /// The whole-layer placement Ollama can express: [`Self::ollama_layers`],
    /// no tensor overrides, no RPC devices.
    #[must_use]
    pub fn ollama_placement(&self) -> Placement {
        Placement {
            n_batch: self.n_batch,
            n_ubatch: self.n_ubatch,
            n_parallel: self.n_parallel,
            ..Placement::default()
        }
        .with_layers(self.ollama_layers(), self.n_threads, Some(self.n_ctx))
    }
}

/// The Modelfile's word where llama.cpp's default is recommended.
pub const UNSET_NUM_GPU: &str =
    "# num_gpu left unset: Ollama places the layers itself, as llama.cpp's default does, as fast as any tuned placement here";

/// The Modelfile's word where Ollama's own run is as fast as the tuned layers.
pub const OLLAMA_OWN_RUN: &str =
    "# num_gpu left unset: Ollama's own run (llama-server's fit) was as fast as the tuned layers here, paired; a set num_gpu would also stop fit's expert spill";

/// The answer at one context against reading speed (the guides' test for
/// chat), and the hatch that would reach it: `tune::verdict::reading`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadingVerdict {
    /// The threshold (`--reading-speed`, t/s of generation).
    pub threshold_ts: f64,
    /// The answer's measured generation speed.
    pub tg_ts: f64,
    /// At or above the threshold.
    pub above: bool,
    /// Below it: the first measured hatch in the guides' order (q8_0 KV
    /// cache, shorter context, FFN spill, whole layers) that reaches it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reaches: Option<ReadingHatch>,
    /// Below it with none measured that reaches it: the hatches priced to
    /// fit but not measured (their speed unknown), in the same order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub untried: Vec<ReadingHatch>,
}

/// A batch job (`--job`) at one context's answer: its generated tokens
/// over the answer's measured rate (every stream's tokens, under
/// `--objective throughput`): `tune::verdict::job`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct JobVerdict {
    pub job: crate::types::Job,
    /// Sequences decoding together at that rate.
    pub streams: u32,
    /// The rate (t/s of generation, all streams).
    pub tg_ts: f64,
    /// Hours of generation (prompts not counted).
    pub hours: f64,
}

/// A hatch named by the reading-speed verdict: what it is, what it costs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadingHatch {
    pub kind: super::HatchKind,
    /// The option in words (`PlacementOption::describe`).
    pub describe: String,
    /// Its context (a shorter one costs the difference).
    pub n_ctx: u32,
    pub measured: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tg_ts: Option<f64>,
    /// Its KL divergence from the f16 cache (a quantized cache's cost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_mean: Option<f64>,
    pub llama_cpp_args: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{KvType, SplitMode};

    #[test]
    fn a_placement_written_into_a_recommendation_reads_back_the_same_and_renders_its_forms() {
        let p = Placement {
            n_cpu_ffn: 3,
            n_batch: 1024,
            n_ubatch: 256,
            n_parallel: 2,
            kv_type: KvType::Q8_0,
            cpu_overrides: vec![r"blk\.9\.ffn_up".into()],
            ..Placement::default()
        }
        .with_layers(20, 6, Some(8192))
        .with_op_offload(false)
        .with_split(&[12, 8], &["10.0.0.2:50052".into()])
        .with_devices(&["RPC0".into(), "Vulkan0".into()])
        .with_split_mode(SplitMode::Row)
        .with_mmproj(Some(std::path::Path::new("/m/proj.gguf")));
        let mut r = Recommendation::default();
        r.set_placement(&p);
        assert_eq!(r.stored_placement(), p);
        // What llama.cpp runs: a quantized cache turns flash attention on.
        assert_eq!(r.llama_cpp_args, p.clone().with_kv(KvType::Q8_0).flags());
        assert!(r.llama_cpp_args.contains("-fa on") && r.llama_cpp_args.contains("-ts 12,8"), "{}", r.llama_cpp_args);
        // Each of the two slots gets half the context, as Ollama counts num_ctx.
        assert!(r.modelfile.iter().any(|l| l == "PARAMETER num_ctx 4096"), "{:?}", r.modelfile);
    }
}
