//! Error kinds that decide the exit code. Everything else is an `anyhow`
//! error and exits 1.

use std::fmt;

/// Exit codes, as documented in the README.
pub mod exit {
    pub const OK: i32 = 0;
    pub const FAILURE: i32 = 1;
    pub const BAD_INPUT: i32 = 2;
    pub const REGRESSION: i32 = 3;
    /// Stopped by SIGINT or SIGTERM; finished work is in the checkpoint.
    pub const INTERRUPTED: i32 = 130;
}

/// The user gave us something we cannot use. The message is one line that
/// names the problem and the fix; it exits 2 and nothing is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadInput(pub String);

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

/// Shorthand: `return Err(bad(format!(..)))`.
#[must_use]
pub fn bad(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(BadInput(msg.into()))
}

/// The sweep was stopped by SIGINT or SIGTERM while a trial ran; that trial
/// is discarded, the finished ones are kept by the caller.
#[derive(Debug, Clone, Copy)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted by {}", crate::interrupt::requested().map_or("a signal", crate::interrupt::name))
    }
}

impl std::error::Error for Interrupted {}

/// A write to a reader that went away (`ngl-tune profiles list | head -1`):
/// the output was not wanted any more, so it ends quietly, as ripgrep does.
#[must_use]
pub fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|e| e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

/// Whether `err` (or what it wraps) is the user's bad input.
#[must_use]
pub fn is_bad_input(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.downcast_ref::<BadInput>().is_some())
}

/// Whether `err` (or what it wraps) is an interrupt.
#[must_use]
pub fn is_interrupted(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.downcast_ref::<Interrupted>().is_some())
}

/// The exit code an error maps to.
#[must_use]
pub fn exit_code(err: &anyhow::Error) -> i32 {
    if is_bad_input(err) {
        exit::BAD_INPUT
    } else if is_interrupted(err) {
        exit::INTERRUPTED
    } else {
        exit::FAILURE
    }
}
