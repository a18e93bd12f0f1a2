//! The words of each note (`types::Note`): the tuner and the profile keep
//! the values, the report says them.

use std::fmt;

use crate::types::{Note, NoteKind, TrialResult};

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(c) = self.ctx {
            write!(f, "{c} context: ")?;
        }
        write!(f, "{}", self.kind)
    }
}

impl fmt::Display for NoteKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoteKind::Noisy { test, n_gpu_layers, n_threads, cv, avg_ts, stddev_ts } => write!(
                f,
                "noisy measurement: {test} at ngl {n_gpu_layers} -t {n_threads} varied by {:.0}% between repetitions ({avg_ts:.2} ± {stddev_ts:.2} t/s); something else was probably using the machine: re-run when it is idle, or with more repetitions (-r)",
                cv * 100.0
            ),
            NoteKind::Busy { trials, of, worst_cores, cores, top, gpu_busy_pct, gpu_pids } => {
                let who = if top.is_empty() {
                    "no single process stood out".to_string()
                } else {
                    let v: Vec<String> =
                        top.iter().map(|p| format!("{} (pid {}) {:.2} cores", p.name, p.pid, p.cores)).collect();
                    format!("most CPU: {}", v.join(", "))
                };
                let gpu = match gpu_busy_pct {
                    Some(u) if !gpu_pids.is_empty() => {
                        let pids: Vec<String> = gpu_pids.iter().map(ToString::to_string).collect();
                        format!("; the GPU was {u}% busy before trials, with pid {} on it", pids.join(", "))
                    }
                    _ => String::new(),
                };
                write!(
                    f,
                    "busy machine: {trials} of {of} trials ran while other processes used more CPU than the threshold (up to {worst_cores:.2} of {cores} cores), also when measured again after a pause; {who}{gpu}. Their speeds are lower than this machine gives when idle, so the recommendation's confidence is low: re-run when the machine is idle"
                )
            }
            NoteKind::Threads { n_threads, n_gpu_layers, free_cores, cores, others_cores, quota } => {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let fits = (free_cores.floor() as u32).max(1);
                if let Some(q) = quota {
                    return write!(
                        f,
                        "more threads than the CPU quota: -t {n_threads} at ngl {n_gpu_layers} ran in a quota of {q:.2} of a core (a cgroup's cpu.max; others used {others_cores:.1} of {cores} cores); llama.cpp's threads then wait on each other and every speed drops: in this quota use -t {fits}, or raise the quota"
                    );
                }
                write!(
                    f,
                    "more threads than free cores: -t {n_threads} at ngl {n_gpu_layers} had about {free_cores:.1} of {cores} cores to itself (others used {others_cores:.1}); llama.cpp's threads then wait on each other and every speed drops: on a shared machine use -t {fits}, or stop the other work"
                )
            }
            _ => f.write_str(self.text().unwrap_or_default()),
        }
    }
}

/// When trials were measured on a busy machine: how many, how busy, and
/// the processes that took the most CPU (name and pid, top 3).
#[must_use]
pub fn busy<'a>(results: impl IntoIterator<Item = &'a TrialResult>) -> Option<Note> {
    let all: Vec<&TrialResult> = results.into_iter().collect();
    let busy: Vec<&crate::types::Contention> =
        all.iter().filter(|r| r.contended()).filter_map(|r| r.contention.as_ref()).collect();
    if busy.is_empty() {
        return None;
    }
    let worst_cores = busy.iter().map(|c| c.others_cores_mean).fold(0.0, f64::max);
    let mut top: Vec<crate::types::BusyProcess> = Vec::new();
    for p in busy.iter().flat_map(|c| c.top.iter()) {
        match top.iter_mut().find(|t| t.pid == p.pid) {
            Some(t) => t.cores = t.cores.max(p.cores),
            None => top.push(p.clone()),
        }
    }
    top.sort_by(|a, b| b.cores.total_cmp(&a.cores));
    top.truncate(3);
    let gpu = busy
        .iter()
        .filter_map(|c| c.gpu_util_before_pct.filter(|_| !c.gpu_others.is_empty()).map(|u| (u, &c.gpu_others)))
        .max_by_key(|(u, _)| *u);
    Some(Note::new(NoteKind::Busy {
        trials: busy.len(),
        of: all.len(),
        worst_cores,
        cores: busy[0].logical_cores,
        top,
        gpu_busy_pct: gpu.map(|g| g.0),
        gpu_pids: gpu.map(|g| g.1.iter().map(|p| p.pid).collect()).unwrap_or_default(),
    }))
}

/// More threads than the cores a trial had: half a core short of what
/// others left, or, in a CPU quota, more than the quota rounded up (a
/// 0.3-core quota is one thread's).
fn over_threads(c: &crate::types::Contention, n_threads: u32) -> bool {
    let n = f64::from(n_threads);
    match c.binding_quota() {
        Some(q) => n > q.ceil().max(1.0),
        None => c.free_cores() + 0.5 < n,
    }
}

/// When a trial asked for more threads than there were free cores:
/// llama.cpp's threads then wait on each other.
#[must_use]
pub fn threads<'a>(results: impl IntoIterator<Item = &'a TrialResult>) -> Option<Note> {
    let (r, c) = results
        .into_iter()
        .filter_map(|r| r.contention.as_ref().map(|c| (r, c)))
        .filter(|(r, c)| over_threads(c, r.spec.placement.n_threads))
        .min_by(|a, b| a.1.free_cores().total_cmp(&b.1.free_cores()))?;
    Some(Note::new(NoteKind::Threads {
        n_threads: r.spec.placement.n_threads,
        n_gpu_layers: r.spec.placement.n_gpu_layers,
        free_cores: c.free_cores(),
        cores: c.logical_cores,
        others_cores: c.others_cores_mean,
        quota: c.binding_quota(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_over_a_cpu_quota_name_the_quota_not_other_processes() {
        let c: crate::types::Contention = serde_json::from_value(serde_json::json!({
            "others_cores_mean": 0.0, "others_cores_peak": 0.0, "others_share_mean": 0.0, "others_share_peak": 0.0,
            "logical_cores": 1, "load_avg_1m": null, "top": [], "contended": false, "threshold_cores": 0.5,
            "quota_cores": 0.3
        }))
        .unwrap();
        assert!((c.free_cores() - 0.3).abs() < 1e-9, "the quota bounds the free cores");
        let ok = crate::types::TrialStatus::Ok;
        let mut r = crate::types::TrialResult::failed(crate::engine::test_spec(), ok, String::new());
        r.spec.placement.n_threads = 2;
        r.contention = Some(c.clone());
        let words = threads([&r]).expect("-t 2 in 0.3 of a core").to_string();
        assert!(words.contains("ran in a quota of 0.30 of a core") && words.contains("use -t 1"), "{words}");
        r.spec.placement.n_threads = 1;
        assert!(threads([&r]).is_none(), "one thread is what a 0.3-core quota holds");
        r.spec.placement.n_threads = 2;
        // Without a quota, other processes are what took the cores.
        let mut busy = c;
        busy.quota_cores = None;
        busy.logical_cores = 4;
        busy.others_cores_mean = 3.5;
        r.contention = Some(busy);
        let words = threads([&r]).expect("-t 2 with half a core free").to_string();
        assert!(words.contains("others used 3.5") && !words.contains("quota"), "{words}");
    }

    #[test]
    fn a_note_from_a_smaller_context_says_its_context_and_stays_a_warning() {
        let noisy = Note::new(NoteKind::Noisy {
            test: "tg128".into(),
            n_gpu_layers: 7,
            n_threads: 2,
            cv: 0.25,
            avg_ts: 10.0,
            stddev_ts: 2.5,
        })
        .at(4096);
        assert!(noisy.is_warning());
        let words = noisy.to_string();
        assert!(words.starts_with("4096 context: noisy measurement: tg128 at ngl 7 -t 2 varied by 25%"), "{words}");
        assert!(!Note::search("adaptive search stopped").at(4096).is_warning());
    }

    #[test]
    fn notes_read_back_typed_and_old_string_notes_as_text() {
        let n = Note::hatch("escape hatch at 32768 context: q8_0").at(32768);
        let back: Note = serde_json::from_str(&serde_json::to_string(&n).unwrap()).unwrap();
        assert_eq!(back, n);
        let old: Note = serde_json::from_str("\"noisy measurement: something\"").unwrap();
        assert_eq!(old.kind, NoteKind::Text { text: "noisy measurement: something".into() });
        assert!(!old.is_warning(), "words alone do not make a warning");
    }
}
