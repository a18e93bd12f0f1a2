//! The one gate every answer passes: an [`Admitted`] recommendation is a
//! placement together with the evidence that admits it under every cap
//! the user set. Its fields are private and [`Gate::admit`] is the only
//! way to make one in the tune, so a stage that replaces the answer (a
//! hatch, the MoE spill, a split, fit at the user's context, throughput,
//! energy) cannot put one in a profile without passing here. A profile
//! read back holds the answer it was written with ([`Evidence::Stored`]).

use serde::{Deserialize, Serialize};

use super::{ProfileTrial, Recommendation};
use crate::engine::predict::Prediction;
use crate::model::human_bytes;
use crate::placement::Placement;
use crate::types::TrialStatus;

/// Why an answer is admitted.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Evidence {
    /// Trials of exactly this placement at this context completed, none
    /// over a cap: their count and the most device memory they took (the
    /// policy's currency).
    Measured { trials: usize, mem_bytes: Option<f64> },
    /// A placement with a draft: the loads of the draft stage that
    /// measured it with its draft, and what both contexts held on the
    /// devices by llama.cpp's accounting.
    MeasuredWithDraft { loads: u32, device_bytes: u64 },
    /// llama.cpp's dry run of this placement plus what this context's
    /// trials held beyond their prices, under the cap.
    Priced { bytes: u64, unaccounted: u64 },
    /// No offload device is capped here (CPU only): nothing to hold under a cap.
    Uncapped,
    /// Read back from a stored profile: admitted when it was written.
    #[default]
    Stored,
}

/// A recommendation with the evidence that admits it. Reads go through
/// `Deref`; nothing outside this module changes its placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Admitted {
    recommendation: Recommendation,
    #[serde(skip)]
    evidence: Evidence,
}

impl std::ops::Deref for Admitted {
    type Target = Recommendation;

    fn deref(&self) -> &Recommendation {
        &self.recommendation
    }
}

impl Admitted {
    /// What admitted it.
    #[must_use]
    pub fn evidence(&self) -> &Evidence {
        &self.evidence
    }

    /// The measurement's confidence, set once the whole tune is judged
    /// (it says how busy the machine was, not where anything runs).
    pub fn set_confidence(&mut self, c: super::Confidence) {
        self.recommendation.confidence = c;
    }

    /// The model has MTP heads: the Modelfile lines say whether Ollama
    /// loads them (the placement is unchanged).
    pub fn mark_mtp_heads(&mut self) {
        self.recommendation.mark_mtp_heads();
    }

    /// The admitted answer itself.
    #[must_use]
    pub fn into_inner(self) -> Recommendation {
        self.recommendation
    }

    /// A test's answer, admitted without evidence.
    #[cfg(test)]
    #[must_use]
    pub fn for_test(recommendation: Recommendation) -> Admitted {
        Admitted { recommendation, evidence: Evidence::Stored }
    }

    /// A test's access to the answer's fields.
    #[cfg(test)]
    pub fn for_test_mut(&mut self) -> &mut Recommendation {
        &mut self.recommendation
    }
}

/// An answer the gate refused, and why, in words.
#[derive(Debug)]
pub struct Refused {
    pub recommendation: Recommendation,
    pub why: String,
}

/// What an answer at one context is judged by: that context's trials, the
/// dry runs, and every cap the user set.
pub struct Gate<'a> {
    pub trials: &'a [ProfileTrial],
    pub predicted: &'a [Prediction],
    /// The capped device's cap in the policy's currency; `None`: no offload device.
    pub cap_bytes: Option<f64>,
    /// What this context's trials held on the device beyond their dry runs.
    pub unaccounted: u64,
    /// The host's cap (bytes), where one is set.
    pub host_bytes: Option<u64>,
    /// `--max-power`: the GPUs' mean power a setting may draw.
    pub max_power_w: Option<f64>,
    /// The draft stage's options (`tune --draft`): the only evidence for
    /// a placement with a draft, which no trial without one measured.
    pub drafts: &'a [super::DraftOption],
}

/// The same placement for memory and for what it runs: where each part
/// lives, the cache, the context and its slots (threads, flash attention
/// and op offload change no allocation a cap reads).
fn same(a: &Placement, b: &Placement) -> bool {
    a.n_gpu_layers == b.n_gpu_layers
        && a.n_cpu_moe == b.n_cpu_moe
        && a.n_cpu_ffn == b.n_cpu_ffn
        && a.cpu_overrides == b.cpu_overrides
        && a.kv_type == b.kv_type
        && a.n_ctx == b.n_ctx
        && a.n_parallel.max(1) == b.n_parallel.max(1)
        && a.tensor_split.iter().sum::<u32>() == b.tensor_split.iter().sum::<u32>()
        && a.draft == b.draft
}

/// A dry run of that placement ([`Prediction::prices_placement`]; no
/// dry run prices fit's CPU tensors).
fn prices(p: &Prediction, placement: &Placement, own_kv: crate::placement::KvType) -> bool {
    p.error.is_none() && placement.cpu_overrides.is_empty() && p.prices_placement(placement, own_kv)
}

impl Gate<'_> {
    /// `rec` admitted by its evidence, or refused with the reason: trials
    /// of exactly its placement (none over the device's cap, out of
    /// memory, or over `--max-power`), else its dry-run price plus the
    /// unaccounted share under the cap; and its host part by the dry run
    /// under the host's cap where both are known. `own_kv`: the tune's own
    /// KV type (the cache a whole-layer price names).
    ///
    /// # Errors
    /// The refusal, holding `rec` and why.
    pub fn admit(&self, rec: Recommendation, own_kv: crate::placement::KvType) -> Result<Admitted, Box<Refused>> {
        let refuse = |rec, why: String| Err(Box::new(Refused { recommendation: rec, why }));
        let p = rec.placement.clone();
        if p.draft.is_some() {
            return self.admit_draft(rec);
        }
        let ran: Vec<&ProfileTrial> = self.trials.iter().filter(|t| same(&t.result.spec.placement, &p)).collect();
        let priced = self.predicted.iter().find(|x| prices(x, &p, own_kv));
        if let (Some(cap), Some(pr)) = (self.host_bytes, priced) {
            if pr.host_bytes() > cap {
                let (need, cap) = (human_bytes(pr.host_bytes()), human_bytes(cap));
                return refuse(
                    rec,
                    format!("its host part needs {need} by llama.cpp's dry run, over the host cap of {cap}"),
                );
            }
        }
        if let Some(t) = ran.iter().find(|t| t.over_cap || t.result.status == TrialStatus::Oom) {
            let what = t.mem_bytes.map_or_else(|| "out of device memory".to_string(), |m| over(m, self.cap_bytes));
            return refuse(rec, format!("measured {what}"));
        }
        let power = |t: &&&ProfileTrial| t.result.test(false).and_then(crate::types::Power::of).and_then(|w| w.gpu_w);
        // Every layer on the CPU puts nothing on the GPUs: what they draw
        // then is not this placement's (the search's rule too).
        if let Some(max) = self.max_power_w.filter(|_| p.n_gpu_layers > 0) {
            if let Some(w) = ran.iter().filter_map(|t| power(&t)).find(|w| *w > max) {
                return refuse(rec, format!("its GPUs drew {w:.0} W, over --max-power {max:.0} W"));
            }
        }
        let ok: Vec<&&ProfileTrial> = ran.iter().filter(|t| t.result.status == TrialStatus::Ok).collect();
        let Some(cap) = self.cap_bytes else {
            return Ok(Admitted { recommendation: rec, evidence: Evidence::Uncapped });
        };
        if !ok.is_empty() {
            let mem_bytes = ok.iter().filter_map(|t| t.mem_bytes).reduce(f64::max);
            return Ok(Admitted { recommendation: rec, evidence: Evidence::Measured { trials: ok.len(), mem_bytes } });
        }
        match priced {
            #[allow(clippy::cast_precision_loss)]
            Some(pr) if (pr.device_bytes + self.unaccounted) as f64 <= cap => Ok(Admitted {
                recommendation: rec,
                evidence: Evidence::Priced { bytes: pr.device_bytes, unaccounted: self.unaccounted },
            }),
            #[allow(clippy::cast_precision_loss)]
            Some(pr) => {
                let why = over((pr.device_bytes + self.unaccounted) as f64, Some(cap));
                refuse(rec, format!("priced {why} by llama.cpp's dry run (with what the trials held beyond it)"))
            }
            None => refuse(rec, "neither measured nor priced at this context".into()),
        }
    }
}

impl Gate<'_> {
    /// A placement with a draft, by the draft stage's loads of exactly it:
    /// both contexts' device bytes (llama.cpp's accounting) plus what
    /// trials held beyond it under the device cap, its dry-run host part
    /// under the host cap; never under `--max-power` (no load of it read
    /// the GPUs' power).
    fn admit_draft(&self, rec: Recommendation) -> Result<Admitted, Box<Refused>> {
        let refuse = |rec, why: String| Err(Box::new(Refused { recommendation: rec, why }));
        // Measured and under the caps by its price too (the price counts
        // what the load did not hold, a projector's share say).
        let ran = self.drafts.iter().find(|o| o.placement == rec.placement && o.loads > 0 && o.fits);
        let (Some(o), Some(device)) = (ran, ran.and_then(|o| o.device_bytes)) else {
            return refuse(rec, "not measured with its draft under the caps".into());
        };
        if self.max_power_w.is_some() {
            return refuse(rec, "a draft's power is not measured, so it cannot be held under --max-power".into());
        }
        if let (Some(cap), Some(host)) = (self.host_bytes, o.predicted_host_bytes) {
            if host > cap {
                let (need, cap) = (human_bytes(host), human_bytes(cap));
                return refuse(
                    rec,
                    format!("with its draft its host part needs {need} by the dry run, over the host cap of {cap}"),
                );
            }
        }
        let most = device.max(o.predicted_device_bytes.unwrap_or(0)) + self.unaccounted;
        #[allow(clippy::cast_precision_loss)]
        if let Some(cap) = self.cap_bytes.filter(|c| most as f64 > *c) {
            return refuse(rec, format!("measured with its draft {}", over(most as f64, Some(cap))));
        }
        let loads = o.loads;
        Ok(Admitted { recommendation: rec, evidence: Evidence::MeasuredWithDraft { loads, device_bytes: device } })
    }
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn over(bytes: f64, cap: Option<f64>) -> String {
    let b = human_bytes(bytes.max(0.0) as u64);
    cap.map_or_else(|| format!("at {b}"), |c| format!("at {b}, over the cap of {}", human_bytes(c.max(0.0) as u64)))
}

/// A set of models admitted to be loaded together: the only way a set's
/// members reach the profile and the forms written from it. Admitted
/// where every member was measured with the others resident, at the
/// set's layers, and completed, and the set's device bytes (each member's
/// own, all resident) are under the cap (`None`: no offload device).
#[derive(Debug, Clone)]
pub struct AdmittedSet(super::MeasuredSet);

impl std::ops::Deref for AdmittedSet {
    type Target = super::MeasuredSet;

    fn deref(&self) -> &super::MeasuredSet {
        &self.0
    }
}

impl AdmittedSet {
    /// `set` through the gate, by `trials` (the set search's).
    ///
    /// # Errors
    /// Why it is refused, in words.
    pub fn admit(set: &super::MeasuredSet, trials: &[super::SetTrial], cap_bytes: Option<f64>) -> Result<Self, String> {
        let n = set.n_gpu_layers.len();
        for (i, ngl) in set.n_gpu_layers.iter().enumerate() {
            let ran = trials
                .iter()
                .rfind(|t| t.member == i && t.beside.len() + 1 == n && t.result.spec.placement.n_gpu_layers == *ngl);
            match ran.map(|t| t.result.status) {
                Some(TrialStatus::Ok) => {}
                Some(s) => return Err(format!("member {i} at ngl {ngl} with the others resident: {}", s.as_str())),
                None => return Err(format!("member {i} at ngl {ngl} was never measured with the others resident")),
            }
        }
        if set.s_per_token.is_none() {
            return Err("a member's speed was not measured".into());
        }
        #[allow(clippy::cast_precision_loss)]
        match (cap_bytes, set.device_bytes) {
            (None, _) => {}
            (Some(cap), Some(b)) if b as f64 <= cap && set.under_cap => {}
            (Some(cap), Some(b)) => {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let cap = human_bytes(cap.max(0.0) as u64);
                return Err(format!("the set took {} on the device, over the cap of {cap}", human_bytes(b)));
            }
            (Some(_), None) => return Err("the set's device memory was not measured".into()),
        }
        Ok(AdmittedSet(set.clone()))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::placement::KvType;

    const MIB: f64 = 1024.0 * 1024.0;

    pub(crate) fn trial(p: &Placement, mem: f64, over_cap: bool) -> ProfileTrial {
        let mut spec = crate::engine::test_spec();
        spec.placement = p.clone();
        let mut result = crate::types::TrialResult::failed(spec, TrialStatus::Ok, String::new());
        result.reason = None;
        ProfileTrial {
            role: crate::types::Role::Grid,
            mem_bytes: Some(mem),
            device_peak_bytes: None,
            device_share: None,
            over_cap,
            predicted_bytes: None,
            prediction_error_pct: None,
            sampled_minus_predicted_bytes: None,
            result,
        }
    }

    fn answer(ngl: u32, kv: KvType) -> Recommendation {
        let mut r = crate::tune::worlds::recommendation();
        r.set_placement(&Placement::default().with_layers(ngl, 2, Some(32768)).with_kv(kv));
        r
    }

    fn gate<'a>(trials: &'a [ProfileTrial], predicted: &'a [Prediction]) -> Gate<'a> {
        Gate {
            trials,
            predicted,
            cap_bytes: Some(100.0 * MIB),
            unaccounted: 10 << 20,
            host_bytes: None,
            max_power_w: None,
            drafts: &[],
        }
    }

    fn price(ngl: u32, mib: u64) -> Prediction {
        let bytes = mib << 20;
        Prediction {
            n_gpu_layers: ngl,
            device_bytes: bytes,
            device_model_bytes: bytes,
            buffers: Vec::new(),
            error: None,
            case: Some(crate::engine::predict::PredictCase::layers(ngl, 32768)),
            split: Vec::new(),
            devices: Vec::new(),
        }
    }

    /// Measured under the cap: admitted by its trials. A trial of it over
    /// the cap refuses it, whatever another trial said; one of another
    /// placement (another KV type) says nothing of it.
    #[test]
    fn an_answer_is_admitted_by_trials_of_exactly_its_placement() {
        let a = answer(7, KvType::F16);
        let ran = [trial(&a.runs(), 80.0 * MIB, false)];
        let ok = gate(&ran, &[]).admit(a.clone(), KvType::F16).unwrap();
        assert_eq!(ok.evidence(), &Evidence::Measured { trials: 1, mem_bytes: Some(80.0 * MIB) });
        assert_eq!(ok.placement.n_gpu_layers, 7);
        let over = [trial(&a.runs(), 80.0 * MIB, false), trial(&a.runs(), 120.0 * MIB, true)];
        let no = gate(&over, &[]).admit(a.clone(), KvType::F16).unwrap_err();
        assert_eq!(no.why, "measured at 120.00 MiB, over the cap of 100.00 MiB");
        let other = [trial(&answer(7, KvType::Q8_0).runs(), 50.0 * MIB, false)];
        assert!(gate(&other, &[]).admit(a, KvType::F16).unwrap_err().why.contains("neither measured nor priced"));
    }

    /// Not measured: its dry run plus what the trials held beyond their
    /// prices decides (85 + 10 under 100; 95 + 10 over it).
    #[test]
    fn an_unmeasured_answer_is_admitted_by_its_price_and_the_unaccounted_share() {
        let a = answer(9, KvType::F16);
        let ok = gate(&[], &[price(9, 85)]).admit(a.clone(), KvType::F16).unwrap();
        assert_eq!(ok.evidence(), &Evidence::Priced { bytes: 85 << 20, unaccounted: 10 << 20 });
        let no = gate(&[], &[price(9, 95)]).admit(a.clone(), KvType::F16).unwrap_err();
        assert!(no.why.starts_with("priced at 105.00 MiB, over the cap of 100.00 MiB"), "{}", no.why);
        // No offload device: nothing to cap.
        let cpu = Gate { cap_bytes: None, ..gate(&[], &[]) };
        assert_eq!(cpu.admit(a, KvType::F16).unwrap().evidence(), &Evidence::Uncapped);
    }

    /// The host's cap and the power cap bind every answer, not only whole
    /// layers; the power cap reads only placements with layers on the GPU.
    #[test]
    fn the_host_and_power_caps_refuse_an_answer_over_them() {
        let a = answer(7, KvType::F16);
        let mut pr = price(7, 50);
        pr.buffers.push(crate::engine::predict::PredictedBuffer {
            buffer_type: "CPU_Mapped".into(),
            is_host: true,
            model: 5000 << 20,
            context: 0,
            compute: 0,
        });
        let ran = [trial(&a.runs(), 80.0 * MIB, false)];
        let host = Gate { host_bytes: Some(4000 << 20), ..gate(&ran, std::slice::from_ref(&pr)) };
        assert!(host.admit(a.clone(), KvType::F16).unwrap_err().why.contains("over the host cap"));
        let mut hot = trial(&a.runs(), 80.0 * MIB, false);
        let mut tg = crate::types::TestResult::from_samples(0, 16, 256, vec![1_000_000_000; 2]);
        tg.power_w = Some(300.0);
        hot.result.tests.push(tg);
        let hot = [hot];
        let power = Gate { max_power_w: Some(250.0), ..gate(&hot, &[]) };
        assert!(power.admit(a, KvType::F16).unwrap_err().why.contains("over --max-power 250 W"));
        // Every layer on the CPU: what the GPUs draw is not its own.
        let cpu = answer(0, KvType::F16);
        let mut idle = trial(&cpu.runs(), 0.0, false);
        idle.result.tests.push(hot[0].result.tests[0].clone());
        let idle = [idle];
        assert!(Gate { max_power_w: Some(250.0), ..gate(&idle, &[]) }.admit(cpu, KvType::F16).is_ok());
    }

    /// A profile read back holds its answer as written.
    #[test]
    fn a_stored_answer_reads_back_as_it_was_written() {
        let a = Admitted::for_test(answer(7, KvType::F16));
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v, serde_json::to_value(&*a).unwrap(), "the JSON is the recommendation's own");
        let back: Admitted = serde_json::from_value(v).unwrap();
        assert_eq!((back.evidence(), back.placement.n_gpu_layers), (&Evidence::Stored, 7));
    }

    /// Issue 54 item 1 for `--together`: a set reaches the profile only
    /// through [`AdmittedSet::admit`]: each member measured with the
    /// others resident at the set's layers, and the whole under the cap.
    #[test]
    fn a_set_is_admitted_only_measured_whole_and_under_the_cap() {
        let set_trial = |member: usize, ngl: u32, status: TrialStatus| {
            let mut t = trial(&Placement::default().with_layers(ngl, 2, Some(4096)), 0.0, false);
            t.result.status = status;
            crate::profile::SetTrial { member, beside: vec![(1 - member, 9)], beside_bytes: None, result: t.result }
        };
        let set = crate::profile::MeasuredSet {
            n_gpu_layers: vec![7, 9],
            predicted_s_per_token: 0.1,
            s_per_token: Some(0.1),
            tg_ts: vec![Some(10.0), Some(10.0)],
            device_bytes: Some(90 << 20),
            under_cap: true,
            recommended: false,
        };
        let mut ok = vec![set_trial(0, 7, TrialStatus::Ok), set_trial(1, 9, TrialStatus::Ok)];
        ok[1].beside = vec![(0, 7)];
        let cap = Some(100.0 * MIB);
        assert_eq!(AdmittedSet::admit(&set, &ok, cap).map(|a| a.n_gpu_layers.clone()), Ok(vec![7, 9]));
        assert!(AdmittedSet::admit(&set, &ok, None).is_ok(), "no offload device: nothing to hold");
        let over = crate::profile::MeasuredSet { device_bytes: Some(110 << 20), ..set.clone() };
        assert!(AdmittedSet::admit(&over, &ok, cap).unwrap_err().contains("over the cap"));
        let mut oom = ok.clone();
        oom[1].result.status = TrialStatus::Oom;
        assert!(AdmittedSet::admit(&set, &oom, cap).unwrap_err().contains("member 1 at ngl 9"));
        // A member measured alone (nothing beside it) is not the set's evidence.
        let mut alone = ok;
        alone[0].beside.clear();
        assert!(AdmittedSet::admit(&set, &alone, cap).unwrap_err().contains("never measured with the others resident"));
    }

    /// A placement with a draft is admitted by the draft stage's load of
    /// exactly it (both contexts plus the driver's share under the cap),
    /// never by trials of its target alone; over the cap or under
    /// `--max-power` it is refused.
    #[test]
    fn a_draft_is_admitted_by_its_own_load_only() {
        let plain = answer(20, KvType::F16);
        let mut with = plain.clone();
        with.set_placement(&Placement {
            draft: Some(crate::placement::Draft::of("d.gguf".into())),
            ..plain.placement.clone()
        });
        let ran = [trial(&plain.placement, 60.0 * MIB, false)];
        let refused = gate(&ran, &[]).admit(with.clone(), KvType::F16).unwrap_err();
        assert_eq!(refused.why, "not measured with its draft under the caps");
        let load = |mib: u64| crate::profile::DraftOption {
            fits: true,
            loads: 1,
            device_bytes: Some(mib << 20),
            chosen: true,
            ..crate::profile::DraftOption::unmeasured("every draft layer on the device".into(), with.placement.clone())
        };
        let under = [load(85)];
        let a = Gate { drafts: &under, ..gate(&ran, &[]) }.admit(with.clone(), KvType::F16).unwrap();
        assert_eq!(*a.evidence(), Evidence::MeasuredWithDraft { loads: 1, device_bytes: 85 << 20 });
        // 95 MiB and the driver's 10 are over 100.
        let over = [load(95)];
        let why = Gate { drafts: &over, ..gate(&ran, &[]) }.admit(with.clone(), KvType::F16).unwrap_err().why;
        assert!(why.starts_with("measured with its draft at 105.00 MiB, over the cap"), "{why}");
        let power = Gate { drafts: &under, max_power_w: Some(300.0), ..gate(&ran, &[]) };
        assert!(power.admit(with, KvType::F16).unwrap_err().why.contains("--max-power"));
    }
}
