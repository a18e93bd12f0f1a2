//! The choice among the hatches' options at one device (pure): the best
//! measured under the cap and the quality gate, a lossy cache only where
//! it pays; and the recommendation it makes.

use crate::profile::{HatchKind, PlacementOption, Recommendation};
use crate::types::{QualityGate, Scoring};

/// The note of a measured quantized cache whose quality was not checked
/// because it would not be chosen even if it passed (not among `checked`):
/// what it measured against the recommendation, and why no check ran.
pub(super) fn unchecked(options: &mut [PlacementOption], scoring: Scoring, checked: &[crate::placement::KvType]) {
    let best = options.iter().find(|o| o.recommended).and_then(|o| score_with_noise(o, scoring)).map(|x| x.0);
    for o in options
        .iter_mut()
        .filter(|o| lossy(o) && o.measured && o.quality.is_none() && !checked.contains(&o.placement.kv_type))
    {
        let cmp = match (score_with_noise(o, scoring), best) {
            (Some((v, _)), Some(b)) if b > 0.0 => {
                format!("{:+.0}% {} against the recommendation; ", (v / b - 1.0) * 100.0, scoring.objective.as_str())
            }
            _ => String::new(),
        };
        o.note = format!("{cmp}quality not checked: not faster than the lossless options beyond the noise, so it could not be chosen");
    }
}

/// The objective's score of an option and its standard error (the larger
/// relative error of the speeds it is made of).
fn score_with_noise(o: &PlacementOption, scoring: Scoring) -> Option<(f64, f64)> {
    let v = scoring.speeds(o.tg_ts, o.pp_ts)?;
    let rel = |se: Option<f64>, ts: Option<f64>| match (se, ts) {
        (Some(se), Some(ts)) if ts > 0.0 => se / ts,
        _ => 0.0,
    };
    let r = scoring.relative_error(rel(o.tg_se_ts, o.tg_ts), rel(o.pp_se_ts, o.pp_ts));
    Some((v, v * r))
}

/// An option that changes the output: a quantized KV cache.
pub(super) fn lossy(o: &PlacementOption) -> bool {
    o.placement.kv_type.is_quantized()
}

/// Marks the best measured option under the cap and says what each other
/// one costs or gains against it. A quantized KV cache needs its quality
/// measured and passing the gate (`--max-kl`, `--min-top1`, at least 100
/// tokens, nothing broken), and is chosen over a lossless option only when
/// it is faster beyond the noise of both (two standard errors of the
/// difference) or nothing lossless fits. Returns notes for the report.
pub fn choose(options: &mut [PlacementOption], scoring: Scoring, gate: &QualityGate) -> Vec<crate::types::Note> {
    let score = |o: &PlacementOption| score_with_noise(o, scoring).map(|x| x.0);
    let gate = |o: &PlacementOption| match &o.quality {
        None => Some("quality not measured: not recommended blind".to_string()),
        Some(q) => q.fails(gate),
    };
    let eligible = |o: &PlacementOption| {
        o.measured && o.fits && o.kind != HatchKind::ShorterContext && (!lossy(o) || gate(o).is_none())
    };
    let best_of = |lossless_only: bool| {
        options
            .iter()
            .enumerate()
            .filter(|(_, o)| eligible(o) && !(lossless_only && lossy(o)))
            .filter_map(|(i, o)| score_with_noise(o, scoring).map(|v| (i, v)))
            .max_by(|a, b| a.1 .0.total_cmp(&b.1 .0))
    };
    let Some((mut bi, (mut bv, best_se))) = best_of(false) else { return Vec::new() };
    let mut within_noise = None;
    if lossy(&options[bi]) {
        if let Some((li, (lv, lse))) = best_of(true) {
            let noise = 2.0 * (best_se * best_se + lse * lse).sqrt();
            if bv - lv <= noise {
                within_noise = Some((bv / lv - 1.0) * 100.0);
                (bi, bv) = (li, lv);
            }
        }
    }
    options[bi].recommended = true;
    let mut notes = Vec::new();
    for (i, o) in options.iter_mut().enumerate() {
        if i == bi || !o.note.is_empty() && !o.measured {
            continue;
        }
        let failed = if lossy(o) && o.measured { gate(o) } else { None };
        if let Some(why) = failed {
            o.note = why;
        } else if let (Some(pct), true) = (within_noise, lossy(o) && eligible(o)) {
            o.note = format!(
                "{pct:+.0}% {} against the recommendation, within the noise of the two: a lossy cache only when it pays",
                scoring.objective.as_str()
            );
        } else if let Some(v) = score(o) {
            let cmp =
                format!("{:+.0}% {} against the recommendation", (v / bv - 1.0) * 100.0, scoring.objective.as_str());
            o.note = if o.note.is_empty() { cmp } else { format!("{}; {cmp}", o.note) };
        } else if !o.fits {
            o.note = "over the cap".into();
        }
    }
    notes.extend(hatch_note(&options[bi]));
    notes
}

/// The note that `o` is the answer at its context: none for the
/// whole-layer split, which needs no hatch.
pub(super) fn hatch_note(o: &PlacementOption) -> Option<crate::types::Note> {
    (o.kind != HatchKind::LayerSplit)
        .then(|| crate::types::Note::hatch(format!("escape hatch at {} context: {}", o.n_ctx(), o.describe())))
}

/// The recommendation at one context: the layer split's, or the chosen
/// hatch's flags (llama.cpp takes each; Ollama takes a quantized KV cache
/// as server settings and has no tensor overrides). The chosen option's
/// placement is the answer whole, as its trials ran (threads included).
#[must_use]
pub fn recommend(layer_split: &Recommendation, options: &[PlacementOption]) -> Recommendation {
    let Some(o) = options.iter().find(|o| o.recommended && o.kind != HatchKind::LayerSplit) else {
        return layer_split.clone();
    };
    let mut r = layer_split.clone();
    r.tg_ts = o.tg_ts;
    r.pp_ts = o.pp_ts;
    #[allow(clippy::cast_precision_loss)]
    let mem = o.device_bytes.map(|b| b as f64);
    r.mem_bytes = mem;
    r.measured = o.measured;
    // Ollama takes a quantized cache as a server setting, which a Modelfile
    // cannot carry (its num_gpu would be over the cap on a server that runs
    // its own cache), and has no tensor overrides: its num_gpu is the
    // whole-layer split, which fits with the cache the server runs.
    r.ollama_num_gpu = Some(layer_split.ollama_layers());
    r.set_placement(&o.placement);
    r
}
