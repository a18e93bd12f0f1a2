//! The NVML path end to end, against a test double of libnvidia-ml
//! (tests/fake-nvml/libnvidia-ml.c): these machines have no NVIDIA GPU. The
//! double's numbers are not a GPU's (workers "hold" their resident memory);
//! what is checked is everything ngl-tune does with them.
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Builds the double into `dir` and returns the directory for LD_LIBRARY_PATH.
fn fake_nvml(dir: &Path) -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-nvml/libnvidia-ml.c");
    let lib = dir.join("libnvidia-ml.so.1");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(built.success(), "cc could not build {}", src.display());
    std::os::unix::fs::symlink("libnvidia-ml.so.1", dir.join("libnvidia-ml.so")).unwrap();
    dir.to_str().unwrap().to_string()
}

fn only_profile(store: &Path) -> serde_json::Value {
    let p: Vec<PathBuf> = profiles_in(store);
    assert_eq!(p.len(), 1, "{p:?}");
    serde_json::from_str(&std::fs::read_to_string(&p[0]).unwrap()).unwrap()
}

#[test]
fn hw_reads_an_nvidia_gpu_through_nvml() {
    // The double lists every running trial worker as a GPU process: none may run beside this.
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_nvml(dir.path());
    let o = run_env(&["hw", "--json"], &[("LD_LIBRARY_PATH", &lib)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let hw: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(hw["nvml"], serde_json::Value::Null, "NVML opened");
    let g = &hw["gpus"][0];
    assert_eq!(g["name"], "Fake NVML GPU (ngl-tune test double)");
    assert_eq!(g["uuid"], "GPU-00000000-0000-0000-0000-0000fa4e0001");
    assert_eq!(g["driver_version"], "999.99.01-fake");
    assert_eq!(g["memory_total"], 16u64 << 30);
    assert_eq!(g["memory_free"], (16u64 << 30) - (512 << 20), "512 MiB held by other processes");
    assert_eq!((&g["pcie_gen_current"], &g["pcie_gen_max"]), (&3.into(), &4.into()));
    assert_eq!((&g["pcie_width_current"], &g["pcie_width_max"]), (&8.into(), &16.into()));
    assert_eq!(g["bandwidth_gbs"], 512.0, "256-bit bus at 8000 MHz, two transfers a clock");
    let notes = hw["notes"].to_string();
    assert!(!notes.contains("NVML not available"), "{notes}");
}

#[test]
#[cfg_attr(not(feature = "vulkan"), ignore = "needs the vulkan build (scripts/test builds it)")]
fn the_gap_between_prediction_and_the_nvml_peak_is_in_the_profile() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_nvml(dir.path());
    let m = synth(dir.path(), 40);
    let store = dir.path().join("store");
    let args = ["--ngl", "0,10,41", "-p", "8", "-n", "4", "-r", "1", "-c", "256", "-t", "2", "--profiles"];
    let mut args: Vec<&str> = [&[m.to_str().unwrap()][..], &args[..]].concat();
    args.push(store.to_str().unwrap());
    let o = run_env(&args, &[("LD_LIBRARY_PATH", &lib), ("GGML_VK_VISIBLE_DEVICES", "0")]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}\n{out}", stderr(&o));
    let p = only_profile(&store);
    assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
    assert_eq!(p["memory"]["source"], "nvml");
    assert_eq!(p["memory"]["baseline_bytes"], 512u64 << 20, "what other processes hold is not ours");
    assert!(p["memory"]["cap_reason"].as_str().unwrap().starts_with("90% of 16.00 GiB on nvml0"), "{}", p["memory"]);
    let trials = p["trials"].as_array().unwrap();
    for t in trials.iter().filter(|t| t["role"] == "grid") {
        let nvml = t["sampled"].as_array().unwrap().iter().find(|s| s["source"] == "nvml").expect("sampled by NVML");
        let own = nvml["peak_pid_used"].as_u64().expect("the worker's own use, from NVML's process list");
        assert!(own > 0, "{nvml}");
        assert_eq!(t["mem_bytes"].as_f64().unwrap(), own as f64, "the trial costs what NVML saw the worker hold");
        let predicted = t["predicted_bytes"].as_i64().expect("llama.cpp's dry run");
        assert_eq!(
            t["sampled_minus_predicted_bytes"].as_i64().unwrap(),
            own as i64 - predicted,
            "ngl {}",
            t["spec"]["n_gpu_layers"]
        );
        assert!(t["prediction_error_pct"].as_f64().unwrap().abs() < 2.0, "{}", t["prediction_error_pct"]);
        // The double draws 150 W: its energy counter around each timed test says so.
        for x in t["tests"].as_array().unwrap() {
            let w = x["power_w"].as_f64().expect("the GPUs' power over the test");
            assert!((140.0..=160.0).contains(&w), "{w} W: {x}");
        }
    }
    assert!(
        out.contains("tg J/token (power)") && out.contains("(GPU 1") && out.contains(" W, CPU "),
        "energy per token in the table: {out}"
    );
    assert!(out.contains("sampled nvml memory minus llama.cpp's prediction: +"), "{out}");
    assert!(!stderr(&o).contains("accounted memory"), "NVML is what the cap uses: {}", stderr(&o));
}

#[test]
fn an_nvidia_gpu_without_a_gpu_backend_means_no_gpu() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_nvml(dir.path());
    let m = synth(dir.path(), 8);
    let store = dir.path().join("store");
    // NVML sees the card, but llama.cpp has no device to offload to (the
    // llvmpipe device hidden: as a CPU-only build on an NVIDIA machine).
    let o = run_env(
        &[m.to_str().unwrap(), "-p", "8", "-n", "4", "-r", "1", "-c", "256", "--profiles", store.to_str().unwrap()],
        &[("LD_LIBRARY_PATH", &lib), ("GGML_VK_VISIBLE_DEVICES", "")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let p = only_profile(&store);
    assert_eq!(p["no_gpu"], true, "ngl does nothing without a GPU backend, whatever NVML sees");
    assert!(p["trials"].as_array().unwrap().iter().all(|t| t["role"] == "threads" && t["spec"]["n_gpu_layers"] == 0));
    assert_eq!(p["recommendation"]["n_gpu_layers"], 0);
    assert!(stderr(&o).contains("so ngl has no effect"), "{}", stderr(&o));
}

#[test]
fn another_program_busy_on_the_gpu_marks_the_trial() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_nvml(dir.path());
    let m = synth(dir.path(), 2);
    let bench = |busy: Option<&str>| {
        let mut env = vec![("LD_LIBRARY_PATH", lib.as_str())];
        if let Some(u) = busy {
            env.push(("FAKE_NVML_GPU_UTIL", u));
        }
        let o =
            run_env(&["bench", m.to_str().unwrap(), "-ngl", "0", "-p", "0", "-n", "4", "-r", "1", "-o", "json"], &env);
        assert!(o.status.success(), "{}", stderr(&o));
        let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&o)).unwrap();
        (rows, stderr(&o))
    };
    // The double makes the GPU 80% busy with pid 1 before every trial.
    let (rows, err) = bench(Some("80"));
    assert!(rows.iter().all(|r| r["contended"] == true), "{rows:?}");
    assert!(err.contains("the GPU was 80% busy before trials, with pid 1 on it"), "{err}");
    // Our own worker alone on the GPU is not someone else.
    let (rows, err) = bench(Some("0"));
    assert!(!err.contains("the GPU was"), "{err}");
    assert!(rows.iter().all(|r| r["contended"] == false || r["others_cpu_cores"].as_f64().unwrap() > 0.1), "{rows:?}");
}

/// The double draws a steady 150 W: a tune for energy records it per test
/// and chooses by tokens per joule; `--max-power` under what it draws
/// leaves no offloaded setting and says why.
#[test]
#[cfg_attr(not(feature = "vulkan"), ignore = "needs the vulkan build (scripts/test builds it)")]
fn energy_is_measured_per_test_and_the_energy_objective_and_max_power_choose_by_it() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let lib = fake_nvml(dir.path());
    let m = synth(dir.path(), 8);
    // The CPU's energy through a powercap tree of the test's own (its counter still: 0 W).
    let powercap = dir.path().join("powercap");
    std::fs::create_dir_all(powercap.join("intel-rapl:0")).unwrap();
    std::fs::write(powercap.join("intel-rapl:0/energy_uj"), "1000\n").unwrap();
    let powercap = powercap.to_str().unwrap().to_string();
    let env =
        [("LD_LIBRARY_PATH", lib.as_str()), ("GGML_VK_VISIBLE_DEVICES", "0"), ("NGL_TUNE_POWERCAP", powercap.as_str())];
    let tune = |extra: &[&str], store: &Path| {
        let args = [m.to_str().unwrap(), "--ngl", "0,9", "-p", "8", "-n", "4", "-r", "1", "-c", "256", "-t", "2"];
        let args = [&args[..], extra, &["--profiles", store.to_str().unwrap()]].concat();
        let o = run_env(&args, &env);
        assert!(o.status.success(), "{}", stderr(&o));
        (stdout(&o), only_profile(store))
    };
    let (out, p) = tune(&["--objective", "energy"], &dir.path().join("energy"));
    assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
    assert_eq!(p["settings"]["objective"], "energy");
    for t in p["trials"].as_array().unwrap().iter().filter(|t| t["status"] == "ok") {
        let tg = t["tests"].as_array().unwrap().iter().find(|x| x["n_gen"].as_u64() > Some(0)).unwrap();
        assert!(tg["power_w"].as_f64().is_some_and(|w| (140.0..=160.0).contains(&w)), "{tg}");
        let j = tg["j_per_token"].as_f64().expect("joules per token");
        assert!((j - tg["power_w"].as_f64().unwrap() / tg["avg_ts"].as_f64().unwrap()).abs() < 1e-9, "{tg}");
    }
    assert!(out.contains("best energy under the"), "{out}");
    // The GPUs' power without the CPU's would make layers on the CPU look free: refused, nothing written.
    let nowhere = dir.path().join("no-powercap");
    let o = run_env(
        &[m.to_str().unwrap(), "--objective", "energy", "--profiles", dir.path().join("blind").to_str().unwrap()],
        &[env[0], env[1], ("NGL_TUNE_POWERCAP", nowhere.to_str().unwrap())],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--objective energy needs the CPU's power too"), "{}", stderr(&o));
    assert!(stderr(&o).contains("the GPUs' power through NVML but not the CPU's"), "{}", stderr(&o));
    assert!(!dir.path().join("blind").exists(), "nothing written");
    let (out, p) = tune(&["--max-power", "100"], &dir.path().join("capped"));
    assert_eq!(p["settings"]["max_power_w"], 100.0);
    assert!(out.contains("--max-power 100 W: the GPUs draw more from ngl 0"), "{out}");
    // No NVML: --max-power has nothing to read.
    let o = run_env(&[m.to_str().unwrap(), "--max-power", "100"], &[("GGML_VK_VISIBLE_DEVICES", "0")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--max-power reads an NVIDIA card's power through NVML"), "{}", stderr(&o));
}
