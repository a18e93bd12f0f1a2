//! The machine: GPUs, llama.cpp's devices, CPU, RAM, contention, RPC servers.

use serde::{Deserialize, Serialize};

/// One NVIDIA GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub driver_version: Option<String>,
    pub memory_total: Option<u64>,
    pub memory_free: Option<u64>,
    pub pcie_gen_current: Option<u32>,
    pub pcie_gen_max: Option<u32>,
    pub pcie_width_current: Option<u32>,
    pub pcie_width_max: Option<u32>,
    pub memory_bus_width_bits: Option<u32>,
    pub memory_clock_max_mhz: Option<u32>,
    /// Theoretical memory bandwidth (GB/s) from bus width and memory clock.
    pub bandwidth_gbs: Option<f64>,
    /// CUDA compute capability (major, minor), as NVML reports it.
    #[serde(default)]
    pub cuda_compute: Option<(u32, u32)>,
}

/// What kind of device ggml says a backend device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Cpu,
    Gpu,
    /// An integrated GPU (sharing the host's memory).
    Igpu,
    Accel,
    #[serde(other)]
    Unknown,
}

impl DeviceKind {
    /// ggml's word for it, as the `hw` report prints it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
            DeviceKind::Igpu => "igpu",
            DeviceKind::Accel => "accel",
            DeviceKind::Unknown => "unknown",
        }
    }
}

/// One llama.cpp (ggml) backend device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaDevice {
    pub index: usize,
    pub name: String,
    pub description: String,
    pub backend: String,
    pub kind: DeviceKind,
    pub memory_total: u64,
    pub memory_free: u64,
}

impl LlamaDevice {
    #[must_use]
    pub fn is_offload_target(&self) -> bool {
        matches!(self.kind, DeviceKind::Gpu | DeviceKind::Igpu)
    }

    /// A device of a llama.cpp RPC server (its description is the endpoint).
    #[must_use]
    pub fn is_remote(&self) -> bool {
        self.backend == "RPC"
    }

    /// A Vulkan implementation that runs on the CPU (Mesa's llvmpipe and
    /// lavapipe, Google's SwiftShader): ggml lists it as a GPU, but
    /// offloading to it cannot beat the CPU backend.
    #[must_use]
    pub fn is_software_renderer(&self) -> bool {
        let d = self.description.to_ascii_lowercase();
        ["llvmpipe", "lavapipe", "swiftshader"].iter().any(|n| d.contains(n))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuInfo {
    pub brand: String,
    pub physical_cores: u32,
    pub logical_cores: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RamInfo {
    pub total: u64,
    pub available: u64,
    /// Memory limit of this process's cgroup, when one is set.
    pub cgroup_limit: Option<u64>,
}

/// The `hw` report. Stable, documented JSON (see README).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hardware {
    /// Stable id of this host (survives driver updates); the profile store's directory.
    pub machine_id: String,
    pub gpus: Vec<GpuInfo>,
    /// Why there is no NVML data, when there is none.
    pub nvml: Option<String>,
    pub llama_devices: Vec<LlamaDevice>,
    pub cpu: CpuInfo,
    pub ram: RamInfo,
    pub os: String,
    pub kernel: String,
    pub llama_cpp_revision: String,
    /// Backends compiled into this build: "CPU", "Vulkan", "CUDA", "Metal".
    pub backends: Vec<String>,
    /// llama.cpp RPC servers whose devices join this machine's (`--rpc`),
    /// as they answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rpc_servers: Vec<RpcServer>,
    /// Short hash of what changes a tuning answer.
    pub fingerprint: String,
    /// Plain-words notes about missing or untrustworthy sources.
    pub notes: Vec<String>,
}

/// A process that used CPU while a trial ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BusyProcess {
    pub pid: u32,
    pub name: String,
    /// Cores' worth of CPU it used on average over the trial.
    pub cores: f64,
}

/// What other processes took while a trial ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Contention {
    /// Cores' worth of CPU that other processes used, on average over the
    /// trial and at the busiest half second.
    pub others_cores_mean: f64,
    pub others_cores_peak: f64,
    /// The same as a share of the machine's CPU time (all logical cores).
    pub others_share_mean: f64,
    pub others_share_peak: f64,
    pub logical_cores: u32,
    /// Largest 1-minute load average seen (it counts the trial's own threads).
    pub load_avg_1m: Option<f64>,
    /// The processes that took the most CPU, at most three.
    pub top: Vec<BusyProcess>,
    /// GPU utilization (percent) before the worker started, and the other
    /// processes holding GPU memory then (NVIDIA, through NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_util_before_pct: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_others: Vec<GpuProcess>,
    /// Others used more than `threshold_cores`, or the GPU was busy before the trial.
    pub contended: bool,
    pub threshold_cores: f64,
    /// The trial was measured again after a contended first attempt; this
    /// is the second attempt, and `first_others_cores` what the first saw.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repeated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_others_cores: Option<f64>,
    /// The CPU quota (a cgroup's `cpu.max`) the measurement ran in, in
    /// cores: a container's limit, the rig's host. Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_cores: Option<f64>,
}

/// Another process on the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub bytes: Option<u64>,
}

impl Contention {
    /// "cc1plus (pid 123) 0.95 cores, make (pid 99) 0.10 cores".
    #[must_use]
    pub fn top_words(&self) -> String {
        self.top
            .iter()
            .map(|p| format!("{} (pid {}) {:.2} cores", p.name, p.pid, p.cores))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Cores the trial could have had to itself, on average: what others
    /// left of the machine, at most its CPU quota.
    #[must_use]
    pub fn free_cores(&self) -> f64 {
        let left = self.left_by_others();
        self.quota_cores.map_or(left, |q| left.min(q))
    }

    /// The quota, where it (not other processes) is what limited the trial.
    #[must_use]
    pub fn binding_quota(&self) -> Option<f64> {
        self.quota_cores.filter(|q| *q <= self.left_by_others())
    }

    /// Cores other processes left of the machine, on average.
    fn left_by_others(&self) -> f64 {
        (f64::from(self.logical_cores) - self.others_cores_mean).max(0.0)
    }
}

/// One device of an RPC server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcDevice {
    /// The server's device index (the `N` of llama.cpp's `RPC<N>[host:port]` buffers is a client-wide count).
    pub index: u32,
    pub memory_total: u64,
    pub memory_free: u64,
}

/// What one server answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcServer {
    pub endpoint: String,
    /// Its RPC protocol version ("7.0.0").
    pub protocol: String,
    pub devices: Vec<RpcDevice>,
    /// Median round trip of a small request, in milliseconds.
    pub rtt_ms: f64,
    /// The link's bandwidth (MB/s) to the server and back, the best of a
    /// few 4 MiB tensor copies to its first device and from it; absent
    /// where not measured (a device that would not hold the buffer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Bandwidth>,
}

/// A link's bandwidth both ways (MB/s, 10^6 bytes a second).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bandwidth {
    pub up_mb_s: f64,
    pub down_mb_s: f64,
}

impl Bandwidth {
    /// Milliseconds to send `bytes` one way and back (there at the upload
    /// rate, back at the download rate).
    #[must_use]
    pub fn there_and_back_ms(&self, bytes: f64) -> f64 {
        bytes / (self.up_mb_s * 1e3) + bytes / (self.down_mb_s * 1e3)
    }
}
