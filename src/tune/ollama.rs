//! Ollama's run, as its server would start llama-server for this model with
//! `num_gpu` unset (llm/llama_server.go, server/sched.go): `-c num_ctx x
//! parallel -np parallel`, no `-ngl` (llama-server's fit decides, with
//! Ollama's fit target), its batch for the context (`-b N -ub N`, stepped
//! down where the model leaves little free memory), its flash attention
//! and KV type, llama.cpp's thread rule (no `-t`).

use anyhow::Result;

use crate::engine::predict::{predict_in_child, LlamaFit, PredictSpec};
use crate::profile::{DefaultComparison, Recommendation, Settings, Verdict};
use crate::types::Note;

use super::baseline::{compare, Opponent};
use super::search::Search;
use super::Shared;

/// Whether Ollama picks the batch itself here (no `-b`/`-ub` given, Ollama the consumer).
fn auto_batch(s: &Settings) -> bool {
    s.ollama().is_some_and(|c| c.auto_batch)
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
pub(super) fn batch_here(sh: &Shared<'_>, s: &mut Settings) -> Option<Note> {
    if !auto_batch(s) {
        return None;
    }
    let rule = crate::consumer::ollama::batch(s.n_ctx);
    let free = available(sh);
    let full = sh.opts.info.n_layer_full;
    let predicted = if free == 0 || rule == 512 {
        0
    } else {
        let spec = PredictSpec {
            ngl: vec![full],
            n_batch: 512,
            n_ubatch: 512,
            ..super::pricer::workload_spec(&sh.opts.info, s, sh.op_offload)
        };
        let out = predict_in_child(&sh.exe, &spec).ok();
        out.and_then(|o| o.predictions.into_iter().find(|p| p.error.is_none())).map_or(0, |p| p.device_bytes)
    };
    let cuda = sh.hw.llama_devices.iter().find(|d| d.is_offload_target() && d.name.starts_with("CUDA"));
    let cuda_without_fa = cuda.filter(|_| s.flash_attn == crate::types::FlashAttn::Off).map(|d| d.memory_total);
    let b = crate::consumer::ollama::batch_for(s.n_ctx, predicted, free, cuda_without_fa);
    (s.n_batch, s.n_ubatch) = (b, b);
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
    Some(Note::consumer(format!("Ollama's batch at {} tokens: -b {b} -ub {b}{why}", s.n_ctx)))
}

/// The answer's Ollama form (its whole layers as num_gpu) against Ollama's
/// own run with num_gpu unset, paired, where Ollama is the consumer: num_gpu
/// stays in the Modelfile only where it beats that run; otherwise it is
/// left unset, with the reason. `fit`: what llama-server's fit chose under
/// Ollama (`None` with its fit off: every layer, `-ngl` auto).
///
/// # Errors
/// What the executor returns (an interrupt).
pub(super) fn against_ollama(
    search: &mut Search<'_>,
    rec: &mut Recommendation,
    fit: Option<&LlamaFit>,
    full: u32,
) -> Result<Option<DefaultComparison>> {
    let s = search.settings();
    let Some(c) = s.ollama() else { return Ok(None) };
    let fit_off = !crate::consumer::ollama::fit(&c.vars).on;
    let all = LlamaFit { n_gpu_layers: Some(-1), n_ctx: Some(s.n_ctx), ..LlamaFit::none(0) };
    // Its fit off: every layer, priced by the dry run where it answered.
    let fit = if fit_off { fit.filter(|f| f.n_gpu_layers == Some(-1)).or(Some(&all)) } else { fit };
    if rec.llama_default {
        let mut out = super::baseline::unmeasured(s.depth_at(s.n_ctx));
        out.note = "num_gpu is left unset already (llama.cpp's default is the answer): Ollama runs its own".into();
        return Ok(Some(out));
    }
    let cmp = compare(search, rec, (fit, Opponent::OllamaRun), full)?;
    if matches!(cmp.verdict, Verdict::Tie | Verdict::Slower | Verdict::Same) && !cmp.over_cap {
        rec.ollama_own_run = true;
        let ngl = rec.ollama_num_gpu.unwrap_or(rec.n_gpu_layers);
        rec.render_forms(ngl);
    }
    Ok(Some(cmp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::executor::fake::{Outcome, World};
    use crate::tune::worlds::{policy, recommendation, settings};

    fn ollama_settings() -> Settings {
        let mut s = settings();
        s.n_batch = 512;
        s.n_ubatch = 512;
        s.consumer = Some(crate::profile::Consumer {
            program: crate::consumer::Program::Ollama,
            source: "test".into(),
            found: false,
            applied: Vec::new(),
            vars: Vec::new(),
            auto_batch: true,
        });
        s
    }

    /// The answer's num_gpu 7 against Ollama's own run (fit: 5 layers),
    /// in a world where `tg` says how fast each is: kept where it beats the
    /// run, left unset with the reason where it ties.
    fn paired(tg: fn(u32) -> f64) -> (DefaultComparison, Recommendation, Vec<Candidate>) {
        let s = ollama_settings();
        let mut world = World::new(move |c| Outcome::Ok { tg: tg(c.ngl), pp: 100.0, mem: 1 << 20 });
        let mut search = Search::new(&s, &mut world, Some(policy(1e12)), crate::progress::Progress::hidden(), None);
        let fit = LlamaFit { n_gpu_layers: Some(5), n_ctx: Some(s.n_ctx), ..LlamaFit::none(1 << 30) };
        let mut rec = recommendation();
        let cmp = against_ollama(&mut search, &mut rec, Some(&fit), 31).unwrap().expect("Ollama is the consumer");
        drop(search);
        (cmp, rec, world.measured)
    }

    use super::super::plan::Candidate;

    #[test]
    fn num_gpu_is_kept_only_where_it_beats_ollamas_own_run() {
        let (cmp, rec, measured) = paired(|ngl| 10.0 + f64::from(ngl));
        assert_eq!((cmp.verdict, cmp.n_gpu_layers, cmp.pairs), (Verdict::Faster, Some(5), 3), "{cmp:?}");
        assert!(!rec.ollama_own_run);
        assert!(rec.modelfile.iter().any(|l| l == "PARAMETER num_gpu 7"), "{:?}", rec.modelfile);
        // Ollama's run: its batch (the workload's), llama.cpp's threads, fit's layers.
        let theirs: Vec<&Candidate> = measured.iter().filter(|c| c.ngl == 5).collect();
        assert_eq!(theirs.len(), 3);
        assert!(theirs.iter().all(|c| !c.stock && c.threads == crate::engine::llama_default_threads()));
        assert!(
            cmp.llama_cpp_args.contains("-ngl 5") && cmp.llama_cpp_args.contains("-b 512"),
            "{}",
            cmp.llama_cpp_args
        );

        let (tie, rec, _) = paired(|_| 10.0);
        assert_eq!(tie.verdict, Verdict::Tie, "{tie:?}");
        assert!(rec.ollama_own_run);
        assert!(!rec.modelfile.iter().any(|l| l.starts_with("PARAMETER num_gpu")), "{:?}", rec.modelfile);
        assert_eq!(rec.modelfile[0], crate::profile::OLLAMA_OWN_RUN);
        assert_eq!(rec.ollama_num_gpu_param(), None);
        assert!(
            rec.llama_cpp_args.contains("-ngl 7"),
            "llama.cpp's flags keep the tuned layers: {}",
            rec.llama_cpp_args
        );
    }

    /// With a projector, Ollama runs it on the CPU at a num_gpu below every
    /// layer, and in its own run where fit's answer says so (too little free
    /// memory): both sides are measured that way, and its line says it.
    #[test]
    fn ollama_keeps_the_projector_where_it_would_run_it() {
        let mut s = ollama_settings();
        s.mmproj = Some("mm.gguf".into());
        let mut world = World::new(|c| Outcome::Ok { tg: 10.0 + f64::from(c.ngl), pp: 100.0, mem: 1 << 20 });
        let mut search = Search::new(&s, &mut world, Some(policy(1e12)), crate::progress::Progress::hidden(), None);
        let fit =
            LlamaFit { n_gpu_layers: Some(5), n_ctx: Some(s.n_ctx), mmproj_offload: false, ..LlamaFit::none(1 << 30) };
        let mut rec = recommendation();
        let cmp = against_ollama(&mut search, &mut rec, Some(&fit), 31).unwrap().unwrap();
        drop(search);
        assert!(cmp.llama_cpp_args.ends_with("--mmproj mm.gguf --no-mmproj-offload"), "{}", cmp.llama_cpp_args);
        let sides: Vec<(u32, bool)> = world.measured.iter().map(|c| (c.ngl, c.mmproj_cpu)).collect();
        assert!(sides.iter().any(|&(n, cpu)| n == 7 && cpu), "num_gpu 7 of 31: the projector on the CPU: {sides:?}");
        assert!(sides.iter().all(|&(_, cpu)| cpu), "{sides:?}");

        // Every layer on the GPU and room for the projector: on the GPU on both sides.
        let mut world = World::new(|c| Outcome::Ok { tg: 10.0 + f64::from(c.ngl), pp: 100.0, mem: 1 << 20 });
        let mut search = Search::new(&s, &mut world, Some(policy(1e12)), crate::progress::Progress::hidden(), None);
        let fit = LlamaFit { n_gpu_layers: Some(20), n_ctx: Some(s.n_ctx), ..LlamaFit::none(1 << 30) };
        let mut rec = recommendation();
        rec.n_gpu_layers = 31;
        let cmp = against_ollama(&mut search, &mut rec, Some(&fit), 31).unwrap().unwrap();
        drop(search);
        assert!(!cmp.llama_cpp_args.contains("--no-mmproj-offload"), "{}", cmp.llama_cpp_args);
        assert!(world.measured.iter().all(|c| !c.mmproj_cpu), "{:?}", world.measured);
    }

    #[test]
    fn without_ollama_as_the_consumer_there_is_no_ollama_run() {
        let s = settings();
        let mut world = World::new(|_| Outcome::Ok { tg: 10.0, pp: 100.0, mem: 1 << 20 });
        let mut search = Search::new(&s, &mut world, Some(policy(1e12)), crate::progress::Progress::hidden(), None);
        let mut rec = recommendation();
        assert!(against_ollama(&mut search, &mut rec, None, 31).unwrap().is_none());
    }
}
