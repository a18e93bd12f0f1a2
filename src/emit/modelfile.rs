//! Ollama Modelfiles: a fresh one from a profile, and an in-place update that
//! changes only the PARAMETER lines ngl-tune owns (num_gpu, num_thread,
//! num_ctx) and keeps every other byte.

use std::path::Path;

use anyhow::Result;

use crate::error::bad;
use crate::profile::store::atomic_write;
use crate::profile::Profile;

/// The PARAMETER names ngl-tune sets. Ollama's name for GPU layers is
/// `num_gpu` (`num_gpu_layers` does not exist there).
pub const OWNED: [&str; 3] = ["num_gpu", "num_thread", "num_ctx"];

/// The owned parameters and their values from a profile, in Modelfile order.
#[must_use]
pub fn params(p: &Profile) -> Vec<(&'static str, u32)> {
    let r = &p.recommendation;
    vec![("num_gpu", r.ollama_num_gpu.unwrap_or(r.n_gpu_layers)), ("num_thread", r.n_threads), ("num_ctx", r.n_ctx)]
}

/// A complete Modelfile for the profile's model.
#[must_use]
pub fn render(p: &Profile) -> String {
    let mut s = format!(
        "# ngl-tune {} on {} (fingerprint {}), {}\nFROM {}\n",
        p.tool.version,
        p.machine_id,
        p.fingerprint,
        p.created_at,
        p.model.path.display()
    );
    if p.recommendation.n_cpu_moe > 0 {
        s.push_str(&format!(
            "# llama.cpp is faster with -ngl {} --n-cpu-moe {}; Ollama has no expert offload, so num_gpu is the best whole-layer split\n",
            p.recommendation.n_gpu_layers, p.recommendation.n_cpu_moe
        ));
    }
    for (k, v) in params(p) {
        s.push_str(&format!("PARAMETER {k} {v}\n"));
    }
    s
}

/// Counts `"""` in a line: an odd count opens or closes a multi-line value
/// (TEMPLATE, SYSTEM, MESSAGE), inside which nothing is an instruction.
fn toggles_block(line: &str) -> bool {
    line.matches("\"\"\"").count() % 2 == 1
}

/// Splits `PARAMETER name value` into (keyword+name prefix, name) when the
/// line is one; the prefix keeps the original spelling and spacing.
fn parameter(line: &str) -> Option<(usize, String)> {
    let body = line.trim_start();
    let indent = line.len() - body.len();
    let kw = body.get(..9)?;
    if !kw.eq_ignore_ascii_case("parameter") {
        return None;
    }
    let rest = &body[9..];
    let after_kw = rest.len() - rest.trim_start().len();
    if after_kw == 0 {
        return None;
    }
    let rest = rest.trim_start();
    let name_len = rest.find(char::is_whitespace).unwrap_or(rest.len());
    let name = rest[..name_len].to_ascii_lowercase();
    let tail = &rest[name_len..];
    let gap = tail.len() - tail.trim_start_matches([' ', '\t']).len();
    Some((indent + 9 + after_kw + name_len + gap, name))
}

/// Rewrites the owned PARAMETER lines of `old` to `values`, adding any that
/// are missing after the last PARAMETER (or the FROM) line. Every other byte
/// is kept, line endings included.
#[must_use]
pub fn update(old: &str, values: &[(&str, u32)]) -> String {
    let eol = if old.contains("\r\n") { "\r\n" } else { "\n" };
    let mut out: Vec<String> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    let mut in_block = false;
    let mut last_param: Option<usize> = None;
    let mut from_line: Option<usize> = None;
    for line in old.split_inclusive('\n') {
        let (content, ending) = match line.strip_suffix("\r\n") {
            Some(c) => (c, "\r\n"),
            None => line.strip_suffix('\n').map_or((line, ""), |c| (c, "\n")),
        };
        let mut replaced = None;
        if !in_block {
            if let Some((prefix_len, name)) = parameter(content) {
                if let Some((k, v)) = values.iter().find(|(k, _)| *k == name) {
                    replaced = Some(format!("{}{v}{ending}", &content[..prefix_len]));
                    seen.push(k);
                }
                last_param = Some(out.len());
            } else if content.trim_start().get(..4).is_some_and(|k| k.eq_ignore_ascii_case("from"))
                && content.trim_start()[4..].starts_with([' ', '\t'])
            {
                from_line = Some(out.len());
            }
        }
        if toggles_block(content) {
            in_block = !in_block;
        }
        out.push(replaced.unwrap_or_else(|| line.to_string()));
    }
    let missing: Vec<String> =
        values.iter().filter(|(k, _)| !seen.contains(k)).map(|(k, v)| format!("PARAMETER {k} {v}{eol}")).collect();
    if !missing.is_empty() {
        let at = last_param.or(from_line).map_or(out.len(), |i| i + 1);
        // The line we insert after may lack a final newline.
        if at > 0 && !out[at - 1].ends_with('\n') {
            out[at - 1].push_str(eol);
        }
        for (i, l) in missing.into_iter().enumerate() {
            out.insert(at + i, l);
        }
    }
    out.concat()
}

/// What `--write-modelfile` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    Created,
    Updated,
    Unchanged,
}

/// Creates or updates a Modelfile in place, atomically, keeping the previous
/// version as `PATH.bak`.
///
/// # Errors
/// `BadInput` for a path that is a directory or not text; write errors.
pub fn write(path: &Path, p: &Profile) -> Result<WriteOutcome> {
    if path.is_dir() {
        return Err(bad(format!(
            "--write-modelfile {} is a directory; pass the Modelfile's path (e.g. {}/Modelfile)",
            path.display(),
            path.display()
        )));
    }
    if !path.exists() {
        atomic_write(path, render(p).as_bytes())?;
        return Ok(WriteOutcome::Created);
    }
    let bytes = std::fs::read(path).map_err(|e| bad(format!("{}: cannot be read ({e})", path.display())))?;
    let old = String::from_utf8(bytes).map_err(|_| {
        bad(format!("{} is not a text file; pass an Ollama Modelfile to --write-modelfile", path.display()))
    })?;
    let new = update(&old, &params(p));
    if new == old {
        return Ok(WriteOutcome::Unchanged);
    }
    let mut bak = path.as_os_str().to_owned();
    bak.push(".bak");
    atomic_write(Path::new(&bak), old.as_bytes())?;
    atomic_write(path, new.as_bytes())?;
    Ok(WriteOutcome::Updated)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGINAL: &str = "# my assistant\nFROM ./gemma.gguf\n\nTEMPLATE \"\"\"{{ .System }}\nPARAMETER num_gpu 1\n{{ .Prompt }}\"\"\"\nSYSTEM \"\"\"\nYou are terse.\n\"\"\"\nPARAMETER temperature 0.7\nparameter   NUM_GPU\t12\nPARAMETER stop \"<end>\"\n# trailing comment";

    #[test]
    fn only_owned_parameters_change() {
        let new = update(ORIGINAL, &[("num_gpu", 0), ("num_thread", 8), ("num_ctx", 4096)]);
        let expected = "# my assistant\nFROM ./gemma.gguf\n\nTEMPLATE \"\"\"{{ .System }}\nPARAMETER num_gpu 1\n{{ .Prompt }}\"\"\"\nSYSTEM \"\"\"\nYou are terse.\n\"\"\"\nPARAMETER temperature 0.7\nparameter   NUM_GPU\t0\nPARAMETER stop \"<end>\"\nPARAMETER num_thread 8\nPARAMETER num_ctx 4096\n# trailing comment";
        assert_eq!(new, expected);
        assert_eq!(update(&new, &[("num_gpu", 0), ("num_thread", 8), ("num_ctx", 4096)]), new, "idempotent");
    }

    #[test]
    fn crlf_files_stay_crlf_and_missing_newline_is_handled() {
        let old = "FROM x.gguf\r\nPARAMETER num_ctx 2048\r\n";
        assert_eq!(
            update(old, &[("num_ctx", 4096), ("num_gpu", 3)]),
            "FROM x.gguf\r\nPARAMETER num_ctx 4096\r\nPARAMETER num_gpu 3\r\n"
        );
        assert_eq!(update("FROM x.gguf", &[("num_gpu", 3)]), "FROM x.gguf\nPARAMETER num_gpu 3\n");
    }

    #[test]
    fn parameter_lines_are_recognized_loosely() {
        assert_eq!(parameter("PARAMETER num_gpu 3").map(|p| p.1), Some("num_gpu".into()));
        assert_eq!(parameter("  Parameter\tnum_ctx   8").map(|p| p.0), Some("  Parameter\tnum_ctx   ".len()));
        assert_eq!(parameter("PARAMETERS x 1"), None);
        assert_eq!(parameter("FROM x"), None);
    }
}
