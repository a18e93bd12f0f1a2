//! Time as ngl-tune writes it: RFC 3339 UTC strings, without a date crate.

/// RFC 3339 UTC time without a date crate.
#[must_use]
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

#[must_use]
#[allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Seconds since the epoch of an RFC 3339 UTC time as ngl-tune writes it
/// ("2026-11-30T05:44:32Z").
#[must_use]
pub fn parse_rfc3339(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' || b[19] != b'Z'
    {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (n(0..4)?, n(5..7)?, n(8..10)?);
    let (hh, mm, ss) = (n(11..13)?, n(14..16)?, n(17..19)?);
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

/// Where a run's wall time went, printed on stderr when `NGL_TUNE_TIMINGS`
/// is set (`scripts/bench-overhead` reads it); silent otherwise.
pub struct Phases {
    on: bool,
    started: std::time::Instant,
    last: std::time::Instant,
    lines: Vec<(String, f64)>,
    /// Load and measurement inside the workers (the work itself).
    work_ms: f64,
}

impl Phases {
    #[must_use]
    pub fn from_env() -> Phases {
        let now = std::time::Instant::now();
        Phases {
            on: std::env::var_os("NGL_TUNE_TIMINGS").is_some(),
            started: now,
            last: now,
            lines: Vec::new(),
            work_ms: 0.0,
        }
    }

    /// Ends a phase named `what`.
    pub fn lap(&mut self, what: &str) {
        let now = std::time::Instant::now();
        self.lines.push((what.to_string(), now.duration_since(self.last).as_secs_f64() * 1e3));
        self.last = now;
    }

    /// Ends the trials' phase, split into what each worker did.
    pub fn trials(&mut self, results: &[crate::types::TrialResult]) {
        let now = std::time::Instant::now();
        let total = now.duration_since(self.last).as_secs_f64() * 1e3;
        for t in results.iter().filter_map(|r| r.timings.map(|t| (r.wall_ms, t))) {
            let (wall, w) = t;
            self.lines.push(("trial: worker process start and exit".into(), wall - w.worker_ms));
            self.lines.push(("trial: backend start in the worker".into(), w.init_ms));
            self.lines.push(("trial: model load".into(), w.load_ms));
            self.lines.push(("trial: measurement (contexts, warm-ups, repetitions)".into(), w.measure_ms));
            self.work_ms += w.load_ms + w.measure_ms;
        }
        let said: f64 = results.iter().map(|r| r.wall_ms).sum();
        self.lines.push(("trial: runner around the workers".into(), (total - said).max(0.0)));
        self.last = now;
    }

    pub fn report(&self) {
        if !self.on {
            return;
        }
        for (what, ms) in &self.lines {
            eprintln!("timing: {ms:8.1} ms  {what}");
        }
        let total = self.started.elapsed().as_secs_f64() * 1e3;
        eprintln!(
            "timing: {total:8.1} ms  total since main; outside load and measurement: {:.1} ms",
            total - self.work_ms
        );
    }
}

/// An age in the largest unit that keeps it short: "3.5d", "2.0h", "12m", "40s".
#[must_use]
#[allow(clippy::cast_precision_loss)]
pub fn human_age(secs: u64) -> String {
    if secs == u64::MAX {
        "of unknown age".into()
    } else if secs >= 86_400 {
        format!("{:.1}d", secs as f64 / 86_400.0)
    } else if secs >= 3600 {
        format!("{:.1}h", secs as f64 / 3600.0)
    } else if secs >= 60 {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_764_474_000), "2025-11-30T03:40:00Z");
    }

    #[test]
    fn rfc3339_round_trips() {
        for secs in [0u64, 951_782_400, 1_764_474_000, 1_796_000_123] {
            assert_eq!(parse_rfc3339(&rfc3339(secs)), Some(secs));
        }
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}
