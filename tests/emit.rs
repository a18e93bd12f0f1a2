//! Every emit format against its snapshot, Ollama's Modelfile rules, the
//! in-place Modelfile update, and the chart. Refresh snapshots with
//! UPDATE_SNAPSHOTS=1 cargo test --release --features vulkan --test emit.
mod common;

use std::path::{Path, PathBuf};

use common::*;

const FORMATS: [&str; 7] = ["modelfile", "llama-cpp", "llama-server-env", "ollama-options", "json", "md", "csv"];

fn examples() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("example-"))
        .collect();
    v.sort();
    assert!(v.len() >= 2);
    v
}

#[test]
fn every_format_matches_its_snapshot() {
    let snap_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some();
    for ex in examples() {
        let stem = ex.file_stem().unwrap().to_string_lossy().into_owned();
        for f in FORMATS {
            let o = run(&["emit", ex.to_str().unwrap(), "--format", f]);
            assert!(o.status.success(), "{stem} {f}: {}", stderr(&o));
            let got = stdout(&o);
            let snap = snap_dir.join(format!("{stem}.{f}"));
            if update {
                std::fs::write(&snap, &got).unwrap();
                continue;
            }
            let want = std::fs::read_to_string(&snap)
                .unwrap_or_else(|_| panic!("{} missing: run with UPDATE_SNAPSHOTS=1", snap.display()));
            assert_eq!(got, want, "{stem} --format {f} differs from {}", snap.display());
        }
    }
}

/// Ollama's Modelfile rules as far as ngl-tune's output goes: one FROM,
/// known instructions, known PARAMETER names, integer values for the ones we set.
fn check_ollama_rules(text: &str) {
    const PARAMS: [&str; 16] = [
        "num_ctx",
        "num_gpu",
        "num_thread",
        "num_batch",
        "num_predict",
        "num_keep",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "typical_p",
        "repeat_last_n",
        "repeat_penalty",
        "seed",
        "stop",
        "mirostat",
    ];
    let mut froms = 0;
    let mut in_block = false;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let was_in_block = in_block;
        if line.matches("\"\"\"").count() % 2 == 1 {
            in_block = !in_block;
        }
        if was_in_block {
            continue;
        }
        let mut words = line.split_whitespace();
        let instr = words.next().unwrap().to_ascii_uppercase();
        match instr.as_str() {
            "FROM" => {
                froms += 1;
                assert!(words.next().is_some(), "FROM needs a model: {line}");
            }
            "PARAMETER" => {
                let name = words.next().unwrap();
                let value = words.next().unwrap_or_else(|| panic!("no value: {line}"));
                assert!(PARAMS.contains(&name), "unknown parameter {name} (Ollama rejects it)");
                assert_ne!(name, "num_gpu_layers");
                if ["num_gpu", "num_thread", "num_ctx"].contains(&name) {
                    assert!(value.parse::<u32>().is_ok(), "{name} needs an integer: {value}");
                }
            }
            "TEMPLATE" | "SYSTEM" | "ADAPTER" | "LICENSE" | "MESSAGE" => {}
            other => panic!("unknown instruction {other}"),
        }
    }
    assert_eq!(froms, 1, "exactly one FROM");
}

#[test]
fn modelfiles_follow_ollamas_rules() {
    for ex in examples() {
        let o = run(&["emit", ex.to_str().unwrap()]);
        assert!(o.status.success());
        check_ollama_rules(&stdout(&o));
    }
}

const USER_MODELFILE: &str = "# my gemma, tuned by hand once\nFROM ./gemma-3-270m-q4_k_m.gguf\n\nTEMPLATE \"\"\"<start_of_turn>user\n{{ .Prompt }}\nPARAMETER num_gpu 99\n<end_of_turn>\"\"\"\nSYSTEM \"\"\"You answer in one line.\"\"\"\nPARAMETER temperature 0.6\nPARAMETER num_gpu 99\n\nPARAMETER stop \"<end_of_turn>\"\n# keep this comment\n";

#[test]
fn updating_a_modelfile_twice_changes_only_owned_lines() {
    let dir = tempfile::tempdir().unwrap();
    let mf = dir.path().join("Modelfile");
    std::fs::write(&mf, USER_MODELFILE).unwrap();
    let ex = &examples()[1];
    let args = ["emit", ex.to_str().unwrap(), "--write-modelfile", mf.to_str().unwrap()];
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "only --write-modelfile was asked for");
    assert!(stderr(&o).contains("updated"), "{}", stderr(&o));
    let once = std::fs::read_to_string(&mf).unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("Modelfile.bak")).unwrap(), USER_MODELFILE);
    check_ollama_rules(&once);
    // Line by line: only the owned PARAMETER lines differ, and two are added.
    let old: Vec<&str> = USER_MODELFILE.lines().collect();
    let new: Vec<&str> = once.lines().collect();
    assert_eq!(new.len(), old.len() + 2, "{once}");
    let mut added = Vec::new();
    let (mut i, mut j) = (0, 0);
    while j < new.len() {
        if i < old.len() && old[i] == new[j] {
            i += 1;
            j += 1;
        } else if i < old.len() && old[i] == "PARAMETER num_gpu 99" && new[j].starts_with("PARAMETER num_gpu ") {
            assert_eq!(new[j], "PARAMETER num_gpu 0");
            i += 1;
            j += 1;
        } else {
            added.push(new[j]);
            j += 1;
        }
    }
    assert_eq!(added, ["PARAMETER num_thread 2", "PARAMETER num_ctx 4096"]);
    assert!(once.contains("{{ .Prompt }}\nPARAMETER num_gpu 99\n<end_of_turn>"), "text inside TEMPLATE is not touched");

    let bak_before = std::fs::metadata(dir.path().join("Modelfile.bak")).unwrap().modified().unwrap();
    let o = run(&args);
    assert!(o.status.success());
    assert!(stderr(&o).contains("unchanged"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&mf).unwrap(), once, "the second update changes nothing");
    assert_eq!(std::fs::metadata(dir.path().join("Modelfile.bak")).unwrap().modified().unwrap(), bak_before);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(leftovers.len(), 2, "no temporary files: {leftovers:?}");
}

#[test]
fn a_missing_modelfile_is_created_with_a_from_line() {
    let dir = tempfile::tempdir().unwrap();
    let mf = dir.path().join("Modelfile");
    let ex = &examples()[0];
    let o = run(&["emit", ex.to_str().unwrap(), "--write-modelfile", mf.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&mf).unwrap();
    check_ollama_rules(&text);
    assert!(text.contains("FROM ") && text.contains("PARAMETER num_gpu 0"));
    assert!(!dir.path().join("Modelfile.bak").exists());
}

#[test]
fn the_llvmpipe_chart_shows_what_it_should() {
    let dir = tempfile::tempdir().unwrap();
    let svg_path = dir.path().join("chart.svg");
    let ex = examples().into_iter().find(|p| p.to_string_lossy().contains("vulkan")).unwrap();
    let o = run(&["emit", ex.to_str().unwrap(), "--chart", svg_path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for label in [
        "tg measured",
        "pp measured",
        "device memory measured",
        "tg model",
        "pp model",
        "device memory model",
        "cap 1843 MiB",
        "recommended ngl 0",
        "no knee",
        "ngl (layers on the GPU",
        "tokens per second",
        "device memory, MiB",
    ] {
        assert!(svg.contains(label), "chart lacks '{label}'");
    }
    let profile = read_json(&ex);
    let measured =
        profile["trials"].as_array().unwrap().iter().filter(|t| t["role"] != "threads" && t["status"] == "ok").count();
    // One circle per measured tg point, plus one in the legend.
    assert_eq!(svg.matches("<circle").count(), measured + 1, "tg markers");
    // Fitted/model lines are dashed: many short segments.
    assert!(svg.matches("<polyline").count() + svg.matches("<line").count() > 20);
}

#[test]
fn emit_takes_a_model_and_finds_its_profile_in_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 2);
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    let missing = run(&["emit", m.to_str().unwrap(), "--profiles", s]);
    assert_bad_input(&missing, "no profile of synth-2L.gguf for this machine");
    let t = run(&[m.to_str().unwrap(), "-p", "8", "-n", "4", "-r", "1", "--profiles", s, "-q"]);
    assert!(t.status.success(), "{}", stderr(&t));
    let o = run(&["emit", m.to_str().unwrap(), "--profiles", s, "--format", "llama-cpp"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("synth-2L.gguf -ngl 0 -t "), "{}", stdout(&o));
}

#[test]
fn emit_rejects_what_is_not_a_profile() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.json");
    std::fs::write(&p, "{not json").unwrap();
    assert_bad_input(&run(&["emit", p.to_str().unwrap()]), "is not JSON");
    std::fs::write(&p, r#"{"schema_version": 7}"#).unwrap();
    assert_bad_input(&run(&["emit", p.to_str().unwrap()]), "schema_version 7");
    assert_eq!(std::fs::read_to_string(&p).unwrap(), r#"{"schema_version": 7}"#, "never overwritten");
    assert_bad_input(&run(&["emit", "/nonexistent.json"]), "no such file");
}
