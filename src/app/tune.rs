//! `ngl-tune [tune] MODEL...`: tune each model, write its profile, print the report (and the ranking of several).

use std::io::Write;

use anyhow::Result;

use super::{check_output_path, print_notes, write_extras};
use crate::cli::TuneArgs;
use crate::error::{bad, exit};
use crate::model;
use crate::request::{parse_budgets, rpc_list, tune_settings};

pub(super) fn cmd_tune(a: &TuneArgs) -> Result<i32> {
    // The cap's options are judged first, before the store and the models
    // (--target-vram by the parser, before this).
    let target = a.target_vram;
    let (budget, device_budgets) = a.vram_budget.as_deref().map(parse_budgets).transpose()?.unwrap_or_default();
    // The servers are probed with the request (tune::TuneRequest::new).
    let rpc = rpc_list(a.workload.rpc.servers.as_deref())?;
    let store = crate::profile::store::dir_or_default(a.store.given());
    crate::profile::store::check_dir(&store)?;
    one_model_flags(a)?;
    // Every model and its settings are checked before anything is measured.
    let mut infos = Vec::new();
    for m in &a.models {
        let info = model::inspect(m)?;
        let mut settings = tune_settings(a, &info, target, budget)?;
        settings.rpc.clone_from(&rpc);
        settings.device_budgets.clone_from(&device_budgets);
        infos.push((info, settings));
    }
    if let Some(c) = &a.files.chart {
        check_output_path(c, "--chart")?;
    }
    if let Some(m) = &a.files.write_modelfile {
        check_output_path(m, "--write-modelfile")?;
    }
    let consumer = crate::request::finish::consumer(a)?;
    let mut reqs = Vec::new();
    for (info, settings) in infos {
        let req = crate::tune::TuneRequest::new(info, settings, store.clone())?
            .with_resume(a.resume)
            .with_output(a.talk.verbose, !a.talk.quiet);
        reqs.push(crate::request::finish::finish(a, req, consumer.as_ref())?);
    }
    let shares = set_shares(a, reqs.len())?;
    crate::interrupt::install();
    let names: Vec<&str> = reqs.iter().map(|r| r.info.file_name.as_str()).collect();
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

/// Flags that write one model's files take one model.
fn one_model_flags(a: &TuneArgs) -> Result<()> {
    if a.models.len() > 1 {
        for (given, flag) in
            [(a.files.chart.is_some(), "--chart"), (a.files.write_modelfile.is_some(), "--write-modelfile")]
        {
            if given {
                return Err(bad(format!(
                    "{flag} takes one model; tune the models together, then use emit {flag} on the one you pick"
                )));
            }
        }
    }
    Ok(())
}

/// `--together`'s shares of requests, checked before anything is measured.
fn set_shares(a: &TuneArgs, n: usize) -> Result<Option<Vec<f64>>> {
    if !a.together {
        return Ok(None);
    }
    if n < 2 {
        return Err(bad("--together places two or more models side by side; give them all"));
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
    let runner = crate::tune::runner(&profiles[0].settings, a.talk.verbose)?;
    let qualities = rank::qualities(&runner, &profiles, profiles[0].settings.n_threads)?;
    for (o, q) in outcomes.iter_mut().zip(&qualities) {
        if q.is_some() {
            o.profile.model_quality.clone_from(q);
            crate::profile::store::write_profile(&o.path, &o.profile)?;
        }
    }
    let s = &profiles[0].settings;
    let rows = rank::rank(&profiles, &qualities, s.max_kl, s.min_top1);
    let mut out = std::io::stdout().lock();
    if a.print.json {
        let all: Vec<&crate::profile::Profile> = outcomes.iter().map(|o| &o.profile).collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&serde_json::json!({ "ranking": rows, "profiles": all }))?)?;
    } else {
        for o in outcomes.iter() {
            print_report(&mut out, o)?;
            writeln!(out)?;
        }
        write!(out, "{}", rank::render(&rows, s.reading_speed))?;
    }
    out.flush()?;
    Ok(exit::OK)
}
