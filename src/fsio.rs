//! Opening what a user names without waiting on it: every path argument is
//! opened without blocking (a FIFO would otherwise wait for a writer
//! forever), checked for what it is on the opened descriptor (no race
//! between the check and the read), and read only up to the largest size a
//! valid file of its kind can have (`/dev/zero` or a runaway file never ends).

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{Context, Result};

use crate::error::bad;

/// Largest profile or checkpoint ngl-tune reads. Real profiles are tens of
/// kilobytes; even a long sweep with every sample kept stays far below this.
pub const MAX_PROFILE_BYTES: u64 = 16 << 20;

/// Largest Modelfile read. A long LICENSE block is tens of kilobytes.
pub const MAX_MODELFILE_BYTES: u64 = 4 << 20;

/// What a path is, in words, for errors ("a FIFO", "a character device").
#[must_use]
pub fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// Opens `path` for reading if it is a regular file. `what` names the
/// argument and the fix ("pass the path of a .gguf model").
///
/// # Errors
/// `BadInput` for a missing, unreadable or non-regular path.
pub fn open_regular(path: &Path, fix: &str) -> Result<File> {
    let shown = path.display();
    // O_NONBLOCK: opening a FIFO for reading would wait for a writer.
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(|e| {
        match e.kind() {
            std::io::ErrorKind::NotFound => bad(format!("{shown}: no such file; {fix}")),
            std::io::ErrorKind::PermissionDenied => {
                bad(format!("{shown}: permission denied; make it readable (chmod a+r) or run as the user who owns it"))
            }
            _ => bad(format!("{shown}: cannot be opened ({e}); {fix}")),
        }
    })?;
    let md = f.metadata().map_err(|e| bad(format!("{shown}: cannot be read ({e}); {fix}")))?;
    if !md.file_type().is_file() {
        return Err(bad(format!("{shown} is {}, not a regular file; {fix}", kind_of(md.file_type()))));
    }
    Ok(f)
}

/// Reads a whole regular file of at most `max` bytes.
///
/// # Errors
/// `BadInput` as [`open_regular`], or when the file is larger than `max`.
pub fn read_regular(path: &Path, max: u64, fix: &str) -> Result<Vec<u8>> {
    let f = open_regular(path, fix)?;
    let mut buf = Vec::new();
    // One byte more than allowed tells a file at the limit from one past it,
    // even where the size in the metadata lies (procfs, a file still growing).
    f.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| bad(format!("{}: cannot be read ({e}); {fix}", path.display())))?;
    if buf.len() as u64 > max {
        return Err(bad(format!(
            "{} is larger than {} bytes, more than any valid file of its kind; {fix}",
            path.display(),
            max
        )));
    }
    Ok(buf)
}

/// Refuses an output path that exists and is not a regular file (writing
/// would replace a FIFO or a device with a file, or wait on it), or whose
/// directory does not exist. `opt` names the option.
///
/// # Errors
/// `BadInput` naming the option, the path and the fix.
pub fn check_output_file(p: &Path, opt: &str) -> Result<()> {
    if let Ok(md) = std::fs::metadata(p) {
        if !md.file_type().is_file() {
            return Err(bad(format!(
                "{opt} {} is {}; pass the path of a regular file",
                p.display(),
                kind_of(md.file_type())
            )));
        }
    }
    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(bad(format!(
                "{opt} {}: directory {} does not exist; create it or pass another path",
                p.display(),
                dir.display()
            )));
        }
    }
    Ok(())
}

/// Refuses a path that exists and is not a directory. `opt` names the option.
///
/// # Errors
/// `BadInput` naming the option, the path and the fix.
pub fn check_dir_arg(dir: &Path, opt: &str, what: &str) -> Result<()> {
    match std::fs::metadata(dir) {
        Ok(md) if !md.is_dir() => Err(bad(format!(
            "{opt} {} is {}, not a directory; pass a directory for {what}",
            dir.display(),
            if md.is_file() { "a file" } else { kind_of(md.file_type()) }
        ))),
        _ => Ok(()),
    }
}

/// Writes `bytes` to `path` so that readers see the old file or the new one,
/// never a torn one. On any error the old file is untouched and the
/// temporary file is removed.
///
/// # Errors
/// I/O errors, with the path named.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        // Make the rename itself durable.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        let hint = match e.raw_os_error() {
            Some(libc::ENOSPC) => "; the disk is full: free space and run again (the previous file is intact)",
            Some(libc::EROFS) => "; the file system is read-only: pass --profiles with a writable directory",
            Some(libc::EACCES | libc::EPERM) => "; no permission: pass --profiles with a directory you can write",
            _ => "",
        };
        return Err(anyhow::anyhow!("cannot write {}: {e}{hint}", path.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a/b/x.json");
        atomic_write(&p, b"one").unwrap();
        atomic_write(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        atomic_write(&p, b"old").unwrap();
        // A directory where the temp file should go makes the write fail.
        let tmp = dir.path().join(format!(".x.json.tmp.{}", std::process::id()));
        std::fs::create_dir(&tmp).unwrap();
        assert!(atomic_write(&p, b"new").is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
    }

    fn fifo(dir: &Path) -> std::path::PathBuf {
        let p = dir.join("pipe");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        p
    }

    #[test]
    fn a_fifo_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = fifo(dir.path());
        // Opening a FIFO with no writer blocks: read in a thread, so a
        // regression fails here instead of hanging the suite.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(read_regular(&p, 10, "pass a file").map_err(|e| e.to_string())));
        let e =
            rx.recv_timeout(std::time::Duration::from_secs(60)).expect("a FIFO is refused, not opened").unwrap_err();
        assert!(e.contains("is a FIFO (named pipe), not a regular file; pass a file"), "{e}");
    }

    #[test]
    fn devices_and_directories_are_refused_and_sizes_bounded() {
        let e = read_regular(Path::new("/dev/zero"), 10, "fix").unwrap_err().to_string();
        assert!(e.contains("is a character device"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = read_regular(dir.path(), 10, "fix").unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        let f = dir.path().join("f");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(read_regular(&f, 10, "fix").unwrap(), b"0123456789");
        let e = read_regular(&f, 9, "fix").unwrap_err().to_string();
        assert!(e.contains("larger than 9 bytes"), "{e}");
        let e = check_output_file(Path::new("/dev/null"), "--chart").unwrap_err().to_string();
        assert!(e.contains("--chart /dev/null is a character device"), "{e}");
        let e = check_dir_arg(&f, "--profiles", "the store").unwrap_err().to_string();
        assert!(e.contains("is a file, not a directory"), "{e}");
    }
}
