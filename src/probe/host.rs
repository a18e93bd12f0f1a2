//! Host memory through sysinfo: the worker's resident set and the machine's
//! available RAM.

use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, RefreshKind, System};

use super::{DeviceSample, MemorySource};

pub struct HostSource {
    sys: System,
}

impl HostSource {
    #[must_use]
    pub fn new() -> Self {
        HostSource { sys: System::new_with_specifics(RefreshKind::nothing()) }
    }
}

impl Default for HostSource {
    fn default() -> Self {
        Self::new()
    }
}

impl MemorySource for HostSource {
    fn name(&self) -> crate::types::Source {
        crate::types::Source::Host
    }

    /// `used` is the machine's RAM in use (total - available); `pid_used`
    /// the worker's resident set.
    fn sample(&mut self, pid: Option<u32>) -> Vec<DeviceSample> {
        self.sys.refresh_memory();
        let pid_used = pid.and_then(|p| {
            let pid = Pid::from_u32(p);
            self.sys.refresh_processes_specifics(
                ProcessesToUpdate::Some(&[pid]),
                true,
                ProcessRefreshKind::nothing().with_memory(),
            );
            self.sys.process(pid).map(sysinfo::Process::memory)
        });
        let total = self.sys.total_memory();
        vec![DeviceSample {
            device: "host".to_string(),
            used: total.saturating_sub(self.sys.available_memory()),
            total,
            pid_used,
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_rss() {
        let mut h = HostSource::new();
        let s = h.sample(Some(std::process::id()));
        assert_eq!(s.len(), 1);
        let rss = s[0].pid_used.expect("own RSS is readable");
        assert!(rss > 1 << 20 && rss < s[0].total, "rss {rss}");
        assert!(s[0].used > 0 && s[0].used <= s[0].total);
    }
}
