//! `ngl-tune rpc-server`: the RPC server ([`crate::rpc::serve`]) run as a
//! child and supervised, so a crash costs one trial of its clients.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::error::bad;

/// Runs the server (hidden `__rpc-serve`, the same process as before a
/// crash) in a child and starts it again whenever it dies while serving,
/// naming how it died and its last words, so a trial that crashes it costs
/// that trial, not the rest of a tune. Ctrl-C or SIGTERM stop both. A
/// server that cannot start (a bad device, a taken port) is not restarted.
///
/// # Errors
/// As [`crate::rpc::serve`], for a server that never started.
pub fn supervise(host: &str, port: u16, devices: &[String], threads: u32, mem: Option<u64>) -> Result<()> {
    use std::ffi::OsString;
    let endpoint = format!("{host}:{port}");
    crate::rpc::listenable(host, port)?;
    let exe = crate::engine::child::current_exe()?;
    // The devices are named by a child: a backend in this long-lived
    // process would hold GPU memory the server's clients need.
    let known: Vec<String> = crate::engine::child::devices(&exe, &[])?.into_iter().map(|d| d.name).collect();
    crate::rpc::check_devices(devices, &known)?;
    if host != "127.0.0.1" && host != "localhost" {
        eprintln!("warning: {}", crate::rpc::NO_AUTH_WARNING);
    }
    let mut args: Vec<OsString> = vec![
        "--host".into(),
        host.into(),
        "--port".into(),
        port.to_string().into(),
        "-t".into(),
        threads.to_string().into(),
    ];
    if !devices.is_empty() {
        args.extend(["--device".into(), devices.join(",").into()]);
    }
    if let Some(m) = mem {
        args.extend(["--mem".into(), m.to_string().into()]);
    }
    crate::interrupt::install();
    let mut restarts = 0u32;
    loop {
        let started = Instant::now();
        let child = crate::engine::child::spawn(&exe, "__rpc-serve", &args, b"", true)?;
        let done = match child.wait(Duration::MAX, Duration::from_millis(100), || {}) {
            Ok(d) => d,
            // Ctrl-C or SIGTERM: the server is stopped with it, as asked.
            Err(e) if e.is::<crate::error::Interrupted>() => return Ok(()),
            Err(e) => return Err(e),
        };
        let served = done.tail.iter().any(|l| l.contains(crate::rpc::SERVING));
        if done.status.success() {
            return Ok(());
        }
        if !served {
            // Its own error line is above; say it once more as the command's error.
            let why = crate::engine::child::telling_line(&done.tail);
            let why = why.strip_prefix("error: ").unwrap_or(&why).to_string();
            return Err(if done.status.code() == Some(crate::error::exit::BAD_INPUT) {
                bad(why)
            } else {
                anyhow::anyhow!("the RPC server on {endpoint} could not start: {why}")
            });
        }
        restarts += 1;
        let how = match done.status.code() {
            Some(c) => format!("exited with status {c}"),
            None => crate::engine::child::describe_exit(done.status).replacen("worker ", "", 1),
        };
        let last = done.tail.iter().rev().find(|l| !l.contains(crate::rpc::SERVING) && !l.trim().is_empty());
        eprintln!(
            "ngl-tune rpc-server: the server on {endpoint} died ({how}) after {:.0} s serving{}; restarting it (restart {restarts})",
            started.elapsed().as_secs_f64(),
            last.map_or_else(String::new, |l| format!("; its last words: {}", l.trim()))
        );
        // A server that dies at once again and again waits longer each time (at most 10 s).
        if started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(250 * u64::from(restarts.min(40))));
        }
    }
}
