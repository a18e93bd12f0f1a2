//! The profile store on disk: where profiles live, atomic writes (temp file,
//! fsync, rename, fsync of the directory), checkpoints.
//!
//! Layout: `<store>/<machine id>/<model stem>-<model id>.json`, and beside it
//! `<model stem>-<model id>.checkpoint.json` while a tuning is unfinished.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::{Checkpoint, ModelIdentity, Profile, SCHEMA_VERSION};
use crate::error::bad;
use crate::fsio::atomic_write;

/// The store directory: `--profiles`, else `NGL_TUNE_PROFILES` (clap reads
/// it), else `$XDG_DATA_HOME/ngl-tune/profiles`, else
/// `~/.local/share/ngl-tune/profiles`.
#[must_use]
pub fn default_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("ngl-tune/profiles");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".local/share/ngl-tune/profiles")
}

/// The store given on the command line, else [`default_dir`].
#[must_use]
pub fn dir_or_default(given: Option<&Path>) -> PathBuf {
    given.map_or_else(default_dir, Path::to_path_buf)
}

/// Checks that a store path is usable (a directory, or absent).
///
/// # Errors
/// `BadInput` when it names a file.
pub fn check_dir(dir: &Path) -> Result<()> {
    crate::fsio::check_dir_arg(dir, "--profiles", "the profile store")
}

fn stem(model: &ModelIdentity) -> String {
    let s = model.file_name.strip_suffix(".gguf").unwrap_or(&model.file_name);
    s.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect()
}

#[must_use]
pub fn profile_path(store: &Path, machine: &str, model: &ModelIdentity) -> PathBuf {
    store.join(machine).join(format!("{}-{}.json", stem(model), model.id()))
}

#[must_use]
pub fn checkpoint_path(store: &Path, machine: &str, model: &ModelIdentity) -> PathBuf {
    store.join(machine).join(format!("{}-{}.checkpoint.json", stem(model), model.id()))
}

/// Writes a profile atomically.
///
/// # Errors
/// As [`atomic_write`].
pub fn write_profile(path: &Path, p: &Profile) -> Result<()> {
    let mut json = serde_json::to_vec_pretty(p)?;
    json.push(b'\n');
    atomic_write(path, &json)
}

/// Reads a profile, naming the file and the problem when it is not one.
///
/// # Errors
/// `BadInput` for a file that is not a profile this version reads.
pub fn read_profile(path: &Path) -> Result<Profile> {
    let bytes = crate::fsio::read_regular(path, crate::fsio::MAX_PROFILE_BYTES, "pass an ngl-tune profile (.json)")?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| bad(format!("{} is not JSON ({e}); it is not an ngl-tune profile", path.display())))?;
    match v.get("schema_version").and_then(serde_json::Value::as_u64) {
        Some(n) if (1..=u64::from(SCHEMA_VERSION)).contains(&n) => {}
        Some(n) => {
            return Err(bad(format!(
                "{} has schema_version {n}; this ngl-tune reads versions 1 to {SCHEMA_VERSION}: use a matching ngl-tune or re-tune",
                path.display()
            )))
        }
        None => return Err(bad(format!("{} has no schema_version; it is not an ngl-tune profile", path.display()))),
    }
    serde_json::from_value(v)
        .map_err(|e| bad(format!("{} is not a complete profile ({e}); re-tune to replace it", path.display())))
}

/// Saves the checkpoint after a trial.
///
/// # Errors
/// As [`atomic_write`].
pub fn write_checkpoint(path: &Path, c: &Checkpoint) -> Result<()> {
    atomic_write(path, &serde_json::to_vec_pretty(c)?)
}

/// Loads a checkpoint, if there is a readable one.
#[must_use]
pub fn read_checkpoint(path: &Path) -> Option<Checkpoint> {
    let bytes = crate::fsio::read_regular(path, crate::fsio::MAX_PROFILE_BYTES, "").ok()?;
    let c: Checkpoint = serde_json::from_slice(&bytes).ok()?;
    (c.schema_version == SCHEMA_VERSION && c.kind == "checkpoint").then_some(c)
}

/// Where replaced versions of a profile are kept:
/// `<store>/<machine>/history/<model stem>-<model id>/<created_at>.json`.
#[must_use]
pub fn history_dir(store: &Path, machine: &str, model: &ModelIdentity) -> PathBuf {
    store.join(machine).join("history").join(format!("{}-{}", stem(model), model.id()))
}

/// Copies the profile at `current` into its history directory before it is
/// replaced, named by its creation time.
///
/// # Errors
/// Write errors (the caller then does not replace the profile).
pub fn archive(current: &Path, history: &Path) -> Result<Option<PathBuf>> {
    let Ok(bytes) = crate::fsio::read_regular(current, crate::fsio::MAX_PROFILE_BYTES, "") else { return Ok(None) };
    let created = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("created_at").and_then(serde_json::Value::as_str).map(str::to_string))
        .unwrap_or_else(|| "unknown-time".to_string());
    let base = created.replace(':', "-");
    let mut dest = history.join(format!("{base}.json"));
    let mut n = 1;
    while dest.exists() {
        n += 1;
        dest = history.join(format!("{base}.{n}.json"));
    }
    atomic_write(&dest, &bytes)?;
    Ok(Some(dest))
}

/// Stores a finished profile at its place in `store`, keeping the version
/// it replaces in the history. A profile is never lost: when the store
/// cannot take it, it is written to the temp directory (or, failing that,
/// printed) and the error says where.
///
/// # Errors
/// The store's write error, with where the profile went instead.
pub fn save(store: &Path, profile: &Profile) -> Result<PathBuf> {
    let path = profile_path(store, &profile.machine_id, &profile.model);
    // Keep the version being replaced: history is what re-profiling compares against.
    let archived = archive(&path, &history_dir(store, &profile.machine_id, &profile.model));
    let Err(e) = archived.and_then(|_| write_profile(&path, profile)) else { return Ok(path) };
    let fallback = std::env::temp_dir().join(format!(
        "ngl-tune-{}-{}-{}.json",
        profile.model.file_name.trim_end_matches(".gguf"),
        profile.model.id(),
        std::process::id()
    ));
    let saved = match write_profile(&fallback, profile) {
        Ok(()) => format!("this run's profile was saved to {}", fallback.display()),
        Err(_) => {
            let _ = writeln!(std::io::stdout().lock(), "{}", serde_json::to_string_pretty(profile)?);
            "this run's profile is printed above".to_string()
        }
    };
    Err(e.context(format!("the tuning finished but its profile could not be stored; {saved}")))
}

/// Every profile file of one machine directory (not checkpoints, history or
/// temporary files), sorted.
#[must_use]
pub fn profile_files(machine_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(machine_dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    let n = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    p.is_file() && n.ends_with(".json") && !n.ends_with(".checkpoint.json") && !n.starts_with('.')
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Machine directories of a store, sorted.
#[must_use]
pub fn machines(store: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(store)
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The profile file for a model (this machine's, in the store) or a profile path.
///
/// # Errors
/// `BadInput` when the path is not a regular file, or there is no profile of the model.
pub fn resolve(source: &Path, store: Option<&Path>) -> Result<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 4];
    let is_gguf = crate::fsio::open_regular(source, "pass a profile (.json) or a model (.gguf)")?
        .read_exact(&mut head)
        .is_ok_and(|()| &head == crate::gguf::MAGIC);
    if !is_gguf {
        return Ok(source.to_path_buf());
    }
    let info = crate::model::inspect(source)?;
    let identity = crate::profile::ModelIdentity::of(&info);
    let dir = dir_or_default(store);
    let path = profile_path(&dir, &crate::probe::machine_id(), &identity);
    if !path.exists() {
        return Err(bad(format!(
            "no profile of {} for this machine in {}; tune it first: ngl-tune {}",
            info.file_name,
            dir.display(),
            source.display()
        )));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_names_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.json");
        std::fs::write(&p, "not json").unwrap();
        assert!(read_profile(&p).unwrap_err().to_string().contains("is not JSON"));
        std::fs::write(&p, r#"{"schema_version": 99}"#).unwrap();
        assert!(read_profile(&p).unwrap_err().to_string().contains("schema_version 99"));
        std::fs::write(&p, r#"{"schema_version": 1}"#).unwrap();
        assert!(read_profile(&p).unwrap_err().to_string().contains("not a complete profile"));
        std::fs::write(&p, r#"{"x": 1}"#).unwrap();
        assert!(read_profile(&p).unwrap_err().to_string().contains("no schema_version"));
    }
}
