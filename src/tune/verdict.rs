//! Is it fast enough? The guides' verdict for chat: a reply streams at
//! least as fast as people read (about 8-10 tokens a second). Below it,
//! they send readers to the hatches in order: a q8_0 KV cache, a shorter
//! context, then one quantization lower and a second GPU. Pure: it reads
//! one context's answer and the hatches already measured or priced there.
//! A batch job (`--job`) is judged by its hours instead.

use crate::profile::{ContextPlacement, JobVerdict, PlacementOption, ReadingHatch, ReadingVerdict};
use crate::types::QualityGate;

fn hatch(o: &PlacementOption) -> ReadingHatch {
    ReadingHatch {
        kind: o.kind,
        describe: o.describe(),
        n_ctx: o.n_ctx(),
        measured: o.measured,
        tg_ts: o.tg_ts.filter(|_| o.measured),
        kl_mean: o.quality.as_ref().map(|q| q.kl_mean),
        llama_cpp_args: o.llama_cpp_args(),
    }
}

/// The verdict at one context: `None` where the answer's generation speed
/// was not measured (nothing to judge). Below the threshold, the first
/// measured hatch in the guides' order that reaches it (under the cap,
/// not the recommendation itself, and a quantized cache only with its
/// quality checked and passing `gate`), else the priced ones that fit but
/// were not measured (their speed unknown), so the reader knows what to
/// try. A cache whose quality failed the gate is never named.
#[must_use]
pub fn reading(c: &ContextPlacement, threshold_ts: f64, gate: &QualityGate) -> Option<ReadingVerdict> {
    let tg = c.recommendation.tg_ts.filter(|t| t.is_finite())?;
    let failed = |o: &PlacementOption| o.quality.as_ref().is_some_and(|q| q.fails(gate).is_some());
    let unchecked = |o: &PlacementOption| o.placement.kv_type.is_quantized() && o.measured && o.quality.is_none();
    let mut options: Vec<&PlacementOption> =
        c.options.iter().filter(|o| o.fits && !o.recommended && !failed(o) && !unchecked(o)).collect();
    // `HatchKind`'s order is the guides': the cache's type, the context, then the placements.
    options.sort_by_key(|o| o.kind);
    let above = tg >= threshold_ts;
    let reaches =
        if above { None } else { options.iter().find(|o| o.measured && o.tg_ts.is_some_and(|t| t >= threshold_ts)) };
    let untried = if above || reaches.is_some() {
        Vec::new()
    } else {
        options.iter().filter(|o| !o.measured).map(|o| hatch(o)).collect()
    };
    Some(ReadingVerdict { threshold_ts, tg_ts: tg, above, reaches: reaches.map(|o| hatch(o)), untried })
}

/// Writes the context's verdicts: reading speed for chat (one stream: not
/// under `--objective throughput`, a job judged by its hours) and `--job`'s.
pub fn judge(c: &mut ContextPlacement, goal: &crate::types::Goal, gate: &QualityGate) {
    if goal.objective != crate::types::Objective::Throughput {
        c.reading = reading(c, goal.reading_speed, gate);
    }
    c.job = goal.job.and_then(|j| job(c, j, goal.streams()));
}

/// The hours `job` takes at the answer's measured generation rate (of
/// `streams` sequences together): generation only.
#[must_use]
pub fn job(c: &ContextPlacement, job: crate::types::Job, streams: u32) -> Option<JobVerdict> {
    let tg = c.recommendation.tg_ts.filter(|t| t.is_finite() && *t > 0.0)?;
    let tokens = f64::from(job.requests) * f64::from(job.n_gen);
    Some(JobVerdict { job, streams, tg_ts: tg, hours: tokens / tg / 3600.0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::KvType;
    use crate::profile::{HatchKind, Recommendation};
    use crate::types::Quality;

    fn option(kind: HatchKind, tg: Option<f64>, measured: bool) -> PlacementOption {
        PlacementOption {
            kind,
            placement: crate::placement::Placement::default()
                .with_layers(33, 4, Some(if kind == HatchKind::ShorterContext { 2048 } else { 8192 }))
                .with_kv(if kind == HatchKind::KvCache { KvType::Q8_0 } else { KvType::F16 }),
            measured,
            tg_ts: tg,
            pp_ts: tg.map(|t| t * 10.0),
            tg_se_ts: None,
            pp_se_ts: None,
            device_bytes: Some(1 << 30),
            fits: true,
            quality: (kind == HatchKind::KvCache).then(|| Quality {
                kl_mean: 0.004,
                kl_p99: 0.02,
                top1_agree: 0.99,
                tokens: 256,
                reference: "f16 KV cache".into(),
                non_finite: 0,
                depth: 4096,
                depth_asked: 0,
                wall_s: 1.0,
            }),
            recommended: false,
            note: String::new(),
        }
    }

    fn gate() -> QualityGate {
        QualityGate { max_kl: 0.05, min_top1: 0.9 }
    }

    /// A quantized cache that reaches reading speed but failed the quality
    /// gate (or was never checked) is never named; the next hatch is.
    #[test]
    fn a_cache_that_failed_the_quality_gate_is_never_named() {
        let mut bad = option(HatchKind::KvCache, Some(30.0), true);
        bad.quality.as_mut().unwrap().kl_mean = 0.3;
        let mut unchecked = option(HatchKind::KvCache, Some(30.0), true);
        unchecked.quality = None;
        let shorter = option(HatchKind::ShorterContext, Some(12.0), true);
        for cache in [bad, unchecked] {
            let v = reading(&context(Some(7.0), vec![cache.clone(), shorter.clone()]), 10.0, &gate()).unwrap();
            assert_eq!(v.reaches.map(|r| r.kind), Some(HatchKind::ShorterContext), "{cache:?}");
        }
    }

    fn context(tg: Option<f64>, options: Vec<PlacementOption>) -> ContextPlacement {
        ContextPlacement {
            n_ctx: 8192,
            fits_fully: false,
            kv_bytes: None,
            recommendation: crate::profile::Admitted::for_test(Recommendation {
                tg_ts: tg,
                ..crate::tune::worlds::recommendation()
            }),
            options,
            default: None,
            ollama: None,
            split: None,
            reading: None,
            job: None,
            draft: None,
        }
    }

    #[test]
    fn an_answer_at_reading_speed_is_fast_enough_and_names_no_hatch() {
        let c = context(Some(10.0), vec![option(HatchKind::KvCache, Some(30.0), true)]);
        let v = reading(&c, 10.0, &gate()).unwrap();
        assert!(v.above);
        assert!(v.reaches.is_none() && v.untried.is_empty());
        assert!(!reading(&c, 10.5, &gate()).unwrap().above);
    }

    #[test]
    fn below_it_the_first_hatch_in_the_guides_order_that_reaches_it_is_named() {
        // The FFN spill is faster, but the guides try the cache type first.
        let opts = vec![
            option(HatchKind::FfnSpill, Some(20.0), true),
            option(HatchKind::ShorterContext, Some(15.0), true),
            option(HatchKind::KvCache, Some(12.0), true),
        ];
        let v = reading(&context(Some(7.0), opts.clone()), 10.0, &gate()).unwrap();
        assert!(!v.above);
        let r = v.reaches.unwrap();
        assert_eq!(r.kind, HatchKind::KvCache);
        assert_eq!(r.kl_mean, Some(0.004));
        // A threshold the cache does not reach: the shorter context is next.
        let v = reading(&context(Some(7.0), opts), 13.0, &gate()).unwrap();
        assert_eq!(v.reaches.unwrap().kind, HatchKind::ShorterContext);
    }

    #[test]
    fn a_hatch_over_the_cap_or_already_recommended_never_reaches() {
        let mut over = option(HatchKind::KvCache, Some(30.0), true);
        over.fits = false;
        let mut chosen = option(HatchKind::FfnSpill, Some(30.0), true);
        chosen.recommended = true;
        let v = reading(&context(Some(7.0), vec![over, chosen]), 10.0, &gate()).unwrap();
        assert!(v.reaches.is_none());
        assert!(v.untried.is_empty());
    }

    #[test]
    fn with_none_measured_that_reaches_the_priced_ones_that_fit_are_listed() {
        let opts = vec![option(HatchKind::KvCache, Some(8.0), true), option(HatchKind::ShorterContext, None, false)];
        let v = reading(&context(Some(7.0), opts), 10.0, &gate()).unwrap();
        assert!(v.reaches.is_none());
        assert_eq!(v.untried.len(), 1);
        assert_eq!(v.untried[0].kind, HatchKind::ShorterContext);
        assert_eq!(v.untried[0].tg_ts, None);
    }

    #[test]
    fn an_unmeasured_answer_gets_no_verdict() {
        assert!(reading(&context(None, Vec::new()), 10.0, &gate()).is_none());
        assert!(reading(&context(Some(f64::NAN), Vec::new()), 10.0, &gate()).is_none());
    }
}
