//! Ollama's batch at each context where it is Ollama's to choose: its rule
//! stepped down for the model's predicted memory as its scheduler does
//! (server/sched.go). Ollama's own run is paired in `baseline::against`.

use super::plan::ContextRun;
use crate::consumer::ollama::process::{consumer_process_bytes, measured_backend};
use crate::types::Note;

use super::start::Shared;

/// Whether Ollama picks the batch itself here (no `-b`/`-ub` given, Ollama the consumer).
fn auto_batch(ollama: Option<&crate::profile::ConsumerRead>) -> bool {
    ollama.is_some_and(|c| c.auto_batch)
}

/// The device's free memory before the trials, as Ollama's scheduler sees it.
fn available(sh: &Shared<'_>) -> u64 {
    sh.policy.as_ref().and_then(|p| p.device_total_bytes.map(|t| t.saturating_sub(p.baseline_bytes))).unwrap_or(0)
}

/// Sets Ollama's batch for this context where it is Ollama's to choose:
/// its rule, stepped down as server/sched.go does for the model's
/// predicted memory (Ollama's own prediction of the whole model at this
/// context: `PredictServerVRAM`) against the device's free memory. The note says what it chose and why.
pub(super) fn batch_here(sh: &Shared<'_>, at: &mut ContextRun) -> Option<Note> {
    let s = sh.opts.settings();
    if !auto_batch(s.ollama()) {
        return None;
    }
    let rule = crate::consumer::ollama::batch(at.n_ctx);
    let free = available(sh);
    // server/sched.go steps the batch on its own prediction (PredictServerVRAM
    // at the context llama-server gets), not on llama.cpp's accounting.
    let predicted = if free == 0 || rule == 512 {
        0
    } else {
        crate::consumer::ollama::predict_server_vram(sh.opts.info(), at.n_ctx)
    };
    let cuda = sh.hw.llama_devices.iter().find(|d| d.is_offload_target() && d.name.starts_with("CUDA"));
    let cuda_without_fa =
        cuda.filter(|_| s.workload.flash_attn == crate::placement::FlashAttn::Off).map(|d| d.memory_total);
    let b = crate::consumer::ollama::batch_for(at.n_ctx, predicted, free, cuda_without_fa);
    (at.n_batch, at.n_ubatch) = (b, b);
    let why = if b < rule && cuda_without_fa.is_none() {
        format!(
            ", stepped down from {rule}: Ollama predicts the model at {} of {} free (its file and an f16 cache; it wants 60% for 2048, 75% for 1024)",
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

/// Ollama's `num_gpu` priced for the engine Ollama runs here. On an NVIDIA
/// card Ollama starts its CUDA llama-server, whose process holds
/// [`crate::consumer::ollama::process::CUDA_PROCESS_BYTES`] that a trial through another backend (Vulkan)
/// never held: the Modelfile's layers are then the most whose dry-run
/// price plus that share is under the cap (at most the answer's), and the
/// note says so. Measured through CUDA, NVML's per-process reading already
/// holds the context and the search's unaccounted share carries it: nothing
/// is added twice. `None` where there is nothing to say (no NVIDIA card, a
/// CUDA measurement, several devices, num_gpu left unset).
pub(super) fn priced_for_consumer(
    (hw, device): (&crate::types::Hardware, Option<&str>),
    search: &mut super::search::Search<'_>,
    rec: &mut crate::profile::Recommendation,
) -> Option<Note> {
    let backend = measured_backend(hw, device);
    let cap = search.cap_bytes()?;
    let share = consumer_process_bytes(hw, device);
    let pinned = rec.ollama_num_gpu_param().filter(|_| share > 0)?;
    #[allow(clippy::cast_precision_loss)]
    let fits = |p: &crate::engine::predict::Prediction| p.error.is_none() && (p.device_bytes + share) as f64 <= cap;
    let mut n = pinned;
    loop {
        let priced = search.price_layers(&[n]);
        match priced.first() {
            Some(p) if fits(p) => break,
            Some(p) if p.error.is_none() && n > 0 => n -= 1,
            _ => return None,
        }
    }
    let mib = share >> 20;
    if n < pinned {
        rec.ollama_num_gpu = Some(n);
        rec.render_forms();
    }
    let said = if n < pinned {
        format!("PARAMETER num_gpu {n}, not {pinned}")
    } else {
        format!("PARAMETER num_gpu {n} fits with it")
    };
    Some(Note::consumer(format!(
        "measured through {backend}; Ollama runs llama.cpp through CUDA on this NVIDIA card, whose process holds about {mib} MiB beyond llama.cpp's accounting (llama.cpp PR #15860, Unsloth PR #8669): priced with it under the cap, {said}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::predict::{PredictCase, Prediction};
    use crate::tune::executor::fake::{Outcome, World};

    use crate::consumer::ollama::process::tests::nvidia;

    /// 100 MiB a layer, 200 MiB of buffers: ngl n is priced 200 + 100 n MiB.
    fn price(cases: &[PredictCase]) -> Vec<Prediction> {
        cases
            .iter()
            .map(|c| Prediction {
                devices: Vec::new(),
                n_gpu_layers: c.ngl,
                device_bytes: (200 + 100 * u64::from(c.ngl)) << 20,
                device_model_bytes: (100 * u64::from(c.ngl)) << 20,
                buffers: Vec::new(),
                error: None,
                case: Some(*c),
                split: vec![],
            })
            .collect()
    }

    fn priced(device: &str, backend: &str, ngl: u32) -> (Option<Note>, crate::profile::Recommendation) {
        let s = crate::tune::worlds::settings();
        let mut world = World::new(|_| Outcome::Ok { tg: 10.0, pp: 100.0, mem: 1 << 20 });
        // A cap of 2000 MiB: 18 layers by the dry run alone (2000), 11 with CUDA's 612 MiB.
        let mut search = crate::tune::worlds::search(&s, &mut world, f64::from(2000u32 << 20))
            .with_pricer(Box::new(crate::tune::pricer::fake::Curves::cases(price)));
        let mut rec = crate::tune::worlds::recommendation();
        rec.set_placement(&crate::placement::Placement::default().with_layers(ngl, 2, Some(32768)));
        let note = priced_for_consumer((&nvidia(device, backend), Some(device)), &mut search, &mut rec);
        (note, rec)
    }

    /// Issue 57 item 4: an Ollama answer measured through Vulkan on an
    /// NVIDIA card is held under the cap less CUDA's per-process share, and
    /// says so; measured through CUDA, nothing is added (NVML's reading
    /// held it already); the llama.cpp flags keep the measured layers.
    #[test]
    fn an_ollama_answer_measured_through_vulkan_is_priced_for_cudas_process() {
        let (note, rec) = priced("Vulkan0", "Vulkan", 18);
        assert_eq!(rec.ollama_num_gpu_param(), Some(11), "200 + 100 x 11 + 612 <= 2000 MiB");
        assert!(rec.modelfile.contains(&"PARAMETER num_gpu 11".to_string()), "{:?}", rec.modelfile);
        assert!(rec.llama_cpp_args.contains("-ngl 18"), "{}", rec.llama_cpp_args);
        let note = note.unwrap().to_string();
        assert!(
            note.contains("measured through Vulkan") && note.contains("612 MiB") && note.contains("not 18"),
            "{note}"
        );
        // Already under with the share: pinned as it is, and said.
        let (note, rec) = priced("Vulkan0", "Vulkan", 9);
        assert_eq!(rec.ollama_num_gpu_param(), Some(9));
        assert!(note.unwrap().to_string().contains("num_gpu 9 fits with it"));
        // Measured through CUDA: not counted twice.
        let (note, rec) = priced("CUDA0", "CUDA", 18);
        assert_eq!((note, rec.ollama_num_gpu_param()), (None, Some(18)));
    }
}
