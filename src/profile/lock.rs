//! One measuring run per machine on a store at a time: an advisory `flock`
//! on `<store>/<machine>/.lock`. Two sweeps on one GPU would spoil each
//! other's numbers and race on the same profiles. The kernel drops the lock
//! when its holder dies, so a lock left by a dead process is simply taken.
//! Machines sharing a store lock only their own directory.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

/// Held while a tuner or reprofile works; released on drop or death.
#[derive(Debug)]
pub struct StoreLock {
    file: File,
    pub path: PathBuf,
}

/// Someone else holds the lock and `--no-wait` was given.
#[derive(Debug)]
pub struct Locked(pub String);

impl std::fmt::Display for Locked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Locked {}

fn try_flock(file: &File) -> bool {
    // SAFETY: flock on a valid open descriptor.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

fn holder(file: &mut File) -> String {
    let mut s = String::new();
    let _ = file.seek(SeekFrom::Start(0));
    // Who holds it is one short line; never read more than that.
    let _ = Read::by_ref(file).take(4096).read_to_string(&mut s);
    let s = s.trim();
    if s.is_empty() {
        "another ngl-tune".to_string()
    } else {
        s.to_string()
    }
}

impl StoreLock {
    /// Takes the lock of `machine` in `store`, waiting (and saying so once)
    /// unless `no_wait`.
    ///
    /// # Errors
    /// [`Locked`] with `no_wait` when it is held; I/O errors.
    pub fn acquire(store: &Path, machine: &str, no_wait: bool, what: &str) -> Result<StoreLock> {
        let dir = store.join(machine);
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(".lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| {
                let hint = match e.raw_os_error() {
                    Some(libc::EROFS) => {
                        "; the store is on a read-only file system: pass --profiles with a writable directory"
                    }
                    Some(libc::EACCES | libc::EPERM) => {
                        "; no permission: pass --profiles with a directory you can write"
                    }
                    Some(libc::ENOSPC) => "; the disk is full: free space and run again",
                    _ => "",
                };
                anyhow::anyhow!("cannot open the store lock {}: {e}{hint}", path.display())
            })?;
        if let Ok(md) = file.metadata() {
            if !md.is_file() {
                anyhow::bail!(crate::error::BadInput(format!(
                    "the store lock {} is {}; remove it (ngl-tune creates a regular file there)",
                    path.display(),
                    crate::fsio::kind_of(md.file_type())
                )));
            }
        }
        let mut said = false;
        while !try_flock(&file) {
            let who = holder(&mut file);
            if no_wait {
                return Err(anyhow::Error::new(Locked(format!(
                    "the profile store {} is in use by {who}; try again when it finishes, or run without --no-wait to wait for it",
                    dir.display()
                ))));
            }
            if !said {
                eprintln!("waiting for {who} to finish with the profile store {} ...", dir.display());
                said = true;
            }
            std::thread::sleep(Duration::from_millis(200));
            if crate::interrupt::requested().is_some() {
                anyhow::bail!(crate::error::Interrupted);
            }
        }
        // Write, then trim: a waiter reading meanwhile sees a whole line, never an empty file.
        let who = format!("pid {} ({what}) since {}", std::process::id(), crate::clock::now_rfc3339());
        let _ = file.seek(SeekFrom::Start(0));
        let _ = file.write_all(who.as_bytes());
        let _ = file.set_len(who.len() as u64);
        let _ = file.flush();
        Ok(StoreLock { file, path })
    }
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
        // SAFETY: unlocking our own descriptor.
        unsafe {
            libc::flock(self.file.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_taker_is_refused_with_no_wait_and_gets_it_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let a = StoreLock::acquire(dir.path(), "m", true, "first").unwrap();
        let e = StoreLock::acquire(dir.path(), "m", true, "second").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("is in use by pid") && msg.contains("(first)"), "{msg}");
        assert!(e.downcast_ref::<Locked>().is_some());
        // Other machines in a shared store are not blocked.
        let other = StoreLock::acquire(dir.path(), "other-machine", true, "x");
        assert!(other.is_ok());
        drop(a);
        assert!(StoreLock::acquire(dir.path(), "m", true, "third").is_ok());
    }
}
