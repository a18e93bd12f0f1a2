//! Arguments before and after clap: llama-bench's short options rewritten,
//! `ngl-tune MODEL` as `ngl-tune tune MODEL`, each flag's value parser
//! with its own one-line error, and clap's errors made one line.

use std::time::Duration;

use super::Cli;

/// `ngl-tune MODEL ...` means `ngl-tune tune MODEL ...`.
#[must_use]
pub fn default_to_tune(mut args: Vec<String>) -> Vec<String> {
    if let Some(first) = args.get(1) {
        use clap::CommandFactory;
        let known = first == "help" || Cli::command().get_subcommands().any(|c| c.get_name() == first);
        if !first.starts_with('-') && !known {
            args.insert(1, "tune".to_string());
        }
    }
    args
}

/// Rewrites llama-bench's multi-letter short options (`-ngl 10`, `-ub 256`,
/// `-fa on`) to their long forms, which clap can parse.
#[must_use]
pub fn normalize_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    const MAP: [(&str, &str); 4] =
        [("-ngl", "--n-gpu-layers"), ("-ub", "--ubatch-size"), ("-fa", "--flash-attn"), ("-ncmoe", "--n-cpu-moe")];
    args.into_iter()
        .map(|a| {
            for (short, long) in MAP {
                if a == short {
                    return long.to_string();
                }
                if let Some(v) = a.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                    return format!("{long}={v}");
                }
            }
            a
        })
        .collect()
}

// Values typed at the parser. Each error names the flag, the value and the
// fix; `main` prints it as one line, exit 2.

fn number(v: &str, ok: impl Fn(f64) -> bool) -> Option<f64> {
    v.trim().parse::<f64>().ok().filter(|x| !x.is_nan() && ok(*x))
}

/// `--target-vram`: a share of device memory in (0, 1].
///
/// # Errors
/// The message names the value and the fix.
pub fn target_share(v: &str) -> Result<f64, String> {
    let f: f64 = v
        .trim()
        .parse()
        .map_err(|_| format!("--target-vram '{v}' is not a number; give a fraction of device memory like 0.9"))?;
    if f.is_nan() || f <= 0.0 || f > 1.0 {
        return Err(format!("--target-vram {v} is outside (0, 1]; give the share of device memory to use, like 0.9"));
    }
    Ok(f)
}

pub(super) fn busy_share(v: &str) -> Result<f64, String> {
    let what = "a positive share of the trial's threads; give one like 0.1 (others may use a tenth of them)";
    positive(v, "--busy-threshold", what)
}

pub(super) fn kl_nats(v: &str) -> Result<f64, String> {
    number(v, |k| k.is_finite() && k >= 0.0)
        .ok_or_else(|| format!("--max-kl {v} is not a KL divergence; give nats like 0.05"))
}

pub(super) fn top1_share(v: &str) -> Result<f64, String> {
    number(v, |k| (0.0..=1.0).contains(&k))
        .ok_or_else(|| format!("--min-top1 {v} is not a share in [0, 1]; give one like 0.9"))
}

pub(super) fn drift_fraction(v: &str) -> Result<f64, String> {
    number(v, |t| (0.0..1.0).contains(&t)).ok_or_else(|| {
        format!("--drift-threshold {v} is not a fraction in [0, 1); give the smallest change that counts, like 0.05")
    })
}

pub(super) fn max_age(v: &str) -> Result<Duration, String> {
    duration(v, "--max-age")
}

pub(super) fn wait_idle(v: &str) -> Result<Duration, String> {
    duration(v, "--wait-idle")
}

/// Parses "7d", "12h", "30m", "45s", "2w" (a bare number is seconds).
///
/// # Errors
/// The message names `opt`, the value and the form.
pub fn duration(s: &str, opt: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = num.parse().map_err(|_| format!("{opt} '{s}' is not a duration; write it like 7d, 12h or 30m"))?;
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 604_800,
        _ => return Err(format!("{opt} '{s}' has an unknown unit; use s, m, h, d or w")),
    };
    Ok(Duration::from_secs(n.saturating_mul(mult)))
}

/// A positive finite number (a share, a power in watts, a speed in tokens
/// a second); the error names `flag`, the value and, in `what`, the fix.
fn positive(v: &str, flag: &str, what: &str) -> Result<f64, String> {
    number(v, |x| x.is_finite() && x > 0.0).ok_or_else(|| format!("{flag} {v} is not {what}"))
}

pub(super) fn positive_watts(v: &str) -> Result<f64, String> {
    positive(v, "--max-power", "a power; give watts above 0, like 250")
}

pub(super) fn positive_speed(v: &str) -> Result<f64, String> {
    positive(v, "--reading-speed", "a speed; give tokens a second above 0, like 10")
}

/// A value the parser refused, as one line: its own message, which names
/// the flag, the value and the fix (clap's form adds the usage around it).
#[must_use]
pub fn one_line(e: &clap::Error) -> Option<String> {
    if e.kind() != clap::error::ErrorKind::ValueValidation {
        return None;
    }
    std::error::Error::source(e).map(ToString::to_string)
}

/// A negative number given to a flag that takes a count, a size or a
/// list (`--depth -5`, `-b -512`): clap reads the number as flags of its
/// own and answers "unexpected argument '-5'" with a tip that would make
/// it a model path. As one line instead: the flag, the value, what it
/// takes. `None` where `e` is not that (`args`: as parsed).
#[must_use]
pub fn negative_value(e: &clap::Error, args: &[String]) -> Option<String> {
    use clap::CommandFactory;
    if e.kind() != clap::error::ErrorKind::UnknownArgument {
        return None;
    }
    let (flag, value) = args.windows(2).find_map(|w| {
        // A number, a size (`-5GiB`) or a list starting with one.
        let negative =
            w[1].strip_prefix('-').and_then(|r| r.chars().next()).is_some_and(|c| c.is_ascii_digit() || c == '.');
        (negative && w[0].starts_with('-') && w[0].parse::<f64>().is_err()).then(|| (&w[0], &w[1]))
    })?;
    let named = |a: &&clap::Arg| {
        flag.strip_prefix("--").map_or_else(
            || flag.strip_prefix('-').and_then(|f| f.chars().next()).is_some_and(|c| a.get_short() == Some(c)),
            |long| a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|v| v.contains(&long)),
        )
    };
    let cmd = Cli::command();
    let takes = std::iter::once(&cmd)
        .chain(cmd.get_subcommands())
        .flat_map(clap::Command::get_arguments)
        .find(named)
        .and_then(|a| a.get_value_names().and_then(|v| v.first()).map(ToString::to_string))
        .unwrap_or_else(|| "a value".into());
    Some(format!(
        "{flag} {value} is negative: {flag} takes {takes}, 0 or more; give one like {flag} {}",
        value.trim_start_matches('-')
    ))
}
