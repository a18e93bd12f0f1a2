//! Every command that takes a model rejects unusable files with one line and exit 2.
mod common;

use std::path::{Path, PathBuf};

use common::*;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn check_all(path: &Path, needle: &str) {
    let p = path.to_str().unwrap();
    assert_bad_input(&run(&["inspect", p]), needle);
    assert_bad_input(&run(&["bench", p, "-p", "8", "-n", "4", "-r", "1"]), needle);
}

#[test]
fn missing_path() {
    check_all(Path::new("/nonexistent/model.gguf"), "no such file");
}

#[test]
fn directory() {
    let dir = tempfile::tempdir().unwrap();
    check_all(dir.path(), "is a directory");
}

#[test]
fn empty_file() {
    let dir = tempfile::tempdir().unwrap();
    check_all(&write(dir.path(), "empty.gguf", b""), "is empty");
}

#[test]
fn random_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let bytes: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    check_all(&write(dir.path(), "random.gguf", &bytes), "is not a GGUF file");
}

#[test]
fn zip_and_png_renamed() {
    let dir = tempfile::tempdir().unwrap();
    check_all(&write(dir.path(), "zip.gguf", b"PK\x03\x04\x14\x00\x00\x00rest of a zip"), "a zip archive");
    check_all(&write(dir.path(), "png.gguf", b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR"), "a PNG image");
}

#[test]
fn truncated_in_header() {
    let dir = tempfile::tempdir().unwrap();
    let full = std::fs::read(synth(dir.path(), 2)).unwrap();
    check_all(&write(dir.path(), "cut-header.gguf", &full[..300]), "cut off in its GGUF header");
    check_all(&write(dir.path(), "cut-magic.gguf", &full[..10]), "cut off");
}

#[test]
fn truncated_in_tensor_data() {
    let dir = tempfile::tempdir().unwrap();
    let full = std::fs::read(synth(dir.path(), 2)).unwrap();
    check_all(&write(dir.path(), "cut-data.gguf", &full[..full.len() - 1000]), "cut off in its tensor data");
}

#[test]
fn absurd_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = b"GGUF".to_vec();
    h.extend(3u32.to_le_bytes());
    h.extend(4_000_000_000u64.to_le_bytes());
    h.extend(1u64.to_le_bytes());
    h.extend([0u8; 64]);
    check_all(&write(dir.path(), "tensors.gguf", &h), "claims 4000000000 tensors");
    let mut k = b"GGUF".to_vec();
    k.extend(3u32.to_le_bytes());
    k.extend(0u64.to_le_bytes());
    k.extend(u64::MAX.to_le_bytes());
    k.extend([0u8; 64]);
    check_all(&write(dir.path(), "keys.gguf", &k), "metadata keys");
}

#[test]
fn vocabulary_only() {
    use ngl_tune::gguf::{Value, Writer};
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("vocab.gguf");
    let mut w = Writer::new();
    w.kv("general.architecture", Value::Str("llama".into())).kv("tokenizer.ggml.model", Value::Str("llama".into()));
    let mut f = std::fs::File::create(&p).unwrap();
    w.write_to(&mut f).unwrap();
    drop(f);
    check_all(&p, "has no layers");
}
