//! Ollama's batch at each context where it is Ollama's to choose: its rule
//! stepped down for the model's predicted memory as its scheduler does
//! (server/sched.go). Ollama's own run is paired in `baseline::against`.

use super::plan::ContextRun;
use crate::engine::predict::{predict_in_child, PredictSpec};
use crate::types::Note;

use super::start::Shared;

/// Whether Ollama picks the batch itself here (no `-b`/`-ub` given, Ollama the consumer).
fn auto_batch(ollama: Option<&crate::profile::Consumer>) -> bool {
    ollama.is_some_and(|c| c.auto_batch)
}

/// The device's free memory before the trials, as Ollama's scheduler sees it.
fn available(sh: &Shared<'_>) -> u64 {
    sh.policy.as_ref().and_then(|p| p.device_total_bytes.map(|t| t.saturating_sub(p.baseline_bytes))).unwrap_or(0)
}

/// Sets Ollama's batch for this context where it is Ollama's to choose:
/// its rule, stepped down as server/sched.go does for the model's
/// predicted memory (llama.cpp's dry run of full offload at this context,
/// Ollama's prediction being of the whole model) against the device's free
/// memory. The note says what it chose and why.
pub(super) fn batch_here(sh: &Shared<'_>, at: &mut ContextRun) -> Option<Note> {
    let s = sh.opts.settings();
    if !auto_batch(s.ollama()) {
        return None;
    }
    let rule = crate::consumer::ollama::batch(at.n_ctx);
    let free = available(sh);
    let full = sh.opts.info().n_layer_full;
    let predicted = if free == 0 || rule == 512 {
        0
    } else {
        let spec = PredictSpec {
            ngl: vec![full],
            n_batch: 512,
            n_ubatch: 512,
            ..super::pricer::workload_spec(sh.opts.info(), s, *at, sh.op_offload)
        };
        let out = predict_in_child(&sh.runner, &spec).ok();
        out.and_then(|o| o.predictions.into_iter().find(|p| p.error.is_none())).map_or(0, |p| p.device_bytes)
    };
    let cuda = sh.hw.llama_devices.iter().find(|d| d.is_offload_target() && d.name.starts_with("CUDA"));
    let cuda_without_fa =
        cuda.filter(|_| s.workload.flash_attn == crate::types::FlashAttn::Off).map(|d| d.memory_total);
    let b = crate::consumer::ollama::batch_for(at.n_ctx, predicted, free, cuda_without_fa);
    (at.n_batch, at.n_ubatch) = (b, b);
    let why = if b < rule && cuda_without_fa.is_none() {
        format!(
            ", stepped down from {rule}: the model takes {} of {} free (Ollama wants 60% for 2048, 75% for 1024)",
            crate::model::human_bytes(predicted),
            crate::model::human_bytes(free)
        )
    } else if cuda_without_fa.is_some() {
        ", on CUDA without flash attention".to_string()
    } else {
        String::new()
    };
    Some(Note::consumer(format!("Ollama's batch at {} tokens: -b {b} -ub {b}{why}", at.n_ctx)))
}
