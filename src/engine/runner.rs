//! Spawns the trial worker (this binary's hidden `__trial` subcommand),
//! enforces its time limit, keeps its stderr, and classifies how it ended.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::child::{self, describe_exit, mentions_oom, telling_line};
use super::live::{Answer, Kept, Live};
use crate::error::Interrupted;
use crate::interrupt;
use crate::probe::host::HostSource;
use crate::probe::nvml::NvmlSource;
use crate::probe::{MemorySource, Sampler};
use crate::types::Contention;
use crate::types::{TrialResult, TrialSpec, TrialStatus};

/// How long a server that stopped answering in a trial gets to come back
/// (a supervised one is restarted within a second or two).
const RPC_GRACE: Duration = Duration::from_secs(5);

/// Prefix of the worker's one result line on stdout, so stray output from a
/// backend cannot be mistaken for it.
pub const RESULT_PREFIX: &str = "NGL_TUNE_RESULT ";

/// How trials are run. One place decides the executable and the limits,
/// and owns the trial worker kept between trials: it ends with the runner,
/// with [`Runner::release`], or when the runner starts any other llama.cpp
/// child ([`Runner::call`]: a dry run, a quality probe), so at most one
/// llama.cpp child of a tune holds the devices at a time.
#[derive(Debug)]
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
    /// The worker kept for a next trial of the same load.
    kept: Mutex<Option<Kept>>,
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
        let exe = child::current_exe()?;
        let nvml_note = crate::probe::nvml::open().err();
        Ok(Runner {
            exe,
            timeout,
            verbose,
            poll: Duration::from_millis(20),
            sample_interval: Duration::from_millis(20),
            nvml_note,
            busy_threshold: crate::probe::cpu::DEFAULT_BUSY_THRESHOLD,
            // A test hook shortens the pause (tests run beside each other).
            retry_wait: Duration::from_millis(
                std::env::var("NGL_TUNE_RETRY_WAIT_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000),
            ),
            kept: Mutex::new(None),
        })
    }

    /// Ends the trial worker kept for a next trial, if any, and waits until
    /// it has freed what it holds: before something that needs the devices
    /// or the RPC servers as they were (a llama.cpp child started with
    /// [`Runner::call`] ends it itself).
    pub fn release(&self) {
        let kept = self.kept().take();
        if let Some(k) = kept {
            k.live.close();
        }
    }

    /// The kept worker, locked (a panic elsewhere does not lose it).
    fn kept(&self) -> std::sync::MutexGuard<'_, Option<Kept>> {
        self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs this binary's hidden subcommand `sub` (`__predict`, `__kl`) with
    /// `input` as JSON and reads its JSON answer, after ending the kept
    /// trial worker: the child finds the devices, and a server that serves
    /// one client at a time, as they were.
    ///
    /// # Errors
    /// When the child cannot run or answers nonsense.
    pub fn call<I: serde::Serialize + ?Sized, O: serde::de::DeserializeOwned>(
        &self,
        sub: &str,
        input: &I,
    ) -> Result<O> {
        self.release();
        child::call(&self.exe, sub, &[], input)
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

    /// The host and, where NVML opened at start, NVML (opened once per trial).
    fn sources(nvml: Option<NvmlSource>) -> Vec<Box<dyn MemorySource>> {
        let mut v: Vec<Box<dyn MemorySource>> = vec![Box::new(HostSource::new())];
        if let Some(n) = nvml {
            v.push(Box::new(n));
        }
        v
    }

    /// Runs one trial in a worker process. `on_tick` is called every poll
    /// interval with the worker's PID while it runs (the memory sampler and
    /// the progress bar hang off it).
    ///
    /// The worker stays up after the trial; the next trial that loads the
    /// model the same way ([`TrialSpec::load_key`]: another context size,
    /// KV type, thread count, batch size or depth) runs in it without
    /// loading the model again. Any other trial, or any other llama.cpp
    /// child of this runner ([`Runner::call`]), ends it first; so does a
    /// failed trial. `NGL_TUNE_NO_SHARE` set: a worker per trial.
    ///
    /// # Errors
    /// Only when the worker cannot be started at all, or an interrupt;
    /// everything the worker does is a [`TrialResult`].
    pub fn run(&self, spec: &TrialSpec, mut on_tick: impl FnMut(u32)) -> Result<TrialResult> {
        let started = Instant::now();
        let mut spec = spec.clone();
        spec.sample_interval_ms = u64::try_from(self.sample_interval.as_millis()).unwrap_or(u64::MAX);
        let key = spec.load_key();
        // (With NGL_TUNE_NO_SHARE every trial's worker ended with it, below.)
        let reuse = self.kept().as_mut().is_some_and(|k| k.key == key && k.live.alive());
        if !reuse {
            self.release();
        }
        let mut kept = self.kept();
        if kept.is_none() {
            *kept =
                Some(Kept { live: Live::start(&self.exe, "__trial", &[], self.verbose)?, key, baselines: Vec::new() });
        }
        let Some(worker) = kept.as_mut() else { unreachable!("started above") };
        worker.live.send(&serde_json::to_vec(&spec)?);
        let pid = worker.live.pid();
        let nvml = if self.nvml_note.is_none() { NvmlSource::open().ok() } else { None };
        let gpu_before = nvml.as_ref().map(|n| n.busy_before(&[pid, std::process::id()]));
        let monitor = crate::probe::cpu::Monitor::start(Some(pid), local_rpc_servers(&spec.placement.rpc));
        let sampler = (!self.sample_interval.is_zero())
            .then(|| Sampler::start(Self::sources(nvml), self.sample_interval, Some(pid)));
        let answer = worker.live.answer(RESULT_PREFIX, self.timeout, self.poll, || on_tick(pid));
        let mut sampled = sampler.map(Sampler::stop).unwrap_or_default();
        let answer = answer?;
        crate::probe::keep_first_baselines(&mut worker.baselines, &mut sampled);
        let tail = worker.live.tail();
        drop(kept);
        let threshold = self.busy_threshold * f64::from(spec.placement.n_threads.max(1));
        let mut result = self.classify(&spec, answer, tail);
        if result.status != TrialStatus::Ok || std::env::var_os(NO_SHARE_ENV).is_some() {
            // Whatever state a failed trial left behind is not the next one's.
            self.release();
        }
        result.wall_ms = started.elapsed().as_secs_f64() * 1e3;
        result.sampled.extend(sampled);
        result.contention = monitor.stop(threshold).map(|c| with_gpu(c, gpu_before));
        if result.status != TrialStatus::Ok {
            // A server that died or stalls mid-trial is named (ggml only aborts).
            if matches!(result.status, TrialStatus::Crashed | TrialStatus::Timeout) {
                if let Some(dead) = crate::rpc::wait_back(&spec.placement.rpc, RPC_GRACE) {
                    result.reason = Some(format!("{dead}; {}", result.reason.unwrap_or_default()));
                }
            }
        }
        Ok(result)
    }

    /// What the worker's answer, or its end without one, says happened.
    fn classify(&self, spec: &TrialSpec, answer: Answer, tail: Vec<String>) -> TrialResult {
        let mut result = match answer {
            Answer::Line(j) => match serde_json::from_str::<TrialResult>(&j) {
                Ok(r) => return r,
                Err(e) => TrialResult::failed(spec.clone(), TrialStatus::Crashed, format!("unreadable result: {e}")),
            },
            Answer::TimedOut => TrialResult::failed(
                spec.clone(),
                TrialStatus::Timeout,
                format!("killed after the {}s trial timeout", self.timeout.as_secs()),
            ),
            Answer::Exited(status) => {
                let how = describe_exit(status);
                let last = telling_line(&tail);
                let oom = tail.iter().any(|l| mentions_oom(l));
                let reason = if last.is_empty() { how } else { format!("{how}: {last}") };
                TrialResult::failed(spec.clone(), if oom { TrialStatus::Oom } else { TrialStatus::Crashed }, reason)
            }
        };
        result.stderr_tail = tail;
        result
    }
}

impl Drop for Runner {
    /// The worker kept for a next trial ends with the runner: no trial
    /// process outlives the command, the tune's context or the set that
    /// measured with it.
    fn drop(&mut self) {
        self.release();
    }
}

/// Set: every trial runs in a worker of its own (the model loaded each
/// time), as before workers were kept; `scripts/bench-search share`.
pub const NO_SHARE_ENV: &str = "NGL_TUNE_NO_SHARE";

/// Adds what NVML saw on the GPUs before the trial; another program busy
/// there makes the trial contended.
fn with_gpu(mut c: Contention, gpu_before: Option<(Option<u32>, Vec<crate::types::GpuProcess>)>) -> Contention {
    if let Some((util, others)) = gpu_before {
        c.gpu_util_before_pct = util;
        c.gpu_others = others;
        // Busy and held by someone else: the last trial's worker, just
        // gone, can still show in the utilization but not in the list.
        if util.is_some_and(|u| u > GPU_BUSY_PCT) && !c.gpu_others.is_empty() {
            c.contended = true;
        }
    }
    c
}

/// Entry point of the hidden `__trial` subcommand: reads one
/// [`TrialSpec`] a line from stdin, runs each, prints one result line for
/// each, until stdin closes. The model stays loaded between trials that
/// load it the same way.
///
/// # Errors
/// When a line is not a spec.
pub fn worker_main() -> Result<()> {
    let mut session = super::worker::Session::default();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let spec: TrialSpec = serde_json::from_str(&line)
            .context("the trial worker expects a TrialSpec as JSON on each line of stdin")?;
        let result = session.run(&spec);
        let line = serde_json::to_string(&result)?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{RESULT_PREFIX}{line}")?;
        out.flush()?;
    }
    Ok(())
}

/// The processes of RPC servers this trial uses that run on this machine
/// (given by a loopback address): their CPU is the trial's, not contention.
fn local_rpc_servers(rpc: &[String]) -> Vec<u32> {
    let ports: Vec<u16> = rpc
        .iter()
        .filter_map(|e| crate::placement::args::parse_endpoint(e).ok())
        .filter(|(host, _)| host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback()))
        .map(|(_, port)| port)
        .collect();
    if ports.is_empty() {
        Vec::new()
    } else {
        crate::probe::cpu::listening_pids(&ports)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for the trial worker: answers every request with `answer`
    /// and stays up until its stdin closes.
    fn fake_worker(dir: &std::path::Path, answer: &TrialResult) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let json = dir.join("answer.json");
        std::fs::write(&json, serde_json::to_vec(answer).unwrap()).unwrap();
        let exe = dir.join("worker");
        let script = format!(
            "#!/bin/sh\nwhile read -r _; do printf '%s' '{RESULT_PREFIX}'; cat '{}'; echo; done\n",
            json.display()
        );
        std::fs::write(&exe, script).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        exe
    }

    /// A runner whose stand-in worker ran one trial and is kept; its `/proc` entry.
    fn runner_with_a_kept_worker(dir: &std::path::Path) -> (Runner, PathBuf) {
        let spec = crate::engine::test_spec();
        let mut ok = TrialResult::failed(spec.clone(), TrialStatus::Ok, String::new());
        ok.reason = None;
        let mut runner = Runner::current(Duration::from_secs(20), false).unwrap().with_sample_interval(Duration::ZERO);
        runner.exe = fake_worker(dir, &ok);
        runner.nvml_note = Some("not sampled in this test".into());
        assert_eq!(runner.run(&spec, |_| {}).unwrap().status, TrialStatus::Ok);
        let pid = runner.kept().as_ref().map(|k| k.live.pid()).expect("kept for a next trial of the same load");
        let proc = PathBuf::from(format!("/proc/{pid}"));
        assert!(proc.exists(), "the worker waits for the next trial");
        (runner, proc)
    }

    #[test]
    fn the_worker_kept_between_trials_ends_with_its_runner() {
        let dir = tempfile::tempdir().unwrap();
        let (runner, proc) = runner_with_a_kept_worker(dir.path());
        drop(runner);
        assert!(!proc.exists(), "the worker has exited and been waited for");
    }

    #[test]
    fn another_llama_cpp_child_of_the_runner_ends_its_kept_worker_first() {
        let dir = tempfile::tempdir().unwrap();
        let (runner, proc) = runner_with_a_kept_worker(dir.path());
        // (The stand-in answers a call with nothing: the call fails, after the release.)
        assert!(runner.call::<_, serde_json::Value>("__predict", &()).is_err());
        assert!(runner.kept().is_none(), "released before the child started");
        assert!(!proc.exists(), "the worker had exited and been waited for");
    }
}
