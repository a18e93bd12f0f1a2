//! The search's dry run: what the stages after the whole-layer search (the
//! hatches, the splits) and the confirmations price through the search's
//! [`Pricer`]. A dry run that fails as a whole prices nothing; its first
//! error is kept for the stage to say once ([`Search::take_unpriced`]), and
//! the options it could not price say so.

use anyhow::Result;

use super::Search;
use crate::engine::predict::{LlamaFitSplit, PredictCase, Prediction};
use crate::placement::KvType;
use crate::placement::Split;
use crate::tune::pricer::Pricer;

impl<'a> Search<'a> {
    /// The search with llama.cpp's dry run (or, in tests, a fake one).
    #[must_use]
    pub fn with_pricer(mut self, pricer: Box<dyn Pricer + 'a>) -> Self {
        self.pricer = Some(pricer);
        self
    }

    /// Whole-layer settings priced (see [`Pricer::layers`]).
    pub fn price_layers(&mut self, ngl: &[u32]) -> Vec<Prediction> {
        let r = self.pricer().and_then(|p| p.layers(ngl));
        self.answered(r)
    }

    /// Placements priced (see [`Pricer::cases`]).
    pub fn price_cases(&mut self, cases: &[PredictCase]) -> Vec<Prediction> {
        let r = self.pricer().and_then(|p| p.cases(cases));
        self.answered(r)
    }

    /// Splits priced (see [`Pricer::splits`]).
    pub fn price_splits(&mut self, splits: &[Split], kv: KvType, n_cpu_ffn: u32) -> Vec<Prediction> {
        let r = self.pricer().and_then(|p| p.splits(splits, kv, n_cpu_ffn));
        self.answered(r)
    }

    /// llama.cpp's own split for these margins (see [`Pricer::fit_split`]).
    ///
    /// # Errors
    /// When the dry run failed, or the search has none.
    pub fn price_fit_split(&mut self, margins: &[u64]) -> Result<Option<LlamaFitSplit>> {
        self.pricer()?.fit_split(margins)
    }

    /// Ends the worker the executor keeps between trials (see
    /// [`crate::tune::executor::TrialExecutor::release`]).
    pub fn release_worker(&mut self) {
        self.executor.release();
    }

    /// The first dry run that failed since the last call, if one did.
    pub fn take_unpriced(&mut self) -> Option<String> {
        self.unpriced.take()
    }

    fn pricer(&mut self) -> Result<&mut (dyn Pricer + 'a)> {
        match self.pricer.as_mut() {
            Some(p) => Ok(p.as_mut()),
            None => Err(anyhow::anyhow!("no dry run was given to this search")),
        }
    }

    fn answered(&mut self, r: Result<Vec<Prediction>>) -> Vec<Prediction> {
        r.unwrap_or_else(|e| crate::tune::pricer::unpriced(&mut self.unpriced, &e))
    }
}

#[cfg(test)]
mod tests {
    use crate::tune::pricer::fake::Curves;
    use crate::tune::worlds;

    /// A failed dry run prices nothing and keeps its first error to be said once.
    #[test]
    fn a_failed_dry_run_is_kept_once_with_its_first_error() {
        let s = worlds::settings();
        let mut world = crate::tune::executor::fake::World::new(|_| crate::tune::executor::fake::Outcome::Oom);
        let progress = crate::progress::Progress::hidden();
        let mut search = super::Search::new(
            &s,
            crate::tune::plan::ContextRun::of(&s, s.workload.n_ctx),
            &mut world,
            None,
            progress,
            None,
        )
        .with_pricer(Box::new(Curves::failing("worker killed by signal 6")));
        assert!(search.price_layers(&[3]).is_empty());
        assert!(search.price_cases(&[crate::engine::predict::PredictCase::layers(3, 512)]).is_empty());
        assert_eq!(search.take_unpriced().as_deref(), Some("worker killed by signal 6"));
        assert_eq!(search.take_unpriced(), None, "said once");
        assert!(search.price_fit_split(&[0]).is_err());
    }
}
