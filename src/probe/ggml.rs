//! llama.cpp's own view of its devices (`ggml_backend_dev_memory`): device
//! list for `hw`, and a memory source for the trial worker, which already
//! holds the backend (the parent must not initialize GPU backends).

use llama_cpp_2::{list_llama_ggml_backend_devices, LlamaBackendDeviceType};

use super::{DeviceSample, LlamaDevice, MemorySource};
use crate::types::DeviceKind;

/// llama.cpp's devices, as `llama-bench --list-devices` shows them.
#[must_use]
pub fn devices() -> Vec<LlamaDevice> {
    list_llama_ggml_backend_devices()
        .into_iter()
        .map(|d| LlamaDevice {
            index: d.index,
            name: d.name,
            description: d.description,
            backend: d.backend,
            kind: match d.device_type {
                LlamaBackendDeviceType::Cpu => DeviceKind::Cpu,
                LlamaBackendDeviceType::Gpu => DeviceKind::Gpu,
                LlamaBackendDeviceType::IntegratedGpu => DeviceKind::Igpu,
                LlamaBackendDeviceType::Accelerator => DeviceKind::Accel,
                LlamaBackendDeviceType::Unknown => DeviceKind::Unknown,
            },
            memory_total: d.memory_total as u64,
            memory_free: d.memory_free as u64,
        })
        .collect()
}

/// Whether a device's free/total figures move with use (and may be
/// sampled while a trial runs: not over the network the trial measures,
/// so not for an RPC device, whose accounted memory applies). Mesa's llvmpipe
/// offers no memory budget (free always equals total), so its samples say
/// nothing; the same holds for any device reporting free == total.
#[must_use]
pub fn has_budget(d: &LlamaDevice) -> bool {
    !d.is_software_renderer() && !d.is_remote() && d.memory_free < d.memory_total
}

/// "Vulkan0 (llvmpipe) reports no memory budget: using llama.cpp's accounted memory".
#[must_use]
pub fn budget_notes(devices: &[LlamaDevice]) -> Vec<String> {
    devices
        .iter()
        .filter(|d| d.is_offload_target() && !has_budget(d))
        .map(|d| {
            let short = d.description.split_whitespace().next().unwrap_or(&d.description).trim_end_matches(',');
            if d.is_remote() {
                return format!("{} ({short}) is an RPC device: using llama.cpp's accounted memory", d.name);
            }
            format!("{} ({short}) reports no memory budget: using llama.cpp's accounted memory", d.name)
        })
        .collect()
}

/// Samples offload devices' used memory (total - free) inside the worker.
pub struct GgmlSource {
    devices: Vec<(String, usize)>,
}

impl GgmlSource {
    /// Sources for every GPU device llama.cpp sees that reports a memory
    /// budget; the others would only repeat their total.
    #[must_use]
    pub fn new() -> Self {
        let devices = devices()
            .into_iter()
            .filter(|d| d.is_offload_target() && has_budget(d))
            .map(|d| (d.name, d.index))
            .collect();
        GgmlSource { devices }
    }
}

impl Default for GgmlSource {
    fn default() -> Self {
        Self::new()
    }
}

impl MemorySource for GgmlSource {
    fn name(&self) -> crate::types::Source {
        crate::types::Source::Ggml
    }

    fn sample(&mut self, _pid: Option<u32>) -> Vec<DeviceSample> {
        self.devices
            .iter()
            .filter_map(|(name, idx)| {
                let (mut free, mut total) = (0usize, 0usize);
                // SAFETY: idx < ggml_backend_dev_count(); the out-pointers are valid locals.
                unsafe {
                    let dev = llama_cpp_sys_2::ggml_backend_dev_get(*idx);
                    if dev.is_null() {
                        return None;
                    }
                    llama_cpp_sys_2::ggml_backend_dev_memory(dev, &raw mut free, &raw mut total);
                }
                Some(DeviceSample {
                    device: name.clone(),
                    used: (total as u64).saturating_sub(free as u64),
                    total: total as u64,
                    pid_used: None,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(desc: &str, free: u64, total: u64) -> LlamaDevice {
        LlamaDevice {
            index: 1,
            name: "Vulkan0".into(),
            description: desc.into(),
            backend: "Vulkan".into(),
            kind: DeviceKind::Gpu,
            memory_total: total,
            memory_free: free,
        }
    }

    #[test]
    fn llvmpipe_and_free_equals_total_have_no_budget() {
        let pipe = dev("llvmpipe (LLVM 15.0.6, 256 bits)", 2 << 30, 2 << 30);
        assert!(!has_budget(&pipe));
        assert_eq!(
            budget_notes(&[pipe]),
            vec!["Vulkan0 (llvmpipe) reports no memory budget: using llama.cpp's accounted memory"]
        );
        assert!(has_budget(&dev("NVIDIA H200", 100 << 30, 140 << 30)));
        assert!(!has_budget(&dev("Some GPU", 8 << 30, 8 << 30)));
        let mut cpu = dev("Intel Xeon", 1, 1);
        cpu.kind = DeviceKind::Cpu;
        assert!(budget_notes(&[cpu]).is_empty(), "the CPU is not an offload target");
    }
}
