//! The tune request finished before any trial: the contexts chosen
//! (`--ctx`, `-c`, the Modelfile's num_ctx, or the consumer's default on
//! this machine), the consumer's settings laid over the workload, the
//! streams decoded together, the depth checked against every context, the
//! machine probed once. The app runs the requests built here; their fields
//! are private, so nothing patches them afterwards.

use std::path::PathBuf;

use anyhow::Result;

use crate::cli::TuneArgs;
use crate::consumer::Consumer;
use crate::model::ModelInfo;
use crate::profile::Settings;
use crate::tune::{Machine, TuneRequest};

/// Every model's finished request for `a`'s command line, and the store
/// they write to: the flags parsed, every model inspected and its
/// settings checked, the machine probed, the contexts and the consumer's
/// settings laid over, before anything is measured.
///
/// # Errors
/// `BadInput` naming the flag, the file, the server or the model and the fix.
pub fn tune_requests(a: &TuneArgs) -> Result<(PathBuf, Vec<TuneRequest>)> {
    // The cap's options are judged first, before the store and the models
    // (--target-vram by the parser, before this).
    let budgets = a.vram_budget.as_deref().map(super::parse_budgets).transpose()?.unwrap_or_default();
    let rpc = super::rpc_list(a.workload.rpc.servers.as_deref())?;
    let store = crate::profile::store::dir_or_default(a.store.given());
    crate::profile::store::check_dir(&store)?;
    one_model_flags(a)?;
    // Every model and its settings are checked before anything is measured.
    let mut checked = Vec::new();
    for m in &a.models {
        let info = crate::model::inspect(m)?;
        let settings = super::tune_settings(a, &info, (a.target_vram, &budgets), &rpc)?;
        checked.push((info, settings));
    }
    if let Some(c) = &a.files.chart {
        crate::fsio::check_output_file(c, "--chart")?;
    }
    if let Some(m) = &a.files.write_modelfile {
        crate::fsio::check_output_file(m, "--write-modelfile")?;
    }
    let consumer = consumer(a)?;
    let mut reqs = Vec::new();
    for (info, mut settings) in checked {
        let machine = Machine::probe(&info, (&settings.backend, &settings.caps))?;
        finish(a, &mut settings, &info, &machine, consumer.as_ref())?;
        let req = TuneRequest::new(info, settings, store.clone(), machine)?
            .with_resume(a.resume)
            .with_output(a.talk.verbose, !a.talk.quiet);
        reqs.push(req);
    }
    Ok((store, reqs))
}

/// Flags that write one model's files take one model.
fn one_model_flags(a: &TuneArgs) -> Result<()> {
    if a.models.len() > 1 {
        for (given, flag) in
            [(a.files.chart.is_some(), "--chart"), (a.files.write_modelfile.is_some(), "--write-modelfile")]
        {
            if given {
                return Err(crate::error::bad(format!(
                    "{flag} takes one model; tune the models together, then use emit {flag} on the one you pick"
                )));
            }
        }
    }
    Ok(())
}

/// Finishes `s` for `a`'s command line on `machine`: its contexts, the
/// consumer's settings, the streams decoded together, the depth checked.
///
/// # Errors
/// `BadInput` for a Modelfile to update that Ollama would reject, or a
/// depth a context cannot hold.
fn finish(a: &TuneArgs, s: &mut Settings, info: &ModelInfo, machine: &Machine, consumer: &dyn Consumer) -> Result<()> {
    let user_ctx = a.ctx.is_some() || a.workload.ctx_size.is_some();
    choose_contexts(a, s, info, machine.hw(), consumer, user_ctx)?;
    // NVML's cards with their compute capability (Ollama's flash-attention
    // check), where the model offloads to a CUDA device: from the request's probe.
    let on_cuda = machine.devices().iter().any(|d| d.is_offload_target() && d.name.starts_with("CUDA"));
    let cards: Vec<(String, (u32, u32))> = if on_cuda {
        machine.hw().gpus.iter().filter_map(|g| Some((g.name.clone(), g.cuda_compute?))).collect()
    } else {
        Vec::new()
    };
    apply(consumer, s, &info.architecture, user_ctx, &cards);
    if let Some(n) = s.goal.parallel_streams {
        s.decode_together(n);
    }
    super::check_depth(s)
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
    let cmds = existing.map(crate::consumer::ollama::modelfile::read).transpose()?;
    if user_ctx {
        return Ok(());
    }
    let from_modelfile = cmds.as_deref().zip(existing).and_then(|(cmds, p)| {
        let params = crate::consumer::ollama::modelfile::parameters(cmds);
        let v = params.iter().find(|(k, _)| k == "num_ctx")?.1.last()?.trim().parse::<u32>().ok().filter(|v| *v > 0)?;
        // llama.cpp (and Ollama) cap the context at the trained one.
        let v = if info.ctx_train > 0 { v.min(u32::try_from(info.ctx_train).unwrap_or(u32::MAX)) } else { v };
        Some((v, p.display().to_string()))
    });
    let (ctx, rule) = match from_modelfile {
        Some((v, path)) => (v, format!("context {v}: num_ctx of the Modelfile being updated ({path})")),
        None => consumer.default_ctx(hw, info.ctx_train),
    };
    s.workload.n_ctx = ctx;
    s.workload.ctx_rule = Some(rule);
    Ok(())
}

/// The consumer whose settings the command line names (`--server-env`,
/// `--ollama-env`), else Ollama's from its systemd unit.
///
/// # Errors
/// `BadInput` for a file that cannot be read or holds a setting llama.cpp
/// would refuse.
fn consumer(a: &TuneArgs) -> Result<Box<dyn Consumer>> {
    crate::consumer::read(a.consumer_settings())
}

/// Lays the consumer's settings over `s` (after its contexts were chosen)
/// and records them in the settings. `cuda`: the CUDA cards llama.cpp
/// offloads to, with their compute capability.
fn apply(c: &dyn Consumer, s: &mut Settings, arch: &str, user_ctx: bool, cuda: &[(String, (u32, u32))]) {
    let applied = c.apply(&mut s.workload, arch, user_ctx, cuda);
    let env = c.env();
    s.consumer = Some(crate::profile::ConsumerRead {
        program: c.program(),
        source: env.source.clone(),
        found: env.found,
        applied: applied.said,
        vars: c.vars(),
        auto_batch: applied.auto_batch,
    });
}
