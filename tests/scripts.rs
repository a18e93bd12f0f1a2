//! The nightly scripts say what the README promises.
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
