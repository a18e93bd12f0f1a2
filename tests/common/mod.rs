//! Shared test helpers: synthetic models, the real model, running the binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ngl_tune::synth::{write_model, SynthSpec};

pub const BIN: &str = env!("CARGO_BIN_EXE_ngl-tune");

/// Writes a synthetic llama model with `n_layer` layers into `dir`.
pub fn synth(dir: &Path, n_layer: u32) -> PathBuf {
    let p = dir.join(format!("synth-{n_layer}L.gguf"));
    write_model(&p, &SynthSpec::default().with_n_layer(n_layer)).expect("write synthetic model");
    p
}

/// A 4-layer MoE model with one MTP block after its trunk (a glm4moe, as
/// GLM-4.5 lays its NextN block out), random weights.
pub fn synth_mtp(dir: &Path) -> PathBuf {
    let p = dir.join("synth-mtp.gguf");
    let spec = SynthSpec::default().with_n_layer(4).with_dims(256, 512, 4).with_kv_heads(2).with_experts(4, 2);
    write_model(&p, &spec.with_vocab(4096, false).with_nextn(1)).expect("write synthetic MTP model");
    p
}

/// The real test model, fetched by scripts/fetch-model (scripts/test runs it first).
pub fn real_model() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("vendor/models/gemma-3-270m-q4_k_m.gguf");
    assert!(p.exists(), "{} is missing: run scripts/fetch-model (scripts/test does)", p.display());
    p
}

/// A directory of this test run's own for a store tuned once; those of
/// earlier runs (their process gone) are removed, so they do not pile up.
pub fn fixture_dir(name: &str) -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let prefix = format!("{name}-");
    for e in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let pid = file.strip_prefix(&prefix).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let d = tmp.join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Copies a directory tree (a tuned store) to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}

/// Tests run beside each other, so trials are often measured again: a
/// short pause before that (the product waits 3 s).
pub const RETRY_WAIT: (&str, &str) = ("NGL_TUNE_RETRY_WAIT_MS", "300");

pub fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("NGL_TUNE_TEST_FAULT")
        .env(RETRY_WAIT.0, RETRY_WAIT.1)
        .output()
        .expect("run ngl-tune")
}

pub fn run_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args).env_remove("NGL_TUNE_TEST_FAULT").env(RETRY_WAIT.0, RETRY_WAIT.1);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run ngl-tune")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts exit 2 with exactly one line on stderr starting "error: " and
/// containing `needle`; no panic, nothing on stdout.
pub fn assert_bad_input(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "expected exit 2, got {:?}; stderr: {err}", o.status);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line on stderr, got: {err}");
    assert!(lines[0].starts_with("error: "), "not an error line: {err}");
    assert!(err.contains(needle), "stderr lacks '{needle}': {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(o.stdout.is_empty(), "stdout not empty: {}", stdout(o));
}

/// Validates a profile against profiles/profile.schema.json; returns the errors.
pub fn schema_errors(profile: &serde_json::Value) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/profile.schema.json");
    let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let v = jsonschema::validator_for(&schema).expect("the schema compiles");
    v.iter_errors(profile).map(|e| format!("{} at {}", e, e.instance_path())).collect()
}

/// Every *.json profile under a store directory (not checkpoints).
pub fn profiles_in(store: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(machines) = std::fs::read_dir(store) else { return out };
    for m in machines.flatten() {
        if let Ok(files) = std::fs::read_dir(m.path()) {
            for f in files.flatten() {
                let p = f.path();
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                if name.ends_with(".json") && !name.ends_with(".checkpoint.json") && !name.starts_with('.') {
                    out.push(p);
                }
            }
        }
    }
    out
}

pub fn checkpoints_in(store: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(machines) = std::fs::read_dir(store) else { return out };
    for m in machines.flatten() {
        if let Ok(files) = std::fs::read_dir(m.path()) {
            out.extend(files.flatten().map(|f| f.path()).filter(|p| p.to_string_lossy().ends_with(".checkpoint.json")));
        }
    }
    out
}

pub fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held by every test that runs llama.cpp (a trial, a tune, a KL check, an
/// RPC server): at most one such test runs at a time on the machine.
/// ggml's threads spin while they wait, so two llama.cpp processes on two
/// cores slow each other far more than twice, and a test's time limits and
/// speed comparisons stop meaning anything. Tests that only parse, refuse
/// bad input or read files do not take it and stay parallel.
pub struct Heavy {
    _in_process: std::sync::MutexGuard<'static, ()>,
    _machine: std::fs::File,
    since: std::time::Instant,
}

/// With `NGL_TUNE_TEST_TIMES=FILE`, each heavy test appends its name and the
/// seconds it held the lock: where the suite's time goes.
impl Drop for Heavy {
    fn drop(&mut self) {
        use std::io::Write;
        let Some(path) = std::env::var_os("NGL_TUNE_TEST_TIMES") else { return };
        let name = std::thread::current().name().unwrap_or("?").to_string();
        let bin = std::env::args().next().unwrap_or_default();
        let bin = Path::new(&bin).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{:7.1} {bin} {name}", self.since.elapsed().as_secs_f64());
        }
    }
}

/// Waits for the machine-wide lock: a mutex for the tests of this binary, an
/// flock(2) on one file for every test binary and process (cargo test runs
/// binaries one after another; nextest or a second `cargo test` would not).
pub fn heavy() -> Heavy {
    use std::os::fd::AsRawFd;
    let in_process = HEAVY.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let path = std::env::temp_dir().join("ngl-tune-heavy-tests.lock");
    let f = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("open the test lock");
    // SAFETY: a valid open file descriptor; the lock is released when the file closes.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock {}", path.display());
    Heavy { _in_process: in_process, _machine: f, since: std::time::Instant::now() }
}

/// Makes a stored profile claim its speeds were `by` times what was measured
/// (every sample of every test): what a regression looks like to reprofile.
pub fn claim_faster(v: &mut serde_json::Value, by: f64) {
    for t in v["trials"].as_array_mut().unwrap() {
        for test in t["tests"].as_array_mut().unwrap() {
            let s: Vec<f64> = test["samples_ts"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() * by).collect();
            test["avg_ts"] = (s.iter().sum::<f64>() / s.len() as f64).into();
            test["samples_ts"] = serde_json::json!(s);
        }
    }
}
