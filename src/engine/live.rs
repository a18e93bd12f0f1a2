//! A child that stays up between requests: one JSON line in on stdin, one
//! answer line out on stdout, until its stdin closes. The trial worker runs
//! this way so trials that load the model the same way share one load.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::error::Interrupted;
use crate::interrupt;

/// Lines of the child's stderr kept for failure reports (of the current request).
const TAIL_LINES: usize = 12;

/// How long a child whose stdin closed may take to free what it holds and exit.
const EXIT_GRACE: Duration = Duration::from_secs(30);

/// A running child serving requests.
pub struct Live {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    err: Option<JoinHandle<()>>,
    tail: Arc<Mutex<VecDeque<String>>>,
    /// Requests it has answered.
    pub served: u32,
}

/// `exe SUB ARGS...` started with its stdin, stdout and stderr piped.
///
/// # Errors
/// When it cannot be started.
pub(crate) fn piped(exe: &Path, sub: &str, args: &[OsString]) -> Result<Child> {
    Command::new(exe)
        .arg(sub)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {} {sub}", exe.display()))
}

/// A thread that keeps the last lines a child writes to stderr (and, with
/// `echo`, forwards each live: llama.cpp's log for `--verbose`).
pub(crate) fn keep_tail(
    stderr: Option<std::process::ChildStderr>,
    echo: bool,
) -> (JoinHandle<()>, Arc<Mutex<VecDeque<String>>>) {
    let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL_LINES)));
    let t = Arc::clone(&tail);
    let handle = std::thread::spawn(move || {
        let Some(e) = stderr else { return };
        for line in BufReader::new(e).lines().map_while(Result::ok) {
            if echo {
                eprintln!("{line}");
            }
            if let Ok(mut t) = t.lock() {
                if t.len() == TAIL_LINES {
                    t.pop_front();
                }
                t.push_back(line);
            }
        }
    });
    (handle, tail)
}

/// How a request ended.
#[derive(Debug)]
pub enum Answer {
    /// The answer line (without its prefix); the child stays up.
    Line(String),
    /// The child ended without answering.
    Exited(ExitStatus),
    /// Killed at the time limit.
    TimedOut,
}

impl Live {
    /// Starts `exe SUB ARGS...`. With `echo`, its stderr is forwarded live.
    ///
    /// # Errors
    /// When the child cannot be started.
    pub fn start(exe: &Path, sub: &str, args: &[OsString], echo: bool) -> Result<Live> {
        let mut child = piped(exe, sub, args)?;
        let (tx, lines) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let (err, tail) = keep_tail(child.stderr.take(), echo);
        let stdin = child.stdin.take();
        Ok(Live { child, stdin, lines, err: Some(err), tail, served: 0 })
    }

    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running (between requests: not killed meanwhile).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends one request (a line) and forgets the last request's stderr.
    /// A child that died before reading it shows in [`Live::answer`].
    pub fn send(&mut self, request: &[u8]) {
        if let Ok(mut t) = self.tail.lock() {
            t.clear();
        }
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(request).and_then(|()| stdin.write_all(b"\n")).and_then(|()| stdin.flush());
        }
    }

    /// Waits for the line starting with `prefix`, calling `on_tick` every
    /// `poll`; kills the child at `timeout`. Ctrl-C or SIGTERM (which reach
    /// the child too) end the wait with [`Interrupted`].
    ///
    /// # Errors
    /// [`Interrupted`], or when the child cannot be waited for.
    pub fn answer(
        &mut self,
        prefix: &str,
        timeout: Duration,
        poll: Duration,
        mut on_tick: impl FnMut(),
    ) -> Result<Answer> {
        let started = Instant::now();
        loop {
            if let Some(line) = self.next_line(prefix, Duration::ZERO) {
                self.served += 1;
                return Ok(Answer::Line(line));
            }
            if let Some(status) = self.child.try_wait()? {
                // A line written just before it ended may still be in the pipe.
                if let Some(line) = self.next_line(prefix, Duration::from_secs(1)) {
                    self.served += 1;
                    return Ok(Answer::Line(line));
                }
                if interrupt::requested().is_some() {
                    return Err(anyhow::Error::new(Interrupted));
                }
                self.join_stderr();
                return Ok(Answer::Exited(status));
            }
            if interrupt::requested().is_some() {
                self.kill();
                return Err(anyhow::Error::new(Interrupted));
            }
            if started.elapsed() >= timeout {
                self.kill();
                self.join_stderr();
                return Ok(Answer::TimedOut);
            }
            on_tick();
            std::thread::sleep(poll);
        }
    }

    /// The next line starting with `prefix` (stray output skipped), waiting
    /// at most `wait` for more.
    fn next_line(&self, prefix: &str, wait: Duration) -> Option<String> {
        let deadline = Instant::now() + wait;
        loop {
            let line = if wait.is_zero() {
                match self.lines.try_recv() {
                    Ok(l) => l,
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => return None,
                }
            } else {
                match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(l) => l,
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
                }
            };
            if let Some(rest) = line.strip_prefix(prefix) {
                return Some(rest.to_string());
            }
        }
    }

    /// The last lines of stderr since the last request.
    #[must_use]
    pub fn tail(&self) -> Vec<String> {
        self.tail.lock().map(|t| t.iter().cloned().collect()).unwrap_or_default()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn join_stderr(&mut self) {
        if let Some(h) = self.err.take() {
            let _ = h.join();
        }
    }

    /// Closes its stdin and waits for it to free what it holds and exit
    /// (killed after a grace period), so the next child finds the devices
    /// as they were.
    pub fn close(mut self) {
        drop(self.stdin.take());
        let started = Instant::now();
        while started.elapsed() < EXIT_GRACE {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.kill();
    }
}

/// The trial worker kept between trials, and how it loaded its model.
pub(crate) struct Kept {
    pub live: Live,
    /// [`crate::types::TrialSpec::load_key`] of its model.
    pub key: String,
    /// Memory before its first trial loaded anything.
    pub baselines: Vec<crate::types::MemoryStats>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept").field("pid", &self.live.pid()).field("key", &self.key).finish_non_exhaustive()
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}
