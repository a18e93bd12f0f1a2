//! A bounds-checked GGUF reader and a small writer.
//!
//! The reader never trusts a count in the header: every length is checked
//! against the bytes left in the file before anything is allocated, so a
//! corrupt or hostile file yields a one-line error instead of an abort inside
//! llama.cpp. The writer exists for tests and benchmarks (synthetic models).

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// More tensors or keys than any real model has (large MoE models have tens of thousands).
const PLAUSIBLE_COUNT: u64 = 1_000_000;

/// A metadata value. Arrays of strings keep only their length when read for
/// inspection beyond a limit, to keep vocabularies of 256k tokens cheap.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    /// Element type and elements. String arrays longer than
    /// [`ARRAY_KEEP`] are kept as a count only (`items` empty).
    Array {
        elem_type: u32,
        len: u64,
        items: Vec<Value>,
    },
}

/// Arrays longer than this are skipped over rather than materialized.
pub const ARRAY_KEEP: u64 = 64;

impl Value {
    #[must_use]
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(u64::from(v)),
            Value::U16(v) => Some(u64::from(v)),
            Value::U32(v) => Some(u64::from(v)),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    #[must_use]
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the fastest-varying dimension.
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// Offset from the start of the tensor data section.
    pub offset: u64,
}

impl TensorInfo {
    #[must_use]
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Bytes of this tensor's data when its type is known.
    #[must_use]
    pub fn n_bytes(&self) -> Option<u64> {
        let (block, size) = type_block_size(self.ggml_type)?;
        let n = self.n_elements();
        Some(n / block * size)
    }
}

#[derive(Debug, Clone)]
pub struct Gguf {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute file offset where tensor data begins.
    pub data_offset: u64,
    pub file_size: u64,
}

/// Why a file could not be read as GGUF. Each variant renders as one line
/// that names the problem; the caller adds the path and the fix.
#[derive(Debug)]
pub enum GgufError {
    Io(io::Error),
    Empty,
    NotGguf { magic: [u8; 4], guess: &'static str },
    TooShortForHeader { size: u64 },
    UnsupportedVersion(u32),
    Truncated { at: u64, size: u64, what: String },
    Absurd { what: String, count: u64, size: u64 },
    Invalid(String),
    DataTruncated { needed: u64, size: u64 },
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufError::Io(e) => write!(f, "cannot be read ({e})"),
            GgufError::Empty => write!(f, "is empty (0 bytes)"),
            GgufError::NotGguf { magic, guess } => {
                write!(f, "is not a GGUF file (magic bytes '{}'", escape(magic))?;
                if guess.is_empty() {
                    write!(f, ")")
                } else {
                    write!(f, ", looks like {guess})")
                }
            }
            GgufError::TooShortForHeader { size } => {
                write!(f, "is cut off: {size} bytes, shorter than a GGUF header")
            }
            GgufError::UnsupportedVersion(v) => {
                write!(f, "has GGUF version {v}, which this build does not read (2 and 3 are supported)")
            }
            GgufError::Truncated { at, size, what } => {
                write!(f, "is cut off in its GGUF header: {what} runs past the end of the file at byte {at} of {size}")
            }
            GgufError::Absurd { what, count, size } => {
                write!(f, "is corrupt: its header claims {count} {what}, more than a file of {size} bytes can hold")
            }
            GgufError::Invalid(s) => write!(f, "is corrupt: {s}"),
            GgufError::DataTruncated { needed, size } => {
                write!(f, "is cut off in its tensor data: the tensors need {needed} bytes but the file has {size}")
            }
        }
    }
}

impl std::error::Error for GgufError {}

impl From<io::Error> for GgufError {
    fn from(e: io::Error) -> Self {
        GgufError::Io(e)
    }
}

fn escape(bytes: &[u8]) -> String {
    bytes.iter().flat_map(|b| std::ascii::escape_default(*b)).map(char::from).collect()
}

fn guess_format(magic: &[u8]) -> &'static str {
    match magic {
        [b'P', b'K', 3, 4] => "a zip archive",
        [0x89, b'P', b'N', b'G'] => "a PNG image",
        [0x7f, b'E', b'L', b'F'] => "an ELF executable",
        [0x1f, 0x8b, ..] => "a gzip archive",
        [b'{', ..] | [b'[', ..] => "JSON text",
        [b'<', ..] => "HTML or XML text",
        [b'v', b'e', b'r', b's'] => "a Git LFS pointer (fetch the real file with git lfs pull)",
        [b'l', b'm', b'g', b'g'] | [b't', b'j', b'g', b'g'] | [b'g', b'g', b'j', b't'] => {
            "an old GGML/GGJT model (convert it to GGUF)"
        }
        _ => "",
    }
}

/// (elements per block, bytes per block) for ggml types this reader knows.
#[must_use]
pub fn type_block_size(t: u32) -> Option<(u64, u64)> {
    Some(match t {
        0 => (1, 4),     // F32
        1 => (1, 2),     // F16
        2 => (32, 18),   // Q4_0
        3 => (32, 20),   // Q4_1
        6 => (32, 22),   // Q5_0
        7 => (32, 24),   // Q5_1
        8 => (32, 34),   // Q8_0
        9 => (32, 36),   // Q8_1
        10 => (256, 84), // Q2_K
        11 => (256, 110),
        12 => (256, 144),  // Q4_K
        13 => (256, 176),  // Q5_K
        14 => (256, 210),  // Q6_K
        15 => (256, 292),  // Q8_K
        16 => (256, 66),   // IQ2_XXS
        17 => (256, 74),   // IQ2_XS
        18 => (256, 98),   // IQ3_XXS
        19 => (256, 50),   // IQ1_S
        20 => (32, 18),    // IQ4_NL
        21 => (256, 110),  // IQ3_S
        22 => (256, 82),   // IQ2_S
        23 => (256, 136),  // IQ4_XS
        24 => (1, 1),      // I8
        25 => (1, 2),      // I16
        26 => (1, 4),      // I32
        27 | 28 => (1, 8), // I64, F64
        29 => (256, 56),   // IQ1_M
        30 => (1, 2),      // BF16
        34 => (256, 54),   // TQ1_0
        35 => (256, 66),   // TQ2_0
        39 => (32, 17),    // MXFP4
        _ => return None,
    })
}

#[must_use]
pub fn type_name(t: u32) -> &'static str {
    match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "unknown",
    }
}

/// llama.cpp's `llama_ftype` names, as `general.file_type` stores them.
#[must_use]
pub fn file_type_name(ft: u64) -> Option<&'static str> {
    Some(match ft {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

struct Cursor<R> {
    r: R,
    pos: u64,
    size: u64,
}

impl<R: Read> Cursor<R> {
    fn need(&self, n: u64, what: &dyn Fn() -> String) -> Result<(), GgufError> {
        if self.size.saturating_sub(self.pos) < n {
            return Err(GgufError::Truncated { at: self.size, size: self.size, what: what() });
        }
        Ok(())
    }

    fn bytes(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<Vec<u8>, GgufError> {
        self.need(n, what)?;
        let len = usize::try_from(n).map_err(|_| GgufError::Invalid("length overflows".into()))?;
        let mut buf = vec![0u8; len];
        self.r.read_exact(&mut buf).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                GgufError::Truncated { at: self.size, size: self.size, what: what() }
            } else {
                GgufError::Io(e)
            }
        })?;
        self.pos += n;
        Ok(buf)
    }

    fn arr<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let v = self.bytes(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(&v);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        if len > self.size {
            return Err(GgufError::Absurd {
                what: format!("bytes in a string ({})", what()),
                count: len,
                size: self.size,
            });
        }
        let b = self.bytes(len, what)?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    fn skip(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<(), GgufError> {
        self.need(n, what)?;
        let copied = io::copy(&mut (&mut self.r).take(n), &mut io::sink())?;
        if copied != n {
            return Err(GgufError::Truncated { at: self.size, size: self.size, what: what() });
        }
        self.pos += n;
        Ok(())
    }

    fn value(&mut self, t: u32, keep: bool, what: &dyn Fn() -> String) -> Result<Value, GgufError> {
        Ok(match t {
            0 => Value::U8(self.arr::<1>(what)?[0]),
            1 => Value::I8(i8::from_le_bytes(self.arr(what)?)),
            2 => Value::U16(u16::from_le_bytes(self.arr(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.arr(what)?)),
            4 => Value::U32(u32::from_le_bytes(self.arr(what)?)),
            5 => Value::I32(i32::from_le_bytes(self.arr(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.arr(what)?)),
            7 => Value::Bool(self.arr::<1>(what)?[0] != 0),
            8 => Value::Str(self.string(what)?),
            10 => Value::U64(u64::from_le_bytes(self.arr(what)?)),
            11 => Value::I64(i64::from_le_bytes(self.arr(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.arr(what)?)),
            9 => {
                let elem_type = self.u32(what)?;
                let len = self.u64(what)?;
                let min = match elem_type {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => return Err(GgufError::Invalid(format!("{} has array element type {other}", what()))),
                };
                if len.saturating_mul(min) > self.size.saturating_sub(self.pos) {
                    return Err(GgufError::Absurd {
                        what: format!("array elements in {}", what()),
                        count: len,
                        size: self.size,
                    });
                }
                let keep_items = keep && len <= ARRAY_KEEP;
                let mut items = Vec::new();
                if elem_type == 8 || elem_type == 9 || keep_items {
                    for _ in 0..len {
                        let v = self.value(elem_type, keep_items, what)?;
                        if keep_items {
                            items.push(v);
                        }
                    }
                } else {
                    self.skip(len * min, what)?;
                }
                Value::Array { elem_type, len, items }
            }
            other => return Err(GgufError::Invalid(format!("{} has unknown value type {other}", what()))),
        })
    }
}

/// Magic, version, and the two counts, each checked against the file size.
fn read_header<R: std::io::Read>(c: &mut Cursor<R>, size: u64) -> Result<(u32, u64, u64), GgufError> {
    if size < 4 {
        return Err(GgufError::TooShortForHeader { size });
    }
    let magic: [u8; 4] = c.arr(&|| "the magic".into())?;
    if &magic != MAGIC {
        return Err(GgufError::NotGguf { magic, guess: guess_format(&magic) });
    }
    if size < 24 {
        return Err(GgufError::TooShortForHeader { size });
    }
    let version = c.u32(&|| "the version".into())?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = c.u64(&|| "the tensor count".into())?;
    let n_kv = c.u64(&|| "the metadata count".into())?;
    // A tensor entry takes at least 8 (name len) + 4 + 8 + 4 + 8 bytes; a key 8 + 4 + 1.
    // A count the file cannot hold means a cut-off file when the count is
    // plausible (reading on reports where it ends), else a corrupt header.
    let left = size - c.pos;
    if n_kv.saturating_mul(13) > left && n_kv > PLAUSIBLE_COUNT {
        return Err(GgufError::Absurd { what: "metadata keys".into(), count: n_kv, size });
    }
    if n_tensors.saturating_mul(32) > left && n_tensors > PLAUSIBLE_COUNT {
        return Err(GgufError::Absurd { what: "tensors".into(), count: n_tensors, size });
    }
    Ok((version, n_tensors, n_kv))
}

/// The tensor table.
fn read_tensors<R: std::io::Read>(c: &mut Cursor<R>, n_tensors: u64) -> Result<Vec<TensorInfo>, GgufError> {
    let mut tensors = Vec::with_capacity(usize::try_from(n_tensors.min(1 << 16)).unwrap_or(0));
    for i in 0..n_tensors {
        let name = c.string(&|| format!("the name of tensor {i}"))?;
        let what = || format!("tensor '{name}'");
        let n_dims = c.u32(&what)?;
        if n_dims > 8 {
            return Err(GgufError::Invalid(format!("tensor '{name}' has {n_dims} dimensions (at most 4 are valid)")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&what)?);
        }
        let ggml_type = c.u32(&what)?;
        let offset = c.u64(&what)?;
        tensors.push(TensorInfo { name, dims, ggml_type, offset });
    }
    Ok(tensors)
}

/// The tensor data the table describes must fit in the file.
fn check_data(tensors: &[TensorInfo], data_offset: u64, size: u64) -> Result<(), GgufError> {
    let mut needed = data_offset;
    for t in tensors {
        let Some(n_elems) = t.dims.iter().try_fold(1u64, |acc, d| acc.checked_mul(*d)) else {
            return Err(GgufError::Absurd { what: format!("elements in tensor '{}'", t.name), count: u64::MAX, size });
        };
        let bytes = match type_block_size(t.ggml_type) {
            Some((block, bsize)) => n_elems / block * bsize,
            None => 0,
        };
        needed = needed.max(data_offset.saturating_add(t.offset).saturating_add(bytes));
    }
    if needed > size {
        return Err(GgufError::DataTruncated { needed, size });
    }
    Ok(())
}

impl Gguf {
    /// Reads the header, metadata and tensor table, and checks that the tensor
    /// data the table describes fits in the file.
    ///
    /// # Errors
    /// A [`GgufError`] naming what is wrong with the file.
    pub fn read(path: &Path) -> Result<Gguf, GgufError> {
        let file = std::fs::File::open(path)?;
        let size = file.metadata()?.len();
        if size == 0 {
            return Err(GgufError::Empty);
        }
        let mut c = Cursor { r: BufReader::with_capacity(1 << 16, file), pos: 0, size };
        let (version, n_tensors, n_kv) = read_header(&mut c, size)?;
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = c.string(&|| format!("metadata key {i}"))?;
            let what = || format!("metadata value '{key}'");
            let t = c.u32(&what)?;
            let keep = !key.starts_with("tokenizer.");
            let v = c.value(t, keep, &what)?;
            metadata.insert(key, v);
        }
        let tensors = read_tensors(&mut c, n_tensors)?;
        let alignment = metadata.get("general.alignment").and_then(Value::as_u64).unwrap_or(DEFAULT_ALIGNMENT);
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(GgufError::Invalid(format!("general.alignment is {alignment}, not a power of two")));
        }
        let data_offset = c.pos.div_ceil(alignment) * alignment;
        check_data(&tensors, data_offset, size)?;
        Ok(Gguf { version, metadata, tensors, data_offset, file_size: size })
    }

    #[must_use]
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    #[must_use]
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    #[must_use]
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// The bytes of every tensor (what ggml allocates for them, before
    /// alignment padding).
    #[must_use]
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().filter_map(TensorInfo::n_bytes).sum()
    }

    /// Number of entries of an array value (a vocabulary, say).
    #[must_use]
    pub fn array_len(&self, key: &str) -> Option<u64> {
        match self.get(key)? {
            Value::Array { len, .. } => Some(*len),
            _ => None,
        }
    }
}

/// Builds a GGUF file in memory order: metadata, tensor table, aligned data.
#[derive(Default)]
pub struct Writer {
    kv: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

impl Writer {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        self.kv.push((key.to_string(), v));
        self
    }

    /// Adds a tensor; `data` must already be in `ggml_type`'s encoding.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ggml_type: u32, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_string(), dims.to_vec(), ggml_type, data));
        self
    }

    /// Writes the file.
    ///
    /// # Errors
    /// I/O errors from `out`.
    pub fn write_to<W: Write + Seek>(&self, out: &mut W) -> io::Result<()> {
        out.write_all(MAGIC)?;
        out.write_all(&3u32.to_le_bytes())?;
        out.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        out.write_all(&(self.kv.len() as u64).to_le_bytes())?;
        for (k, v) in &self.kv {
            write_str(out, k)?;
            write_value(out, v, true)?;
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, dims, t, data) in &self.tensors {
            write_str(out, name)?;
            out.write_all(&(dims.len() as u32).to_le_bytes())?;
            for d in dims {
                out.write_all(&d.to_le_bytes())?;
            }
            out.write_all(&t.to_le_bytes())?;
            out.write_all(&offset.to_le_bytes())?;
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        }
        let pos = out.stream_position()?;
        let data_start = pos.div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        pad(out, data_start - pos)?;
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            let here = out.stream_position()? - data_start;
            pad(out, off - here)?;
            out.write_all(data)?;
        }
        let here = out.stream_position()? - data_start;
        pad(out, offset - here)?;
        out.seek(SeekFrom::End(0))?;
        Ok(())
    }
}

fn pad<W: Write>(out: &mut W, n: u64) -> io::Result<()> {
    out.write_all(&vec![0u8; usize::try_from(n).unwrap_or(0)])
}

fn write_str<W: Write>(out: &mut W, s: &str) -> io::Result<()> {
    out.write_all(&(s.len() as u64).to_le_bytes())?;
    out.write_all(s.as_bytes())
}

fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::Str(_) => 8,
        Value::Array { .. } => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn write_value<W: Write>(out: &mut W, v: &Value, with_type: bool) -> io::Result<()> {
    if with_type {
        out.write_all(&value_type(v).to_le_bytes())?;
    }
    match v {
        Value::U8(x) => out.write_all(&[*x]),
        Value::I8(x) => out.write_all(&x.to_le_bytes()),
        Value::U16(x) => out.write_all(&x.to_le_bytes()),
        Value::I16(x) => out.write_all(&x.to_le_bytes()),
        Value::U32(x) => out.write_all(&x.to_le_bytes()),
        Value::I32(x) => out.write_all(&x.to_le_bytes()),
        Value::F32(x) => out.write_all(&x.to_le_bytes()),
        Value::Bool(x) => out.write_all(&[u8::from(*x)]),
        Value::Str(s) => write_str(out, s),
        Value::U64(x) => out.write_all(&x.to_le_bytes()),
        Value::I64(x) => out.write_all(&x.to_le_bytes()),
        Value::F64(x) => out.write_all(&x.to_le_bytes()),
        Value::Array { elem_type, items, .. } => {
            out.write_all(&elem_type.to_le_bytes())?;
            out.write_all(&(items.len() as u64).to_le_bytes())?;
            for it in items {
                write_value(out, it, false)?;
            }
            Ok(())
        }
    }
}
