mod common;

use std::time::Instant;

use common::*;

fn json_rows(o: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(o.status.success(), "exit {:?}: {}", o.status, stderr(o));
    let v: serde_json::Value = serde_json::from_str(&stdout(o)).expect("valid JSON on stdout");
    v.as_array().expect("a JSON array").clone()
}

#[test]
fn synthetic_40_layers_bench_json_has_llama_bench_fields() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 40);
    let t0 = Instant::now();
    let o = run(&[
        "bench",
        m.to_str().unwrap(),
        "-ngl",
        "0,10,99",
        "-p",
        "32",
        "-n",
        "8",
        "-r",
        "2",
        "-t",
        "2",
        "-o",
        "json",
    ]);
    let rows = json_rows(&o);
    eprintln!("40-layer bench of 3 settings took {:?}", t0.elapsed());
    assert_eq!(rows.len(), 6, "a pp and a tg row per ngl");
    for (i, r) in rows.iter().enumerate() {
        for f in [
            "n_gpu_layers",
            "n_prompt",
            "n_gen",
            "avg_ts",
            "stddev_ts",
            "samples_ts",
            "samples_ns",
            "avg_ns",
            "n_threads",
            "n_batch",
            "n_ubatch",
            "flash_attn",
            "model_type",
            "test_time",
        ] {
            assert!(r.get(f).is_some(), "row {i} lacks {f}: {r}");
        }
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
        let s: Vec<f64> = r["samples_ts"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let mean = s.iter().sum::<f64>() / s.len() as f64;
        assert!((mean - r["avg_ts"].as_f64().unwrap()).abs() < 1e-6 * mean, "avg_ts is the mean of samples_ts");
        assert_eq!(r["n_threads"], 2);
    }
    let ngls: Vec<u64> = rows.iter().map(|r| r["n_gpu_layers"].as_u64().unwrap()).collect();
    assert_eq!(ngls, vec![0, 0, 10, 10, 99, 99]);
    assert_eq!((rows[0]["n_prompt"].as_u64(), rows[0]["n_gen"].as_u64()), (Some(32), Some(0)));
    assert_eq!((rows[1]["n_prompt"].as_u64(), rows[1]["n_gen"].as_u64()), (Some(0), Some(8)));
}

#[test]
fn output_formats_md_csv_jsonl() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 2);
    let m = m.to_str().unwrap();
    let base = ["bench", m, "-ngl", "0", "-p", "8", "-n", "4", "-r", "1", "-t", "1"];

    let md = run(&[&base[..], &["-o", "md"]].concat());
    assert!(md.status.success(), "{}", stderr(&md));
    let t = stdout(&md);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 4, "{t}");
    assert!(lines[0].starts_with("| model |") && lines[0].contains("| t/s |"), "{t}");
    assert!(lines[2].contains("| pp8 |") && lines[3].contains("| tg4 |"), "{t}");

    let csv = run(&[&base[..], &["-o", "csv"]].concat());
    let t = stdout(&csv);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 3, "{t}");
    let header: Vec<&str> = lines[0].split(',').collect();
    assert!(header.contains(&"avg_ts") && header.contains(&"n_gpu_layers") && header.contains(&"stddev_ts"));
    assert_eq!(lines[1].matches("\",\"").count() + 1, header.len(), "every field quoted once");

    let jl = run(&[&base[..], &["-o", "jsonl"]].concat());
    let t = stdout(&jl);
    let rows: Vec<serde_json::Value> = t.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["n_gen"], 4);
}

#[test]
fn llama_log_stays_off_the_terminal_unless_verbose() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 2);
    let m = m.to_str().unwrap();
    let quiet = run(&["bench", m, "-ngl", "0", "-p", "8", "-n", "0", "-r", "1", "-q"]);
    assert!(quiet.status.success());
    assert!(!stderr(&quiet).contains("llama_model_loader"), "{}", stderr(&quiet));
    let loud = run(&["bench", m, "-ngl", "0", "-p", "8", "-n", "0", "-r", "1", "-q", "-v"]);
    assert!(loud.status.success());
    assert!(stderr(&loud).contains("llama_model_loader"), "verbose shows llama.cpp's log");
}

#[test]
fn a_crashing_trial_is_a_failed_row_and_the_others_are_measured() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 4);
    let m = m.to_str().unwrap();
    for (fault, signal) in [("abort@2", "SIGABRT"), ("segv@2", "SIGSEGV")] {
        let o = run_env(
            &["bench", m, "-ngl", "0,2,5", "-p", "8", "-n", "4", "-r", "1", "-o", "json"],
            &[("NGL_TUNE_TEST_FAULT", fault)],
        );
        let rows = json_rows(&o);
        assert_eq!(rows.len(), 6, "{rows:?}");
        let status: Vec<&str> = rows.iter().map(|r| r["status"].as_str().unwrap()).collect();
        assert_eq!(status, ["ok", "ok", "crashed", "crashed", "ok", "ok"], "{fault}");
        let reason = rows[2]["reason"].as_str().unwrap();
        assert!(reason.contains(signal), "{fault}: {reason}");
        assert!(reason.contains("injecting test fault"), "the last stderr line is kept: {reason}");
        assert!(rows[2]["avg_ts"].is_null());
        assert!(stderr(&o).contains("1 of 3 trials did not complete"));
    }
}

#[test]
fn a_hanging_trial_is_killed_at_its_timeout() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 2);
    let t0 = Instant::now();
    let o = run_env(
        &[
            "bench",
            m.to_str().unwrap(),
            "-ngl",
            "0,1",
            "-p",
            "8",
            "-n",
            "0",
            "-r",
            "1",
            "-o",
            "json",
            "--trial-timeout",
            "3",
        ],
        &[("NGL_TUNE_TEST_FAULT", "hang@1")],
    );
    let rows = json_rows(&o);
    assert_eq!(rows[0]["status"], "ok");
    assert_eq!(rows[1]["status"], "timeout");
    assert!(rows[1]["reason"].as_str().unwrap().contains("3s trial timeout"));
    assert!(t0.elapsed().as_secs() < 60);
}

#[test]
fn bad_workload_options_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 2);
    let m = m.to_str().unwrap();
    assert_bad_input(&run(&["bench", m, "-t", "0"]), "-t 0");
    assert_bad_input(&run(&["bench", m, "-p", "0", "-n", "0"]), "nothing to measure");
    assert_bad_input(&run(&["bench", m, "-ngl", "10-"]), "has no end");
    assert_bad_input(&run(&["bench", m, "-ngl", "5-1"]), "ends before it starts");
    assert_bad_input(&run(&["bench", m, "-ngl", "a"]), "not a number");
    // A device llama.cpp does not have here: named, with the ones it has.
    assert_bad_input(
        &run(&["bench", m, "--llama-args", "--device Nope7 -ngl 3", "-p", "0", "-n", "1"]),
        "Nope7 is not one",
    );
    let usage = run(&["bench", m, "-o", "xml"]);
    assert_eq!(usage.status.code(), Some(2));
}

#[test]
fn real_model_bench_json() {
    let _heavy = heavy();
    let m = real_model();
    let o =
        run(&["bench", m.to_str().unwrap(), "-ngl", "0", "-p", "32", "-n", "8", "-r", "2", "-t", "2", "-o", "json"]);
    let rows = json_rows(&o);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["model_type"], "gemma3 268M Q4_K_M");
    assert!(rows.iter().all(|r| r["status"] == "ok" && r["avg_ts"].as_f64().unwrap() > 0.0));
}

#[test]
fn the_kv_cache_holds_d_tokens_before_each_test_as_llama_bench_does() {
    let _heavy = heavy();
    // tg at 8192 tokens of cache against an empty one, on a small llama
    // model without sliding-window attention (its attention over the cache
    // then dwarfs its weights): 25-45 times slower on these machines, far
    // beyond any noise. (gemma-3-270m attends to a 512-token window in five
    // layers of six: 5% to a third slower, by the CPU.)
    let dir = tempfile::tempdir().unwrap();
    let small_llama = dir.path().join("llama-4L-ctx16k.gguf");
    let spec = ngl_tune::synth::SynthSpec::default().with_n_layer(4).with_dims(256, 512, 4).with_ctx_train(16384);
    ngl_tune::synth::write_model(&small_llama, &spec).unwrap();
    let d = small_llama.to_str().unwrap();
    let o = run(&["bench", d, "-ngl", "0", "-p", "0", "-n", "32", "-r", "2", "-t", "2", "-d", "0,8192", "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = json_rows(&o);
    let tg = |d: u64| {
        let r =
            rows.iter().find(|r| r["n_depth"] == d && r["n_gen"] == 32).unwrap_or_else(|| panic!("d {d}: {rows:?}"));
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["n_ctx"], 32 + d, "the context sized as llama-bench does: {r}");
        r["avg_ts"].as_f64().unwrap()
    };
    let (empty, deep) = (tg(0), tg(8192));
    assert!(deep < 0.5 * empty, "tg at depth 8192 ({deep:.2}) is not slower than at 0 ({empty:.2})");
    // n_depth in every format.
    let m = real_model();
    let m = m.to_str().unwrap();
    let small = ["bench", m, "-ngl", "0", "-p", "8", "-n", "4", "-r", "1", "-t", "2", "-d", "64"];
    let md = run(&[&small[..], &["-o", "md"]].concat());
    assert!(stdout(&md).contains("tg4 @ d64") && stdout(&md).contains("pp8 @ d64"), "{}", stdout(&md));
    let csv = stdout(&run(&[&small[..], &["-o", "csv"]].concat()));
    // RFC 4180 cells: a quoted cell may hold commas ("Vulkan,CPU").
    let cells = |line: &str| {
        let (mut v, mut cur, mut quoted) = (Vec::new(), String::new(), false);
        for ch in line.chars() {
            match ch {
                '"' => quoted = !quoted,
                ',' if !quoted => v.push(std::mem::take(&mut cur)),
                c => cur.push(c),
            }
        }
        v.push(cur);
        v
    };
    let header = cells(csv.lines().next().unwrap());
    let col = header.iter().position(|h| h == "n_depth").expect("an n_depth column");
    assert!(csv.lines().skip(1).all(|l| cells(l)[col] == "64"), "{csv}");
    let jsonl = stdout(&run(&[&small[..], &["-o", "jsonl"]].concat()));
    assert!(jsonl.lines().all(|l| l.contains("\"n_depth\":64")), "{jsonl}");
    // A depth the context cannot hold is refused before anything runs.
    assert_bad_input(&run(&["bench", m, "-c", "2048", "-d", "4096"]), "-d 4096 leaves no room in -c 2048");
}

/// A recurrent model (synthetic mamba: state-space layers, no KV cache to
/// trim) runs at depth: each repetition clears the memory and loads the
/// filled sequence's saved state, as llama-bench does. Trimming the cache
/// past the depth (the way before, `NGL_TUNE_DEPTH_TRIM=1`) is refused by
/// recurrent memory, and the row says so.
#[test]
fn a_recurrent_model_runs_at_depth_as_llama_bench_restores_it() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("mamba.gguf");
    let spec = ngl_tune::synth::SynthSpec::default().with_n_layer(4).with_mamba(true).with_q8_0(true);
    ngl_tune::synth::write_model(&m, &spec).unwrap();
    let args = ["bench", m.to_str().unwrap(), "-p", "16", "-n", "8", "-r", "3", "-d", "64", "-o", "json", "-q"];
    let rows = json_rows(&run(&args));
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!((r["n_depth"].as_u64(), r["samples_ts"].as_array().map(Vec::len)), (Some(64), Some(3)), "{r}");
    }
    let trimmed = run_env(&args, &[("NGL_TUNE_DEPTH_TRIM", "1")]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&trimmed)).unwrap();
    assert!(
        v.as_array().unwrap().iter().all(|r| r["status"] != "ok"
            && r["reason"].as_str().is_some_and(|x| x.contains("could not trim the KV cache back to depth 64"))),
        "{v}"
    );
}

/// The model as its own draft, greedily: the target accepts every drafted
/// token (both compute the same next token on the same text), so each
/// verifying batch yields the draft's 3 and its own, and both runs
/// generate the same tokens. Speeds are reported paired, not judged.
#[test]
fn a_model_drafting_for_itself_is_accepted_whole_and_paired() {
    let _heavy = heavy();
    let m = real_model();
    let m = m.to_str().unwrap();
    let o = run(&["bench", m, "--draft", m, "-ngl", "0", "-d", "64", "-n", "12", "-r", "2", "-t", "2", "-o", "json"]);
    let rows = json_rows(&o);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert!(r["acceptance"].as_f64().unwrap() > 0.9, "{r}");
    assert!(r["tokens_per_verify"].as_f64().unwrap() > 3.5, "{r}");
    assert_eq!(r["same_prefix"], 12, "{r}");
    assert_eq!(r["run"]["spec_ns"].as_array().unwrap().len(), 2, "{r}");
    let [m, lo, hi] = [0, 1, 2].map(|i| r["ratio"][i].as_f64().unwrap());
    assert!(lo <= m && m <= hi && lo > 0.0, "{r}");
    assert!(r["tg_ts"].as_f64().unwrap() > 0.0 && r["tg_draft_ts"].as_f64().unwrap() > 0.0, "{r}");
}

/// A model's own MTP heads (`--mtp`): drafted with through llama.cpp's
/// draft-mtp loop in one load, paired with the model without them; the
/// heads' random weights draft tokens the target rarely takes, which is
/// not the test's to judge. A model without heads is exit 2.
#[test]
fn mtp_heads_draft_in_one_load_and_a_model_without_them_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth_mtp(dir.path());
    let m = m.to_str().unwrap();
    let o = run(&["bench", m, "--mtp", "-ngl", "0", "-d", "64", "-n", "8", "-r", "2", "-t", "2", "-o", "json"]);
    let rows = json_rows(&o);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert_eq!(r["draft"], "MTP heads", "{r}");
    assert!(r["run"]["n_rounds"].as_u64().unwrap() > 0 && r["run"]["n_drafted"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["same_prefix"], 8, "greedy both ways: the same tokens, {r}");
    let [m_, lo, hi] = [0, 1, 2].map(|i| r["ratio"][i].as_f64().unwrap());
    assert!(lo <= m_ && m_ <= hi && lo > 0.0, "{r}");
    // The line's form reads back the same run.
    let line = run(&[
        "bench",
        m,
        "--llama-args",
        "-ngl 0 --spec-type draft-mtp",
        "-n",
        "4",
        "-d",
        "64",
        "-r",
        "1",
        "-o",
        "json",
    ]);
    assert_eq!(json_rows(&line)[0]["draft"], "MTP heads");
    let plain = synth(dir.path(), 2);
    assert_bad_input(&run(&["bench", plain.to_str().unwrap(), "--mtp", "-n", "4", "-r", "1"]), "has no MTP heads");
    assert_bad_input(&run(&["bench", m, "--mtp", "--draft-ngl", "1"]), "drop --draft-ngl");
    assert_bad_input(&run(&["bench", m, "--mtp", "--draft", m]), "one draft at a time");
}

#[test]
fn a_draft_that_does_not_suit_the_model_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let other = synth(dir.path(), 2);
    let m = real_model();
    let o = run(&["bench", m.to_str().unwrap(), "--draft", other.to_str().unwrap(), "-n", "4", "-r", "1"]);
    assert_bad_input(&o, "vocabulary does not match");
    assert_bad_input(&run(&["bench", m.to_str().unwrap(), "--draft-ngl", "3"]), "give it with --draft MODEL");
    assert_bad_input(&run(&["bench", m.to_str().unwrap(), "--draft", "/nonexistent.gguf"]), "no such file");
    let line = run(&["bench", m.to_str().unwrap(), "--llama-args", "-md d.gguf --spec-type draft-mtp"]);
    assert_bad_input(&line, "draft-simple");
}
