//! The tuner end to end: real offload to llvmpipe (vulkan build), budgets,
//! interrupts and resume, the no-GPU path, bad options.
mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const VK: (&str, &str) = ("GGML_VK_VISIBLE_DEVICES", "0");

fn ngls(profile: &serde_json::Value) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = profile["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["role"].as_str().unwrap().to_string(), t["spec"]["n_gpu_layers"].as_u64().unwrap()))
        .collect();
    v.sort();
    v
}

fn only_profile(store: &Path) -> serde_json::Value {
    let p = profiles_in(store);
    assert_eq!(p.len(), 1, "{p:?}");
    let v = read_json(&p[0]);
    let errs = schema_errors(&v);
    assert!(errs.is_empty(), "profile does not validate: {errs:?}");
    v
}

#[test]
#[cfg_attr(not(feature = "vulkan"), ignore = "needs the vulkan build (scripts/test builds it)")]
fn gemma_on_llvmpipe_recommends_zero_and_says_why() {
    let _heavy = heavy();
    let m = real_model();
    let store = tempfile::tempdir().unwrap();
    let o = run_env(
        &[
            m.to_str().unwrap(),
            "--ngl",
            "0,99",
            "-p",
            "8",
            "-n",
            "8",
            "-r",
            "1",
            "-c",
            "512",
            "-t",
            "2",
            "--profiles",
            store.path().to_str().unwrap(),
        ],
        &[VK],
    );
    let out = stdout(&o);
    assert!(o.status.success(), "{}\n{out}", stderr(&o));
    let p = only_profile(store.path());
    // Which thread count wins is the machine's business; that the answer
    // names one it measured at the recommended setting is ours.
    let threads = p["recommendation"]["n_threads"].as_u64().unwrap();
    let measured: Vec<u64> = p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["spec"]["n_gpu_layers"] == 0)
        .map(|t| t["spec"]["n_threads"].as_u64().unwrap())
        .collect();
    assert!(measured.contains(&threads), "{threads} not among {measured:?}");
    let ngl = p["recommendation"]["n_gpu_layers"].as_u64().unwrap();
    assert!(
        out.contains(&format!("PARAMETER num_gpu {ngl}"))
            && out.contains(&format!("PARAMETER num_thread {threads}"))
            && out.contains("PARAMETER num_ctx 512"),
        "{out}"
    );
    // llvmpipe runs on the CPU: op offload is off, and the flags say so.
    // Ollama's batch for the context is measured and emitted (-b 512 -ub 512; -ub 512 is llama.cpp's).
    assert!(out.contains(&format!("-ngl {ngl} -t {threads} -c 512 -b 512 --no-op-offload")), "{out}");
    assert!(out.contains("| 19 |"), "99 means full offload, ngl 19: {out}");
    if p["recommendation"]["confidence"] == "low" {
        // Other work on the machine can flip even llvmpipe's 30x gap; then the tool must say so.
        assert!(out.contains("warning: busy machine:") && out.contains("confidence: low"), "{out}");
    } else {
        assert!(out.contains("ngl 0: offloading to Vulkan0 (llvmpipe) is slower than the CPU here"), "{out}");
        assert_eq!(p["decision"]["offload_hurts"], true);
        assert_eq!(ngl, 0);
    }
    assert_eq!(p["memory"]["source"], "accounted");
    assert_eq!(p["model"]["n_layer_full"], 19);
    // llama.cpp's dry run predicted what it then allocated, within 2%, at every setting.
    for t in p["trials"].as_array().unwrap() {
        let e = t["prediction_error_pct"].as_f64().expect("a prediction for every grid setting");
        assert!(e.abs() < 2.0, "ngl {}: {e}%", t["spec"]["n_gpu_layers"]);
    }
    assert!(out.contains("llama.cpp's own fit (same memory margin) would choose ngl 19"), "{out}");
    assert!(out.contains(&p["machine_id"].as_str().unwrap().to_string()), "the profile path is printed");
    assert!(checkpoints_in(store.path()).is_empty(), "the checkpoint is removed once the profile is written");
}

#[test]
#[cfg_attr(not(feature = "vulkan"), ignore = "needs the vulkan build (scripts/test builds it)")]
fn a_budget_between_grid_points_is_respected_and_the_memory_fit_holds() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 40);
    let store = dir.path().join("store");
    // Accounted device memory at -c 256: about 8.8 MB at ngl 10, 16.7 MB at 20, 24.5 MB at 30.
    let o = run_env(
        &[
            m.to_str().unwrap(),
            "--vram-budget",
            "20MB",
            "--search",
            "grid",
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "-c",
            "256",
            "--profiles",
            store.to_str().unwrap(),
            "--json",
            "-q",
        ],
        &[VK],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("--json prints the profile");
    assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
    assert_eq!(p, only_profile(&store), "--json prints what was stored");
    let budget = 20e6;
    assert_eq!(p["memory"]["cap_bytes"].as_f64().unwrap(), budget);
    assert!(p["memory"]["cap_reason"].as_str().unwrap().starts_with("--vram-budget"));
    // llama.cpp's dry run predicts 30, 40 and 41 over the 20 MB budget: they are marked and not run.
    assert_eq!(p["prediction"]["predicted_over_cap"], serde_json::json!([30, 40, 41]));
    let measured: Vec<u64> = p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] == "grid")
        .map(|t| t["spec"]["n_gpu_layers"].as_u64().unwrap())
        .collect();
    assert_eq!(measured, [0, 10, 20]);
    // The memory fit predicts every grid point within 5%: measured ones against
    // their measurement, the others against llama.cpp's dry run.
    for c in p["memory_fit_check"].as_array().unwrap() {
        assert!(c["error_pct"].as_f64().unwrap().abs() < 5.0, "{c}");
    }
    let fit = &p["decision"]["fits"]["memory"];
    let (a, b) = (fit["intercept"].as_f64().unwrap(), fit["slope"].as_f64().unwrap());
    for pr in p["prediction"]["predictions"].as_array().unwrap() {
        let ngl = pr["n_gpu_layers"].as_f64().unwrap();
        if ngl == 0.0 {
            continue;
        }
        let (fitted, dry) = (a + b * ngl, pr["device_bytes"].as_f64().unwrap());
        assert!((fitted - dry).abs() / dry < 0.05, "ngl {ngl}: fit {fitted} vs dry run {dry}");
    }
    // llama.cpp's default, measured beside the answer, is what users get without flags: not held to our cap.
    for t in p["trials"].as_array().unwrap().iter().filter(|t| t["role"] != "paired") {
        assert!(t["mem_bytes"].as_f64().unwrap() <= budget, "{t}");
        assert!(t["prediction_error_pct"].as_f64().unwrap().abs() < 2.0, "{}", t["prediction_error_pct"]);
    }
    let d = &p["decision"];
    let max = d["max_ngl_under_cap"].as_u64().unwrap();
    assert!((20..30).contains(&max), "largest setting under the budget lies between the grid points: {max}");
    assert!(p["recommendation"]["mem_bytes"].as_f64().unwrap() <= budget);
    assert!(p["recommendation"]["n_gpu_layers"].as_u64().unwrap() <= max);
}

fn wait_for_trials(store: &Path, n: usize, limit: Duration) {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some(c) = checkpoints_in(store).first() {
            if let Ok(t) = std::fs::read_to_string(c) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&t) {
                    if v["trials"].as_array().map_or(0, Vec::len) >= n {
                        return;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the checkpoint never held {n} trials");
}

fn interrupted_run(model: &Path, store: &Path, hang_at: u32, signal: i32, finished: usize) {
    let mut child = Command::new(BIN)
        .args([
            model.to_str().unwrap(),
            "--search",
            "grid",
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "-c",
            "256",
            "--profiles",
            store.to_str().unwrap(),
            "--resume",
        ])
        .env(VK.0, VK.1)
        .env(RETRY_WAIT.0, RETRY_WAIT.1)
        .env("NGL_TUNE_TEST_FAULT", format!("hang@{hang_at}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_trials(store, finished, Duration::from_secs(120));
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: sending a signal to our own child.
    unsafe {
        libc::kill(child.id() as i32, signal);
    }
    let t0 = Instant::now();
    let o = loop {
        if child.try_wait().unwrap().is_some() {
            break child.wait_with_output().unwrap();
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the tuner did not stop on signal {signal}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains(&format!("stopped at ngl {hang_at}")), "{err}");
    assert!(err.contains("run the same command with --resume to continue"), "{err}");
    assert!(profiles_in(store).is_empty(), "no profile from an interrupted run");
    let cp = read_json(&checkpoints_in(store)[0]);
    assert_eq!(cp["trials"].as_array().unwrap().len(), finished, "every finished trial is kept");
}

#[test]
#[cfg_attr(not(feature = "vulkan"), ignore = "needs the vulkan build (scripts/test builds it)")]
fn an_interrupted_run_resumes_to_the_same_trials() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 40);
    let store = dir.path().join("store");
    interrupted_run(&m, &store, 20, libc::SIGINT, 2);
    interrupted_run(&m, &store, 40, libc::SIGTERM, 4);
    let o = run_env(
        &[
            m.to_str().unwrap(),
            "--search",
            "grid",
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "-c",
            "256",
            "--profiles",
            store.to_str().unwrap(),
            "--resume",
            "-q",
        ],
        &[VK],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("resuming: 4 finished trials"), "{}", stderr(&o));
    let resumed = only_profile(&store);
    assert!(checkpoints_in(&store).is_empty());

    // The same trials a run without interruptions makes: every grid value
    // once, nothing measured twice (the search's resume logic is unit-tested
    // against curves in tune::search).
    let grid: Vec<u64> = ngls(&resumed).iter().filter(|t| t.0 == "grid").map(|t| t.1).collect();
    assert_eq!(grid, [0, 10, 20, 30, 40, 41]);
    // (The A/B/A/B pairs against llama.cpp's default measure each side twice by design.)
    let mut keys: Vec<(String, u64, u64)> = resumed["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] != "paired")
        .map(|t| {
            let s = &t["spec"];
            (
                t["role"].as_str().unwrap().to_string(),
                s["n_gpu_layers"].as_u64().unwrap(),
                s["n_threads"].as_u64().unwrap(),
            )
        })
        .collect();
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "no trial measured twice: {keys:?}");
    // The dry run matched llama.cpp's accounting within 2% at every ngl of the 40-layer model (a
    // baseline's trials by the dry run of what its fit chose, at its own context and batch).
    for t in resumed["trials"].as_array().unwrap() {
        let e = t["prediction_error_pct"].as_f64().unwrap();
        assert!(e.abs() < 2.0, "ngl {}: {e}%", t["spec"]["n_gpu_layers"]);
    }
}

#[test]
#[cfg_attr(not(feature = "vulkan"), ignore = "needs the vulkan build (scripts/test builds it)")]
fn an_out_of_memory_trial_skips_larger_settings() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 40);
    let store = dir.path().join("store");
    // The oom hook starts the offload devices, then caps the worker's address
    // space at ngl 20, so llama.cpp's own allocations for the model really
    // fail there (its mmap, or a buffer for its weights), not the driver's start.
    let o = run_env(
        &[
            m.to_str().unwrap(),
            "--ngl",
            "0,10,20,30",
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "-c",
            "256",
            "--profiles",
            store.to_str().unwrap(),
            "--json",
            "-q",
        ],
        &[VK, ("NGL_TUNE_TEST_FAULT", "oom@20")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let status: Vec<(u64, &str)> = p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] == "grid")
        .map(|t| (t["spec"]["n_gpu_layers"].as_u64().unwrap(), t["status"].as_str().unwrap()))
        .collect();
    let reasons: Vec<&serde_json::Value> = p["trials"].as_array().unwrap().iter().map(|t| &t["reason"]).collect();
    assert_eq!(status, [(0, "ok"), (10, "ok"), (20, "oom")], "reasons: {reasons:?}");
    assert_eq!(p["skipped"], serde_json::json!([30]));
    let reason = p["trials"][2]["reason"].as_str().unwrap().to_ascii_lowercase();
    assert!(
        ["cannot allocate memory", "outofhostmemory", "bad_alloc", "unable to allocate"]
            .iter()
            .any(|w| reason.contains(w)),
        "{}",
        p["trials"][2]["reason"]
    );
    assert!(p["recommendation"]["n_gpu_layers"].as_u64().unwrap() < 20);
}

#[test]
fn without_a_gpu_device_threads_are_tuned_instead() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 4);
    let store = dir.path().join("store");
    // No GGML_VK_VISIBLE_DEVICES: ggml hides llvmpipe, so there is no GPU device.
    let o = run(&[m.to_str().unwrap(), "-p", "8", "-n", "8", "-r", "1", "--profiles", store.to_str().unwrap()]);
    let out = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.contains("ngl has no effect here"), "{out}");
    assert!(out.contains("tuned threads instead: -t "), "{out}");
    assert!(out.contains("PARAMETER num_gpu 0") && out.contains("PARAMETER num_thread "), "{out}");
    let p = only_profile(&store);
    assert_eq!(p["no_gpu"], true);
    assert!(p["trials"].as_array().unwrap().iter().all(|t| t["role"] == "threads" && t["spec"]["n_gpu_layers"] == 0));
    let best = p["recommendation"]["n_threads"].as_u64().unwrap();
    assert!(best >= 1);
    // Every trial loads the model the same way (ngl 0): one worker, one load,
    // the same model buffers in every trial.
    let trials = p["trials"].as_array().unwrap();
    assert!(trials.len() >= 2, "{trials:?}");
    for t in &trials[1..] {
        assert_eq!(t["model_reused"], true, "{t}");
        assert_eq!(t["t_load_ms"], 0.0, "{t}");
        assert_eq!(t["model_buffers"], trials[0]["model_buffers"], "{t}");
    }
    // stderr is no terminal here: one plain line per trial says the setting,
    // what it measured, how long it took and how much time has passed.
    let err = stderr(&o);
    let n = p["trials"].as_array().unwrap().len();
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("trial ")).collect();
    assert_eq!(lines.len(), n, "{err}");
    assert!(lines[0].starts_with(&format!("trial 1/{n}: ngl 0 -t ")), "{err}");
    assert!(lines[0].contains(" t/s") && lines[0].contains(" s elapsed"), "{err}");
    if n > 1 {
        assert!(lines[0].contains("s left"), "a remaining estimate while trials remain: {err}");
    }
    let q = run_env(
        &[m.to_str().unwrap(), "-p", "8", "-n", "8", "-r", "1", "--profiles", store.to_str().unwrap(), "-q"],
        &[("NGL_TUNE_NO_SHARE", "1")],
    );
    assert!(!stderr(&q).contains("trial 1/"), "--quiet prints no progress: {}", stderr(&q));
    let p = only_profile(&store);
    assert!(p["trials"].as_array().unwrap().iter().all(|t| t["model_reused"].is_null()), "a worker per trial");
}

#[test]
fn bad_tune_options_exit_2_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 2);
    let m = m.to_str().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    for (args, needle) in [
        (vec!["--target-vram", "0"], "outside (0, 1]"),
        (vec!["--target-vram", "-0.5"], "outside (0, 1]"),
        (vec!["--target-vram", "1.5"], "outside (0, 1]"),
        (vec!["--target-vram", "NaN"], "outside (0, 1]"),
        (vec!["--target-vram", "abc"], "is not a number"),
        (vec!["--vram-budget", "lots"], "is not a size"),
        (vec!["--vram-budget", "0"], "is zero"),
        (vec!["--ngl", "10-"], "has no end"),
        (vec!["-t", "0"], "-t 0"),
        (vec!["-p", "0", "-n", "0"], "nothing to measure"),
    ] {
        let mut a = vec![m, "--profiles", s];
        a.extend(args);
        assert_bad_input(&run(&a), needle);
    }
    assert!(!store.exists(), "nothing was written");
    let file = dir.path().join("afile");
    std::fs::write(&file, "x").unwrap();
    assert_bad_input(&run(&[m, "--profiles", file.to_str().unwrap()]), "is a file, not a directory");
}

/// Every numeric flag takes a negative number to its own one-line
/// message (clap's "unexpected argument '-50'" tip, which turns the
/// number into a model path, once answered three of them); the same model
/// twice in a set is bad input too. Nothing is written.
#[test]
fn negative_numbers_and_a_model_twice_in_a_set_are_one_line_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let (m, other) = (synth(dir.path(), 2), synth(dir.path(), 3));
    let (m, other) = (m.to_str().unwrap(), other.to_str().unwrap());
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    let flags: &[(&[&str], &str, &str)] = &[
        (&["--together", other], "--weights", "-1,2"),
        (&[], "--max-power", "-50"),
        (&[], "--reading-speed", "-3"),
        (&[], "--target-vram", "-0.5"),
        (&[], "--max-kl", "-1"),
        (&[], "--min-top1", "-0.5"),
        (&[], "--busy-threshold", "-0.1"),
        (&[], "--vram-budget", "-5GiB"),
        (&[], "--host-budget", "-5GiB"),
        (&[], "--depth", "-5"),
        (&[], "--parallel", "-2"),
        (&[], "--ctx", "-4096"),
        (&[], "--ngl", "-3"),
        (&[], "-p", "-5"),
        (&[], "-n", "-5"),
        (&[], "-r", "-1"),
        (&[], "-t", "-1"),
        (&[], "-b", "-512"),
        (&[], "--ubatch-size", "-512"),
        (&[], "--trial-timeout", "-9"),
        (&[], "--sample-interval", "-20"),
    ];
    for (before, flag, value) in flags {
        let mut a = vec![m];
        a.extend(*before);
        a.extend(["--profiles", s, flag, value]);
        let o = run(&a);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{flag} {value}: one line, got: {err}");
        assert!(lines[0].starts_with("error: ") && lines[0].contains(flag), "{flag} {value}: {err}");
        assert!(!err.contains("tip:") && !err.contains("unexpected argument"), "{flag} {value}: {err}");
    }
    // What a set cannot honour is refused, never silently dropped.
    for extra in [
        &["--objective", "energy"][..],
        &["--objective", "pp"],
        &["--max-power", "200"],
        &["--host-budget", "8GiB"],
        &["--ctx", "2048,4096"],
    ] {
        let mut a = vec![m, other, "--together", "--profiles", s];
        a.extend(extra);
        assert_bad_input(&run(&a), &format!("--together does not take {}", extra.join(" ")));
    }
    let same = dir.path().join(".").join(Path::new(m).file_name().unwrap());
    assert_bad_input(&run(&[m, same.to_str().unwrap(), "--together", "--profiles", s]), "a set holds each model once");
    assert!(!store.exists(), "nothing was written");
}

#[test]
fn example_profiles_validate_and_read_back() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let p = e.path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".json") || name.ends_with(".schema.json") {
            continue;
        }
        n += 1;
        let v = read_json(&p);
        assert!(schema_errors(&v).is_empty(), "{name}: {:?}", schema_errors(&v));
        let prof = ngl_tune::profile::store::read_profile(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(prof.model.file_name, "gemma-3-270m-q4_k_m.gguf");
        assert!(prof.model.path.is_relative(), "{name}: no path of the machine it was made on");
        assert_eq!(
            prof.recommendation.modelfile[0],
            format!("PARAMETER num_gpu {}", prof.recommendation.placement.n_gpu_layers)
        );
    }
    assert!(n >= 2, "profiles/ holds the CPU and the vulkan example");
}

#[test]
#[cfg_attr(not(feature = "vulkan"), ignore = "needs the vulkan build (scripts/test builds it)")]
fn adaptive_search_reaches_the_grids_answer_with_fewer_trials() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 40);
    let mut answers = Vec::new();
    for mode in ["grid", "adaptive"] {
        let store = dir.path().join(mode);
        let mut args =
            vec![m.to_str().unwrap(), "-p", "8", "-n", "4", "-r", "2", "-c", "256", "--json", "-q", "--profiles"];
        args.push(store.to_str().unwrap());
        if mode == "grid" {
            args.extend(["--search", "grid"]);
        }
        let o = run_env(&args, &[VK]);
        assert!(o.status.success(), "{}", stderr(&o));
        let p: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
        answers.push(p);
    }
    let (grid, adaptive) = (&answers[0], &answers[1]);
    assert_eq!(
        grid["recommendation"]["n_gpu_layers"], adaptive["recommendation"]["n_gpu_layers"],
        "same recommendation"
    );
    assert_eq!(grid["search"]["trials"], 6);
    assert_eq!(grid["search"]["stopped_early"], 0, "the grid measures every setting in full");
    let a = &adaptive["search"];
    assert_eq!(a["mode"], "adaptive", "adaptive is the default");
    assert_eq!(a["trials"], 2, "ngl 0 and full offload: offloading only hurts on llvmpipe");
    assert_eq!(a["grid_size"], 6);
    // Full offload is far slower than ngl 0 in tg (the objective): raced, its
    // tg test stops after one repetition and its pp test is not run.
    let top = adaptive["trials"].as_array().unwrap().iter().find(|t| t["spec"]["n_gpu_layers"] == 41).unwrap();
    assert_eq!(a["stopped_early"], 1, "{top}");
    let tests = top["tests"].as_array().unwrap();
    assert_eq!(tests.len(), 1, "{top}");
    assert_eq!((tests[0]["n_gen"].as_u64(), tests[0]["stopped_early"].as_bool()), (Some(4), Some(true)));
    assert_eq!(tests[0]["samples_ns"].as_array().unwrap().len(), 1, "{top}");
    assert!(top["spec"]["race"]["tg_below_ts"].as_f64().unwrap() > 0.0);
    let zero = adaptive["trials"].as_array().unwrap().iter().find(|t| t["spec"]["n_gpu_layers"] == 0).unwrap();
    assert!(zero["tests"].as_array().unwrap().iter().all(|t| t["samples_ns"].as_array().unwrap().len() == 2));
    assert!(a["grid_estimate_s"].as_f64().unwrap() > a["trial_wall_s"].as_f64().unwrap());
    let notes: Vec<&str> = adaptive["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["kind"] == "search")
        .map(|n| n["text"].as_str().unwrap())
        .collect();
    assert!(notes.iter().any(|n| n.starts_with("adaptive search stopped after the two ends: ngl 41 is")), "{notes:?}");
}

#[test]
#[cfg_attr(not(feature = "vulkan"), ignore = "needs the vulkan build (scripts/test builds it)")]
fn a_moe_model_is_tuned_over_n_cpu_moe_and_its_flags_load() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("moe.gguf");
    ngl_tune::synth::write_model(&m, &ngl_tune::synth::SynthSpec::default().with_n_layer(4).with_experts(4, 2))
        .unwrap();
    let store = dir.path().join("store");
    let o = run_env(
        &[
            m.to_str().unwrap(),
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "-c",
            "256",
            "--profiles",
            store.to_str().unwrap(),
            "--json",
            "-q",
        ],
        &[VK],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
    let mut moe: Vec<u64> = p["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["role"] == "moe")
        .map(|t| {
            assert_eq!(t["spec"]["n_gpu_layers"], 5, "expert offload runs with every layer on the GPU");
            assert_eq!(t["status"], "ok", "{t}");
            t["spec"]["n_cpu_moe"].as_u64().unwrap()
        })
        .collect();
    moe.sort_unstable();
    assert_eq!(moe, [0, 1, 2, 3, 4], "tuned over n_cpu_moe");
    assert!(p["decision"]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r.as_str().unwrap().contains("mixture of experts")));
    // Experts on the CPU take device memory away: the memory falls as n_cpu_moe rises.
    let mem = |k: u64| {
        p["trials"].as_array().unwrap().iter().find(|t| t["role"] == "moe" && t["spec"]["n_cpu_moe"] == k).unwrap()
            ["mem_bytes"]
            .as_f64()
            .unwrap()
    };
    assert!(mem(4) < mem(2) && mem(2) < mem(0), "{} {} {}", mem(4), mem(2), mem(0));

    // A profile recommending expert offload emits flags llama.cpp loads.
    let mut q = p.clone();
    q["recommendation"]["n_gpu_layers"] = 5.into();
    q["recommendation"]["n_cpu_moe"] = 2.into();
    q["recommendation"]["ollama_num_gpu"] = 0.into();
    // Whatever the tune recommended (llama.cpp's default on a tie), this one is ours.
    q["recommendation"]["llama_default"] = false.into();
    let qp = dir.path().join("moe-profile.json");
    std::fs::write(&qp, serde_json::to_string(&q).unwrap()).unwrap();
    let flags = stdout(&run(&["emit", qp.to_str().unwrap(), "--format", "llama-cpp"]));
    assert!(
        flags.trim_end().ends_with("-ngl 5 -t 2 -c 256 --n-cpu-moe 2") || flags.contains("--n-cpu-moe 2"),
        "{flags}"
    );
    let words: Vec<&str> = flags.split_whitespace().collect();
    let value = |flag: &str| words[words.iter().position(|w| *w == flag).unwrap() + 1].to_string();
    let b = run_env(
        &[
            "bench",
            &value("-m"),
            "-ngl",
            &value("-ngl"),
            "--n-cpu-moe",
            &value("--n-cpu-moe"),
            "-c",
            &value("-c"),
            "-p",
            "8",
            "-n",
            "4",
            "-r",
            "1",
            "-o",
            "json",
        ],
        &[VK],
    );
    assert!(b.status.success(), "{}", stderr(&b));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&b)).unwrap();
    assert!(rows.iter().all(|r| r["status"] == "ok" && r["n_cpu_moe"] == 2 && r["layers_offloaded"] == 5), "{rows:?}");
    let env = stdout(&run(&["emit", qp.to_str().unwrap(), "--format", "llama-server-env"]));
    assert!(env.contains("LLAMA_ARG_N_CPU_MOE=2"), "{env}");
    let mf = stdout(&run(&["emit", qp.to_str().unwrap()]));
    assert!(
        mf.contains("--n-cpu-moe 2") && mf.contains("PARAMETER num_gpu 0"),
        "Ollama gets the best whole-layer split: {mf}"
    );
}

#[test]
fn the_ollama_servers_settings_are_what_the_tune_measures() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = real_model();
    let env = dir.path().join("ollama.env");
    std::fs::write(
        &env,
        "# the server's\nOLLAMA_NUM_PARALLEL=4\nOLLAMA_CONTEXT_LENGTH=8192\nOLLAMA_KV_CACHE_TYPE=q8_0\n",
    )
    .unwrap();
    let store = dir.path().join("store");
    let common = ["-p", "16", "-n", "8", "-r", "1", "--depth", "64", "--profiles", store.to_str().unwrap()];
    let o = run(&[&[m.to_str().unwrap(), "--ollama-env", env.to_str().unwrap()][..], &common].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let p = only_profile(&store);
    // llama.cpp's default runs as llama-server does without flags (its 4 slots over one unified
    // cache, its own batch); every other trial as Ollama runs it. All of them with Ollama's KV type.
    let stock = |s: &serde_json::Value| {
        s["n_batch"] == 2048 && s["n_ubatch"] == 512 && s["n_parallel"] == 4 && s["kv_unified"] == true
    };
    for t in p["trials"].as_array().unwrap() {
        let s = &t["spec"];
        assert_eq!(s["kv_type"], "q8_0", "both baselines priced and measured with Ollama's KV type: {s}");
        if t["role"] == "paired" && stock(s) {
            continue;
        }
        assert_eq!((s["n_ctx"].as_u64(), s["n_parallel"].as_u64()), (Some(32768), Some(4)), "-c 8192 x 4 -np 4: {s}");
        assert_eq!((s["n_batch"].as_u64(), s["n_ubatch"].as_u64()), (Some(1024), Some(1024)), "Ollama's batch: {s}");
    }
    if let Some(c) = p["placements"].as_array().and_then(|a| a.last()) {
        for (field, needle) in [("default", "-ctk q8_0 -ctv q8_0"), ("ollama", "-c 32768 -np 4 -b 1024 -ub 1024")] {
            let args = c[field]["llama_cpp_args"].as_str().unwrap_or_default();
            assert!(args.contains(needle) && args.contains("-ctk q8_0"), "{field}: {args}");
        }
    }
    assert!(
        out.contains(&format!("Ollama server settings from --ollama-env {}: OLLAMA_NUM_PARALLEL=4", env.display())),
        "{out}"
    );
    assert!(out.contains("-c 32768 -np 4") && out.contains("PARAMETER num_ctx 8192"), "{out}");
    assert_eq!(p["settings"]["consumer"]["source"], format!("--ollama-env {}", env.display()));

    // A file Ollama could not have: exit 2, nothing written.
    std::fs::write(&env, "OLLAMA_NUM_PARALLEL 4\n").unwrap();
    let bad = run(&[&[m.to_str().unwrap(), "--ollama-env", env.to_str().unwrap()][..], &common].concat());
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("line 1: 'OLLAMA_NUM_PARALLEL 4' is not KEY=VALUE"), "{}", stderr(&bad));

    // Without the file and without an Ollama service, the report says so.
    if !std::path::Path::new("/etc/systemd/system/ollama.service").exists() {
        let none = dir.path().join("none");
        let o = run(&[
            m.to_str().unwrap(),
            "-c",
            "1024",
            "-p",
            "16",
            "-n",
            "8",
            "-r",
            "1",
            "--profiles",
            none.to_str().unwrap(),
        ]);
        assert!(
            stdout(&o).contains("Ollama server settings: none found: no --ollama-env and no ollama systemd unit"),
            "{}",
            stdout(&o)
        );
    }
}

/// Ollama picks the batch per context (server/sched.go): 512 at 4096
/// tokens, 2048 above 32768 where the model leaves the device room; each
/// context is measured and emitted with its own.
#[test]
fn each_context_gets_ollamas_own_batch() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("long.gguf");
    ngl_tune::synth::write_model(&m, &ngl_tune::synth::SynthSpec::default().with_n_layer(4).with_ctx_train(65536))
        .unwrap();
    let store = dir.path().join("store");
    let args = ["--ctx", "4096,65536", "--depth", "64", "-p", "16", "-n", "8", "-r", "1", "-q", "--json"];
    let o = run(&[&[m.to_str().unwrap(), "--profiles", store.to_str().unwrap()][..], &args].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
    for t in p["trials"].as_array().unwrap().iter().filter(|t| t["role"] != "paired") {
        let s = &t["spec"];
        let want = if s["n_ctx"] == 4096 { 512 } else { 2048 };
        assert_eq!((s["n_batch"].as_u64(), s["n_ubatch"].as_u64()), (Some(want), Some(want)), "{s}");
    }
    assert_eq!(p["settings"]["consumer"]["auto_batch"], true);
    let notes = p["notes"].to_string();
    assert!(notes.contains("Ollama's batch at 65536 tokens: -b 2048 -ub 2048"), "{notes}");
}

/// A synthetic 8-layer model and a small Gemma-3-kind projector made for it.
fn model_with_projector(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let m = synth(dir, 8);
    let p = dir.join("mmproj.gguf");
    let spec = ngl_tune::synth::ProjectorSpec::for_text(128).with_tower(64, 256, 2);
    ngl_tune::synth::write_projector(&p, &spec).unwrap();
    (m, p)
}

#[test]
#[cfg_attr(not(feature = "vulkan"), ignore = "needs the vulkan build (scripts/test builds it)")]
fn a_projector_is_priced_counted_against_the_cap_timed_and_emitted() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let (m, mm) = model_with_projector(dir.path());
    let (m_s, mm_s) = (m.to_str().unwrap(), mm.to_str().unwrap());
    let tune = |store: &Path, extra: &[&str]| {
        let base = [m_s, "--mmproj", mm_s, "-c", "512", "-p", "16", "-n", "8", "-r", "2", "--depth", "0"];
        let o = run_env(&[&base[..], &["--profiles", store.to_str().unwrap()], extra].concat(), &[VK]);
        assert!(o.status.success(), "{}\n{}", stderr(&o), stdout(&o));
        (stdout(&o), only_profile(store))
    };
    let (out, p) = tune(&dir.path().join("a"), &["--search", "grid", "--ngl", "0,9"]);

    // Priced by mtmd's dry run, on the first GPU as llama-server loads it,
    // and within 2% of what each trial's load allocated there.
    let pred = &p["prediction"]["mmproj"];
    let on_device = |lines: &serde_json::Value, kinds: &[&str]| -> u64 {
        lines
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["buffer_type"] == "Vulkan0" && kinds.iter().any(|k| b["kind"] == *k))
            .map(|b| b["bytes"].as_u64().unwrap())
            .sum()
    };
    let predicted: u64 = pred["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["buffer_type"] == "Vulkan0")
        .map(|b| b["model"].as_u64().unwrap() + b["compute"].as_u64().unwrap())
        .sum();
    assert!(predicted > 0, "the projector is priced on Vulkan0: {pred}");
    // llama-server with --mmproj and fit on adds mtmd's estimate to the
    // device's fit target (server-context.cpp, load_model): llama.cpp's
    // default is priced with 1 GiB plus the projector on Vulkan0.
    let margin = p["prediction"]["default_fit"]["margin_bytes"].as_u64().unwrap();
    let pad = margin.checked_sub(1 << 30).expect("more than llama.cpp's 1 GiB");
    assert!((pad as f64 - predicted as f64).abs() < 0.01 * predicted as f64, "pad {pad} B, projector {predicted} B");
    let trials = p["trials"].as_array().unwrap();
    // The answer's Ollama form at num_gpu 0 is paired as Ollama runs it:
    // the projector on the CPU (--no-mmproj-offload), unpriced by the grid.
    let (cpu, gpu): (Vec<&serde_json::Value>, Vec<&serde_json::Value>) =
        trials.iter().filter(|t| t["status"] == "ok").partition(|t| t["spec"]["mmproj_offload"] == false);
    for t in &cpu {
        assert!(t["role"] == "paired" && t["spec"]["n_gpu_layers"] == 0, "{t}");
        assert_eq!(on_device(&t["model_buffers"], &["mmproj", "mmproj-compute"]), 0, "{t}");
        assert!(t["predicted_bytes"].is_null(), "{t}");
    }
    for t in gpu {
        let allocated = on_device(&t["model_buffers"], &["mmproj", "mmproj-compute"]);
        let err = (predicted as f64 - allocated as f64).abs() / allocated as f64;
        assert!(err < 0.02, "predicted {predicted} B, allocated {allocated} B: {t}");
        assert!(
            on_device(&t["model_buffers"], &["mmproj"]) > 0,
            "weights on the GPU at ngl {}",
            t["spec"]["n_gpu_layers"]
        );
        assert_eq!(t["spec"]["mmproj"], mm_s);
    }
    // The img row: every trial that ran to its end encoded the fixed image into 16 tokens.
    let full = trials.iter().filter(|t| t["status"] == "ok" && !t["tests"].to_string().contains("stopped_early"));
    for t in full {
        let img = &t["image"];
        assert_eq!((img["n_tokens"].as_u64(), img["nx"].as_u64()), (Some(16), Some(896)), "{t}");
        assert!(img["avg_ns"].as_u64().unwrap() > 0 && img["samples_ns"].as_array().unwrap().len() == 2, "{img}");
    }
    assert!(out.contains("img ms") && out.contains("projector mmproj.gguf on Vulkan0"), "{out}");
    assert!(out.contains("Ollama at num_gpu 0 runs the projector on the CPU"), "{out}");

    // Counted against the cap: a budget full offload meets without the
    // projector but not with it puts full offload over the cap.
    let full9 = p["prediction"]["predictions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["n_gpu_layers"] == 9)
        .map(|x| x["device_bytes"].as_u64().unwrap())
        .unwrap();
    let budget = full9 - predicted / 2;
    let (_, q) =
        tune(&dir.path().join("b"), &["--search", "grid", "--ngl", "0,9", "--vram-budget", &budget.to_string()]);
    let over: Vec<u64> =
        q["prediction"]["predicted_over_cap"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(over, [9], "{budget} B holds ngl 9 without the projector ({} B), not with it", full9 - predicted);

    // The emitted flags load it: bench runs them with the same allocation and the img row.
    let rec = &p["recommendation"];
    let args = rec["llama_cpp_args"].as_str().unwrap();
    assert!(args.contains(&format!("--mmproj {mm_s}")), "{args}");
    let b = run_env(&["bench", m_s, "--llama-args", args, "-p", "16", "-n", "8", "-r", "1", "-o", "json"], &[VK]);
    assert!(b.status.success(), "{}", stderr(&b));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&b)).unwrap();
    let img = rows.iter().find(|r| r["image"] == "896x896").expect("an img row");
    assert_eq!((img["status"].as_str(), img["n_image_tokens"].as_u64()), (Some("ok"), Some(16)), "{img}");
    let mine = trials
        .iter()
        .find(|t| {
            t["status"] == "ok"
                && t["spec"]["n_gpu_layers"] == rec["n_gpu_layers"]
                && t["spec"]["n_threads"] == rec["n_threads"]
        })
        .unwrap();
    assert_eq!(img["accounted_device_bytes"].as_f64(), mine["mem_bytes"].as_f64(), "{img}\n{mine}");
    let env = rec_env(rec);
    assert!(env.contains(&format!("LLAMA_ARG_MMPROJ={mm_s}")), "{env}");
}

/// The recommendation's llama-server environment as `emit --format env` prints it.
fn rec_env(rec: &serde_json::Value) -> String {
    let placement = ngl_tune::placement::args::parse_placement(rec["llama_cpp_args"].as_str().unwrap()).unwrap();
    placement.server_env().iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

#[test]
fn a_projector_that_is_not_one_or_not_this_models_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = model_with_projector(dir.path());
    let other = dir.path().join("for-640.gguf");
    ngl_tune::synth::write_projector(&other, &ngl_tune::synth::ProjectorSpec::for_text(640).with_tower(64, 256, 1))
        .unwrap();
    let store = dir.path().join("store");
    let tune = |mm: &str| {
        run(&[
            m.to_str().unwrap(),
            "--mmproj",
            mm,
            "-c",
            "256",
            "-p",
            "8",
            "-n",
            "4",
            "--profiles",
            store.to_str().unwrap(),
        ])
    };
    assert_bad_input(&tune(m.to_str().unwrap()), "is a model of architecture 'llama', not a projector");
    assert_bad_input(&tune("/nonexistent/mmproj.gguf"), "--mmproj /nonexistent/mmproj.gguf: no such file");
    assert_bad_input(
        &tune(other.to_str().unwrap()),
        "does not go with synth-8L.gguf: mismatch between text model (n_embd = 128) and mmproj (n_embd = 640)",
    );
    assert!(profiles_in(&store).is_empty(), "nothing written");
}

/// A host memory cap no placement can keep (it would only swap) is bad
/// input before any trial: without an offload device by the weights alone,
/// with one by llama.cpp's dry run of every placement the device can hold.
#[test]
fn a_host_cap_below_what_every_placement_needs_is_exit_2_and_writes_no_profile() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 4);
    let store = dir.path().join("store");
    let args = [m.to_str().unwrap(), "-p", "8", "-n", "8", "-r", "1", "--host-budget", "64KiB"];
    let args = [&args[..], &["--profiles", store.to_str().unwrap()]].concat();
    for (env, says) in [
        (&[][..], "the model's weights alone"),
        (&[VK][..], "every placement that fits the device needs more host memory than the cap of 0.06 MiB"),
    ] {
        let o = run_env(&args, env);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(says) && stderr(&o).contains("--host-budget"), "{}", stderr(&o));
        assert_eq!(stderr(&o).lines().filter(|l| l.starts_with("error:")).count(), 1, "{}", stderr(&o));
        fn files(p: &Path) -> usize {
            std::fs::read_dir(p).map_or(0, |d| {
                // The store's lock (taken before the dry run, held by no one after) is not a result.
                let kept = |e: &std::fs::DirEntry| e.file_name() != ".lock";
                d.flatten().filter(kept).map(|e| if e.path().is_dir() { files(&e.path()) } else { 1 }).sum()
            })
        }
        assert_eq!(files(&store), 0, "no profile, checkpoint or history written");
    }
}

/// `--draft` with the model as its own draft, on the CPU: the draft stage
/// prices and measures each draft placement beside the answer in a load of
/// its own, greedy generation accepts every drafted token (the draft
/// computes what the target does), and the profile keeps it all, valid by
/// the schema. Whether speculation pays is the machine's to say, not the
/// test's.
#[test]
fn a_draft_is_tried_beside_the_answer_and_reported() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = real_model();
    let store = dir.path().join("store");
    let args = [m.to_str().unwrap(), "-c", "512", "-p", "8", "-n", "8", "-r", "1", "-t", "2"];
    let o = run(&[&args[..], &["--draft", m.to_str().unwrap(), "--profiles", store.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("speculative decoding at 512 context with gemma-3-270m-q4_k_m.gguf"), "{out}");
    let p = only_profile(&store);
    assert_eq!(p["settings"]["draft"]["model"], m.to_str().unwrap());
    let d = &p["placements"][0]["draft"];
    let options = d["options"].as_array().unwrap();
    assert_eq!(
        options.len(),
        3,
        "no device here: the draft on the CPU alone, at llama-server's length and two others: {d}"
    );
    let lengths: Vec<&serde_json::Value> = options.iter().map(|o| &o["placement"]["draft"]["n_max"]).collect();
    assert_eq!(lengths, [&serde_json::Value::Null, &serde_json::json!(1), &serde_json::json!(8)], "{d}");
    for o in options {
        assert_eq!(o["loads"], 1, "{o}");
        assert!(o["acceptance"].as_f64().unwrap() > 0.9, "{o}");
        assert!(o["ratio"].as_array().unwrap().len() == 3, "{o}");
    }
    let said = d["summary"].as_str().unwrap();
    let rec = &p["recommendation"];
    match options.iter().find(|o| o["chosen"] == true) {
        Some(c) => {
            assert!(said.starts_with("speculation pays"), "{said}");
            assert_eq!(rec["draft"], c["placement"]["draft"], "{rec}");
        }
        None => {
            assert!(said.contains("does not pay"), "{said}");
            assert!(rec.get("draft").is_none(), "{rec}");
        }
    }
}

/// A model with MTP heads: the tune tries drafting with them without
/// being asked (one load at the answer, llama.cpp's draft-mtp loop), and
/// the Ollama lines say whether to load them: `draft_num_predict` N where
/// they became the answer, else 0 (num_gpu is priced without them).
/// Which it is is the machine's to say, not the test's. `--mtp` on a
/// model without heads is exit 2 and writes nothing.
#[test]
fn mtp_heads_are_tried_unasked_and_the_ollama_lines_say_whether_to_load_them() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth_mtp(dir.path());
    let store = dir.path().join("store");
    let args = [m.to_str().unwrap(), "-c", "512", "-p", "8", "-n", "8", "-r", "1", "-t", "2", "--json", "-q"];
    let o = run(&[&args[..], &["--profiles", store.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
    assert_eq!(p["model"]["n_layer_nextn"], 1, "{}", p["model"]);
    let d = &p["placements"][0]["draft"];
    assert_eq!(d["mtp"], true, "{d}");
    let options = d["options"].as_array().unwrap();
    assert_eq!(options.len(), 3, "no device: the heads at the answer alone, at three draft lengths: {d}");
    assert!(options.iter().all(|o| o["loads"] == 1), "{d}");
    assert_eq!(options[0]["placement"]["draft"], serde_json::json!({}), "the model's own heads, no file: {d}");
    let rec = &p["recommendation"];
    let lines: Vec<&str> = rec["modelfile"].as_array().unwrap().iter().filter_map(|l| l.as_str()).collect();
    let modelfile = dir.path().join("Modelfile");
    let stored = profiles_in(&store);
    let w = run(&["emit", stored[0].to_str().unwrap(), "--write-modelfile", modelfile.to_str().unwrap()]);
    assert!(w.status.success(), "{}", stderr(&w));
    let written = std::fs::read_to_string(&modelfile).unwrap();
    if let Some(c) = options.iter().find(|o| o["chosen"] == true) {
        assert!(rec["llama_cpp_args"].as_str().unwrap().contains("--spec-type draft-mtp"), "{rec}");
        let n = c["placement"]["draft"]["n_max"].as_u64().unwrap_or(3);
        let line = format!("PARAMETER draft_num_predict {n}");
        assert!(lines.contains(&line.as_str()), "{lines:?}");
        assert!(written.contains(&line), "{written}");
    } else {
        assert!(rec.get("draft").is_none(), "{rec}");
        assert!(lines.contains(&"PARAMETER draft_num_predict 0"), "the profile's own lines say it too: {lines:?}");
        assert!(
            written.contains("PARAMETER draft_num_predict 0"),
            "num_gpu priced without the heads keeps them off: {written}"
        );
    }
    let plain = synth(dir.path(), 2);
    let no = run(&[plain.to_str().unwrap(), "--mtp", "--profiles", store.to_str().unwrap()]);
    assert_bad_input(&no, "has no MTP heads");
    assert_eq!(profiles_in(&store).len(), 1, "nothing more written");
}

#[test]
fn a_draft_of_another_vocabulary_is_exit_2_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let other = synth(dir.path(), 2);
    let store = dir.path().join("store");
    let m = real_model();
    let o = run(&[m.to_str().unwrap(), "--draft", other.to_str().unwrap(), "--profiles", store.to_str().unwrap()]);
    assert_bad_input(&o, "vocabulary does not match");
    assert!(profiles_in(&store).is_empty());
}
