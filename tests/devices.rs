//! `hw`, sampled and accounted memory, and real offload to llvmpipe (vulkan build).
mod common;

use common::*;

const VK: (&str, &str) = ("GGML_VK_VISIBLE_DEVICES", "0");

#[test]
fn hw_reports_cpu_ram_devices_and_why_there_is_no_nvml() {
    let o = run_env(&["hw"], &[VK]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = stdout(&o);
    for needle in ["cpu ", "ram ", "devices", "CPU", "fingerprint", "llama-cpp-sys-2 0.1.160"] {
        assert!(t.contains(needle), "hw lacks {needle}: {t}");
    }
    // These machines have no NVIDIA driver: the reason is said in words.
    assert!(t.contains("NVML not available (libnvidia-ml.so.1 not found"), "{t}");
    if cfg!(feature = "vulkan") {
        assert!(t.contains("llvmpipe"), "{t}");
        assert!(t.contains("Vulkan0 (llvmpipe) reports no memory budget: using llama.cpp's accounted memory"), "{t}");
    } else {
        assert!(t.contains("this build has no GPU backend, so ngl has no effect"), "{t}");
        assert!(t.contains("--features cuda"), "{t}");
    }
}

#[test]
fn hw_json_is_stable() {
    let a = run_env(&["hw", "--json"], &[VK]);
    assert!(a.status.success(), "{}", stderr(&a));
    let v: serde_json::Value = serde_json::from_str(&stdout(&a)).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "backends",
            "cpu",
            "fingerprint",
            "gpus",
            "kernel",
            "llama_cpp_revision",
            "llama_devices",
            "machine_id",
            "notes",
            "nvml",
            "os",
            "ram"
        ]
    );
    assert!(v["cpu"]["physical_cores"].as_u64().unwrap() >= 1);
    assert!(v["ram"]["total"].as_u64().unwrap() > 1 << 30);
    assert_eq!(v["fingerprint"].as_str().unwrap().len(), 16);
    let devs = v["llama_devices"].as_array().unwrap();
    assert!(devs.iter().any(|d| d["kind"] == "cpu"));
    // Same machine, same answer.
    let b = run_env(&["hw", "--json"], &[VK]);
    let w: serde_json::Value = serde_json::from_str(&stdout(&b)).unwrap();
    assert_eq!(v["fingerprint"], w["fingerprint"]);
    assert_eq!(v["machine_id"], w["machine_id"]);
}

#[test]
fn bench_rows_carry_host_rss_and_the_memory_source() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 4);
    let o = run(&["bench", m.to_str().unwrap(), "-ngl", "0", "-p", "8", "-n", "4", "-r", "1", "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&o)).unwrap();
    for r in &rows {
        assert!(r["peak_host_rss_bytes"].as_u64().unwrap() > 1 << 20, "{r}");
        // No NVIDIA and no device with a memory budget here.
        assert_eq!(r["memory_source"], "accounted");
        assert!(r["sampled_peak_device_bytes"].is_null());
    }
    assert!(stderr(&o).contains("note: NVML not available"), "said once: {}", stderr(&o));
    assert_eq!(stderr(&o).matches("NVML not available").count(), 1);
}

fn inspect_json(m: &str) -> serde_json::Value {
    let o = run(&["inspect", m, "--json"]);
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// Offloaded tensor bytes at `ngl` from `inspect`: the output layer first, then
/// the last ngl-1 repeating layers.
fn expected_offload(info: &serde_json::Value, ngl: usize) -> u64 {
    let layers: Vec<u64> = info["layer_bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect();
    if ngl == 0 {
        return 0;
    }
    let rep = (ngl - 1).min(layers.len());
    layers[layers.len() - rep..].iter().sum::<u64>() + info["output_bytes"].as_u64().unwrap()
}

fn offload_rows(model: &str, ngl: &str) -> Vec<serde_json::Value> {
    let o = run_env(&["bench", model, "-ngl", ngl, "-p", "8", "-n", "2", "-r", "1", "-t", "2", "-o", "json"], &[VK]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&o)).unwrap();
    rows.into_iter().filter(|r| r["n_gen"] == 0).collect()
}

#[test]
#[cfg_attr(not(feature = "vulkan"), ignore = "needs the vulkan build (scripts/test builds it)")]
fn llvmpipe_offload_of_gemma_matches_inspect() {
    let _heavy = heavy();
    let m = real_model();
    let m = m.to_str().unwrap();
    let info = inspect_json(m);
    let rows = offload_rows(m, "0,10,19");
    let off: Vec<(u64, u64)> =
        rows.iter().map(|r| (r["layers_offloaded"].as_u64().unwrap(), r["layers_total"].as_u64().unwrap())).collect();
    assert_eq!(off, [(0, 19), (10, 19), (19, 19)]);
    let acc: Vec<u64> = rows.iter().map(|r| r["accounted_device_bytes"].as_u64().unwrap()).collect();
    assert!(acc[0] < acc[1] && acc[1] < acc[2], "accounted device memory rises with ngl: {acc:?}");
    let model_bytes: Vec<u64> = rows.iter().map(|r| r["model_device_bytes"].as_u64().unwrap()).collect();
    for (i, ngl) in [0usize, 10, 19].iter().enumerate() {
        let want = expected_offload(&info, *ngl) as f64;
        let rise = (model_bytes[i] - model_bytes[0]) as f64;
        if *ngl == 0 {
            assert_eq!(model_bytes[0], 0);
        } else {
            assert!((rise - want).abs() / want < 0.02, "ngl {ngl}: model buffer rise {rise} vs inspect {want}");
        }
    }
    for r in &rows {
        assert_eq!(r["memory_source"], "accounted", "llvmpipe has no budget: {r}");
    }
}

#[test]
#[cfg_attr(not(feature = "vulkan"), ignore = "needs the vulkan build (scripts/test builds it)")]
fn llvmpipe_offload_of_synthetic_40_layers_matches_inspect() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 40);
    let m = m.to_str().unwrap();
    let info = inspect_json(m);
    let rows = offload_rows(m, "0,1,20,41");
    let off: Vec<u64> = rows.iter().map(|r| r["layers_offloaded"].as_u64().unwrap()).collect();
    assert_eq!(off, [0, 1, 20, 41]);
    for r in &rows {
        let ngl = r["n_gpu_layers"].as_u64().unwrap() as usize;
        let want = expected_offload(&info, ngl);
        let got = r["model_device_bytes"].as_u64().unwrap();
        let diff = (got as f64 - want as f64).abs();
        assert!(diff <= 0.02 * want as f64 + 16384.0, "ngl {ngl}: device model buffer {got} vs inspect {want}");
    }
}

#[test]
#[cfg_attr(not(feature = "vulkan"), ignore = "needs the vulkan build (scripts/test builds it)")]
fn hidden_vulkan_device_means_no_gpu() {
    let o = run_env(&["hw"], &[("GGML_VK_VISIBLE_DEVICES", "")]);
    let t = stdout(&o);
    assert!(!t.contains("llvmpipe"), "{t}");
    assert!(t.contains("no GPU device found for the compiled backends"), "{t}");
}
