//! Several models resident together on one device (`tune A.gguf B.gguf
//! --together [--weights 0.8,0.2]`): one placement per model so that all
//! of them stay loaded at once under the device's cap, the weighted time a
//! generated token takes (each model's share of requests) as small as it
//! can be. Each model's settings are priced by llama.cpp's dry run and
//! measured alone at their ends (ngl 0 and the most that fits); the sets
//! that fit the cap together are ranked on those lines, and the best two
//! are measured with every model loaded: each generating in turn while the
//! others sit resident in processes of their own (`__hold`), as in an
//! Ollama server or a llama-swap group.

pub mod choose;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;

use self::choose::Member;
use super::executor::spec_of;
use super::memory::trial_memory;
use super::plan::{Candidate, ContextRun};
use super::TuneRequest;
use crate::engine::hold::Hold;
use crate::engine::runner::Runner;
use crate::error::bad;
use crate::profile::{MeasuredSet, MemoryPolicy, SetMember, SetProfile, SetTrial};
use crate::types::{TrialSpec, TrialStatus};

/// What the set's tune found and where it was stored.
pub struct SetOutcome {
    pub profile: SetProfile,
    pub path: PathBuf,
}

/// A member's trials as they run: its spec at any setting.
struct Part<'a> {
    req: &'a TuneRequest,
    base: TrialSpec,
    devices: Vec<String>,
}

impl Part<'_> {
    fn spec(&self, ngl: u32) -> TrialSpec {
        spec_of(&self.base, &self.devices, Candidate::layers(ngl, self.req.settings().backend.n_threads), None)
    }

    /// As a resident neighbour: its model and context allocated, idle.
    fn resident(&self, ngl: u32) -> TrialSpec {
        TrialSpec { n_depth: 0, depth_cache: None, ..self.spec(ngl) }
    }
}

/// Each share of requests, normalized: `--weights` (one a model), else equal.
///
/// # Errors
/// `BadInput` for a list that does not give one positive share a model.
pub fn weights(list: Option<&str>, n: usize) -> Result<Vec<f64>> {
    let Some(list) = list else {
        #[allow(clippy::cast_precision_loss)]
        return Ok(vec![1.0 / n as f64; n]);
    };
    let w: Vec<f64> = list
        .split(',')
        .map(|p| p.trim().parse::<f64>().ok().filter(|x| x.is_finite() && *x > 0.0))
        .collect::<Option<_>>()
        .ok_or_else(|| bad(format!("--weights {list}: give one positive share a model, like 0.8,0.2")))?;
    if w.len() != n {
        return Err(bad(format!("--weights {list} gives {} shares for {n} models; give one a model", w.len())));
    }
    let sum: f64 = w.iter().sum();
    Ok(w.iter().map(|x| x / sum).collect())
}

/// Tunes `reqs` as neighbours (see the module) and stores the set.
///
/// # Errors
/// `BadInput` for several offload devices; what a trial's runner returns
/// (an interrupt); a store that cannot be written.
pub fn tune_together(reqs: &[TuneRequest], shares: &[f64]) -> Result<SetOutcome> {
    let started = Instant::now();
    let first = &reqs[0];
    if first.caps().len() > 1 {
        return Err(bad("--together places the models on one offload device; give --vram-budget DEV=SIZE for one, or tune them apart"));
    }
    let mut hw = first.hw().clone();
    crate::probe::refresh_memory(&mut hw);
    let policy =
        super::memory::policy_for(&hw, &first.settings().caps, first.caps()).unwrap_or_else(MemoryPolicy::no_gpu);
    // Ollama starts a llama-server a member on an NVIDIA card, each holding
    // its CUDA context; measured through another backend the set is priced
    // with that share a member (`consumer::ollama::process::consumer_process_bytes`).
    let process_bytes =
        crate::consumer::ollama::process::consumer_process_bytes(&hw, first.caps().first().map(|c| c.device.as_str()));
    #[allow(clippy::cast_precision_loss)]
    let cap_bytes = policy.cap_bytes - (process_bytes * reqs.len() as u64) as f64;
    let exe = crate::engine::child::current_exe()?;
    let s0 = first.settings();
    let runner = super::start::runner(&s0.policy, first.verbose())?;
    // One depth cache a model: its files are named by depth and cache type, not by model.
    let depths: Vec<Option<crate::engine::DepthCache>> =
        reqs.iter().map(|_| crate::engine::DepthCache::unless_disabled()).collect();
    let mut parts = Vec::new();
    let mut members = Vec::new();
    let mut trials = Vec::new();
    for (i, req) in reqs.iter().enumerate() {
        let s = req.settings();
        let op = s.backend.op_offload.resolve(crate::probe::only_software_offload(&hw.llama_devices));
        let mut base = super::context::base_spec(req.info(), s, ContextRun::of(s, s.workload.n_ctx), op);
        base.depth_cache = depths[i].as_ref().map(|d| d.0.clone());
        let part = Part { req, base, devices: req.caps().iter().map(|c| c.device.clone()).collect() };
        let priced = price(&runner, req, (&policy, cap_bytes), op);
        let most = priced.iter().map(|p| p.0).max().unwrap_or(0);
        let mut measured = Vec::new();
        for n in if most > 0 { vec![0, most] } else { vec![0] } {
            let result = runner.run(&part.spec(n), |_| {})?;
            if let Some(tg) = ok_tg(&result) {
                measured.push((n, tg));
            }
            trials.push(SetTrial { member: i, beside: Vec::new(), beside_bytes: None, result });
        }
        members.push(Member { weight: shares[i], priced, measured });
        parts.push(part);
    }
    let ranked = choose::ranked(&members, cap_bytes);
    // The best two that load whole and measure under the cap (at most four tried).
    let mut sets: Vec<MeasuredSet> = Vec::new();
    for set in ranked.iter().take(4) {
        if sets.iter().filter(|s| s.under_cap && s.s_per_token.is_some()).count() == 2 {
            break;
        }
        let (m, t) = measure_set(&exe, &runner, &parts, set, (&policy, cap_bytes), shares)?;
        sets.push(m);
        trials.extend(t);
    }
    runner.release();
    // Only a set the gate admits is written (measured whole, under the cap).
    let cap = (policy.source != crate::types::Source::None).then_some(cap_bytes);
    let (best, chosen) = sets
        .iter()
        .enumerate()
        .filter_map(|(i, s)| crate::profile::AdmittedSet::admit(s, &trials, cap).ok().map(|a| (i, a)))
        .min_by(|a, b| a.1.s_per_token.unwrap_or(f64::MAX).total_cmp(&b.1.s_per_token.unwrap_or(f64::MAX)))
        .ok_or_else(|| {
            bad("no set of these models fits the cap together with every member measured; give a larger --vram-budget or fewer models")
        })?;
    sets[best].recommended = true;
    sets.sort_by_key(|s| !s.recommended);
    let profile = set_profile(&hw, (policy, process_bytes), &parts, &chosen, shares, (sets, trials), started);
    let path = store_set(first.store(), &profile)?;
    Ok(SetOutcome { profile, path })
}

/// The settings a member may take alone under the cap, priced by
/// llama.cpp's dry run (its grid: `--ngl`, else every few layers and all).
fn price(runner: &Runner, req: &TuneRequest, (policy, cap_bytes): (&MemoryPolicy, f64), op: bool) -> Vec<(u32, u64)> {
    let s = req.settings();
    let full = req.info().n_layer_full;
    let grid = s
        .policy
        .grid
        .clone()
        .map_or_else(|| super::plan::default_grid(full, (full / 6).max(1)), |g| super::plan::normalize(&g, full));
    if policy.source == crate::types::Source::None {
        return vec![(0, 0)];
    }
    let report =
        super::memory::predict(runner, (req.info(), s, ContextRun::of(s, s.workload.n_ctx)), policy, &grid, op);
    #[allow(clippy::cast_precision_loss)]
    let v: Vec<(u32, u64)> = report
        .predictions
        .iter()
        .filter(|p| p.error.is_none() && p.device_bytes as f64 <= cap_bytes)
        .map(|p| (p.n_gpu_layers, p.device_bytes))
        .collect();
    if v.is_empty() {
        vec![(0, 0)]
    } else {
        v
    }
}

fn ok_tg(r: &crate::types::TrialResult) -> Option<f64> {
    (r.status == TrialStatus::Ok).then(|| r.test(false).map(|t| t.avg_ts)).flatten()
}

/// Measures `set` with every member resident: each generates in turn
/// while the others are held.
fn measure_set(
    exe: &std::path::Path,
    runner: &Runner,
    parts: &[Part<'_>],
    set: &choose::Set,
    (policy, cap_bytes): (&MemoryPolicy, f64),
    shares: &[f64],
) -> Result<(MeasuredSet, Vec<SetTrial>)> {
    let mut trials = Vec::new();
    let mut tg = Vec::new();
    let mut bytes = Some(0u64);
    for (i, part) in parts.iter().enumerate() {
        // The last trial's worker holds memory that is not this set's.
        runner.release();
        let mut holds = Vec::new();
        let mut beside = Vec::new();
        for (j, other) in parts.iter().enumerate().filter(|(j, _)| *j != i) {
            let spec = other.resident(set.ngls[j]);
            match Hold::start(exe, &spec, Duration::from_secs(other.req.settings().policy.trial_timeout_s)) {
                Ok(h) => holds.push(h),
                // A neighbour that cannot be loaded (out of memory): this set cannot be resident.
                Err(e) if e.downcast_ref::<crate::error::Interrupted>().is_none() => {
                    return Ok((unmeasured(set, parts.len()), trials));
                }
                Err(e) => return Err(e),
            }
            beside.push((j, set.ngls[j]));
        }
        let beside_bytes = holds.iter().map(Hold::device_bytes).sum();
        let result = runner.run(&part.spec(set.ngls[i]), |_| {})?;
        drop(holds);
        tg.push(ok_tg(&result));
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let own = trial_memory(&result, policy).0.map(|m| m.max(0.0) as u64);
        bytes = bytes.zip(own).map(|(a, b)| a + b);
        trials.push(SetTrial { member: i, beside, beside_bytes: Some(beside_bytes), result });
    }
    let times: Option<Vec<f64>> = tg.iter().map(|t| t.filter(|v| *v > 0.0).map(|v| 1.0 / v)).collect();
    #[allow(clippy::cast_precision_loss)]
    let under_cap = policy.source == crate::types::Source::None || bytes.is_some_and(|b| b as f64 <= cap_bytes);
    let measured = MeasuredSet {
        n_gpu_layers: set.ngls.clone(),
        predicted_s_per_token: set.s_per_token,
        s_per_token: times.map(|t| choose::weighted(shares, &t)),
        tg_ts: tg,
        device_bytes: bytes,
        under_cap,
        recommended: false,
    };
    Ok((measured, trials))
}

/// A set that could not be loaded whole: not measured, not under the cap.
fn unmeasured(set: &choose::Set, n: usize) -> MeasuredSet {
    MeasuredSet {
        n_gpu_layers: set.ngls.clone(),
        predicted_s_per_token: set.s_per_token,
        s_per_token: None,
        tg_ts: vec![None; n],
        device_bytes: None,
        under_cap: false,
        recommended: false,
    }
}

/// The set's profile: each member's answer and forms, the sets measured.
fn set_profile(
    hw: &crate::types::Hardware,
    (memory, process_bytes): (MemoryPolicy, u64),
    parts: &[Part<'_>],
    chosen: &crate::profile::AdmittedSet,
    shares: &[f64],
    (sets, trials): (Vec<MeasuredSet>, Vec<SetTrial>),
    started: Instant,
) -> SetProfile {
    let names: Vec<String> = parts.iter().map(|p| p.req.info().file_name.clone()).collect();
    // Each member with its own Ollama server settings (KV type, flash attention, slots).
    let (members, envs): (Vec<SetMember>, Vec<Vec<String>>) = parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ngl = chosen.n_gpu_layers[i];
            let placement = p.spec(ngl).placement;
            let own = trials
                .iter()
                .rfind(|t| t.member == i && !t.beside.is_empty() && t.result.spec.placement.n_gpu_layers == ngl);
            let others: Vec<String> =
                names.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, n)| n.clone()).collect();
            let alone: Vec<(u32, f64)> = trials
                .iter()
                .filter(|t| t.member == i && t.beside.is_empty())
                .filter_map(|t| ok_tg(&t.result).map(|tg| (t.result.spec.placement.n_gpu_layers, tg)))
                .collect();
            let model = crate::profile::ModelIdentity::of(p.req.info());
            let env = crate::consumer::ollama::server_settings(&placement);
            let member = SetMember {
                model,
                weight: shares[i],
                n_layer_full: p.req.info().n_layer_full,
                tg_ts: chosen.tg_ts[i],
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                device_bytes: own.and_then(|t| trial_memory(&t.result, &memory).0).map(|m| m.max(0.0) as u64),
                ollama_predicted_bytes: placement
                    .n_ctx
                    .map(|c| crate::consumer::ollama::predicted_for_load(p.req.info(), c, placement.n_batch)),
                why: choose::why(ngl, p.req.info().n_layer_full, shares[i], &alone, &others),
                modelfile: crate::consumer::ollama::modelfile_lines(&placement),
                placement,
            };
            (member, env)
        })
        .unzip();
    let (ollama_server_env, ollama_note) = crate::emit::together::ollama(&members, &envs, &memory, process_bytes);
    SetProfile {
        schema_version: crate::profile::SCHEMA_VERSION,
        kind: "set".into(),
        tool: crate::profile::Tool::this(),
        created_at: crate::clock::now_rfc3339(),
        machine_id: hw.machine_id.clone(),
        fingerprint: hw.fingerprint.clone(),
        llama_swap: crate::emit::together::llama_swap(&members),
        ollama_server_env,
        ollama_note,
        memory,
        members,
        sets,
        trials,
        wall_s: started.elapsed().as_secs_f64(),
    }
}

/// Writes the set to `<store>/<machine>/sets/<models>.json`.
fn store_set(store: &std::path::Path, p: &SetProfile) -> Result<PathBuf> {
    let stems: Vec<String> =
        p.members.iter().map(|m| format!("{}-{}", m.model.file_name.trim_end_matches(".gguf"), m.model.id())).collect();
    let path = store.join(&p.machine_id).join("sets").join(format!("{}.json", stems.join("+")));
    let mut json = serde_json::to_vec_pretty(p)?;
    json.push(b'\n');
    crate::fsio::atomic_write(&path, &json)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_one_positive_number_a_model_and_sum_to_one() {
        assert_eq!(weights(None, 4).unwrap(), [0.25; 4]);
        let w = weights(Some("4, 1"), 2).unwrap();
        assert!((w[0] - 0.8).abs() < 1e-12 && (w[1] - 0.2).abs() < 1e-12, "{w:?}");
        for (list, needle) in
            [("0.8", "gives 1 shares for 2 models"), ("0.8,-1", "one positive share"), ("a,b", "one positive share")]
        {
            let e = weights(Some(list), 2).unwrap_err();
            assert_eq!(crate::error::exit_code(&e), crate::error::exit::BAD_INPUT, "{e}");
            assert!(e.to_string().contains(needle), "{e}");
        }
    }
}
