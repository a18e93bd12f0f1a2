//! The nightly scripts say what the README promises.
mod common;
use common::heavy;
use std::path::Path;

fn read(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/nightly").join(name)).unwrap()
}

#[test]
fn systemd_units_run_reprofile_nightly_at_low_priority() {
    let svc = read("ngl-tune-reprofile.service");
    for needle in [
        "Type=oneshot",
        "ExecStart=/usr/local/bin/ngl-tune reprofile",
        "Nice=19",
        "IOSchedulingClass=idle",
        "NGL_TUNE_PROFILES=",
    ] {
        assert!(svc.contains(needle), "service lacks {needle}");
    }
    let timer = read("ngl-tune-reprofile.timer");
    for needle in ["OnCalendar=*-*-* 03:00:00", "RandomizedDelaySec=2h", "Persistent=true", "WantedBy=timers.target"] {
        assert!(timer.contains(needle), "timer lacks {needle}");
    }
    if let Ok(out) = std::process::Command::new("systemd-analyze")
        .args(["verify", "ngl-tune-reprofile.service", "ngl-tune-reprofile.timer"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/nightly"))
        .output()
    {
        let err = String::from_utf8_lossy(&out.stderr);
        // The binary is not installed here; anything else is a unit-file error.
        let problems: Vec<&str> =
            err.lines().filter(|l| !l.contains("/usr/local/bin/ngl-tune") && !l.trim().is_empty()).collect();
        assert!(problems.is_empty(), "{problems:?}");
    }
}

#[test]
fn the_cron_line_is_one_valid_entry() {
    let cron = read("crontab");
    let lines: Vec<&str> = cron.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1);
    let fields: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(&fields[..5], ["0", "3", "*", "*", "*"]);
    let cmd = fields[5..].join(" ");
    assert!(cmd.contains("ngl-tune reprofile") && cmd.contains("nice -n 19") && cmd.contains("ionice -c 3"));
    assert!(!cmd.replace("\\%", "").contains('%'), "cron needs % escaped");
}

#[test]
fn the_kubernetes_example_targets_gpu_nodes_and_a_shared_store() {
    let y = read("k8s-cronjob.yaml");
    for needle in [
        "kind: CronJob",
        "concurrencyPolicy: Forbid",
        "nodeSelector:",
        "nvidia.com/gpu.product:",
        "nvidia.com/gpu: 1",
        "\"reprofile\"",
        "\"--profiles\", \"/store\"",
        "ReadWriteMany",
        "/etc/machine-id",
    ] {
        assert!(y.contains(needle), "k8s example lacks {needle}");
    }
}

#[test]
fn gpu_check_runs_in_local_mode_and_reports_regret() {
    let _heavy = heavy();
    let out = tempfile::tempdir().unwrap();
    let o = std::process::Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-check"))
        .args(["--local", "--out", out.path().to_str().unwrap(), "--bin", env!("CARGO_BIN_EXE_ngl-tune")])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    for model in ["small", "mid"] {
        for cap in ["cap budget", "cap target"] {
            assert!(report.contains(&format!("## {model}: ")) && report.contains(cap), "{report}");
        }
    }
    // On llvmpipe offloading only hurts: the brute force's best under every cap is ngl 0.
    assert_eq!(report.matches("- brute force: best under the cap ngl 0").count(), 4, "{report}");
    assert_eq!(report.matches("- adaptive: ngl ").count(), 4, "{report}");
    assert_eq!(report.matches("- grid: ngl ").count(), 4, "{report}");
    assert_eq!(report.matches("- llama.cpp's fit").count(), 4, "{report}");
    // At the tuner's depth, and against what llama.cpp does without flags.
    assert_eq!(report.matches(", at depth 128").count(), 4, "{report}");
    assert!(report.matches("- against llama.cpp's default, adaptive").count() >= 1, "{report}");
    assert!(report
        .lines()
        .filter(|l| l.starts_with("- adaptive") || l.starts_with("- grid"))
        .all(|l| l.contains("regret ")));
    let raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("raw.json")).unwrap()).unwrap();
    assert_eq!(
        raw["small.bench"].as_array().unwrap().len(),
        2 * 6,
        "every ngl of the 4-layer model (0 to 5), pp and tg"
    );
    assert_eq!(raw["mid.budget.adaptive"]["search"]["mode"], "adaptive");
    // The long-context run: f16 full offload cannot fit under the budget, the hatches are measured.
    assert!(report.contains("## small-long.gguf at 4096 context"), "{report}");
    assert!(report.contains("- full offload with an f16 KV cache fits: False"), "{report}");
    assert!(report.contains("- kv_cache ") && report.contains("-ctk q8_0"), "{report}");
    assert_eq!(report.matches("(recommended)").count(), 1, "{report}");
    assert_eq!(raw["small.placement"]["placements"][0]["fits_fully"], false);
    let files: Vec<_> = std::fs::read_dir(out.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(files.len() <= 8, "few files travel back from a GPU machine: {files:?}");
}

/// Sized for a short lease: `--models`, `--searches` and `--no-placement`
/// run only what they name, and a `--deadline` that leaves no time cuts
/// every step yet still writes a report that names what was cut.
#[test]
fn gpu_check_runs_only_what_it_is_asked_and_reports_what_a_deadline_cut() {
    let _heavy = heavy();
    let run = |extra: &[&str]| {
        let out = tempfile::tempdir().unwrap();
        let o = std::process::Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-check"))
            .args(["--local", "--out", out.path().to_str().unwrap(), "--bin", env!("CARGO_BIN_EXE_ngl-tune")])
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
        let raw: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.path().join("raw.json")).unwrap()).unwrap();
        (report, raw)
    };
    let (report, raw) = run(&["--models", "small", "--searches", "adaptive", "--no-placement"]);
    assert_eq!(report.matches("- adaptive: ngl ").count(), 2, "{report}");
    assert!(!report.contains("- grid: ") && !report.contains("## mid") && !report.contains("context, cap"), "{report}");
    assert!(raw.get("small.budget.adaptive").is_some() && raw.get("small.budget.grid").is_none(), "{raw}");
    assert!(!report.contains("Cut short"), "{report}");

    let (report, raw) = run(&["--models", "small", "--deadline", "0"]);
    assert!(report.contains("## Cut short") && report.contains("- small brute"), "{report}");
    assert!(report.contains("- small placement"), "{report}");
    assert!(raw.get("small.bench").is_none(), "{raw}");

    let o = std::process::Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-check"))
        .args(["--local", "--models", "huge", "--bin", env!("CARGO_BIN_EXE_ngl-tune")])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--models names none"));
}

/// The truth table's CI cell: a tiny model on the GPU-like rig (an
/// rpc-server of a memory size as the device, the host in a CPU quota) at
/// an ample and a tight device. What no noise can flip: the tune's answer
/// is measured by the brute force and under the cap in both cells; a
/// default over the cap is reported as such and never the answer.
#[test]
fn the_truth_tables_ci_cell_answers_under_the_cap() {
    let _heavy = heavy();
    let out = tempfile::tempdir().unwrap();
    let o = std::process::Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/truth"))
        .args(["--cells", "ci", "--out", out.path().to_str().unwrap(), "--bin", env!("CARGO_BIN_EXE_ngl-tune")])
        .args(["-p", "16", "-n", "8", "-r", "2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("truth.json")).unwrap()).unwrap();
    let cells = t["table"].as_array().unwrap();
    assert_eq!(cells.len(), 2, "{t}");
    let run = &t["runs"][0];
    assert!(run["regime"]["speedup"].as_f64().is_some(), "the regime is measured: {run}");
    for c in cells {
        assert!(c["best"].is_object(), "something fits: {c}");
        let tune = &c["answers"][0];
        assert_eq!(tune["label"], "tune");
        assert_eq!(tune["measured"], true, "{c}");
        assert_eq!(tune["under_cap"], true, "the answer is under the cap: {c}");
        // Both baselines, each as the tune paired it: one over the cap is reported as such.
        let labels: Vec<&str> = c["answers"].as_array().unwrap().iter().filter_map(|a| a["label"].as_str()).collect();
        assert_eq!(labels, ["tune", "llama.cpp's default", "Ollama's own run"], "{c}");
        for d in c["answers"].as_array().unwrap()[1..].iter().filter(|d| d["under_cap"] == false) {
            assert_eq!(d["over_cap_reported"], true, "a baseline over the cap is reported as such: {d}");
        }
        // Every ngl with the cell's base cache; a quantized cache the tune tried is brute-forced
        // beside it (at the ngl the tune tried it), so the rows are not one an ngl.
        let brute = c["brute"].as_array().unwrap();
        let whole = |b: &&serde_json::Value| b["n_cpu_moe"] == 0 && b["n_cpu_ffn"] == 0;
        let f16: Vec<u64> =
            brute.iter().filter(whole).filter(|b| b["kv"] == "f16").map(|b| b["ngl"].as_u64().unwrap()).collect();
        assert_eq!(f16, (0..=c["n_layer_full"].as_u64().unwrap()).collect::<Vec<_>>(), "every ngl: {c}");
        // Where full offload does not fit, every FFN spill at full offload (f16), as the tune may try.
        let spills: Vec<u64> = brute.iter().map(|b| b["n_cpu_ffn"].as_u64().unwrap()).filter(|k| *k > 0).collect();
        let want: Vec<u64> =
            if c["cell"] == "tight" { (1..c["n_layer_full"].as_u64().unwrap()).collect() } else { vec![] };
        assert_eq!(spills, want, "every FFN spill where the cell is tight: {c}");
        let tried: Vec<&serde_json::Value> = c["tune_trials_detail"].as_array().unwrap().iter().collect();
        for b in brute.iter().filter(whole).filter(|b| b["kv"] != "f16") {
            assert!(
                tried.iter().any(|t| t["kv"] == b["kv"] && t["ngl"] == b["ngl"]),
                "brute-forced where the tune tried it: {b}"
            );
        }
        assert!(c["cost_ratio"].as_f64().is_some_and(|r| r > 0.0), "{c}");
    }
    assert_eq!(cells[0]["cell"], "ample");
    assert_eq!(cells[1]["cell"], "tight");
    assert!(cells[0]["device_bytes"].as_u64() > cells[1]["device_bytes"].as_u64());
    let md = std::fs::read_to_string(out.path().join("truth.md")).unwrap();
    assert!(
        md.contains("# The truth table") && md.contains("| 1 | tiny | ample |") && md.contains("| 1 | tiny | tight |"),
        "{md}"
    );
}

/// `scripts/truth --merge`: cells measured again replace theirs, each cell
/// keeps naming the run that measured it, and merging after every cell (as
/// a run does) never shifts an index twice (it once did: a run of two cells
/// ended in an IndexError after its second).
#[test]
fn the_truth_tables_merge_keeps_each_cells_run() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/truth");
    let check = r#"
import importlib.machinery, importlib.util, sys
sys.dont_write_bytecode = True
loader = importlib.machinery.SourceFileLoader("truth", sys.argv[1])
spec = importlib.util.spec_from_loader("truth", loader)
t = importlib.util.module_from_spec(spec)
loader.exec_module(t)
def cell(model, kind, tg):
    return {"model": model, "cell": kind, "tg": tg}
# The older form: one run's facts at the top.
old = {"cells": "full", "date": "d1", "mode": "m", "workload": "w", "machine": {}, "regime": {},
       "table": [cell("smol", "ample", 1), cell("moe", "tight", 2), cell("moe", "ample", 3)]}
new = {"runs": [{"command": "c2"}], "table": [cell("moe", "tight", 20)]}
a = t.merged(old, new)
new["table"].append(cell("moe", "long", 30))
b = t.merged(old, new)
for m in (a, b):
    assert [r.get("command") for r in m["runs"]] == ["--cells full", "c2"], m["runs"]
rows = {(c["model"], c["cell"]): (c["tg"], c["run"]) for c in b["table"]}
assert rows == {("smol", "ample"): (1, 0), ("moe", "ample"): (3, 0), ("moe", "tight"): (20, 1),
                ("moe", "long"): (30, 1)}, rows
# In the full set's order, and a run no cell names any more is dropped.
assert [(c["model"], c["cell"]) for c in b["table"]] == [("smol", "ample"), ("moe", "ample"), ("moe", "tight"),
                                                         ("moe", "long")], b["table"]
again = t.merged(b, {"runs": [{"command": "c3"}], "table": [cell("smol", "ample", 9), cell("moe", "ample", 8)]})
assert [r.get("command") for r in again["runs"]] == ["c2", "c3"], again["runs"]
# Without --merge a run's table is its own, each cell in run 0.
alone = t.merged(None, new)
assert [(c["cell"], c["run"]) for c in alone["table"]] == [("tight", 0), ("long", 0)], alone
print("ok")
"#;
    let o = std::process::Command::new("python3").args(["-c", check]).arg(&script).output().unwrap();
    assert!(o.status.success(), "{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "ok");
}

/// `scripts/gpu-check --backends`: the same check through each build in
/// turn, each into its own directory with an even share of the deadline,
/// then one report side by side that says whether each backend's answer
/// stays under the cap when the other runs it. Here both "builds" are this
/// one (llvmpipe), which exercises the plumbing and the report; on a card
/// they are the CUDA and the Vulkan build. `--dry-run` lists the steps.
#[test]
fn gpu_check_through_two_backends_reports_them_side_by_side() {
    let _heavy = heavy();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-check");
    let bin = env!("CARGO_BIN_EXE_ngl-tune");
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    let base = ["--local", "--models", "small", "--searches", "adaptive", "--no-placement", "--out", dir];
    let two = ["--backends", "cuda,vulkan", "--bin-cuda", bin, "--bin-vulkan", bin];
    let dry = std::process::Command::new("bash")
        .arg(&script)
        .args(base)
        .args(two)
        .args(["--deadline", "600", "--dry-run"])
        .output()
        .unwrap();
    assert!(dry.status.success(), "{}", String::from_utf8_lossy(&dry.stderr));
    let steps = String::from_utf8_lossy(&dry.stdout).to_string();
    assert_eq!(steps.lines().count(), 3, "{steps}");
    assert!(steps.contains(&format!("--out {dir}/cuda")) && steps.contains("--deadline 300"), "{steps}");
    assert!(steps.lines().last().unwrap().contains("gpu_check_backends.py"), "{steps}");
    assert!(!out.path().join("cuda").exists(), "a dry run runs nothing");
    let o = std::process::Command::new("bash").arg(&script).args(base).args(two).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(report.starts_with("# gpu-check through cuda, vulkan"), "{report}");
    assert!(report.contains("| ngl | tg cuda | pp cuda | beyond cuda (MiB) | tg vulkan |"), "{report}");
    assert!(
        report.contains("cuda's answer through vulkan: held ") && report.contains("vulkan's answer through cuda"),
        "{report}"
    );
    assert!(out.path().join("cuda/raw.json").exists() && out.path().join("vulkan/raw.json").exists());
    let bad =
        std::process::Command::new("bash").arg(&script).args(["--backends", "metal", "--dry-run"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown backend 'metal'"));
}

/// The floors docs/architecture.md states hold, checked by the script it
/// cites: no cycle between the rooms of src/, no function over 80 lines,
/// no source file over 700. The script finds each kind of breach.
#[test]
fn the_structure_floors_hold_and_the_check_finds_each_breach() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/structure");
    let o = std::process::Command::new("python3").arg(&script).output().unwrap();
    let said = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{said}");
    assert!(said.trim_end().ends_with(", 0 breaches"), "{said}");
    let dir = tempfile::tempdir().unwrap();
    let long: String = (0..90).map(|i| format!("    let x{i} = {i};\n")).collect();
    std::fs::write(dir.path().join("a.rs"), format!("use crate::b::B;\nfn big() {{\n{long}}}\n")).unwrap();
    std::fs::write(dir.path().join("b.rs"), "pub struct B(crate::a::A);\n").unwrap();
    std::fs::write(dir.path().join("c.rs"), "\n".repeat(701)).unwrap();
    let o = std::process::Command::new("python3")
        .arg(&script)
        .args(["--src", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(1), "{said}");
    assert!(said.contains("a.rs: fn big is 92 lines") && said.contains("c.rs: 701 lines"), "{said}");
    assert!(said.contains("cycle: a -> b -> a"), "{said}");
}
