//! The one way the parent talks to llama.cpp: it re-executes this binary
//! with a hidden subcommand, typed input as JSON on stdin, typed output as
//! JSON on stdout. Everything that initializes a backend therefore runs in a
//! child (a CUDA context in the parent would take device memory from the
//! trials, and a crash there would be ours); the parent keeps the time limit,
//! the interrupt, the exit status and the child's last words on stderr.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::Interrupted;
use crate::interrupt;
use crate::types::LlamaDevice;

/// How long the short calls (devices, check, dry run) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// A running child: its pid, and threads collecting its output.
pub struct Spawned {
    child: std::process::Child,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<()>>,
    tail: Arc<Mutex<VecDeque<String>>>,
}

/// How a child ended.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    /// Killed at the time limit.
    pub timed_out: bool,
    pub stdout: String,
    /// Its last lines on stderr.
    pub tail: Vec<String>,
}

/// Starts `exe SUB ARGS...` with `input` on its stdin. With `echo`, the
/// child's stderr is forwarded live (llama.cpp's log for `--verbose`).
///
/// # Errors
/// When the child cannot be started.
pub fn spawn(exe: &Path, sub: &str, args: &[OsString], input: &[u8], echo: bool) -> Result<Spawned> {
    let mut child = super::live::piped(exe, sub, args)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A child that dies before reading its input shows up in its exit status.
        let _ = stdin.write_all(input);
    }
    let stdout = child.stdout.take();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut o) = stdout {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let (err, tail) = super::live::keep_tail(child.stderr.take(), echo);
    Ok(Spawned { child, out: Some(out), err: Some(err), tail })
}

impl Spawned {
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the child, calling `on_tick` every `poll`; kills it at
    /// `timeout`. Ctrl-C or SIGTERM (which reach the child too) end the
    /// wait with [`Interrupted`].
    ///
    /// # Errors
    /// [`Interrupted`], or when the child cannot be waited for.
    pub fn wait(mut self, timeout: Duration, poll: Duration, mut on_tick: impl FnMut()) -> Result<Finished> {
        let started = Instant::now();
        let (status, timed_out) = loop {
            if let Some(status) = self.child.try_wait()? {
                if interrupt::requested().is_some() {
                    return Err(anyhow::Error::new(Interrupted));
                }
                break (status, false);
            }
            if interrupt::requested().is_some() {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(anyhow::Error::new(Interrupted));
            }
            if started.elapsed() >= timeout {
                let _ = self.child.kill();
                break (self.child.wait()?, true);
            }
            on_tick();
            std::thread::sleep(poll);
        };
        let stdout = self.out.take().and_then(|h| h.join().ok()).unwrap_or_default();
        if let Some(h) = self.err.take() {
            let _ = h.join();
        }
        let tail = self.tail.lock().map(|t| t.iter().cloned().collect()).unwrap_or_default();
        Ok(Finished { status, timed_out, stdout, tail })
    }
}

/// Runs a hidden subcommand to the end and reads its JSON answer from stdout.
///
/// # Errors
/// When it cannot start, fails, runs past its time or answers nonsense; the
/// error says how it ended and its last words.
pub fn call<I: Serialize + ?Sized, O: DeserializeOwned>(
    exe: &Path,
    sub: &str,
    args: &[OsString],
    input: &I,
) -> Result<O> {
    let spawned = spawn(exe, sub, args, &serde_json::to_vec(input)?, false)?;
    let done = spawned.wait(CALL_TIMEOUT, Duration::from_millis(5), || {})?;
    if done.timed_out {
        anyhow::bail!("{sub} did not answer within {} s", CALL_TIMEOUT.as_secs());
    }
    if !done.status.success() {
        let last = telling_line(&done.tail);
        anyhow::bail!(
            "{sub} failed ({}{})",
            describe_exit(done.status),
            if last.is_empty() { String::new() } else { format!(": {last}") }
        );
    }
    serde_json::from_str(done.stdout.trim()).with_context(|| format!("{sub} printed no valid JSON"))
}

/// The ngl-tune binary to re-execute.
///
/// # Errors
/// When the current executable's path cannot be found.
pub fn current_exe() -> Result<PathBuf> {
    std::env::current_exe().context("cannot find the ngl-tune executable to run llama.cpp in")
}

/// llama.cpp's devices, listed by a child (hidden `__devices`).
///
/// # Errors
/// When the child cannot run or answers nonsense.
pub fn devices(exe: &Path, rpc: &[String]) -> Result<Vec<LlamaDevice>> {
    call(exe, "__devices", &rpc_args(rpc), &())
}

/// `--rpc LIST` for a child, when there are servers.
fn rpc_args(rpc: &[String]) -> Vec<std::ffi::OsString> {
    if rpc.is_empty() {
        Vec::new()
    } else {
        vec!["--rpc".into(), rpc.join(",").into()]
    }
}

/// Whether llama.cpp can load a model's header and vocabulary, and the
/// devices it sees: one child (hidden `__check`) answers both, so a run pays
/// for one backend start before its first trial, not two.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Check {
    pub ok: bool,
    pub error: Option<String>,
    #[serde(default)]
    pub devices: Vec<LlamaDevice>,
}

/// Asks a child whether llama.cpp can load `model` at all.
///
/// # Errors
/// When the child cannot run at all (its own failure is a `Check`).
pub fn check(exe: &Path, model: &Path, rpc: &[String], mmproj: Option<&Path>) -> Result<Check> {
    let mut args = vec![model.as_os_str().to_owned()];
    args.extend(rpc_args(rpc));
    if let Some(m) = mmproj {
        args.extend(["--mmproj".into(), m.as_os_str().to_owned()]);
    }
    let spawned = spawn(exe, "__check", &args, b"", false)?;
    let done = spawned.wait(CALL_TIMEOUT, Duration::from_millis(5), || {})?;
    Ok(serde_json::from_str(done.stdout.trim()).unwrap_or_else(|_| Check {
        ok: false,
        error: Some(if done.timed_out { "it did not answer in time".to_string() } else { describe_exit(done.status) }),
        devices: Vec::new(),
    }))
}

/// Checks that llama.cpp can load the model (its architecture,
/// hyperparameters and vocabulary), so a model this llama.cpp cannot run is
/// bad input, not a sweep of failed trials; returns llama.cpp's devices.
///
/// # Errors
/// `BadInput` with llama.cpp's reason.
pub fn check_loadable(
    exe: &Path,
    info: &crate::model::ModelInfo,
    rpc: &[String],
    mmproj: Option<&Path>,
) -> Result<Vec<LlamaDevice>> {
    let c = check(exe, &info.path, rpc, mmproj)?;
    if c.ok {
        return Ok(c.devices);
    }
    let why = c.error.unwrap_or_default();
    if let (Some(m), Some(mm)) = (mmproj, why.strip_prefix(PROJECTOR_FAILED)) {
        return Err(crate::error::bad(format!(
            "--mmproj {} does not go with {}: {}; give the projector file made for this model",
            m.display(),
            info.file_name,
            mm.trim()
        )));
    }
    Err(cannot_load(info, &why, why.contains("unknown model architecture")))
}

/// How the check says the model loads but its projector does not.
pub const PROJECTOR_FAILED: &str = "projector:";

/// Bad input: llama.cpp cannot load the model, in words (`arch`: because
/// it does not know the architecture).
#[must_use]
pub fn cannot_load(info: &crate::model::ModelInfo, why: &str, arch: bool) -> anyhow::Error {
    if arch {
        return crate::error::bad(format!(
            "{} has architecture '{}', which this llama.cpp ({}) does not support; use a model of a supported architecture or an ngl-tune built on a newer llama.cpp",
            info.path.display(),
            info.architecture,
            crate::types::LLAMA_CPP_REVISION
        ));
    }
    crate::error::bad(format!("llama.cpp cannot load {}: {why}; check the model file", info.path.display()))
}

/// "killed by signal 6 (SIGABRT)" or "exited with status 7".
#[must_use]
pub fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        let name = match sig {
            libc::SIGABRT => "SIGABRT",
            libc::SIGSEGV => "SIGSEGV",
            libc::SIGBUS => "SIGBUS",
            libc::SIGILL => "SIGILL",
            libc::SIGFPE => "SIGFPE",
            libc::SIGKILL => "SIGKILL, often the kernel's out-of-memory killer",
            libc::SIGTERM => "SIGTERM",
            libc::SIGINT => "SIGINT",
            _ => "signal",
        };
        format!("worker killed by signal {sig} ({name})")
    } else {
        match status.code() {
            Some(c) => format!("worker exited with status {c} without a result"),
            None => "worker ended without a result".to_string(),
        }
    }
}

/// The line of a child's last words that best says what went wrong: one
/// about memory, else ggml's assertion, else one naming an error, else the last.
#[must_use]
pub fn telling_line(tail: &[String]) -> String {
    let lines: Vec<&str> = tail.iter().map(|l| l.trim()).filter(|l| !l.is_empty()).collect();
    lines
        .iter()
        .rev()
        .find(|l| mentions_oom(l))
        // ggml's own abort (an assertion in a backend), before the backtrace that follows it.
        .or_else(|| lines.iter().rev().find(|l| l.contains("GGML_ASSERT") || l.contains("GGML_ABORT")))
        .or_else(|| lines.iter().rev().find(|l| l.to_ascii_lowercase().contains("error")))
        .or_else(|| lines.last())
        .map_or_else(String::new, |l| (*l).to_string())
}

/// Whether a log line says memory ran out (host or device).
#[must_use]
pub fn mentions_oom(text: &str) -> bool {
    let l = text.to_ascii_lowercase();
    [
        "out of memory",
        "failed to allocate",
        "cannot allocate memory",
        "unable to allocate",
        "outofdevicememory",
        "outofhostmemory",
        "cudamalloc failed",
        "not enough memory",
        "bad_alloc",
        "memory allocation of",
    ]
    .iter()
    .any(|p| l.contains(p))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_telling_line_is_ggmls_assertion_not_the_backtrace_after_it() {
        let tail: Vec<String> = [
            "sched_reserve: graph: nodes = 730, splits = 2",
            "/src/ggml/src/ggml-backend-meta.cpp:547: GGML_ASSERT(src_ss[0].axis != GGML_BACKEND_SPLIT_AXIS_0) failed",
            "30\t../sysdeps/unix/sysv/linux/wait4.c: No such file or directory.",
        ]
        .map(String::from)
        .to_vec();
        assert!(super::telling_line(&tail).contains("GGML_ASSERT(src_ss[0].axis"), "{}", super::telling_line(&tail));
        let oom =
            ["GGML_ASSERT(x) failed".to_string(), "ggml_vulkan: Device memory allocation of size 9 failed".to_string()];
        assert!(super::telling_line(&oom).contains("allocation"), "memory first");
    }
}
