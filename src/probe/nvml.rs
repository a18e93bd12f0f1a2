//! NVIDIA devices through NVML (`nvml-wrapper`), loaded at run time so every
//! build can read NVIDIA memory. What NVML cannot tell is said in words.

use nvml_wrapper::enum_wrappers::device::Clock;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::Nvml;

use super::{DeviceSample, GpuInfo, MemorySource};

/// Opens NVML: the plain library name first, then `libnvidia-ml.so.1`,
/// which is all that some drivers install.
///
/// # Errors
/// A sentence saying why NVML is not available.
pub fn open() -> Result<Nvml, String> {
    match Nvml::init() {
        Ok(n) => Ok(n),
        Err(first) => match Nvml::builder().lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1")).init() {
            Ok(n) => Ok(n),
            Err(second) => Err(describe_init_error(&first, &second)),
        },
    }
}

/// "NVML not available (libnvidia-ml.so.1 not found)" and friends.
#[must_use]
pub fn describe_init_error(first: &NvmlError, second: &NvmlError) -> String {
    let is_missing = |e: &NvmlError| matches!(e, NvmlError::LibloadingError(_));
    if is_missing(first) && is_missing(second) {
        return "NVML not available (libnvidia-ml.so.1 not found: no NVIDIA driver on this machine)".to_string();
    }
    let e = if is_missing(second) { first } else { second };
    match e {
        NvmlError::DriverNotLoaded => "NVML not available (the NVIDIA driver is not loaded)".to_string(),
        NvmlError::NoPermission => "NVML not available (no permission to talk to the NVIDIA driver)".to_string(),
        NvmlError::FailedToLoadSymbol(s) => {
            format!("NVML not available (libnvidia-ml lacks symbol {s}: driver too old?)")
        }
        other => format!("NVML not available ({other})"),
    }
}

/// Bytes one process holds on a device, from NVML's process lists. A process
/// can appear in both the compute and graphics lists; count it once (the
/// larger figure, as nvidia-smi shows).
#[must_use]
pub fn pid_used(compute: &[ProcessInfo], graphics: &[ProcessInfo], pid: u32) -> Option<u64> {
    let of = |list: &[ProcessInfo]| {
        list.iter()
            .filter(|p| p.pid == pid)
            .filter_map(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            })
            .max()
    };
    match (of(compute), of(graphics)) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0).max(b.unwrap_or(0))),
    }
}

/// Theoretical memory bandwidth in GB/s from bus width (bits) and the
/// maximum memory clock (MHz); GDDR and HBM transfer twice per clock.
#[must_use]
pub fn bandwidth_gbs(bus_width_bits: u32, mem_clock_mhz: u32) -> f64 {
    f64::from(bus_width_bits) / 8.0 * f64::from(mem_clock_mhz) * 1e6 * 2.0 / 1e9
}

/// Everything `hw` reports per NVIDIA GPU. Fields NVML refuses are `None`.
#[must_use]
pub fn gpus(nvml: &Nvml) -> Vec<GpuInfo> {
    let Ok(n) = nvml.device_count() else {
        return Vec::new();
    };
    let driver = nvml.sys_driver_version().ok();
    (0..n)
        .filter_map(|i| nvml.device_by_index(i).ok().map(|d| (i, d)))
        .map(|(i, d)| {
            let mem = d.memory_info().ok();
            let bus = d.memory_bus_width().ok();
            let clock = d.max_clock_info(Clock::Memory).ok();
            GpuInfo {
                index: i,
                name: d.name().unwrap_or_default(),
                uuid: d.uuid().unwrap_or_default(),
                driver_version: driver.clone(),
                memory_total: mem.as_ref().map(|m| m.total),
                memory_free: mem.as_ref().map(|m| m.free),
                pcie_gen_current: d.current_pcie_link_gen().ok(),
                pcie_gen_max: d.max_pcie_link_gen().ok(),
                pcie_width_current: d.current_pcie_link_width().ok(),
                pcie_width_max: d.max_pcie_link_width().ok(),
                memory_bus_width_bits: bus,
                memory_clock_max_mhz: clock,
                bandwidth_gbs: bus.zip(clock).map(|(b, c)| bandwidth_gbs(b, c)),
                cuda_compute: d
                    .cuda_compute_capability()
                    .ok()
                    .and_then(|c| Some((u32::try_from(c.major).ok()?, u32::try_from(c.minor).ok()?))),
            }
        })
        .collect()
}

/// The GPUs' power around a timed test, device-wide (all processes, as
/// the memory): NVML's total energy counter of every device before and
/// after, over the seconds between; where a device has no counter (before
/// Volta), the mean of its power read before and after.
pub struct EnergyMeter {
    nvml: Nvml,
}

/// A reading the meter started a span with.
pub struct EnergySpan {
    t0: std::time::Instant,
    /// The devices read (NVML's indices): those this process runs on.
    pub devices: Vec<u32>,
    energy_mj: Option<u64>,
    power_mw: u64,
}

/// The devices a process runs on, by the processes each device lists
/// (`listed[i]`: device i's compute and graphics processes): those that
/// list `me`; every device where none does (a driver that lists no
/// processes, as in containers without the host's PID namespace).
fn used_by(listed: &[Vec<u32>], me: u32) -> Vec<u32> {
    let all = (0..listed.len()).filter_map(|i| u32::try_from(i).ok());
    let mine: Vec<u32> = all.clone().filter(|&i| listed[i as usize].contains(&me)).collect();
    if mine.is_empty() {
        all.collect()
    } else {
        mine
    }
}

impl EnergyMeter {
    /// `None` where NVML is not available (no NVIDIA driver): nothing to meter.
    #[must_use]
    pub fn open() -> Option<Self> {
        open().ok().filter(|n| n.device_count().is_ok_and(|c| c > 0)).map(|nvml| EnergyMeter { nvml })
    }

    /// The devices this process (the trial's worker, its model loaded)
    /// runs on: an idle card beside it draws its own power, which is not
    /// this placement's (an 8-GPU node's idle cards once added ~500 W to
    /// every setting).
    fn ours(&self) -> Vec<u32> {
        let n = self.nvml.device_count().unwrap_or(0);
        let listed: Vec<Vec<u32>> = (0..n)
            .map(|i| {
                self.nvml.device_by_index(i).map_or_else(
                    |_| Vec::new(),
                    |d| {
                        let compute = d.running_compute_processes().unwrap_or_default();
                        let graphics = d.running_graphics_processes().unwrap_or_default();
                        compute.iter().chain(&graphics).map(|p| p.pid).collect()
                    },
                )
            })
            .collect();
        used_by(&listed, std::process::id())
    }

    /// `devices`' energy counters summed (`None` if one has none), and their power now.
    fn read(&self, devices: &[u32]) -> (Option<u64>, u64) {
        let devices: Vec<_> = devices.iter().filter_map(|&i| self.nvml.device_by_index(i).ok()).collect();
        let energy = devices.iter().map(|d| d.total_energy_consumption().ok()).sum::<Option<u64>>();
        (energy, devices.iter().filter_map(|d| d.power_usage().ok()).map(u64::from).sum())
    }

    #[must_use]
    pub fn start(&self) -> EnergySpan {
        self.start_on(self.ours())
    }

    /// A span on `devices` (those a span before found: the process lists
    /// are not read again for every timed section).
    #[must_use]
    pub fn start_on(&self, devices: Vec<u32>) -> EnergySpan {
        let (energy_mj, power_mw) = self.read(&devices);
        EnergySpan { t0: std::time::Instant::now(), devices, energy_mj, power_mw }
    }

    /// Mean power (W) of the span's devices since it started; `None` when
    /// nothing could be read.
    #[must_use]
    pub fn watts(&self, span: &EnergySpan) -> Option<f64> {
        self.joules(span).map(|(j, s)| j / s)
    }

    /// The energy (J) of the span's devices since it started (their
    /// counters, else the mean of the power read at each end over the
    /// time), and the seconds since; `None` when nothing could be read.
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn joules(&self, span: &EnergySpan) -> Option<(f64, f64)> {
        let (energy, power) = self.read(&span.devices);
        let secs = span.t0.elapsed().as_secs_f64();
        if secs <= 0.0 {
            return None;
        }
        match (span.energy_mj, energy) {
            (Some(a), Some(b)) if b >= a => Some(((b - a) as f64 / 1000.0, secs)),
            _ if span.power_mw + power > 0 => Some(((span.power_mw + power) as f64 / 2.0 / 1000.0 * secs, secs)),
            _ => None,
        }
    }
}

/// Sampled memory from NVML: device-wide used/total and the worker's own use.
pub struct NvmlSource {
    nvml: Nvml,
}

impl NvmlSource {
    /// # Errors
    /// Why NVML cannot be opened.
    pub fn open() -> Result<Self, String> {
        open().map(|nvml| NvmlSource { nvml })
    }
}

impl NvmlSource {
    /// See [`busy_before`].
    #[must_use]
    pub fn busy_before(&self, except: &[u32]) -> (Option<u32>, Vec<crate::types::GpuProcess>) {
        busy_before(&self.nvml, except)
    }
}

impl MemorySource for NvmlSource {
    fn name(&self) -> crate::types::Source {
        crate::types::Source::Nvml
    }

    fn sample(&mut self, pid: Option<u32>) -> Vec<DeviceSample> {
        let Ok(n) = self.nvml.device_count() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for i in 0..n {
            let Ok(d) = self.nvml.device_by_index(i) else {
                continue;
            };
            let Ok(m) = d.memory_info() else { continue };
            let pid_bytes = pid.and_then(|p| {
                let compute = d.running_compute_processes().unwrap_or_default();
                let graphics = d.running_graphics_processes().unwrap_or_default();
                pid_used(&compute, &graphics, p)
            });
            out.push(DeviceSample { device: format!("nvml{i}"), used: m.used, total: m.total, pid_used: pid_bytes });
        }
        out
    }
}

/// What else was on the NVIDIA GPUs just before a trial started: the
/// highest utilization (percent) any device reported, and the processes
/// other than `except` holding compute contexts.
#[must_use]
pub fn busy_before(nvml: &Nvml, except: &[u32]) -> (Option<u32>, Vec<crate::types::GpuProcess>) {
    let Ok(n) = nvml.device_count() else { return (None, Vec::new()) };
    let mut util: Option<u32> = None;
    let mut others = Vec::new();
    for d in (0..n).filter_map(|i| nvml.device_by_index(i).ok()) {
        if let Ok(u) = d.utilization_rates() {
            util = Some(util.unwrap_or(0).max(u.gpu));
        }
        for p in d.running_compute_processes().unwrap_or_default() {
            if !except.contains(&p.pid) {
                let bytes = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                };
                others.push(crate::types::GpuProcess { pid: p.pid, bytes });
            }
        }
    }
    (util, others)
}

#[cfg(test)]
mod tests {
    /// Power is read from the cards the worker runs on; where no card
    /// lists any process, from all of them.
    #[test]
    fn energy_is_read_from_the_devices_the_worker_runs_on() {
        let listed = vec![vec![7, 1], vec![], vec![42], vec![]];
        assert_eq!(used_by(&listed, 42), [2], "one card of four");
        assert_eq!(used_by(&[vec![42], vec![42]], 42), [0, 1], "a split over two");
        assert_eq!(used_by(&[vec![], vec![]], 42), [0, 1], "nothing listed: every card");
        assert!(used_by(&[], 42).is_empty());
    }

    use super::*;

    fn p(pid: u32, used: Option<u64>) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: used.map_or(UsedGpuMemory::Unavailable, UsedGpuMemory::Used),
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn pid_filtering_counts_the_worker_once() {
        let compute = [p(10, Some(100)), p(42, Some(5000)), p(7, Some(1))];
        let graphics = [p(42, Some(4000)), p(99, Some(8))];
        assert_eq!(pid_used(&compute, &graphics, 42), Some(5000));
        assert_eq!(pid_used(&compute, &graphics, 99), Some(8));
        assert_eq!(pid_used(&compute, &graphics, 1234), None);
        assert_eq!(pid_used(&[p(5, None)], &[], 5), None, "WDDM reports no per-process figure");
    }

    #[test]
    fn bandwidth_from_bus_and_clock() {
        // RTX 4090: 384-bit bus, 10501 MHz max memory clock -> about 1008 GB/s.
        let bw = bandwidth_gbs(384, 10501);
        assert!((bw - 1008.1).abs() < 0.5, "{bw}");
    }

    #[test]
    fn init_errors_are_sentences() {
        let lib = || NvmlError::LibloadingError(libloading_error());
        let msg = describe_init_error(&lib(), &lib());
        assert_eq!(msg, "NVML not available (libnvidia-ml.so.1 not found: no NVIDIA driver on this machine)");
        assert_eq!(
            describe_init_error(&lib(), &NvmlError::DriverNotLoaded),
            "NVML not available (the NVIDIA driver is not loaded)"
        );
        assert!(describe_init_error(&NvmlError::NoPermission, &lib()).contains("no permission"));
    }

    fn libloading_error() -> libloading::Error {
        // SAFETY: loading a library that does not exist only returns an error.
        unsafe { libloading::Library::new("libngl-tune-does-not-exist.so") }.expect_err("no such library")
    }
}
