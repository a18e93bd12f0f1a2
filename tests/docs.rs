//! The README and docs/ stay true to `--help`: every flag a command takes
//! is documented, every flag the docs give a command exists, and the
//! README stays short (the rest lives under docs/).
mod common;
use common::*;

use std::path::Path;

const COMMANDS: [&[&str]; 9] = [
    &["tune"],
    &["bench"],
    &["emit"],
    &["reprofile"],
    &["history"],
    &["profiles", "list"],
    &["inspect"],
    &["hw"],
    &["rpc-server"],
];

fn docs() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = std::fs::read_to_string(root.join("README.md")).unwrap();
    for e in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            all += &std::fs::read_to_string(e.path()).unwrap();
        }
    }
    all
}

/// The long flags `--help` lists for a command.
fn flags(cmd: &[&str]) -> Vec<String> {
    let mut args = cmd.to_vec();
    args.push("--help");
    let o = run(&args);
    assert!(o.status.success(), "{cmd:?} --help: {}", stderr(&o));
    let mut v: Vec<String> = stdout(&o)
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split([' ', ',', '=', '<']).find(|w| w.starts_with("--")).map(str::to_string))
        .filter(|f| f != "--help" && f != "--version")
        .collect();
    v.dedup();
    v
}

#[test]
fn every_flag_in_help_is_documented() {
    let docs = docs();
    for cmd in COMMANDS {
        let fl = flags(cmd);
        assert!(!fl.is_empty() || cmd == ["inspect"] || cmd == ["history"], "{cmd:?} lists no flags");
        for f in fl {
            assert!(docs.contains(&f), "{cmd:?} takes {f}, which neither README.md nor docs/ mention");
        }
    }
}

#[test]
fn the_readmes_command_table_names_only_flags_the_commands_take() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let mut checked = 0;
    for line in readme.lines().filter(|l| l.starts_with("| `ngl-tune ")) {
        let usage = line.split('`').nth(1).unwrap();
        let words: Vec<&str> = usage.split_whitespace().collect();
        let cmd: Vec<&str> = match words[1] {
            "profiles" => vec!["profiles", "list"],
            w if COMMANDS.iter().any(|c| c[0] == w) => vec![w],
            _ => vec!["tune"],
        };
        let known = flags(&cmd);
        for w in words.iter().map(|w| w.trim_matches(|c| c == '[' || c == ']')) {
            let f = w.split('=').next().unwrap();
            if f.starts_with("--") {
                assert!(known.iter().any(|k| k == f), "README: `{usage}`: {cmd:?} has no {f}");
                checked += 1;
            }
        }
    }
    assert!(checked > 10, "the command table was read ({checked} flags)");
}

#[test]
fn the_readme_starts_small() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    assert!(readme.lines().count() <= 200, "README.md has {} lines; move detail to docs/", readme.lines().count());
    let first: Vec<&str> = readme.lines().take(10).collect();
    assert!(first.iter().any(|l| l.starts_with("scripts/demo")) && first.iter().any(|l| l.starts_with("scripts/test")));
    for doc in ["tuning", "commands", "errors", "architecture", "development"] {
        assert!(readme.contains(&format!("(docs/{doc}.md)")), "README links docs/{doc}.md");
    }
}
