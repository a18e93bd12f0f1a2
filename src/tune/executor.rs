//! The seam between the search and the world: a [`TrialExecutor`] measures
//! one candidate placement and says what the trial produced. The tuner's
//! executor runs a worker process per trial; the tests' executor is a world
//! made of curves, so the search (racing, confirmation, OOM, threads, MoE,
//! resume) is tested in milliseconds without llama.cpp.

use anyhow::Result;

use super::plan::Candidate;
use crate::engine::runner::Runner;
use crate::types::{Race, TrialResult, TrialSpec};

/// Measures candidates.
pub trait TrialExecutor {
    /// Measures `c`; `race` cuts a test short where it falls behind.
    ///
    /// # Errors
    /// Only when nothing could be measured at all (the worker cannot start,
    /// an interrupt); a failed trial is a result.
    fn measure(&mut self, c: Candidate, race: Option<Race>) -> Result<TrialResult>;

    /// What a trial of `c` would run (unraced), without running it.
    fn spec(&self, c: Candidate) -> TrialSpec;

    /// Ends whatever the executor keeps between trials (a loaded worker),
    /// before something that needs the devices or the RPC servers as they
    /// were. The default keeps nothing.
    fn release(&mut self) {}

    /// Runs `c` once, unmeasured, so that it fills the KV cache to the
    /// trials' depth and keeps it for the trials of its KV type (where `c`
    /// fills faster than they would). The default does nothing.
    ///
    /// # Errors
    /// Only when the worker cannot start, or an interrupt.
    fn prefill(&mut self, _c: Candidate) -> Result<()> {
        Ok(())
    }
}

/// The spec of `c`: the workload of `base`, the placement of `c`; `devices`
/// are the offload devices' names in llama.cpp's order (for a split in
/// another order, its `--device` list).
#[must_use]
pub fn spec_of(base: &TrialSpec, devices: &[String], c: Candidate, race: Option<Race>) -> TrialSpec {
    let mut spec = base.clone();
    spec.placement.n_gpu_layers = c.ngl;
    spec.placement.n_threads = c.threads;
    spec.placement.n_cpu_moe = c.n_cpu_moe;
    spec.placement.n_cpu_ffn = c.n_cpu_ffn;
    if let Some(kv) = c.kv {
        spec.placement.kv_type = kv;
    }
    spec.placement.tensor_split = c.split.listed();
    spec.placement.devices = c.split.device_names(devices);
    spec.placement.split_mode = c.split.mode();
    spec.placement.cpu_overrides = c.spill.patterns();
    if c.ctx > 0 {
        spec.placement.n_ctx = Some(c.ctx);
    }
    if c.mmproj_cpu {
        spec.placement.mmproj_offload = false;
    }
    if c.upstream {
        spec.baseline = true;
        spec.placement.op_offload = crate::placement::OpOffload::On;
    }
    if c.stock {
        spec.placement = spec.placement.with_server_defaults();
        // Its slots serve at most that many streams at once; the rest wait.
        spec.n_streams = spec.n_streams.min(spec.placement.n_parallel);
    }
    if c.ngl == 0 {
        // Every layer on the CPU: measured as recommended, without the
        // servers (with them, llama.cpp's op offload could ship the
        // prompt's matrix products to one).
        spec.placement.rpc.clear();
    }
    spec.placement.flash_attn = spec.placement.kv_type.flash_attn(spec.placement.flash_attn);
    spec.race = race.filter(|r| r.pp_below_ts.is_some() || r.tg_below_ts.is_some());
    spec
}

/// The real world: one worker process per trial, measured again once when
/// the machine was busy (see [`Runner::run_settled`]). The runner, and the
/// worker it keeps, outlive one context's executor: the next context's
/// trials may run in the same worker.
pub struct WorkerExecutor<'r> {
    runner: &'r Runner,
    base: TrialSpec,
    /// The offload devices' names, in llama.cpp's order.
    devices: Vec<String>,
}

impl<'r> WorkerExecutor<'r> {
    #[must_use]
    pub fn new(runner: &'r Runner, base: TrialSpec, devices: Vec<String>) -> Self {
        WorkerExecutor { runner, base, devices }
    }
}

impl TrialExecutor for WorkerExecutor<'_> {
    fn measure(&mut self, c: Candidate, race: Option<Race>) -> Result<TrialResult> {
        self.runner.run_settled(&spec_of(&self.base, &self.devices, c, race), |_| {})
    }

    fn spec(&self, c: Candidate) -> TrialSpec {
        spec_of(&self.base, &self.devices, c, None)
    }

    fn release(&mut self) {
        self.runner.release();
    }

    fn prefill(&mut self, c: Candidate) -> Result<()> {
        if self.base.n_depth == 0 || self.base.depth_cache.is_none() {
            return Ok(());
        }
        let mut spec = spec_of(&self.base, &self.devices, c, None);
        (spec.n_prompt, spec.n_gen, spec.repetitions, spec.warmup) = (0, 1, 1, false);
        // A failed fill costs nothing: the trial then fills its own.
        self.runner.run(&spec, |_| {}).map(|_| ())
    }
}

/// A world made of curves, for tests.
#[cfg(test)]
pub(crate) mod fake {
    use super::{spec_of, Candidate, Race, TrialExecutor, TrialResult, TrialSpec};
    use crate::types::{BufferLine, TestResult, TrialStatus};

    /// What measuring a candidate gives.
    #[derive(Debug, Clone, Copy)]
    pub enum Outcome {
        /// Speeds (t/s) and device memory (bytes).
        Ok {
            tg: f64,
            pp: f64,
            mem: u64,
        },
        Oom,
    }

    /// What a candidate measures, by its trial's spec.
    pub type Measures = dyn Fn(Candidate, &TrialSpec) -> Outcome;

    pub struct World {
        /// What a candidate measures as its trial's spec says (the depth,
        /// the context, the streams decoded together).
        pub at: Box<Measures>,
        pub base: TrialSpec,
        /// Every candidate measured, in order.
        pub measured: Vec<Candidate>,
        /// Where set, NVML sees each trial's process hold its model bytes
        /// plus this much (a driver's own context, which llama.cpp does
        /// not account).
        pub driver_bytes: Option<u64>,
        /// The index into `measured` of the next trial after each release
        /// (a kept worker ended: that trial loads the model anew).
        pub releases: Vec<usize>,
    }

    impl World {
        pub fn new(at: impl Fn(Candidate) -> Outcome + 'static) -> World {
            World::at_depth(move |c, _| at(c))
        }

        /// A world whose speeds depend on the depth the trial runs at.
        pub fn at_depth(at: impl Fn(Candidate, u32) -> Outcome + 'static) -> World {
            World::of(move |c, s| at(c, s.n_depth))
        }

        /// A world whose speeds and memory follow the whole spec; its tg is
        /// the test's rate, every stream's tokens counted.
        pub fn of(at: impl Fn(Candidate, &TrialSpec) -> Outcome + 'static) -> World {
            World {
                at: Box::new(at),
                base: crate::engine::test_spec(),
                measured: Vec::new(),
                driver_bytes: None,
                releases: Vec::new(),
            }
        }
    }

    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn samples(tokens: u32, ts: f64, reps: u32) -> Vec<u64> {
        vec![(f64::from(tokens) / ts * 1e9) as u64; reps as usize]
    }

    impl TrialExecutor for World {
        fn spec(&self, c: Candidate) -> TrialSpec {
            spec_of(&self.base, &[], c, None)
        }

        fn release(&mut self) {
            self.releases.push(self.measured.len());
        }

        fn measure(&mut self, c: Candidate, race: Option<Race>) -> anyhow::Result<TrialResult> {
            self.measured.push(c);
            let spec = spec_of(&self.base, &[], c, race);
            let (tg, pp, mem) = match (self.at)(c, &spec) {
                Outcome::Oom => return Ok(TrialResult::failed(spec, TrialStatus::Oom, "out of memory".into())),
                Outcome::Ok { tg, pp, mem } => (tg, pp, mem),
            };
            let mut r = TrialResult::failed(spec.clone(), TrialStatus::Ok, String::new());
            r.reason = None;
            r.model_buffers.push(BufferLine { buffer_type: "Vulkan0".into(), kind: "model".into(), bytes: mem });
            r.wall_ms = 1000.0;
            if let Some(d) = self.driver_bytes {
                r.sampled.push(crate::types::MemoryStats {
                    source: crate::types::Source::Nvml,
                    device: "nvml0 (fake)".into(),
                    total: 1 << 40,
                    baseline_used: 0,
                    peak_used: mem + d,
                    mean_used: mem + d,
                    peak_pid_used: Some(mem + d),
                    n_samples: 10,
                });
            }
            for (np, ng) in spec.tests() {
                let ts = if np > 0 { pp } else { tg };
                let behind = spec.race.and_then(|x| x.below(np)).is_some_and(|t| ts < t);
                let reps = if behind { 1 } else { spec.repetitions };
                let mut t = TestResult::from_samples(np, ng, 256, samples(np + ng, ts, reps));
                t.stopped_early = behind;
                t.n_streams = if np == 0 { spec.n_streams } else { 1 };
                r.tests.push(t);
                if behind && spec.race.is_some_and(|x| x.skip_rest) {
                    break;
                }
            }
            Ok(r)
        }
    }
}
