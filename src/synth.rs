//! Tiny synthetic GGUF models with real shapes and random weights, so tests
//! and benchmarks can load and run llama.cpp in milliseconds.

use std::io::BufWriter;
use std::path::Path;

use rand::{Rng, SeedableRng};

use crate::gguf::{Value, Writer};

/// Shape of a synthetic llama-architecture model.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    pub n_layer: u32,
    pub n_embd: u64,
    pub n_ff: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub ctx_train: u32,
    /// Experts per layer; 0 writes a dense llama model, >1 a qwen3moe model.
    pub n_expert: u32,
    pub n_expert_used: u32,
    pub seed: u64,
    /// Weight matrices in Q8_0 (what GPUs run fast) instead of F32.
    pub q8_0: bool,
    /// Vocabulary size: the byte tokens, then plain tokens to this many.
    pub n_vocab: u64,
    /// Tied embeddings: no `output.weight` (the output reuses `token_embd`).
    pub tied: bool,
    /// A recurrent model (llama.cpp's `mamba`: selective state-space layers,
    /// no attention, no KV cache) instead of a transformer.
    pub mamba: bool,
    /// Multi-token-prediction (NextN) blocks after the `n_layer` trunk
    /// blocks: a `glm4moe` model (GLM-4.5's MTP layout: the last blocks
    /// of `block_count`, each a whole MoE block plus `nextn.*`), which
    /// llama.cpp loads only for `--spec-type draft-mtp`.
    pub n_nextn: u32,
}

impl Default for SynthSpec {
    fn default() -> Self {
        SynthSpec {
            n_layer: 4,
            n_embd: 128,
            n_ff: 256,
            n_head: 2,
            n_head_kv: 2,
            ctx_train: 4096,
            n_expert: 0,
            n_expert_used: 0,
            seed: 42,
            q8_0: false,
            n_vocab: N_VOCAB,
            tied: false,
            mamba: false,
            n_nextn: 0,
        }
    }
}

impl SynthSpec {
    #[must_use]
    pub fn with_n_layer(mut self, n: u32) -> Self {
        self.n_layer = n;
        self
    }

    #[must_use]
    pub fn with_dims(mut self, n_embd: u64, n_ff: u64, n_head: u64) -> Self {
        self.n_embd = n_embd;
        self.n_ff = n_ff;
        self.n_head = n_head;
        self.n_head_kv = n_head;
        self
    }

    /// Grouped-query attention: `n` key/value heads.
    #[must_use]
    pub fn with_kv_heads(mut self, n: u64) -> Self {
        self.n_head_kv = n.max(1);
        self
    }

    /// Weight matrices in Q8_0.
    #[must_use]
    pub fn with_q8_0(mut self, q: bool) -> Self {
        self.q8_0 = q;
        self
    }

    #[must_use]
    pub fn with_ctx_train(mut self, n: u32) -> Self {
        self.ctx_train = n;
        self
    }

    /// A vocabulary of `n` tokens (at least the 259 byte-level ones) and,
    /// with `tied`, the output reusing the embeddings.
    #[must_use]
    pub fn with_vocab(mut self, n: u64, tied: bool) -> Self {
        self.n_vocab = n.max(N_VOCAB);
        self.tied = tied;
        self
    }

    #[must_use]
    pub fn with_mamba(mut self, mamba: bool) -> Self {
        self.mamba = mamba;
        self
    }

    /// `n` MTP blocks after the trunk (a `glm4moe` model with experts; see [`SynthSpec::n_nextn`]).
    #[must_use]
    pub fn with_nextn(mut self, n: u32) -> Self {
        self.n_nextn = n;
        self
    }

    /// The MTP blocks written: a MoE transformer (glm4moe) carries them, nothing else.
    fn nextn(&self) -> u32 {
        if self.n_expert > 1 && !self.mamba {
            self.n_nextn
        } else {
            0
        }
    }

    #[must_use]
    pub fn with_experts(mut self, n_expert: u32, n_used: u32) -> Self {
        self.n_expert = n_expert;
        self.n_expert_used = n_used;
        self
    }
}

/// Vocabulary: <unk>, <s>, </s> and the 256 byte tokens of a SentencePiece model.
pub const N_VOCAB: u64 = 3 + 256;

fn vocab(w: &mut Writer, n_vocab: u64) {
    let mut tokens = vec![Value::Str("<unk>".into()), Value::Str("<s>".into()), Value::Str("</s>".into())];
    let mut types = vec![Value::I32(2), Value::I32(3), Value::I32(3)];
    for b in 0..=255u8 {
        tokens.push(Value::Str(format!("<0x{b:02X}>")));
        types.push(Value::I32(6));
    }
    for i in N_VOCAB..n_vocab {
        tokens.push(Value::Str(format!("\u{2581}w{i}")));
        types.push(Value::I32(1));
    }
    let scores = (0..n_vocab).map(|_| Value::F32(0.0)).collect::<Vec<_>>();
    w.kv("tokenizer.ggml.model", Value::Str("llama".into()));
    w.kv("tokenizer.ggml.tokens", Value::Array { elem_type: 8, len: n_vocab, items: tokens });
    w.kv("tokenizer.ggml.scores", Value::Array { elem_type: 6, len: n_vocab, items: scores });
    w.kv("tokenizer.ggml.token_type", Value::Array { elem_type: 5, len: n_vocab, items: types });
    w.kv("tokenizer.ggml.unknown_token_id", Value::U32(0));
    w.kv("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.kv("tokenizer.ggml.eos_token_id", Value::U32(2));
}

fn f32_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(f32::to_le_bytes).collect()
}

/// An F32 tensor of random weights in [-0.05, 0.05).
fn random_f32(w: &mut Writer, name: &str, dims: &[u64], rng: &mut impl Rng) {
    let n: u64 = dims.iter().product();
    w.tensor(name, dims, 0, f32_bytes((0..n).map(|_| rng.random_range(-0.05f32..0.05))));
}

/// An F32 vector of `n` values `v` (norm weights, biases).
fn filled(w: &mut Writer, name: &str, n: u64, v: f32) {
    w.tensor(name, &[n], 0, f32_bytes((0..n).map(|_| v)));
}

/// ggml's Q8_0: blocks of 32 weights, an f16 scale and 32 signed bytes.
const Q8_0: u32 = 8;

/// Random Q8_0 data for `n` weights (`n` a multiple of 32): scale about
/// 0.0008 (f16 0x128E), bytes in [-64, 63]; speed does not depend on them.
fn q8_0_bytes(n: u64, rng: &mut impl Rng) -> Vec<u8> {
    let blocks = usize::try_from(n / 32).unwrap_or(0);
    let mut out = Vec::with_capacity(blocks * 34);
    for _ in 0..blocks {
        out.extend_from_slice(&0x128Eu16.to_le_bytes());
        for _ in 0..4 {
            out.extend(rng.random::<u64>().to_le_bytes().map(|b| b & 0x7f).map(|b| b.wrapping_sub(64)));
        }
    }
    out
}

/// One mamba layer's tensors, as llama.cpp's
/// `llama_model_mamba::load_arch_tensors` reads them (expansion factor 2).
fn mamba_layer(w: &mut Writer, rand_tensor: &mut impl FnMut(&mut Writer, &str, &[u64]), p: &str, e: u64) {
    let (d_conv, d_state, dt_rank) = mamba_dims(e);
    let d_inner = 2 * e;
    filled(w, &format!("{p}.attn_norm.weight"), e, 1.0);
    rand_tensor(w, &format!("{p}.ssm_in.weight"), &[e, 2 * d_inner]);
    rand_tensor(w, &format!("{p}.ssm_conv1d.weight"), &[d_conv, d_inner]);
    filled(w, &format!("{p}.ssm_conv1d.bias"), d_inner, 0.0);
    rand_tensor(w, &format!("{p}.ssm_x.weight"), &[d_inner, dt_rank + 2 * d_state]);
    rand_tensor(w, &format!("{p}.ssm_dt.weight"), &[dt_rank, d_inner]);
    filled(w, &format!("{p}.ssm_dt.bias"), d_inner, 0.0);
    let a: Vec<f32> = vec![-1.0; usize::try_from(d_state * d_inner).unwrap_or(0)];
    w.tensor(&format!("{p}.ssm_a"), &[d_state, d_inner], 0, f32_bytes(a.into_iter()));
    filled(w, &format!("{p}.ssm_d"), d_inner, 1.0);
    rand_tensor(w, &format!("{p}.ssm_out.weight"), &[d_inner, e]);
}

/// Mamba's convolution width, state size and time-step rank for `n_embd`
/// (the reference model's 4, 16 and ceil(n_embd / 16)).
fn mamba_dims(n_embd: u64) -> (u64, u64, u64) {
    (4, 16, n_embd.div_ceil(16))
}

/// The model's keys: its shape as llama.cpp's loader for `arch` reads it.
#[allow(clippy::cast_possible_truncation)]
fn hparams(w: &mut Writer, spec: &SynthSpec, arch: &str) {
    let moe = spec.n_expert > 1 && !spec.mamba;
    let (e, ff, h, hkv) = (spec.n_embd, spec.n_ff, spec.n_head, spec.n_head_kv);
    let head_dim = e / h;
    w.kv("general.architecture", Value::Str(arch.into()));
    w.kv("general.name", Value::Str(format!("synthetic-{arch}-{}L", spec.n_layer)));
    // ggml's file types: 0 all F32, 7 mostly Q8_0.
    w.kv("general.file_type", Value::U32(if spec.q8_0 { 7 } else { 0 }));
    w.kv(&format!("{arch}.context_length"), Value::U32(spec.ctx_train));
    w.kv(&format!("{arch}.embedding_length"), Value::U32(e as u32));
    let nextn = spec.nextn();
    w.kv(&format!("{arch}.block_count"), Value::U32(spec.n_layer + nextn));
    // Mamba has neither an FFN nor attention heads (its converter writes 0s).
    let (ff_kv, h_kv, hkv_kv) = if spec.mamba { (0, 0, 0) } else { (ff, h, hkv) };
    w.kv(&format!("{arch}.feed_forward_length"), Value::U32(ff_kv as u32));
    w.kv(&format!("{arch}.attention.head_count"), Value::U32(h_kv as u32));
    w.kv(&format!("{arch}.attention.head_count_kv"), Value::U32(hkv_kv as u32));
    if spec.mamba {
        let (d_conv, d_state, dt_rank) = mamba_dims(e);
        w.kv(&format!("{arch}.ssm.conv_kernel"), Value::U32(d_conv as u32));
        w.kv(&format!("{arch}.ssm.inner_size"), Value::U32(2 * e as u32));
        w.kv(&format!("{arch}.ssm.state_size"), Value::U32(d_state as u32));
        w.kv(&format!("{arch}.ssm.time_step_rank"), Value::U32(dt_rank as u32));
    }
    w.kv(&format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F32(1e-5));
    w.kv(&format!("{arch}.rope.freq_base"), Value::F32(10000.0));
    if moe {
        w.kv(&format!("{arch}.expert_count"), Value::U32(spec.n_expert));
        w.kv(&format!("{arch}.expert_used_count"), Value::U32(spec.n_expert_used.max(1)));
        w.kv(&format!("{arch}.expert_feed_forward_length"), Value::U32(ff as u32));
        w.kv(&format!("{arch}.attention.key_length"), Value::U32(head_dim as u32));
        w.kv(&format!("{arch}.attention.value_length"), Value::U32(head_dim as u32));
    }
    if nextn > 0 {
        // glm4moe: one shared expert (its MTP graph runs it), no dense lead.
        w.kv(&format!("{arch}.expert_shared_count"), Value::U32(1));
        w.kv(&format!("{arch}.leading_dense_block_count"), Value::U32(0));
        w.kv(&format!("{arch}.nextn_predict_layers"), Value::U32(nextn));
    }
}

/// Writes a model described by `spec` to `path` (F32 weights).
///
/// # Errors
/// I/O errors.
#[allow(clippy::cast_possible_truncation)]
pub fn write_model(path: &Path, spec: &SynthSpec) -> std::io::Result<()> {
    let moe = spec.n_expert > 1 && !spec.mamba;
    let arch = if spec.mamba {
        "mamba"
    } else if spec.nextn() > 0 {
        "glm4moe"
    } else if moe {
        "qwen3moe"
    } else {
        "llama"
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let mut w = Writer::new();
    let (e, ff, h, hkv) = (spec.n_embd, spec.n_ff, spec.n_head, spec.n_head_kv);
    let head_dim = e / h;
    hparams(&mut w, spec, arch);
    vocab(&mut w, spec.n_vocab);

    let q8_0 = spec.q8_0;
    let mut rand_tensor = |w: &mut Writer, name: &str, dims: &[u64]| {
        if q8_0 && dims[0].is_multiple_of(32) {
            let data = q8_0_bytes(dims.iter().product(), &mut rng);
            w.tensor(name, dims, Q8_0, data);
        } else {
            random_f32(w, name, dims, &mut rng);
        }
    };
    let ones = |w: &mut Writer, name: &str, n: u64| filled(w, name, n, 1.0);

    rand_tensor(&mut w, "token_embd.weight", &[e, spec.n_vocab]);
    ones(&mut w, "output_norm.weight", e);
    if !spec.tied {
        rand_tensor(&mut w, "output.weight", &[e, spec.n_vocab]);
    }
    let kv_dim = head_dim * hkv;
    let glm = spec.nextn() > 0;
    for i in 0..spec.n_layer + spec.nextn() {
        let p = format!("blk.{i}");
        if spec.mamba {
            mamba_layer(&mut w, &mut rand_tensor, &p, e);
            continue;
        }
        ones(&mut w, &format!("{p}.attn_norm.weight"), e);
        rand_tensor(&mut w, &format!("{p}.attn_q.weight"), &[e, head_dim * h]);
        rand_tensor(&mut w, &format!("{p}.attn_k.weight"), &[e, kv_dim]);
        rand_tensor(&mut w, &format!("{p}.attn_v.weight"), &[e, kv_dim]);
        rand_tensor(&mut w, &format!("{p}.attn_output.weight"), &[head_dim * h, e]);
        // glm4moe names its pre-FFN norm post_attention_norm (LLM_TENSOR_ATTN_POST_NORM).
        ones(&mut w, &format!("{p}.{}.weight", if glm { "post_attention_norm" } else { "ffn_norm" }), e);
        if glm {
            filled(&mut w, &format!("{p}.exp_probs_b.bias"), u64::from(spec.n_expert), 0.0);
            rand_tensor(&mut w, &format!("{p}.ffn_gate_shexp.weight"), &[e, ff]);
            rand_tensor(&mut w, &format!("{p}.ffn_up_shexp.weight"), &[e, ff]);
            rand_tensor(&mut w, &format!("{p}.ffn_down_shexp.weight"), &[ff, e]);
        }
        if glm && i >= spec.n_layer {
            rand_tensor(&mut w, &format!("{p}.nextn.eh_proj.weight"), &[2 * e, e]);
            ones(&mut w, &format!("{p}.nextn.enorm.weight"), e);
            ones(&mut w, &format!("{p}.nextn.hnorm.weight"), e);
        }
        if moe {
            ones(&mut w, &format!("{p}.attn_q_norm.weight"), head_dim);
            ones(&mut w, &format!("{p}.attn_k_norm.weight"), head_dim);
            let x = u64::from(spec.n_expert);
            rand_tensor(&mut w, &format!("{p}.ffn_gate_inp.weight"), &[e, x]);
            rand_tensor(&mut w, &format!("{p}.ffn_gate_exps.weight"), &[e, ff, x]);
            rand_tensor(&mut w, &format!("{p}.ffn_up_exps.weight"), &[e, ff, x]);
            rand_tensor(&mut w, &format!("{p}.ffn_down_exps.weight"), &[ff, e, x]);
        } else {
            rand_tensor(&mut w, &format!("{p}.ffn_gate.weight"), &[e, ff]);
            rand_tensor(&mut w, &format!("{p}.ffn_up.weight"), &[e, ff]);
            rand_tensor(&mut w, &format!("{p}.ffn_down.weight"), &[ff, e]);
        }
    }
    let mut f = BufWriter::new(std::fs::File::create(path)?);
    w.write_to(&mut f)?;
    use std::io::Write;
    f.flush()
}

/// Shape of a synthetic vision projector (`--mmproj`): a SigLIP tower
/// with Gemma 3's projector (`clip.projector_type` gemma3), the kind
/// Gemma-3 vision models ship, with random weights.
#[derive(Debug, Clone)]
pub struct ProjectorSpec {
    /// The text model's embedding size (the projection's output).
    pub n_embd_text: u64,
    pub n_embd: u64,
    pub n_ff: u64,
    pub n_head: u64,
    pub n_layer: u32,
    /// Square images of this side, in patches of `patch_size` pixels.
    pub image_size: u32,
    pub patch_size: u32,
    /// Gemma 3's pooling: `(image_size / patch_size / n_merge)^2` tokens per image.
    pub n_merge: u32,
    pub seed: u64,
}

impl ProjectorSpec {
    /// A small projector for a text model of `n_embd_text`: 224-pixel
    /// images, 256 patches pooled to 16 tokens.
    #[must_use]
    pub fn for_text(n_embd_text: u64) -> Self {
        ProjectorSpec {
            n_embd_text,
            n_embd: 256,
            n_ff: 1024,
            n_head: 4,
            n_layer: 6,
            image_size: 224,
            patch_size: 14,
            n_merge: 4,
            seed: 7,
        }
    }

    #[must_use]
    pub fn with_tower(mut self, n_embd: u64, n_ff: u64, n_layer: u32) -> Self {
        self.n_embd = n_embd;
        self.n_ff = n_ff;
        self.n_layer = n_layer;
        self
    }

    /// Image tokens per image.
    #[must_use]
    pub fn n_image_tokens(&self) -> u32 {
        let side = self.image_size / self.patch_size / self.n_merge.max(1);
        side * side
    }
}

/// Writes a projector described by `spec` to `path` (F32 weights), as
/// llama.cpp's converter writes Gemma 3's: the keys and tensor names
/// `tools/mtmd/clip.cpp` reads.
///
/// # Errors
/// I/O errors.
#[allow(clippy::cast_possible_truncation)]
pub fn write_projector(path: &Path, spec: &ProjectorSpec) -> std::io::Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let mut w = Writer::new();
    let (e, ff) = (spec.n_embd, spec.n_ff);
    let n_patches = u64::from((spec.image_size / spec.patch_size).pow(2));
    let p = u64::from(spec.patch_size);
    let three = |v: f32| Value::Array { elem_type: 6, len: 3, items: vec![Value::F32(v); 3] };
    w.kv("general.architecture", Value::Str("clip".into()));
    w.kv("general.name", Value::Str(format!("synthetic-gemma3-projector-{}L", spec.n_layer)));
    w.kv("general.file_type", Value::U32(0));
    w.kv("clip.has_vision_encoder", Value::Bool(true));
    w.kv("clip.projector_type", Value::Str("gemma3".into()));
    w.kv("clip.use_gelu", Value::Bool(true));
    w.kv("clip.vision.image_size", Value::U32(spec.image_size));
    w.kv("clip.vision.patch_size", Value::U32(spec.patch_size));
    w.kv("clip.vision.embedding_length", Value::U32(e as u32));
    w.kv("clip.vision.feed_forward_length", Value::U32(ff as u32));
    w.kv("clip.vision.block_count", Value::U32(spec.n_layer));
    w.kv("clip.vision.projection_dim", Value::U32(spec.n_embd_text as u32));
    w.kv("clip.vision.attention.head_count", Value::U32(spec.n_head as u32));
    w.kv("clip.vision.attention.layer_norm_epsilon", Value::F32(1e-6));
    w.kv("clip.vision.image_mean", three(0.5));
    w.kv("clip.vision.image_std", three(0.5));
    w.kv("clip.vision.projector.scale_factor", Value::U32(spec.n_merge));
    let mut rand_tensor = |w: &mut Writer, name: &str, dims: &[u64]| random_f32(w, name, dims, &mut rng);
    let fill = filled;
    rand_tensor(&mut w, "v.patch_embd.weight", &[p, p, 3, e]);
    fill(&mut w, "v.patch_embd.bias", e, 0.0);
    rand_tensor(&mut w, "v.position_embd.weight", &[e, n_patches]);
    for i in 0..spec.n_layer {
        let b = format!("v.blk.{i}");
        for norm in ["ln1", "ln2"] {
            fill(&mut w, &format!("{b}.{norm}.weight"), e, 1.0);
            fill(&mut w, &format!("{b}.{norm}.bias"), e, 0.0);
        }
        for m in ["attn_q", "attn_k", "attn_v", "attn_out"] {
            rand_tensor(&mut w, &format!("{b}.{m}.weight"), &[e, e]);
            fill(&mut w, &format!("{b}.{m}.bias"), e, 0.0);
        }
        rand_tensor(&mut w, &format!("{b}.ffn_up.weight"), &[e, ff]);
        fill(&mut w, &format!("{b}.ffn_up.bias"), ff, 0.0);
        rand_tensor(&mut w, &format!("{b}.ffn_down.weight"), &[ff, e]);
        fill(&mut w, &format!("{b}.ffn_down.bias"), e, 0.0);
    }
    fill(&mut w, "v.post_ln.weight", e, 1.0);
    fill(&mut w, "v.post_ln.bias", e, 0.0);
    fill(&mut w, "mm.soft_emb_norm.weight", e, 1.0);
    rand_tensor(&mut w, "mm.input_projection.weight", &[spec.n_embd_text, e]);
    let mut f = BufWriter::new(std::fs::File::create(path)?);
    w.write_to(&mut f)?;
    use std::io::Write;
    f.flush()
}

/// Quantizes `input` into `output` with llama.cpp's own quantizer
/// (`llama_model_quantize`, requantizing allowed), for a second
/// quantization of one model in tests and benchmarks.
///
/// # Errors
/// `BadInput` for an unknown type; llama.cpp's failure otherwise.
pub fn quantize(input: &Path, output: &Path, kind: &str) -> anyhow::Result<()> {
    use llama_cpp_sys_2 as sys;
    let ftype = match kind {
        "q8_0" => sys::LLAMA_FTYPE_MOSTLY_Q8_0,
        "q4_0" => sys::LLAMA_FTYPE_MOSTLY_Q4_0,
        "q4_1" => sys::LLAMA_FTYPE_MOSTLY_Q4_1,
        "q4_k_m" => sys::LLAMA_FTYPE_MOSTLY_Q4_K_M,
        "q3_k_m" => sys::LLAMA_FTYPE_MOSTLY_Q3_K_M,
        "q2_k" => sys::LLAMA_FTYPE_MOSTLY_Q2_K,
        _ => {
            return Err(crate::error::bad(format!(
                "quantization type '{kind}': use q8_0, q4_0, q4_1, q4_k_m, q3_k_m or q2_k"
            )))
        }
    };
    let c = |p: &Path| std::ffi::CString::new(p.to_string_lossy().as_bytes()).unwrap_or_default();
    let (i, o) = (c(input), c(output));
    let _backend = llama_cpp_2::llama_backend::LlamaBackend::init()?;
    // SAFETY: default params from llama.cpp, valid NUL-terminated paths for the call's duration.
    let rc = unsafe {
        let mut params = sys::llama_model_quantize_default_params();
        params.ftype = ftype;
        params.allow_requantize = true;
        sys::llama_model_quantize(i.as_ptr(), o.as_ptr(), &raw const params)
    };
    anyhow::ensure!(rc == 0, "llama.cpp could not quantize {} to {kind} (code {rc})", input.display());
    Ok(())
}
