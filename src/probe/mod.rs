//! What this machine has (GPUs, llama.cpp devices, CPU, RAM, OS), its
//! fingerprint, and sampled memory: one [`MemorySource`] seam with NVML,
//! llama.cpp's device free/total and the host as implementations, polled by
//! a [`Sampler`] thread while a trial runs.

pub mod cpu;
pub mod energy;
pub mod ggml;
pub mod host;
pub mod nvml;
pub mod rapl;

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::types::{CpuInfo, GpuInfo, Hardware, LlamaDevice, MemoryStats, RamInfo, LLAMA_CPP_REVISION};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One reading of one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceSample {
    /// "nvml0", "Vulkan0", "host".
    pub device: String,
    /// Bytes in use on the whole device (all processes).
    pub used: u64,
    pub total: u64,
    /// Bytes the trial's process holds, where the source can attribute it.
    pub pid_used: Option<u64>,
}

/// Something that can read memory in use. Sources never fail loudly while
/// sampling: a reading they cannot take is simply absent, and why is said
/// once, up front, by whoever opened the source.
pub trait MemorySource: Send {
    fn name(&self) -> crate::types::Source;
    fn sample(&mut self, pid: Option<u32>) -> Vec<DeviceSample>;
}

struct Acc {
    source: crate::types::Source,
    total: u64,
    baseline: u64,
    peak: u64,
    sum: u128,
    n: u64,
    peak_pid: Option<u64>,
}

type Shared = Arc<(Mutex<bool>, Condvar)>;

/// Polls sources on its own thread until [`Sampler::stop`].
pub struct Sampler {
    stop: Shared,
    handle: Option<JoinHandle<BTreeMap<String, Acc>>>,
}

fn record(acc: &mut BTreeMap<String, Acc>, source: crate::types::Source, samples: Vec<DeviceSample>, baseline: bool) {
    for s in samples {
        let a = acc.entry(s.device.clone()).or_insert_with(|| Acc {
            source,
            total: 0,
            baseline: 0,
            peak: 0,
            sum: 0,
            n: 0,
            peak_pid: None,
        });
        a.total = s.total;
        if baseline && a.n == 0 {
            a.baseline = s.used;
        }
        a.peak = a.peak.max(s.used);
        a.sum += u128::from(s.used);
        a.n += 1;
        if let Some(p) = s.pid_used {
            a.peak_pid = Some(a.peak_pid.unwrap_or(0).max(p));
        }
    }
}

/// Samples of a later trial in a kept worker measured from the first
/// trial's baselines (taken before the worker loaded anything), so what
/// the kept model holds still counts as the trial's; `first` keeps them.
pub fn keep_first_baselines(first: &mut Vec<MemoryStats>, sampled: &mut [MemoryStats]) {
    for m in sampled.iter_mut() {
        match first.iter().find(|f| f.source == m.source && f.device == m.device) {
            Some(f) => m.baseline_used = f.baseline_used,
            None => first.push(m.clone()),
        }
    }
}

impl Sampler {
    /// Takes a baseline reading now, then samples every `interval` on a
    /// thread. `pid` is the process whose own use is attributed.
    #[must_use]
    pub fn start(mut sources: Vec<Box<dyn MemorySource>>, interval: Duration, pid: Option<u32>) -> Sampler {
        let mut acc: BTreeMap<String, Acc> = BTreeMap::new();
        for s in &mut sources {
            let name = s.name();
            record(&mut acc, name, s.sample(None), true);
        }
        let stop: Shared = Arc::new((Mutex::new(false), Condvar::new()));
        let stop2 = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let (lock, cv) = &*stop2;
            loop {
                for s in &mut sources {
                    let name = s.name();
                    record(&mut acc, name, s.sample(pid), false);
                }
                let Ok(guard) = lock.lock() else { break };
                if *guard {
                    break;
                }
                // Wakes at once when told to stop.
                let Ok((guard, _)) = cv.wait_timeout_while(guard, interval, |stopped| !*stopped) else {
                    break;
                };
                if *guard {
                    break;
                }
            }
            acc
        });
        Sampler { stop, handle: Some(handle) }
    }

    /// Stops the thread and returns per-device statistics.
    #[must_use]
    pub fn stop(mut self) -> Vec<MemoryStats> {
        self.signal();
        let acc = self.handle.take().and_then(|h| h.join().ok()).unwrap_or_default();
        acc.into_iter()
            .map(|(device, a)| MemoryStats {
                source: a.source,
                device,
                total: a.total,
                baseline_used: a.baseline,
                peak_used: a.peak,
                #[allow(clippy::cast_possible_truncation)]
                mean_used: if a.n == 0 { 0 } else { (a.sum / u128::from(a.n)) as u64 },
                peak_pid_used: a.peak_pid,
                n_samples: a.n,
            })
            .collect()
    }

    fn signal(&self) {
        let (lock, cv) = &*self.stop;
        if let Ok(mut g) = lock.lock() {
            *g = true;
        }
        cv.notify_all();
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.signal();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Backends compiled into this build.
#[must_use]
pub fn compiled_backends() -> Vec<String> {
    let mut b = Vec::new();
    if cfg!(feature = "cuda") {
        b.push("CUDA".to_string());
    }
    if cfg!(feature = "vulkan") {
        b.push("Vulkan".to_string());
    }
    if cfg!(feature = "metal") {
        b.push("Metal".to_string());
    }
    b.push("CPU".to_string());
    b
}

/// The CPU's brand string ("Intel(R) Xeon(R) Processor").
#[must_use]
pub fn cpu_brand() -> String {
    let mut s = sysinfo::System::new();
    s.refresh_cpu_all();
    s.cpus().first().map(|c| c.brand().trim().to_string()).unwrap_or_default()
}

/// Every offload device runs on the CPU (llvmpipe and friends): moving
/// work there cannot beat the CPU backend.
#[must_use]
pub fn only_software_offload(devices: &[LlamaDevice]) -> bool {
    let mut offload = devices.iter().filter(|d| d.is_offload_target()).peekable();
    offload.peek().is_some() && offload.all(LlamaDevice::is_software_renderer)
}

/// Why op offload is off by default on such a machine, in words.
#[must_use]
pub fn op_offload_note(devices: &[LlamaDevice]) -> String {
    let names: Vec<String> = devices
        .iter()
        .filter(|d| d.is_offload_target())
        .map(|d| format!("{} ({})", d.name, d.description.split(" (").next().unwrap_or(&d.description)))
        .collect();
    format!(
        "op offload off (llama.cpp: --no-op-offload): {} runs on the CPU, so moving the prompt's matrix products of CPU layers there cannot beat the CPU backend; --op-offload on measures llama.cpp's default",
        names.join(", ")
    )
}

/// The sentence for a build or machine where ngl does nothing.
#[must_use]
pub fn no_gpu_note(devices: &[LlamaDevice]) -> Option<String> {
    if devices.iter().any(LlamaDevice::is_offload_target) {
        return None;
    }
    if compiled_backends().len() == 1 {
        Some(
            "this build has no GPU backend, so ngl has no effect: rebuild with `cargo build --release --features cuda` (NVIDIA), `--features vulkan` (any Vulkan GPU) or `--features metal` (Apple)"
                .to_string(),
        )
    } else {
        Some(format!(
            "no GPU device found for the compiled backends ({}), so ngl has no effect on this machine",
            compiled_backends().join(", ")
        ))
    }
}

/// The fields that change a tuning answer, hashed: GPU models, memory and
/// driver; CPU; RAM size (GiB, so free memory does not move it); llama.cpp
/// revision; backends and their devices; RPC servers, their protocol and
/// their devices' memory.
#[must_use]
pub fn fingerprint(hw: &Hardware) -> String {
    let mut parts = Vec::new();
    for g in &hw.gpus {
        parts.push(format!(
            "gpu:{}:{}:{}",
            g.name,
            g.memory_total.unwrap_or(0),
            g.driver_version.clone().unwrap_or_default()
        ));
    }
    for d in hw.llama_devices.iter().filter(|d| d.is_offload_target()) {
        parts.push(format!("dev:{}:{}:{}", d.backend, d.description, d.memory_total));
    }
    parts.push(format!("cpu:{}:{}:{}", hw.cpu.brand, hw.cpu.physical_cores, hw.cpu.logical_cores));
    parts.push(format!("ram:{}", (hw.ram.total + (1 << 29)) >> 30));
    parts.push(format!("llama:{}", hw.llama_cpp_revision));
    parts.push(format!("backends:{}", hw.backends.join(",")));
    for r in &hw.rpc_servers {
        let devs: Vec<String> = r.devices.iter().map(|d| d.memory_total.to_string()).collect();
        parts.push(format!("rpc:{}:{}:{}", r.endpoint, r.protocol, devs.join(",")));
    }
    let mut h = Sha256::new();
    h.update(parts.join("\n").as_bytes());
    format!("{:x}", h.finalize())[..16].to_string()
}

/// A stable id of this host for the profile store: /etc/machine-id when
/// present (it survives driver updates), else the host name, hashed.
#[must_use]
pub fn machine_id() -> String {
    let raw = std::fs::read_to_string("/etc/machine-id")
        .or_else(|_| std::fs::read_to_string("/var/lib/dbus/machine-id"))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(sysinfo::System::host_name)
        .unwrap_or_else(|| "unknown-host".to_string());
    let mut h = Sha256::new();
    h.update(raw.as_bytes());
    let host = sysinfo::System::host_name().unwrap_or_default();
    let host: String = host.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').take(24).collect();
    let id = &format!("{:x}", h.finalize())[..12];
    if host.is_empty() {
        id.to_string()
    } else {
        format!("{host}-{id}")
    }
}

/// Reads again the figures other programs move, that a tune's caps start
/// from: each NVIDIA card's memory (NVML) and the host's available RAM.
/// The rest of a probe stands for the whole command.
pub fn refresh_memory(hw: &mut Hardware) {
    if let Ok(n) = nvml::open() {
        hw.gpus = nvml::gpus(&n);
    }
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    hw.ram.available = sys.available_memory();
}

/// Builds the hardware report, once a command (see [`refresh_memory`]).
/// `llama_devices` comes from the caller: the parent process of a sweep
/// must not initialize GPU backends itself (a CUDA context would take
/// device memory from the trials), so it passes what a worker reported;
/// `hw` initializes them directly.
#[must_use]
pub fn hardware(llama_devices: Vec<LlamaDevice>) -> Hardware {
    let (gpus, nvml_note) = match nvml::open() {
        Ok(n) => (nvml::gpus(&n), None),
        Err(why) => (Vec::new(), Some(why)),
    };
    let mut sys = sysinfo::System::new();
    sys.refresh_cpu_all();
    sys.refresh_memory();
    let logical = u32::try_from(sys.cpus().len()).unwrap_or(0);
    let cpu = CpuInfo {
        brand: cpu_brand(),
        physical_cores: sysinfo::System::physical_core_count().and_then(|n| u32::try_from(n).ok()).unwrap_or(logical),
        logical_cores: logical,
    };
    let cgroup_limit = sys.cgroup_limits().map(|c| c.total_memory).filter(|t| *t > 0 && *t < sys.total_memory());
    let ram = RamInfo { total: sys.total_memory(), available: sys.available_memory(), cgroup_limit };
    let mut notes = Vec::new();
    if let Some(n) = &nvml_note {
        notes.push(n.clone());
    }
    // With NVML the cap uses NVML's figures: no device falls back to accounted memory.
    if gpus.is_empty() {
        notes.extend(ggml::budget_notes(&llama_devices));
    }
    if let Some(n) = no_gpu_note(&llama_devices) {
        notes.push(n);
    }
    let mut hw = Hardware {
        machine_id: machine_id(),
        gpus,
        nvml: nvml_note,
        llama_devices,
        cpu,
        ram,
        os: sysinfo::System::long_os_version().unwrap_or_default(),
        kernel: sysinfo::System::kernel_version().unwrap_or_default(),
        llama_cpp_revision: LLAMA_CPP_REVISION.to_string(),
        backends: compiled_backends(),
        rpc_servers: Vec::new(),
        fingerprint: String::new(),
        notes,
    };
    hw.fingerprint = fingerprint(&hw);
    hw
}

/// Milliseconds since `since`.
#[must_use]
pub fn elapsed_ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        used: u64,
        calls: Arc<Mutex<u64>>,
    }

    impl MemorySource for Fake {
        fn name(&self) -> crate::types::Source {
            crate::types::Source::Ggml
        }
        fn sample(&mut self, pid: Option<u32>) -> Vec<DeviceSample> {
            *self.calls.lock().unwrap() += 1;
            self.used += 10;
            vec![DeviceSample {
                device: "dev0".into(),
                used: self.used,
                total: 1000,
                pid_used: pid.map(|_| self.used / 2),
            }]
        }
    }

    #[test]
    fn sampler_reports_baseline_peak_mean_and_stops_fast() {
        let calls = Arc::new(Mutex::new(0));
        let s = Sampler::start(
            vec![Box::new(Fake { used: 100, calls: Arc::clone(&calls) })],
            Duration::from_millis(5),
            Some(7),
        );
        std::thread::sleep(Duration::from_millis(60));
        let t = Instant::now();
        let stats = s.stop();
        assert!(elapsed_ms(t) < 50.0, "stop took {} ms", elapsed_ms(t));
        let st = &stats[0];
        assert_eq!(st.device, "dev0");
        assert_eq!(st.baseline_used, 110, "the first reading, taken before the trial");
        let n = *calls.lock().unwrap();
        assert!(n >= 3, "sampled {n} times");
        assert_eq!(st.n_samples, n);
        assert_eq!(st.peak_used, 100 + 10 * n);
        assert!(st.mean_used > st.baseline_used && st.mean_used < st.peak_used);
        assert_eq!(st.peak_pid_used, Some(st.peak_used / 2));
        assert!((st.peak_share() - st.peak_used as f64 / 1000.0).abs() < 1e-12);
    }

    #[test]
    fn a_long_interval_still_stops_within_50ms() {
        let calls = Arc::new(Mutex::new(0));
        let s = Sampler::start(vec![Box::new(Fake { used: 0, calls })], Duration::from_secs(10), None);
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        let _ = s.stop();
        assert!(elapsed_ms(t) < 50.0);
    }

    fn hw() -> Hardware {
        Hardware {
            machine_id: "m".into(),
            gpus: vec![],
            nvml: None,
            llama_devices: vec![],
            cpu: CpuInfo { brand: "X".into(), physical_cores: 2, logical_cores: 2 },
            ram: RamInfo { total: 24 << 30, available: 20 << 30, cgroup_limit: None },
            os: "Debian".into(),
            kernel: "6".into(),
            llama_cpp_revision: "r1".into(),
            backends: vec!["CPU".into()],
            rpc_servers: vec![],
            fingerprint: String::new(),
            notes: vec![],
        }
    }

    #[test]
    fn fingerprint_moves_with_what_changes_answers_only() {
        let base = fingerprint(&hw());
        assert_eq!(base.len(), 16);
        let mut free = hw();
        free.ram.available = 1;
        assert_eq!(fingerprint(&free), base, "free memory does not change the fingerprint");
        let mut drv = hw();
        drv.gpus.push(GpuInfo {
            index: 0,
            name: "NVIDIA H200".into(),
            uuid: "GPU-1".into(),
            driver_version: Some("570.1".into()),
            memory_total: Some(140 << 30),
            memory_free: None,
            pcie_gen_current: None,
            pcie_gen_max: None,
            pcie_width_current: None,
            pcie_width_max: None,
            memory_bus_width_bits: None,
            memory_clock_max_mhz: None,
            bandwidth_gbs: None,
            cuda_compute: None,
        });
        let with_gpu = fingerprint(&drv);
        assert_ne!(with_gpu, base);
        drv.gpus[0].driver_version = Some("575.2".into());
        assert_ne!(fingerprint(&drv), with_gpu, "a driver update changes it");
        let mut rev = hw();
        rev.llama_cpp_revision = "r2".into();
        assert_ne!(fingerprint(&rev), base);
        let mut remote = hw();
        let dev = crate::types::RpcDevice { index: 0, memory_total: 8 << 30, memory_free: 1 };
        let server = crate::types::RpcServer {
            endpoint: "10.0.0.2:50052".into(),
            protocol: "7.0.0".into(),
            devices: vec![dev],
            rtt_ms: 0.2,
            bandwidth: None,
        };
        remote.rpc_servers.push(server);
        let with_rpc = fingerprint(&remote);
        assert_ne!(with_rpc, base);
        remote.rpc_servers[0].devices[0].memory_free = 2;
        remote.rpc_servers[0].rtt_ms = 3.0;
        remote.rpc_servers[0].bandwidth = Some(crate::types::Bandwidth { up_mb_s: 100.0, down_mb_s: 90.0 });
        assert_eq!(fingerprint(&remote), with_rpc, "free memory, the round trip and the bandwidth do not change it");
        remote.rpc_servers[0].devices[0].memory_total = 16 << 30;
        assert_ne!(fingerprint(&remote), with_rpc, "a changed remote device does");
    }
}
