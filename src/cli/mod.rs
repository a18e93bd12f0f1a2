//! Command line: clap derive, llama-bench's option names, NGL_TUNE_* env vars.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "ngl-tune",
    version,
    about = "Find, by measurement, how many layers of a GGUF model belong on the GPU",
    long_about = "Find, by measurement, how many layers of a GGUF model belong on the GPU.\n\n\
        Exit codes: 0 ok, 1 failure, 2 bad input or usage, 3 regression found (reprofile),\n\
        130 stopped by SIGINT/SIGTERM (finished trials kept; continue with --resume).\n\
        llama-bench's short options -ngl, -ncmoe, -ub and -fa are accepted as written."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once and matched once: the size of the tune's arguments costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Tune: sweep ngl, fit, choose the best setting under the VRAM target, write a profile
    /// (also the default: `ngl-tune MODEL` is `ngl-tune tune MODEL`)
    Tune(TuneArgs),
    /// Measure pp and tg like llama-bench at each ngl, one worker process per value
    Bench(BenchArgs),
    /// Show what a GGUF model is: architecture, layers, bytes per layer, experts
    Inspect(InspectArgs),
    /// Write a profile as Modelfile lines, llama.cpp flags, llama-server env, Ollama options, tables, a chart
    Emit(EmitArgs),
    /// Nightly: re-tune this machine's stale profiles, test for drift, keep history
    Reprofile(ReprofileArgs),
    /// How tg, pp and the recommendation moved over time for a model or profile
    History(HistoryArgs),
    /// Profiles in the store, from every machine
    Profiles(ProfilesArgs),
    /// What this machine has: GPUs (NVML), llama.cpp devices, CPU, RAM, fingerprint
    Hw(HwArgs),
    /// Serve this machine's devices to other hosts' tunes over llama.cpp's RPC protocol (no
    /// authentication: bind beyond 127.0.0.1 on a private network only)
    RpcServer(RpcServerArgs),
    /// Internal: write a synthetic GGUF model (tests and benchmarks)
    #[command(name = "__synth", hide = true)]
    Synth(SynthArgs),
    /// Internal: quantize a GGUF model with llama.cpp's quantize API (tests and benchmarks)
    #[command(name = "__quantize", hide = true)]
    Quantize {
        input: PathBuf,
        output: PathBuf,
        /// q8_0, q4_0, q4_1, q4_k_m, q3_k_m or q2_k
        kind: String,
    },
    /// Internal: check that llama.cpp can load a model's header and vocabulary
    #[command(name = "__check", hide = true)]
    Check {
        model: PathBuf,
        #[arg(long)]
        rpc: Option<String>,
        #[arg(long)]
        mmproj: Option<PathBuf>,
    },
    /// Internal: predict device memory by llama.cpp's dry run (spec as JSON on stdin)
    #[command(name = "__predict", hide = true)]
    Predict,
    /// Internal: generate with and without a draft model (spec as JSON on stdin)
    #[command(name = "__spec", hide = true)]
    Spec,
    #[command(name = "__kl", hide = true)]
    Kl,
    /// Internal: print llama.cpp's devices as JSON
    #[command(name = "__devices", hide = true)]
    Devices {
        #[arg(long)]
        rpc: Option<String>,
    },
    /// Internal: the RPC server itself, which `rpc-server` supervises
    #[command(name = "__rpc-serve", hide = true)]
    RpcServe(RpcServerArgs),
    /// Internal: run one trial (spec as JSON on stdin, result as one line on stdout)
    #[command(name = "__trial", hide = true)]
    Trial,
    /// Internal: keep one model and its context allocated until stdin closes (a resident neighbour)
    #[command(name = "__hold", hide = true)]
    Hold,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Md,
    Csv,
    Json,
    Jsonl,
}

/// Workload options shared by `bench` and the tuner.
#[derive(Debug, Clone, Args)]
pub struct WorkloadArgs {
    /// Prompt tokens for the pp test, 0 skips it [default: 512; tune --quick: 128]
    #[arg(short = 'p', long = "n-prompt")]
    pub n_prompt: Option<u32>,
    /// Generated tokens for the tg test, 0 skips it [default: 128; tune --quick: 32]
    #[arg(short = 'n', long = "n-gen")]
    pub n_gen: Option<u32>,
    /// Repetitions of each test [default: bench 5, tune 3, tune --quick 2]
    #[arg(short = 'r', long = "repetitions")]
    pub repetitions: Option<u32>,
    /// CPU threads [default: physical cores]
    #[arg(short = 't', long = "threads", env = "NGL_TUNE_THREADS")]
    pub threads: Option<u32>,
    /// Logical batch size
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch_size: u32,
    /// Physical batch size (llama-bench: -ub)
    #[arg(long = "ubatch-size", default_value_t = 512)]
    pub ubatch_size: u32,
    /// Context size [default: bench n_prompt + n_gen of each test (as llama-bench); tune: see --ctx]
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<u32>,
    /// Flash attention (llama-bench: -fa)
    #[arg(long = "flash-attn", value_enum, default_value_t = crate::placement::FlashAttn::Auto)]
    pub flash_attn: crate::placement::FlashAttn,
    /// Skip the warmup run before each test
    #[arg(long)]
    pub no_warmup: bool,
    /// Memory sampling interval in milliseconds while a trial runs (0 turns sampling off)
    #[arg(long = "sample-interval", default_value_t = 20, value_name = "MS")]
    pub sample_interval_ms: u64,
    /// Seconds before a trial is killed and recorded as a timeout
    #[arg(long, default_value_t = 900, env = "NGL_TUNE_TRIAL_TIMEOUT")]
    pub trial_timeout: u64,
    #[command(flatten)]
    pub busy: BusyArg,
    /// Offload host tensor operations to the GPU (llama.cpp's --op-offload)
    ///
    /// The prompt's matrix products of layers on the CPU. Auto turns it off where the only GPU is
    /// a CPU-based Vulkan device (llvmpipe), where it cannot beat the CPU backend.
    #[arg(long, value_enum, default_value_t = crate::placement::OpOffload::Auto)]
    pub op_offload: crate::placement::OpOffload,
    #[command(flatten)]
    pub rpc: RpcArg,
    /// A multimodal projector (mmproj-*.gguf) loaded beside the model, as llama-server's --mmproj
    ///
    /// It goes on the first GPU, as llama-server puts it: its weights and image-encoder buffers are
    /// priced and counted against that device's cap, and each trial also times the encoding of
    /// one fixed image (the img row beside pp and tg).
    #[arg(long, value_name = "FILE")]
    pub mmproj: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// GGUF model file
    pub model: PathBuf,
    /// Layers on the GPU: a list and ranges as llama-bench (0,10,99 or 0-40+10); 99 means all (llama-bench: -ngl)
    #[arg(long = "n-gpu-layers", default_value = "99")]
    pub ngl: Vec<String>,
    /// Layers whose MoE expert tensors stay on the CPU, as llama.cpp's --n-cpu-moe (list and ranges as -ngl; llama-bench: -ncmoe)
    #[arg(long = "n-cpu-moe", default_value = "0")]
    pub n_cpu_moe: Vec<String>,
    /// Layers (from the first) whose dense FFN weights stay on the CPU, as the tune's FFN spill emits it
    /// (-ot 'blk\.(0|1|..)\.ffn_(up|down|gate)\.weight=CPU'); a list and ranges as -ngl; every ngl is
    /// measured with each
    #[arg(long = "n-cpu-ffn", default_value = "0")]
    pub n_cpu_ffn: Vec<String>,
    /// Tokens in the KV cache before each test, as llama-bench's -d: a list and ranges as -ngl
    /// (0,4096,16384); every setting is measured at each
    #[arg(short = 'd', long = "n-depth", default_value = "0")]
    pub n_depth: Vec<String>,
    /// KV cache type of both caches (llama-bench: -ctk/-ctv)
    #[arg(long = "cache-type", value_enum, default_value_t = crate::placement::KvType::F16)]
    pub cache_type: crate::placement::KvType,
    /// Keep the tensors matching PATTERN on the CPU, llama.cpp's -ot PATTERN=CPU (repeatable)
    #[arg(long = "override-tensor", value_name = "PATTERN=CPU")]
    pub override_tensor: Vec<String>,
    /// Run a llama.cpp command line's placement as given, e.g. the llama_cpp_args of a profile:
    /// "-ngl 99 -t 8 -c 16384 -ctk q8_0 -ctv q8_0 -fa on -ot 'PATTERN=CPU' --n-cpu-moe 4 --no-op-offload"
    /// (its values replace the options above)
    #[arg(long = "llama-args", value_name = "FLAGS", allow_hyphen_values = true)]
    pub llama_args: Option<String>,
    /// Another model held resident while this one is measured (its model and context allocated, idle), as
    /// beside it in an Ollama server or a llama-swap group: a set's member checked with its neighbour
    #[arg(long, value_name = "MODEL")]
    pub beside: Option<PathBuf>,
    /// With --beside: its llama.cpp command line, like a set member's llama_server_args
    #[arg(long, value_name = "FLAGS", allow_hyphen_values = true, requires = "beside")]
    pub beside_args: Option<String>,
    #[command(flatten)]
    pub draft: DraftArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Output format
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Md)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub talk: Verbosity,
}

/// Speculative decoding: a draft model loaded beside the model, as llama-server loads one.
#[derive(Debug, Clone, Args)]
pub struct DraftArgs {
    /// A draft model (llama.cpp's -md, run as --spec-type draft-simple). bench: generation is
    /// measured with and without it at each depth, greedily on natural text, paired within one
    /// load; tune: tried beside the answer (on the CPU, on the device, and the target's layers the
    /// cap trades for it) and kept where faster beyond the noise
    #[arg(help_heading = "Speculative decoding", long, value_name = "MODEL")]
    pub draft: Option<PathBuf>,
    /// Draft with the model's own multi-token-prediction heads (llama.cpp's --spec-type draft-mtp;
    /// Ollama's PARAMETER draft_num_predict), measured as --draft is. tune tries them on a model
    /// that has them whether given or not
    #[arg(help_heading = "Speculative decoding", long)]
    pub mtp: bool,
    /// The draft's layers on the device (llama.cpp's -ngld) [default: bench every layer; tune: tried]
    #[arg(help_heading = "Speculative decoding", long = "draft-ngl", value_name = "N")]
    pub draft_ngl: Option<u32>,
    /// The most tokens one draft proposes (llama.cpp's --spec-draft-n-max) [default: 3]
    #[arg(help_heading = "Speculative decoding", long = "draft-max", value_name = "N")]
    pub draft_max: Option<u32>,
    /// The text drafted on: its first --n-depth tokens fill the context before generating
    /// [default: the quality check's natural text, Debian's fortunes]
    #[arg(help_heading = "Speculative decoding", long = "prompt-file", value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ObjectiveArg {
    /// Token generation speed (chat)
    Tg,
    /// Prompt processing speed (long prompts)
    Pp,
    /// Time for one request of -p prompt and -n generated tokens
    Mixed,
    /// Generated tokens per joule (needs an NVIDIA card's NVML or the CPU's RAPL)
    Energy,
    /// Generated tokens per second of --parallel N sequences decoding together (batch jobs)
    Throughput,
}

#[derive(Debug, Args)]
pub struct TuneArgs {
    /// GGUF model file(s)
    ///
    /// Several (one model's quantizations, or other models) are tuned under the same cap and
    /// workload and ranked, each with its KL divergence from the largest.
    #[arg(required = true, num_args = 1.., value_name = "MODEL")]
    pub models: Vec<PathBuf>,
    /// Use at most this share of each device's memory
    ///
    /// All processes are counted where a sampler can see them (NVML).
    #[arg(help_heading = "Cap", long, default_value = "0.9", value_name = "F", allow_hyphen_values = true,
          value_parser = target_share)]
    pub target_vram: f64,
    /// Absolute cap on the memory the model may take, e.g. 8GiB, or per device DEV=SIZE,...
    ///
    /// The stricter of this and --target-vram applies. DEV is a llama.cpp device (CUDA1, RPC0; see
    /// `hw`) or an RPC server's host:port (RPC0=4GiB,Vulkan0=6GiB); a plain SIZE applies to every
    /// device.
    #[arg(help_heading = "Cap", long, value_name = "SIZE|DEV=SIZE,...", allow_hyphen_values = true)]
    pub vram_budget: Option<String>,
    /// Cap on the host memory a placement may take, e.g. 12GiB [default: 90% of the RAM free at start]
    ///
    /// The host part of each candidate (the CPU layers' weights, read through mmap, the CPU's KV
    /// cache and compute buffers, by llama.cpp's dry run): one over it would page the model in
    /// from disk, so it is not run and the report names it with what it needs.
    #[arg(help_heading = "Cap", long, value_name = "SIZE")]
    pub host_budget: Option<String>,
    /// Exclude whole-layer settings whose GPUs draw more than this over the tg test (W; NVML)
    #[arg(help_heading = "Cap", long, value_name = "W", allow_hyphen_values = true, value_parser = positive_watts)]
    pub max_power: Option<f64>,
    /// ngl values to measure instead of the adaptive search (99 = all layers)
    ///
    /// The default grid is 0,10,20,... and full offload; lists and ranges as llama-bench (0-40+10).
    #[arg(help_heading = "Search", long = "n-gpu-layers", visible_alias = "ngl")]
    pub ngl: Vec<String>,
    /// Context sizes to tune, e.g. 4096,16384,32768
    ///
    /// Each at most what the model was trained for; the profile holds one placement per context.
    /// [default: -c, else num_ctx of the --write-modelfile Modelfile, else the context Ollama gives
    /// the model by default on this machine's GPU memory]
    #[arg(help_heading = "Workload", long = "ctx", value_name = "LIST", conflicts_with = "ctx_size")]
    pub ctx: Option<String>,
    /// Tokens in the KV cache before each test [default: half of each context]
    ///
    /// Every candidate at a context is measured at this depth, as llama-bench's -d: the escape
    /// hatches differ where the cache is full. Half the context is where tg equals its mean over
    /// a filled window; 0 measures with an empty cache. Always leaves room for the tests.
    #[arg(help_heading = "Workload", long, value_name = "TOKENS")]
    pub depth: Option<u32>,
    /// The consumer's settings file: `--ollama-env FILE` or `--server-env FILE` (`consumer::Program::flag`).
    #[command(flatten)]
    pub consumer: crate::consumer::args::ConsumerArgs,
    /// Largest KL divergence (nats) a quantized KV cache may cost and still be recommended
    ///
    /// Measured against the f16 cache on tokens the f16 cache generated.
    #[arg(help_heading = "Search", long, default_value = "0.05", value_name = "NATS", allow_hyphen_values = true,
          value_parser = kl_nats)]
    pub max_kl: f64,
    /// Smallest share of positions whose top token a quantized KV cache must keep
    ///
    /// Against the f16 cache's, on the tokens scored for --max-kl; with --max-kl, the gate a lossy
    /// option passes before it can be recommended.
    #[arg(help_heading = "Search", long, default_value = "0.9", value_name = "F", allow_hyphen_values = true,
          value_parser = top1_share)]
    pub min_top1: f64,
    /// Reading speed for chat: each context's answer is judged against it (tg, t/s)
    ///
    /// Below it, the report names the first hatch in the guides' order (q8_0 KV cache, shorter
    /// context, FFN spill) that was measured above it, or what is left to try.
    #[arg(help_heading = "Search", long, default_value = "10", value_name = "T/S", allow_hyphen_values = true,
          value_parser = positive_speed)]
    pub reading_speed: f64,
    #[command(flatten, next_help_heading = "Workload")]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub draft: DraftArgs,
    /// What to maximize
    #[arg(help_heading = "Search", long, value_enum, default_value_t = ObjectiveArg::Tg)]
    pub objective: ObjectiveArg,
    /// Sequences decoding together for --objective throughput (llama-server's -np)
    ///
    /// Each tg test decodes N sequences one token each a step, each at the depth, and counts all
    /// their tokens (llama-batched-bench's S_TG); each context is N slots of the --ctx given, so
    /// the KV cache is sized for N. Emitted as -np N, LLAMA_ARG_N_PARALLEL and OLLAMA_NUM_PARALLEL.
    #[arg(help_heading = "Search", long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: Option<u32>,
    /// Place the models to stay resident together on one device (two or more models)
    ///
    /// One placement per model so that all of them are loaded at once under the cap, the weighted
    /// time a generated token takes as small as it can be; measured with every model loaded, each
    /// generating in turn while the others sit resident. Emits each model's lines, the Ollama
    /// server's settings that keep them loaded, and a llama-swap group.
    #[arg(help_heading = "Search", long)]
    pub together: bool,
    /// With --together: each model's share of requests, like 0.8,0.2 [default: equal]
    #[arg(help_heading = "Search", long, value_name = "W,W,...", requires = "together", allow_hyphen_values = true)]
    pub weights: Option<String>,
    /// A batch job to time: REQUESTSxTOKENS generated (like 500x800); the report gives its hours
    #[arg(help_heading = "Search", long, value_name = "RxT")]
    pub job: Option<String>,
    /// How to choose what to measure: adaptively, or every grid value in full
    ///
    /// Adaptive measures ngl 0 and the largest setting predicted under the cap, then one or two
    /// interior points unless those two ends already decide it; a setting far behind the best is
    /// cut short after one repetition.
    #[arg(help_heading = "Search", long, value_enum, default_value_t = crate::types::SearchMode::Adaptive)]
    pub search: crate::types::SearchMode,
    /// A short pass: -p 128 -n 32 -r 2 unless given
    #[arg(help_heading = "Search", long)]
    pub quick: bool,
    /// Measure grid values above one that ran out of memory anyway
    #[arg(help_heading = "Search", long)]
    pub no_skip: bool,
    /// Continue an interrupted tuning of this model from its checkpoint
    #[arg(help_heading = "Output", long)]
    pub resume: bool,
    #[command(flatten, next_help_heading = "Output")]
    pub lock: LockArg,
    #[command(flatten, next_help_heading = "Output")]
    pub store: StoreArg,
    #[command(flatten, next_help_heading = "Output")]
    pub print: PrintJson,
    #[command(flatten, next_help_heading = "Output")]
    pub files: ProfileFiles,
    #[command(flatten, next_help_heading = "Output")]
    pub talk: Verbosity,
}

#[derive(Debug, Args)]
pub struct EmitArgs {
    /// A profile (.json), or a model whose profile for this machine is in the store
    pub source: PathBuf,
    /// Output format [default: modelfile, unless only --chart or --write-modelfile is asked for]
    #[arg(short = 'f', long, value_enum)]
    pub format: Option<crate::emit::Format>,
    #[command(flatten)]
    pub files: ProfileFiles,
    /// The context size whose placement to emit, of those tuned [default: the largest]
    #[arg(long, value_name = "N")]
    pub ctx: Option<u32>,
    #[command(flatten)]
    pub store: StoreArg,
}

#[derive(Debug, Args)]
pub struct ReprofileArgs {
    #[command(flatten)]
    pub store: StoreArg,
    /// Re-tune profiles older than this (7d, 12h, 30m)
    #[arg(long, default_value = "7d", value_name = "AGE", value_parser = max_age)]
    pub max_age: Duration,
    /// Only list what would be re-tuned and why
    #[arg(long)]
    pub dry_run: bool,
    /// Smallest change (fraction) that counts as drift; a change must also be significant (Welch's t-test, p < 0.05)
    #[arg(long, default_value = "0.05", value_name = "F", allow_hyphen_values = true, value_parser = drift_fraction)]
    pub drift_threshold: f64,
    /// Rewrite the Modelfiles in DIR whose FROM is a model whose recommendation changed
    #[arg(long, value_name = "DIR")]
    pub update_modelfiles: Option<PathBuf>,
    #[command(flatten)]
    pub lock: LockArg,
    /// Before re-tuning, wait up to this long for the machine to be idle (0: do not wait);
    /// then re-tune anyway, and trials measured while it was busy are not judged for drift
    #[arg(long, default_value = "10m", value_name = "DURATION", value_parser = wait_idle)]
    pub wait_idle: Duration,
    #[command(flatten)]
    pub busy: BusyArg,
    #[command(flatten)]
    pub print: PrintJson,
    #[command(flatten)]
    pub talk: Verbosity,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// A model (its profile for this machine) or a profile (.json)
    pub source: PathBuf,
    #[command(flatten)]
    pub store: StoreArg,
    #[command(flatten)]
    pub print: PrintJson,
}

#[derive(Debug, Args)]
pub struct ProfilesArgs {
    #[command(subcommand)]
    pub command: ProfilesCommand,
}

#[derive(Debug, Subcommand)]
pub enum ProfilesCommand {
    /// Every profile in the store: machine, model, recommendation, age
    List {
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        print: PrintJson,
    },
}

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Where to write the model
    pub out: PathBuf,
    #[arg(long, default_value_t = 4)]
    pub layers: u32,
    /// Experts per layer (0: dense llama; >1: qwen3moe)
    #[arg(long, default_value_t = 0)]
    pub experts: u32,
    /// A recurrent model (llama.cpp's mamba: state-space layers, no KV cache)
    #[arg(long)]
    pub mamba: bool,
    /// Multi-token-prediction blocks after the trunk (a glm4moe model; --experts 4 unless given)
    #[arg(long, default_value_t = 0)]
    pub mtp: u32,
    #[arg(long, default_value_t = 128)]
    pub n_embd: u64,
    #[arg(long, default_value_t = 256)]
    pub n_ff: u64,
    /// Attention heads
    #[arg(long, default_value_t = 2)]
    pub heads: u64,
    /// Key/value heads (grouped-query attention) [default: as many as heads]
    #[arg(long)]
    pub kv_heads: Option<u64>,
    /// Weight matrices in Q8_0 instead of F32
    #[arg(long)]
    pub q8_0: bool,
    /// The context it was "trained" for
    #[arg(long, default_value_t = 4096)]
    pub ctx_train: u32,
    /// Vocabulary size (at least 259: the byte tokens)
    #[arg(long, default_value_t = 259)]
    pub vocab: u64,
    /// Tied embeddings: the output reuses token_embd (no output.weight)
    #[arg(long)]
    pub tied: bool,
    /// Write a vision projector (Gemma 3's kind) for a text model of this embedding size instead
    #[arg(long, value_name = "N_EMBD")]
    pub projector_for: Option<u64>,
}

#[derive(Debug, Args)]
pub struct HwArgs {
    #[command(flatten)]
    pub print: PrintJson,
    #[command(flatten)]
    pub rpc: RpcArg,
}

#[derive(Debug, Args)]
pub struct RpcServerArgs {
    /// Address to listen on. Anything but 127.0.0.1 is reachable from other machines: llama.cpp's
    /// RPC protocol has no authentication or encryption, so bind to a private network only
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on
    #[arg(long, default_value_t = 50052)]
    pub port: u16,
    /// Devices to serve, by llama.cpp's names (CUDA0,CUDA1; see `hw`) [default: every GPU, else the CPU]
    #[arg(long, value_delimiter = ',', value_name = "DEV,...")]
    pub device: Vec<String>,
    /// CPU threads for a served CPU device [default: physical cores]
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// Give each served device this much memory (512MiB, 8GiB): its total to clients, less what they
    /// hold as free; an allocation past it fails as on a full card. Lends part of a shared GPU, or
    /// makes the CPU a card of that size [default: the device's own]
    #[arg(long, value_name = "SIZE")]
    pub mem: Option<String>,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// GGUF model file
    pub model: PathBuf,
    #[command(flatten)]
    pub print: PrintJson,
}

// Flags several commands take, each defined once here and flattened into
// the commands that take it: one help text, one env var, one type.

/// The profile store.
#[derive(Debug, Clone, Args)]
pub struct StoreArg {
    /// Profile store directory [default: $XDG_DATA_HOME/ngl-tune/profiles]
    #[arg(long, env = "NGL_TUNE_PROFILES", value_name = "DIR")]
    pub profiles: Option<PathBuf>,
}

impl TuneArgs {
    /// The consumer whose settings file the command line names, and the file.
    #[must_use]
    pub fn consumer_settings(&self) -> Option<(crate::consumer::Program, &Path)> {
        self.consumer.given.as_ref().map(|(program, file)| (*program, file.as_path()))
    }
}

impl StoreArg {
    /// The directory given, if any.
    #[must_use]
    pub fn given(&self) -> Option<&Path> {
        self.profiles.as_deref()
    }
}

/// Machine output on stdout.
#[derive(Debug, Clone, Copy, Args)]
pub struct PrintJson {
    /// Print JSON instead of the text report (stable forms: docs/commands.md)
    #[arg(long)]
    pub json: bool,
}

/// llama.cpp's log and the progress bars.
#[derive(Debug, Clone, Copy, Args)]
pub struct Verbosity {
    /// Show llama.cpp's log
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// No progress bars
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// The store's lock: wait for another tuner, or not.
#[derive(Debug, Clone, Copy, Args)]
pub struct LockArg {
    /// Exit at once if another tuner holds the store instead of waiting
    #[arg(long)]
    pub no_wait: bool,
}

/// Files written from a profile beside it.
#[derive(Debug, Clone, Args)]
pub struct ProfileFiles {
    /// Update this Ollama Modelfile in place with the recommendation, read as Ollama reads it
    ///
    /// Only the lines ngl-tune owns change (num_gpu, num_thread, num_ctx); the old file is kept as
    /// PATH.bak; a Modelfile Ollama would reject is refused, untouched.
    #[arg(long, value_name = "PATH")]
    pub write_modelfile: Option<PathBuf>,
    /// Draw the tuning curve as an SVG chart
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<PathBuf>,
}

/// Remote devices.
#[derive(Debug, Clone, Args)]
pub struct RpcArg {
    /// llama.cpp RPC servers whose devices join this machine's, host:port,... (llama.cpp's --rpc)
    ///
    /// Each runs `ngl-tune rpc-server` or llama.cpp's rpc-server of the same revision. With two or
    /// more offload devices, tune measures how to split the layers between them; `hw` lists their
    /// devices and the round trip to each.
    #[arg(long = "rpc", value_name = "HOST:PORT,...", env = "NGL_TUNE_RPC", help_heading = "Devices")]
    pub servers: Option<String>,
}

/// When a trial counts as contended.
#[derive(Debug, Clone, Copy, Args)]
pub struct BusyArg {
    /// Share of a trial's threads other processes may use before the trial counts as contended
    ///
    /// 0.1 with -t 8: 0.8 cores' worth of CPU. A contended trial is measured once more after a
    /// short wait, and marked if the machine is still busy; reprofile waits for the machine to
    /// fall under it first.
    #[arg(
        long = "busy-threshold",
        default_value = "0.1",
        value_name = "F",
        env = "NGL_TUNE_BUSY_THRESHOLD",
        allow_hyphen_values = true,
        value_parser = busy_share
    )]
    pub threshold: f64,
}

mod values;
use values::{busy_share, drift_fraction, kl_nats, max_age, positive_speed, positive_watts, top1_share, wait_idle};
pub use values::{default_to_tune, duration, negative_value, normalize_args, one_line, target_share};

#[cfg(test)]
mod tests;
