//! The llama.cpp driver: one trial (one ngl setting) measured the way
//! llama-bench measures, in a child process so a crash is only a result.
//!
//! `worker` runs inside the child (hidden `__trial` subcommand); `runner`
//! spawns it, watches it, and turns whatever happened into a [`TrialResult`].

pub mod child;
pub mod hold;
pub mod live;
pub mod logs;
pub mod placement;
pub mod predict;
pub mod quality;
pub mod runner;
pub mod spec;
pub mod worker;

#[cfg(test)]
use crate::placement::Placement;
#[cfg(test)]
use crate::types::{Race, TrialSpec};

extern "C" {
    fn ngl_tune_math_threads() -> std::ffi::c_int;
}

/// The threads llama.cpp's tools (llama-server, llama-cli) use without
/// `-t`: its `common_cpu_get_num_math` (physical cores; performance cores
/// only on a hybrid Intel CPU). It does not look at a CPU quota.
#[must_use]
pub fn llama_default_threads() -> u32 {
    // SAFETY: no preconditions; it reads /sys and cpuid, and restores the
    // calling thread's affinity where it pins it.
    u32::try_from(unsafe { ngl_tune_math_threads() }).unwrap_or(1).max(1)
}

/// A small spec for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) fn test_spec() -> TrialSpec {
    TrialSpec {
        model: "m.gguf".into(),
        placement: Placement::default().with_layers(0, 2, Some(256)),
        n_prompt: 64,
        n_gen: 16,
        n_depth: 0,
        depth_cache: None,
        kv_base: crate::placement::KvType::F16,
        repetitions: 3,
        warmup: true,
        seed: 1,
        sample_interval_ms: 20,
        race: None,
        baseline: false,
        n_streams: 1,
    }
}

/// A directory for KV caches filled to depth, shared by one tune's trials
/// (the first trial at a context fills it, the others load it) and removed
/// when the tune ends, however it ends.
pub struct DepthCache(pub std::path::PathBuf);

impl DepthCache {
    /// A new empty folder under the temporary directory; `None` where none can be made.
    #[must_use]
    pub fn new() -> Option<DepthCache> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ngl-tune-depth-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).ok().map(|()| DepthCache(dir))
    }

    /// [`DepthCache::new`], unless `NGL_TUNE_NO_DEPTH_CACHE` is set (every trial then fills its own).
    #[must_use]
    pub fn unless_disabled() -> Option<DepthCache> {
        if std::env::var_os("NGL_TUNE_NO_DEPTH_CACHE").is_some() {
            None
        } else {
            DepthCache::new()
        }
    }
}

impl Drop for DepthCache {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raced_test_runs_first() {
        let mut spec = TrialSpec { n_prompt: 128, n_gen: 32, ..test_spec() };
        assert_eq!(spec.tests(), [(128, 0), (0, 32)], "llama-bench's order");
        spec.race = Some(Race { pp_below_ts: None, tg_below_ts: Some(20.0), skip_rest: true });
        assert_eq!(spec.tests(), [(0, 32), (128, 0)]);
        spec.race = Some(Race { pp_below_ts: Some(50.0), tg_below_ts: Some(20.0), skip_rest: false });
        assert_eq!(spec.tests(), [(128, 0), (0, 32)]);
        let back: TrialSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(back, spec, "the worker gets the race on its stdin");
    }
}
