//! The end of a tune: every context's outcome made one profile (the
//! largest context's answer first, each smaller context's notes saying
//! which context they are of), stored, and the checkpoint removed.

use std::time::Instant;

use anyhow::Result;

use super::context::ContextOutcome;
use super::start::Shared;
use super::TuneOutcome;
use crate::clock::now_rfc3339;
use crate::profile::store;
use crate::profile::{Confidence, MemoryPolicy, Profile, Tool, SCHEMA_VERSION};
use crate::types::Note;

/// The profile of every context's outcome (the last, the largest, is the
/// answer), stored.
///
/// # Errors
/// A profile that cannot be written.
pub(super) fn profile(
    sh: &Shared<'_>,
    mut outcomes: Vec<ContextOutcome>,
    mut notes: Vec<Note>,
    started: Instant,
) -> Result<TuneOutcome> {
    let (s, hw, policy) = (sh.opts.settings(), &sh.hw, &sh.policy);
    let primary = outcomes.pop().expect("at least one context");
    let busy =
        crate::report::note::busy(outcomes.iter().chain([&primary]).flat_map(|o| o.trials.iter().map(|t| &t.result)));
    let confidence = if busy.is_some() { Confidence::Low } else { Confidence::High };
    let mut placements: Vec<crate::profile::ContextPlacement> = Vec::new();
    let mut trials = Vec::new();
    let mtp = sh.identity.has_mtp();
    for o in outcomes.iter().chain([&primary]) {
        let mut p = o.placement.clone();
        p.recommendation.set_confidence(confidence);
        if mtp {
            p.recommendation.mark_mtp_heads();
        }
        placements.push(p);
        trials.extend(o.trials.iter().cloned());
        add_context_notes(&mut notes, &o.notes, o.placement.n_ctx, s.workload.n_ctx);
    }
    notes.extend(busy);
    notes.extend(crate::report::note::threads(trials.iter().map(|t| &t.result)));
    let mut recommendation = primary.placement.recommendation.clone();
    recommendation.set_confidence(confidence);
    if mtp {
        recommendation.mark_mtp_heads();
    }
    let profile = Profile {
        schema_version: SCHEMA_VERSION,
        tool: Tool::this(),
        created_at: now_rfc3339(),
        machine_id: hw.machine_id.clone(),
        fingerprint: hw.fingerprint.clone(),
        memory: policy.clone().unwrap_or_else(MemoryPolicy::no_gpu),
        hardware: hw.clone(),
        model: sh.identity.clone(),
        settings: s.clone(),
        no_gpu: primary.no_gpu,
        memory_fit_check: primary.fit_check,
        recommendation,
        decision: primary.found.decision,
        skipped: primary.found.skipped,
        trials,
        prediction: primary.prediction,
        search: primary.search,
        notes: notes.clone(),
        wall_s: started.elapsed().as_secs_f64(),
        // Without a device there is nothing to place, but a draft tried beside the answer.
        placements: if policy.is_some() || placements.iter().any(|c| c.draft.is_some()) {
            placements
        } else {
            Vec::new()
        },
        model_quality: None,
        measured_backend: Some(crate::consumer::ollama::process::measured_backend(
            hw,
            sh.opts.caps().first().filter(|_| policy.is_some()).map(|c| c.device.as_str()),
        )),
    };
    let path = store::save(sh.opts.store(), &profile)?;
    let _ = std::fs::remove_file(store::checkpoint_path(sh.opts.store(), &profile.machine_id, &profile.model));
    Ok(TuneOutcome { profile, path, notes })
}

/// Adds what one context's search said; a note from a context smaller
/// than the profile's answer (`primary`) says which context it is of.
fn add_context_notes(notes: &mut Vec<Note>, found: &[Note], n_ctx: u32, primary: u32) {
    for n in found {
        let n = if n_ctx == primary { n.clone() } else { n.clone().at(n_ctx) };
        if !notes.contains(&n) {
            notes.push(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::NoteKind;

    #[test]
    fn a_noisy_trial_at_the_smaller_of_two_contexts_is_a_warning_in_the_report() {
        let noisy = |ngl| {
            Note::new(NoteKind::Noisy {
                test: "tg128".into(),
                n_gpu_layers: ngl,
                n_threads: 2,
                cv: 0.3,
                avg_ts: 10.0,
                stddev_ts: 3.0,
            })
        };
        let mut notes = vec![Note::hardware("NVML not available")];
        add_context_notes(&mut notes, &[noisy(7), Note::search("adaptive search stopped")], 4096, 32768);
        add_context_notes(&mut notes, &[noisy(9)], 32768, 32768);
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/example-gemma-3-270m-cpu.json");
        let mut profile = crate::profile::store::read_profile(&p).unwrap();
        profile.notes = notes;
        let report = crate::report::tune_report(&profile, &p);
        let warnings: Vec<&str> = report.lines().filter(|l| l.starts_with("warning: ")).collect();
        assert_eq!(warnings.len(), 2, "{report}");
        assert!(warnings[0].starts_with("warning: 4096 context: noisy measurement: tg128 at ngl 7"), "{report}");
        assert!(warnings[1].starts_with("warning: noisy measurement: tg128 at ngl 9"), "{report}");
        assert!(!report.contains("adaptive search stopped"), "plain notes are printed before the report");
    }
}
