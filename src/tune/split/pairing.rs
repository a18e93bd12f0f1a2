//! The answer paired with llama.cpp's own splits: its default (by free
//! memory) and its fit for the same caps.

#[allow(clippy::wildcard_imports)]
use super::*;

/// llama.cpp's fit for the caps as a candidate split: its layers (-1:
/// every layer) and its proportions as whole layers per device (none: its
/// default split by free memory).
pub(super) fn fit_split(fit: &crate::engine::predict::LlamaFitSplit, full: u32, n_devices: usize) -> Option<Vec<u32>> {
    let ngl = match fit.n_gpu_layers? {
        n if n < 0 => full,
        n => u32::try_from(n).ok()?.min(full),
    };
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let weights: Vec<u32> = fit.tensor_split.iter().map(|v| v.max(0.0).round() as u32).collect();
    if weights.iter().all(|w| *w == 0) || ngl == 0 {
        // Its default split: no -ts, only the layer count.
        return Some(vec![ngl]);
    }
    let mut weights = weights;
    weights.resize(n_devices, 0);
    if weights.iter().sum::<u32>() == ngl {
        return Some(weights);
    }
    let total: u32 = weights.iter().sum();
    Some(proportional(ngl, &weights.iter().map(|w| w * ngl.div_ceil(total.max(1)).max(1)).collect::<Vec<_>>()))
}

/// The recommended split measured alternately with llama.cpp's default
/// split at the same layer count and with llama.cpp's fit for the same
/// caps, at the search's depth. Where llama.cpp's default split is as fast
/// (within the noise), or either is faster beyond it, and stays under
/// every cap, it becomes the recommendation.
///
/// # Errors
/// What the executor returns (an interrupt).
pub fn against_llama(
    search: &mut Search<'_>,
    found: &mut SplitFound,
    inp: &SplitInputs<'_>,
    fit: Option<&crate::engine::predict::LlamaFitSplit>,
) -> Result<Vec<crate::profile::SplitComparison>> {
    use crate::profile::{DefaultComparison, SplitComparison, Verdict};
    let Some(best) = found.best.map(|i| found.options[i].clone()) else { return Ok(Vec::new()) };
    let (s, depth) = (search.settings(), search.at().depth);
    let threads = inp.threads;
    let candidate = |layers: &[u32]| match layers {
        [ngl] if inp.devs.len() > 1 => Candidate::layers(*ngl, threads),
        l => Candidate { split: Split::new(l), ..Candidate::layers(l.iter().sum(), threads) },
    };
    let mine = super::candidate_of(&best, threads);
    // (label, layers, is llama.cpp's default): the default wins a tie, fit's own split does not.
    let mut sides: Vec<(String, Vec<u32>, bool)> =
        vec![("llama.cpp's default split (by free memory)".into(), vec![best.placement.n_gpu_layers], true)];
    match fit.and_then(|f| fit_split(f, inp.full, inp.devs.len())) {
        Some(l) if l == sides[0].1 => sides[0].0 += ", which llama.cpp's fit for the same caps chooses too",
        Some(l) => sides.push(("llama.cpp's fit for the same caps".into(), l, false)),
        None => {}
    }
    let mut out = Vec::new();
    let mut switch: Option<(String, Candidate)> = None;
    for (label, layers, default) in sides {
        let theirs = candidate(&layers);
        let split = if theirs.split == Split::default() { Split::new(&[]) } else { theirs.split };
        let mut r = DefaultComparison {
            placement: Some(split_placement(theirs.ngl, &split, (s.workload.kv_type, 0), threads, inp)),
            verdict: Verdict::Same,
            ..DefaultComparison::unmeasured(depth)
        };
        if theirs == mine {
            r.note = "the recommendation is this split".into();
        } else {
            let cut = crate::tune::baseline::pair(search, mine, theirs, &mut r)?;
            r.note = match r.verdict {
                Verdict::Faster if cut => crate::profile::CUT_SHORT.into(),
                Verdict::Tie if default => "within the noise: llama.cpp's default split is recommended".into(),
                Verdict::Tie => "within the noise".into(),
                Verdict::NotDecided if default => {
                    "not decided (the pairs could not tell): llama.cpp's default split is recommended".into()
                }
                Verdict::NotDecided => "not decided (the pairs could not tell)".into(),
                Verdict::Slower => "theirs was faster beyond the noise: it is recommended".into(),
                Verdict::NotMeasured => "a side of the pairs did not complete: not judged".into(),
                _ => String::new(),
            };
            let wins =
                r.verdict == Verdict::Slower || (default && matches!(r.verdict, Verdict::Tie | Verdict::NotDecided));
            if wins && switch.is_none() {
                switch = Some((label.clone(), theirs));
            }
        }
        let tensor_split = if layers.len() > 1 || inp.devs.len() == 1 { layers } else { Vec::new() };
        // What the devices' speeds said of a split of llama.cpp's with proportions, before it ran.
        let predicted_tg_ts =
            found.speed.as_ref().filter(|_| !tensor_split.is_empty()).map(|m| m.predict(&Split::new(&tensor_split)).0);
        let tg_ts = crate::tune::baseline::paired_mean(&search.trials, theirs, false);
        out.push(SplitComparison { against: label, predicted_tg_ts, tg_ts, result: r });
    }
    if let Some((label, theirs)) = switch {
        recommend_paired(search, found, inp, &label, theirs);
    }
    Ok(out)
}

/// Makes the paired side `theirs` the recommended option, where its
/// paired trials stay under every cap; else says why not.
pub(super) fn recommend_paired(
    search: &Search<'_>,
    found: &mut SplitFound,
    inp: &SplitInputs<'_>,
    label: &str,
    theirs: Candidate,
) {
    let s = search.settings();
    let Some(t) = search.trials.iter().rev().find(|t| t.role == Role::Paired && theirs.is(&t.result.spec)) else {
        return;
    };
    let split = if theirs.split == Split::default() { Split::new(&[]) } else { theirs.split };
    let acc = accounted(&t.result, inp.devs);
    let mut o = option_of(&format!("{label}, paired"), &split, acc.clone(), Some(t), s, inp);
    o.placement.n_gpu_layers = theirs.ngl;
    o.predicted_bytes = acc;
    if !o.fits {
        found.notes.push(crate::types::Note::split(format!(
            "{label} was as fast or faster, but over a device's cap: the tuned split stays recommended"
        )));
        return;
    }
    for x in &mut found.options {
        x.recommended = false;
    }
    o.recommended = true;
    o.note = "paired with the tuned split: as fast or faster".into();
    found.options.push(o);
    found.best = Some(found.options.len() - 1);
}
