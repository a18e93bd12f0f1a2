//! Progress of a sweep of trials, for bench and tune alike: an indicatif
//! bar on a terminal, one plain line per finished trial elsewhere (CI logs,
//! nohup, the journal), nothing with `--quiet`.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::types::TrialResult;

pub struct Progress {
    bar: ProgressBar,
    plain: bool,
    started: Instant,
}

impl Progress {
    /// `planned` trials to begin with (more can be planned as the work goes);
    /// shown as a bar when stderr is a terminal.
    #[must_use]
    pub fn new(show: bool, planned: u64) -> Progress {
        Progress::with_terminal(show, std::io::stderr().is_terminal(), planned)
    }

    /// As [`Progress::new`], saying whether stderr is a terminal.
    #[must_use]
    pub fn with_terminal(show: bool, terminal: bool, planned: u64) -> Progress {
        let bar = if show && terminal {
            let b = ProgressBar::new(planned);
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} {elapsed_precise} [{bar:25}] {pos}/{len} trials, about {eta} left | {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b.enable_steady_tick(Duration::from_millis(120));
            b
        } else {
            // Hidden, but still counting trials: the plain lines read it.
            ProgressBar::with_draw_target(Some(planned), ProgressDrawTarget::hidden())
        };
        Progress { bar, plain: show && !terminal, started: Instant::now() }
    }

    /// A bar that shows nothing (tests, quiet runs).
    #[must_use]
    pub fn hidden() -> Progress {
        Progress::with_terminal(false, false, 0)
    }

    /// Makes room for `n` more trials.
    pub fn plan(&self, n: u64) {
        self.bar.inc_length(n);
    }

    /// Makes sure one more trial has room (the adaptive search plans as it goes).
    pub fn plan_one_more(&self) {
        if self.bar.position() >= self.bar.length().unwrap_or(0) {
            self.plan(1);
        }
    }

    /// At least `n` trials in all, or as many as are done already.
    pub fn length_at_least(&self, n: u64) {
        self.bar.set_length(self.bar.position().max(n));
    }

    /// Trials already done (a resumed run).
    pub fn done_already(&self, n: u64) {
        self.bar.set_position(n);
    }

    /// A planned trial that will not run (predicted over the cap, skipped).
    pub fn skip(&self) {
        self.bar.inc(1);
    }

    /// What is being measured now.
    pub fn starting(&self, what: String) {
        self.bar.set_message(what);
    }

    /// One trial finished: the bar moves, and without a terminal one plain
    /// line says what it measured and how long the rest should take.
    pub fn finished(&self, r: &TrialResult, message: String) {
        self.bar.inc(1);
        self.bar.set_message(message);
        if self.plain {
            #[allow(clippy::cast_possible_truncation)]
            let (pos, len) = (self.bar.position() as usize, self.bar.length().unwrap_or(0) as usize);
            eprintln!("{}", crate::report::progress_line(pos, len, r, self.started.elapsed()));
        }
    }

    /// A line above the bar (on a terminal only: plain output has its own lines).
    pub fn println(&self, line: String) {
        self.bar.println(line);
    }

    /// A warning that must be read whether or not a bar is drawn.
    pub fn warn(&self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }

    /// Leaves the bar where it stopped (an interrupt).
    pub fn abandon(&self) {
        self.bar.abandon();
    }

    pub fn clear(&self) {
        self.bar.finish_and_clear();
    }
}
