//! A busy machine is detected, never silently measured: a CPU hog beside a
//! tune marks its trials contended (each measured once more first), names
//! the hog in the report and the profile, lowers the recommendation's
//! confidence, and keeps `reprofile` from calling the slowdown a
//! regression. The same tune without the hog is not marked.
mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};

use common::*;

/// A busy loop pinned to core 0, killed when dropped.
struct Hog(Child);

impl Hog {
    fn start() -> Hog {
        let mut c = Command::new("sh");
        c.args(["-c", "while :; do :; done"]);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            c.pre_exec(|| {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                Ok(())
            });
        }
        let h = Hog(c.spawn().expect("start the hog"));
        // Let it get going before anything is measured.
        std::thread::sleep(std::time::Duration::from_millis(300));
        h
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Tunes `model` CPU-only at a 1024-token context (depth 512): trials of
/// about a second, the KV cache filled in seconds (the default 4096 context
/// fills 2048 tokens per tune, most of its time, behind a hog even more).
fn tune(model: &Path, store: &Path) -> (std::process::Output, serde_json::Value) {
    let o = run(&[
        model.to_str().unwrap(),
        "-p",
        "16",
        "-n",
        "16",
        "-r",
        "2",
        "-t",
        "2",
        "-c",
        "1024",
        "--profiles",
        store.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p = read_json(&profiles_in(store)[0]);
    assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
    (o, p)
}

/// The real model tuned on an idle machine, once for this file (by the
/// first test that asks, under the heavy lock, never beside a hog): its
/// store, the tune's output and its profile.
fn idle_tune() -> &'static (std::path::PathBuf, std::process::Output, serde_json::Value) {
    static IDLE: std::sync::OnceLock<(std::path::PathBuf, std::process::Output, serde_json::Value)> =
        std::sync::OnceLock::new();
    IDLE.get_or_init(|| {
        let store = fixture_dir("contention-idle");
        let (o, p) = tune(&real_model(), &store);
        (store, o, p)
    })
}

fn contention(p: &serde_json::Value) -> Vec<&serde_json::Value> {
    p["trials"].as_array().unwrap().iter().map(|t| &t["contention"]).collect()
}

#[test]
fn a_busy_core_marks_the_trials_and_names_the_hog_and_an_idle_machine_does_not() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    // The real model, CPU only: trials of about a second, long enough for
    // /proc's clock ticks to tell a busy core from an idle one.
    let m = real_model();

    let hog = Hog::start();
    let busy_store = dir.path().join("busy");
    let (o, p) = tune(&m, &busy_store);
    let b =
        run(&["bench", m.to_str().unwrap(), "-ngl", "0", "-p", "0", "-n", "32", "-r", "2", "-t", "2", "-o", "json"]);
    drop_hog(hog, |pid| {
        let out = stdout(&o);
        for c in contention(&p) {
            assert_eq!(c["contended"], true, "{c}");
            assert_eq!(c["repeated"], true, "measured once more after a pause: {c}");
            assert!(c["others_cores_mean"].as_f64().unwrap() > 0.3, "{c}");
            assert_eq!(c["top"][0]["pid"], pid, "{c}");
        }
        assert!(out.contains("warning: busy machine:"), "{out}");
        assert!(out.contains(&format!("sh (pid {pid})")), "the hog is named: {out}");
        assert!(out.contains("confidence: low"), "{out}");
        assert!(out.contains("contended (others"), "the table marks the rows: {out}");
        assert_eq!(p["recommendation"]["confidence"], "low");
        let busy: Vec<&serde_json::Value> =
            p["notes"].as_array().unwrap().iter().filter(|n| n["kind"] == "busy").collect();
        assert_eq!(busy.len(), 1, "one typed busy-machine warning: {}", p["notes"]);
        assert_eq!(busy[0]["top"][0]["pid"], pid, "{}", busy[0]);
        // bench says it too.
        assert!(b.status.success(), "{}", stderr(&b));
        let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&b)).unwrap();
        assert!(rows.iter().all(|r| r["contended"] == true), "{rows:?}");
        assert!(stderr(&b).contains(&format!("sh (pid {pid})")), "{}", stderr(&b));
    });
    let profile = profiles_in(&busy_store)[0].clone();
    let mf = stdout(&run(&["emit", profile.to_str().unwrap()]));
    assert!(mf.contains("# confidence low"), "{mf}");

    // Idle: the same tune is not marked.
    let (_, o, p) = idle_tune();
    for c in contention(p) {
        assert_eq!(c["contended"], false, "{c}");
        assert!(c["repeated"].is_null(), "{c}");
    }
    assert_eq!(p["recommendation"]["confidence"], "high");
    assert!(!stdout(o).contains("busy machine"), "{}", stdout(o));
}

/// Stops the hog, then runs the checks (so a failed assertion never leaves it running).
fn drop_hog(hog: Hog, checks: impl FnOnce(u32)) {
    let pid = hog.pid();
    drop(hog);
    checks(pid);
}

#[test]
fn reprofile_calls_no_regression_from_trials_on_a_busy_machine() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    // A copy of the idle tune's store (this test changes its profile).
    let store = dir.path().join("store");
    copy_dir(&idle_tune().0, &store);
    let path = profiles_in(&store)[0].clone();
    // The previous profile claims 20% more speed: on an idle machine that is a regression.
    let mut v = read_json(&path);
    claim_faster(&mut v, 1.2);
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();

    let hog = Hog::start();
    let o = run(&[
        "reprofile",
        "--profiles",
        store.to_str().unwrap(),
        "--max-age",
        "0s",
        "--wait-idle",
        "2s",
        "--drift-threshold",
        "0.05",
        "--json",
        "-q",
    ]);
    drop_hog(hog, |pid| {
        let s: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)));
        assert_eq!(o.status.code(), Some(0), "no regression from a busy machine: {s:#}");
        assert_eq!(s["regressions"], 0, "{s:#}");
        assert!(s["contended"].as_u64().unwrap() >= 1, "{s:#}");
        let busy = s["busy_at_start"].as_str().expect("it waited, then said the machine stayed busy");
        assert!(busy.contains(&format!("sh (pid {pid})")), "{busy}");
        let cmp = s["entries"][0]["drift"]["comparisons"].as_array().unwrap();
        assert!(cmp.iter().all(|c| c["verdict"] == "contended"), "{cmp:?}");
    });
}
