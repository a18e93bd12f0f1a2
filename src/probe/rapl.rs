//! The CPU packages' energy through Linux's powercap interface (RAPL,
//! which serves AMD Zen as well as Intel): each zone read by its `name`,
//! the packages (`package-N`) and the memory (`dram`, a subzone of a
//! package or a zone of its own, outside the package's figure), summed,
//! read around a timed test. `psys` (the whole platform, packages
//! included) counts only where it is the only zone, never beside them.
//! Where none is readable (a VM, a non-x86 host, no permission) the CPU's
//! energy is not measured and the report says so.

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

/// A top-level zone's directory: `intel-rapl:0`, not a subzone `intel-rapl:0:1`.
fn is_package(name: &str) -> bool {
    name.strip_prefix("intel-rapl:").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A subzone's directory: `intel-rapl:0:2`.
fn is_subzone(name: &str) -> bool {
    name.strip_prefix("intel-rapl:").and_then(|n| n.split_once(':')).is_some_and(|(a, b)| {
        !a.is_empty() && !b.is_empty() && a.bytes().all(|c| c.is_ascii_digit()) && b.bytes().all(|c| c.is_ascii_digit())
    })
}

/// What a zone counts, by the name the kernel gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `package-N` (or a top-level zone without a name: taken as one).
    Package,
    /// `dram`: the memory's energy, outside the package's.
    Dram,
    /// `psys`: the whole platform, packages and memory included.
    Platform,
    /// Cores, uncore and the rest: inside the package's figure.
    Inside,
}

fn kind(dir: &Path, top: bool) -> Kind {
    let name = std::fs::read_to_string(dir.join("name")).unwrap_or_default();
    match name.trim() {
        "" if top => Kind::Package,
        n if n.starts_with("package") => Kind::Package,
        "dram" => Kind::Dram,
        "psys" => Kind::Platform,
        _ => Kind::Inside,
    }
}

/// A zone's counter and the value it wraps at (µJ), where it reads.
fn counter(dir: &Path) -> Option<(PathBuf, u64)> {
    let energy = dir.join("energy_uj");
    read_u64(&energy)?;
    Some((energy, read_u64(&dir.join("max_energy_range_uj")).unwrap_or(u64::MAX)))
}

impl Rapl {
    /// This machine's packages; `None` where no counter can be read.
    /// `NGL_TUNE_POWERCAP` names another tree (the tests' stand-in, as
    /// `LD_LIBRARY_PATH` names their NVML).
    #[must_use]
    pub fn open() -> Option<Self> {
        let root = std::env::var_os("NGL_TUNE_POWERCAP").map_or_else(|| PathBuf::from(POWERCAP), PathBuf::from);
        Self::open_at(&root)
    }

    /// The zones under `root` (a powercap tree; tests pass their own):
    /// packages and memory, or the platform alone where nothing else reads.
    #[must_use]
    pub fn open_at(root: &Path) -> Option<Self> {
        let mut found: Vec<(Kind, PathBuf, u64)> = std::fs::read_dir(root)
            .ok()?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let top = is_package(&name);
                if !top && !is_subzone(&name) {
                    return None;
                }
                let k = kind(&e.path(), top);
                let counted = if top { k != Kind::Inside } else { k == Kind::Dram };
                let (energy, max) = counter(&e.path()).filter(|_| counted)?;
                Some((k, energy, max))
            })
            .collect();
        if found.iter().any(|(k, _, _)| *k != Kind::Platform) {
            found.retain(|(k, _, _)| *k != Kind::Platform);
        }
        let mut zones: Vec<(PathBuf, u64)> = found.into_iter().map(|(_, p, m)| (p, m)).collect();
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
    pub fn watts(&self, span: &RaplSpan) -> Option<f64> {
        self.joules(span).map(|(j, s)| j / s)
    }

    /// The energy (J) the zones counted since `span` started, and the
    /// seconds since (`None` where a counter does not read or no time passed).
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn joules(&self, span: &RaplSpan) -> Option<(f64, f64)> {
        let now = self.read()?;
        let secs = span.t0.elapsed().as_secs_f64();
        let uj: u64 = self
            .zones
            .iter()
            .zip(span.uj.iter().zip(&now))
            .map(|((_, max), (a, b))| if b >= a { b - a } else { max.saturating_sub(*a) + b })
            .sum();
        (secs > 0.0).then(|| (uj as f64 / 1e6, secs))
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

    /// Zones by their names: the packages and the memory are summed,
    /// `psys` beside them is left out (it holds them), and alone it is
    /// the figure; cores and uncore stay inside their package's.
    #[test]
    fn zones_are_read_by_name_dram_counted_and_psys_only_alone() {
        let tree = |zones: &[(&str, &str)]| {
            let dir = tempfile::tempdir().unwrap();
            for (d, name) in zones {
                let z = dir.path().join(d);
                std::fs::create_dir_all(&z).unwrap();
                std::fs::write(z.join("name"), format!("{name}\n")).unwrap();
                std::fs::write(z.join("energy_uj"), "1000\n").unwrap();
            }
            dir
        };
        let names = |dir: &tempfile::TempDir| {
            let r = Rapl::open_at(dir.path()).unwrap();
            let n: Vec<String> = r
                .zones
                .iter()
                .map(|(p, _)| p.parent().unwrap().file_name().unwrap().to_string_lossy().into())
                .collect();
            n
        };
        let server = tree(&[
            ("intel-rapl:0", "package-0"),
            ("intel-rapl:0:0", "core"),
            ("intel-rapl:0:1", "dram"),
            ("intel-rapl:1", "package-1"),
            ("intel-rapl:1:0", "dram"),
            ("intel-rapl:2", "psys"),
        ]);
        assert_eq!(names(&server), ["intel-rapl:0", "intel-rapl:0:1", "intel-rapl:1", "intel-rapl:1:0"]);
        let laptop = tree(&[("intel-rapl:0", "psys")]);
        assert_eq!(names(&laptop), ["intel-rapl:0"], "psys alone is the figure");
        assert!(is_subzone("intel-rapl:0:1") && !is_subzone("intel-rapl:0") && !is_subzone("intel-rapl:0:"));
    }
}
