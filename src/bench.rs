//! `ngl-tune bench`: llama-bench-style measurement over a list of ngl values,
//! one worker process per value, no decision. Rows use llama-bench's field
//! names where the meaning is the same.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use crate::engine::runner::Runner;
use crate::model::{human_bytes, human_params, ModelInfo};
use crate::types::{TrialResult, TrialSpec, LLAMA_CPP_REVISION};

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub model: PathBuf,
    /// What every trial runs but its layers and experts (RPC servers probed by the caller).
    pub placement: crate::placement::Placement,
    /// The settings measured: every ngl with each expert and FFN spill.
    pub grid: Grid,
    /// Depths (`-d`); every setting is measured at each.
    pub depths: Vec<u32>,
    pub n_prompt: u32,
    pub n_gen: u32,
    pub repetitions: u32,
    pub warmup: bool,
    pub timeout: Duration,
    pub sample_interval: Duration,
    pub busy_threshold: f64,
    pub verbose: bool,
    pub progress: bool,
}

/// What a bench sweeps: each ngl with each `--n-cpu-moe` and each
/// `--n-cpu-ffn` value (an empty list is the one value 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grid {
    pub ngl: Vec<u32>,
    pub n_cpu_moe: Vec<u32>,
    pub n_cpu_ffn: Vec<u32>,
}

impl Grid {
    /// Every setting in the order measured: (ngl, experts on the CPU, FFN layers on the CPU).
    #[must_use]
    pub fn settings(&self) -> Vec<(u32, u32, u32)> {
        let or_zero = |v: &Vec<u32>| if v.is_empty() { vec![0] } else { v.clone() };
        let (moe, ffn) = (or_zero(&self.n_cpu_moe), or_zero(&self.n_cpu_ffn));
        let mut out = Vec::new();
        for &n in &self.ngl {
            for &m in &moe {
                out.extend(ffn.iter().map(|&f| (n, m, f)));
            }
        }
        out
    }
}

/// Physical cores, llama-bench's default thread count.
#[must_use]
pub fn default_threads() -> u32 {
    sysinfo::System::physical_core_count()
        .or_else(|| std::thread::available_parallelism().ok().map(std::num::NonZero::get))
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(1)
        .max(1)
}

/// The thread count a tune starts from: [`default_threads`], at most the
/// cores a CPU quota gives this process (rounded up): in a container
/// limited to half a core, two spinning threads wait on each other
/// (measured on the rig at 0.3 of a core: tg 7.4 t/s at -t 2, 18.5 at -t 1).
#[must_use]
pub fn tune_threads() -> u32 {
    let t = default_threads();
    match crate::probe::cpu::cpu_quota_cores() {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Some(q) => t.min((q.ceil() as u32).max(1)),
        None => t,
    }
}

/// Backends compiled into this build, llama-bench style ("Vulkan,CPU").
#[must_use]
pub fn compiled_backends() -> String {
    crate::probe::compiled_backends().join(",")
}

impl BenchOptions {
    pub(crate) fn spec(&self, (ngl, n_cpu_moe, n_cpu_ffn): (u32, u32, u32), n_depth: u32) -> TrialSpec {
        TrialSpec {
            model: self.model.clone(),
            placement: crate::placement::Placement {
                n_gpu_layers: ngl,
                n_cpu_moe,
                n_cpu_ffn,
                ..self.placement.clone()
            },
            n_prompt: self.n_prompt,
            n_gen: self.n_gen,
            n_depth,
            depth_cache: None,
            kv_base: crate::placement::KvType::F16,
            repetitions: self.repetitions,
            warmup: self.warmup,
            seed: 1234,
            sample_interval_ms: 20,
            race: None,
            baseline: false,
            n_streams: 1,
        }
    }
}

/// Runs every ngl value in its own worker; a failed worker is a failed row,
/// never a lost sweep. `first` sees the first trial before anything about
/// it is printed: it is also the check that llama.cpp can load the model
/// (an error there ends the run as bad input).
///
/// # Errors
/// When a worker cannot be started at all, or what `first` returns.
pub fn run(opts: &BenchOptions, mut first: impl FnMut(&TrialResult) -> Result<()>) -> Result<Vec<TrialResult>> {
    let runner = Runner::current(opts.timeout, opts.verbose)?
        .with_sample_interval(opts.sample_interval)
        .with_busy_threshold(opts.busy_threshold);
    let settings = opts.grid.settings();
    let depths = if opts.depths.is_empty() { vec![0] } else { opts.depths.clone() };
    let progress = crate::progress::Progress::new(opts.progress, (settings.len() * depths.len()) as u64);
    let mut results = Vec::new();
    // The cache filled to a depth is the same wherever the layers run: the
    // first setting fills it, the others load it (as a tune's trials do).
    let cache = depths.iter().any(|d| *d > 0).then(crate::engine::DepthCache::unless_disabled).flatten();
    for setting in settings {
        for &d in &depths {
            let at = setting_label(setting, d);
            progress.starting(at.clone());
            let spec = TrialSpec { depth_cache: cache.as_ref().map(|c| c.0.clone()), ..opts.spec(setting, d) };
            let r = runner.run_settled(&spec, |_| {})?;
            if results.is_empty() {
                first(&r)?;
            }
            let said = match r.test(false).or_else(|| r.test(true)) {
                Some(t) => format!("{at}: {} {:.2} t/s", t.name(), t.avg_ts),
                None => format!("{at}: {}", r.status.as_str()),
            };
            progress.println(said.clone());
            progress.finished(&r, said);
            results.push(r);
        }
    }
    progress.clear();
    Ok(results)
}

/// "ngl 99 moe 2 ffn 3 @ d512": the setting, the depth only where set.
fn setting_label(setting: (u32, u32, u32), depth: u32) -> String {
    let at = format!("ngl {}", setting_words(setting));
    if depth > 0 {
        format!("{at} @ d{depth}")
    } else {
        at
    }
}

/// "99 moe 2 ffn 3": the layers, and the spills only where set (the
/// progress label and the markdown's ngl column).
fn setting_words((ngl, moe, ffn): (u32, u32, u32)) -> String {
    let mut s = ngl.to_string();
    if moe > 0 {
        s += &format!(" moe {moe}");
    }
    if ffn > 0 {
        s += &format!(" ffn {ffn}");
    }
    s
}

/// One output row: a test (pp or tg) at one ngl, or a failed trial.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub build_commit: String,
    pub build_number: u32,
    pub cpu_info: String,
    pub gpu_info: String,
    pub backends: String,
    pub model_filename: String,
    pub model_type: String,
    pub model_size: u64,
    pub model_n_params: u64,
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub n_threads: u32,
    pub type_k: &'static str,
    pub type_v: &'static str,
    pub n_gpu_layers: u32,
    pub n_cpu_moe: u32,
    /// ngl-tune's: layers whose dense FFN weights stay on the CPU (`-ot`, `bench --n-cpu-ffn`).
    pub n_cpu_ffn: u32,
    /// llama-bench's fields: split mode, main device, `-ts` as "a/b/c" ("0.00": none).
    pub split_mode: &'static str,
    pub main_gpu: u32,
    pub tensor_split: String,
    /// llama-bench's `devices`: the offload devices in order ("auto": llama.cpp's own).
    pub devices: String,
    /// llama-bench's `--rpc` servers ("": none).
    pub rpc: String,
    pub flash_attn: i8,
    pub use_mmap: bool,
    pub embeddings: bool,
    pub n_prompt: u32,
    pub n_gen: u32,
    pub n_depth: u32,
    pub n_ctx: u32,
    pub test_time: String,
    pub avg_ns: Option<u64>,
    pub stddev_ns: Option<u64>,
    pub avg_ts: Option<f64>,
    pub stddev_ts: Option<f64>,
    pub samples_ns: Vec<u64>,
    pub samples_ts: Vec<f64>,
    /// ngl-tune's own fields.
    pub status: &'static str,
    pub reason: Option<String>,
    pub layers_offloaded: Option<u32>,
    pub layers_total: Option<u32>,
    pub accounted_device_bytes: u64,
    /// llama.cpp's accounted bytes per device buffer type ("RPC0[10.0.0.2:50052]", "CUDA1").
    pub accounted_bytes_by_device: std::collections::BTreeMap<String, u64>,
    pub model_device_bytes: u64,
    /// "nvml" or "ggml" when a trustworthy sampler measured device memory,
    /// "accounted" when only llama.cpp's own accounting is available.
    pub memory_source: crate::types::Source,
    /// Peak device memory in use (all processes) while the trial ran.
    pub sampled_peak_device_bytes: Option<u64>,
    pub sampled_device_total_bytes: Option<u64>,
    /// sampled_peak_device_bytes / sampled_device_total_bytes.
    pub sampled_device_share: Option<f64>,
    /// Peak device memory held by the trial's own process (NVML only).
    pub sampled_peak_pid_bytes: Option<u64>,
    pub peak_host_rss_bytes: Option<u64>,
    /// llama-bench's field: 1 when host operations stayed on the CPU.
    pub no_op_offload: u8,
    /// Cores' worth of CPU other processes used while the trial ran, and
    /// whether that made it contended (measured again, still busy).
    pub others_cpu_cores: Option<f64>,
    pub contended: bool,
    /// The projector loaded beside the model (`--mmproj`), where one was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mmproj: Option<String>,
    /// The `img` row: the fixed image ("896x896") encoded by the
    /// projector, into this many tokens; its t/s are image tokens per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_image_tokens: Option<u32>,
}

/// Flattens trial results into rows.
#[must_use]
pub fn rows(model: &ModelInfo, results: &[TrialResult], gpu_info: &str) -> Vec<Row> {
    let cpu = crate::probe::cpu_brand();
    let backends = compiled_backends();
    let time = crate::clock::now_rfc3339();
    let mut out = Vec::new();
    for r in results {
        let base = base_row(model, r, (&cpu, gpu_info, &backends, &time));
        if r.tests.is_empty() {
            for (p, g) in r.spec.tests() {
                out.push(Row { n_prompt: p, n_gen: g, ..base.clone() });
            }
            continue;
        }
        for t in &r.tests {
            out.push(Row {
                n_prompt: t.n_prompt,
                n_gen: t.n_gen,
                n_ctx: t.n_ctx,
                n_depth: t.n_depth,
                avg_ns: Some(t.avg_ns),
                stddev_ns: Some(t.stddev_ns),
                avg_ts: Some(t.avg_ts),
                stddev_ts: Some(t.stddev_ts),
                samples_ns: t.samples_ns.clone(),
                samples_ts: t.samples_ts.clone(),
                ..base.clone()
            });
        }
        if let Some(i) = &r.image {
            let t = i.as_test();
            out.push(Row {
                avg_ns: Some(t.avg_ns),
                stddev_ns: Some(t.stddev_ns),
                avg_ts: Some(t.avg_ts),
                stddev_ts: Some(t.stddev_ts),
                samples_ns: t.samples_ns,
                samples_ts: t.samples_ts,
                image: Some(format!("{}x{}", i.nx, i.ny)),
                n_image_tokens: Some(i.n_tokens),
                ..base.clone()
            });
        }
    }
    out
}

/// The row of a trial before its tests: `ctx` is (cpu, gpu, backends, time).
fn base_row(model: &ModelInfo, r: &TrialResult, ctx: (&str, &str, &str, &str)) -> Row {
    let (cpu, gpu_info, backends, time) = ctx;
    let s = &r.spec;
    let sampled = r.sampled_devices();
    let peak = sampled.iter().max_by_key(|m| m.peak_used);
    Row {
        build_commit: LLAMA_CPP_REVISION.to_string(),
        build_number: 0,
        cpu_info: cpu.to_string(),
        gpu_info: gpu_info.to_string(),
        backends: backends.to_string(),
        model_filename: s.model.display().to_string(),
        model_type: model.model_type(),
        model_size: model.file_size,
        model_n_params: model.n_params,
        n_batch: s.placement.n_batch,
        n_ubatch: s.placement.n_ubatch,
        n_threads: s.placement.n_threads,
        type_k: s.placement.kv_type.as_str(),
        type_v: s.placement.kv_type.as_str(),
        n_gpu_layers: s.placement.n_gpu_layers,
        n_cpu_moe: s.placement.n_cpu_moe,
        n_cpu_ffn: s.placement.n_cpu_ffn,
        split_mode: s.placement.split_mode.as_str(),
        main_gpu: s.placement.main_gpu,
        tensor_split: tensor_split_field(&s.placement.tensor_split),
        devices: if s.placement.devices.is_empty() { "auto".into() } else { s.placement.devices.join("/") },
        rpc: s.placement.rpc.join(","),
        flash_attn: r.flash_attn.value(),
        use_mmap: true,
        embeddings: false,
        n_prompt: 0,
        n_gen: 0,
        n_depth: s.n_depth,
        n_ctx: 0,
        test_time: time.to_string(),
        avg_ns: None,
        stddev_ns: None,
        avg_ts: None,
        stddev_ts: None,
        samples_ns: Vec::new(),
        samples_ts: Vec::new(),
        status: r.status.as_str(),
        reason: r.reason.clone(),
        layers_offloaded: r.layers_offloaded,
        layers_total: r.layers_total,
        accounted_device_bytes: r.accounted_device_bytes(),
        accounted_bytes_by_device: r.accounted_per_device().into_iter().collect(),
        model_device_bytes: r.device_model_bytes(),
        memory_source: peak.map_or(crate::types::Source::Accounted, |m| m.source),
        sampled_peak_device_bytes: peak.map(|m| m.peak_used),
        sampled_device_total_bytes: peak.map(|m| m.total),
        sampled_device_share: peak.map(|m| m.peak_share()),
        sampled_peak_pid_bytes: peak.and_then(|m| m.peak_pid_used),
        peak_host_rss_bytes: r.peak_host_rss(),
        no_op_offload: u8::from(s.placement.op_offload == crate::placement::OpOffload::Off),
        others_cpu_cores: r.contention.as_ref().map(|c| c.others_cores_mean),
        contended: r.contended(),
        mmproj: s.placement.mmproj.as_ref().map(|m| m.display().to_string()),
        image: None,
        n_image_tokens: None,
    }
}

/// llama-bench's `tensor_split` field: "10.00/31.00", "0.00" for none.
fn tensor_split_field(split: &[u32]) -> String {
    if split.is_empty() {
        return "0.00".to_string();
    }
    split.iter().map(|l| format!("{l}.00")).collect::<Vec<_>>().join("/")
}

/// llama-bench's test name: "pp512", "tg128 @ d4096".
fn test_name(r: &Row) -> String {
    if let (Some(img), Some(n)) = (&r.image, r.n_image_tokens) {
        return format!("img {img} ({n} tok)");
    }
    let base = match (r.n_prompt, r.n_gen) {
        (p, 0) => format!("pp{p}"),
        (0, g) => format!("tg{g}"),
        (p, g) => format!("pp{p}+tg{g}"),
    };
    if r.n_depth > 0 {
        format!("{base} @ d{}", r.n_depth)
    } else {
        base
    }
}

/// llama-bench's markdown table, with ngl-tune's offload and status columns.
#[must_use]
pub fn to_markdown(rows: &[Row], model: &ModelInfo) -> String {
    let mut t = crate::table::Table::new(&[
        ("model", false),
        ("size", true),
        ("params", true),
        ("backend", false),
        ("threads", true),
        ("ngl", true),
        ("offloaded", true),
        ("dev mem", true),
        ("host RSS", true),
        ("test", false),
        ("t/s", true),
        ("status", false),
    ]);
    for r in rows {
        let off = match (r.layers_offloaded, r.layers_total) {
            (Some(a), Some(b)) => format!("{a}/{b}"),
            _ => "-".to_string(),
        };
        let status = match &r.reason {
            Some(why) if r.status != "ok" => format!("{}: {why}", r.status),
            _ => r.status.to_string(),
        };
        let dev = match (r.sampled_peak_device_bytes, r.sampled_device_share) {
            (Some(b), Some(share)) => format!("{} ({:.0}%)", human_bytes(b), share * 100.0),
            _ => format!("{} acc.", human_bytes(r.accounted_device_bytes)),
        };
        t.row(vec![
            model.model_type(),
            human_bytes(r.model_size),
            human_params(r.model_n_params),
            r.backends.clone(),
            r.n_threads.to_string(),
            setting_words((r.n_gpu_layers, r.n_cpu_moe, r.n_cpu_ffn)),
            off,
            dev,
            r.peak_host_rss_bytes.map_or("-".to_string(), human_bytes),
            test_name(r),
            crate::table::speed_cell(r.avg_ts, r.stddev_ts, r.samples_ts.len()),
            status,
        ]);
    }
    t.render()
}

fn csv_field(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// llama-bench's CSV: a header, then one quoted line per row (samples left
/// out, as llama-bench does).
///
/// # Errors
/// Serialization errors.
pub fn to_csv(rows: &[Row]) -> Result<String> {
    let mut out = String::new();
    let mut header: Option<Vec<String>> = None;
    for r in rows {
        let v = serde_json::to_value(r)?;
        let obj = v.as_object().cloned().unwrap_or_default();
        let keys: Vec<String> = obj.keys().filter(|k| !k.starts_with("samples_")).cloned().collect();
        if header.is_none() {
            out.push_str(&keys.join(","));
            out.push('\n');
            header = Some(keys.clone());
        }
        let vals: Vec<String> = keys
            .iter()
            .map(|k| match &obj[k] {
                serde_json::Value::String(s) => csv_field(s),
                serde_json::Value::Null => csv_field(""),
                serde_json::Value::Bool(b) => csv_field(if *b { "1" } else { "0" }),
                other => csv_field(&other.to_string()),
            })
            .collect();
        out.push_str(&vals.join(","));
        out.push('\n');
    }
    Ok(out)
}

/// Renders rows in the named format.
///
/// # Errors
/// Serialization errors.
pub fn render(format: crate::cli::OutputFormat, rows: &[Row], model: &ModelInfo) -> Result<String> {
    use crate::cli::OutputFormat;
    Ok(match format {
        OutputFormat::Json => serde_json::to_string_pretty(rows)? + "\n",
        OutputFormat::Jsonl => {
            let mut s = String::new();
            for r in rows {
                s.push_str(&serde_json::to_string(r)?);
                s.push('\n');
            }
            s
        }
        OutputFormat::Csv => to_csv(rows)?,
        OutputFormat::Md => to_markdown(rows, model),
    })
}
