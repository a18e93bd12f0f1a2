//! What a tune's settings say beyond their fields: the consumer, the
//! depth of each context, the streams decoded together.

use super::{Caps, ConsumerRead, Settings};

impl Settings {
    /// The consumer's settings where Ollama is the consumer (its server's
    /// environment, found or its defaults).
    #[must_use]
    pub fn ollama(&self) -> Option<&ConsumerRead> {
        self.consumer.as_ref().filter(|c| c.program == crate::consumer::Program::Ollama)
    }

    /// What the tune's scores weigh: its objective and test sizes.
    #[must_use]
    pub fn scoring(&self) -> crate::types::Scoring {
        crate::types::Scoring {
            objective: self.goal.objective,
            n_prompt: self.measure.n_prompt,
            n_gen: self.measure.n_gen,
        }
    }

    /// Makes each context `n` slots of itself, decoded together
    /// (`--objective throughput --parallel N`): the KV cache sized for `n`
    /// sequences, `-np n`; a consumer's own slots are replaced.
    pub fn decode_together(&mut self, n: u32) {
        self.into_slots(n);
        self.goal.parallel_streams = Some(n);
    }

    /// Makes each context `n` slots of one slot's context (`-c ctx x n
    /// -np n`, as llama-server splits it and Ollama starts it); slots set
    /// before are replaced.
    pub fn into_slots(&mut self, n: u32) {
        self.workload.into_slots(n);
    }

    /// The depth a context is measured at: `--depth`, else half the
    /// context (where tg equals its mean over a filled window), always
    /// leaving room for the longer test.
    #[must_use]
    pub fn depth_at(&self, n_ctx: u32) -> u32 {
        let slot = n_ctx / self.workload.n_parallel.max(1);
        let room = slot.saturating_sub(self.measure.longest_test());
        self.measure.n_depth.unwrap_or(slot / 2).min(room)
    }

    /// The depth rule in words, for the report.
    #[must_use]
    pub fn depth_rule(&self) -> String {
        let at: Vec<String> = self.contexts().iter().map(|c| format!("{} at {c}", self.depth_at(*c))).collect();
        match self.measure.n_depth {
            None => format!(
                "depth: half of each context ({}): each test runs with that many tokens already in the KV cache, where tg equals its mean over a filled window; --depth sets it",
                at.join(", ")
            ),
            Some(0) => "depth: 0 (an empty KV cache before each test)".to_string(),
            Some(_) => format!("depth: --depth ({}) tokens in the KV cache before each test", at.join(", ")),
        }
    }

    /// The context sizes tuned, ascending.
    #[must_use]
    pub fn contexts(&self) -> Vec<u32> {
        if self.workload.contexts.is_empty() {
            vec![self.workload.n_ctx]
        } else {
            self.workload.contexts.clone()
        }
    }
}

impl Caps {
    /// `--target-vram` alone: no budgets, no power cap.
    #[must_use]
    pub fn target(target_vram: f64) -> Caps {
        Caps {
            target_vram,
            vram_budget_bytes: None,
            device_budgets: Vec::new(),
            host_budget_bytes: None,
            max_power_w: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The caps, the search policy and the workload are groups in the code
    /// and plain fields of `settings` in the profile, where readers of the
    /// JSON and older profiles have them.
    #[test]
    fn groups_are_fields_of_the_stored_settings() {
        let mut v = serde_json::json!({
            "target_vram": 0.8, "vram_budget_bytes": 1000, "n_ctx": 4096, "n_prompt": 64, "n_gen": 16,
            "repetitions": 2, "n_threads": 2, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1,
            "objective": "tg", "grid": null, "quick": false, "no_skip": false, "trial_timeout_s": 60,
            "sample_interval_ms": 20
        });
        let s: Settings = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(s.caps, Caps { vram_budget_bytes: Some(1000), ..Caps::target(0.8) });
        let out = serde_json::to_value(&s).unwrap();
        assert!(
            ["caps", "policy", "workload", "gate", "measure", "goal", "backend"].iter().all(|g| out.get(g).is_none()),
            "{out}"
        );
        assert_eq!((s.measure.n_prompt, s.measure.n_depth, s.measure.warmup), (64, Some(0), true), "older profiles");
        assert!(out["n_depth"] == 0 && out.get("warmup").is_none(), "{out}");
        assert_eq!(s.gate, crate::types::QualityGate::default(), "profiles from before the gate: its defaults");
        assert_eq!(
            (s.goal.objective, s.goal.reading_speed, s.goal.parallel_streams, s.goal.job),
            (crate::types::Objective::Tg, crate::types::DEFAULT_READING_SPEED, None, None),
            "profiles from before the reading speed, streams and job"
        );
        assert!(out["objective"] == "tg" && out.get("reading_speed").is_none() && out.get("job").is_none(), "{out}");
        assert!(out.get("max_kl").is_none() && out.get("min_top1").is_none(), "the defaults: not written");
        assert_eq!((s.workload.n_ctx, s.workload.n_parallel, s.workload.kv_type), (4096, 1, crate::types::KvType::F16));
        assert!(out.get("contexts").is_none() && out.get("n_parallel").is_none(), "defaults: not written");
        assert_eq!(out["n_ubatch"], 512);
        assert_eq!(
            (s.backend.n_threads, s.backend.op_offload, s.backend.rpc.len(), &s.backend.mmproj),
            (2, crate::types::OpOffload::default(), 0, &None),
            "profiles from before op offload, RPC and the projector"
        );
        assert!(out["n_threads"] == 2 && out.get("rpc").is_none() && out.get("mmproj").is_none(), "{out}");
        assert_eq!(
            (&out["trial_timeout_s"], &out["grid"], &out["busy_threshold"]),
            (&60.into(), &serde_json::Value::Null, &0.1.into())
        );
        assert_eq!(s.policy.search, crate::types::SearchMode::Grid, "profiles from before the field: grid");
        assert!(out.get("host_budget_bytes").is_none() && out.get("device_budgets").is_none(), "unset: not written");

        v["device_budgets"] = serde_json::json!([{ "device": "RPC0", "bytes": 5 }]);
        v["host_budget_bytes"] = 7.into();
        v["max_power_w"] = 250.0.into();
        v["max_kl"] = 0.01.into();
        v["objective"] = "throughput".into();
        v["parallel_streams"] = 4.into();
        v["job"] = serde_json::json!({ "requests": 500, "n_gen": 800 });
        v["rpc"] = serde_json::json!(["10.0.0.2:50052"]);
        v["mmproj"] = "mmproj-f16.gguf".into();
        let s: Settings = serde_json::from_value(v).unwrap();
        assert_eq!((s.gate.max_kl, s.gate.min_top1), (0.01, crate::types::DEFAULT_MIN_TOP1));
        assert_eq!((s.goal.streams(), s.goal.job.map(|j| j.requests)), (4, Some(500)));
        assert_eq!(
            (s.backend.rpc[0].as_str(), s.backend.mmproj.as_deref()),
            ("10.0.0.2:50052", Some("mmproj-f16.gguf".as_ref()))
        );
        assert_eq!(
            (s.caps.device_budgets[0].bytes, s.caps.host_budget_bytes, s.caps.max_power_w),
            (5, Some(7), Some(250.0))
        );
        let out = serde_json::to_value(&s).unwrap();
        assert_eq!(
            (&out["device_budgets"][0]["device"], &out["host_budget_bytes"], &out["max_power_w"]),
            (&"RPC0".into(), &7.into(), &250.0.into())
        );
        assert_eq!(
            (&out["max_kl"], &out["parallel_streams"], &out["job"]["n_gen"]),
            (&0.01.into(), &4.into(), &800.into())
        );
        assert_eq!(serde_json::from_value::<Settings>(out).unwrap(), s, "read back as written");
    }
}
