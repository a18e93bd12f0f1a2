//! Ollama's rules, read in its source: how its server reads its
//! environment (`envconfig`), the systemd unit it runs under, and what it
//! passes llama-server for a model (slots, KV type, flash attention, batch,
//! fit target, where the projector goes); and a placement in Ollama's
//! forms (Modelfile lines, server settings).

use std::path::Path;

use super::{parse_env_file, read_env_file, var_in, ServerEnv};

pub mod modelfile;
pub mod process;
use crate::placement::{FlashAttn, KvType, Placement, DEFAULT_N_BATCH, DEFAULT_N_UBATCH};

impl ServerEnv {
    fn number(&self, key: &str) -> Option<u64> {
        self.var(key).and_then(|v| v.parse().ok())
    }

    /// Ollama's boolean: unset is `None`.
    fn flag(&self, key: &str) -> Option<bool> {
        self.var(key).map(|v| parse_bool(&v))
    }
}

/// A boolean as Ollama reads one (`envconfig.BoolWithDefault`): false only
/// where Go's `strconv.ParseBool` says false, anything unparsable true.
#[must_use]
pub fn parse_bool(v: &str) -> bool {
    !matches!(v.trim(), "0" | "f" | "F" | "false" | "FALSE" | "False")
}

/// The environment of a systemd unit from `systemctl show UNIT
/// --property=LoadState,Environment,EnvironmentFiles`: `Environment=`
/// (drop-ins merged by systemd) first, then each `EnvironmentFiles=` file,
/// whose assignments override it as systemd applies them. `read` reads a
/// file (`None`: unreadable, skipped as systemd does with a `-` path).
#[must_use]
pub fn parse_systemctl_show(unit: &str, text: &str, read: &dyn Fn(&Path) -> Option<String>) -> Option<ServerEnv> {
    let mut loaded = false;
    let mut vars = Vec::new();
    let mut files = Vec::new();
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else { continue };
        match k {
            "LoadState" => loaded = v.trim() == "loaded",
            "Environment" => {
                for word in shlex::split(v).unwrap_or_default() {
                    if let Some((key, value)) = word.split_once('=') {
                        vars.push((key.to_string(), value.to_string()));
                    }
                }
            }
            "EnvironmentFiles" => {
                if let Some(path) = v.split_whitespace().next() {
                    files.push(path.to_string());
                }
            }
            _ => {}
        }
    }
    if !loaded {
        return None;
    }
    let mut from = vec!["Environment=".to_string()];
    for f in &files {
        if let Some(parsed) = read(Path::new(f)).and_then(|t| parse_env_file(&t).ok()) {
            vars.extend(parsed);
            from.push(f.clone());
        }
    }
    Some(ServerEnv { source: format!("systemd unit {unit} ({})", from.join(", ")), found: true, vars })
}

/// The Ollama server's environment: `--ollama-env FILE`, else the
/// `ollama` systemd unit's, else none (said in words).
///
/// # Errors
/// `BadInput` for a file that cannot be read or is not KEY=VALUE lines.
pub fn server_env(file: Option<&Path>) -> anyhow::Result<ServerEnv> {
    if let Some(f) = file {
        return read_env_file(f, "--ollama-env");
    }
    let unit = "ollama.service";
    let shown = std::process::Command::new("systemctl")
        .args(["show", unit, "--property=LoadState", "--property=Environment", "--property=EnvironmentFiles"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    Ok(shown.and_then(|t| parse_systemctl_show(unit, &t, &read)).unwrap_or_else(|| ServerEnv {
        source:
            "none found: no --ollama-env and no ollama systemd unit; Ollama's defaults assumed (1 slot, f16 KV cache)"
                .into(),
        found: false,
        vars: Vec::new(),
    }))
}

/// Model families Ollama runs with one slot whatever `OLLAMA_NUM_PARALLEL`
/// says (server/sched.go).
const ONE_SLOT: [&str; 11] = [
    "mllama",
    "qwen3vl",
    "qwen3vlmoe",
    "qwen35",
    "qwen35moe",
    "qwen3next",
    "lfm2",
    "lfm2moe",
    "nemotron_h",
    "nemotron_h_moe",
    "nemotron_h_omni",
];

/// Whether Ollama runs architecture `arch` with one slot whatever
/// `OLLAMA_NUM_PARALLEL` says (server/sched.go, `load`: "model architecture
/// does not currently support parallel requests").
#[must_use]
pub fn one_slot(arch: &str) -> bool {
    ONE_SLOT.contains(&arch)
}

/// What the Ollama server will pass llama-server, from its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OllamaRun {
    /// `OLLAMA_NUM_PARALLEL` (1 for the families Ollama keeps at one slot).
    pub parallel: u32,
    /// `OLLAMA_KV_CACHE_TYPE`, when one llama.cpp and ngl-tune know.
    pub kv_type: Option<KvType>,
    /// `OLLAMA_FLASH_ATTENTION` when set; unset, off where Ollama's device
    /// check refuses a card (see [`cuda_flash_attention`]), else
    /// None (Ollama passes auto).
    pub flash_attn: Option<FlashAttn>,
    /// What was read and what it does, a phrase each.
    pub applied: Vec<String>,
}

/// Ollama's automatic batch size for a context (server/sched.go,
/// `generationBatchForContext`): 2048 above 32768 tokens, 1024 above 4096,
/// else 512, passed as both `-b` and `-ub`, before [`batch_for`]
/// steps it down.
#[must_use]
pub fn batch(effective_ctx: u32) -> u32 {
    match effective_ctx {
        c if c > 32768 => 2048,
        c if c > 4096 => 1024,
        _ => 512,
    }
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// What Ollama adds to its memory prediction for a batch size
/// (`generationBatchSurcharge`).
fn batch_surcharge(batch: u32) -> u64 {
    match batch {
        b if b >= 2048 => 2 * GIB,
        b if b >= 1024 => 768 * MIB,
        _ => 0,
    }
}

/// Ollama's own prediction of a model's device memory before it starts
/// llama-server (llm/llama_server.go `PredictServerVRAM`): the file's size
/// plus an f16 cache of `2 x layers x kv heads x (embedding / heads) x
/// context x 2` bytes, deliberately high. Its scheduler steps the batch
/// down and decides whether a model loads beside others on this, not on
/// llama.cpp's accounting. `n_ctx`: the context llama-server gets
/// (`num_ctx x parallel`: `effectiveLlamaServerContext`).
#[must_use]
pub fn predict_server_vram(info: &crate::model::ModelInfo, n_ctx: u32) -> u64 {
    // HeadCountKVMin() of 0 counts as 1; HeadCountMax() of 0 leaves no head dimension.
    let kv_heads = info.n_head_kv.max(1);
    let head_dim = info.n_embd.checked_div(info.n_head).unwrap_or(0);
    info.file_size + 2 * u64::from(info.n_layer) * kv_heads * head_dim * u64::from(n_ctx) * 2
}

/// What Ollama's pre-flight check weighs before it loads a model fully on
/// the GPU beside loaded ones (server/sched.go: `predictedForLoad`, the
/// prediction plus the batch's surcharge), against 80% of the free memory
/// they leave.
#[must_use]
pub fn predicted_for_load(info: &crate::model::ModelInfo, n_ctx: u32, n_batch: u32) -> u64 {
    predict_server_vram(info, n_ctx) + batch_surcharge(n_batch)
}

/// Ollama's `generationBatchFits`: the prediction under 80% of the free
/// memory, under 60% (2048) or 75% (1024) of it, and the surcharge inside
/// what the 80% leaves.
fn batch_fits(batch: u32, predicted: u64, available: u64) -> bool {
    if predicted == 0 || available == 0 {
        return true;
    }
    let threshold = available * 80 / 100;
    let headroom = match batch {
        b if b >= 2048 => predicted <= available * 60 / 100,
        b if b >= 1024 => predicted <= available * 75 / 100,
        _ => true,
    };
    predicted <= threshold && headroom && batch_surcharge(batch) <= threshold - predicted
}

/// Ollama's batch for a context on its devices (`automaticGenerationBatch`):
/// on a CUDA device with flash attention off, 512 (256 above 4096 tokens on a
/// card of at most 8 GiB: `cuda_without_fa` gives that card's memory); else
/// the context's batch, stepped down to 1024 and 512 while the predicted
/// memory of the model (`predicted`, bytes) leaves too little of the free
/// memory (`available`).
#[must_use]
pub fn batch_for(effective_ctx: u32, predicted: u64, available: u64, cuda_without_fa: Option<u64>) -> u32 {
    if let Some(card) = cuda_without_fa {
        return if effective_ctx > 4096 && card > 0 && card <= 8 * GIB { 256 } else { 512 };
    }
    let mut batch = batch(effective_ctx);
    while batch > 512 && !batch_fits(batch, predicted, available) {
        batch = if batch > 1024 { 1024 } else { 512 };
    }
    batch
}

/// How llama-server's fit runs under Ollama with `num_gpu` unset: on
/// unless `LLAMA_ARG_FIT` (inherited from Ollama's environment) says off;
/// its margin `LLAMA_ARG_FIT_TARGET` where set there (MiB, the first of a
/// list; Ollama keeps an inherited one as it is), else
/// [`fit_margin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OllamaFit {
    pub on: bool,
    pub target_bytes: Option<u64>,
}

/// [`OllamaFit`] from Ollama's environment.
#[must_use]
pub fn fit(vars: &[(String, String)]) -> OllamaFit {
    // llama.cpp's is_falsey.
    let on = !var_in(vars, "LLAMA_ARG_FIT").is_some_and(|v| matches!(v.as_str(), "off" | "false" | "0" | "disabled"));
    let target_bytes = var_in(vars, "LLAMA_ARG_FIT_TARGET")
        .and_then(|v| v.split([',', '/']).next().and_then(|x| x.trim().parse::<u64>().ok()))
        .map(|mib| mib * MIB);
    OllamaFit { on, target_bytes }
}

/// The fit margin Ollama sets without `LLAMA_ARG_FIT_TARGET`: with a
/// projector, its memory plus llama.cpp's margin `base` (1 GiB; the rig's
/// stand-in there) in whole MiB (llm/llama_server.go, `mmprojFitTargetMiB`),
/// which replaces llama.cpp's; else `base`.
#[must_use]
pub fn fit_margin(projector_bytes: Option<u64>, base: u64) -> u64 {
    match projector_bytes {
        Some(b) if b > 0 => (b + base).div_ceil(MIB) * MIB,
        _ => base,
    }
}

/// Whether Ollama loads a projector of `bytes` (its tensors) on the GPU
/// with num_gpu unset: not where a GPU has less free memory than the
/// projector plus 1 GiB (llm/llama_server.go, `mmprojOffloadDisabled`:
/// "limited-vram", then `--no-mmproj-offload` and no fit-target pad).
#[must_use]
pub fn offloads_projector(bytes: u64, free_per_gpu: &[u64]) -> bool {
    !free_per_gpu.iter().any(|&free| free > 0 && free < bytes + GIB)
}

/// Whether Ollama's device check lets flash attention run on a CUDA card of
/// compute capability `major.minor` (ml/device.go,
/// `cudaFlashAttentionSupported`: 6.0 or newer, except 7.2; the driver
/// check there passes every driver a current llama.cpp runs on).
#[must_use]
pub fn cuda_flash_attention((major, minor): (u32, u32)) -> bool {
    major >= 6 && (major, minor) != (7, 2)
}

/// What the Ollama server's environment makes it run for a model of
/// architecture `arch`, on CUDA cards `cuda` (name and compute capability,
/// empty where llama.cpp offloads to none).
#[must_use]
pub fn run(env: &ServerEnv, arch: &str, cuda: &[(String, (u32, u32))]) -> OllamaRun {
    let mut applied = Vec::new();
    let asked = env.number("OLLAMA_NUM_PARALLEL").map_or(1, |n| u32::try_from(n.max(1)).unwrap_or(u32::MAX));
    let parallel = if asked > 1 && one_slot(arch) {
        applied.push(format!("OLLAMA_NUM_PARALLEL={asked} (Ollama runs {arch} with one slot)"));
        1
    } else {
        if asked > 1 {
            applied.push(format!("OLLAMA_NUM_PARALLEL={asked}: -np {asked}, the context times {asked}"));
        }
        asked
    };
    // Ollama lowercases it and passes it to llama-server as it is (llm/server.go).
    let kv_type = env.var("OLLAMA_KV_CACHE_TYPE").and_then(|v| KvType::from_name(&v.to_ascii_lowercase()));
    if let Some(raw) = env.var("OLLAMA_KV_CACHE_TYPE") {
        applied.push(match kv_type {
            Some(k) => format!("OLLAMA_KV_CACHE_TYPE={raw}: -ctk {0} -ctv {0}", k.as_str()),
            None => {
                format!("OLLAMA_KV_CACHE_TYPE={raw}: not a cache type llama-server takes (f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1): its llama-server would not start; f16 assumed")
            }
        });
    }
    let mut flash_attn = env.flag("OLLAMA_FLASH_ATTENTION").map(|on| if on { FlashAttn::On } else { FlashAttn::Off });
    if let Some(fa) = flash_attn {
        applied.push(format!(
            "OLLAMA_FLASH_ATTENTION={}: -fa {}",
            env.var("OLLAMA_FLASH_ATTENTION").unwrap_or_default(),
            fa.as_str()
        ));
    } else if let Some((name, (major, minor))) = cuda.iter().find(|(_, cc)| !cuda_flash_attention(*cc)) {
        // llm/llama_server.go: unset, flash attention is off where any card fails the check.
        flash_attn = Some(FlashAttn::Off);
        applied.push(format!(
            "--flash-attn off: Ollama's device check refuses flash attention on {name} (CUDA compute {major}.{minor})"
        ));
    }
    for k in ["OLLAMA_CONTEXT_LENGTH", "OLLAMA_IGPU_ENABLE"] {
        if let Some(v) = env.var(k) {
            applied.push(format!("{k}={v}"));
        }
    }
    // server/sched.go only logs it at load; server/routes.go still takes it
    // off each GPU's total for the default context's tier.
    if let Some(v) = env.var("OLLAMA_GPU_OVERHEAD") {
        applied.push(format!(
            "OLLAMA_GPU_OVERHEAD={v}: lowers the memory Ollama's default context counts, and reserves nothing at load (llama-server's fit keeps its own margin: LLAMA_ARG_FIT_TARGET sets it)"
        ));
    }
    OllamaRun { parallel, kv_type, flash_attn, applied }
}

/// The context Ollama gives a model when no `num_ctx` is set, as current
/// Ollama chooses it (server/routes.go): 256k tokens when the GPUs' memory
/// (less `OLLAMA_GPU_OVERHEAD` each) adds up to at least 47 GiB, 32k from
/// 23 GiB, else 4k; `OLLAMA_CONTEXT_LENGTH` replaces the rule; never more
/// than the model was trained for.
#[must_use]
pub fn default_ctx(gpu_totals: &[u64], overhead: u64, env_ctx: Option<u64>, ctx_train: u64) -> u64 {
    const GIB: u64 = 1 << 30;
    let total: u64 = gpu_totals.iter().map(|t| t.saturating_sub(overhead)).sum();
    let by_vram = if total >= 47 * GIB {
        262_144
    } else if total >= 23 * GIB {
        32_768
    } else {
        4096
    };
    let ctx = env_ctx.filter(|c| *c > 0).unwrap_or(by_vram);
    if ctx_train > 0 {
        ctx.min(ctx_train)
    } else {
        ctx
    }
}

/// The context current Ollama gives a model on this machine when no
/// `num_ctx` is set: its rule over the GPUs its discovery keeps
/// (discover/runner.go: NVIDIA cards, else this machine's own offload
/// devices, never RPC servers, which Ollama does not start, nor CPU-emulated
/// ones, which ggml hides from it; integrated GPUs on CUDA and ROCm's
/// gfx1151 by default, others only with `OLLAMA_IGPU_ENABLE`, which
/// decides for every one where set), `OLLAMA_GPU_OVERHEAD` and
/// `OLLAMA_CONTEXT_LENGTH` read through `env` (the Ollama server's environment).
#[must_use]
pub fn ctx_here(hw: &crate::types::Hardware, ctx_train: u64, env: &dyn Fn(&str) -> Option<String>) -> u64 {
    let num = |k: &str| env(k).and_then(|v| v.trim().parse::<u64>().ok());
    // Ollama's admission of integrated GPUs (discover/runner.go,
    // integratedGPUAllowedByDefault): its variable when set, else CUDA's
    // and ROCm's gfx1151 (Ryzen AI Max: Radeon 8060S/8050S, whatever
    // backend llama.cpp reaches it through here).
    let igpu_env = env("OLLAMA_IGPU_ENABLE").map(|v| parse_bool(&v));
    let igpu = |d: &crate::types::LlamaDevice| igpu_env.unwrap_or(d.backend == "CUDA" || gfx1151(&d.description));
    let mut totals: Vec<u64> = hw.gpus.iter().filter_map(|g| g.memory_total).collect();
    if totals.is_empty() {
        totals = hw
            .llama_devices
            .iter()
            .filter(|d| d.is_offload_target() && !d.is_remote() && !d.is_software_renderer())
            .filter(|d| d.kind != crate::types::DeviceKind::Igpu || igpu(d))
            .map(|d| d.memory_total)
            .collect();
    }
    default_ctx(&totals, num("OLLAMA_GPU_OVERHEAD").unwrap_or(0), num("OLLAMA_CONTEXT_LENGTH"), ctx_train)
}

/// Whether a device's description names a gfx1151 part (AMD Ryzen AI Max's
/// Radeon 8060S and 8050S), which Ollama admits as an integrated GPU by
/// default (discover/runner.go, `defaultIntegratedROCmGFXTargets`).
fn gfx1151(description: &str) -> bool {
    let d = description.to_ascii_lowercase();
    ["gfx1151", "radeon 8060s", "radeon 8050s"].iter().any(|n| d.contains(n))
}

/// What Ollama's `num_batch` can say of a placement's batch sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumBatch {
    /// llama.cpp's defaults (-b 2048 -ub 512): no num_batch, Ollama's own rule.
    Default,
    /// Equal sizes: `num_batch N`.
    Num(u32),
    /// Unequal sizes Ollama cannot pass.
    Inexpressible,
}

/// Ollama's `num_ctx` of a placement: the context of one slot (Ollama
/// starts llama-server with `-c num_ctx x P -np P`).
#[must_use]
pub fn num_ctx(p: &Placement) -> Option<u32> {
    p.n_ctx.map(|c| c / p.n_parallel.max(1))
}

/// Ollama's `num_batch` for a placement's batch sizes: it passes one value
/// as both `-b` and `-ub` (llm/llama_server.go).
#[must_use]
pub fn num_batch(p: &Placement) -> NumBatch {
    if p.n_batch == p.n_ubatch {
        NumBatch::Num(p.n_batch)
    } else if (p.n_batch, p.n_ubatch) == (DEFAULT_N_BATCH, DEFAULT_N_UBATCH) {
        NumBatch::Default
    } else {
        NumBatch::Inexpressible
    }
}

/// A Modelfile's PARAMETER lines for a whole-layer placement (Ollama has
/// no tensor overrides or RPC devices: callers pass the placement Ollama
/// can express): layers, threads, the context of one slot, the batch size
/// where Ollama can take it.
#[must_use]
pub fn modelfile_lines(p: &Placement) -> Vec<String> {
    let mut v = vec![format!("PARAMETER num_gpu {}", p.n_gpu_layers), format!("PARAMETER num_thread {}", p.n_threads)];
    if let Some(c) = num_ctx(p) {
        v.push(format!("PARAMETER num_ctx {c}"));
    }
    match num_batch(p) {
        NumBatch::Num(b) => v.push(format!("PARAMETER num_batch {b}")),
        NumBatch::Default => {}
        NumBatch::Inexpressible => v.push(format!(
            "# measured with -b {} -ub {}; Ollama passes num_batch as both, so it cannot run these: tune with -b N --ubatch-size N for Ollama",
            p.n_batch, p.n_ubatch
        )),
    }
    if let Some(n) = draft_num_predict(p) {
        v.push(format!("PARAMETER draft_num_predict {n}"));
    }
    v
}

/// Ollama's `draft_num_predict` for a placement that drafts with the
/// model's own MTP heads: Ollama then starts llama-server with
/// `--spec-type draft-mtp --spec-draft-n-max N` (llm/llama_server.go,
/// `appendDraftArgs`; server/routes.go leaves it 0, MTP off, unless a
/// Modelfile or request sets it). A draft model Ollama runs only as
/// draft-mtp or draft-dflash, never as draft-simple: `None`.
#[must_use]
pub fn draft_num_predict(p: &Placement) -> Option<u32> {
    p.draft.as_ref().filter(|d| d.is_mtp()).map(|d| d.n_max)
}

/// The Ollama server settings a placement needs: they live in the
/// server's environment and apply to every model it runs (the KV cache
/// type, flash attention, parallel slots).
#[must_use]
pub fn server_settings(p: &Placement) -> Vec<String> {
    let mut v = Vec::new();
    if p.kv_type.is_quantized() {
        v.push(format!("OLLAMA_KV_CACHE_TYPE={}", p.kv_type.as_str()));
    }
    match (p.kv_type.is_quantized(), p.flash_attn) {
        (true, _) | (false, FlashAttn::On) => v.push("OLLAMA_FLASH_ATTENTION=1".into()),
        (false, FlashAttn::Off) => v.push("OLLAMA_FLASH_ATTENTION=0".into()),
        (false, FlashAttn::Auto) => {}
    }
    if p.n_parallel > 1 {
        v.push(format!("OLLAMA_NUM_PARALLEL={}", p.n_parallel));
    }
    // server/sched.go (selectLlamaServerPlacement, bestSingleGPUFit): on
    // several GPUs Ollama runs a model on one (--split-mode none) wherever
    // its prediction is under 80% of that GPU's free memory; a placement
    // tuned over several only runs as tuned where Ollama spreads it.
    if local_gpus(p) >= 2 {
        v.push("OLLAMA_SCHED_SPREAD=1".into());
    }
    v
}

/// How many of this machine's GPUs a placement puts layers on (RPC
/// servers are not Ollama's; 0 where it cannot tell: llama.cpp's own
/// order with servers in it).
fn local_gpus(p: &Placement) -> usize {
    if p.n_gpu_layers == 0 {
        return 0;
    }
    let holds = |i: usize| p.tensor_split.get(i).is_none_or(|l| *l > 0);
    if p.devices.is_empty() {
        return if p.rpc.is_empty() { p.tensor_split.iter().filter(|l| **l > 0).count() } else { 0 };
    }
    p.devices.iter().enumerate().filter(|(i, d)| !d.starts_with("RPC") && holds(*i)).count()
}

/// The Ollama server as the consumer: its environment, found or not (its
/// defaults then).
pub struct Ollama {
    pub env: ServerEnv,
}

impl Ollama {
    /// The server's environment: `--ollama-env FILE`, else the `ollama`
    /// systemd unit's, else none.
    ///
    /// # Errors
    /// As [`server_env`].
    pub fn read(file: Option<&Path>) -> anyhow::Result<Ollama> {
        Ok(Ollama { env: server_env(file)? })
    }
}

impl super::Consumer for Ollama {
    fn program(&self) -> super::Program {
        super::Program::Ollama
    }

    fn env(&self) -> &ServerEnv {
        &self.env
    }

    /// Ollama's own and the `LLAMA_ARG_*` its llama-server inherits.
    fn vars(&self) -> Vec<(String, String)> {
        super::namespaced(&self.env, &["OLLAMA_", "LLAMA_ARG_"])
    }

    fn default_ctx(&self, hw: &crate::types::Hardware, ctx_train: u64) -> (u32, String) {
        let c = u32::try_from(ctx_here(hw, ctx_train, &|k| self.env.var(k))).unwrap_or(u32::MAX);
        (c, format!(
            "context {c}: what current Ollama gives this model here without num_ctx (4k under 23 GiB of GPU memory, 32k from 23 GiB, 256k from 47 GiB; OLLAMA_CONTEXT_LENGTH replaces the rule; at most the trained context); --ctx tunes others"
        ))
    }

    /// Parallel slots multiply each context, the KV type and flash
    /// attention are the server's, and the batch size is its rule for the
    /// context (unless `-b`/`--ubatch-size` were given).
    fn apply(
        &self,
        w: &mut super::Workload,
        arch: &str,
        _user_ctx: bool,
        cuda: &[(String, (u32, u32))],
    ) -> super::Applied {
        let defaults = w.default_batch();
        let run = run(&self.env, arch, cuda);
        let mut said = run.applied;
        if self.env.found {
            if run.parallel > 1 {
                w.into_slots(run.parallel);
            }
            if let Some(k) = run.kv_type {
                w.kv_type = k;
            }
        }
        // Its setting where found, or its device check's.
        if let Some(fa) = run.flash_attn {
            w.flash_attn = fa;
        }
        // Ollama's batch rule holds with or without its settings found.
        if defaults {
            let b = batch(w.n_ctx);
            (w.n_batch, w.n_ubatch) = (b, b);
            said.push(format!(
                "Ollama's batch size, its rule per context (-b {b} -ub {b} at {} tokens before its step-down)",
                w.n_ctx
            ));
        }
        super::Applied { said, auto_batch: defaults }
    }
}

#[cfg(test)]
mod tests;
