//! No path argument makes a subcommand wait: every class of thing that is
//! not what the argument should be (a FIFO, a character device, a socket, a
//! directory, a link to a device, a file far too large, a missing path) gets
//! the one-line error and exit 2 within seconds, and nothing is written.
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Runs ngl-tune and fails the test if it has not answered within `limit`.
fn answers_within(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("NGL_TUNE_TEST_FAULT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ngl-tune");
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!("ngl-tune {args:?} still waiting after {limit:?}; stderr: {}", stderr(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn quick(args: &[&str], needle: &str) {
    let o = answers_within(args, Duration::from_secs(10));
    assert_bad_input(&o, needle);
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo {}", p.display());
}

/// One of each class, in `dir`.
struct Classes {
    fifo: PathBuf,
    socket: PathBuf,
    link_to_zero: PathBuf,
    dangling: PathBuf,
    huge: PathBuf,
    dir: PathBuf,
    _listener: std::os::unix::net::UnixListener,
}

fn classes(dir: &Path) -> Classes {
    let fifo = dir.join("pipe.json");
    mkfifo(&fifo);
    let socket = dir.join("sock.json");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let link_to_zero = dir.join("zero.json");
    std::os::unix::fs::symlink("/dev/zero", &link_to_zero).unwrap();
    let dangling = dir.join("dangling.json");
    std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
    // Sparse: 64 MiB on paper, nothing on disk.
    let huge = dir.join("huge.json");
    std::fs::File::create(&huge).unwrap().set_len(64 << 20).unwrap();
    let sub = dir.join("subdir");
    std::fs::create_dir(&sub).unwrap();
    Classes { fifo, socket, link_to_zero, dangling, huge, dir: sub, _listener: listener }
}

#[test]
fn model_arguments_of_every_kind_are_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let c = classes(tmp.path());
    let store = tmp.path().join("store");
    let s = store.to_str().unwrap();
    for (path, needle) in [
        (&c.fifo, "is a FIFO (named pipe), not a regular file"),
        (&c.socket, "cannot be opened"),
        (&c.link_to_zero, "is a character device, not a regular file"),
        (&PathBuf::from("/dev/zero"), "is a character device, not a regular file"),
        (&c.dangling, "no such file"),
        (&c.dir, "is a directory"),
    ] {
        let p = path.to_str().unwrap();
        quick(&["inspect", p], needle);
        quick(&["bench", p, "-p", "8", "-n", "4", "-r", "1"], needle);
        quick(&["tune", p, "--profiles", s], needle);
        quick(&[p, "--profiles", s], needle);
    }
    assert!(!store.exists(), "nothing was written");
}

#[test]
fn profile_and_modelfile_arguments_of_every_kind_are_refused_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let c = classes(tmp.path());
    let profile = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/example-gemma-3-270m-cpu.json");
    let profile = profile.to_str().unwrap();
    for (path, needle) in [
        (&c.fifo, "is a FIFO (named pipe), not a regular file"),
        (&c.link_to_zero, "is a character device, not a regular file"),
        (&c.huge, "is larger than 16777216 bytes"),
        (&c.dangling, "no such file"),
    ] {
        let p = path.to_str().unwrap();
        quick(&["emit", p], needle);
        quick(&["history", p], needle);
    }
    // Output paths: what is there and not a regular file is never replaced or waited on.
    let mf_huge = tmp.path().join("Modelfile");
    std::fs::File::create(&mf_huge).unwrap().set_len(8 << 20).unwrap();
    for (path, needle) in [
        (c.fifo.to_str().unwrap(), "--write-modelfile"),
        ("/dev/null", "is a character device; pass the path of a regular file"),
        (c.socket.to_str().unwrap(), "is a socket"),
        (mf_huge.to_str().unwrap(), "is larger than 4194304 bytes"),
    ] {
        quick(&["emit", profile, "--write-modelfile", path], needle);
    }
    quick(&["emit", profile, "--chart", c.fifo.to_str().unwrap()], "is a FIFO");
    quick(&["emit", profile, "--chart", "/dev/zero"], "is a character device");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&c.fifo).unwrap().file_type().is_fifo(), "the FIFO was not replaced");
    assert_eq!(std::fs::metadata(&mf_huge).unwrap().len(), 8 << 20, "left as it was");
}

#[test]
fn store_arguments_and_store_contents_never_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let c = classes(tmp.path());
    for dir_arg in [c.fifo.to_str().unwrap(), "/dev/zero", c.huge.to_str().unwrap()] {
        quick(&["profiles", "list", "--profiles", dir_arg], "not a directory");
        quick(&["reprofile", "--profiles", dir_arg], "not a directory");
    }
    let store = tmp.path().join("store");
    std::fs::create_dir_all(store.join("somemachine")).unwrap();
    quick(
        &["reprofile", "--profiles", store.to_str().unwrap(), "--update-modelfiles", c.fifo.to_str().unwrap()],
        "is not a directory",
    );
    // A FIFO or a device named like a profile inside the store is passed over.
    mkfifo(&store.join("somemachine/x.json"));
    std::os::unix::fs::symlink("/dev/zero", store.join("somemachine/y.json")).unwrap();
    let o =
        answers_within(&["profiles", "list", "--profiles", store.to_str().unwrap(), "--json"], Duration::from_secs(10));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "[]");
}

/// A tune's settings files (`--ollama-env`, `--server-env`, `--mmproj`) on a
/// FIFO or a device are refused at once, and so is a depth the context
/// cannot hold (never measured silently at a smaller one).
#[test]
fn a_tunes_settings_files_never_hang_and_a_depth_must_fit() {
    let tmp = tempfile::tempdir().unwrap();
    let c = classes(tmp.path());
    let m = synth(tmp.path(), 2);
    let m = m.to_str().unwrap();
    for flag in ["--ollama-env", "--server-env", "--mmproj"] {
        quick(&[m, flag, c.fifo.to_str().unwrap()], "is a FIFO (named pipe), not a regular file");
        quick(&[m, flag, "/dev/zero"], "is a character device, not a regular file");
        quick(&[m, flag, c.dangling.to_str().unwrap()], "no such file");
    }
    quick(&[m, "-c", "1024", "--depth", "5000"], "--depth 5000 leaves no room in the 1024-token context");
    quick(&[m, "--ctx", "512,4096", "--depth", "1000", "-p", "64", "-n", "16"], "give --depth 448 or less");
}
