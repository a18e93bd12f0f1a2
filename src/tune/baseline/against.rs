//! The answer paired with what users get without us, one opponent at a
//! time (see [`Opponent`]): llama.cpp's default as `llama-server -m MODEL`
//! runs it, then, where Ollama is the consumer, Ollama's own run with
//! num_gpu unset, as its server would start llama-server for this model
//! (llm/llama_server.go, server/sched.go: `-c num_ctx x parallel -np
//! parallel`, no `-ngl`, llama-server's fit with Ollama's fit target, its
//! batch for the context, its flash attention and KV type, llama.cpp's
//! thread rule).

use anyhow::Result;

use super::{compare, Opponent};
use crate::engine::predict::LlamaFit;
use crate::profile::{DefaultComparison, Recommendation, Verdict};
use crate::tune::search::Search;

/// The recommendation measured against llama.cpp's default, alternately.
/// The default (`llama-server -m MODEL`: `-c 0`, one slot, its threads)
/// is the no-flags baseline the report shows; it never becomes the answer,
/// because it runs another context, slots and threads than the user's.
/// Where it ties or wins, fit's own placement at the user's context
/// (`here`: its layers for the user's cap, the user's context, slots and
/// KV type, the tuned threads) is paired with the answer, and becomes the
/// answer where it ties or wins in turn (see [`super::fit_here`]).
///
/// # Errors
/// What the executor returns (an interrupt).
pub fn llama_default(
    search: &mut Search<'_>,
    recommendation: &mut Recommendation,
    (fit, here): (Option<&LlamaFit>, Option<&LlamaFit>),
    full: u32,
) -> Result<DefaultComparison> {
    let mut cmp = compare(search, recommendation, (fit, Opponent::LlamaDefault), full)?;
    if matches!(cmp.verdict, Verdict::Tie | Verdict::Slower | Verdict::NotDecided) && !cmp.over_cap {
        let said = super::fit_here(search, recommendation, here, full)?;
        cmp.note = if cmp.note.is_empty() { said } else { format!("{}; {said}", cmp.note) };
    }
    Ok(cmp)
}

/// The answer against llama.cpp's default, then its Ollama form against
/// Ollama's own run (one offload device, the dry run priced).
pub fn baselines(
    search: &mut Search<'_>,
    rec: &mut Recommendation,
    priced: Option<&crate::profile::PredictionReport>,
    full: u32,
) -> Result<(Option<DefaultComparison>, Option<DefaultComparison>)> {
    let Some(pr) = priced else { return Ok((None, None)) };
    let d = llama_default(search, rec, (pr.default_fit.as_ref(), pr.llama_fit.as_ref()), full)?;
    let o = ollama_run(search, rec, pr.ollama_fit.as_ref(), full)?;
    Ok((Some(d), o))
}

/// The answer's Ollama form (its whole layers as num_gpu) against Ollama's
/// own run with num_gpu unset, paired, where Ollama is the consumer: num_gpu
/// stays in the Modelfile only where it beats that run; otherwise it is
/// left unset, with the reason. `fit`: what llama-server's fit chose under
/// Ollama (`None` with its fit off: every layer, `-ngl` auto).
///
/// # Errors
/// What the executor returns (an interrupt).
pub fn ollama_run(
    search: &mut Search<'_>,
    rec: &mut Recommendation,
    fit: Option<&LlamaFit>,
    full: u32,
) -> Result<Option<DefaultComparison>> {
    let (s, at) = (search.settings(), search.at());
    let Some(c) = s.ollama() else { return Ok(None) };
    let fit_off = !crate::consumer::ollama::fit(&c.vars).on;
    let all = LlamaFit { n_gpu_layers: Some(-1), n_ctx: Some(at.n_ctx), ..LlamaFit::none(0) };
    // Its fit off: every layer, priced by the dry run where it answered.
    let fit = if fit_off { fit.filter(|f| f.n_gpu_layers == Some(-1)).or(Some(&all)) } else { fit };
    if rec.llama_default {
        let mut out = DefaultComparison::unmeasured(at.depth);
        out.note = "num_gpu is left unset already (llama.cpp's default is the answer): Ollama runs its own".into();
        return Ok(Some(out));
    }
    let cmp = compare(search, rec, (fit, Opponent::OllamaRun), full)?;
    // Not decided: num_gpu is pinned only where it is shown to pay.
    if matches!(cmp.verdict, Verdict::Tie | Verdict::Slower | Verdict::Same | Verdict::NotDecided) && !cmp.over_cap {
        rec.ollama_own_run = true;
        rec.render_forms();
    }
    Ok(Some(cmp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Settings;
    use crate::tune::executor::fake::{Outcome, World};
    use crate::tune::worlds::{recommendation, settings};

    fn ollama_settings() -> Settings {
        let mut s = settings();
        s.workload.n_batch = 512;
        s.workload.n_ubatch = 512;
        s.consumer = Some(crate::profile::ConsumerRead {
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
        let mut search = crate::tune::worlds::search(&s, &mut world, 1e12);
        let fit = LlamaFit { n_gpu_layers: Some(5), n_ctx: Some(s.workload.n_ctx), ..LlamaFit::none(1 << 30) };
        let mut rec = recommendation();
        let cmp = ollama_run(&mut search, &mut rec, Some(&fit), 31).unwrap().expect("Ollama is the consumer");
        drop(search);
        (cmp, rec, world.measured)
    }

    use crate::tune::plan::Candidate;

    #[test]
    fn num_gpu_is_kept_only_where_it_beats_ollamas_own_run() {
        let (cmp, rec, measured) = paired(|ngl| 10.0 + f64::from(ngl));
        assert_eq!((cmp.verdict, cmp.n_gpu_layers(), cmp.pairs), (Verdict::Faster, Some(5), 3), "{cmp:?}");
        assert!(!rec.ollama_own_run);
        assert!(rec.modelfile.iter().any(|l| l == "PARAMETER num_gpu 7"), "{:?}", rec.modelfile);
        // Ollama's run: its batch (the workload's), llama.cpp's threads, fit's layers.
        let theirs: Vec<&Candidate> = measured.iter().filter(|c| c.ngl == 5).collect();
        assert_eq!(theirs.len(), 3);
        assert!(theirs.iter().all(|c| !c.stock && c.threads == crate::engine::llama_default_threads()));
        assert!(
            cmp.llama_cpp_args().contains("-ngl 5") && cmp.llama_cpp_args().contains("-b 512"),
            "{}",
            cmp.llama_cpp_args()
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
        s.backend.mmproj = Some("mm.gguf".into());
        let mut world = World::new(|c| Outcome::Ok { tg: 10.0 + f64::from(c.ngl), pp: 100.0, mem: 1 << 20 });
        let mut search = crate::tune::worlds::search(&s, &mut world, 1e12);
        let fit = LlamaFit {
            n_gpu_layers: Some(5),
            n_ctx: Some(s.workload.n_ctx),
            mmproj_offload: false,
            ..LlamaFit::none(1 << 30)
        };
        let mut rec = recommendation();
        let cmp = ollama_run(&mut search, &mut rec, Some(&fit), 31).unwrap().unwrap();
        drop(search);
        assert!(cmp.llama_cpp_args().ends_with("--mmproj mm.gguf --no-mmproj-offload"), "{}", cmp.llama_cpp_args());
        let sides: Vec<(u32, bool)> = world.measured.iter().map(|c| (c.ngl, c.mmproj_cpu)).collect();
        assert!(sides.iter().any(|&(n, cpu)| n == 7 && cpu), "num_gpu 7 of 31: the projector on the CPU: {sides:?}");
        assert!(sides.iter().all(|&(_, cpu)| cpu), "{sides:?}");

        // Every layer on the GPU and room for the projector: on the GPU on both sides.
        let mut world = World::new(|c| Outcome::Ok { tg: 10.0 + f64::from(c.ngl), pp: 100.0, mem: 1 << 20 });
        let mut search = crate::tune::worlds::search(&s, &mut world, 1e12);
        let fit = LlamaFit { n_gpu_layers: Some(20), n_ctx: Some(s.workload.n_ctx), ..LlamaFit::none(1 << 30) };
        let mut rec = recommendation();
        rec.placement.n_gpu_layers = 31;
        let cmp = ollama_run(&mut search, &mut rec, Some(&fit), 31).unwrap().unwrap();
        drop(search);
        assert!(!cmp.llama_cpp_args().contains("--no-mmproj-offload"), "{}", cmp.llama_cpp_args());
        assert!(world.measured.iter().all(|c| !c.mmproj_cpu), "{:?}", world.measured);
    }

    /// A q8_0 answer (the KV hatch): its Ollama form is the whole-layer
    /// split with the cache Ollama's server runs (f16 here), so that is
    /// what is paired with Ollama's own f16 run, never the q8_0 placement.
    #[test]
    fn a_quantized_answers_ollama_form_is_paired_with_the_servers_own_cache() {
        let s = ollama_settings();
        let mut world = World::new(move |c| Outcome::Ok { tg: 10.0 + f64::from(c.ngl), pp: 100.0, mem: 1 << 20 });
        let mut search = crate::tune::worlds::search(&s, &mut world, 1e12);
        let fit = LlamaFit { n_gpu_layers: Some(5), n_ctx: Some(s.workload.n_ctx), ..LlamaFit::none(1 << 30) };
        let mut rec = recommendation();
        rec.placement = rec.placement.clone().with_layers(31, 2, Some(32768)).with_kv(crate::placement::KvType::Q8_0);
        rec.ollama_num_gpu = Some(7);
        rec.render_forms();
        assert!(rec.modelfile.iter().any(|l| l == "PARAMETER num_gpu 7"), "{:?}", rec.modelfile);
        ollama_run(&mut search, &mut rec, Some(&fit), 31).unwrap().unwrap();
        drop(search);
        let mine: Vec<&Candidate> = world.measured.iter().filter(|c| c.ngl == 7).collect();
        assert_eq!(mine.len(), 3, "{:?}", world.measured);
        assert!(mine.iter().all(|c| c.kv == Some(s.workload.kv_type)), "{mine:?}");
    }

    #[test]
    fn without_ollama_as_the_consumer_there_is_no_ollama_run() {
        let s = settings();
        let mut world = World::new(|_| Outcome::Ok { tg: 10.0, pp: 100.0, mem: 1 << 20 });
        let mut search = crate::tune::worlds::search(&s, &mut world, 1e12);
        let mut rec = recommendation();
        assert!(ollama_run(&mut search, &mut rec, None, 31).unwrap().is_none());
    }
}
