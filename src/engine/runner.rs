//! Spawns the trial worker (this binary's hidden `__trial` subcommand),
//! enforces its time limit, keeps its stderr, and classifies how it ended.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::{interrupt, TrialResult, TrialSpec, TrialStatus};
use crate::probe::host::HostSource;
use crate::probe::nvml::NvmlSource;
use crate::probe::{MemorySource, Sampler};

/// Prefix of the worker's one result line on stdout, so stray output from a
/// backend cannot be mistaken for it.
pub const RESULT_PREFIX: &str = "NGL_TUNE_RESULT ";
const TAIL_LINES: usize = 12;

/// How trials are run. One place decides the executable and the limits.
#[derive(Debug, Clone)]
pub struct Runner {
    /// The ngl-tune binary to re-execute.
    pub exe: PathBuf,
    pub timeout: Duration,
    /// Forward the worker's stderr (llama.cpp's log) live.
    pub verbose: bool,
    /// How often the watcher wakes to check the worker.
    pub poll: Duration,
    /// Memory sampling interval (zero: no sampling).
    pub sample_interval: Duration,
    /// Why NVML is not sampled, if it is not.
    pub nvml_note: Option<String>,
    /// Other processes may use this share of the trial's threads (in cores)
    /// before the trial counts as contended.
    pub busy_threshold: f64,
    /// Wait before measuring a contended trial again.
    pub retry_wait: Duration,
}

/// GPU utilization (percent, before the worker starts) above which
/// another process is taken to be using the GPU.
pub const GPU_BUSY_PCT: u32 = 10;

impl Runner {
    /// A runner that re-executes the current binary.
    ///
    /// # Errors
    /// When the current executable's path cannot be found.
    pub fn current(timeout: Duration, verbose: bool) -> Result<Self> {
        let exe = std::env::current_exe().context("cannot find the ngl-tune executable to run trials")?;
        let nvml_note = crate::probe::nvml::open().err();
        Ok(Runner {
            exe,
            timeout,
            verbose,
            poll: Duration::from_millis(20),
            sample_interval: Duration::from_millis(20),
            nvml_note,
            busy_threshold: crate::probe::cpu::DEFAULT_BUSY_THRESHOLD,
            retry_wait: Duration::from_secs(3),
        })
    }

    #[must_use]
    pub fn with_busy_threshold(mut self, share_of_threads: f64) -> Self {
        self.busy_threshold = share_of_threads;
        self
    }

    /// Runs a trial; when other processes took more than the threshold
    /// while it ran, waits a moment and measures it once more, keeping the
    /// second measurement (marked `repeated`, still `contended` if the
    /// machine stayed busy).
    ///
    /// # Errors
    /// As [`Runner::run`], and an interrupt during the wait.
    pub fn run_settled(&self, spec: &TrialSpec, mut on_tick: impl FnMut(u32)) -> Result<TrialResult> {
        let first = self.run(spec, &mut on_tick)?;
        if first.status != TrialStatus::Ok || !first.contended() {
            return Ok(first);
        }
        let waited = Instant::now();
        while waited.elapsed() < self.retry_wait {
            if interrupt::requested().is_some() {
                return Err(anyhow::Error::new(Interrupted));
            }
            std::thread::sleep(self.poll);
        }
        let mut second = self.run(spec, &mut on_tick)?;
        if let Some(c) = second.contention.as_mut() {
            c.repeated = true;
            c.first_others_cores = first.contention.as_ref().map(|f| f.others_cores_mean);
        }
        Ok(second)
    }

    #[must_use]
    pub fn with_sample_interval(mut self, interval: Duration) -> Self {
        self.sample_interval = interval;
        self
    }

    fn sources(&self) -> Vec<Box<dyn MemorySource>> {
        let mut v: Vec<Box<dyn MemorySource>> = vec![Box::new(HostSource::new())];
        if self.nvml_note.is_none() {
            if let Ok(n) = NvmlSource::open() {
                v.push(Box::new(n));
            }
        }
        v
    }

    /// Runs one trial in a child process. `on_tick` is called every poll
    /// interval with the child's PID while it runs (the memory sampler and
    /// the progress bar hang off it).
    ///
    /// # Errors
    /// Only when the worker cannot be started at all; everything the worker
    /// does is a [`TrialResult`].
    pub fn run(&self, spec: &TrialSpec, mut on_tick: impl FnMut(u32)) -> Result<TrialResult> {
        let started = Instant::now();
        let mut child = Command::new(&self.exe)
            .arg("__trial")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start the trial worker {}", self.exe.display()))?;
        let pid = child.id();
        let gpu_before = if self.nvml_note.is_none() {
            crate::probe::nvml::open().ok().map(|n| crate::probe::nvml::busy_before(&n, &[pid, std::process::id()]))
        } else {
            None
        };
        let monitor = crate::probe::cpu::Monitor::start(Some(pid));
        let sampler =
            (!self.sample_interval.is_zero()).then(|| Sampler::start(self.sources(), self.sample_interval, Some(pid)));
        let mut spec = spec.clone();
        spec.sample_interval_ms = u64::try_from(self.sample_interval.as_millis()).unwrap_or(u64::MAX);
        let spec = &spec;
        let spec_json = serde_json::to_string(spec)?;
        if let Some(mut stdin) = child.stdin.take() {
            // A worker that dies before reading its spec shows up in its exit status.
            let _ = stdin.write_all(spec_json.as_bytes());
        }

        let stdout = child.stdout.take();
        let out_thread = std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut o) = stdout {
                let _ = o.read_to_string(&mut s);
            }
            s
        });
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
        let err_thread = {
            let tail = Arc::clone(&tail);
            let stderr = child.stderr.take();
            let verbose = self.verbose;
            std::thread::spawn(move || {
                let Some(e) = stderr else { return };
                for line in BufReader::new(e).lines().map_while(Result::ok) {
                    if verbose {
                        eprintln!("{line}");
                    }
                    if let Ok(mut t) = tail.lock() {
                        if t.len() == TAIL_LINES {
                            t.pop_front();
                        }
                        t.push_back(line);
                    }
                }
            })
        };

        let (status, timed_out) = self.wait(&mut child, pid, &mut on_tick)?;
        let sampled = sampler.map(Sampler::stop).unwrap_or_default();
        let mut contention = monitor.stop(self.busy_threshold * f64::from(spec.n_threads.max(1)));
        if let (Some(c), Some((util, others))) = (contention.as_mut(), gpu_before) {
            c.gpu_util_before_pct = util;
            c.gpu_others = others;
            // Busy and held by someone else: the last trial's worker, just
            // gone, can still show in the utilization but not in the list.
            if util.is_some_and(|u| u > GPU_BUSY_PCT) && !c.gpu_others.is_empty() {
                c.contended = true;
            }
        }
        let stdout = out_thread.join().unwrap_or_default();
        let _ = err_thread.join();
        let tail: Vec<String> = tail.lock().map(|t| t.iter().cloned().collect()).unwrap_or_default();
        let wall_ms = started.elapsed().as_secs_f64() * 1e3;

        let parsed = stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(RESULT_PREFIX))
            .and_then(|j| serde_json::from_str::<TrialResult>(j).ok());

        let mut result = match (timed_out, parsed) {
            (true, _) => TrialResult::failed(
                spec.clone(),
                TrialStatus::Timeout,
                format!("killed after the {}s trial timeout", self.timeout.as_secs()),
            ),
            (false, Some(r)) if status.success() => r,
            (false, _) => {
                let how = describe_exit(status);
                let last = telling_line(&tail);
                let oom = tail.iter().any(|l| mentions_oom(l));
                let reason = if last.is_empty() { how } else { format!("{how}: {last}") };
                TrialResult::failed(spec.clone(), if oom { TrialStatus::Oom } else { TrialStatus::Crashed }, reason)
            }
        };
        result.wall_ms = wall_ms;
        result.sampled.extend(sampled);
        result.contention = contention;
        if result.status != TrialStatus::Ok {
            result.stderr_tail = tail;
        }
        Ok(result)
    }

    fn wait(&self, child: &mut Child, pid: u32, on_tick: &mut impl FnMut(u32)) -> Result<(ExitStatus, bool)> {
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                // Ctrl-C reaches the worker too: its death is the interrupt, not a crash.
                if interrupt::requested().is_some() {
                    return Err(anyhow::Error::new(Interrupted));
                }
                return Ok((status, false));
            }
            if interrupt::requested().is_some() {
                let _ = child.kill();
                let _ = child.wait();
                return Err(anyhow::Error::new(Interrupted));
            }
            if started.elapsed() >= self.timeout {
                let _ = child.kill();
                let status = child.wait()?;
                return Ok((status, true));
            }
            on_tick(pid);
            std::thread::sleep(self.poll);
        }
    }
}

/// The line of a worker's last words that best says what went wrong: one
/// about memory, else one naming an error, else the last.
#[must_use]
pub fn telling_line(tail: &[String]) -> String {
    let lines: Vec<&str> = tail.iter().map(|l| l.trim()).filter(|l| !l.is_empty()).collect();
    lines
        .iter()
        .rev()
        .find(|l| mentions_oom(l))
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

/// The sweep was stopped by SIGINT or SIGTERM while a trial ran; that trial
/// is discarded, the finished ones are kept by the caller.
#[derive(Debug, Clone, Copy)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted by {}", interrupt::requested().map_or("a signal", interrupt::name))
    }
}

impl std::error::Error for Interrupted {}

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

/// Entry point of the hidden `__trial` subcommand: reads a [`TrialSpec`]
/// from stdin, runs it, prints one result line.
///
/// # Errors
/// When stdin does not hold a spec.
pub fn worker_main() -> Result<()> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let spec: TrialSpec =
        serde_json::from_str(&input).context("the trial worker expects a TrialSpec as JSON on stdin")?;
    let result = super::worker::run(&spec);
    let line = serde_json::to_string(&result)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{RESULT_PREFIX}{line}")?;
    out.flush()?;
    Ok(())
}
