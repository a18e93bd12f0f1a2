//! The command line: llama-bench's names, the value parsers' one-line errors.

use super::*;

#[test]
fn llama_bench_short_options_are_rewritten() {
    let a = normalize_args(["ngl-tune", "bench", "m.gguf", "-ngl", "0,10", "-ub=256", "-t", "2"].map(String::from));
    assert_eq!(a, ["ngl-tune", "bench", "m.gguf", "--n-gpu-layers", "0,10", "--ubatch-size=256", "-t", "2"]);
    let cli = Cli::try_parse_from(a).unwrap();
    let Command::Bench(b) = cli.command else { panic!("not bench") };
    assert_eq!(b.ngl, vec!["0,10"]);
    assert_eq!(b.workload.ubatch_size, 256);
    assert_eq!(b.workload.threads, Some(2));
    assert_eq!(b.workload.n_prompt, None);
    assert_eq!(b.workload.repetitions, None);
}

#[test]
fn a_model_first_means_tune() {
    let a = default_to_tune(["ngl-tune", "m.gguf", "--target-vram", "0.8"].map(String::from).to_vec());
    assert_eq!(a[1], "tune");
    let cli = Cli::try_parse_from(a).unwrap();
    let Command::Tune(t) = cli.command else { panic!("not tune") };
    assert!((t.target_vram - 0.8).abs() < 1e-12);
    let b = default_to_tune(["ngl-tune", "bench", "m.gguf"].map(String::from).to_vec());
    assert_eq!(b[1], "bench");
    let h = default_to_tune(["ngl-tune", "--help"].map(String::from).to_vec());
    assert_eq!(h[1], "--help");
}

#[test]
fn the_settings_file_given_names_the_consumer() {
    use crate::consumer::Program;
    let tune = |extra: &[&str]| {
        let mut a = vec!["ngl-tune", "tune", "m.gguf"];
        a.extend_from_slice(extra);
        let Command::Tune(t) = Cli::try_parse_from(a).unwrap().command else { panic!("not tune") };
        t
    };
    let t = tune(&["--server-env", "s.env"]);
    assert_eq!(t.consumer_settings(), Some((Program::LlamaServer, Path::new("s.env"))));
    let t = tune(&["--ollama-env", "o.env"]);
    assert_eq!(t.consumer_settings(), Some((Program::Ollama, Path::new("o.env"))));
    assert_eq!(tune(&[]).consumer_settings(), None, "Ollama's own, from its unit");
    let both = ["ngl-tune", "tune", "m.gguf", "--ollama-env", "o.env", "--server-env", "s.env"];
    assert!(Cli::try_parse_from(both).is_err(), "one consumer at a time");
}

#[test]
fn numbers_and_durations_are_typed_at_the_parser() {
    assert!((target_share("0.9").unwrap() - 0.9).abs() < 1e-12);
    assert_eq!(target_share("1").unwrap(), 1.0);
    for bad in ["0", "-0.5", "1.5", "NaN", "abc", "inf"] {
        assert!(target_share(bad).is_err(), "{bad}");
    }
    assert_eq!(duration("7d", "--max-age").unwrap(), Duration::from_secs(7 * 86_400));
    assert_eq!(duration("12h", "--max-age").unwrap(), Duration::from_secs(43_200));
    assert_eq!(duration("0", "--max-age").unwrap(), Duration::ZERO);
    assert!(duration("soon", "--max-age").unwrap_err().contains("--max-age 'soon' is not a duration"));
    assert!(duration("3y", "--max-age").unwrap_err().contains("unknown unit"));
    assert!(busy_share("0").is_err() && kl_nats("-1").is_err() && top1_share("1.1").is_err());
    assert!(drift_fraction("1").is_err() && drift_fraction("0").is_ok());
    let parse = |a: &[&str]| Cli::try_parse_from(default_to_tune(a.iter().map(|s| (*s).to_string()).collect()));
    let e = parse(&["ngl-tune", "m.gguf", "--max-kl", "x"]).unwrap_err();
    assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation);
    assert_eq!(one_line(&e).as_deref(), Some("--max-kl x is not a KL divergence; give nats like 0.05"));
    let Command::Reprofile(r) = parse(&["ngl-tune", "reprofile", "--wait-idle", "0"]).unwrap().command else {
        panic!("not reprofile")
    };
    assert_eq!((r.max_age, r.wait_idle), (Duration::from_secs(7 * 86_400), Duration::ZERO));
    assert!((r.busy.threshold - 0.1).abs() < 1e-12 && (r.drift_threshold - 0.05).abs() < 1e-12);
}

#[test]
fn clap_definition_is_consistent() {
    use clap::CommandFactory;
    Cli::command().debug_assert();
}
