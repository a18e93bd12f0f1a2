//! Parse, run, print errors, exit with a documented code.

use clap::Parser;

use ngl_tune::cli::{default_to_tune, normalize_args, Cli};
use ngl_tune::error::{exit, exit_code, is_broken_pipe};

fn main() {
    let args = default_to_tune(normalize_args(std::env::args()));
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { exit::BAD_INPUT } else { exit::OK };
            match ngl_tune::cli::one_line(&e).or_else(|| ngl_tune::cli::negative_value(&e, &args)) {
                Some(line) => eprintln!("error: {line}"),
                None => drop(e.print()),
            }
            std::process::exit(code);
        }
    };
    // The trial worker kept for a next trial ended with the runner that ran it.
    match ngl_tune::app::run(cli) {
        Ok(code) => std::process::exit(code),
        Err(err) if is_broken_pipe(&err) => std::process::exit(exit::OK),
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::exit(exit_code(&err));
        }
    }
}
