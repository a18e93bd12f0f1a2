//! What each of Ollama's llama-server processes holds on the card beyond
//! llama.cpp's accounting, by the backend the trials measured through.

/// What a CUDA process holds on the card beyond llama.cpp's accounting
/// (its context, cuBLAS's workspace): 451-456 MiB per RTX 4090 in the
/// breakdown of llama.cpp PR #15860, 612 MiB on a B200 in Unsloth PR #8669;
/// the larger, until a card measured here through both backends
/// (`scripts/gpu-check --backends cuda,vulkan`) says otherwise.
pub const CUDA_PROCESS_BYTES: u64 = 612 << 20;

/// The backend the trials ran through: the offload device's (`CUDA`,
/// `Vulkan`, ...), else `CPU`.
#[must_use]
pub fn measured_backend(hw: &crate::types::Hardware, device: Option<&str>) -> String {
    device
        .and_then(|d| hw.llama_devices.iter().find(|x| x.name == d))
        .map_or_else(|| "CPU".to_string(), |d| d.backend.clone())
}

/// What each of Ollama's llama-server processes holds here beyond what the
/// trials measured: [`CUDA_PROCESS_BYTES`] on an NVIDIA card measured
/// through another backend (Vulkan, RPC), else nothing (a CUDA
/// measurement's NVML reading holds its context already; no NVIDIA card,
/// no CUDA process).
#[must_use]
pub fn consumer_process_bytes(hw: &crate::types::Hardware, device: Option<&str>) -> u64 {
    let backend = measured_backend(hw, device);
    if hw.gpus.is_empty() || backend == "CUDA" || backend == "CPU" {
        0
    } else {
        CUDA_PROCESS_BYTES
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A machine with an NVIDIA card (NVML lists it) whose llama.cpp device is `device`.
    pub(crate) fn nvidia(device: &str, backend: &str) -> crate::types::Hardware {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/example-gemma-3-270m-cpu.json");
        let profile: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let mut hw: crate::types::Hardware = serde_json::from_value(profile["hardware"].clone()).unwrap();
        let gpu = serde_json::json!({"index": 0, "name": "NVIDIA H100", "uuid": "GPU-0", "driver_version": "580.1",
            "memory_total": 85_000_000_000u64, "memory_free": 84_000_000_000u64});
        hw.gpus = vec![serde_json::from_value(gpu).unwrap()];
        let dev = serde_json::json!({"index": 0, "name": device, "description": "NVIDIA H100", "backend": backend,
            "kind": "gpu", "memory_total": 85_000_000_000u64, "memory_free": 84_000_000_000u64});
        hw.llama_devices = vec![serde_json::from_value(dev).unwrap()];
        hw
    }

    /// Issue 54 item 9: a set's members each run in an Ollama llama-server
    /// of their own, so each holds CUDA's share on an NVIDIA card measured
    /// through another backend; through CUDA, or with no NVIDIA card, none.
    #[test]
    fn each_of_ollamas_processes_holds_cudas_share_where_the_trials_did_not() {
        assert_eq!(consumer_process_bytes(&nvidia("Vulkan0", "Vulkan"), Some("Vulkan0")), 612 << 20);
        assert_eq!(consumer_process_bytes(&nvidia("RPC0", "RPC"), Some("RPC0")), 612 << 20);
        assert_eq!(consumer_process_bytes(&nvidia("CUDA0", "CUDA"), Some("CUDA0")), 0);
        assert_eq!(consumer_process_bytes(&nvidia("Vulkan0", "Vulkan"), None), 0, "on the CPU: no device process");
        let mut amd = nvidia("Vulkan0", "Vulkan");
        amd.gpus.clear();
        assert_eq!(consumer_process_bytes(&amd, Some("Vulkan0")), 0, "no NVIDIA card: Ollama runs no CUDA");
    }
}
