//! What a dry run prices, read against the trial it stands for.

use super::*;

fn whole_layers(ngl: u32) -> Prediction {
    Prediction {
        n_gpu_layers: ngl,
        device_bytes: 1,
        device_model_bytes: 1,
        buffers: Vec::new(),
        error: None,
        case: None,
        split: Vec::new(),
        devices: Vec::new(),
    }
}

#[test]
fn a_whole_layer_prediction_prices_the_trial_at_the_tunes_own_kv_type_not_only_f16() {
    let mut spec = crate::engine::test_spec();
    spec.placement = spec.placement.with_layers(4, 2, Some(256));
    assert!(whole_layers(4).prices(&spec));
    // A server forcing q8_0: its trials run q8_0, and the tune's dry run priced q8_0.
    spec.kv_base = crate::placement::KvType::Q8_0;
    spec.placement = spec.placement.with_kv(crate::placement::KvType::Q8_0);
    assert!(whole_layers(4).prices(&spec));
    assert!(!whole_layers(3).prices(&spec));
    // A case naming f16 is not that trial; one naming q8_0 is.
    let case = |kv| {
        let c = PredictCase { kv_type: Some(kv), ..PredictCase::layers(4, 256) };
        Prediction { case: Some(c), ..whole_layers(4) }
    };
    assert!(!case(crate::placement::KvType::F16).prices(&spec));
    assert!(case(crate::placement::KvType::Q8_0).prices(&spec));
}
