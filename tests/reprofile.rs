//! Nightly re-profiling: staleness, drift, history, exit codes, the store
//! lock, Modelfile updates, and profiles that are not ours to touch.
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use common::*;

/// The real model tuned CPU-only (threads), small workload: stable numbers
/// in seconds. Tuned once for this file (under the heavy lock, by the first
/// test that asks); each test gets a copy of the store to change.
/// At a 1024-token context (depth 512): the default 4096 (depth 2048) says
/// no more here and costs each tune and re-tune a 2048-token fill at -t 1
/// (18 s of a 23 s tune on a 2-core Xeon).
fn tuned_store(dir: &Path) -> (PathBuf, PathBuf) {
    static STORE: OnceLock<PathBuf> = OnceLock::new();
    copy_of(STORE.get_or_init(|| tuned_store_of(&fixture_dir("reprofile-real"), &real_model(), &["-c", "1024"]).0), dir)
}

/// The same with a synthetic model: a tenth of the time, for tests whose
/// point is not the numbers (what is skipped, listed, left alone, rewritten).
/// The model stays where the one tune wrote it (`model.path` of the profile).
fn tuned_synth_store(dir: &Path) -> (PathBuf, PathBuf) {
    static STORE: OnceLock<PathBuf> = OnceLock::new();
    let store = STORE.get_or_init(|| {
        let d = fixture_dir("reprofile-synth");
        let m = ngl_tune::synth::SynthSpec::default().with_n_layer(4).with_dims(256, 512, 4);
        let path = d.join("synth.gguf");
        ngl_tune::synth::write_model(&path, &m).unwrap();
        tuned_store_of(&d, &path, &[]).0
    });
    copy_of(store, dir)
}

fn tuned_store_of(dir: &Path, m: &Path, extra: &[&str]) -> (PathBuf, PathBuf) {
    let store = dir.join("store");
    let args = [m.to_str().unwrap(), "-p", "32", "-n", "32", "-r", "3", "--profiles", store.to_str().unwrap(), "-q"];
    let o = run(&[&args[..], extra].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let p = profiles_in(&store).pop().unwrap();
    (store, p)
}

/// A test's own copy of a tuned store, and its profile.
fn copy_of(store: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let to = dir.join("store");
    copy_dir(store, &to);
    let p = profiles_in(&to).pop().unwrap();
    (to, p)
}

/// Runs reprofile on the store. These tests are about staleness, exit codes,
/// history and the lock, not speed: these shared machines move a 32-token
/// test by up to ~10% between runs (seen: pp32 8.7% slower, p 0.003), so
/// unless a test sets its own, the drift threshold sits above that noise.
fn reprofile(store: &Path, extra: &[&str]) -> std::process::Output {
    run(&reprofile_args(store, extra))
}

fn reprofile_args<'a>(store: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    // No waiting for an idle machine: cargo runs other tests beside these.
    let mut a = vec!["reprofile", "--profiles", store.to_str().unwrap(), "-q", "--wait-idle", "0"];
    a.extend_from_slice(extra);
    if !extra.contains(&"--drift-threshold") {
        a.extend_from_slice(&["--drift-threshold", "0.5"]);
    }
    a
}

fn edit(p: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v = read_json(p);
    f(&mut v);
    std::fs::write(p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn fresh_is_skipped_unmeasured_and_a_driver_change_is_retuned_with_its_reason() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    // Staleness and its reason, not speeds: the synthetic model.
    let (store, p) = tuned_synth_store(dir.path());
    // Skipped without measuring: every trial would abort, and the profile's
    // bytes stay as they were. (An outcome, not a time: a timed "under a
    // second" failed at 1.76 s on a CI machine busy with other tests.)
    let before = std::fs::read(&p).unwrap();
    let o = run_env(&reprofile_args(&store, &[]), &[(ngl_tune::engine::worker::FAULT_ENV, "abort")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("fresh    synth.gguf"), "{}", stdout(&o));
    assert_eq!(std::fs::read(&p).unwrap(), before, "a fresh profile is left byte for byte");
    assert_eq!(profiles_in(&store).len(), 1);

    edit(&p, |v| {
        v["fingerprint"] = "0123456789abcdef".into();
        v["hardware"]["gpus"] = serde_json::json!([{
            "index": 0, "name": "NVIDIA H200", "uuid": "GPU-0", "driver_version": "550.54.15",
            "memory_total": 150_000_000_000u64, "memory_free": 149_000_000_000u64,
            "pcie_gen_current": 5, "pcie_gen_max": 5, "pcie_width_current": 16, "pcie_width_max": 16,
            "memory_bus_width_bits": 6144, "memory_clock_max_mhz": 2619, "bandwidth_gbs": 4022.0
        }]);
    });
    let dry = reprofile(&store, &["--dry-run"]);
    assert_eq!(dry.status.code(), Some(0));
    assert!(stdout(&dry).contains("would re-tune"), "{}", stdout(&dry));
    assert!(
        profiles_in(&store).len() == 1 && read_json(&p)["fingerprint"] == "0123456789abcdef",
        "dry run writes nothing"
    );

    // (Its microsecond trials move more between runs than the real model's: no drift verdict here.)
    let o = reprofile(&store, &["--drift-threshold", "0.99"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", stderr(&o));
    assert!(out.contains("stale    synth.gguf: GPU 0 (NVIDIA H200, driver 550.54.15) is gone; re-tuning"), "{out}");
    assert_ne!(read_json(&p)["fingerprint"], "0123456789abcdef", "re-tuned on this hardware");
    assert!(schema_errors(&read_json(&p)).is_empty());
}

#[test]
fn a_previous_profile_half_again_faster_is_a_regression_and_noise_is_not() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let (store, p) = tuned_store(dir.path());

    // Same machine, measured again: within noise (see `reprofile`), exit 0.
    let o = reprofile(&store, &["--max-age", "0s", "--json"]);
    let s: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)));
    assert_eq!(o.status.code(), Some(0), "{s:#}");
    assert_eq!(s["regressions"], 0, "{s:#}");
    assert_eq!(s["retuned"], 1);
    assert_eq!(s["exit_code"], 0);
    let cmp = s["entries"][0]["drift"]["comparisons"].as_array().unwrap();
    assert!(cmp.len() >= 2, "every setting measured in both is compared: {cmp:?}");

    // The previous profile claims 50% more speed than this machine gives: a regression, exit 3.
    // (20% was once within what two runs on this 2-core machine differ by
    // when a test beside them starts: a verdict noise could flip.)
    edit(&p, |v| claim_faster(v, 1.5));
    // The default threshold (5%): the claimed 50% is far beyond it and the noise.
    let o = reprofile(&store, &["--max-age", "0s", "--drift-threshold", "0.05"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(3), "{out}");
    assert!(out.contains("REGRESSION tg32 @ d512 at ngl 0"), "measured at half the 1024 context: {out}");
    assert!(out.contains("regressions"), "{out}");

    // History: every replaced version is kept, and listed in order.
    let h = run(&["history", real_model().to_str().unwrap(), "--profiles", store.to_str().unwrap(), "--json"]);
    assert!(h.status.success(), "{}", stderr(&h));
    let versions: Vec<serde_json::Value> = serde_json::from_str(&stdout(&h)).unwrap();
    assert_eq!(versions.len(), 3, "the first tune and two re-tunes: {versions:#?}");
    let times: Vec<&str> = versions.iter().map(|v| v["created_at"].as_str().unwrap()).collect();
    let mut sorted = times.clone();
    sorted.sort();
    assert_eq!(times, sorted);
    assert_eq!(versions[2]["current"], true);
    let text = stdout(&run(&["history", p.to_str().unwrap()]));
    assert!(text.contains("3 versions") && text.contains("current"), "{text}");
}

#[test]
fn a_quick_profile_claiming_far_more_speed_is_a_regression_once_measured_again() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let m = real_model();
    // At 1024 tokens (depth 512), as `tuned_store`: the fill, not the verdict, is what 4096 adds.
    let o =
        run(&[m.to_str().unwrap(), "--quick", "-t", "2", "-c", "1024", "--profiles", store.to_str().unwrap(), "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p = profiles_in(&store).pop().unwrap();
    // Two repetitions a setting: Welch's test over two samples rarely clears 5%, so a
    // first verdict may be "inconclusive"; the setting is measured again until it is clear.
    // The claim is beyond what the machine moves between two runs: on a 2-core Xeon the
    // re-profile once measured tg32 at -t 2 33% faster than the tune a minute before it
    // (18.2 against 24.2 t/s, nothing else running), so a claimed 25% read as an improvement.
    edit(&p, |v| claim_faster(v, 1.6));
    let o = reprofile(&store, &["--max-age", "0s", "--drift-threshold", "0.05", "--json"]);
    let s: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)));
    assert_eq!(o.status.code(), Some(3), "a confirmed regression: {s:#}");
    assert!(s["regressions"].as_u64().unwrap() >= 1, "{s:#}");
    let cmp = s["entries"][0]["drift"]["comparisons"].as_array().unwrap();
    assert!(cmp.iter().all(|c| c["verdict"] != "same" || c["change_pct"].as_f64().unwrap().abs() < 5.0), "{cmp:#?}");
}

#[test]
fn two_reprofiles_at_once_take_turns_and_lose_nothing() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    // The lock and the history, not speeds: the synthetic model, whose
    // microsecond trials move more between runs than any drift verdict.
    let (store, p) = tuned_synth_store(dir.path());
    let spawn = || {
        let a = reprofile_args(&store, &["--max-age", "0s", "--drift-threshold", "0.99"]);
        Command::new(BIN)
            .args(&a)
            .env(RETRY_WAIT.0, RETRY_WAIT.1)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let first = spawn();
    let second = spawn();
    // While they run, a third that will not wait is turned away.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let third = reprofile(&store, &["--max-age", "0s", "--no-wait"]);
    let a = first.wait_with_output().unwrap();
    let b = second.wait_with_output().unwrap();
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    assert_eq!(b.status.code(), Some(0), "{}", stderr(&b));
    let waited = [&a, &b].iter().filter(|o| stderr(o).contains("waiting for ")).count();
    assert_eq!(waited, 1, "exactly one waited: {} / {}", stderr(&a), stderr(&b));
    assert_eq!(third.status.code(), Some(1), "{}", stderr(&third));
    assert!(stderr(&third).contains("is in use by"), "{}", stderr(&third));
    // Both re-tunes landed: two replaced versions in history, a valid current profile.
    let h = run(&["history", p.to_str().unwrap(), "--json"]);
    let versions: Vec<serde_json::Value> = serde_json::from_str(&stdout(&h)).unwrap();
    assert_eq!(versions.len(), 3, "{versions:#?}");
    assert!(schema_errors(&read_json(&p)).is_empty());
    let stray: Vec<_> = std::fs::read_dir(p.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp."))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn profiles_that_are_not_ours_are_named_skipped_and_left_alone() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let (store, p) = tuned_synth_store(dir.path());
    let mdir = p.parent().unwrap();
    let bad = [
        ("notjson.json", "{ this is not json".to_string()),
        ("future.json", r#"{"schema_version": 99}"#.to_string()),
        ("partial.json", r#"{"schema_version": 1, "machine_id": "x"}"#.to_string()),
    ];
    for (n, c) in &bad {
        std::fs::write(mdir.join(n), c).unwrap();
    }
    let mut other = read_json(&p);
    other["machine_id"] = "another-host".into();
    let other_text = serde_json::to_string_pretty(&other).unwrap();
    std::fs::write(mdir.join("other.json"), &other_text).unwrap();
    let o = reprofile(&store, &[]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("notjson.json is not JSON"), "{out}");
    assert!(out.contains("future.json has schema_version 99"), "{out}");
    assert!(out.contains("partial.json is not a complete profile"), "{out}");
    assert!(out.contains("made on machine another-host, not this one"), "{out}");
    for (n, c) in &bad {
        assert_eq!(&std::fs::read_to_string(mdir.join(n)).unwrap(), c, "{n} untouched");
    }
    assert_eq!(std::fs::read_to_string(mdir.join("other.json")).unwrap(), other_text);
    let h = run(&["history", mdir.join("future.json").to_str().unwrap()]);
    assert_bad_input(&h, "schema_version 99");
}

#[test]
fn changed_recommendations_update_the_modelfiles_that_use_the_model() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let (store, p) = tuned_synth_store(dir.path());
    let mdir = dir.path().join("modelfiles");
    std::fs::create_dir(&mdir).unwrap();
    let model = PathBuf::from(read_json(&p)["model"]["path"].as_str().unwrap());
    let ours = format!("FROM {}\nSYSTEM \"\"\"Be brief.\"\"\"\nPARAMETER num_thread 1\n", model.display());
    let theirs = "FROM /models/other.gguf\nPARAMETER num_thread 1\n";
    std::fs::write(mdir.join("gemma.modelfile"), &ours).unwrap();
    std::fs::write(mdir.join("other.modelfile"), theirs).unwrap();
    // The old profile recommended 1 thread; this machine is fastest with more.
    edit(&p, |v| {
        v["recommendation"]["n_threads"] = 1.into();
    });
    let o = reprofile(&store, &["--max-age", "0s", "--update-modelfiles", mdir.to_str().unwrap()]);
    let out = stdout(&o);
    assert!(o.status.code() == Some(0) || o.status.code() == Some(3), "{out}");
    let new = read_json(&p);
    let threads = new["recommendation"]["n_threads"].as_u64().unwrap();
    if threads != 1 {
        assert!(out.contains("updated"), "{out}");
        let text = std::fs::read_to_string(mdir.join("gemma.modelfile")).unwrap();
        assert!(text.contains(&format!("PARAMETER num_thread {threads}")), "{text}");
        assert!(text.contains("SYSTEM \"\"\"Be brief.\"\"\""));
        assert_eq!(std::fs::read_to_string(mdir.join("gemma.modelfile.bak")).unwrap(), ours);
    }
    assert_eq!(
        std::fs::read_to_string(mdir.join("other.modelfile")).unwrap(),
        theirs,
        "other models' Modelfiles are left alone"
    );
}

#[test]
fn profiles_list_shows_every_machine() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let (store, p) = tuned_synth_store(dir.path());
    let mut other = read_json(&p);
    other["machine_id"] = "gpu-node-7".into();
    let odir = store.join("gpu-node-7");
    std::fs::create_dir_all(&odir).unwrap();
    std::fs::write(odir.join(p.file_name().unwrap()), serde_json::to_string(&other).unwrap()).unwrap();
    let o = run(&["profiles", "list", "--profiles", store.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(rows.len(), 2);
    let machines: Vec<&str> = rows.iter().map(|r| r["machine"].as_str().unwrap()).collect();
    assert!(machines.contains(&"gpu-node-7"));
    assert_eq!(rows.iter().filter(|r| r["this_machine"] == true).count(), 1);
    let text = stdout(&run(&["profiles", "list", "--profiles", store.to_str().unwrap()]));
    assert!(text.contains("(this machine)") && text.contains("gpu-node-7"), "{text}");
    // A re-profile of this machine leaves the other machine's profile alone.
    let before = std::fs::read(odir.join(p.file_name().unwrap())).unwrap();
    let _ = reprofile(&store, &["--max-age", "0s"]);
    assert_eq!(std::fs::read(odir.join(p.file_name().unwrap())).unwrap(), before);
}
