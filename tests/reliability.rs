//! Bad input the other suites do not cover, and faults while writing: every
//! case checks the exit code, the message and that nothing partial is left.
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn an_unreadable_model_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let m = synth(dir.path(), 2);
    std::fs::set_permissions(&m, std::fs::Permissions::from_mode(0o000)).unwrap();
    // Root reads anything: drop to nobody for this run.
    let o = if is_root() {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN, "inspect", m.to_str().unwrap()])
            .output()
            .unwrap()
    } else {
        run(&["inspect", m.to_str().unwrap()])
    };
    assert_bad_input(&o, "permission denied");
    assert!(stderr(&o).contains("chmod a+r"));
}

#[test]
fn an_architecture_llama_cpp_does_not_know_is_bad_input() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 2);
    // Rename the architecture (same length keeps every offset): llama -> lxama,
    // in general.architecture and in the keys that carry it as a prefix.
    let data = std::fs::read(&m).unwrap();
    let arch_kv: &[u8] = b"general.architecture\x08\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00llama";
    let pos = data.windows(arch_kv.len()).position(|w| w == arch_kv).expect("architecture key");
    let mut patched = data.clone();
    patched[pos + arch_kv.len() - 4] = b'x';
    let mut i = 0;
    while let Some(p) = patched[i..].windows(6).position(|w| w == b"llama.") {
        patched[i + p + 1] = b'x';
        i += p + 6;
    }
    let p = dir.path().join("unknown-arch.gguf");
    std::fs::write(&p, &patched).unwrap();
    let store = dir.path().join("store");
    let o = run(&["bench", p.to_str().unwrap(), "-p", "8", "-n", "0", "-r", "1"]);
    assert_bad_input(&o, "has architecture 'lxama', which this llama.cpp");
    let o = run(&[p.to_str().unwrap(), "--profiles", store.to_str().unwrap()]);
    assert_bad_input(&o, "does not support");
    assert!(!store.exists());
}

#[test]
fn a_context_beyond_training_is_allowed_with_a_warning() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 2); // trained for 4096
    let o = run(&["bench", m.to_str().unwrap(), "-c", "8192", "-p", "8", "-n", "0", "-r", "1", "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("warning: -c 8192 is larger than the 4096 tokens"), "{}", stderr(&o));
}

/// A small tmpfs, unmounted on drop. `None` where mounting is not allowed.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap().keep();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", dir.to_str().unwrap()])
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir))
    }

    fn remount_ro(&self) {
        let s = Command::new("mount").args(["-o", "remount,ro", self.0.to_str().unwrap()]).status().unwrap();
        assert!(s.success());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in walk(dir) {
        out.push(e.strip_prefix(dir).unwrap().display().to_string());
    }
    out.sort();
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                v.extend(walk(&p));
            } else {
                v.push(p);
            }
        }
    }
    v
}

fn tune_into(model: &Path, store: &Path, reps: &str) -> std::process::Output {
    run(&[model.to_str().unwrap(), "-p", "8", "-n", "4", "-r", reps, "--profiles", store.to_str().unwrap(), "-q"])
}

#[test]
fn a_full_or_read_only_store_keeps_the_previous_profile() {
    if !is_root() {
        eprintln!("skipped: mounting a small tmpfs needs root (CI runs as root)");
        return;
    }
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 2);
    let Some(fs) = Tmpfs::new("512k") else {
        panic!("root could not mount a tmpfs");
    };
    let store = fs.0.join("store");
    let first = tune_into(&m, &store, "1");
    assert!(first.status.success(), "{}", stderr(&first));
    let profile = profiles_in(&store).pop().unwrap();
    let before = std::fs::read(&profile).unwrap();
    let listing = files_under(&store);

    // Fill the disk, leaving less than a profile needs.
    let filler = fs.0.join("filler");
    let free = {
        let out = Command::new("df").args(["-B1", "--output=avail", fs.0.to_str().unwrap()]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().nth(1).unwrap().trim().parse::<u64>().unwrap()
    };
    std::fs::write(&filler, vec![0u8; (free - 4096) as usize]).unwrap_or(());
    let full = tune_into(&m, &store, "2");
    let err = stderr(&full);
    assert_eq!(full.status.code(), Some(1), "{err}");
    assert!(err.contains("No space left on device") && err.contains("the disk is full"), "{err}");
    assert!(err.contains("this run's profile was saved to"), "the new result is not lost: {err}");
    assert_eq!(std::fs::read(&profile).unwrap(), before, "the previous profile is intact");
    // No temporary or torn files: only the profile, and a complete checkpoint
    // when one fit on the disk (it lets --resume finish the run later).
    let now: Vec<String> = files_under(&store).into_iter().filter(|f| !f.ends_with(".checkpoint.json")).collect();
    assert_eq!(now, listing, "no temporary or partial files");
    for c in checkpoints_in(&store) {
        let v = read_json(&c);
        assert_eq!(v["kind"], "checkpoint");
    }
    let saved = err.split("saved to ").nth(1).unwrap().split_whitespace().next().unwrap().trim_end_matches([';', ':']);
    let saved_json = read_json(Path::new(saved));
    assert!(schema_errors(&saved_json).is_empty());
    let _ = std::fs::remove_file(saved);
    std::fs::remove_file(&filler).unwrap();

    // Read-only: found before any measuring (the store lock cannot be taken), nothing changes.
    fs.remount_ro();
    let ro = tune_into(&m, &store, "2");
    let err = stderr(&ro);
    assert_eq!(ro.status.code(), Some(1), "{err}");
    assert!(
        err.contains("Read-only file system") && err.contains("pass --profiles with a writable directory"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "one error line: {err}");
    assert_eq!(std::fs::read(&profile).unwrap(), before);
}
