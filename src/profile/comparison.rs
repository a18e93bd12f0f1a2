//! The answer against another program's own run at one context:
//! llama.cpp's default, Ollama's own run, or llama.cpp's splits.

use serde::{Deserialize, Serialize};

use crate::placement::Placement;

/// The recommendation against llama.cpp's default at one context: the
/// placement llama.cpp's fit chooses without flags (1 GiB free per device),
/// both measured at the same depth, alternated (A/B/A/B) so drift cancels.
/// The JSON keeps the opponent's placement flat (`n_gpu_layers` null where
/// it could not be placed) with its flags rendered from it when written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "StoredComparison", try_from = "StoredComparison")]
pub struct DefaultComparison {
    /// What the opponent runs (its layers, threads, context, fit's CPU
    /// tensors, its batch), as its paired trials ran; `None` where it
    /// could not be placed (the note says why).
    pub placement: Option<Placement>,
    /// Alternated pairs measured.
    pub pairs: u32,
    pub n_depth: u32,
    /// Recommendation over default, and the half width of its 95% interval
    /// (kept for readers of older profiles: the interval is not symmetric).
    pub tg_ratio: Option<f64>,
    pub tg_half_width: Option<f64>,
    pub pp_ratio: Option<f64>,
    pub pp_half_width: Option<f64>,
    /// The 95% interval of each ratio, its two ends (the verdict's
    /// statistic); `None` in profiles from before it was kept.
    pub tg_interval: Option<[f64; 2]>,
    pub pp_interval: Option<[f64; 2]>,
    pub verdict: Verdict,
    pub note: String,
    /// The default took more than the user's cap (measured, or llama.cpp's
    /// dry run where it could not run): reported, never recommended.
    pub over_cap: bool,
    /// llama.cpp's dry run of what its fit chose (device bytes).
    pub predicted_bytes: Option<u64>,
    /// The most device memory its paired trials took (the policy's currency).
    pub mem_bytes: Option<f64>,
    /// The verdict is the race's: the baseline was cut short in every pair
    /// (below half the answer's speed each time); the interval of the few
    /// tokens it timed is too wide to say it.
    pub by_race: bool,
}

impl DefaultComparison {
    /// A comparison not measured yet, at `depth`.
    #[must_use]
    pub fn unmeasured(depth: u32) -> DefaultComparison {
        DefaultComparison {
            placement: None,
            pairs: 0,
            n_depth: depth,
            tg_ratio: None,
            tg_half_width: None,
            pp_ratio: None,
            pp_half_width: None,
            tg_interval: None,
            pp_interval: None,
            verdict: Verdict::NotMeasured,
            note: String::new(),
            over_cap: false,
            predicted_bytes: None,
            mem_bytes: None,
            by_race: false,
        }
    }

    /// The layers the opponent placed (full offload as n_layer + 1).
    #[must_use]
    pub fn n_gpu_layers(&self) -> Option<u32> {
        self.placement.as_ref().map(|p| p.n_gpu_layers)
    }

    /// The opponent's placement as llama.cpp flags (what running without
    /// flags does here); empty where it could not be placed.
    #[must_use]
    pub fn llama_cpp_args(&self) -> String {
        self.placement.as_ref().map(Placement::flags).unwrap_or_default()
    }
}

/// A comparison as the profile's JSON holds it. Profiles written before
/// the comparison held a whole placement kept its layers, threads, context
/// and CPU tensors beside its flags; their placement is read from the flags.
#[derive(Serialize, Deserialize)]
struct StoredComparison {
    #[serde(flatten)]
    placement: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    llama_cpp_args: String,
    pairs: u32,
    n_depth: u32,
    tg_ratio: Option<f64>,
    tg_half_width: Option<f64>,
    pp_ratio: Option<f64>,
    pp_half_width: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tg_interval: Option<[f64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pp_interval: Option<[f64; 2]>,
    verdict: Verdict,
    note: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    over_cap: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    predicted_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mem_bytes: Option<f64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    by_race: bool,
}

impl From<DefaultComparison> for StoredComparison {
    fn from(c: DefaultComparison) -> Self {
        let llama_cpp_args = c.llama_cpp_args();
        let placement = match &c.placement {
            Some(p) => super::option::placement_fields(p),
            None => std::iter::once(("n_gpu_layers".to_string(), serde_json::Value::Null)).collect(),
        };
        StoredComparison {
            placement,
            llama_cpp_args,
            pairs: c.pairs,
            n_depth: c.n_depth,
            tg_ratio: c.tg_ratio,
            tg_half_width: c.tg_half_width,
            pp_ratio: c.pp_ratio,
            pp_half_width: c.pp_half_width,
            tg_interval: c.tg_interval,
            pp_interval: c.pp_interval,
            verdict: c.verdict,
            note: c.note,
            over_cap: c.over_cap,
            predicted_bytes: c.predicted_bytes,
            mem_bytes: c.mem_bytes,
            by_race: c.by_race,
        }
    }
}

impl TryFrom<StoredComparison> for DefaultComparison {
    type Error = serde_json::Error;

    fn try_from(s: StoredComparison) -> Result<Self, Self::Error> {
        let placed = s.placement.get("n_gpu_layers").is_some_and(|n| !n.is_null());
        // Older profiles wrote the threads and context as null where unknown.
        let fields = s.placement.into_iter().filter(|(_, v)| !v.is_null()).collect();
        Ok(DefaultComparison {
            placement: if placed { Some(super::option::stored_placement(fields, &s.llama_cpp_args)?) } else { None },
            pairs: s.pairs,
            n_depth: s.n_depth,
            tg_ratio: s.tg_ratio,
            tg_half_width: s.tg_half_width,
            pp_ratio: s.pp_ratio,
            pp_half_width: s.pp_half_width,
            tg_interval: s.tg_interval,
            pp_interval: s.pp_interval,
            verdict: s.verdict,
            note: s.note,
            over_cap: s.over_cap,
            predicted_bytes: s.predicted_bytes,
            mem_bytes: s.mem_bytes,
            by_race: s.by_race,
        })
    }
}

/// How the recommendation compares with llama.cpp's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Faster beyond the noise of the pairs.
    Faster,
    /// Within the noise: llama.cpp's default is recommended.
    Tie,
    /// The default was faster beyond the noise: it is recommended.
    Slower,
    /// The tuned placement is what llama.cpp does anyway.
    Same,
    /// The default could not be measured (the note says why).
    NotMeasured,
    /// The interval covers 1 but is wider than a tie's resolution after
    /// the most pairs the budget allows: the pairs could not tell. Nothing
    /// changes on it: the lossless answer at the user's context stays, and
    /// the consumer's own run keeps what it would do anyway.
    NotDecided,
}

impl Verdict {
    /// The verdict in words, as the report says it.
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Faster => "faster beyond the noise",
            Verdict::Tie => "within the noise",
            Verdict::Slower => "slower beyond the noise",
            Verdict::Same => "the same placement",
            Verdict::NotMeasured => "not judged",
            Verdict::NotDecided => "not decided (the pairs could not tell)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written with the opponent's placement flat and its flags; read back
    /// whole. Unplaced: `n_gpu_layers` null and no flags.
    #[test]
    fn a_comparison_is_written_as_its_opponents_placement_and_read_back() {
        let p = Placement { cpu_overrides: vec!["blk\\.1[0-9]\\.ffn_.*".into()], ..Placement::default() }
            .with_layers(25, 6, Some(131_072))
            .with_server_defaults();
        let c = DefaultComparison {
            placement: Some(p.clone()),
            pairs: 3,
            verdict: Verdict::Faster,
            tg_ratio: Some(1.3),
            ..DefaultComparison::unmeasured(512)
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(
            (v["n_gpu_layers"].as_u64(), v["n_threads"].as_u64(), v["n_ctx"].as_u64()),
            (Some(25), Some(6), Some(131_072))
        );
        assert_eq!(v["cpu_overrides"][0].as_str(), Some("blk\\.1[0-9]\\.ffn_.*"));
        assert_eq!(v["llama_cpp_args"].as_str(), Some(p.flags().as_str()));
        assert!(p.flags().contains("-ot "), "{}", p.flags());
        assert_eq!(serde_json::from_value::<DefaultComparison>(v).unwrap(), c);

        let none = DefaultComparison { note: "fit gave no layer count".into(), ..DefaultComparison::unmeasured(0) };
        let v = serde_json::to_value(&none).unwrap();
        assert!(v["n_gpu_layers"].is_null() && v["llama_cpp_args"] == "", "{v}");
        assert_eq!(serde_json::from_value::<DefaultComparison>(v).unwrap(), none);
    }

    /// A profile from before: its flags give the placement; nulls for the
    /// threads and context it did not know are left to them.
    #[test]
    fn an_older_comparison_reads_its_placement_from_its_flags() {
        let v = serde_json::json!({
            "n_gpu_layers": 13, "llama_cpp_args": "-ngl 13 -t 4 -c 40960", "pairs": 2, "n_depth": 1024,
            "tg_ratio": 1.1, "tg_half_width": 0.2, "pp_ratio": null, "pp_half_width": null,
            "verdict": "tie", "note": "within the noise", "n_threads": 4, "n_ctx": 40960
        });
        let c: DefaultComparison = serde_json::from_value(v).unwrap();
        let p = c.placement.as_ref().unwrap();
        assert_eq!((p.n_gpu_layers, p.n_threads, p.n_ctx), (13, 4, Some(40960)));
        assert_eq!(
            (c.n_gpu_layers(), c.llama_cpp_args(), c.verdict),
            (Some(13), "-ngl 13 -t 4 -c 40960".into(), Verdict::Tie)
        );
    }

    /// A split of llama.cpp's, paired: its layers per device are its
    /// placement's, written once, and read back from an older profile's
    /// `tensor_split` beside its flags.
    #[test]
    fn a_paired_split_writes_its_layers_once_and_reads_older_ones() {
        let p = Placement::default().with_layers(21, 4, Some(4096)).with_split(&[10, 11], &["h:1".to_string()]);
        let a = super::super::SplitComparison {
            against: "llama.cpp's fit for the same caps".into(),
            predicted_tg_ts: Some(20.0),
            tg_ts: None,
            result: DefaultComparison { placement: Some(p), ..DefaultComparison::unmeasured(256) },
        };
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(text.matches("\"tensor_split\"").count(), 1, "{text}");
        let back: super::super::SplitComparison = serde_json::from_str(&text).unwrap();
        assert_eq!((back.tensor_split(), &back), (&[10, 11][..], &a));
        let old = serde_json::json!({
            "against": "llama.cpp's fit for the same caps", "tensor_split": [10, 11], "n_gpu_layers": 21,
            "llama_cpp_args": "--rpc h:1 -ngl 21 -t 4 -c 4096 -ts 10,11", "pairs": 3, "n_depth": 256,
            "tg_ratio": 1.2, "tg_half_width": 0.1, "pp_ratio": null, "pp_half_width": null,
            "verdict": "faster", "note": "", "n_threads": 4
        });
        let back: super::super::SplitComparison = serde_json::from_value(old).unwrap();
        assert_eq!(
            (back.tensor_split(), back.result.placement.as_ref().map(|p| p.rpc.clone())),
            (&[10, 11][..], Some(vec!["h:1".to_string()]))
        );
    }
}
