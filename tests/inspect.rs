mod common;

use std::io::Write;

use common::*;
use ngl_tune::gguf::{Gguf, Value, Writer};

#[test]
fn synthetic_40_layer_model_is_inspected() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 40);
    let o = run(&["inspect", m.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["architecture"], "llama");
    assert_eq!(v["n_layer"], 40);
    assert_eq!(v["n_layer_full"], 41);
    assert_eq!(v["n_expert"], 0);
    assert_eq!(v["ctx_train"], 4096);
    assert_eq!(v["quantization"], "F32");
    // Every layer: 4 attention matrices 128x128, 3 FFN 128x256, 2 norms of 128, all F32.
    let per_layer = (4 * 128 * 128 + 3 * 128 * 256 + 2 * 128) * 4;
    let layers = v["layer_bytes"].as_array().unwrap();
    assert_eq!(layers.len(), 40);
    assert!(layers.iter().all(|b| b.as_u64() == Some(per_layer)), "{layers:?}");
    // Output layer: output.weight (128 x 259) + output_norm (128).
    assert_eq!(v["output_bytes"], (128 * 259 + 128) * 4);
    assert_eq!(v["output_tied"], false);

    let text = run(&["inspect", m.to_str().unwrap()]);
    assert_eq!(text.status.code(), Some(0));
    let t = stdout(&text);
    assert!(t.contains("40 repeating + output = 41"), "{t}");
    assert!(t.contains("none (dense)"), "{t}");
}

#[test]
fn moe_model_reports_experts() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("moe.gguf");
    ngl_tune::synth::write_model(&p, &ngl_tune::synth::SynthSpec::default().with_n_layer(3).with_experts(4, 2))
        .unwrap();
    let o = run(&["inspect", p.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["architecture"], "qwen3moe");
    assert_eq!(v["n_expert"], 4);
    assert_eq!(v["n_expert_used"], 2);
}

#[test]
fn real_model_is_inspected() {
    let m = real_model();
    let o = run(&["inspect", m.to_str().unwrap(), "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["architecture"], "gemma3");
    assert_eq!(v["n_layer"], 18);
    assert_eq!(v["file_size"], 253_113_024u64);
    assert_eq!(v["quantization"], "Q4_K_M");
    assert_eq!(v["ctx_train"], 32768);
    assert_eq!(v["output_tied"], true);
    // Only output_norm (640 F32) goes to the device with the output layer.
    assert_eq!(v["output_bytes"], 640 * 4);
}

#[test]
fn writer_and_reader_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("rt.gguf");
    let mut w = Writer::new();
    w.kv("general.architecture", Value::Str("llama".into()))
        .kv("general.alignment", Value::U32(32))
        .kv("x.f", Value::F32(1.5))
        .tensor("a", &[3], 0, vec![0u8; 12])
        .tensor("b", &[2, 2], 1, vec![1u8; 8]);
    let mut f = std::fs::File::create(&p).unwrap();
    w.write_to(&mut f).unwrap();
    f.flush().unwrap();
    let g = Gguf::read(&p).unwrap();
    assert_eq!(g.get_str("general.architecture"), Some("llama"));
    assert_eq!(g.get("x.f"), Some(&Value::F32(1.5)));
    assert_eq!(g.tensors.len(), 2);
    assert_eq!(g.tensors[1].dims, vec![2, 2]);
    assert_eq!(g.tensors[1].offset, 32);
    assert_eq!(g.data_offset % 32, 0);
}
