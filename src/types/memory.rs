//! Memory readings: what llama.cpp allocated (its buffer lines) and what a device reported.

use serde::{Deserialize, Serialize};

/// Bytes per name, in the order the names first come, the bytes of one
/// name combined by `merge` (a sum, or the largest).
#[must_use]
pub fn merge_by_name(items: impl IntoIterator<Item = (String, u64)>, merge: fn(u64, u64) -> u64) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for (name, bytes) in items {
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => *v = merge(*v, bytes),
            None => out.push((name, bytes)),
        }
    }
    out
}

/// One "<buffer type> <kind> buffer size = N MiB" line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BufferLine {
    /// llama.cpp's buffer type name: "CPU_Mapped", "Vulkan0", "CUDA_Host", ...
    pub buffer_type: String,
    /// "model", "KV", "compute", "output", "RS", ...
    pub kind: String,
    pub bytes: u64,
}

impl BufferLine {
    /// True for memory that lives on an accelerator (not host or pinned host memory).
    #[must_use]
    pub fn on_device(&self) -> bool {
        is_device_buffer_type(&self.buffer_type)
    }
}

#[must_use]
pub fn is_device_buffer_type(name: &str) -> bool {
    !(name.starts_with("CPU") || name.ends_with("_Host") || name.is_empty())
}

/// Where a memory figure comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// NVIDIA's management library: device-wide and per process.
    Nvml,
    /// llama.cpp's device free/total (devices with a memory budget).
    Ggml,
    /// The machine's RAM and the worker's resident set.
    Host,
    /// What llama.cpp itself allocated, from its log.
    Accounted,
    /// No GPU device: nothing to measure.
    None,
}

impl Source {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Nvml => "nvml",
            Source::Ggml => "ggml",
            Source::Host => "host",
            Source::Accounted => "accounted",
            Source::None => "none",
        }
    }

    /// A sampler that sees what the device holds (not llama.cpp's own accounting).
    #[must_use]
    pub fn is_sampled(self) -> bool {
        matches!(self, Source::Nvml | Source::Ggml)
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Baseline, peak and mean of one device over a trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryStats {
    pub source: Source,
    pub device: String,
    pub total: u64,
    /// Used before the trial started.
    pub baseline_used: u64,
    pub peak_used: u64,
    pub mean_used: u64,
    /// Peak bytes held by the trial's process, where attributable.
    pub peak_pid_used: Option<u64>,
    pub n_samples: u64,
}

impl MemoryStats {
    /// Peak use as a share of the device's total.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn peak_share(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.peak_used as f64 / self.total as f64
        }
    }
}
