//! The command line's consumer flags, one per [`Program`], made from the
//! programs themselves (`Program::flag`): a new consumer adds its flag in
//! `consumer/mod.rs`, not in `cli.rs`.

use std::path::PathBuf;

use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};

use super::Program;

/// The settings file of the consumer the command line names (one at a time).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerArgs {
    pub given: Option<(Program, PathBuf)>,
}

impl FromArgMatches for ConsumerArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let given = Program::ALL.into_iter().find_map(|p| m.get_one::<PathBuf>(p.flag().0).map(|f| (p, f.clone())));
        Ok(ConsumerArgs { given })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        if let Some(given) = Self::from_arg_matches(m)?.given {
            self.given = Some(given);
        }
        Ok(())
    }
}

impl Args for ConsumerArgs {
    fn augment_args(cmd: Command) -> Command {
        Program::ALL.into_iter().fold(cmd, |cmd, p| {
            let (flag, help, more) = p.flag();
            let others = Program::ALL.into_iter().filter(move |o| *o != p).map(|o| o.flag().0);
            cmd.arg(
                Arg::new(flag)
                    .long(flag)
                    .value_name("FILE")
                    .value_parser(clap::value_parser!(PathBuf))
                    .help(help)
                    .long_help(format!("{help}\n\n{more}"))
                    .help_heading("Workload")
                    .conflicts_with_all(others),
            )
        })
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}
