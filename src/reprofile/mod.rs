//! Nightly re-profiling: decide which of this machine's profiles are stale
//! and why, re-tune them with their original settings, test the new
//! measurements against the old for drift, and report in words or JSON.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use crate::clock::human_age;
use crate::model::sha256_prefix;
use crate::profile::store;
use crate::profile::{Profile, Tool};
use crate::types::Hardware;

/// Significance level for drift: a change must be both this unlikely under
/// "no change" and larger than the threshold.
pub const ALPHA: f64 = 0.05;

/// Why a profile no longer describes this machine, in words.
#[must_use]
pub fn hardware_changes(old: &Hardware, new: &Hardware) -> Vec<String> {
    let mut v = Vec::new();
    let n = old.gpus.len().max(new.gpus.len());
    for i in 0..n {
        match (old.gpus.get(i), new.gpus.get(i)) {
            (Some(a), Some(b)) => {
                if a.name != b.name {
                    v.push(format!("GPU {i}: {} → {}", a.name, b.name));
                }
                if a.driver_version != b.driver_version {
                    v.push(format!(
                        "GPU {i} driver {} → {}",
                        a.driver_version.as_deref().unwrap_or("?"),
                        b.driver_version.as_deref().unwrap_or("?")
                    ));
                }
                if a.memory_total != b.memory_total {
                    v.push(format!("GPU {i} memory {:?} → {:?} bytes", a.memory_total, b.memory_total));
                }
            }
            (Some(a), None) => {
                v.push(format!("GPU {i} ({}, driver {}) is gone", a.name, a.driver_version.as_deref().unwrap_or("?")))
            }
            (None, Some(b)) => v.push(format!("new GPU {i}: {}", b.name)),
            (None, None) => {}
        }
    }
    let devs = |h: &Hardware| -> Vec<String> {
        h.llama_devices
            .iter()
            .filter(|d| d.is_offload_target())
            .map(|d| format!("{} {}", d.name, d.description))
            .collect()
    };
    if devs(old) != devs(new) {
        v.push(format!("llama.cpp devices [{}] → [{}]", devs(old).join(", "), devs(new).join(", ")));
    }
    if old.cpu != new.cpu {
        v.push(format!("CPU {} → {}", old.cpu.brand, new.cpu.brand));
    }
    if (old.ram.total + (1 << 29)) >> 30 != (new.ram.total + (1 << 29)) >> 30 {
        v.push(format!(
            "RAM {} → {}",
            crate::model::human_bytes(old.ram.total),
            crate::model::human_bytes(new.ram.total)
        ));
    }
    if old.llama_cpp_revision != new.llama_cpp_revision {
        v.push(format!("llama.cpp {} → {}", old.llama_cpp_revision, new.llama_cpp_revision));
    }
    if old.backends != new.backends {
        v.push(format!("backends {} → {}", old.backends.join(","), new.backends.join(",")));
    }
    for o in &old.rpc_servers {
        match new.rpc_servers.iter().find(|n| n.endpoint == o.endpoint) {
            None => v.push(format!("RPC server {} is no longer used", o.endpoint)),
            Some(n) if n.protocol != o.protocol => {
                v.push(format!("RPC server {} protocol {} → {}", o.endpoint, o.protocol, n.protocol));
            }
            Some(n) => {
                let mem =
                    |r: &crate::types::RpcServer| -> Vec<u64> { r.devices.iter().map(|d| d.memory_total).collect() };
                if mem(o) != mem(n) {
                    v.push(format!(
                        "RPC server {} devices changed: memory {:?} → {:?} bytes",
                        o.endpoint,
                        mem(o),
                        mem(n)
                    ));
                }
            }
        }
    }
    if v.is_empty() && old.fingerprint != new.fingerprint {
        v.push(format!("hardware fingerprint {} → {}", old.fingerprint, new.fingerprint));
    }
    v
}

/// What is wrong with the model file a profile was made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelState {
    Same,
    Changed(String),
    Gone,
}

/// Compares the model file with the profile's record: size and mtime first
/// (cheap), the sha256 of the first 16 MiB only when those moved.
#[must_use]
pub fn model_state(p: &Profile) -> ModelState {
    let Ok(md) = std::fs::metadata(&p.model.path) else { return ModelState::Gone };
    let mtime =
        md.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
    if md.len() == p.model.file_size && mtime == p.model.mtime {
        return ModelState::Same;
    }
    match sha256_prefix(&p.model.path, crate::model::ID_PREFIX_BYTES) {
        Ok(h) if h != p.model.sha256_16m => ModelState::Changed("model file changed (its first 16 MiB differ)".into()),
        Ok(_) if md.len() != p.model.file_size => {
            ModelState::Changed(format!("model file size {} → {} bytes", p.model.file_size, md.len()))
        }
        Ok(_) => ModelState::Same,
        Err(_) => ModelState::Gone,
    }
}

/// Every reason a profile is stale; empty when it is fresh.
#[must_use]
pub fn stale_reasons(p: &Profile, hw: &Hardware, now: u64, max_age: Duration) -> Vec<String> {
    let mut r = Vec::new();
    if p.fingerprint != hw.fingerprint {
        r.extend(hardware_changes(&p.hardware, hw));
    }
    let tool = Tool::this();
    if p.tool.version != tool.version {
        r.push(format!("ngl-tune {} → {}", p.tool.version, tool.version));
    }
    if p.tool.llama_cpp_revision != tool.llama_cpp_revision && !r.iter().any(|x| x.starts_with("llama.cpp")) {
        r.push(format!("llama.cpp {} → {}", p.tool.llama_cpp_revision, tool.llama_cpp_revision));
    }
    if let ModelState::Changed(why) = model_state(p) {
        r.push(why);
    }
    let age = crate::clock::parse_rfc3339(&p.created_at).map_or(u64::MAX, |t| now.saturating_sub(t));
    if age > max_age.as_secs() || max_age.is_zero() {
        r.push(format!("{} old (max age {})", human_age(age), human_age(max_age.as_secs())));
    }
    r
}

mod drift;
use drift::settle;
pub use drift::{drift, holm, Comparison, Drift, SETTLE_REPETITIONS, SETTLE_ROUNDS};
#[cfg(test)]
use drift::{judge_again, key};

/// What became of one profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryStatus {
    /// Younger than --max-age, same machine fingerprint: left alone.
    Fresh,
    /// Would be re-tuned (dry run).
    Stale,
    Retuned,
    ModelMissing,
    Invalid,
    Failed,
}

/// What happened to one profile.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    pub profile: PathBuf,
    pub model: String,
    pub model_path: PathBuf,
    pub status: EntryStatus,
    pub reasons: Vec<String>,
    pub drift: Option<Drift>,
    pub error: Option<String>,
    pub updated_modelfiles: Vec<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub machine_id: String,
    pub store: PathBuf,
    pub fingerprint: String,
    pub dry_run: bool,
    pub entries: Vec<Entry>,
    pub retuned: usize,
    pub fresh: usize,
    pub missing: usize,
    pub invalid: usize,
    pub failed: usize,
    pub regressions: usize,
    pub improvements: usize,
    pub recommendations_changed: usize,
    /// Comparisons not judged because the machine was busy during a trial.
    pub contended: usize,
    /// Changes past the threshold that stayed unclear after measuring again.
    pub inconclusive: usize,
    /// The machine was still busy when `--wait-idle` ran out, in words.
    pub busy_at_start: Option<String>,
    /// 0 nothing regressed, 3 a regression, 1 a re-tune failed.
    pub exit_code: i32,
}

#[derive(Debug, Clone)]
pub struct ReprofileOptions {
    pub store: PathBuf,
    pub max_age: Duration,
    pub dry_run: bool,
    pub threshold: f64,
    pub update_modelfiles: Option<PathBuf>,
    /// Wait up to this long for an idle machine before re-tuning.
    pub wait_idle: Duration,
    /// Share of the tuning's threads others may use for the machine to count as idle.
    pub busy_threshold: f64,
    pub verbose: bool,
    pub progress: bool,
}

/// Modelfiles in `dir` whose FROM names `model` (relative FROMs are taken
/// from the Modelfile's directory).
#[must_use]
pub fn modelfiles_for(dir: &Path, model: &Path) -> Vec<PathBuf> {
    let target = std::fs::canonicalize(model).unwrap_or_else(|_| model.to_path_buf());
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    let mut files: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect();
    files.sort();
    for f in files {
        if f.extension().is_some_and(|e| e == "bak") {
            continue;
        }
        // Only Modelfiles Ollama would read; anything else in the directory is not ours to judge.
        let Ok(cmds) = crate::consumer::ollama::modelfile::read(&f) else { continue };
        let from = cmds.iter().find(|c| c.name == "model" && !c.parameter).map(|c| c.args.clone());
        let Some(from) = from else { continue };
        let p = Path::new(&from);
        let p = if p.is_absolute() { p.to_path_buf() } else { f.parent().unwrap_or(Path::new(".")).join(p) };
        if std::fs::canonicalize(&p).is_ok_and(|c| c == target) {
            out.push(f);
        }
    }
    out
}

/// Runs the nightly job over this machine's profiles.
///
/// # Errors
/// When the store cannot be listed or devices cannot be probed; a failed
/// re-tune is an entry, not an error.
pub fn reprofile(opts: &ReprofileOptions, say: &mut dyn FnMut(&str)) -> Result<Summary> {
    let exe = crate::engine::child::current_exe()?;
    let hw = crate::probe::hardware(crate::engine::child::devices(&exe, &[])?);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let files = store::profile_files(&opts.store.join(&hw.machine_id));
    say(&format!("reprofile: {} profiles of machine {} in {}", files.len(), hw.machine_id, opts.store.display()));
    // Waited for once, before the first re-tune: fresh profiles cost nothing.
    let mut busy_at_start: Option<Option<String>> = None;
    let mut entries = Vec::new();
    for path in files {
        entries.push(one(&path, &hw, now, opts, say, &mut busy_at_start)?);
    }
    Ok(summarize(entries, opts, &hw, busy_at_start.flatten()))
}

/// This machine with the devices of `rpc`'s servers.
///
/// # Errors
/// A server that does not answer (named).
pub fn hardware_with_rpc(rpc: &[String]) -> Result<Hardware> {
    let servers = crate::rpc::probe_all(rpc)?;
    let exe = crate::engine::child::current_exe()?;
    let mut hw = crate::probe::hardware(crate::engine::child::devices(&exe, rpc)?);
    hw.rpc_servers = servers;
    hw.fingerprint = crate::probe::fingerprint(&hw);
    Ok(hw)
}

fn entry(path: &Path, old: Option<&Profile>, status: EntryStatus, reasons: Vec<String>) -> Entry {
    Entry {
        profile: path.to_path_buf(),
        model: old.map(|p| p.model.file_name.clone()).unwrap_or_default(),
        model_path: old.map(|p| p.model.path.clone()).unwrap_or_default(),
        status,
        reasons,
        drift: None,
        error: None,
        updated_modelfiles: Vec::new(),
    }
}

/// What happens to one profile: skipped (invalid, another machine's, model
/// gone, fresh), listed (dry run), or re-tuned and compared.
fn one(
    path: &Path,
    hw: &Hardware,
    now: u64,
    opts: &ReprofileOptions,
    say: &mut dyn FnMut(&str),
    busy_at_start: &mut Option<Option<String>>,
) -> Result<Entry> {
    let old = match store::read_profile(path) {
        Ok(p) => p,
        Err(e) => {
            say(&format!("  invalid  {e:#}; skipped (left as it is)"));
            return Ok(entry(path, None, EntryStatus::Invalid, vec![format!("{e:#}")]));
        }
    };
    if old.machine_id != hw.machine_id {
        let why = format!("made on machine {}, not this one ({}); left alone", old.machine_id, hw.machine_id);
        say(&format!("  invalid  {}: {why}", path.display()));
        return Ok(entry(path, Some(&old), EntryStatus::Invalid, vec![why]));
    }
    if model_state(&old) == ModelState::Gone {
        let why = format!("model file {} is gone", old.model.path.display());
        say(&format!("  missing  {}: {why}; skipped", old.model.file_name));
        return Ok(entry(path, Some(&old), EntryStatus::ModelMissing, vec![why]));
    }
    // A profile tuned with RPC servers is judged with their devices.
    let with_rpc;
    let hw = if old.settings.backend.rpc.is_empty() {
        hw
    } else {
        match hardware_with_rpc(&old.settings.backend.rpc) {
            Ok(h) => {
                with_rpc = h;
                &with_rpc
            }
            Err(err) => {
                say(&format!("  failed   {}: {err:#}", old.model.file_name));
                let mut e = entry(path, Some(&old), EntryStatus::Failed, vec![format!("{err:#}")]);
                e.error = Some(format!("{err:#}"));
                return Ok(e);
            }
        }
    };
    let reasons = stale_reasons(&old, hw, now, opts.max_age);
    if reasons.is_empty() {
        let age = crate::clock::parse_rfc3339(&old.created_at).map_or(u64::MAX, |t| now.saturating_sub(t));
        say(&format!("  fresh    {} ({} old): skipped", old.model.file_name, human_age(age)));
        return Ok(entry(path, Some(&old), EntryStatus::Fresh, reasons));
    }
    if opts.dry_run {
        say(&format!("  stale    {}: {}; would re-tune", old.model.file_name, reasons.join("; ")));
        return Ok(entry(path, Some(&old), EntryStatus::Stale, reasons));
    }
    if busy_at_start.is_none() {
        let cores = opts.busy_threshold * f64::from(crate::bench::default_threads());
        *busy_at_start = Some(wait_for_idle(opts.wait_idle, cores, say)?);
    }
    say(&format!("  stale    {}: {}; re-tuning", old.model.file_name, reasons.join("; ")));
    let mut e = entry(path, Some(&old), EntryStatus::Retuned, reasons);
    match retune(&old, opts) {
        Ok(new) => {
            let mut d = drift(&old, &new, opts.threshold);
            settle(&mut d, &old, &new, opts, say)?;
            say_drift(&d, opts.threshold, say);
            if d.recommendation_changed.is_some() || d.threads_changed.is_some() {
                if let Some(dir) = &opts.update_modelfiles {
                    e.updated_modelfiles = update_modelfiles(dir, &new, say);
                }
            }
            e.drift = Some(d);
        }
        Err(err) if err.is::<crate::error::Interrupted>() => return Err(err),
        Err(err) => {
            say(&format!("           re-tune FAILED: {err:#}"));
            e.status = EntryStatus::Failed;
            e.error = Some(format!("{err:#}"));
        }
    }
    Ok(e)
}

fn say_drift(d: &Drift, threshold: f64, say: &mut dyn FnMut(&str)) {
    for c in d.comparisons.iter().filter(|c| c.verdict != "same" && c.verdict != "contended") {
        let again =
            if c.remeasured > 0 { format!(", {} repetitions measured again", c.remeasured) } else { String::new() };
        let ctx = c.n_ctx.map_or(String::new(), |n| format!(" -c {n}"));
        let extra = if c.placement.is_empty() { String::new() } else { format!(" ({})", c.placement) };
        // A draft's comparison is its paired ratio, judged by its intervals.
        let (x, unit, p) = if c.test == drift::DRAFT_TEST {
            ("x", "", "95% intervals".to_string())
        } else {
            ("", " t/s", format!("p {}", c.p_value.map_or("n/a".into(), |p| format!("{p:.3}"))))
        };
        say(&format!(
            "           {} {} at ngl {} -t {}{ctx}{extra}: {x}{:.2} → {x}{:.2}{unit} ({:+.1}%, {p}{again})",
            c.verdict.to_uppercase(),
            c.test,
            c.n_gpu_layers,
            c.n_threads,
            c.old_ts,
            c.new_ts,
            c.change_pct,
        ));
    }
    if let Some((a, b)) = d.recommendation_changed {
        say(&format!("           recommendation changed: ngl {a} → ngl {b}"));
    }
    for (c, a, b) in &d.placements_changed {
        say(&format!("           at {c} context the flags changed: {a} → {b}"));
    }
    if d.contended > 0 {
        say(&format!("           {} comparisons not judged: the machine was busy during those trials", d.contended));
    }
    let unclear = d.comparisons.iter().filter(|c| c.verdict == "inconclusive").count();
    if d.regressions == 0 && d.improvements == 0 && unclear == 0 {
        say(&format!("           no drift beyond {:.0}% in {} comparisons", threshold * 100.0, d.comparisons.len()));
    }
}

fn update_modelfiles(dir: &Path, new: &Profile, say: &mut dyn FnMut(&str)) -> Vec<PathBuf> {
    let mut updated = Vec::new();
    for mf in modelfiles_for(dir, &new.model.path) {
        match crate::emit::modelfile::write(&mf, new) {
            Ok(_) => {
                say(&format!("           updated {}", mf.display()));
                updated.push(mf);
            }
            Err(e) => say(&format!("           could not update {}: {e:#}", mf.display())),
        }
    }
    updated
}

fn summarize(entries: Vec<Entry>, opts: &ReprofileOptions, hw: &Hardware, busy_at_start: Option<String>) -> Summary {
    let count = |s: EntryStatus| entries.iter().filter(|e| e.status == s).count();
    let drifts = || entries.iter().filter_map(|e| e.drift.as_ref());
    let regressions: usize = drifts().map(|d| d.regressions).sum();
    let failed = count(EntryStatus::Failed);
    let exit_code = if failed > 0 {
        crate::error::exit::FAILURE
    } else if regressions > 0 {
        crate::error::exit::REGRESSION
    } else {
        crate::error::exit::OK
    };
    Summary {
        machine_id: hw.machine_id.clone(),
        store: opts.store.clone(),
        fingerprint: hw.fingerprint.clone(),
        dry_run: opts.dry_run,
        retuned: count(EntryStatus::Retuned),
        fresh: count(EntryStatus::Fresh),
        missing: count(EntryStatus::ModelMissing),
        invalid: count(EntryStatus::Invalid),
        failed,
        regressions,
        improvements: drifts().map(|d| d.improvements).sum(),
        recommendations_changed: drifts().filter(|d| d.recommendation_changed.is_some()).count(),
        contended: drifts().map(|d| d.contended).sum(),
        inconclusive: drifts().map(|d| d.comparisons.iter().filter(|c| c.verdict == "inconclusive").count()).sum(),
        busy_at_start,
        entries,
        exit_code,
    }
}

/// Waits, up to `limit`, until other processes use at most `cores` of CPU
/// over a few seconds; returns what they used when it gave up, in words.
///
/// # Errors
/// An interrupt while waiting.
pub fn wait_for_idle(limit: Duration, cores: f64, say: &mut dyn FnMut(&str)) -> Result<Option<String>> {
    let started = std::time::Instant::now();
    let window = Duration::from_secs(2).min(limit.max(Duration::from_millis(500)));
    let mut said = false;
    loop {
        let Some(c) = crate::probe::cpu::others_now(window, cores) else { return Ok(None) };
        if !c.contended {
            if said {
                say(&format!("reprofile: the machine is idle now (others use {:.2} cores)", c.others_cores_mean));
            }
            return Ok(None);
        }
        let words = format!(
            "other processes use {:.2} of {} cores (more than {cores:.2}): {}",
            c.others_cores_mean,
            c.logical_cores,
            if c.top.is_empty() { "no single process stands out".to_string() } else { c.top_words() }
        );
        if started.elapsed() >= limit {
            say(&format!(
                "reprofile: the machine stayed busy for {}; re-tuning anyway, and trials measured while it is busy are not judged for drift ({words})",
                human_age(limit.as_secs())
            ));
            return Ok(Some(words));
        }
        if !said {
            say(&format!("reprofile: waiting up to {} for an idle machine: {words}", human_age(limit.as_secs())));
            said = true;
        }
        if crate::interrupt::requested().is_some() {
            anyhow::bail!(crate::error::Interrupted);
        }
    }
}

fn retune(old: &Profile, opts: &ReprofileOptions) -> Result<Profile> {
    let info = crate::model::inspect(&old.model.path)?;
    let mut settings = old.settings.clone();
    // Thread counts follow the machine (a new CPU has other cores): the
    // drift report says where the tuned count changed.
    settings.backend.n_threads =
        threads_now(old.settings.backend.n_threads, &old.hardware.cpu, crate::bench::tune_threads());
    // The same checks as the command line's: a model this llama.cpp cannot load is no re-tune.
    let machine = crate::tune::Machine::probe(&info, (&settings.backend, &settings.caps))?;
    let req = crate::tune::TuneRequest::new(info, settings, opts.store.clone(), machine)?
        .with_output(opts.verbose, opts.progress);
    Ok(crate::tune::tune(&req)?.profile)
}

/// The thread count a re-tune starts from: the machine's default now where
/// the stored count was the machine's default then (its physical cores:
/// what a tune without `-t` starts from), so a new CPU's cores are tuned
/// for; a count the user chose otherwise is kept.
#[must_use]
pub fn threads_now(asked: u32, then: &crate::types::CpuInfo, default_now: u32) -> u32 {
    if asked == 0 || asked == then.physical_cores.max(1) {
        default_now
    } else {
        asked
    }
}

#[cfg(test)]
mod tests;
