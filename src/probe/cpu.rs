//! Contention: how much CPU other processes used while a trial ran, read
//! from `/proc` (the machine's busy time in `/proc/stat` minus the worker's
//! and our own, and each process's time in `/proc/PID/stat`), so a
//! measurement taken on a busy machine is known as such instead of being
//! silently low.

use crate::types::{BusyProcess, Contention};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Share of the trial's threads that other processes may use (in cores'
/// worth of CPU, on average over the trial) before it counts as contended.
pub const DEFAULT_BUSY_THRESHOLD: f64 = 0.10;

/// How often the machine's and every process's CPU time are read.
const INTERVAL: Duration = Duration::from_millis(500);

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        #[allow(clippy::cast_precision_loss)]
        let t = t as f64;
        t
    } else {
        100.0
    }
}

/// Busy ticks of the whole machine (every state but idle and iowait).
fn machine_busy() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest is inside user).
    (v.len() >= 8).then(|| v[0] + v[1] + v[2] + v[5] + v[6] + v[7])
}

/// (ticks of user + system time, command name) of one process.
fn process_ticks(pid: u32) -> Option<(u64, String)> {
    parse_pid_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses `/proc/PID/stat`: the name sits in parentheses and may hold
/// spaces or parentheses itself, so fields are counted from the last ')'.
#[must_use]
pub fn parse_pid_stat(s: &str) -> Option<(u64, String)> {
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let name = s.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = s.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is the state (field 3); utime and stime are fields 14 and 15.
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((utime + stime, name))
}

fn all_processes() -> HashMap<u32, (u64, String)> {
    let mut m = HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                if let Some(t) = process_ticks(pid) {
                    m.insert(pid, t);
                }
            }
        }
    }
    m
}

/// CPU seconds of the children this process has reaped (all their threads),
/// or of this process itself.
fn rusage_s(who: libc::c_int) -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a zeroed rusage.
    if unsafe { libc::getrusage(who, &raw mut r) } != 0 {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss)]
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(r.ru_utime) + s(r.ru_stime)
}

fn load_avg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// The CPU quota of this process's cgroup in cores (cgroup v2 `cpu.max`,
/// v1 `cpu.cfs_quota_us` over `cpu.cfs_period_us`), where one is set.
#[must_use]
pub fn cpu_quota_cores() -> Option<f64> {
    static QUOTA: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *QUOTA.get_or_init(|| {
        let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
        quota_of(&groups, &mounts, |p| std::fs::read_to_string(p).ok())
    })
}

/// [`cpu_quota_cores`] from `/proc/self/cgroup` and `/proc/mounts`, with
/// `read` reading a cgroup file.
fn quota_of(groups: &str, mounts: &str, read: impl Fn(&str) -> Option<String>) -> Option<f64> {
    let mount = |v2: bool| {
        mounts.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).find_map(|f| match f.as_slice() {
            [_, dir, "cgroup2", ..] if v2 => Some((*dir).to_string()),
            [_, dir, "cgroup", opts, ..] if !v2 && opts.split(',').any(|o| o == "cpu") => Some((*dir).to_string()),
            _ => None,
        })
    };
    for line in groups.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        if controllers.split(',').any(|c| c == "cpu") {
            let dir = format!("{}{path}", mount(false)?);
            let quota: f64 = read(&format!("{dir}/cpu.cfs_quota_us"))?.trim().parse().ok()?;
            let period: f64 = read(&format!("{dir}/cpu.cfs_period_us"))?.trim().parse().ok()?;
            if quota > 0.0 && period > 0.0 {
                return Some(quota / period);
            }
        } else if controllers.is_empty() && path != "/" {
            if let Some(max) = mount(true).and_then(|m| read(&format!("{m}{path}/cpu.max"))) {
                let mut w = max.split_whitespace();
                if let (Some(Ok(q)), Some(Ok(p))) = (w.next().map(str::parse::<f64>), w.next().map(str::parse::<f64>)) {
                    return (p > 0.0).then_some(q / p);
                }
            }
        }
    }
    None
}

fn logical_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(1))
}

/// Accumulates what other processes use between readings. The machine's
/// busy time comes from `/proc/stat`; the measurement's own share is this
/// process (`getrusage(RUSAGE_SELF)`) and the worker: read from `/proc`
/// while it lives, and exactly, all threads included, from
/// `getrusage(RUSAGE_CHILDREN)` once it has been reaped.
struct Tally {
    worker: Option<u32>,
    /// Processes whose CPU is the measurement's too (RPC servers on this
    /// machine that the trial's layers run in).
    helpers: Vec<u32>,
    helpers_start: f64,
    /// CPU seconds the worker had used before the watch (a worker kept
    /// from an earlier trial).
    worker_start: f64,
    ticks_per_s: f64,
    started: Instant,
    busy_start: Option<u64>,
    self_start: f64,
    children_start: f64,
    last_at: Instant,
    last_busy: Option<u64>,
    last_own_s: f64,
    last_procs: HashMap<u32, (u64, String)>,
    peak_cores: f64,
    per_pid: HashMap<u32, (f64, String)>,
    load: Option<f64>,
}

impl Tally {
    fn new(worker: Option<u32>, helpers: Vec<u32>) -> Tally {
        let now = Instant::now();
        let procs = all_processes();
        let busy = machine_busy();
        let mut t = Tally {
            worker,
            helpers,
            helpers_start: 0.0,
            worker_start: 0.0,
            ticks_per_s: clock_ticks(),
            started: now,
            busy_start: busy,
            self_start: rusage_s(libc::RUSAGE_SELF),
            children_start: rusage_s(libc::RUSAGE_CHILDREN),
            last_at: now,
            last_busy: busy,
            last_own_s: 0.0,
            last_procs: HashMap::new(),
            peak_cores: 0.0,
            per_pid: HashMap::new(),
            load: load_avg(),
        };
        t.last_own_s = t.own_s(&procs).unwrap_or(0.0);
        t.helpers_start = t.helpers_s(&procs);
        t.worker_start = t.worker_s(&procs).unwrap_or(0.0);
        t.last_procs = procs;
        t
    }

    #[allow(clippy::cast_precision_loss)]
    fn helpers_s(&self, procs: &HashMap<u32, (u64, String)>) -> f64 {
        self.helpers.iter().filter_map(|h| procs.get(h)).map(|t| t.0 as f64 / self.ticks_per_s).sum()
    }

    /// CPU seconds the worker has used, while `/proc` shows it.
    #[allow(clippy::cast_precision_loss)]
    fn worker_s(&self, procs: &HashMap<u32, (u64, String)>) -> Option<f64> {
        self.worker.and_then(|w| procs.get(&w)).map(|t| t.0 as f64 / self.ticks_per_s)
    }

    /// CPU seconds the measurement itself has used: this process, and the
    /// worker while `/proc` still shows it (`None` once it is gone).
    fn own_s(&self, procs: &HashMap<u32, (u64, String)>) -> Option<f64> {
        let worker = match self.worker {
            #[allow(clippy::cast_precision_loss)]
            Some(w) => procs.get(&w).map(|t| t.0 as f64 / self.ticks_per_s)?,
            None => 0.0,
        };
        Some(rusage_s(libc::RUSAGE_SELF) + worker + self.helpers_s(procs))
    }

    #[allow(clippy::cast_precision_loss)]
    fn read(&mut self) {
        let now = Instant::now();
        let procs = all_processes();
        let busy = machine_busy();
        let dt = now.duration_since(self.last_at).as_secs_f64();
        let own = self.own_s(&procs);
        if let (Some(b0), Some(b1), Some(own)) = (self.last_busy, busy, own) {
            // Only while the worker is visible is this interval's own share known.
            if dt > 0.05 {
                let others = b1.saturating_sub(b0) as f64 / self.ticks_per_s - (own - self.last_own_s);
                self.peak_cores = self.peak_cores.max(others.max(0.0) / dt);
            }
            self.last_own_s = own;
        }
        let me = std::process::id();
        for (pid, (ticks, name)) in &procs {
            if *pid == me || Some(*pid) == self.worker || self.helpers.contains(pid) {
                continue;
            }
            // A process first seen now started since the last reading: all of its time is new.
            let before = self.last_procs.get(pid).map_or(0, |t| t.0);
            let d = ticks.saturating_sub(before);
            if d > 0 {
                let e = self.per_pid.entry(*pid).or_insert((0.0, name.clone()));
                e.0 += d as f64;
            }
        }
        self.load = match (self.load, load_avg()) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.last_at = now;
        self.last_busy = busy;
        self.last_procs = procs;
    }

    /// What others used over the whole watch. The worker's share: from
    /// `/proc` while it lives on (kept for the next trial), else exactly
    /// from `getrusage` once reaped, less what it had used before the watch.
    #[allow(clippy::cast_precision_loss)]
    fn finish(mut self, threshold_cores: f64) -> Option<Contention> {
        self.read();
        let busy_s = self.last_busy?.saturating_sub(self.busy_start?) as f64 / self.ticks_per_s;
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let reaped = rusage_s(libc::RUSAGE_CHILDREN) - self.children_start;
        let worker = match self.worker_s(&self.last_procs) {
            Some(now) => now - self.worker_start + reaped,
            None => reaped - self.worker_start,
        };
        let own_s = (rusage_s(libc::RUSAGE_SELF) - self.self_start)
            + worker
            + (self.helpers_s(&self.last_procs) - self.helpers_start);
        let cores = logical_cores();
        let mean = ((busy_s - own_s) / secs).max(0.0);
        // /proc/stat counts in clock ticks, sampled per CPU: over a short
        // trial a couple of ticks a CPU look like a lot of cores. Only what
        // lies beyond that resolution makes a trial contended.
        let resolution = 2.0 * f64::from(cores) / self.ticks_per_s / secs;
        let mut peak = self.peak_cores.max(mean);
        let mut mean = mean;
        // In a CPU quota (a container's limit, the rig's host), /proc/stat
        // counts more busy time than the throttled processes had (measured:
        // 2.1 s for 1.57 s of a process's own in a 0.3-core quota, none
        // without one): only time some process was given counts there.
        if cpu_quota_cores().is_some() {
            let attributed: f64 = self.per_pid.values().map(|(t, _)| t / self.ticks_per_s / secs).sum();
            mean = mean.min(attributed);
            peak = peak.min(attributed);
        }
        let mut top: Vec<BusyProcess> = self
            .per_pid
            .into_iter()
            .map(|(pid, (t, name))| BusyProcess { pid, name, cores: t / self.ticks_per_s / secs })
            .filter(|p| p.cores >= 0.01)
            .collect();
        top.sort_by(|a, b| b.cores.total_cmp(&a.cores));
        top.truncate(3);
        Some(Contention {
            others_cores_mean: mean,
            others_cores_peak: peak,
            others_share_mean: mean / f64::from(cores),
            others_share_peak: peak / f64::from(cores),
            logical_cores: cores,
            load_avg_1m: self.load,
            top,
            gpu_util_before_pct: None,
            gpu_others: Vec::new(),
            contended: mean - resolution > threshold_cores,
            threshold_cores,
            repeated: false,
            first_others_cores: None,
            quota_cores: cpu_quota_cores(),
        })
    }
}

type Stop = Arc<(Mutex<bool>, Condvar)>;

/// Watches the machine's CPU on its own thread while a trial runs.
pub struct Monitor {
    stop: Stop,
    handle: Option<JoinHandle<Tally>>,
}

impl Monitor {
    /// Starts watching; the CPU time of this process, of `worker` (a
    /// child, reaped before [`Monitor::stop`] or kept for the next trial) and of `helpers` (RPC
    /// servers on this machine) is the measurement's own.
    #[must_use]
    pub fn start(worker: Option<u32>, helpers: Vec<u32>) -> Monitor {
        let mut tally = Tally::new(worker, helpers);
        let stop: Stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop2 = Arc::clone(&stop);
        let handle = std::thread::spawn(move || {
            let (lock, cv) = &*stop2;
            loop {
                let Ok(guard) = lock.lock() else { break };
                let Ok((guard, _)) = cv.wait_timeout_while(guard, INTERVAL, |s| !*s) else { break };
                if *guard {
                    break;
                }
                drop(guard);
                tally.read();
            }
            tally
        });
        Monitor { stop, handle: Some(handle) }
    }

    /// Stops and says what others used; `None` where `/proc` cannot tell
    /// (not Linux).
    #[must_use]
    pub fn stop(mut self, threshold_cores: f64) -> Option<Contention> {
        self.signal();
        self.handle.take().and_then(|h| h.join().ok()).and_then(|t| t.finish(threshold_cores))
    }

    fn signal(&self) {
        let (lock, cv) = &*self.stop;
        if let Ok(mut g) = lock.lock() {
            *g = true;
        }
        cv.notify_all();
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.signal();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// What others use over `window`, measured now (this process excluded).
#[must_use]
pub fn others_now(window: Duration, threshold_cores: f64) -> Option<Contention> {
    let m = Monitor::start(None, Vec::new());
    std::thread::sleep(window);
    m.stop(threshold_cores)
}

/// The processes of this machine listening on these TCP ports (an RPC
/// server given as `127.0.0.1:50052` is one): `/proc/net/tcp{,6}` gives the
/// listening sockets' inodes, `/proc/PID/fd` who holds them.
#[must_use]
pub fn listening_pids(ports: &[u16]) -> Vec<u32> {
    let mut inodes = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(f) else { continue };
        for line in text.lines().skip(1) {
            let v: Vec<&str> = line.split_whitespace().collect();
            let port = v.get(1).and_then(|a| a.rsplit_once(':')).and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if v.get(3) == Some(&"0A") && port.is_some_and(|p| ports.contains(&p)) {
                inodes.extend(v.get(9).map(|i| format!("socket:[{i}]")));
            }
        }
    }
    let mut pids = Vec::new();
    if inodes.is_empty() {
        return pids;
    }
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let fds = std::fs::read_dir(e.path().join("fd")).into_iter().flatten().flatten();
        if fds
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()))
        {
            pids.push(pid);
        }
    }
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_cpu_quota_is_read_from_v1_and_v2() {
        let mounts =
            "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
        let files = |p: &str| match p {
            "/sys/fs/cgroup/cpu/rig/cpu.cfs_quota_us" => Some("3000\n".to_string()),
            "/sys/fs/cgroup/cpu/rig/cpu.cfs_period_us" => Some("10000\n".to_string()),
            "/sys/fs/cgroup/cpu/free/cpu.cfs_quota_us" => Some("-1\n".to_string()),
            "/sys/fs/cgroup/cpu/free/cpu.cfs_period_us" => Some("100000\n".to_string()),
            "/sys/fs/cgroup/unified/box/cpu.max" => Some("150000 100000\n".to_string()),
            "/sys/fs/cgroup/unified/open/cpu.max" => Some("max 100000\n".to_string()),
            _ => None,
        };
        let q = |groups: &str| quota_of(groups, mounts, files);
        assert_eq!(q("2:cpuacct:/\n1:cpu:/rig\n0::/\n"), Some(0.3));
        assert_eq!(q("1:cpu:/free\n0::/\n"), None, "no quota: -1");
        assert_eq!(q("0::/box\n"), Some(1.5));
        assert_eq!(q("0::/open\n"), None, "max: no quota");
        assert_eq!(q("0::/\n"), None);
    }

    #[test]
    fn proc_stat_names_with_spaces_and_parentheses() {
        let s = "1234 (tmux: server (x)) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_pid_stat(s), Some((300, "tmux: server (x)".to_string())));
        assert_eq!(parse_pid_stat("garbage"), None);
    }

    #[test]
    fn a_busy_child_process_is_seen_and_named() {
        // A child spinning for the whole window is another process: it shows.
        let mut child = std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap();
        let seen = others_now(Duration::from_millis(800), 0.1).expect("Linux has /proc");
        let _ = child.kill();
        let _ = child.wait();
        assert!(seen.others_cores_mean > 0.5, "{seen:?}");
        assert!(seen.contended);
        // Among the three busiest, not necessarily first: a compiler or
        // another test's process can outspin it on a loaded machine.
        let it = seen.top.iter().find(|p| p.pid == child.id()).unwrap_or_else(|| panic!("{seen:?}"));
        assert_eq!(it.name, "sh");
        assert!(seen.top_words().contains(&format!("sh (pid {}) ", child.id())), "{}", seen.top_words());
    }

    #[test]
    fn the_process_listening_on_a_port_is_found() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(listening_pids(&[port]), [std::process::id()]);
        drop(l);
        assert!(listening_pids(&[port]).is_empty());
    }
}
