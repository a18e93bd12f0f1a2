//! One split across several devices, as the split stage priced or
//! measured it.

use serde::{Deserialize, Serialize};

use crate::placement::{KvType, Placement, SplitMode};
use crate::types::Quality;

/// One split: priced by the dry run, measured where it could win. Its
/// placement is what its trial ran (or the dry run priced); its layers per
/// device in llama.cpp's order and the order they fill in are the split as
/// the devices' speeds and caps see it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(into = "StoredSplitOption", from = "StoredSplitOption")]
pub struct SplitOption {
    /// How it was made: "by capacity", "fill in device order", "llama.cpp's default split", ...
    pub label: String,
    /// What its trial ran: layers, threads, the KV cache (the workload's
    /// own, or the hatch's q8_0 cache where it lets more layers onto the
    /// faster devices), the FFN spill, the devices in their order, `-ts`,
    /// `-sm`, the servers and the workload.
    pub placement: Placement,
    /// Layers per offload device, in llama.cpp's device order (empty:
    /// llama.cpp's default by free memory).
    pub tensor_split: Vec<u32>,
    /// The order the devices take layers in (`--device`): indices into
    /// llama.cpp's order; empty: llama.cpp's order.
    pub order: Vec<u32>,
    /// Bytes per device by the dry run, in the devices' order.
    pub predicted_bytes: Vec<u64>,
    /// Bytes per device llama.cpp allocated in the trial.
    pub accounted_bytes: Vec<u64>,
    pub measured: bool,
    pub tg_ts: Option<f64>,
    pub pp_ts: Option<f64>,
    /// Under every device's cap (by the trial where measured).
    pub fits: bool,
    pub recommended: bool,
    pub note: String,
    /// A quantized cache's quality against f16, where measured.
    pub quality: Option<Quality>,
    /// The rates each device's measured speed predicts for this split
    /// (`tune::speed`), where the probes ran.
    pub predicted_tg_ts: Option<f64>,
    pub predicted_pp_ts: Option<f64>,
}

impl SplitOption {
    /// llama.cpp's flags for this split, rendered from its placement.
    #[must_use]
    pub fn llama_cpp_args(&self) -> String {
        self.placement.flags()
    }
}

/// A split as the profile's JSON holds it: its placement whole
/// (`placement`), and beside it, for those who read the row, its layers,
/// `-sm`, KV type, FFN spill and flags as the rows before it had them.
/// Rows from before the placement was kept are read from those.
#[derive(Serialize, Deserialize)]
struct StoredSplitOption {
    label: String,
    n_gpu_layers: u32,
    tensor_split: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    order: Vec<u32>,
    #[serde(default, skip_serializing_if = "crate::placement::is_layer")]
    split_mode: SplitMode,
    predicted_bytes: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    accounted_bytes: Vec<u64>,
    measured: bool,
    tg_ts: Option<f64>,
    pp_ts: Option<f64>,
    fits: bool,
    recommended: bool,
    note: String,
    #[serde(default)]
    llama_cpp_args: String,
    #[serde(default, skip_serializing_if = "crate::types::is_f16")]
    kv_type: KvType,
    #[serde(default, skip_serializing_if = "crate::types::is_zero")]
    n_cpu_ffn: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quality: Option<Quality>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    predicted_tg_ts: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    predicted_pp_ts: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    placement: Option<Placement>,
}

impl From<SplitOption> for StoredSplitOption {
    fn from(o: SplitOption) -> Self {
        let p = &o.placement;
        StoredSplitOption {
            label: o.label,
            n_gpu_layers: p.n_gpu_layers,
            tensor_split: o.tensor_split,
            order: o.order,
            split_mode: p.split_mode,
            predicted_bytes: o.predicted_bytes,
            accounted_bytes: o.accounted_bytes,
            measured: o.measured,
            tg_ts: o.tg_ts,
            pp_ts: o.pp_ts,
            fits: o.fits,
            recommended: o.recommended,
            note: o.note,
            llama_cpp_args: p.flags(),
            kv_type: p.kv_type,
            n_cpu_ffn: p.n_cpu_ffn,
            quality: o.quality,
            predicted_tg_ts: o.predicted_tg_ts,
            predicted_pp_ts: o.predicted_pp_ts,
            placement: Some(o.placement),
        }
    }
}

impl From<StoredSplitOption> for SplitOption {
    fn from(s: StoredSplitOption) -> Self {
        // An older row: its flags as llama.cpp reads them, its own fields over them.
        let placement = s.placement.unwrap_or_else(|| Placement {
            n_gpu_layers: s.n_gpu_layers,
            kv_type: s.kv_type,
            n_cpu_ffn: s.n_cpu_ffn,
            split_mode: s.split_mode,
            ..crate::placement::args::parse_placement(&s.llama_cpp_args).unwrap_or_default()
        });
        SplitOption {
            label: s.label,
            placement,
            tensor_split: s.tensor_split,
            order: s.order,
            predicted_bytes: s.predicted_bytes,
            accounted_bytes: s.accounted_bytes,
            measured: s.measured,
            tg_ts: s.tg_ts,
            pp_ts: s.pp_ts,
            fits: s.fits,
            recommended: s.recommended,
            note: s.note,
            quality: s.quality,
            predicted_tg_ts: s.predicted_tg_ts,
            predicted_pp_ts: s.predicted_pp_ts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written with its placement whole and the row's fields from it;
    /// read back as the same split. An older row (no `placement`) is read
    /// from its flags.
    #[test]
    fn a_split_is_written_with_its_placement_and_older_rows_read_from_their_flags() {
        let p = Placement::default()
            .with_layers(22, 4, Some(8192))
            .with_kv(KvType::Q8_0)
            .with_split(&[13, 9], &["10.0.0.2:50052".to_string()])
            .with_devices(&["Vulkan0".to_string(), "RPC0[10.0.0.2:50052]".to_string()]);
        let o = SplitOption {
            label: "by capacity".into(),
            placement: p.clone(),
            tensor_split: vec![9, 13],
            order: vec![1, 0],
            measured: true,
            tg_ts: Some(11.0),
            fits: true,
            ..SplitOption::default()
        };
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!((v["n_gpu_layers"].as_u64(), v["kv_type"].as_str()), (Some(22), Some("q8_0")));
        assert_eq!(v["tensor_split"], serde_json::json!([9, 13]), "llama.cpp's order, as the devices see it");
        assert_eq!(v["placement"]["tensor_split"], serde_json::json!([13, 9]), "the order they take layers in");
        assert_eq!(v["llama_cpp_args"].as_str(), Some(p.flags().as_str()));
        assert!(p.flags().contains("--device 'Vulkan0,RPC0") && p.flags().contains("-ts 13,9"), "{}", p.flags());
        assert_eq!(serde_json::from_value::<SplitOption>(v.clone()).unwrap(), o);

        let mut old = v;
        old.as_object_mut().unwrap().remove("placement");
        let back: SplitOption = serde_json::from_value(old).unwrap();
        assert_eq!(back.placement, p, "{:?} vs {:?}", back.placement, p);
    }
}
