//! Ollama Modelfiles, read as Ollama reads them, and an in-place update that
//! changes only the PARAMETER values ngl-tune owns (num_gpu, num_thread,
//! num_ctx, num_batch, and draft_num_predict for a model with MTP heads)
//! and keeps every other byte. What the values are is
//! the profile's (`emit::modelfile`).
//!
//! The reader follows Ollama's own parser (`parser/parser.go`, `ParseFile`)
//! rune by rune: a command word (case-insensitive) and a space; for
//! PARAMETER a name (letters, digits, `_`, case kept) and a space; then a
//! value that ends at a newline only once the value collected so far,
//! trimmed, is complete: one that starts with `"""` must end with `"""`, one
//! that starts with `"` must end with `"`, anything else ends at the first
//! newline. `#` starts a comment only where a command could start. So a
//! `"""` in a comment or in the middle of a value opens nothing, and text
//! inside a multi-line value is never an instruction.

use std::ops::Range;
use std::path::Path;

use anyhow::Result;

use crate::error::bad;
use crate::fsio::atomic_write;

/// The PARAMETER names ngl-tune sets. Ollama's name for GPU layers is
/// `num_gpu` (`num_gpu_layers` does not exist there). Ollama's parameter
/// names are case-sensitive: `NUM_GPU` is not ours, and Ollama rejects it.
/// `draft_num_predict` is set only for a model with MTP heads (`emit::modelfile::params`).
pub const OWNED: [&str; 5] = ["num_gpu", "num_thread", "num_ctx", "num_batch", "draft_num_predict"];

/// Names seen in Modelfiles in the wild that Ollama rejects ("unknown
/// parameter"), with the name that was meant.
const MISNAMED: [(&str, &str); 6] = [
    ("num_gpu_layers", "num_gpu"),
    ("n_gpu_layers", "num_gpu"),
    ("num_threads", "num_thread"),
    ("n_threads", "num_thread"),
    ("n_ctx", "num_ctx"),
    ("batch_size", "num_batch"),
];

/// One command as Ollama's parser reads it, with where it stands in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// "model" for FROM; the lower-cased command word otherwise; for
    /// PARAMETER the parameter name exactly as written.
    pub name: String,
    pub parameter: bool,
    /// The value as Ollama reads it (quotes removed; "role: text" for MESSAGE).
    pub args: String,
    /// Line of the command word (1-based).
    pub line: usize,
    /// Bytes of the value as written, quotes included (empty when none).
    pub value: Range<usize>,
}

/// Why Ollama would refuse a Modelfile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub msg: String,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Nil,
    Name,
    Value,
    Parameter,
    Message,
    Comment,
}

/// Go's `strconv.IsPrint` as far as Modelfiles go: no control characters,
/// no spaces but U+0020, no invisible format characters.
fn is_print(c: char) -> bool {
    !c.is_control()
        && (c == ' ' || !c.is_whitespace())
        && !matches!(c, '\u{200b}'..='\u{200f}' | '\u{2060}'..='\u{2064}' | '\u{feff}')
}

fn is_space(c: char) -> bool {
    c == ' ' || c == '\t'
}

fn is_newline(c: char) -> bool {
    c == '\r' || c == '\n'
}

/// Ollama's `unquote`: the value without its quotes, or `None` while a
/// quoted value is still open.
fn unquote(s: &str) -> Option<&str> {
    if let Some(rest) = s.strip_prefix("\"\"\"") {
        return (s.len() >= 6 && rest.ends_with("\"\"\"")).then(|| &s[3..s.len() - 3]);
    }
    if let Some(rest) = s.strip_prefix('"') {
        return (!rest.is_empty() && rest.ends_with('"')).then(|| &s[1..s.len() - 1]);
    }
    Some(s)
}

fn is_valid_command(word: &str) -> bool {
    matches!(
        word.to_ascii_lowercase().as_str(),
        "from"
            | "license"
            | "template"
            | "system"
            | "adapter"
            | "draft"
            | "renderer"
            | "parser"
            | "parameter"
            | "message"
            | "requires"
    )
}

/// Ollama's parser, one rune at a time.
struct Reader {
    out: Vec<Command>,
    state: State,
    buf: String,
    line: usize,
    cmd_line: usize,
    name: String,
    parameter: bool,
    role: String,
    value: Option<Range<usize>>,
}

impl Reader {
    fn err(&self, msg: String) -> ParseError {
        ParseError { line: self.cmd_line, msg }
    }

    /// The command read so far, when its value is complete.
    fn finish(&self) -> Option<Command> {
        unquote(self.buf.trim()).map(|s| Command {
            name: self.name.clone(),
            parameter: self.parameter,
            args: if self.role.is_empty() { s.to_string() } else { format!("{}: {s}", self.role) },
            line: self.cmd_line,
            value: self.value.clone().unwrap_or(0..0),
        })
    }

    fn rune(&mut self, i: usize, c: char) -> Result<(), ParseError> {
        match self.state {
            State::Nil => {
                if c == '#' {
                    self.state = State::Comment;
                } else if !is_space(c) && !is_newline(c) {
                    self.state = State::Name;
                    self.cmd_line = self.line;
                    self.buf.clear();
                    if is_print(c) {
                        self.buf.push(c);
                    }
                }
            }
            State::Comment => {
                if is_newline(c) {
                    self.state = State::Nil;
                }
            }
            State::Name => self.command_word(c)?,
            State::Parameter => {
                if c.is_ascii_alphanumeric() || c == '_' {
                    self.buf.push(c);
                } else if is_space(c) {
                    self.name = std::mem::take(&mut self.buf);
                    self.state = State::Value;
                } else {
                    return Err(self.err(format!(
                        "PARAMETER {} has no value (a name of letters, digits and _, a space, then the value)",
                        self.buf
                    )));
                }
            }
            State::Message => {
                if c.is_ascii_alphabetic() {
                    self.buf.push(c);
                } else if is_space(c) {
                    if !matches!(self.buf.as_str(), "system" | "user" | "assistant") {
                        return Err(
                            self.err(format!("MESSAGE role '{}' is not one of system, user or assistant", self.buf))
                        );
                    }
                    self.role = std::mem::take(&mut self.buf);
                    self.state = State::Value;
                } else {
                    return Err(self.err(format!("MESSAGE {} has no role and text", self.buf)));
                }
            }
            State::Value => self.value_rune(i, c),
        }
        if c == '\n' {
            self.line += 1;
        }
        Ok(())
    }

    /// The command word ends at a space; what follows depends on it.
    fn command_word(&mut self, c: char) -> Result<(), ParseError> {
        if c.is_ascii_alphabetic() {
            self.buf.push(c);
            return Ok(());
        }
        if !is_space(c) {
            let word = format!("{}{}", self.buf, if is_newline(c) { "" } else { "…" });
            return Err(self.err(format!("'{word}' is not a command followed by a value")));
        }
        if !is_valid_command(&self.buf) {
            return Err(self.err(format!("'{}' is not a Modelfile command (Ollama knows FROM, PARAMETER, TEMPLATE, SYSTEM, ADAPTER, LICENSE, MESSAGE, DRAFT, RENDERER, PARSER, REQUIRES)", self.buf)));
        }
        let word = self.buf.to_ascii_lowercase();
        self.parameter = false;
        self.role.clear();
        self.value = None;
        self.buf.clear();
        (self.state, self.name) = match word.as_str() {
            "parameter" => {
                self.parameter = true;
                (State::Parameter, String::new())
            }
            "message" => (State::Message, word),
            "from" => (State::Value, "model".into()),
            _ => (State::Value, word),
        };
        Ok(())
    }

    /// A value runs on over spaces, and over newlines while it is an open quote.
    fn value_rune(&mut self, i: usize, c: char) {
        if is_space(c) || is_newline(c) {
            let complete = unquote(self.buf.trim()).is_some();
            if !complete || is_space(c) {
                self.buf.push(c);
            } else {
                let cmd = self.finish().expect("complete");
                self.out.push(cmd);
                self.buf.clear();
                self.state = State::Nil;
            }
            return;
        }
        if is_print(c) {
            self.buf.push(c);
        }
        let end = i + c.len_utf8();
        self.value = Some(self.value.take().map_or(i..end, |v| v.start..end));
    }

    /// What the end of the file leaves.
    fn end(mut self) -> Result<Vec<Command>, ParseError> {
        match self.state {
            State::Nil | State::Comment => {}
            State::Value => match self.finish() {
                Some(c) => self.out.push(c),
                None => {
                    let what = if self.parameter {
                        format!("PARAMETER {}", self.name)
                    } else {
                        self.name.to_ascii_uppercase()
                    };
                    return Err(self.err(format!("the quoted value of {what} is never closed")));
                }
            },
            State::Parameter => return Err(self.err(format!("PARAMETER {} has no value", self.buf))),
            State::Name | State::Message => {
                return Err(self.err(format!("'{}' at the end of the file has no value", self.buf)));
            }
        }
        Ok(self.out)
    }
}

/// Reads a Modelfile (without a byte-order mark) the way Ollama does.
///
/// # Errors
/// Where Ollama's parser fails: an unknown command, a PARAMETER name
/// followed by anything but a value, a MESSAGE role other than
/// system/user/assistant, a quoted value never closed.
pub fn parse(text: &str) -> Result<Vec<Command>, ParseError> {
    let mut r = Reader {
        out: Vec::new(),
        state: State::Nil,
        buf: String::new(),
        line: 1,
        cmd_line: 1,
        name: String::new(),
        parameter: false,
        role: String::new(),
        value: None,
    };
    for (i, c) in text.char_indices() {
        r.rune(i, c)?;
    }
    r.end()
}

/// The parameters Ollama builds from the commands: the last value of each
/// name wins, except `stop`, which collects every value.
#[must_use]
pub fn parameters(cmds: &[Command]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for c in cmds.iter().filter(|c| c.parameter) {
        match out.iter_mut().find(|(k, _)| *k == c.name) {
            Some((_, v)) if c.name == "stop" => v.push(c.args.clone()),
            Some((_, v)) => *v = vec![c.args.clone()],
            None => out.push((c.name.clone(), vec![c.args.clone()])),
        }
    }
    out
}

/// Checks what Ollama's parser lets through but `ollama create` then
/// rejects, where it concerns ngl-tune: a FROM line, values for PARAMETERs,
/// and names that look like ours but are not Ollama's.
fn check(cmds: &[Command]) -> Result<(), ParseError> {
    for c in cmds.iter().filter(|c| c.parameter) {
        if c.name.is_empty() {
            return Err(ParseError {
                line: c.line,
                msg: "PARAMETER is followed by more than one space, so Ollama reads an empty parameter name and rejects it; put one space between PARAMETER and the name".into(),
            });
        }
        if c.value.is_empty() {
            return Err(ParseError {
                line: c.line,
                msg: format!("PARAMETER {} has no value; give it one or delete the line", c.name),
            });
        }
        if !OWNED.contains(&c.name.as_str()) {
            if let Some(ours) = OWNED.iter().find(|o| o.eq_ignore_ascii_case(&c.name)) {
                return Err(ParseError {
                    line: c.line,
                    msg: format!(
                        "PARAMETER {} is not {ours}: Ollama's parameter names are case-sensitive and `ollama create` rejects it; write {ours}",
                        c.name
                    ),
                });
            }
            if let Some((_, meant)) = MISNAMED.iter().find(|(m, _)| m.eq_ignore_ascii_case(&c.name)) {
                return Err(ParseError {
                    line: c.line,
                    msg: format!(
                        "PARAMETER {} is not an Ollama parameter (`ollama create` rejects it); its name is {meant}",
                        c.name
                    ),
                });
            }
        }
    }
    if !cmds.iter().any(|c| c.name == "model" && !c.parameter) {
        return Err(ParseError { line: 1, msg: "no FROM line, which Ollama requires; add FROM <model>".into() });
    }
    Ok(())
}

/// Rewrites the values of the owned PARAMETERs of `old` to `values` (every
/// occurrence, so one value remains whichever Ollama takes), removes the
/// lines of those whose value is `None` (left to Ollama), and adds the
/// missing ones after the end of the last PARAMETER value (or the last
/// FROM). Every other byte is kept, line endings included. The result is
/// read back with [`parse`] and must yield exactly the intended commands.
///
/// # Errors
/// A [`ParseError`] for a Modelfile Ollama would reject, with its line.
pub fn update(old: &str, values: &[(&str, Option<u32>)]) -> Result<String, ParseError> {
    let bom = if old.starts_with('\u{feff}') { '\u{feff}'.len_utf8() } else { 0 };
    let body = &old[bom..];
    let cmds = parse(body)?;
    check(&cmds)?;
    let eol = if body.contains("\r\n") { "\r\n" } else { "\n" };
    let value_of = |name: &str| values.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    let unset = |c: &Command| c.parameter && value_of(&c.name) == Some(None);
    let mut edits: Vec<(Range<usize>, String)> = cmds
        .iter()
        .filter(|c| c.parameter)
        .filter_map(|c| match value_of(&c.name) {
            Some(Some(v)) => Some((c.value.clone(), v.to_string())),
            Some(None) => Some((whole_lines(body, c), String::new())),
            None => None,
        })
        .collect();
    let missing: Vec<(&str, u32)> = values
        .iter()
        .filter_map(|(k, v)| v.map(|v| (*k, v)))
        .filter(|(k, _)| !cmds.iter().any(|c| c.parameter && c.name == *k))
        .collect();
    let anchor =
        cmds.iter().rposition(|c| c.parameter && !unset(c)).or_else(|| cmds.iter().rposition(|c| c.name == "model"));
    if !missing.is_empty() {
        let lines: String = missing.iter().map(|(k, v)| format!("PARAMETER {k} {v}{eol}")).collect();
        // After the newline that ends the anchor's value; a value ends at a
        // newline, so nothing of another command stands between them.
        let after = anchor.map_or(body.len(), |a| cmds[a].value.end);
        let at = body[after..].find('\n').map_or(body.len(), |n| after + n + 1);
        let text =
            if at == body.len() && !body.is_empty() && !body.ends_with('\n') { format!("{eol}{lines}") } else { lines };
        edits.push((at..at, text));
    }
    // An insertion before a removal that starts where it does.
    edits.sort_by_key(|e| (e.0.start, e.0.end));
    let mut new = body.to_string();
    for (range, text) in edits.iter().rev() {
        new.replace_range(range.clone(), text);
    }
    // Read back as Ollama would: the same commands, owned values replaced,
    // the missing ones right after the anchor.
    let mut want: Vec<(String, bool, String)> = Vec::new();
    let mut at = want.len();
    for (i, c) in cmds.iter().enumerate() {
        if !unset(c) {
            let args = match value_of(&c.name) {
                Some(Some(v)) if c.parameter => v.to_string(),
                _ => c.args.clone(),
            };
            want.push((c.name.clone(), c.parameter, args));
        }
        if Some(i) == anchor {
            at = want.len();
        }
    }
    if anchor.is_none() {
        at = want.len();
    }
    for (i, (k, v)) in missing.iter().enumerate() {
        want.insert(at + i, ((*k).to_string(), true, v.to_string()));
    }
    let got: Vec<(String, bool, String)> = parse(&new)
        .map_err(|e| ParseError { line: e.line, msg: format!("the updated file would not parse ({})", e.msg) })?
        .into_iter()
        .map(|c| (c.name, c.parameter, c.args))
        .collect();
    if got != want {
        return Err(ParseError { line: 1, msg: "the update would change more than the owned parameters".into() });
    }
    Ok(format!("{}{new}", &old[..bom]))
}

/// The bytes of a command's whole lines: from the start of the line its
/// word stands on through the newline that ends its value.
fn whole_lines(body: &str, c: &Command) -> Range<usize> {
    let start = body.split_inclusive('\n').take(c.line.saturating_sub(1)).map(str::len).sum();
    let end = body[c.value.end..].find('\n').map_or(body.len(), |n| c.value.end + n + 1);
    start..end
}

/// What `--write-modelfile` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    Created,
    Updated,
    Unchanged,
}

/// A Modelfile's bytes as text, and how to turn text back into the same
/// encoding. Ollama reads UTF-8, and UTF-16 when a byte-order mark says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Utf8,
    Utf16Le,
    Utf16Be,
}

fn decode(bytes: &[u8]) -> std::result::Result<(String, Encoding), String> {
    let utf16 = |units: Vec<u16>, enc: Encoding| {
        String::from_utf16(&units).map(|s| (s, enc)).map_err(|_| "is not valid UTF-16 text".to_string())
    };
    let pairs = |b: &[u8]| -> std::result::Result<Vec<[u8; 2]>, String> {
        if b.len() % 2 == 1 {
            return Err("has an odd number of bytes after its UTF-16 byte-order mark".into());
        }
        Ok(b.chunks_exact(2).map(|p| [p[0], p[1]]).collect())
    };
    if let Some(rest) = bytes.strip_prefix(&[0xff, 0xfe]) {
        return utf16(pairs(rest)?.into_iter().map(u16::from_le_bytes).collect(), Encoding::Utf16Le);
    }
    if let Some(rest) = bytes.strip_prefix(&[0xfe, 0xff]) {
        return utf16(pairs(rest)?.into_iter().map(u16::from_be_bytes).collect(), Encoding::Utf16Be);
    }
    if bytes.contains(&0) {
        return Err("holds NUL bytes: UTF-16 without a byte-order mark, or not text; Ollama reads it as UTF-8 and rejects it: save it as UTF-8".into());
    }
    match String::from_utf8(bytes.to_vec()) {
        Ok(s) => Ok((s, Encoding::Utf8)),
        Err(e) => Err(format!("is not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to())),
    }
}

fn encode(text: &str, enc: Encoding) -> Vec<u8> {
    match enc {
        Encoding::Utf8 => text.as_bytes().to_vec(),
        Encoding::Utf16Le => [0xff, 0xfe].into_iter().chain(text.encode_utf16().flat_map(u16::to_le_bytes)).collect(),
        Encoding::Utf16Be => [0xfe, 0xff].into_iter().chain(text.encode_utf16().flat_map(u16::to_be_bytes)).collect(),
    }
}

/// Reads a Modelfile as Ollama would (bounded, regular files only), or says
/// why Ollama would not.
///
/// # Errors
/// `BadInput` naming the file, the line and the problem.
pub fn read(path: &Path) -> Result<Vec<Command>> {
    let bytes = crate::fsio::read_regular(path, crate::fsio::MAX_MODELFILE_BYTES, "pass an Ollama Modelfile")?;
    let (text, _) = decode(&bytes).map_err(|why| bad(format!("{} {why}", path.display())))?;
    parse(text.strip_prefix('\u{feff}').unwrap_or(&text))
        .map_err(|e| bad(format!("{}: line {}: {}", path.display(), e.line, e.msg)))
}

/// Creates or updates a Modelfile in place, atomically, keeping the previous
/// version as `PATH.bak`: the owned parameters set to `values` (see
/// [`update`]), or, for a missing or empty file, `fresh()` whole.
///
/// # Errors
/// `BadInput` for a path that is not a regular file, not text, or a
/// Modelfile Ollama would reject (named by line; the file is left as it
/// is); write errors.
pub fn write(path: &Path, values: &[(&str, Option<u32>)], fresh: &dyn Fn() -> String) -> Result<WriteOutcome> {
    crate::fsio::check_output_file(path, "--write-modelfile")?;
    let exists = std::fs::symlink_metadata(path).is_ok();
    let bytes = if exists {
        crate::fsio::read_regular(
            path,
            crate::fsio::MAX_MODELFILE_BYTES,
            "pass an Ollama Modelfile to --write-modelfile",
        )?
    } else {
        Vec::new()
    };
    if bytes.is_empty() {
        atomic_write(path, fresh().as_bytes())?;
        return Ok(if exists { WriteOutcome::Updated } else { WriteOutcome::Created });
    }
    let unchanged = |why: String| bad(format!("{} {why}; it is left unchanged", path.display()));
    let (old, enc) = decode(&bytes).map_err(unchanged)?;
    let new = update(&old, values).map_err(|e| unchanged(format!("line {}: {}", e.line, e.msg)))?;
    if new == old {
        return Ok(WriteOutcome::Unchanged);
    }
    let mut bak = path.as_os_str().to_owned();
    bak.push(".bak");
    atomic_write(Path::new(&bak), &bytes)?;
    atomic_write(path, &encode(&new, enc))?;
    Ok(WriteOutcome::Updated)
}

#[cfg(test)]
mod tests;
