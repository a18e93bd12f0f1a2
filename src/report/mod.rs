//! What a person reads after tuning: the measured table, the choice and why,
//! and the lines to paste.

pub mod listing;
pub mod note;
pub mod placement;
pub mod split;
pub mod together;

use std::fmt::Write as _;
use std::path::Path;

use crate::model::human_bytes;
use crate::profile::Profile;
use crate::types::{TrialResult, TrialStatus};

fn ts(test: Option<&crate::types::TestResult>) -> String {
    test.map_or_else(
        || "-".to_string(),
        |x| crate::table::speed_cell(Some(x.avg_ts), Some(x.stddev_ts), x.samples_ns.len()),
    )
}

/// The trial table: ngl, pp and tg t/s ± sd, peak device memory and share, status.
#[must_use]
pub fn trial_table(p: &Profile) -> String {
    let mem_head = if p.memory.source == crate::types::Source::Accounted {
        "device memory (accounted)"
    } else {
        "peak device memory"
    };
    let several = p.settings.contexts().len() > 1;
    let images = p.trials.iter().any(|t| t.result.image.is_some());
    let mut columns = if several { vec![("ctx", true)] } else { Vec::new() };
    let tg_head = match p.settings.goal.streams() {
        1 => "tg t/s".to_string(),
        n => format!("tg t/s ({n} streams)"),
    };
    columns.extend([("ngl", true), ("threads", true), ("pp t/s", true), (tg_head.as_str(), true)]);
    if images {
        columns.push(("img ms", true));
    }
    // NVIDIA cards (NVML) and CPU packages (RAPL): mean power over the tg test, energy per token.
    let energy = p.trials.iter().any(|t| t.result.test(false).and_then(crate::types::Power::of).is_some());
    if energy {
        columns.push(("tg J/token (power)", true));
    }
    columns.extend([(mem_head, true), ("status", false)]);
    let mut t = crate::table::Table::new(&columns);
    let mut trials: Vec<_> = p.trials.iter().collect();
    trials.sort_by_key(|t| {
        let sp = &t.result.spec;
        (
            sp.placement.n_ctx,
            sp.placement.n_gpu_layers,
            sp.placement.kv_type,
            sp.placement.n_cpu_ffn,
            sp.placement.n_threads,
        )
    });
    for tr in trials {
        let r = &tr.result;
        let mem = match (tr.device_peak_bytes, tr.device_share) {
            (Some(b), Some(sh)) if r.status == TrialStatus::Ok || b > 0 => {
                format!("{} ({:.1}%)", human_bytes(b), sh * 100.0)
            }
            (Some(b), None) => human_bytes(b),
            _ => "-".to_string(),
        };
        let mut row =
            vec![placement_cell(&r.spec), r.spec.placement.n_threads.to_string(), ts(r.test(true)), ts(r.test(false))];
        if images {
            row.push(image_cell(r.image.as_ref()));
        }
        if energy {
            row.push(energy_cell(r.test(false)));
        }
        row.extend([mem, status_words(tr)]);
        if several {
            row.insert(0, r.spec.placement.n_ctx.map_or_else(|| "-".into(), |c| c.to_string()));
        }
        t.row(row);
    }
    for n in &p.skipped {
        let mut row: Vec<String> = if several { vec![p.settings.workload.n_ctx.to_string()] } else { Vec::new() };
        row.extend([n.to_string(), "-".into(), "-".into(), "-".into(), "-".into()]);
        row.extend(std::iter::repeat_n("-".to_string(), usize::from(images) + usize::from(energy)));
        row.push("skipped: a smaller ngl ran out of memory".into());
        t.row(row);
    }
    t.render()
}

/// Joules per generated token and the mean power it came from:
/// "1.250 (GPU 150 W, CPU no RAPL)".
fn energy_cell(tg: Option<&crate::types::TestResult>) -> String {
    let Some(t) = tg else { return "-".into() };
    let Some(j) = t.joules_per_token() else { return "-".into() };
    let gpu = t.power_w.map_or_else(|| "GPU -".into(), |w| format!("GPU {w:.0} W"));
    let cpu = t.cpu_power_w.map_or_else(|| "CPU no RAPL".into(), |w| format!("CPU {w:.0} W"));
    format!("{j:.3} ({gpu}, {cpu})")
}

/// Milliseconds per image ± sd: the `img` test.
fn image_cell(img: Option<&crate::types::ImageTest>) -> String {
    img.map_or_else(|| "-".to_string(), |i| format!("{:.1} ± {:.1}", i.avg_ms(), i.stddev_ms()))
}

/// The projector's line: what it takes where, predicted and allocated,
/// and what an image costs at the recommendation.
fn projector_line(p: &Profile) -> Option<String> {
    let path = p.settings.backend.mmproj.as_ref()?;
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let mut s = format!("projector {name}");
    let measured = p.trials.iter().find_map(|t| {
        let lines: Vec<_> = t.result.model_buffers.iter().filter(|b| b.kind.starts_with("mmproj")).collect();
        (!lines.is_empty()).then_some(lines)
    });
    let weights = measured.as_ref().and_then(|l| l.iter().find(|b| b.kind == "mmproj"));
    if let Some(lines) = &measured {
        let on = weights.map_or("CPU", |b| b.buffer_type.as_str());
        let w = weights.map_or(0, |b| b.bytes);
        let enc: u64 = lines.iter().filter(|b| b.kind == "mmproj-compute" && b.on_device()).map(|b| b.bytes).sum();
        let _ = write!(s, " on {on}: {} weights + {} image encoder", human_bytes(w), human_bytes(enc));
        let total: u64 = lines.iter().filter(|b| b.on_device()).map(|b| b.bytes).sum();
        if let Some(pred) = p.prediction.as_ref().and_then(|pr| pr.mmproj.as_ref()).filter(|m| m.error.is_none()) {
            let pb = pred.device_bytes();
            #[allow(clippy::cast_precision_loss)]
            let err = if total > 0 { (pb as f64 - total as f64) / total as f64 * 100.0 } else { 0.0 };
            let _ = write!(s, " (predicted {}, allocated {}: {err:+.2}%)", human_bytes(pb), human_bytes(total));
        }
        if total > 0 {
            s.push_str(", counted against that device's cap in every trial");
        }
    }
    let rec = &p.recommendation;
    let img = p.trials.iter().find_map(|t| t.result.image.as_ref());
    if let (Some(i), Some(ms)) = (img, rec.img_ms) {
        let _ = write!(s, "; img {}x{} -> {} tokens: {ms:.1} ms at the recommendation", i.nx, i.ny, i.n_tokens);
    }
    let w = weights.map_or(0, |b| b.bytes);
    let _ = write!(s, "\n{}", ollama_projector(rec.ollama_num_gpu_param(), p.model.n_layer_full, w));
    Some(s)
}

/// What Ollama does with a model's projector at this `num_gpu`
/// (llm/llama_server.go: `shouldDisableMMProjOffload`, `mmprojFitTargetMiB`).
#[must_use]
pub fn ollama_projector(num_gpu: Option<u32>, layers: u32, weights: u64) -> String {
    let reserve = (weights + (1 << 30)).div_ceil(1 << 20);
    match num_gpu {
        Some(0) => "Ollama at num_gpu 0 runs the projector on the CPU (--no-mmproj-offload)".to_string(),
        Some(n) if n < layers => format!(
            "Ollama at num_gpu {n} (fewer than the model's {layers} layers) runs the projector on the CPU (--no-mmproj-offload): its {} stay off the GPU, and images encode on the CPU, slower than the img column measured here with it on the GPU",
            human_bytes(weights)
        ),
        _ => format!(
            "Ollama loads the projector on the GPU and reserves {reserve} MiB for it (its weights + 1 GiB, added to llama.cpp's fit target); it moves it to the CPU where a GPU has less free"
        ),
    }
}

/// The ngl cell: the layers, and the hatch when there is one.
fn placement_cell(spec: &crate::types::TrialSpec) -> String {
    let mut c = spec.placement.n_gpu_layers.to_string();
    if spec.placement.kv_type.is_quantized() {
        c += &format!(" ({} KV)", spec.placement.kv_type.as_str());
    }
    if spec.placement.n_cpu_ffn > 0 {
        c += &format!(" (FFN of {} on CPU)", spec.placement.n_cpu_ffn);
    }
    if !spec.placement.tensor_split.is_empty() {
        c += &format!(" (-ts {})", crate::placement::split_list(&spec.placement.tensor_split));
    }
    c
}

/// A trial's status in words: how it ended, over the cap, why it ran,
/// whether it was cut short or contended, and why it failed.
fn status_words(t: &crate::profile::ProfileTrial) -> String {
    let r = &t.result;
    let mut status = r.status.as_str().to_string();
    if t.over_cap {
        status.push_str(", over cap");
    }
    if t.role == crate::types::Role::Confirm {
        status.push_str(" (confirmation)");
    }
    if r.spec.baseline {
        // llama.cpp's or Ollama's own run: its context and slots are its own,
        // not the tuned ones the other rows share.
        let p = &r.spec.placement;
        let mut at = p.n_ctx.map_or_else(String::new, |c| format!(" -c {c}"));
        if p.n_parallel > 1 {
            let _ = write!(at, " -np {}", p.n_parallel);
        }
        if p.kv_unified {
            at.push_str(" -kvu");
        }
        let _ = write!(status, " (a baseline's run{at})");
    }
    if let Some(x) = r.tests.iter().find(|x| x.stopped_early) {
        match x.tokens_measured {
            Some(n) => {
                let _ = write!(status, ", cut short after {n} of {} tokens: far behind the best", x.n_prompt + x.n_gen);
            }
            None => status.push_str(", cut short: far behind the best"),
        }
    }
    if let Some(c) = r.contention.as_ref().filter(|c| c.contended) {
        let _ = write!(status, ", contended (others {:.2} cores)", c.others_cores_mean);
    }
    if t.role == crate::types::Role::Moe {
        let _ = write!(status, " (--n-cpu-moe {})", r.spec.placement.n_cpu_moe);
    }
    if let Some(why) = r.reason.as_deref().filter(|_| r.status != TrialStatus::Ok) {
        let _ = write!(status, ": {why}");
    }
    status
}

/// One plain line per finished trial, for logs without a terminal (CI,
/// nohup, the journal): the setting, what it measured, how long it took,
/// and how long the rest should take at this pace.
#[must_use]
pub fn progress_line(done: usize, total: usize, r: &TrialResult, elapsed: std::time::Duration) -> String {
    let s = &r.spec;
    let mut setting = format!("ngl {} -t {}", s.placement.n_gpu_layers, s.placement.n_threads);
    if s.placement.n_cpu_moe > 0 {
        let _ = write!(setting, " --n-cpu-moe {}", s.placement.n_cpu_moe);
    }
    if s.placement.n_cpu_ffn > 0 {
        let _ = write!(setting, " (FFN of {} layers on the CPU)", s.placement.n_cpu_ffn);
    }
    if !s.placement.tensor_split.is_empty() {
        let _ = write!(setting, " -ts {}", crate::placement::split_list(&s.placement.tensor_split));
    }
    let mut what: Vec<String> = r.tests.iter().map(|t| format!("{} {:.2} t/s", t.name(), t.avg_ts)).collect();
    if let Some(i) = &r.image {
        what.push(format!("{} {:.1} ms", i.name(), i.avg_ms()));
    }
    if r.status != TrialStatus::Ok {
        what.push(format!("{}{}", r.status.as_str(), r.reason.as_deref().map_or(String::new(), |w| format!(" ({w})"))));
    }
    if let Some(c) = r.contention.as_ref().filter(|c| c.contended) {
        what.push(format!("contended: others used {:.2} cores", c.others_cores_mean));
    }
    let secs = elapsed.as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let left = if done > 0 && total > done {
        format!(", about {:.0} s left", secs / done as f64 * (total - done) as f64)
    } else {
        String::new()
    };
    format!(
        "trial {done}/{}: {setting}: {} in {:.1} s; {secs:.0} s elapsed{left}",
        total.max(done),
        what.join(", "),
        r.wall_ms / 1e3
    )
}

/// The whole report printed by the tuner.
#[must_use]
pub fn tune_report(p: &Profile, path: &Path) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} ({} {}, {} layers + output) on {}",
        p.model.file_name, p.model.architecture, p.model.quantization, p.model.n_layer, p.memory.device
    );
    if !p.no_gpu {
        let _ = writeln!(s, "cap: {} [memory: {}]", p.memory.cap_reason, p.memory.source);
    }
    if let Some(rule) = &p.settings.workload.ctx_rule {
        let _ = writeln!(s, "{rule}");
    }
    if let Some(c) = &p.settings.consumer {
        let what = c.program.settings_words();
        let _ = if c.found {
            let applied =
                if c.applied.is_empty() { "none that change the run".to_string() } else { c.applied.join("; ") };
            writeln!(s, "{what} from {}: {applied}", c.source)
        } else {
            writeln!(s, "{what}: {}", c.source)
        };
    }
    let _ = writeln!(s, "{}", p.settings.depth_rule());
    let n = p.settings.goal.streams();
    if n > 1 {
        let _ = writeln!(
            s,
            "throughput: each tg test decodes {n} sequences together, one token each a step, each at the depth; its t/s counts all of them (llama-batched-bench's S_TG); each context is {n} slots (-np {n}); pp is one sequence's prompt"
        );
    }
    if let Some(l) = projector_line(p) {
        let _ = writeln!(s, "{l}");
    }
    let _ = writeln!(s);
    s.push_str(&trial_table(p));
    let _ = writeln!(s);
    let d = &p.decision;
    for r in &d.reasons {
        let _ = writeln!(s, "{r}");
    }
    if !p.no_gpu {
        let _ = writeln!(s, "{}", d.knee_note);
    }
    for n in &d.fit_notes {
        let _ = writeln!(s, "note: {n}");
    }
    for n in p.notes.iter().filter(|n| n.is_warning()) {
        let _ = writeln!(s, "warning: {n}");
    }
    if let Some(pr) = &p.prediction {
        s.push_str(&prediction_lines(p, pr));
    }
    if let Some(sr) = &p.search {
        s.push_str(&search_line(sr));
    }
    let pl = placement::placement_lines(p);
    if !pl.is_empty() {
        s.push('\n');
        s.push_str(&pl);
    }
    for c in &p.placements {
        if let Some(r) = &c.split {
            s.push('\n');
            s.push_str(&split::split_lines(c, r));
        }
    }
    s.push_str(&paste_lines(p, path));
    s
}

/// What llama.cpp predicted and would have chosen, against what was measured.
fn prediction_lines(p: &Profile, pr: &crate::profile::PredictionReport) -> String {
    let mut s = String::new();
    if !pr.predicted_over_cap.is_empty() {
        let v: Vec<String> = pr.predicted_over_cap.iter().map(ToString::to_string).collect();
        let _ = writeln!(s, "not run: ngl {} (llama.cpp's dry run predicts more memory than the cap)", v.join(", "));
    }
    let gaps: Vec<(u32, i64)> = p
        .trials
        .iter()
        .filter_map(|t| t.sampled_minus_predicted_bytes.map(|g| (t.result.spec.placement.n_gpu_layers, g)))
        .collect();
    if let (Some(lo), Some(hi)) = (gaps.iter().min_by_key(|g| g.1), gaps.iter().max_by_key(|g| g.1)) {
        let signed = |b: i64| format!("{}{}", if b < 0 { "-" } else { "+" }, human_bytes(b.unsigned_abs()));
        let range = if lo == hi {
            format!("{} at ngl {}", signed(lo.1), lo.0)
        } else {
            format!("{} (ngl {}) to {} (ngl {})", signed(lo.1), lo.0, signed(hi.1), hi.0)
        };
        let _ = writeln!(
            s,
            "sampled {} memory minus llama.cpp's prediction: {range} (what llama.cpp does not count: driver context, allocator slack)",
            p.memory.source
        );
    }
    if let Some(e) = pr.max_error_pct {
        let _ = writeln!(
            s,
            "llama.cpp's dry-run memory prediction was within {e:.2}% of what it allocated at every measured ngl"
        );
    }
    match pr.llama_fit.as_ref().map(|f| (f.n_gpu_layers, f)) {
        Some((Some(n), _)) => {
            let ngl = if n < 0 { p.model.n_layer_full } else { u32::try_from(n).unwrap_or(0) };
            let tg = pr.llama_fit_tg_ts.map_or(String::new(), |t| format!(", measured tg {t:.2} t/s"));
            let _ = writeln!(
                s,
                "llama.cpp's own fit (same memory margin) would choose ngl {ngl}{tg}; measured best: ngl {}{}",
                p.recommendation.placement.n_gpu_layers,
                p.recommendation.tg_ts.map_or(String::new(), |t| format!(", tg {t:.2} t/s"))
            );
        }
        Some((None, f)) => {
            let _ = writeln!(s, "llama.cpp's own fit found no setting: {}", f.error.as_deref().unwrap_or("?"));
        }
        None => {}
    }
    s
}

/// How much measuring the search took.
fn search_line(sr: &crate::profile::SearchReport) -> String {
    let short = if sr.stopped_early > 0 { format!(", {} cut short", sr.stopped_early) } else { String::new() };
    let grid = sr.grid_estimate_s.map_or(String::new(), |g| {
        format!(
            "; the full grid would take about {g:.1} s: this took {:.0}% of that",
            sr.trial_wall_s / g.max(1e-9) * 100.0
        )
    });
    let mut after = String::new();
    if sr.other_trials > 0 {
        after +=
            &format!("; then {} trials in {:.1} s (threads, hatches, baselines)", sr.other_trials, sr.other_wall_s);
    }
    if sr.quality_wall_s > 0.0 {
        after += &format!("; the quality check {:.1} s", sr.quality_wall_s);
    }
    format!(
        "search: {}, {} trials{short} in {:.1} s (the full grid has {} settings){grid}{after}\n",
        sr.mode, sr.trials, sr.trial_wall_s, sr.grid_size
    )
}

/// The lines people paste, and where the profile is.
fn paste_lines(p: &Profile, path: &Path) -> String {
    let mut s = String::new();
    let rec = &p.recommendation;
    if rec.confidence == crate::profile::Confidence::Low {
        let _ = writeln!(s, "confidence: low (measured on a busy machine; see the warning above)");
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "Ollama Modelfile:");
    for l in &rec.modelfile {
        let _ = writeln!(s, "  {l}");
    }
    // Profiles from before `mtp_heads` lack the lines the model decides.
    let said = rec.modelfile.iter().any(|l| l.starts_with("PARAMETER draft_num_predict "));
    if !said && crate::emit::modelfile::draft_num_predict(p) == Some(0) {
        let _ = writeln!(s, "  {}\n  PARAMETER draft_num_predict 0", crate::emit::modelfile::MTP_OFF);
    }
    if let Some(n) = crate::emit::ollama_ctx_note(p, &|k| p.ollama_var(k)) {
        let _ = writeln!(s, "  note: {n}");
    }
    if !rec.ollama_server_env.is_empty() {
        let _ = writeln!(
            s,
            "Ollama server (not the Modelfile; applies to every model that server runs): {}",
            rec.ollama_server_env.join(" ")
        );
    }
    let _ = writeln!(s, "llama.cpp:  {}", rec.llama_cpp_args);
    let _ = writeln!(s, "profile:    {}", path.display());
    s
}

/// Human-readable `inspect` output.
#[must_use]
pub fn render_inspect(m: &crate::model::ModelInfo) -> String {
    let mut s = String::new();
    // The trunk's layers (the MTP blocks' slots hold nothing unless they load).
    let trunk = m.trunk_layer_bytes();
    let per_layer = if trunk.is_empty() { 0 } else { trunk.iter().sum::<u64>() / trunk.len() as u64 };
    let (min, max) = (trunk.iter().min().copied().unwrap_or(0), trunk.iter().max().copied().unwrap_or(0));
    let types: Vec<String> = m.bytes_by_type.iter().map(|(t, b)| format!("{t} {}", human_bytes(*b))).collect();
    s += &format!("model          {}\n", m.path.display());
    if let Some(n) = &m.name {
        s += &format!("name           {n}\n");
    }
    s += &format!("architecture   {}\n", m.architecture);
    s += &format!(
        "layers         {} repeating + output = {} (full offload: -ngl {})\n",
        m.n_layer, m.n_layer_full, m.n_layer_full
    );
    s += &format!("file size      {} ({} bytes)\n", human_bytes(m.file_size), m.file_size);
    s += &format!("parameters     {} ({})\n", crate::model::human_params(m.n_params), m.n_params);
    s += &format!("quantization   {}  [{}]\n", m.quantization, types.join(", "));
    s += &format!("per layer      {} average ({} .. {})\n", human_bytes(per_layer), human_bytes(min), human_bytes(max));
    s += &format!(
        "output layer   {}{}\n",
        human_bytes(m.output_bytes),
        if m.output_tied {
            " (output_norm only: the output weight is tied to token_embd, which stays on the CPU)"
        } else {
            ""
        }
    );
    s += &format!("token_embd     {} (stays on the CPU)\n", human_bytes(m.token_embd_bytes));
    s += &format!("all offloaded  {}\n", human_bytes(m.offloaded_bytes(m.n_layer_full)));
    if m.is_moe() {
        s += &format!(
            "experts        {} per layer, {} used per token (mixture of experts)\n",
            m.n_expert, m.n_expert_used
        );
    } else {
        s += "experts        none (dense)\n";
    }
    if m.n_layer_nextn > 0 && !m.has_mtp() {
        s += &format!(
            "MTP heads      none: nextn_predict_layers is {} but the blocks carry no weights (llama.cpp loads the trunk alone)\n",
            m.n_layer_nextn
        );
    }
    if m.has_mtp() {
        s += &format!(
            "MTP heads      {} block(s), {}, the last of the {} layers: loaded only for --spec-type draft-mtp (Ollama: draft_num_predict), else a slot of -ngl that holds nothing\n",
            m.n_layer_nextn,
            human_bytes(m.nextn_bytes),
            m.n_layer
        );
    }
    s += &format!("context        {} tokens trained\n", m.ctx_train);
    s += &format!(
        "dims           n_embd {}, n_head {}, n_head_kv {}, n_vocab {}\n",
        m.n_embd, m.n_head, m.n_head_kv, m.n_vocab
    );
    s += &format!("identity       sha256 of first 16 MiB {}\n", m.sha256_16m);
    s
}

/// Human-readable `hw` output.
#[must_use]
pub fn render_hw(hw: &crate::types::Hardware) -> String {
    let mut s = String::new();
    s += &format!("machine      {} (fingerprint {})\n", hw.machine_id, hw.fingerprint);
    s += &format!("os           {}, kernel {}\n", hw.os, hw.kernel);
    s += &format!(
        "cpu          {}, {} physical / {} logical cores\n",
        hw.cpu.brand, hw.cpu.physical_cores, hw.cpu.logical_cores
    );
    s += &format!("ram          {} total, {} available", human_bytes(hw.ram.total), human_bytes(hw.ram.available));
    if let Some(l) = hw.ram.cgroup_limit {
        s += &format!(", cgroup limit {}", human_bytes(l));
    }
    s += "\n";
    s += &format!("llama.cpp    {}, backends {}\n", hw.llama_cpp_revision, hw.backends.join(", "));
    s += "devices      (llama.cpp)\n";
    for d in &hw.llama_devices {
        s += &format!(
            "  {:<2} {:<10} {:<7} {:<5} {}  total {}, free {}\n",
            d.index,
            d.name,
            d.backend,
            d.kind.as_str(),
            d.description,
            human_bytes(d.memory_total),
            human_bytes(d.memory_free)
        );
    }
    for r in &hw.rpc_servers {
        let devs: Vec<String> = r.devices.iter().map(|d| human_bytes(d.memory_total)).collect();
        s += &format!(
            "rpc          {} protocol {}, {} device(s) ({}), {}\n",
            r.endpoint,
            r.protocol,
            r.devices.len(),
            devs.join(", "),
            link(r.rtt_ms, r.bandwidth)
        );
    }
    if hw.gpus.is_empty() {
        s += &format!("gpus (NVML)  none: {}\n", hw.nvml.as_deref().unwrap_or("NVML reports no devices"));
    } else {
        s += "gpus (NVML)\n";
        for g in &hw.gpus {
            let opt = |v: Option<u32>| v.map_or("?".to_string(), |x| x.to_string());
            s += &format!(
                "  {} {} {}  driver {}  memory {} (free {})  PCIe gen {}/{} x{}/{}  bus {} bit, mem clock {} MHz, {} GB/s\n",
                g.index,
                g.name,
                g.uuid,
                g.driver_version.as_deref().unwrap_or("?"),
                g.memory_total.map_or("?".into(), human_bytes),
                g.memory_free.map_or("?".into(), human_bytes),
                opt(g.pcie_gen_current),
                opt(g.pcie_gen_max),
                opt(g.pcie_width_current),
                opt(g.pcie_width_max),
                opt(g.memory_bus_width_bits),
                opt(g.memory_clock_max_mhz),
                g.bandwidth_gbs.map_or("?".into(), |b| format!("{b:.0}"))
            );
        }
    }
    for n in &hw.notes {
        s += &format!("note: {n}\n");
    }
    s
}

/// An RPC link in words: "round trip 0.045 ms, bandwidth 1234 MB/s up,
/// 987 MB/s down" (the bandwidth where measured).
#[must_use]
pub fn link(rtt_ms: f64, bandwidth: Option<crate::types::Bandwidth>) -> String {
    let bw = bandwidth
        .map_or(String::new(), |b| format!(", bandwidth {:.0} MB/s up, {:.0} MB/s down", b.up_mb_s, b.down_mb_s));
    format!("round trip {rtt_ms:.3} ms{bw}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ollama_moves_the_projector_to_the_cpu_at_a_partial_offload() {
        let w = 800 << 20;
        assert!(ollama_projector(Some(0), 49, w).contains("on the CPU (--no-mmproj-offload)"));
        let partial = ollama_projector(Some(30), 49, w);
        assert!(
            partial.contains("num_gpu 30 (fewer than the model's 49 layers) runs the projector on the CPU"),
            "{partial}"
        );
        // Full offload or num_gpu unset: on the GPU, weights + 1 GiB added to fit's target, in MiB.
        for n in [Some(49), None] {
            let on = ollama_projector(n, 49, w);
            assert!(on.contains("reserves 1824 MiB"), "{on}");
        }
    }

    fn example() -> Profile {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/example-gemma-3-270m-vulkan-llvmpipe.json");
        crate::profile::store::read_profile(&p).expect("the example profile reads")
    }

    #[test]
    fn the_sampled_gap_to_the_prediction_is_shown_where_it_was_measured() {
        let mut p = example();
        let out = tune_report(&p, Path::new("x.json"));
        assert!(!out.contains("minus llama.cpp's prediction"), "accounted memory has no gap: {out}");
        p.memory.source = crate::types::Source::Nvml;
        let gaps = [300i64 << 20, 512 << 20, 420 << 20];
        for (t, g) in p.trials.iter_mut().zip(gaps) {
            t.sampled_minus_predicted_bytes = Some(g);
        }
        let out = tune_report(&p, Path::new("x.json"));
        let line = out.lines().find(|l| l.contains("minus llama.cpp's prediction")).expect(&out);
        assert!(
            line.starts_with(
                "sampled nvml memory minus llama.cpp's prediction: +300.00 MiB (ngl 0) to +512.00 MiB (ngl 10)"
            ),
            "{line}"
        );
        assert!(line.ends_with("(what llama.cpp does not count: driver context, allocator slack)"), "{line}");
    }

    #[test]
    fn a_trial_cut_short_shows_one_sample_and_says_so() {
        let mut p = example();
        let t = &mut p.trials[1].result;
        for x in &mut t.tests {
            x.samples_ns.truncate(1);
            x.samples_ts.truncate(1);
            x.stopped_early = true;
        }
        let n = t.spec.placement.n_gpu_layers;
        let table = trial_table(&p);
        let row = table.lines().find(|l| l.starts_with(&format!("| {n} |"))).expect(&table);
        assert!(row.contains("cut short: far behind the best"), "{row}");
        assert!(!row.contains('±'), "one sample has no spread: {row}");
    }

    /// A baseline's trials (llama.cpp's default, Ollama's own run) run
    /// their own context and slots: their rows say so, so they are not
    /// read as the answer's at another memory.
    #[test]
    fn a_baselines_rows_say_whose_run_they_are() {
        let mut p = example();
        let t = &mut p.trials[1].result;
        t.spec.baseline = true;
        t.spec.placement = t.spec.placement.clone().with_layers(t.spec.placement.n_gpu_layers, 2, Some(8192));
        t.spec.placement = t.spec.placement.clone().with_server_defaults();
        let n = t.spec.placement.n_gpu_layers;
        let table = trial_table(&p);
        let row = table.lines().find(|l| l.starts_with(&format!("| {n} | 2 |"))).expect(&table);
        assert!(row.contains("(a baseline's run -c 8192 -np 4 -kvu)"), "{row}");
        let others = table.lines().filter(|l| l.contains("a baseline's run")).count();
        assert_eq!(others, 1, "only the baseline's row: {table}");
    }
}
