//! `ngl-tune inspect` and `ngl-tune hw`: what a model is, what this machine has.

use anyhow::Result;

use super::print_json_or_text;
use crate::cli::{HwArgs, InspectArgs};
use crate::model;
use crate::request::rpc_list;

pub(super) fn cmd_inspect(a: &InspectArgs) -> Result<i32> {
    let info = model::inspect(&a.model)?;
    print_json_or_text(a.print.json, &info, || crate::report::render_inspect(&info))
}

pub(super) fn cmd_hw(a: &HwArgs) -> Result<i32> {
    let exe = std::env::current_exe()?;
    let rpc = rpc_list(a.rpc.servers.as_deref())?;
    let servers = crate::rpc::probe_all(&rpc)?;
    let devices = crate::engine::child::devices(&exe, &rpc)?;
    let mut hw = crate::probe::hardware(devices);
    hw.rpc_servers = servers;
    hw.fingerprint = crate::probe::fingerprint(&hw);
    print_json_or_text(a.print.json, &hw, || crate::report::render_hw(&hw))
}
