//! The placement part of the tune report: the answer per context size and
//! the escape hatches in the guide's order, each measured or predicted.

use std::fmt::Write as _;

use crate::model::human_bytes;
use crate::profile::{ContextPlacement, HatchKind, PlacementOption, Profile};

fn speed(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// One option in one line: what it is, its figures, measured or predicted, the note.
#[must_use]
pub fn option_line(o: &PlacementOption) -> String {
    let mem = o.device_bytes.map_or_else(|| "-".into(), human_bytes);
    let figures = if o.measured {
        format!("tg {} t/s, pp {} t/s, {mem}", speed(o.tg_ts), speed(o.pp_ts))
    } else {
        format!("predicted {mem}{}", if o.fits { "" } else { " (over the cap)" })
    };
    let quality = o.quality.as_ref().map_or(String::new(), |q| {
        let read = if q.depth_asked > q.depth {
            format!(
                ", judged at depth {} of {} (the whole read would have cost more than the trials on this host)",
                q.depth, q.depth_asked
            )
        } else {
            String::new()
        };
        format!(", KL {:.4} (top token agrees {:.1}%){read}", q.kl_mean, q.top1_agree * 100.0)
    });
    let note = if o.note.is_empty() { String::new() } else { format!("; {}", o.note) };
    let mark = if o.recommended { "  <- recommended" } else { "" };
    format!("{}: {figures}{quality}{note}{mark}", o.describe())
}

/// A recommendation in a few words: "ngl 19, q8_0 KV".
fn short(r: &crate::profile::Recommendation) -> String {
    let mut v = format!("ngl {}", r.placement.n_gpu_layers);
    if r.placement.kv_type.is_quantized() {
        v += &format!(", {} KV", r.placement.kv_type.as_str());
    }
    if r.placement.n_cpu_ffn > 0 {
        v += &format!(", FFN of {} layers on CPU", r.placement.n_cpu_ffn);
    }
    if r.placement.n_cpu_moe > 0 {
        v += &format!(", experts of {} layers on CPU", r.placement.n_cpu_moe);
    }
    v
}

/// The escape hatches at one context, numbered in the guide's order.
fn hatch_lines(s: &mut String, p: &Profile, c: &ContextPlacement) {
    if c.options.is_empty() {
        return;
    }
    let why = if c.fits_fully {
        "full offload fits, but the KV cache is a large share of the cap".to_string()
    } else {
        format!("full offload with an f16 KV cache does not fit under {}", p.memory.cap_reason)
    };
    let kv = c.kv_bytes.map_or(String::new(), |b| format!("; its f16 KV cache: {}", human_bytes(b)));
    let _ = writeln!(s, "escape hatches at {} context ({why}{kv}):", c.n_ctx);
    let mut options: Vec<&PlacementOption> = c.options.iter().collect();
    options.sort_by_key(|o| o.kind);
    for (i, o) in options.iter().enumerate() {
        let _ = writeln!(s, "  {}. {}", i + 1, option_line(o));
    }
    if c.recommendation.placement.n_cpu_ffn > 0 {
        let split = c.options.iter().find(|o| o.kind == HatchKind::LayerSplit);
        let gain = split.and_then(|l| Some((c.recommendation.tg_ts? / l.tg_ts? - 1.0) * 100.0));
        let _ = writeln!(
            s,
            "  Ollama has no tensor overrides: its num_gpu is the whole-layer split{}",
            gain.map_or(String::new(), |g| format!(" (the override buys {g:+.0}% tg in llama.cpp)"))
        );
    }
}

/// A paired comparison's ratios with their 95% intervals, as the
/// intervals themselves: "tg x1.10 [1.02, 1.19]". A profile from before
/// the interval was kept shows its half width.
#[must_use]
pub fn ratios(d: &crate::profile::DefaultComparison) -> Vec<String> {
    let ratio = |name: &str, r: Option<f64>, i: Option<[f64; 2]>, h: Option<f64>| {
        r.map(|r| match i {
            Some([lo, hi]) => format!("{name} x{r:.2} [{lo:.2}, {hi:.2}]"),
            None => format!("{name} x{r:.2} ± {:.2}", h.unwrap_or(0.0)),
        })
    };
    [ratio("tg", d.tg_ratio, d.tg_interval, d.tg_half_width), ratio("pp", d.pp_ratio, d.pp_interval, d.pp_half_width)]
        .into_iter()
        .flatten()
        .collect()
}

/// The recommendation against llama.cpp's default at one context, then
/// its Ollama form against Ollama's own run: each with its command line.
#[must_use]
pub fn default_lines(c: &ContextPlacement) -> Vec<String> {
    // (comparison, what it is, what it says without a command line, how its
    // command line is introduced and closed, the line's lead)
    let sides = [
        (
            c.default.as_ref(),
            "llama.cpp's default",
            "",
            ("llama-server ", ": what it does without flags here"),
            "against",
        ),
        (
            c.ollama.as_ref(),
            "Ollama's own run",
            " (num_gpu unset)",
            ("num_gpu unset: Ollama starts llama-server ", ""),
            "Ollama's lines (num_gpu) against",
        ),
    ];
    sides
        .into_iter()
        .filter_map(|(d, name, bare, (before, after), lead)| {
            let d = d?;
            let args = d.llama_cpp_args();
            let what =
                if args.is_empty() { format!("{name}{bare}") } else { format!("{name} ({before}{args}{after})") };
            Some(comparison_line(c, d, lead, &what))
        })
        .collect()
}

fn comparison_line(c: &ContextPlacement, d: &crate::profile::DefaultComparison, lead: &str, what: &str) -> String {
    use crate::profile::Verdict;
    let figures = ratios(d);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let took = d.mem_bytes.map(|m| crate::model::human_bytes(m.max(0.0) as u64));
    let memory = match (took, d.predicted_bytes) {
        (Some(t), Some(p)) => format!("; it took {t} (fit's dry run: {})", crate::model::human_bytes(p)),
        (Some(t), None) => format!("; it took {t}"),
        _ => String::new(),
    };
    let line = match d.verdict {
        Verdict::Same | Verdict::NotMeasured => format!("{lead} {what} at {} context: {}", c.n_ctx, d.note),
        v => {
            let verdict = match v {
                Verdict::Faster if d.over_cap => format!("faster beyond the noise; {}", d.note),
                Verdict::Faster if d.by_race => format!("faster: {}", d.note),
                Verdict::Faster => "faster beyond the noise".to_string(),
                Verdict::Tie if d.over_cap => format!("within the noise; {}", d.note),
                Verdict::NotDecided if d.over_cap => format!("not decided; {}", d.note),
                Verdict::Slower if d.over_cap => format!("slower beyond the noise; {}", d.note),
                _ => d.note.clone(),
            };
            format!(
                "{lead} {what} at {} context, depth {}: {} ({} alternated pairs, 95% intervals): {verdict}{memory}",
                c.n_ctx,
                d.n_depth,
                figures.join(", "),
                d.pairs
            )
        }
    };
    line
}

/// The per-context table (only with more than one context) and every
/// context's escape hatches.
#[must_use]
pub fn placement_lines(p: &Profile) -> String {
    let mut s = String::new();
    if p.placements.len() > 1 {
        let base = p.placements.first().and_then(|c| c.recommendation.tg_ts);
        let mut t = crate::table::Table::new(&[
            ("context", true),
            ("depth", true),
            ("placement", false),
            ("tg t/s", true),
            ("pp t/s", true),
            ("device memory", true),
            ("tg against the smallest context", true),
        ]);
        for c in &p.placements {
            let r = &c.recommendation;
            let cost = match (base, r.tg_ts) {
                (Some(b), Some(v)) => format!("{:+.0}%", (v / b - 1.0) * 100.0),
                _ => "-".into(),
            };
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let mem = r.mem_bytes.map_or_else(|| "-".into(), |m| human_bytes(m as u64));
            let depth = p.settings.depth_at(c.n_ctx).to_string();
            t.row(vec![c.n_ctx.to_string(), depth, short(r), speed(r.tg_ts), speed(r.pp_ts), mem, cost]);
        }
        s.push_str(&t.render());
        let _ = writeln!(s);
    }
    for c in &p.placements {
        hatch_lines(&mut s, p, c);
        for l in default_lines(c) {
            let _ = writeln!(s, "{l}");
        }
        if let Some(v) = &c.reading {
            let _ = writeln!(s, "{}", reading_line(c.n_ctx, v));
        }
        if let Some(j) = &c.job {
            let _ = writeln!(s, "{}", job_line(c.n_ctx, j));
        }
        if let Some(d) = &c.draft {
            s.push_str(&draft_lines(c.n_ctx, d));
        }
    }
    s
}

/// `--draft` at one context: each draft placement, what it was priced or
/// measured at against the answer without it, and whether speculation pays.
#[must_use]
pub fn draft_lines(n_ctx: u32, d: &crate::profile::DraftReport) -> String {
    let name = d.draft.file_name().map_or_else(|| d.draft.to_string_lossy(), |n| n.to_string_lossy());
    let name = if d.mtp { "the model's own MTP heads (--spec-type draft-mtp)".to_string() } else { name.into_owned() };
    let mut s = format!(
        "speculative decoding at {n_ctx} context with {name} ({} tokens greedy at depth {}, natural text):\n",
        d.n_gen, d.n_depth
    );
    for o in &d.options {
        let mem = match (o.device_bytes, o.predicted_device_bytes) {
            (Some(m), Some(p)) => {
                format!("{} measured, {} priced ({})", human_bytes(m), human_bytes(p), error_pct(p, m))
            }
            (Some(m), None) => format!("{} measured", human_bytes(m)),
            (None, Some(p)) => format!("{} priced", human_bytes(p)),
            (None, None) => "-".into(),
        };
        let measured = match (o.tg_ts, o.plain_tg_ts, o.ratio) {
            (Some(t), Some(p), Some([m, lo, hi])) => {
                let acc = o
                    .acceptance
                    .map_or_else(String::new, |a| format!(", {:.0}% of drafted tokens accepted", a * 100.0));
                format!("tg {t:.2} against {p:.2} without, x{m:.2} [{lo:.2}, {hi:.2}]{acc}")
            }
            _ => "not measured".into(),
        };
        let mark = if o.chosen { " (the answer)" } else { "" };
        let note = if o.note.is_empty() { String::new() } else { format!("; {}", o.note) };
        let _ = writeln!(s, "  {}{mark}: {measured}; {mem} on the devices with the target{note}", o.label);
    }
    let _ = writeln!(s, "  {}", d.summary);
    s
}

/// A price's error against the measured bytes (not 0), as the prediction lines give it.
#[allow(clippy::cast_precision_loss)]
fn error_pct(priced: u64, measured: u64) -> String {
    format!("error {:+.1}%", (priced as f64 - measured as f64) / measured as f64 * 100.0)
}

/// The hours of `--job` at one context's answer.
#[must_use]
pub fn job_line(n_ctx: u32, j: &crate::profile::JobVerdict) -> String {
    let streams = if j.streams > 1 { format!(", {} streams decoding together", j.streams) } else { String::new() };
    format!(
        "job at {n_ctx} context: {} requests x {} generated tokens at tg {:.2} t/s{streams}: {:.2} hours of generation (prompts not counted)",
        j.job.requests, j.job.n_gen, j.tg_ts, j.hours
    )
}

/// What a hatch costs, in the verdict's words.
fn hatch_cost(h: &crate::profile::ReadingHatch, n_ctx: u32) -> String {
    match (h.kind, h.kl_mean) {
        (HatchKind::ShorterContext, _) => format!("the context shortened from {n_ctx} to {}", h.n_ctx),
        (_, Some(kl)) => format!("KL {kl:.4} from the f16 cache"),
        (HatchKind::FfnSpill, None) => "no change to the output; llama.cpp only (Ollama cannot take -ot)".into(),
        _ => "no change to the output".into(),
    }
}

/// The answer at one context against reading speed for chat, and the
/// hatch that reaches it (or what is left to try), in the guides' order.
#[must_use]
pub fn reading_line(n_ctx: u32, v: &crate::profile::ReadingVerdict) -> String {
    let head = format!("reading speed at {n_ctx} context: tg {:.2} t/s", v.tg_ts);
    let need = format!("the {} t/s a chat reader needs (--reading-speed)", v.threshold_ts);
    if v.above {
        return format!("{head}, at or above {need}");
    }
    let next = "one quantization lower (ngl-tune THIS.gguf LOWER.gguf measures both and ranks them) \
                or a second device (another GPU, or --rpc HOST:PORT)";
    if let Some(h) = &v.reaches {
        return format!(
            "{head}, below {need}; the first hatch in the guides' order that reaches it: {} (tg {} t/s; {}): {}",
            h.describe,
            speed(h.tg_ts),
            hatch_cost(h, n_ctx),
            h.llama_cpp_args
        );
    }
    if v.untried.is_empty() {
        return format!("{head}, below {need}; no hatch measured here reaches it; the guides' next steps: {next}");
    }
    let untried: Vec<String> =
        v.untried.iter().map(|h| format!("{} ({}): {}", h.describe, hatch_cost(h, n_ctx), h.llama_cpp_args)).collect();
    format!(
        "{head}, below {need}; no hatch measured here reaches it; priced to fit but not measured: {}; after those, {next}",
        untried.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{ReadingHatch, ReadingVerdict};

    fn hatch(kind: HatchKind, kl: Option<f64>) -> ReadingHatch {
        ReadingHatch {
            kind,
            describe: "q8_0 KV cache at ngl 33".into(),
            n_ctx: 2048,
            measured: true,
            tg_ts: Some(12.5),
            kl_mean: kl,
            llama_cpp_args: "-ngl 33 -ctk q8_0 -ctv q8_0 -fa on".into(),
        }
    }

    #[test]
    fn the_reading_line_says_the_verdict_and_what_the_hatch_costs() {
        let mut v = ReadingVerdict { threshold_ts: 10.0, tg_ts: 12.0, above: true, reaches: None, untried: Vec::new() };
        let l = reading_line(8192, &v);
        assert!(l.contains("tg 12.00 t/s, at or above the 10 t/s"), "{l}");
        (v.tg_ts, v.above) = (7.0, false);
        v.reaches = Some(hatch(HatchKind::KvCache, Some(0.004)));
        let l = reading_line(8192, &v);
        assert!(l.contains("below the 10 t/s") && l.contains("tg 12.50 t/s; KL 0.0040"), "{l}");
        assert!(l.ends_with("-ngl 33 -ctk q8_0 -ctv q8_0 -fa on"), "{l}");
        v.reaches = Some(hatch(HatchKind::ShorterContext, None));
        assert!(reading_line(8192, &v).contains("shortened from 8192 to 2048"));
        v.reaches = None;
        let l = reading_line(8192, &v);
        assert!(l.contains("reaches it; the guides' next steps: one quantization lower"), "{l}");
        v.untried = vec![hatch(HatchKind::FfnSpill, None)];
        let l = reading_line(8192, &v);
        assert!(l.contains("priced to fit but not measured") && l.contains("Ollama cannot take -ot"), "{l}");
    }
}
