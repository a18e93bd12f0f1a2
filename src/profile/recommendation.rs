//! The answer, in the forms people paste: what llama.cpp runs, Ollama's
//! num_gpu (or why it is left unset), and the rendered lines.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The answer: the placement llama.cpp runs, what it measured, the
/// verdicts on it (llama.cpp's default or Ollama's own run as fast), and
/// the forms people paste, rendered from those by [`Self::render_forms`].
/// `Default` is an empty answer whose placement [`Self::set_placement`]
/// writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Recommendation {
    /// Where each part runs and with which settings, as the trials ran it
    /// (flash attention as asked: [`Self::runs`] turns it on for a
    /// quantized cache). Its fields are the recommendation's in the JSON.
    #[serde(flatten)]
    pub placement: Placement,
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
    /// settings) tied or beat the answer's whole layers, paired: the
    /// Modelfile leaves num_gpu unset.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ollama_own_run: bool,
    /// Ollama runs this model's family with one slot whatever
    /// `OLLAMA_NUM_PARALLEL` says (server/sched.go): the slots tuned here
    /// are not written as an Ollama server setting, and the Modelfile says
    /// why (the one slot Ollama runs needs less memory than the slots
    /// measured, so `num_gpu` still fits).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ollama_one_slot: bool,
    /// The model has MTP heads: where the answer does not draft with
    /// them, the Modelfile lines say `draft_num_predict 0`
    /// ([`Self::mark_mtp_heads`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mtp_heads: bool,
    /// The recommended setting was measured (not only predicted).
    pub measured: bool,
    /// Low when trials ran on a busy machine (profiles from before the field: high).
    #[serde(default)]
    pub confidence: Confidence,
    pub tg_ts: Option<f64>,
    pub pp_ts: Option<f64>,
    pub mem_bytes: Option<f64>,
    /// Milliseconds to encode the fixed image at this setting (the `img` test), where measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub img_ms: Option<f64>,
    /// Ollama Modelfile lines.
    pub modelfile: Vec<String>,
    /// llama.cpp flags.
    pub llama_cpp_args: String,
    /// Ollama server settings the recommendation needs (`OLLAMA_KV_CACHE_TYPE`,
    /// `OLLAMA_FLASH_ATTENTION`): they apply to every model that server runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ollama_server_env: Vec<String>,
}

impl Recommendation {
    /// What llama.cpp runs for this recommendation: every setting the
    /// trials ran with (flash attention on for a quantized cache).
    #[must_use]
    pub fn runs(&self) -> Placement {
        self.placement.clone().with_kv(self.placement.kv_type)
    }

    /// The context the answer runs at (the whole context of its slots).
    #[must_use]
    pub fn n_ctx(&self) -> u32 {
        self.placement.n_ctx.unwrap_or(0)
    }

    /// The one place a recommendation's placement is written: `p` (its
    /// context kept where `p` leaves it to llama.cpp; op offload as the
    /// trials resolved it; `-mg` and `--no-mmproj-offload` not held: an
    /// answer runs with main device 0 and the projector on the GPU), then
    /// the paste-ready forms rendered again from it.
    pub fn set_placement(&mut self, p: &Placement) {
        let op_on = p.op_offload != crate::placement::OpOffload::Off;
        self.placement =
            Placement { n_ctx: p.n_ctx.or(self.placement.n_ctx), main_gpu: 0, mmproj_offload: true, ..p.clone() }
                .with_op_offload(op_on);
        self.render_forms();
    }

    /// The whole layers Ollama can run of this answer: `ollama_num_gpu`
    /// where it differs (experts, FFN weights or an RPC server's layers
    /// Ollama cannot place), else `n_gpu_layers`.
    #[must_use]
    pub fn ollama_layers(&self) -> u32 {
        self.ollama_num_gpu.unwrap_or(self.placement.n_gpu_layers)
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
        let placement = self.runs();
        self.llama_cpp_args = placement.flags();
        self.ollama_server_env = crate::consumer::ollama::server_settings(&placement);
        self.modelfile = crate::consumer::ollama::modelfile_lines(&self.ollama_placement());
        if self.ollama_one_slot && placement.n_parallel > 1 {
            self.ollama_server_env.retain(|v| !v.starts_with("OLLAMA_NUM_PARALLEL="));
            self.modelfile.insert(
                0,
                format!(
                    "{ONE_SLOT_LINE} (the {} slots tuned here are llama-server's -np {})",
                    placement.n_parallel, placement.n_parallel
                ),
            );
        }
        if let Some(line) = self.unset_num_gpu_line() {
            self.modelfile.retain(|l| !l.starts_with("PARAMETER num_gpu "));
            self.modelfile.insert(0, line.to_string());
        } else if let Some(line) = self.server_cache_line() {
            self.modelfile.insert(0, line);
        }
        if self.mtp_heads && crate::consumer::ollama::draft_num_predict(&self.ollama_placement()).is_none() {
            self.modelfile.push(MTP_OFF.to_string());
            self.modelfile.push("PARAMETER draft_num_predict 0".to_string());
        }
    }

    /// For a model with MTP heads: the forms rendered again with
    /// `draft_num_predict 0` where the answer does not draft with them.
    pub fn mark_mtp_heads(&mut self) {
        self.mtp_heads = true;
        self.render_forms();
    }

    /// Where the answer's layers need a quantized KV cache that only the
    /// Ollama server's environment sets (`OLLAMA_KV_CACHE_TYPE`, which a
    /// Modelfile cannot carry): its `num_gpu` is the whole-layer split that
    /// fits with the server's own cache, and this comment says what the
    /// server setting would allow.
    #[must_use]
    pub fn server_cache_line(&self) -> Option<String> {
        let p = &self.placement;
        let n = self.ollama_num_gpu.filter(|n| *n != p.n_gpu_layers)?;
        (p.kv_type.is_quantized() && p.n_cpu_ffn == 0 && p.n_cpu_moe == 0 && p.cpu_overrides.is_empty()).then(|| {
            format!(
                "# num_gpu {n} fits with the KV cache the Ollama server runs; with OLLAMA_KV_CACHE_TYPE={} on the server (a setting of every model it runs), num_gpu {} was measured to fit",
                p.kv_type.as_str(),
                p.n_gpu_layers
            )
        })
    }

    /// This recommendation's llama.cpp flags.
    #[must_use]
    pub fn flags(&self) -> String {
        self.runs().flags()
    }

    /// The whole-layer placement Ollama can express: [`Self::ollama_layers`],
    /// no tensor overrides, no RPC devices, and the model's own MTP heads
    /// where the answer drafts with them and Ollama runs exactly its layers
    /// (a `num_gpu` of other layers, or none, was never priced with them;
    /// a draft model Ollama cannot run).
    #[must_use]
    pub fn ollama_placement(&self) -> Placement {
        let p = &self.placement;
        let whole = p.n_cpu_moe == 0 && p.n_cpu_ffn == 0 && p.cpu_overrides.is_empty() && p.rpc.is_empty();
        let same = whole && self.ollama_num_gpu_param() == Some(p.n_gpu_layers);
        let draft = p.draft.clone().filter(|d| d.is_mtp() && same);
        Placement { n_batch: p.n_batch, n_ubatch: p.n_ubatch, n_parallel: p.n_parallel, draft, ..Placement::default() }
            .with_layers(self.ollama_layers(), p.n_threads, p.n_ctx)
    }
}

/// The Modelfile's word where llama.cpp's default is recommended.
pub const UNSET_NUM_GPU: &str =
    "# num_gpu left unset: Ollama places the layers itself, as llama.cpp's default does, as fast as any tuned placement here";

/// Why a model with MTP heads gets `draft_num_predict 0`.
pub const MTP_OFF: &str = "# the model has MTP heads; Ollama's placement here was not priced with them, so draft_num_predict 0 keeps Ollama from loading them (the tune's report says whether they pay)";

/// The Modelfile's comment for a family Ollama runs with one slot.
pub const ONE_SLOT_LINE: &str =
    "# Ollama runs this model's family with one slot whatever OLLAMA_NUM_PARALLEL says (server/sched.go)";

/// The Modelfile's word where Ollama's own run tied or beat the tuned
/// layers (the report gives the paired ratio and which way it went).
pub const OLLAMA_OWN_RUN: &str =
    "# num_gpu left unset: Ollama's own run (llama-server's fit) was no slower than the tuned layers here, paired; a set num_gpu would also stop fit's expert spill";

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
    use crate::placement::{KvType, SplitMode};

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
        assert_eq!(r.placement, p);
        // What llama.cpp runs: a quantized cache turns flash attention on.
        assert_eq!(r.llama_cpp_args, p.clone().with_kv(KvType::Q8_0).flags());
        assert!(r.llama_cpp_args.contains("-fa on") && r.llama_cpp_args.contains("-ts 12,8"), "{}", r.llama_cpp_args);
        // Each of the two slots gets half the context, as Ollama counts num_ctx.
        assert!(r.modelfile.iter().any(|l| l == "PARAMETER num_ctx 4096"), "{:?}", r.modelfile);
    }

    /// Issue 54 item 10: a family Ollama runs with one slot (qwen3next,
    /// lfm2, ...) gets no OLLAMA_NUM_PARALLEL, which its server would
    /// ignore; the Modelfile says why, and llama.cpp's flags keep -np.
    #[test]
    fn a_one_slot_family_gets_no_ollama_num_parallel() {
        assert!(crate::consumer::ollama::one_slot("lfm2") && !crate::consumer::ollama::one_slot("llama"));
        let p = Placement { n_parallel: 4, ..Placement::default() }.with_layers(20, 6, Some(8192));
        let mut r = Recommendation::default();
        r.set_placement(&p);
        assert!(r.ollama_server_env.contains(&"OLLAMA_NUM_PARALLEL=4".to_string()), "{:?}", r.ollama_server_env);
        r.ollama_one_slot = true;
        r.render_forms();
        assert!(!r.ollama_server_env.iter().any(|v| v.starts_with("OLLAMA_NUM_PARALLEL")), "{:?}", r.ollama_server_env);
        assert!(r.modelfile[0].starts_with(ONE_SLOT_LINE) && r.modelfile[0].contains("-np 4"), "{:?}", r.modelfile);
        assert!(r.llama_cpp_args.contains("-np 4"), "{}", r.llama_cpp_args);
        // A Modelfile comment is a comment to Ollama's parser: the parameters read back the same.
        let text = r.modelfile.join("\n");
        assert!(text.lines().filter(|l| !l.starts_with('#')).all(|l| l.starts_with("PARAMETER ")), "{text}");
    }

    /// An answer drafting with the model's MTP heads tells Ollama to load
    /// them only where Ollama runs exactly its layers: a whole-layer split
    /// Ollama runs instead (of an expert spill), or num_gpu left unset, was
    /// never priced with them.
    #[test]
    fn mtp_heads_reach_the_modelfile_only_with_the_layers_they_were_priced_with() {
        let p = Placement { draft: Some(crate::placement::Draft::mtp(3)), ..Placement::default() }.with_layers(
            20,
            6,
            Some(8192),
        );
        let mut r = Recommendation::default();
        r.set_placement(&p);
        assert!(r.modelfile.contains(&"PARAMETER draft_num_predict 3".to_string()), "{:?}", r.modelfile);
        assert!(r.llama_cpp_args.contains("--spec-type draft-mtp"), "{}", r.llama_cpp_args);
        r.set_placement(&Placement { n_cpu_moe: 4, ..p.clone() });
        r.ollama_num_gpu = Some(16);
        r.render_forms();
        assert!(r.modelfile.contains(&"PARAMETER num_gpu 16".to_string()), "{:?}", r.modelfile);
        assert!(!r.modelfile.iter().any(|l| l.contains("draft_num_predict")), "{:?}", r.modelfile);
        r.set_placement(&p);
        r.ollama_num_gpu = None;
        r.llama_default = true;
        r.render_forms();
        assert!(!r.modelfile.iter().any(|l| l.contains("draft_num_predict")), "{:?}", r.modelfile);
    }

    /// A recommendation of schema 3 and before held its placement fields
    /// beside the verdicts, op offload as a boolean; it reads as the same
    /// placement, and writes back in the trials' spec's words.
    #[test]
    fn a_schema_3_recommendation_reads_as_its_placement() {
        let old = serde_json::json!({
            "n_gpu_layers": 12, "n_cpu_moe": 0, "ollama_num_gpu": null, "n_threads": 4, "n_ctx": 8192,
            "measured": true, "op_offload": false, "tg_ts": 9.5, "pp_ts": null, "mem_bytes": null,
            "modelfile": ["PARAMETER num_gpu 12"], "llama_cpp_args": "-ngl 12 -t 4 -c 8192 --no-op-offload",
            "kv_type": "q8_0", "tensor_split": [8, 4], "rpc": ["10.0.0.2:50052"]
        });
        let r: Recommendation = serde_json::from_value(old).unwrap();
        let p = &r.placement;
        assert_eq!((p.n_gpu_layers, p.n_threads, r.n_ctx(), p.kv_type), (12, 4, 8192, KvType::Q8_0));
        assert_eq!(
            (p.op_offload, p.n_batch, p.n_ubatch),
            (crate::placement::OpOffload::Off, 2048, 512),
            "older defaults"
        );
        assert_eq!((p.tensor_split.as_slice(), p.rpc.len()), ([8, 4].as_slice(), 1));
        assert!(r.runs().flags().contains("--no-op-offload"), "{}", r.runs().flags());
        let out = serde_json::to_value(&r).unwrap();
        assert_eq!((&out["op_offload"], &out["n_gpu_layers"], out.get("placement")), (&"off".into(), &12.into(), None));
        assert_eq!(serde_json::from_value::<Recommendation>(out).unwrap(), r, "read back as written");
        let on: Recommendation =
            serde_json::from_value(serde_json::json!({"n_gpu_layers": 1, "n_threads": 1, "n_ctx": 512, "measured": false,
                "op_offload": true, "tg_ts": null, "pp_ts": null, "mem_bytes": null, "modelfile": [], "llama_cpp_args": ""}))
            .unwrap();
        assert_eq!(on.placement.op_offload, crate::placement::OpOffload::On);
        assert!(serde_json::to_value(&on).unwrap().get("op_offload").is_none(), "on: not written");
    }
}
