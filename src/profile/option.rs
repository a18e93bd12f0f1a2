//! The escape hatches at one context, each as the placement its trial ran
//! (or its dry run priced) and what that placement measured.

use serde::{Deserialize, Serialize};

use crate::placement::Placement;
use crate::types::Quality;

/// One way to run the model at a context, in the order the guide ranks
/// them: a quantized KV cache, a shorter context, FFN weights on the CPU,
/// whole layers on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HatchKind {
    /// Every layer on the GPU with a quantized KV cache.
    KvCache,
    /// The largest context that fits fully (another workload: predicted).
    ShorterContext,
    /// Every layer on the GPU, the dense FFN weights of the first K layers on the CPU.
    FfnSpill,
    /// The best whole-layer split (what Ollama's num_gpu can express).
    LayerSplit,
}

/// One escape hatch at one context: measured, or predicted with the reason.
/// Its placement is the same value a trial runs and a recommendation
/// holds; the JSON keeps its fields flat beside the measurements, with its
/// llama.cpp flags (`llama_cpp_args`) rendered from it when written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "StoredOption", try_from = "StoredOption")]
pub struct PlacementOption {
    pub kind: HatchKind,
    /// What its trial ran, or what llama.cpp's dry run priced: the
    /// workload's batch, slots and projector, at this option's context.
    pub placement: Placement,
    pub measured: bool,
    pub tg_ts: Option<f64>,
    pub pp_ts: Option<f64>,
    /// Standard error of the measured means (t/s): the noise a lossy option
    /// must beat a lossless one by.
    pub tg_se_ts: Option<f64>,
    pub pp_se_ts: Option<f64>,
    /// Device memory: the trial's (policy's currency) when measured, else llama.cpp's dry run.
    pub device_bytes: Option<u64>,
    /// Under the cap (by measurement where measured).
    pub fits: bool,
    /// Quality against the reference (f16 KV): mean KL divergence of the
    /// token distributions and how often the top token agrees.
    pub quality: Option<Quality>,
    pub recommended: bool,
    /// Why it was not measured, or what it costs or gains against the recommendation.
    pub note: String,
}

impl PlacementOption {
    /// The context it runs at (the whole context of its slots).
    #[must_use]
    pub fn n_ctx(&self) -> u32 {
        self.placement.n_ctx.unwrap_or(0)
    }

    /// llama.cpp's flags for this option, rendered from its placement.
    #[must_use]
    pub fn llama_cpp_args(&self) -> String {
        self.placement.flags()
    }

    /// The option in words: "q8_0 KV cache, every layer on the GPU".
    #[must_use]
    pub fn describe(&self) -> String {
        let p = &self.placement;
        let n = p.n_gpu_layers;
        match self.kind {
            HatchKind::KvCache => format!("{} KV cache at ngl {n}", p.kv_type.as_str()),
            HatchKind::ShorterContext => {
                format!("{} context at ngl {n} ({} KV cache)", self.n_ctx(), p.kv_type.as_str())
            }
            HatchKind::FfnSpill => {
                format!("ngl {n} with the FFN weights of {} layers on the CPU (-ot)", p.n_cpu_ffn)
            }
            HatchKind::LayerSplit => format!("ngl {n}, whole layers (the layer split)"),
        }
    }
}

/// An option as the profile's JSON holds it: the placement's fields flat,
/// and its flags rendered. Profiles written before the option held a whole
/// placement kept only its context, layers, FFN spill and cache type beside
/// those flags; their placement is read back from the flags.
#[derive(Serialize, Deserialize)]
struct StoredOption {
    kind: HatchKind,
    #[serde(flatten)]
    placement: serde_json::Map<String, serde_json::Value>,
    measured: bool,
    tg_ts: Option<f64>,
    pp_ts: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tg_se_ts: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pp_se_ts: Option<f64>,
    device_bytes: Option<u64>,
    fits: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quality: Option<Quality>,
    recommended: bool,
    note: String,
    #[serde(default)]
    llama_cpp_args: String,
}

impl From<PlacementOption> for StoredOption {
    fn from(o: PlacementOption) -> Self {
        let llama_cpp_args = o.llama_cpp_args();
        StoredOption {
            kind: o.kind,
            placement: placement_fields(&o.placement),
            measured: o.measured,
            tg_ts: o.tg_ts,
            pp_ts: o.pp_ts,
            tg_se_ts: o.tg_se_ts,
            pp_se_ts: o.pp_se_ts,
            device_bytes: o.device_bytes,
            fits: o.fits,
            quality: o.quality,
            recommended: o.recommended,
            note: o.note,
            llama_cpp_args,
        }
    }
}

impl TryFrom<StoredOption> for PlacementOption {
    type Error = serde_json::Error;

    fn try_from(s: StoredOption) -> Result<Self, Self::Error> {
        Ok(PlacementOption {
            kind: s.kind,
            placement: stored_placement(s.placement, &s.llama_cpp_args)?,
            measured: s.measured,
            tg_ts: s.tg_ts,
            pp_ts: s.pp_ts,
            tg_se_ts: s.tg_se_ts,
            pp_se_ts: s.pp_se_ts,
            device_bytes: s.device_bytes,
            fits: s.fits,
            quality: s.quality,
            recommended: s.recommended,
            note: s.note,
        })
    }
}

/// A placement's fields as its JSON object holds them.
pub(super) fn placement_fields(p: &Placement) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(p) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => unreachable!("a placement is written as a JSON object"),
    }
}

/// The placement of a stored record (an option, a comparison's opponent, a
/// set's member): its fields where it has them all; an older record's
/// flags as llama.cpp reads them, its own fields over them; else its
/// fields over llama.cpp's defaults.
pub(super) fn stored_placement(
    fields: serde_json::Map<String, serde_json::Value>,
    flags: &str,
) -> Result<Placement, serde_json::Error> {
    // Every placement written whole has its batch size; older records never did.
    let whole = fields.contains_key("n_batch");
    let base = if whole { None } else { crate::placement::args::parse_placement(flags).ok() };
    let mut merged = placement_fields(&base.unwrap_or_default());
    merged.extend(fields);
    serde_json::from_value(serde_json::Value::Object(merged))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::KvType;

    fn option(placement: Placement) -> PlacementOption {
        PlacementOption {
            kind: HatchKind::FfnSpill,
            placement,
            measured: true,
            tg_ts: Some(12.5),
            pp_ts: Some(300.0),
            tg_se_ts: Some(0.1),
            pp_se_ts: None,
            device_bytes: Some(5 << 30),
            fits: true,
            quality: None,
            recommended: true,
            note: String::new(),
        }
    }

    /// Written with its placement's fields flat and its flags rendered from
    /// them; read back as the same option.
    #[test]
    fn an_option_is_written_as_its_placement_and_flags_and_read_back_whole() {
        let p = Placement { n_cpu_ffn: 3, n_batch: 1024, n_ubatch: 1024, ..Placement::default() }
            .with_layers(33, 8, Some(32768))
            .with_kv(KvType::Q8_0)
            .with_parallel(2);
        let o = option(p.clone());
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!(
            (v["n_gpu_layers"].as_u64(), v["n_ctx"].as_u64(), v["n_cpu_ffn"].as_u64()),
            (Some(33), Some(32768), Some(3))
        );
        assert_eq!(
            (v["kv_type"].as_str(), v["n_parallel"].as_u64(), v["n_threads"].as_u64()),
            (Some("q8_0"), Some(2), Some(8))
        );
        assert_eq!(v["llama_cpp_args"].as_str(), Some(p.flags().as_str()));
        assert!(p.flags().contains("-ctk q8_0 -ctv q8_0") && p.flags().contains("-np 2"), "{}", p.flags());
        assert_eq!(v.get("pp_se_ts"), None, "an absent figure is left out");
        let back: PlacementOption = serde_json::from_value(v).unwrap();
        assert_eq!(back, o);
        assert_eq!(back.n_ctx(), 32768);
    }

    /// A profile from before the option held its placement: its flags give
    /// the workload (threads, batch, slots), its own fields what it moved.
    #[test]
    fn an_older_option_reads_its_placement_from_its_flags() {
        let v = serde_json::json!({
            "kind": "kv_cache", "n_ctx": 8192, "n_gpu_layers": 20, "kv_type": "q4_0", "measured": false,
            "tg_ts": null, "pp_ts": null, "device_bytes": 123, "fits": true, "recommended": false,
            "note": "predicted", "llama_cpp_args": "-ngl 20 -t 6 -c 8192 -b 512 -ub 256 -ctk q4_0 -ctv q4_0 -fa on"
        });
        let o: PlacementOption = serde_json::from_value(v).unwrap();
        let p = &o.placement;
        assert_eq!((p.n_gpu_layers, p.n_threads, p.n_ctx, p.n_batch, p.n_ubatch), (20, 6, Some(8192), 512, 256));
        assert_eq!((p.kv_type, o.kind, o.device_bytes), (KvType::Q4_0, HatchKind::KvCache, Some(123)));
        assert_eq!(o.llama_cpp_args(), "-ngl 20 -t 6 -c 8192 -b 512 -ub 256 -ctk q4_0 -ctv q4_0 -fa on");
        // Without flags: its own fields over llama.cpp's defaults.
        let bare: PlacementOption = serde_json::from_value(serde_json::json!({
            "kind": "layer_split", "n_ctx": 4096, "n_gpu_layers": 7, "measured": true, "tg_ts": 3.0,
            "pp_ts": 9.0, "device_bytes": null, "fits": true, "recommended": true, "note": ""
        }))
        .unwrap();
        assert_eq!((bare.placement.n_gpu_layers, bare.n_ctx(), bare.placement.kv_type), (7, 4096, KvType::F16));
    }
}
