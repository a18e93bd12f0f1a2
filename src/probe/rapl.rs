//! The CPU packages' energy through Linux's powercap interface (RAPL,
//! which serves AMD Zen as well as Intel): each package's
//! `/sys/class/powercap/intel-rapl:N/energy_uj`, summed, read around a
//! timed test. Where none is readable (a VM, a non-x86 host, no
//! permission) the CPU's energy is not measured and the report says so.

use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where Linux puts the powercap zones.
pub const POWERCAP: &str = "/sys/class/powercap";

/// The packages' energy counters (their subzones, cores and uncore, are
/// inside the package's figure and left out).
pub struct Rapl {
    /// Each package's counter and the value it wraps at (µJ).
    zones: Vec<(PathBuf, u64)>,
}

/// A reading a span started with.
pub struct RaplSpan {
    t0: Instant,
    uj: Vec<u64>,
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// A package zone's name: `intel-rapl:0`, not a subzone `intel-rapl:0:1`.
fn is_package(name: &str) -> bool {
    name.strip_prefix("intel-rapl:").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl Rapl {
    /// This machine's packages; `None` where no counter can be read.
    #[must_use]
    pub fn open() -> Option<Self> {
        Self::open_at(Path::new(POWERCAP))
    }

    /// The packages under `root` (a powercap tree; tests pass their own).
    #[must_use]
    pub fn open_at(root: &Path) -> Option<Self> {
        let mut zones: Vec<(PathBuf, u64)> = std::fs::read_dir(root)
            .ok()?
            .flatten()
            .filter(|e| is_package(&e.file_name().to_string_lossy()))
            .filter_map(|e| {
                let energy = e.path().join("energy_uj");
                read_u64(&energy)?;
                Some((energy, read_u64(&e.path().join("max_energy_range_uj")).unwrap_or(u64::MAX)))
            })
            .collect();
        zones.sort();
        (!zones.is_empty()).then_some(Rapl { zones })
    }

    fn read(&self) -> Option<Vec<u64>> {
        self.zones.iter().map(|(p, _)| read_u64(p)).collect()
    }

    #[must_use]
    pub fn start(&self) -> Option<RaplSpan> {
        Some(RaplSpan { t0: Instant::now(), uj: self.read()? })
    }

    /// The packages' mean power (W) since `span` started (a counter that
    /// wrapped is taken round once).
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn watts(&self, span: &RaplSpan) -> Option<f64> {
        let now = self.read()?;
        let secs = span.t0.elapsed().as_secs_f64();
        let uj: u64 = self
            .zones
            .iter()
            .zip(span.uj.iter().zip(&now))
            .map(|((_, max), (a, b))| if b >= a { b - a } else { max.saturating_sub(*a) + b })
            .sum();
        (secs > 0.0).then(|| uj as f64 / 1e6 / secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packages_are_summed_subzones_left_out_and_a_wrapped_counter_taken_round() {
        let dir = tempfile::tempdir().unwrap();
        let zone = |name: &str, uj: u64, max: u64| {
            let z = dir.path().join(name);
            std::fs::create_dir_all(&z).unwrap();
            std::fs::write(z.join("energy_uj"), format!("{uj}\n")).unwrap();
            std::fs::write(z.join("max_energy_range_uj"), format!("{max}\n")).unwrap();
        };
        zone("intel-rapl:0", 1_000_000, 10_000_000);
        zone("intel-rapl:1", 9_500_000, 10_000_000);
        zone("intel-rapl:0:0", 5, 10_000_000);
        let r = Rapl::open_at(dir.path()).expect("two packages");
        assert_eq!(r.zones.len(), 2);
        let span = r.start().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // +2 J on package 0; package 1 wraps: +1 J (0.5 to the top, 0.5 past it).
        zone("intel-rapl:0", 3_000_000, 10_000_000);
        zone("intel-rapl:1", 500_000, 10_000_000);
        let w = r.watts(&span).unwrap();
        let secs = span.t0.elapsed().as_secs_f64();
        assert!((w * secs - 3.0).abs() < 0.2, "3 J over {secs} s: {w} W");
        assert!(Rapl::open_at(&dir.path().join("missing")).is_none());
        assert!(is_package("intel-rapl:12") && !is_package("intel-rapl:0:1") && !is_package("intel-rapl:"));
    }
}
