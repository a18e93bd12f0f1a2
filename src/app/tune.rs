//! `ngl-tune [tune] MODEL...`: tune each model, write its profile, print the report (and the ranking of several).

use std::io::Write;

use anyhow::Result;

use super::{print_notes, write_extras};
use clap::ValueEnum;

use crate::cli::TuneArgs;
use crate::error::{bad, exit};

pub(super) fn cmd_tune(a: &TuneArgs) -> Result<i32> {
    let (store, reqs) = crate::request::finish::tune_requests(a)?;
    let shares = set_shares(a, reqs.len())?;
    // Bad input before the store is touched.
    for req in &reqs {
        crate::tune::check_request_power(req)?;
    }
    crate::interrupt::install();
    let names: Vec<&str> = reqs.iter().map(|r| r.info().file_name.as_str()).collect();
    let _lock = crate::profile::lock::StoreLock::acquire(
        &store,
        &crate::probe::machine_id(),
        a.lock.no_wait,
        &format!("ngl-tune tune {}", names.join(" ")),
    )?;
    if let Some(shares) = shares {
        return together(a, &reqs, &shares);
    }
    let mut outcomes = Vec::new();
    for req in &reqs {
        outcomes.push(crate::tune::tune(req)?);
    }
    if outcomes.len() > 1 {
        return ranked(a, &mut outcomes);
    }
    let outcome = &outcomes[0];
    write_extras(&outcome.profile, a.files.chart.as_deref(), a.files.write_modelfile.as_deref())?;
    let mut out = std::io::stdout().lock();
    if a.print.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&outcome.profile)?)?;
    } else {
        print_report(&mut out, outcome)?;
    }
    out.flush()?;
    Ok(exit::OK)
}

/// `--together`'s shares of requests, checked before anything is measured.
fn set_shares(a: &TuneArgs, n: usize) -> Result<Option<Vec<f64>>> {
    if !a.together {
        return Ok(None);
    }
    if n < 2 {
        return Err(bad("--together places two or more models side by side; give them all"));
    }
    // The set is placed by the weighted time a generated token takes, at
    // one context, under the device's cap: what it cannot honour is refused,
    // never silently dropped.
    let ignored = [
        matches!(
            a.objective,
            crate::cli::ObjectiveArg::Pp | crate::cli::ObjectiveArg::Mixed | crate::cli::ObjectiveArg::Energy
        )
        .then(|| {
            format!("--objective {}", a.objective.to_possible_value().map_or("?".into(), |v| v.get_name().to_string()))
        }),
        a.max_power.map(|w| format!("--max-power {w}")),
        a.host_budget.as_ref().map(|b| format!("--host-budget {b}")),
        a.ctx.as_ref().filter(|c| c.contains(',')).map(|c| format!("--ctx {c}")),
    ];
    if let Some(flag) = ignored.into_iter().flatten().next() {
        return Err(bad(format!(
            "--together does not take {flag}: a set is placed by the weighted generation speed of its models at one context under the device's cap; drop it, or tune the models one by one"
        )));
    }
    let same = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    for (i, m) in a.models.iter().enumerate() {
        if let Some(first) = a.models[..i].iter().find(|o| same(o) == same(m)) {
            return Err(bad(format!(
                "--together got {} twice (as {} and {}): a set holds each model once; give each model one time",
                same(m).display(),
                first.display(),
                m.display()
            )));
        }
    }
    crate::tune::together::weights(a.weights.as_deref(), n).map(Some)
}

/// `--together`: the models tuned as neighbours, the set printed.
fn together(a: &TuneArgs, reqs: &[crate::tune::TuneRequest], shares: &[f64]) -> Result<i32> {
    let set = crate::tune::together::tune_together(reqs, shares)?;
    let mut out = std::io::stdout().lock();
    if a.print.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&set.profile)?)?;
    } else {
        write!(out, "{}", crate::report::together::set_report(&set.profile, &set.path))?;
    }
    out.flush()?;
    Ok(exit::OK)
}

fn print_report(out: &mut impl Write, outcome: &crate::tune::TuneOutcome) -> Result<()> {
    // The noise warning belongs beside the numbers, in the report.
    let notes: Vec<String> = outcome.notes.iter().filter(|n| !n.is_warning()).map(ToString::to_string).collect();
    print_notes(&notes);
    write!(out, "{}", crate::report::tune_report(&outcome.profile, &outcome.path))?;
    Ok(())
}

/// Several models: each one's report, then the ranking with each one's
/// quality against the largest (stored in its profile).
fn ranked(a: &TuneArgs, outcomes: &mut [crate::tune::TuneOutcome]) -> Result<i32> {
    use crate::tune::rank;
    let profiles: Vec<crate::profile::Profile> = outcomes.iter().map(|o| o.profile.clone()).collect();
    let runner = crate::tune::runner(&profiles[0].settings.policy, a.talk.verbose)?;
    let qualities = rank::qualities(&runner, &profiles, profiles[0].settings.backend.n_threads)?;
    for (o, q) in outcomes.iter_mut().zip(&qualities) {
        if q.is_some() {
            o.profile.model_quality.clone_from(q);
            crate::profile::store::write_profile(&o.path, &o.profile)?;
        }
    }
    let s = &profiles[0].settings;
    let rows = rank::rank(&profiles, &qualities, &s.gate);
    let mut out = std::io::stdout().lock();
    if a.print.json {
        let all: Vec<&crate::profile::Profile> = outcomes.iter().map(|o| &o.profile).collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&serde_json::json!({ "ranking": rows, "profiles": all }))?)?;
    } else {
        for o in outcomes.iter() {
            print_report(&mut out, o)?;
            writeln!(out)?;
        }
        write!(out, "{}", rank::render(&rows, s.goal.reading_speed))?;
    }
    out.flush()?;
    Ok(exit::OK)
}
