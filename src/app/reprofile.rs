//! `ngl-tune reprofile`: the nightly re-tune of what is stale, with drift.

use std::io::Write;

use anyhow::Result;

use crate::cli::ReprofileArgs;

pub(super) fn cmd_reprofile(a: &ReprofileArgs) -> Result<i32> {
    let opts = crate::request::reprofile_options(a)?;
    crate::interrupt::install();
    let _lock = crate::profile::lock::StoreLock::acquire(
        &opts.store,
        &crate::probe::machine_id(),
        a.lock.no_wait,
        "ngl-tune reprofile",
    )?;
    let json = a.print.json;
    // A reader that went away (a pager closed early) does not stop the
    // nightly run: its exit code still says what happened.
    let mut say = |line: &str| {
        if !json {
            let _ = writeln!(std::io::stdout().lock(), "{line}");
        }
    };
    let summary = crate::reprofile::reprofile(&opts, &mut say)?;
    if json {
        say_out(&serde_json::to_string_pretty(&summary)?);
    } else {
        say_out(&format!(
            "summary: {} re-tuned, {} fresh, {} missing, {} invalid, {} failed; {} regressions, {} improvements, {} recommendations changed, {} inconclusive, {} comparisons not judged (busy machine)",
            summary.retuned,
            summary.fresh,
            summary.missing,
            summary.invalid,
            summary.failed,
            summary.regressions,
            summary.improvements,
            summary.recommendations_changed,
            summary.inconclusive,
            summary.contended
        ));
    }
    Ok(summary.exit_code)
}

fn say_out(line: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}
