//! The plain data every module shares: what a trial is and what it
//! measured, memory and contention readings, devices and hardware, the
//! objective and the decision. Serde types with small helpers; no I/O and
//! no llama.cpp. Everything else imports these; these import nothing of
//! ours but the pure math of `stats` and `curve`.

mod decision;
mod hardware;
mod memory;
mod note;
mod objective;
mod trial;

pub use decision::*;
pub use hardware::*;
pub use memory::*;
pub use note::*;
pub use objective::*;
pub use trial::*;

pub(crate) use crate::placement::{is_f16, is_one, is_true, is_zero, one, yes};

/// The llama.cpp this binary is built from. llama-cpp-sys-2 vendors one
/// llama.cpp revision per release (its build reports build 0, commit
/// "unknown"), so the crate version is the revision.
pub const LLAMA_CPP_REVISION: &str = "llama-cpp-sys-2 0.1.160";

#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

#[allow(clippy::trivially_copy_pass_by_ref)]
pub(crate) fn is_zero_u64(x: &u64) -> bool {
    *x == 0
}
