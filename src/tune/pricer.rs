//! The seam between the tune and llama.cpp's dry run, beside the trial
//! executor's: a [`Pricer`] says what a placement will allocate on each
//! device without running it. The tuner's pricer asks llama.cpp in a child
//! process (`__predict`); the tests' pricer is made of functions, so the
//! search, the hatches and the splits are tested without llama.cpp.
//!
//! An `Err` is a dry run that failed as a whole (the child crashed, the
//! model would not load); one setting llama.cpp refuses is an answer with
//! its own `error`. The search keeps the first failure, and each stage
//! says it once (see [`crate::tune::search::Search::take_unpriced`]).

use anyhow::Result;

use super::plan::ContextRun;
use crate::engine::predict::{predict_in_child, LlamaFitSplit, PredictCase, PredictSpec, Prediction, SplitCase};
use crate::engine::runner::Runner;
use crate::model::ModelInfo;
use crate::placement::KvType;
use crate::placement::Split;
use crate::profile::Settings;

/// Prices placements at one context with llama.cpp's dry run.
pub trait Pricer {
    /// Whole layers on the offload devices (llama.cpp's default split),
    /// one answer per `ngl`, in order.
    ///
    /// # Errors
    /// When the dry run failed as a whole.
    fn layers(&mut self, ngl: &[u32]) -> Result<Vec<Prediction>>;

    /// Other placements: another context, KV cache type, or tensors kept
    /// on the CPU; one answer per case, in order.
    ///
    /// # Errors
    /// When the dry run failed as a whole.
    fn cases(&mut self, cases: &[PredictCase]) -> Result<Vec<Prediction>>;

    /// Splits across the offload devices with a KV cache of `kv` and the
    /// dense FFN weights of the first `n_cpu_ffn` layers on the CPU.
    ///
    /// # Errors
    /// When the dry run failed as a whole.
    fn splits(&mut self, splits: &[Split], kv: KvType, n_cpu_ffn: u32) -> Result<Vec<Prediction>>;

    /// The split llama.cpp's own fit would choose leaving `margins` bytes
    /// free on each device (in llama.cpp's device order).
    ///
    /// # Errors
    /// When the dry run failed as a whole.
    fn fit_split(&mut self, margins: &[u64]) -> Result<Option<LlamaFitSplit>>;
}

/// A dry run of the settings' workload at context `at` that prices nothing yet.
#[must_use]
pub fn workload_spec(info: &ModelInfo, s: &Settings, at: ContextRun, op_offload: bool) -> PredictSpec {
    PredictSpec {
        model: info.path.clone(),
        ngl: Vec::new(),
        n_ctx: at.n_ctx,
        n_batch: at.n_batch,
        n_ubatch: at.n_ubatch,
        flash_attn: s.workload.flash_attn,
        op_offload,
        fit_margin_bytes: None,
        upstream_margin_bytes: crate::engine::predict::upstream_margin(),
        cases: Vec::new(),
        splits: Vec::new(),
        rpc: s.backend.rpc.clone(),
        fit_split_margins: Vec::new(),
        default_fit: false,
        ollama_fit: None,
        kv_type: s.workload.kv_type,
        mmproj: s.backend.mmproj.clone(),
        mtp: false,
        outputs: None,
    }
}

/// The real dry run: this binary's `__predict` in a child process, started
/// by the runner (which ends its kept trial worker first, so the dry run
/// finds the devices as they were).
pub struct ChildPricer<'r> {
    runner: &'r Runner,
    base: PredictSpec,
    /// The offload devices' names, in llama.cpp's order (a split's `--device` list).
    devices: Vec<String>,
}

impl<'r> ChildPricer<'r> {
    #[must_use]
    pub fn new(runner: &'r Runner, base: PredictSpec, devices: Vec<String>) -> Self {
        ChildPricer { runner, base, devices }
    }

    fn ask(&self, spec: &PredictSpec) -> Result<crate::engine::predict::PredictOutput> {
        predict_in_child(self.runner, spec)
    }
}

impl Pricer for ChildPricer<'_> {
    fn layers(&mut self, ngl: &[u32]) -> Result<Vec<Prediction>> {
        Ok(self.ask(&PredictSpec { ngl: ngl.to_vec(), ..self.base.clone() })?.predictions)
    }

    fn cases(&mut self, cases: &[PredictCase]) -> Result<Vec<Prediction>> {
        Ok(self.ask(&PredictSpec { cases: cases.to_vec(), ..self.base.clone() })?.cases)
    }

    fn splits(&mut self, splits: &[Split], kv: KvType, n_cpu_ffn: u32) -> Result<Vec<Prediction>> {
        let case = |x: &Split| SplitCase {
            layers: x.listed(),
            devices: x.device_names(&self.devices),
            mode: x.mode(),
            n_cpu_ffn,
        };
        let spec = PredictSpec { kv_type: kv, splits: splits.iter().map(case).collect(), ..self.base.clone() };
        Ok(self.ask(&spec)?.splits)
    }

    fn fit_split(&mut self, margins: &[u64]) -> Result<Option<LlamaFitSplit>> {
        Ok(self.ask(&PredictSpec { fit_split_margins: margins.to_vec(), ..self.base.clone() })?.llama_fit_split)
    }
}

/// A dry run that failed as a whole: nothing priced, its first failure
/// kept in `failed` to be said once (each stage says it in a note, so an
/// option left unpriced says why).
pub fn unpriced<T: Default>(failed: &mut Option<String>, e: &anyhow::Error) -> T {
    failed.get_or_insert_with(|| format!("{e:#}"));
    T::default()
}

/// A dry run made of functions, for tests.
#[cfg(test)]
pub(crate) mod fake {
    use super::{KvType, LlamaFitSplit, PredictCase, Prediction, Pricer, Result, Split};

    type Cases<'a> = Box<dyn FnMut(&[PredictCase]) -> Vec<Prediction> + 'a>;
    type Splits<'a> = Box<dyn FnMut(&[Split], KvType, u32) -> Vec<Prediction> + 'a>;

    /// Answers what its functions answer; what it has no function for,
    /// or everything once `failing` is set, fails as a whole dry run does.
    #[derive(Default)]
    pub(crate) struct Curves<'a> {
        cases: Option<Cases<'a>>,
        splits: Option<Splits<'a>>,
        failing: Option<String>,
    }

    impl<'a> Curves<'a> {
        /// Prices cases (and whole layers, as cases at context 0) with `f`.
        pub(crate) fn cases(f: impl FnMut(&[PredictCase]) -> Vec<Prediction> + 'a) -> Self {
            Curves { cases: Some(Box::new(f)), ..Curves::default() }
        }

        /// Prices splits with `f`.
        pub(crate) fn splits(f: impl FnMut(&[Split], KvType, u32) -> Vec<Prediction> + 'a) -> Self {
            Curves { splits: Some(Box::new(f)), ..Curves::default() }
        }

        /// Every dry run fails with `why`.
        pub(crate) fn failing(why: &str) -> Self {
            Curves { failing: Some(why.into()), ..Curves::default() }
        }

        fn check(&self) -> Result<()> {
            match &self.failing {
                Some(why) => Err(anyhow::anyhow!("{why}")),
                None => Ok(()),
            }
        }
    }

    fn unpriced(what: &str) -> anyhow::Error {
        anyhow::anyhow!("this world prices no {what}")
    }

    impl Pricer for Curves<'_> {
        fn layers(&mut self, ngl: &[u32]) -> Result<Vec<Prediction>> {
            let cases: Vec<PredictCase> = ngl.iter().map(|n| PredictCase::layers(*n, 0)).collect();
            let mut answers = self.cases(&cases)?;
            for p in &mut answers {
                p.case = None;
            }
            Ok(answers)
        }

        fn cases(&mut self, cases: &[PredictCase]) -> Result<Vec<Prediction>> {
            self.check()?;
            let f = self.cases.as_mut().ok_or_else(|| unpriced("cases"))?;
            Ok(f(cases))
        }

        fn splits(&mut self, splits: &[Split], kv: KvType, n_cpu_ffn: u32) -> Result<Vec<Prediction>> {
            self.check()?;
            let f = self.splits.as_mut().ok_or_else(|| unpriced("splits"))?;
            Ok(f(splits, kv, n_cpu_ffn))
        }

        fn fit_split(&mut self, _margins: &[u64]) -> Result<Option<LlamaFitSplit>> {
            self.check()?;
            Ok(None)
        }
    }
}
