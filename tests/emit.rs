//! Every emit format against its snapshot, Ollama's Modelfile rules, the
//! in-place Modelfile update, and the chart. Refresh snapshots with
//! UPDATE_SNAPSHOTS=1 cargo test --release --features vulkan --test emit.
mod common;

use std::path::{Path, PathBuf};

use common::*;
use ngl_tune::consumer::ollama::modelfile;

const FORMATS: [&str; 8] =
    ["modelfile", "llama-cpp", "llama-server-env", "docker-env", "ollama-options", "json", "md", "csv"];

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

/// Ollama's Modelfile rules as far as ngl-tune's output goes, read with
/// the parser that follows Ollama's own: one FROM, known PARAMETER names,
/// integer values for the ones we set.
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
    let cmds = modelfile::parse(text).unwrap_or_else(|e| panic!("Ollama would reject it: {e:?}\n{text}"));
    assert_eq!(cmds.iter().filter(|c| c.name == "model" && !c.parameter).count(), 1, "exactly one FROM");
    for c in cmds.iter().filter(|c| c.parameter) {
        assert!(PARAMS.contains(&c.name.as_str()), "unknown parameter {} (Ollama rejects it)", c.name);
        if modelfile::OWNED.contains(&c.name.as_str()) {
            assert!(c.args.parse::<u32>().is_ok(), "{} needs an integer: {}", c.name, c.args);
        }
    }
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
    let _heavy = heavy();
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

/// systemd's EnvironmentFile= reader (src/basic/env-file.c,
/// parse_env_file_internal), for the forms ngl-tune writes: comments,
/// KEY=value, single and double quotes, backslash escapes.
fn systemd_env(text: &str) -> Vec<(String, String)> {
    #[derive(PartialEq)]
    enum S {
        PreKey,
        Key,
        PreValue,
        Value,
        ValueEscape,
        Single,
        Double,
        DoubleEscape,
        Comment,
    }
    let (mut out, mut key, mut value, mut state) = (Vec::new(), String::new(), String::new(), S::PreKey);
    let push = |k: &mut String, v: &mut String, out: &mut Vec<(String, String)>| {
        out.push((k.trim_end().to_string(), std::mem::take(v)));
        k.clear();
    };
    for c in text.chars() {
        state = match state {
            S::PreKey if c == '#' || c == ';' => S::Comment,
            S::PreKey if c.is_whitespace() => S::PreKey,
            S::PreKey => {
                key.push(c);
                S::Key
            }
            S::Key if c == '\n' => {
                key.clear();
                S::PreKey
            }
            S::Key if c == '=' => S::PreValue,
            S::Key => {
                key.push(c);
                S::Key
            }
            S::PreValue | S::Value if c == '\n' => {
                let trimmed = value.trim_end().to_string();
                value = if state == S::Value { trimmed } else { value };
                push(&mut key, &mut value, &mut out);
                S::PreKey
            }
            S::PreValue if c == '\'' => S::Single,
            S::PreValue if c == '"' => S::Double,
            S::PreValue | S::Value if c == '\\' => S::ValueEscape,
            S::PreValue if c == ' ' || c == '\t' => S::PreValue,
            S::PreValue | S::Value => {
                value.push(c);
                S::Value
            }
            S::ValueEscape => {
                if c != '\n' {
                    value.push(c);
                }
                S::Value
            }
            S::Single if c == '\'' => S::PreValue,
            S::Single => {
                value.push(c);
                S::Single
            }
            S::Double if c == '"' => S::PreValue,
            S::Double if c == '\\' => S::DoubleEscape,
            S::Double => {
                value.push(c);
                S::Double
            }
            S::DoubleEscape => {
                if "\"\\`$".contains(c) {
                    value.push(c);
                } else if c != '\n' {
                    value.push('\\');
                    value.push(c);
                }
                S::Double
            }
            S::Comment if c == '\n' => S::PreKey,
            S::Comment => S::Comment,
        };
    }
    if state != S::PreKey && state != S::Comment {
        push(&mut key, &mut value, &mut out);
    }
    out
}

/// docker run --env-file: one KEY=VALUE a line, everything after the first
/// '=' taken literally (quotes too), '#' lines and blank lines skipped.
fn docker_env(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim_start)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=VALUE");
            assert!(!k.contains(char::is_whitespace), "docker rejects a key with spaces: {k}");
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn server_env_survives_a_model_path_with_spaces_and_quotes_in_every_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let tricky = "/models/my models/it's \"q4\" $HOME `x` \\ b.gguf";
    let mut p = read_json(&examples()[0]);
    p["model"]["path"] = tricky.into();
    let prof = dir.path().join("p.json");
    std::fs::write(&prof, serde_json::to_string(&p).unwrap()).unwrap();
    let want = |pairs: &[(String, String)]| {
        let m = pairs.iter().find(|(k, _)| k == "LLAMA_ARG_MODEL").map(|(_, v)| v.clone());
        assert_eq!(m.as_deref(), Some(tricky), "{pairs:?}");
        assert!(pairs.iter().any(|(k, v)| k == "LLAMA_ARG_N_GPU_LAYERS" && v == "0"), "{pairs:?}");
    };

    let env = stdout(&run(&["emit", prof.to_str().unwrap(), "--format", "llama-server-env"]));
    want(&systemd_env(&env));
    // A POSIX shell reads the same file with set -a and `.`.
    let file = dir.path().join("server.env");
    std::fs::write(&file, &env).unwrap();
    let sh = std::process::Command::new("sh")
        .args(["-c", "set -a; . \"$1\"; printf '%s' \"$LLAMA_ARG_MODEL\"", "sh", file.to_str().unwrap()])
        .env_remove("LLAMA_ARG_MODEL")
        .output()
        .unwrap();
    assert!(sh.status.success(), "{}", String::from_utf8_lossy(&sh.stderr));
    assert_eq!(String::from_utf8_lossy(&sh.stdout), tricky, "sh reads {env}");

    let docker = stdout(&run(&["emit", prof.to_str().unwrap(), "--format", "docker-env"]));
    want(&docker_env(&docker));

    // A line break cannot travel in docker's format: refused, not mangled.
    p["model"]["path"] = "/models/a\nb.gguf".into();
    std::fs::write(&prof, serde_json::to_string(&p).unwrap()).unwrap();
    assert_bad_input(&run(&["emit", prof.to_str().unwrap(), "--format", "docker-env"]), "line break");
    let env = stdout(&run(&["emit", prof.to_str().unwrap(), "--format", "llama-server-env"]));
    assert_eq!(systemd_env(&env)[0].1, "/models/a\nb.gguf", "{env}");
}

#[test]
fn a_pinned_num_ctx_smaller_than_ollamas_default_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = read_json(&examples()[0]);
    // A 24 GiB card: Ollama's default context there is 32k.
    p["hardware"]["gpus"] = serde_json::json!([{
        "index": 0, "name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-1", "driver_version": "570.1",
        "memory_total": 25_757_220_864u64, "memory_free": 25_000_000_000u64,
        "pcie_gen_current": 4, "pcie_gen_max": 4, "pcie_width_current": 16, "pcie_width_max": 16,
        "memory_bus_width_bits": 384, "memory_clock_max_mhz": 10501, "bandwidth_gbs": 1008.0
    }]);
    p["model"]["ctx_train"] = 32768.into();
    let prof = dir.path().join("p.json");
    std::fs::write(&prof, serde_json::to_string(&p).unwrap()).unwrap();
    let o = run_env(&["emit", prof.to_str().unwrap()], &[("OLLAMA_NUM_PARALLEL", "1")]);
    assert!(o.status.success());
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("num_ctx 4096 pins the context below the 32768 tokens Ollama would give"), "{err}");
    let o = run_env(&["emit", prof.to_str().unwrap(), "--format", "ollama-options"], &[("OLLAMA_NUM_PARALLEL", "4")]);
    assert!(
        stderr(&o).contains("OLLAMA_NUM_PARALLEL=4 makes Ollama start llama-server with 4 x 4096 = 16384"),
        "{}",
        stderr(&o)
    );
    // Not for llama.cpp's own formats.
    let o = run(&["emit", prof.to_str().unwrap(), "--format", "llama-cpp"]);
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
}

/// Every Modelfile form, through `--write-modelfile` as a user runs it:
/// what Ollama would read afterwards is exactly the intended parameters,
/// every byte outside the owned values is the same, and what Ollama would
/// reject is refused (exit 2) with the file untouched.
#[test]
fn every_modelfile_form_round_trips_or_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let ex = examples()[1].clone();
    let want = [("num_gpu", "0"), ("num_thread", "2"), ("num_ctx", "4096")];
    let good: &[(&str, &[u8])] = &[
        ("stop-block", b"FROM x.gguf\nPARAMETER num_gpu 99\nPARAMETER stop \"\"\"\n<|im_end|>\n\"\"\"\n"),
        ("odd-quotes-comment", b"FROM x.gguf\n# Use \"\"\" for multi-line values\nPARAMETER num_gpu 99\n"),
        ("plain-quoted-lines", b"FROM x.gguf\nSYSTEM \"one\nPARAMETER num_gpu 5\ntwo\"\nPARAMETER num_gpu 9\n"),
        ("repeated", b"FROM x.gguf\nPARAMETER num_gpu 99\nPARAMETER num_gpu 12\n"),
        ("crlf", b"FROM x.gguf\r\nPARAMETER num_ctx 2048\r\n"),
        ("bom", b"\xef\xbb\xbfFROM x.gguf\nPARAMETER num_gpu 1\n"),
        ("no-final-newline", b"FROM x.gguf\nPARAMETER temperature 0.5"),
        ("blocks", b"FROM x.gguf\nTEMPLATE \"\"\"{{ .Prompt }}\nPARAMETER num_gpu 3\"\"\"\nLICENSE \"\"\"\nMIT\n\"\"\"\nMESSAGE user \"\"\"hi\n\"\"\"\nADAPTER ./l.gguf\nPARAMETER stop <a>\nPARAMETER stop <b>\n"),
    ];
    for (name, bytes) in good {
        let mf = dir.path().join(format!("{name}.Modelfile"));
        std::fs::write(&mf, bytes).unwrap();
        let o = run(&["emit", ex.to_str().unwrap(), "--write-modelfile", mf.to_str().unwrap()]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let new = std::fs::read(&mf).unwrap();
        let (old_text, new_text) = (String::from_utf8_lossy(bytes), String::from_utf8_lossy(&new));
        let strip = |s: &str| s.trim_start_matches('\u{feff}').to_string();
        let (old_cmds, new_cmds) =
            (modelfile::parse(&strip(&old_text)).unwrap(), modelfile::parse(&strip(&new_text)).unwrap());
        let params = modelfile::parameters(&new_cmds);
        for (k, v) in want {
            let got = params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            assert_eq!(got, Some(vec![v.to_string()]), "{name}: {k} in {new_text}");
        }
        // Everything that is not an owned parameter reads the same, in order.
        let others = |cs: &[modelfile::Command]| -> Vec<(String, String)> {
            cs.iter()
                .filter(|c| !(c.parameter && modelfile::OWNED.contains(&c.name.as_str())))
                .map(|c| (c.name.clone(), c.args.clone()))
                .collect()
        };
        assert_eq!(others(&old_cmds), others(&new_cmds), "{name}");
        // Byte for byte: the old file is the new one with the owned values
        // put back and the added lines taken out.
        let mut back = new_text.to_string();
        for (k, v) in want {
            let line = format!("PARAMETER {k} {v}");
            if !old_cmds.iter().any(|c| c.parameter && c.name == k) {
                let eol = if back.contains("\r\n") { "\r\n" } else { "\n" };
                back = back.replacen(&format!("{line}{eol}"), "", 1);
            }
        }
        let old_owned: Vec<&modelfile::Command> =
            old_cmds.iter().filter(|c| c.parameter && modelfile::OWNED.contains(&c.name.as_str())).collect();
        let restored = {
            let b = strip(&back);
            let cmds = modelfile::parse(&b).unwrap();
            let mut s = b.clone();
            let owned: Vec<&modelfile::Command> =
                cmds.iter().filter(|c| c.parameter && modelfile::OWNED.contains(&c.name.as_str())).collect();
            assert_eq!(owned.len(), old_owned.len(), "{name}");
            for (n, o) in owned.iter().zip(&old_owned).rev() {
                s.replace_range(n.value.clone(), &strip(&old_text)[o.value.clone()]);
            }
            s
        };
        let trailing_fix = |s: String| if old_text.ends_with('\n') { s } else { s.trim_end_matches('\n').to_string() };
        assert_eq!(trailing_fix(restored), strip(&old_text), "{name}: only the owned values changed");
        assert_eq!(std::fs::read(dir.path().join(format!("{name}.Modelfile.bak"))).unwrap(), *bytes, "{name}");
    }
    // UTF-16 with a byte-order mark: Ollama reads it, so it is updated and stays UTF-16.
    let utf16: Vec<u8> = [0xff, 0xfe]
        .into_iter()
        .chain("FROM x.gguf\nPARAMETER num_gpu 7\n".encode_utf16().flat_map(u16::to_le_bytes))
        .collect();
    let mf = dir.path().join("utf16.Modelfile");
    std::fs::write(&mf, &utf16).unwrap();
    let o = run(&["emit", ex.to_str().unwrap(), "--write-modelfile", mf.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&mf).unwrap();
    assert_eq!(&bytes[..2], [0xff, 0xfe]);
    let units: Vec<u16> = bytes[2..].chunks_exact(2).map(|p| u16::from_le_bytes([p[0], p[1]])).collect();
    assert_eq!(
        String::from_utf16(&units).unwrap(),
        "FROM x.gguf\nPARAMETER num_gpu 0\nPARAMETER num_thread 2\nPARAMETER num_ctx 4096\n"
    );

    let bad: &[(&str, &[u8], &str)] = &[
        ("no-value", b"FROM x.gguf\nPARAMETER num_gpu\n", "line 2: PARAMETER num_gpu has no value"),
        ("unterminated", b"FROM x.gguf\nSYSTEM \"\"\"open\n", "line 2: the quoted value of SYSTEM is never closed"),
        ("case", b"FROM x.gguf\nPARAMETER NUM_GPU 12\n", "line 2: PARAMETER NUM_GPU is not num_gpu"),
        ("misnamed", b"FROM x.gguf\nPARAMETER num_gpu_layers 12\n", "its name is num_gpu"),
        ("utf16-no-bom", b"F\0R\0O\0M\0 \0x\0\n\0", "UTF-16 without a byte-order mark"),
        ("no-from", b"PARAMETER num_gpu 1\n", "no FROM line"),
    ];
    for (name, bytes, needle) in bad {
        let mf = dir.path().join(format!("{name}.bad"));
        std::fs::write(&mf, bytes).unwrap();
        assert_bad_input(&run(&["emit", ex.to_str().unwrap(), "--write-modelfile", mf.to_str().unwrap()]), needle);
        assert_eq!(std::fs::read(&mf).unwrap(), *bytes, "{name}: untouched");
        assert!(!dir.path().join(format!("{name}.bad.bak")).exists(), "{name}: nothing written");
    }
}

/// A profile whose answer at 32k is a quantized KV cache, and one whose
/// answer is FFN weights on the CPU: each consumer gets it where it takes it.
#[test]
fn a_hatch_goes_where_each_consumer_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let ex = examples().into_iter().find(|p| p.to_string_lossy().contains("llvmpipe")).unwrap();
    let base = read_json(&ex);
    let with = |edit: &dyn Fn(&mut serde_json::Value), name: &str| {
        let mut p = base.clone();
        edit(&mut p["recommendation"]);
        let path = dir.path().join(name);
        std::fs::write(&path, serde_json::to_string(&p).unwrap()).unwrap();
        assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
        path
    };
    let kv = with(
        &|r| {
            r["n_gpu_layers"] = 19.into();
            r["kv_type"] = "q8_0".into();
            r["ollama_server_env"] = serde_json::json!(["OLLAMA_KV_CACHE_TYPE=q8_0", "OLLAMA_FLASH_ATTENTION=1"]);
        },
        "kv.json",
    );
    let emit = |p: &Path, f: &str| {
        let o = run(&["emit", p.to_str().unwrap(), "--format", f]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    assert!(emit(&kv, "llama-cpp").contains("-ngl 19 -t 2 -c 4096 -ctk q8_0 -ctv q8_0 -fa on"));
    let env = emit(&kv, "llama-server-env");
    for line in ["LLAMA_ARG_CACHE_TYPE_K=q8_0", "LLAMA_ARG_CACHE_TYPE_V=q8_0", "LLAMA_ARG_FLASH_ATTN=on"] {
        assert!(env.lines().any(|l| l == line), "{line} in {env}");
    }
    let mf = emit(&kv, "modelfile");
    assert!(mf.contains("# set on the Ollama server, not here") && mf.contains("OLLAMA_KV_CACHE_TYPE=q8_0"), "{mf}");
    assert!(mf.contains("PARAMETER num_gpu 19"), "Ollama runs it fully offloaded with the server setting: {mf}");
    check_ollama_rules(&mf);

    let ffn = with(
        &|r| {
            r["n_gpu_layers"] = 19.into();
            r["n_cpu_ffn"] = 3.into();
            r["ollama_num_gpu"] = 12.into();
        },
        "ffn.json",
    );
    let pattern = r"blk\.(0|1|2)\.ffn_(up|down|gate)\.weight=CPU";
    assert!(emit(&ffn, "llama-cpp").contains(&format!("-ot '{pattern}'")), "{}", emit(&ffn, "llama-cpp"));
    let env = emit(&ffn, "llama-server-env");
    // Double-quoted with backslashes escaped: what systemd and sh both undo.
    let quoted = format!("LLAMA_ARG_OVERRIDE_TENSOR=\"{}\"", pattern.replace('\\', "\\\\"));
    assert!(env.lines().any(|l| l == quoted), "{quoted} in {env}");
    let docker = emit(&ffn, "docker-env");
    assert!(docker.lines().any(|l| l == format!("LLAMA_ARG_OVERRIDE_TENSOR={pattern}")), "{docker}");
    let mf = emit(&ffn, "modelfile");
    assert!(mf.contains("PARAMETER num_gpu 12") && mf.contains("Ollama has no tensor overrides"), "{mf}");
    // The faster placement under Ollama: the override server-wide, with its own num_gpu, said so.
    let server = format!("LLAMA_ARG_OVERRIDE_TENSOR='{pattern}' in the Ollama server's environment");
    assert!(mf.contains(&server) && mf.contains("every model the server runs gets it"), "{mf}");
    assert!(mf.contains("and PARAMETER num_gpu 19 here"), "the pair that was measured: {mf}");
    check_ollama_rules(&mf);
}

#[test]
fn a_split_goes_where_each_consumer_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let ex = examples().into_iter().find(|p| p.to_string_lossy().contains("llvmpipe")).unwrap();
    let mut p = read_json(&ex);
    let r = &mut p["recommendation"];
    r["n_gpu_layers"] = 41.into();
    r["rpc"] = serde_json::json!(["10.0.0.2:50052", "10.0.0.3:50052"]);
    r["tensor_split"] = serde_json::json!([9, 13, 19]);
    r["ollama_num_gpu"] = 19.into();
    assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
    let path = dir.path().join("split.json");
    std::fs::write(&path, serde_json::to_string(&p).unwrap()).unwrap();
    let emit = |f: &str| {
        let o = run(&["emit", path.to_str().unwrap(), "--format", f]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let line = emit("llama-cpp");
    assert!(
        line.contains("--rpc 10.0.0.2:50052,10.0.0.3:50052 -ngl 41") && line.contains("-sm layer -ts 9,13,19 -mg 0"),
        "{line}"
    );
    // What llama.cpp's parser would read back: bench runs the same flags.
    let flags = line.split_once(".gguf'").or_else(|| line.split_once(".gguf")).unwrap().1;
    let a = ngl_tune::placement::args::parse_placement(flags.trim()).unwrap();
    assert_eq!((a.rpc.len(), a.tensor_split, a.n_gpu_layers, a.main_gpu), (2, vec![9, 13, 19], 41, 0));
    let env = emit("llama-server-env");
    for want in [
        "LLAMA_ARG_RPC=\"10.0.0.2:50052,10.0.0.3:50052\"",
        "LLAMA_ARG_SPLIT_MODE=\"layer\"",
        "LLAMA_ARG_TENSOR_SPLIT=\"9,13,19\"",
        "LLAMA_ARG_MAIN_GPU=\"0\"",
    ] {
        let bare = want.replace('"', "");
        assert!(env.lines().any(|l| l == want || l == bare), "{want} in {env}");
    }
    let docker = emit("docker-env");
    assert!(docker.lines().any(|l| l == "LLAMA_ARG_TENSOR_SPLIT=9,13,19"), "{docker}");
    let mf = emit("modelfile");
    assert!(mf.contains("PARAMETER num_gpu 19") && mf.contains("Ollama cannot use them"), "{mf}");
    check_ollama_rules(&mf);
}
