//! Energy over the timed sections of a test only: each repetition's timed
//! tokens, not its warmup or the depth restored before each repetition
//! (which once averaged into every figure). The GPUs' (NVML) and the CPU
//! packages' (RAPL) energy are summed over the sections, and so are the
//! sections' seconds: the mean power is the one over the other.

use super::nvml::{EnergyMeter, EnergySpan};
use super::rapl::{Rapl, RaplSpan};

/// Joules and seconds summed over sections; `read` once one section read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sum {
    joules: f64,
    secs: f64,
    read: bool,
}

impl Sum {
    /// One section's energy and seconds (`None`: it could not be read; a
    /// section that did not read leaves the sum to those that did).
    pub fn add(&mut self, section: Option<(f64, f64)>) {
        if let Some((j, s)) = section {
            self.joules += j;
            self.secs += s;
            self.read = true;
        }
    }

    /// The mean power (W) over the sections that read.
    #[must_use]
    pub fn watts(&self) -> Option<f64> {
        (self.read && self.secs > 0.0).then(|| self.joules / self.secs)
    }
}

/// The meters a worker has, around one test's timed sections.
pub struct Timed<'m> {
    gpu: Option<&'m EnergyMeter>,
    cpu: Option<&'m Rapl>,
    /// The GPUs this process runs on, found at the first section.
    devices: Option<Vec<u32>>,
    open: Option<(Option<EnergySpan>, Option<RaplSpan>)>,
    gpu_sum: Sum,
    cpu_sum: Sum,
}

impl<'m> Timed<'m> {
    #[must_use]
    pub fn new(gpu: Option<&'m EnergyMeter>, cpu: Option<&'m Rapl>) -> Self {
        Timed { gpu, cpu, devices: None, open: None, gpu_sum: Sum::default(), cpu_sum: Sum::default() }
    }

    /// A timed section starts (right before its clock).
    pub fn begin(&mut self) {
        let gpu = self.gpu.map(|m| match &self.devices {
            Some(d) => m.start_on(d.clone()),
            None => m.start(),
        });
        if let Some(s) = &gpu {
            self.devices.get_or_insert_with(|| s.devices.clone());
        }
        self.open = Some((gpu, self.cpu.and_then(Rapl::start)));
    }

    /// The section ends (right after its clock).
    pub fn end(&mut self) {
        let Some((gpu, cpu)) = self.open.take() else { return };
        self.gpu_sum.add(self.gpu.zip(gpu.as_ref()).and_then(|(m, s)| m.joules(s)));
        self.cpu_sum.add(self.cpu.zip(cpu.as_ref()).and_then(|(r, s)| r.joules(s)));
    }

    /// The GPUs' and the CPU packages' mean power (W) over the sections.
    #[must_use]
    pub fn watts(&self) -> (Option<f64>, Option<f64>) {
        (self.gpu_sum.watts(), self.cpu_sum.watts())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two timed sections, 10 J over 1 s and 30 J over 1 s, with minutes
    /// of warmup and depth restore between them: 20 W, whatever the gaps
    /// drew. A section that did not read is left out, not taken as 0 W.
    #[test]
    fn power_is_the_timed_sections_energy_over_their_seconds() {
        let mut s = Sum::default();
        assert_eq!(s.watts(), None, "nothing read");
        s.add(Some((10.0, 1.0)));
        s.add(None);
        s.add(Some((30.0, 1.0)));
        assert_eq!(s.watts(), Some(20.0));
    }

    /// Against a powercap tree whose counters move only inside the
    /// sections: what the counter gained between sections is not counted.
    #[test]
    fn energy_between_sections_is_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        let z = dir.path().join("intel-rapl:0");
        std::fs::create_dir_all(&z).unwrap();
        let set = |uj: u64| std::fs::write(z.join("energy_uj"), format!("{uj}\n")).unwrap();
        set(0);
        let rapl = Rapl::open_at(dir.path()).unwrap();
        let mut t = Timed::new(None, Some(&rapl));
        t.begin();
        std::thread::sleep(std::time::Duration::from_millis(20));
        set(1_000_000); // 1 J inside the section
        t.end();
        set(500_000_000); // 499 J of warmup and depth restore between sections
        t.begin();
        std::thread::sleep(std::time::Duration::from_millis(20));
        set(501_000_000); // 1 J inside
        t.end();
        let (gpu, cpu) = t.watts();
        assert_eq!(gpu, None);
        let w = cpu.unwrap();
        // 2 J over about 40 ms: tens of watts, never the ~12 kW the gap would make it.
        assert!(w > 5.0 && w < 100.0, "{w} W");
    }
}
