//! The tune request finished before any trial: the contexts chosen
//! (`--ctx`, `-c`, the Modelfile's num_ctx, or the consumer's default on
//! this machine), the consumer's settings laid over the workload, the
//! streams decoded together, the depth checked against every context. The
//! app builds the request and runs it; nothing patches it afterwards.

use anyhow::Result;

use crate::cli::TuneArgs;
use crate::consumer::{Consumer, Workload};
use crate::model::ModelInfo;
use crate::profile::Settings;
use crate::tune::TuneRequest;

/// Finishes `req` for `a`'s command line: its contexts, the consumer's
/// settings, the streams decoded together, the depth checked.
///
/// # Errors
/// `BadInput` for a Modelfile to update that Ollama would reject, or a
/// depth a context cannot hold.
pub fn finish(a: &TuneArgs, mut req: TuneRequest, consumer: &dyn Consumer) -> Result<TuneRequest> {
    let user_ctx = a.ctx.is_some() || a.workload.ctx_size.is_some();
    choose_contexts(a, &mut req.settings, &req.info, &req.hw, consumer, user_ctx)?;
    // NVML's cards with their compute capability (Ollama's flash-attention
    // check), where the model offloads to a CUDA device: from the request's probe.
    let on_cuda = req.devices.iter().any(|d| d.is_offload_target() && d.name.starts_with("CUDA"));
    let cards: Vec<(String, (u32, u32))> = if on_cuda {
        req.hw.gpus.iter().filter_map(|g| Some((g.name.clone(), g.cuda_compute?))).collect()
    } else {
        Vec::new()
    };
    apply(consumer, &mut req.settings, &req.info.architecture, user_ctx, &cards);
    if let Some(n) = req.settings.parallel_streams {
        req.settings.decode_together(n);
    }
    super::check_depth(&req.settings)?;
    Ok(req)
}

/// The contexts to tune and the rule that chose them: `--ctx`, `-c`
/// (`user_ctx`: kept as given), the Modelfile's num_ctx, or the consumer's
/// default here.
///
/// # Errors
/// `BadInput` for a Modelfile to update that Ollama would reject (said
/// before anything is measured, not after).
fn choose_contexts(
    a: &TuneArgs,
    s: &mut Settings,
    info: &ModelInfo,
    hw: &crate::types::Hardware,
    consumer: &dyn Consumer,
    user_ctx: bool,
) -> Result<()> {
    let existing = a.files.write_modelfile.as_deref().filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0));
    let cmds = existing.map(crate::consumer::modelfile::read).transpose()?;
    if user_ctx {
        return Ok(());
    }
    let from_modelfile = cmds.as_deref().zip(existing).and_then(|(cmds, p)| {
        let params = crate::consumer::modelfile::parameters(cmds);
        let v = params.iter().find(|(k, _)| k == "num_ctx")?.1.last()?.trim().parse::<u32>().ok().filter(|v| *v > 0)?;
        // llama.cpp (and Ollama) cap the context at the trained one.
        let v = if info.ctx_train > 0 { v.min(u32::try_from(info.ctx_train).unwrap_or(u32::MAX)) } else { v };
        Some((v, p.display().to_string()))
    });
    let (ctx, rule) = match from_modelfile {
        Some((v, path)) => (v, format!("context {v}: num_ctx of the Modelfile being updated ({path})")),
        None => consumer.default_ctx(hw, info.ctx_train),
    };
    s.n_ctx = ctx;
    s.ctx_rule = Some(rule);
    Ok(())
}

/// The consumer whose settings the command line names (`--server-env`,
/// `--ollama-env`), else Ollama's from its systemd unit.
///
/// # Errors
/// `BadInput` for a file that cannot be read or holds a setting llama.cpp
/// would refuse.
pub fn consumer(a: &TuneArgs) -> Result<Box<dyn Consumer>> {
    crate::consumer::read(a.consumer_settings())
}

/// Lays the consumer's settings over `s` (after its contexts were chosen)
/// and records them in the settings. `cuda`: the CUDA cards llama.cpp
/// offloads to, with their compute capability.
fn apply(c: &dyn Consumer, s: &mut Settings, arch: &str, user_ctx: bool, cuda: &[(String, (u32, u32))]) {
    let mut w = Workload {
        n_ctx: s.n_ctx,
        contexts: s.contexts.clone(),
        ctx_rule: s.ctx_rule.clone(),
        n_parallel: s.n_parallel,
        kv_type: s.kv_type,
        flash_attn: s.flash_attn,
        n_batch: s.n_batch,
        n_ubatch: s.n_ubatch,
    };
    let applied = c.apply(&mut w, arch, user_ctx, cuda);
    (s.n_ctx, s.contexts, s.ctx_rule, s.n_parallel) = (w.n_ctx, w.contexts, w.ctx_rule, w.n_parallel);
    (s.kv_type, s.flash_attn, s.n_batch, s.n_ubatch) = (w.kv_type, w.flash_attn, w.n_batch, w.n_ubatch);
    let env = c.env();
    s.consumer = Some(crate::profile::Consumer {
        program: c.program(),
        source: env.source.clone(),
        found: env.found,
        applied: applied.said,
        vars: c.vars(),
        auto_batch: applied.auto_batch,
    });
}
