//! Runs a parsed command line: each command in its own file, turning the
//! command line into typed requests (`request`), calling the library and
//! printing what `report` renders.

mod bench;
mod draft;
mod emit;
mod history;
mod hw;
mod profiles;
mod reprofile;
mod rpc_server;
mod tune;

use std::io::Write;

use anyhow::Result;

use crate::cli::{Cli, Command};
use crate::error::exit;
use crate::request::rpc_list;

/// `rpc-server --mem` in bytes, where given.
fn rpc_mem(a: &crate::cli::RpcServerArgs) -> Result<Option<u64>> {
    a.mem.as_deref().map(|m| crate::request::parse_size_for("--mem", m)).transpose()
}

/// Runs the command; returns the exit code.
///
/// # Errors
/// Any failure; `BadInput` errors exit 2.
pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Tune(a) => tune::cmd_tune(&a),
        Command::Bench(a) => bench::cmd_bench(&a),
        Command::Inspect(a) => hw::cmd_inspect(&a),
        Command::Trial => crate::engine::runner::worker_main().map(|()| exit::OK),
        Command::Hold => crate::engine::worker::hold_main().map(|()| exit::OK),
        Command::Predict => crate::engine::predict::predict_main().map(|()| exit::OK),
        Command::Spec => crate::engine::spec::spec_main().map(|()| exit::OK),
        Command::Kl => crate::engine::quality::kl_main().map(|()| exit::OK),
        Command::Devices { rpc } => {
            let _backend = llama_cpp_2::llama_backend::LlamaBackend::init()?;
            crate::engine::placement::add_rpc_servers(&rpc_list(rpc.as_deref())?)?;
            let devices = crate::probe::ggml::devices();
            println!("{}", serde_json::to_string(&devices)?);
            Ok(exit::OK)
        }
        Command::Hw(a) => hw::cmd_hw(&a),
        Command::RpcServer(a) => {
            let threads = a.threads.unwrap_or_else(|| crate::probe::hardware(Vec::new()).cpu.physical_cores.max(1));
            rpc_server::supervise(&a.host, a.port, &a.device, threads, rpc_mem(&a)?).map(|()| exit::OK)
        }
        Command::RpcServe(a) => {
            let threads = a.threads.unwrap_or(1);
            crate::rpc::serve(&a.host, a.port, &a.device, threads, rpc_mem(&a)?).map(|()| exit::OK)
        }
        Command::Emit(a) => emit::cmd_emit(&a),
        Command::Reprofile(a) => reprofile::cmd_reprofile(&a),
        Command::History(a) => history::cmd_history(&a),
        Command::Profiles(a) => match a.command {
            crate::cli::ProfilesCommand::List { store, print } => {
                profiles::cmd_profiles_list(store.given(), print.json)
            }
        },
        Command::Check { model, rpc, mmproj } => {
            let verdict = crate::engine::worker::check_loadable(&model, &rpc_list(rpc.as_deref())?, mmproj.as_deref());
            // The backend is up now: the device list costs nothing more.
            let devices = if verdict.is_ok() { crate::probe::ggml::devices() } else { Vec::new() };
            let check = crate::engine::child::Check { ok: verdict.is_ok(), error: verdict.err(), devices };
            println!("{}", serde_json::to_string(&check)?);
            Ok(exit::OK)
        }
        Command::Quantize { input, output, kind } => {
            crate::synth::quantize(&input, &output, &kind)?;
            Ok(exit::OK)
        }
        Command::Synth(a) if a.projector_for.is_some() => {
            let spec = crate::synth::ProjectorSpec::for_text(a.projector_for.unwrap_or_default());
            crate::synth::write_projector(&a.out, &spec)?;
            Ok(exit::OK)
        }
        Command::Synth(a) => {
            // MTP blocks are a glm4moe's: experts unless given.
            let (experts, used) = if a.mtp > 0 && a.experts < 2 { (4, 2) } else { (a.experts, a.experts.min(2)) };
            let spec = crate::synth::SynthSpec::default()
                .with_n_layer(a.layers)
                .with_dims(a.n_embd, a.n_ff, a.heads)
                .with_kv_heads(a.kv_heads.unwrap_or(a.heads))
                .with_experts(experts, used)
                .with_nextn(a.mtp)
                .with_mamba(a.mamba)
                .with_q8_0(a.q8_0)
                .with_ctx_train(a.ctx_train)
                .with_vocab(a.vocab, a.tied);
            crate::synth::write_model(&a.out, &spec)?;
            Ok(exit::OK)
        }
    }
}

fn print_notes(notes: &[String]) {
    for n in notes {
        eprintln!("note: {n}");
    }
}

/// `--json` prints the value, otherwise the human rendering.
fn print_json_or_text(json: bool, value: &impl serde::Serialize, text: impl FnOnce() -> String) -> Result<i32> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(value)?)?;
    } else {
        write!(out, "{}", text())?;
    }
    out.flush()?;
    Ok(exit::OK)
}

/// Refuses an output path that is a directory, a FIFO or a device, or whose
/// directory does not exist.
fn check_output_path(p: &std::path::Path, opt: &str) -> Result<()> {
    crate::fsio::check_output_file(p, opt)
}

/// `--chart` and `--write-modelfile`, shared by the tuner and `emit`.
fn write_extras(
    p: &crate::profile::Profile,
    chart: Option<&std::path::Path>,
    modelfile: Option<&std::path::Path>,
) -> Result<()> {
    use crate::consumer::ollama::modelfile::WriteOutcome;
    if let Some(c) = chart {
        let svg = crate::emit::chart::svg(p)?;
        crate::fsio::atomic_write(c, svg.as_bytes())?;
        eprintln!("chart written to {}", c.display());
    }
    if let Some(m) = modelfile {
        match crate::emit::modelfile::write(m, p)? {
            WriteOutcome::Created => eprintln!("{} created", m.display()),
            WriteOutcome::Updated => eprintln!("{} updated (the previous version is {}.bak)", m.display(), m.display()),
            WriteOutcome::Unchanged => eprintln!("{} already has these settings; unchanged", m.display()),
        }
    }
    Ok(())
}

/// A profile named directly, or the store's profile of a model on this machine.
///
/// # Errors
/// `BadInput` when there is none or it is not a profile.
pub fn load_profile(source: &std::path::Path, store: Option<&std::path::Path>) -> Result<crate::profile::Profile> {
    crate::profile::store::read_profile(&crate::profile::store::resolve(source, store)?)
}
