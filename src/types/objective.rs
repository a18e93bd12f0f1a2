//! The objective, in one place: what "best" means, and everything that
//! follows from it: the score of measured or predicted speeds, which of a
//! trial's tests it reads, how a trial is raced against the best so far,
//! the noise of a score, and what a layer costs on a device. A new
//! objective is a new arm in each `match` here and nowhere else.

use serde::{Deserialize, Serialize};

use super::{Power, Race, TrialResult};

/// What "best" means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    /// Token generation speed (chat, the default).
    Tg,
    /// Prompt processing speed (long prompts, RAG).
    Pp,
    /// Time for one request of n_prompt + n_gen tokens.
    Mixed,
    /// Generated tokens per joule (the GPUs' and CPU packages' measured
    /// power over the tg test): fewer layers where power grows faster
    /// than speed.
    Energy,
    /// Generated tokens per second of `--parallel N` sequences decoding
    /// together (llama-batched-bench's S_TG): batch jobs.
    Throughput,
}

impl Objective {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Objective::Tg => "tg",
            Objective::Pp => "pp",
            Objective::Mixed => "mixed",
            Objective::Energy => "energy",
            Objective::Throughput => "throughput",
        }
    }
}

/// The tests an objective's score is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// The tg test alone (tg, throughput's streams, energy's tokens).
    Tg,
    /// The pp test alone.
    Pp,
    /// Both, weighed as one request (mixed).
    Both,
}

impl Objective {
    /// The tests this objective's score is made of.
    #[must_use]
    pub fn reads(self) -> Reads {
        match self {
            Objective::Tg | Objective::Throughput | Objective::Energy => Reads::Tg,
            Objective::Pp => Reads::Pp,
            Objective::Mixed => Reads::Both,
        }
    }

    /// Racing thresholds from `best(pp)`, the threshold for a test (the
    /// best speed so far at the racer's share): the objective's own test
    /// alone decides, and once behind the trial's other tests do not run;
    /// mixed races each test for itself and runs both. Energy races
    /// nothing: a slower setting may draw less power.
    #[must_use]
    pub fn race(self, best: impl Fn(bool) -> Option<f64>) -> Option<Race> {
        if self.weighs_power() {
            return None;
        }
        Some(match self.reads() {
            Reads::Tg => Race { pp_below_ts: None, tg_below_ts: best(false), skip_rest: true },
            Reads::Pp => Race { pp_below_ts: best(true), tg_below_ts: None, skip_rest: true },
            Reads::Both => Race { pp_below_ts: best(true), tg_below_ts: best(false), skip_rest: false },
        })
    }

    /// Whether its score weighs the power drawn, not only the speed.
    #[must_use]
    pub fn weighs_power(self) -> bool {
        self == Objective::Energy
    }

    /// The objective a search walks by where its argument is about speed
    /// (time per token linear in ngl): energy's search walks by tg, its
    /// decision then weighs the watts.
    #[must_use]
    pub fn by_speed(self) -> Objective {
        if self.weighs_power() {
            Objective::Tg
        } else {
            self
        }
    }
}

/// What an objective's score weighs: the objective, and llama-bench's test
/// sizes, by which mixed weighs one request (`n_prompt` + `n_gen` tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scoring {
    pub objective: Objective,
    pub n_prompt: u32,
    pub n_gen: u32,
}

impl Scoring {
    /// The objective's value (higher is better) of measured or predicted
    /// speeds; energy needs the power too ([`Self::with_power`]): `None` here.
    #[must_use]
    pub fn speeds(self, tg: Option<f64>, pp: Option<f64>) -> Option<f64> {
        self.with_power((tg, pp), None)
    }

    /// [`Self::speeds`] with the mean power (W) over the tg test: energy is
    /// generated tokens per joule, tg over watts.
    #[must_use]
    pub fn with_power(self, (tg, pp): (Option<f64>, Option<f64>), watts: Option<f64>) -> Option<f64> {
        match self.objective {
            // Throughput's tg test counts every stream's tokens.
            Objective::Tg | Objective::Throughput => tg,
            Objective::Pp => pp,
            Objective::Mixed => {
                let t = f64::from(self.n_prompt) / pp? + f64::from(self.n_gen) / tg?;
                (t > 0.0).then(|| 1.0 / t)
            }
            Objective::Energy => tg.zip(watts.filter(|w| *w > 0.0)).map(|(t, w)| t / w),
        }
    }

    /// A trial's value: its tests' mean speeds, and its tg test's power.
    #[must_use]
    pub fn trial(self, r: &TrialResult) -> Option<f64> {
        let speed = |pp: bool| r.test(pp).map(|x| x.avg_ts);
        let watts = r.test(false).and_then(Power::of).map(|w| w.total());
        self.with_power((speed(false), speed(true)), watts)
    }
}

impl Scoring {
    /// The relative standard error of a score from its tests' own
    /// (`se / mean` of tg and of pp; 0 where unknown): the larger of the
    /// tests it is made of.
    #[must_use]
    pub fn relative_error(self, tg: f64, pp: f64) -> f64 {
        match self.objective.reads() {
            Reads::Tg => tg,
            Reads::Pp => pp,
            Reads::Both => tg.max(pp),
        }
    }

    /// What a layer on a device costs for the objective, from its ms per
    /// token of generation and of prompt: per token (tg, pp), or per
    /// request of `n_prompt` + `n_gen` tokens (mixed).
    #[must_use]
    pub fn layer_cost(self, tg_ms: f64, pp_ms: f64) -> f64 {
        match self.objective.reads() {
            Reads::Tg => tg_ms,
            Reads::Pp => pp_ms,
            Reads::Both => f64::from(self.n_prompt) * pp_ms + f64::from(self.n_gen) * tg_ms,
        }
    }

    /// A paired verdict's ratio where the score itself has none (a pair
    /// without power readings): the objective's own test's ratio; mixed
    /// needs both tests, so none.
    #[must_use]
    pub fn single_test<T>(self, tg: Option<T>, pp: Option<T>) -> Option<T> {
        match self.objective.reads() {
            Reads::Tg => tg,
            Reads::Pp => pp,
            Reads::Both => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each objective's score of the same speeds: tg and throughput the tg
    /// rate, pp the pp rate, mixed one request of n_prompt + n_gen tokens,
    /// energy tokens per joule (nothing without power).
    #[test]
    fn each_objective_weighs_the_speeds_its_own_way() {
        let at = |objective| Scoring { objective, n_prompt: 512, n_gen: 128 };
        let (tg, pp) = (Some(20.0), Some(256.0));
        assert_eq!(at(Objective::Tg).speeds(tg, pp), Some(20.0));
        assert_eq!(at(Objective::Throughput).speeds(tg, pp), Some(20.0));
        assert_eq!(at(Objective::Pp).speeds(tg, pp), Some(256.0));
        // 512 / 256 + 128 / 20 = 2 + 6.4 = 8.4 s a request.
        let mixed = at(Objective::Mixed).speeds(tg, pp).unwrap();
        assert!((mixed - 1.0 / 8.4).abs() < 1e-12, "{mixed}");
        assert_eq!(at(Objective::Mixed).speeds(tg, None), None, "mixed needs both");
        assert_eq!(at(Objective::Energy).speeds(tg, pp), None, "energy needs the power");
        assert_eq!(at(Objective::Energy).with_power((tg, pp), Some(200.0)), Some(0.1));
        assert_eq!(at(Objective::Energy).with_power((tg, pp), Some(0.0)), None, "no power read");
    }

    /// Racing by objective, one rule for the search and the pairing: the
    /// objective's own test alone (the rest skipped once behind), mixed
    /// each test for itself with both run, energy nothing. The pairing's
    /// old rule raced mixed on tg alone (its `_` arm).
    #[test]
    fn each_objective_races_its_own_tests() {
        let best = |pp: bool| Some(if pp { 100.0 } else { 10.0 });
        let race = |o: Objective| o.race(best);
        let tg = Race { pp_below_ts: None, tg_below_ts: Some(10.0), skip_rest: true };
        assert_eq!(race(Objective::Tg), Some(tg));
        assert_eq!(race(Objective::Throughput), Some(tg));
        assert_eq!(race(Objective::Pp), Some(Race { pp_below_ts: Some(100.0), tg_below_ts: None, skip_rest: true }));
        assert_eq!(
            race(Objective::Mixed),
            Some(Race { pp_below_ts: Some(100.0), tg_below_ts: Some(10.0), skip_rest: false })
        );
        assert_eq!(race(Objective::Energy), None, "a slower setting may draw less power");
        assert_eq!(Objective::Energy.by_speed(), Objective::Tg);
        assert_eq!(Objective::Mixed.by_speed(), Objective::Mixed);
    }

    /// The noise of a score, a layer's cost and the fallback ratio read
    /// the tests the objective is made of, mixed both.
    #[test]
    fn the_noise_the_layer_cost_and_the_fallback_read_the_objectives_tests() {
        let at = |objective| Scoring { objective, n_prompt: 100, n_gen: 10 };
        assert!((at(Objective::Tg).relative_error(0.02, 0.05) - 0.02).abs() < 1e-12);
        assert!((at(Objective::Energy).relative_error(0.02, 0.05) - 0.02).abs() < 1e-12);
        assert!((at(Objective::Pp).relative_error(0.02, 0.05) - 0.05).abs() < 1e-12);
        assert!((at(Objective::Mixed).relative_error(0.02, 0.05) - 0.05).abs() < 1e-12);
        assert!((at(Objective::Throughput).layer_cost(2.0, 0.5) - 2.0).abs() < 1e-12);
        assert!((at(Objective::Pp).layer_cost(2.0, 0.5) - 0.5).abs() < 1e-12);
        // 100 prompt tokens at 0.5 ms and 10 generated at 2 ms a layer.
        assert!((at(Objective::Mixed).layer_cost(2.0, 0.5) - 70.0).abs() < 1e-12);
        assert_eq!(at(Objective::Tg).single_test(Some(1), Some(2)), Some(1));
        assert_eq!(at(Objective::Pp).single_test(Some(1), Some(2)), Some(2));
        assert_eq!(at(Objective::Mixed).single_test(Some(1), Some(2)), None, "mixed needs both tests");
    }
}
