//! llama.cpp's RPC servers, as a client sees them before anything loads:
//! the handshake (protocol version), the devices and their memory, and the
//! network's round trip, spoken in ggml-rpc's own wire format
//! (`ggml-rpc.cpp`: a command byte, a little-endian u64 request size, the
//! request; the answer's u64 size, the answer). ggml aborts the whole
//! process on a server it cannot reach, so every endpoint is probed here
//! first; a failure is one line naming the endpoint.
//!
//! Also `ngl-tune rpc-server`: this machine's devices served over the same
//! protocol, through the shim and ggml's own server.

use std::ffi::{c_char, CString};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::error::bad;
use crate::placement::args::parse_endpoint;
use crate::types::{RpcDevice, RpcServer};

const CMD_ALLOC_BUFFER: u8 = 0;
const CMD_BUFFER_GET_BASE: u8 = 3;
const CMD_FREE_BUFFER: u8 = 4;
const CMD_SET_TENSOR: u8 = 6;
const CMD_GET_TENSOR: u8 = 8;
const CMD_GET_DEVICE_MEMORY: u8 = 11;
const CMD_HELLO: u8 = 14;
const CMD_DEVICE_COUNT: u8 = 15;
/// `RPC_CONN_CAPS_SIZE` (transport.h): the transport capabilities of the
/// hello; all zero is plain TCP.
const CONN_CAPS: usize = 24;
const TIMEOUT: Duration = Duration::from_secs(5);
/// Round trips timed per server.
const PINGS: usize = 9;
/// Bytes copied each way to time a link's bandwidth, and how many times.
const COPY_BYTES: usize = 4 << 20;
const COPIES: usize = 3;
/// `sizeof(rpc_tensor)` (ggml-rpc.cpp, packed): id, type, buffer, ne[4],
/// nb[4], op, op_params[16], flags, src[10], view_src, view_offs, data,
/// name[64], use_count.
const RPC_TENSOR: usize = 296;
const GGML_TYPE_F32: u32 = 0;

extern "C" {
    fn ngl_tune_rpc_protocol() -> u32;
    fn ngl_tune_rpc_serve(
        endpoint: *const c_char,
        cache_dir: *const c_char,
        n_threads: u32,
        names: *const *const c_char,
        n_names: u32,
        mem_limit: u64,
    ) -> i32;
}

/// The RPC protocol version this build speaks (`RPC_PROTO_*_VERSION`).
#[must_use]
pub fn protocol() -> (u8, u8, u8) {
    // SAFETY: returns three constants.
    let v = unsafe { ngl_tune_rpc_protocol() };
    #[allow(clippy::cast_possible_truncation)]
    ((v >> 16) as u8, (v >> 8) as u8, v as u8)
}

fn version(v: (u8, u8, u8)) -> String {
    format!("{}.{}.{}", v.0, v.1, v.2)
}

fn call(s: &mut TcpStream, cmd: u8, input: &[u8], out_len: usize) -> std::io::Result<Vec<u8>> {
    let mut msg = Vec::with_capacity(9 + input.len());
    msg.push(cmd);
    msg.extend_from_slice(&(input.len() as u64).to_le_bytes());
    msg.extend_from_slice(input);
    s.write_all(&msg)?;
    let mut size = [0u8; 8];
    s.read_exact(&mut size)?;
    let n = u64::from_le_bytes(size);
    if n != out_len as u64 {
        return Err(std::io::Error::other(format!("answered {n} bytes where {out_len} were expected")));
    }
    let mut out = vec![0u8; out_len];
    s.read_exact(&mut out)?;
    Ok(out)
}

/// A command that has no answer (ggml-rpc's `send` without a response).
fn send(s: &mut TcpStream, cmd: u8, input: &[&[u8]]) -> std::io::Result<()> {
    let len: usize = input.iter().map(|b| b.len()).sum();
    let mut head = Vec::with_capacity(9);
    head.push(cmd);
    head.extend_from_slice(&(len as u64).to_le_bytes());
    s.write_all(&head)?;
    for b in input {
        s.write_all(b)?;
    }
    Ok(())
}

/// ggml-rpc's `rpc_tensor` for `n` f32 values at `data` in a buffer.
fn f32_tensor(buffer: u64, data: u64, n: u64) -> Vec<u8> {
    let mut t = vec![0u8; RPC_TENSOR];
    t[8..12].copy_from_slice(&GGML_TYPE_F32.to_le_bytes());
    t[12..20].copy_from_slice(&buffer.to_le_bytes());
    let n32 = u32::try_from(n).unwrap_or(u32::MAX);
    let bytes = n32.saturating_mul(4);
    for (i, v) in [n32, 1, 1, 1].iter().enumerate() {
        t[20 + 4 * i..24 + 4 * i].copy_from_slice(&v.to_le_bytes());
    }
    for (i, v) in [4, bytes, bytes, bytes].iter().enumerate() {
        t[36 + 4 * i..40 + 4 * i].copy_from_slice(&v.to_le_bytes());
    }
    // data: after id..name's offsets (8+4+8+16+16+4+64+4+80+8+8).
    t[220..228].copy_from_slice(&data.to_le_bytes());
    t
}

/// The link's bandwidth: a 4 MiB buffer on the server's first device,
/// copied to it and back [`COPIES`] times (ggml-rpc's `set_tensor` has no
/// answer: a round trip after it says when it landed), the fastest of
/// each way, less the round trip; the buffer freed. `None` where the
/// device would not hold the buffer.
fn bandwidth(s: &mut TcpStream, rtt_ms: f64) -> std::io::Result<Option<crate::types::Bandwidth>> {
    let size = COPY_BYTES as u64;
    let mut req = 0u32.to_le_bytes().to_vec();
    req.extend_from_slice(&size.to_le_bytes());
    let alloc = call(s, CMD_ALLOC_BUFFER, &req, 16)?;
    let buffer = u64_at(&alloc, 0);
    if buffer == 0 || u64_at(&alloc, 8) < size {
        if buffer != 0 {
            send(s, CMD_FREE_BUFFER, &[&buffer.to_le_bytes()])?;
        }
        return Ok(None);
    }
    let base = u64_at(&call(s, CMD_BUFFER_GET_BASE, &buffer.to_le_bytes(), 8)?, 0);
    let tensor = f32_tensor(buffer, base, size / 4);
    let data = vec![0u8; COPY_BYTES];
    // get_tensor's request: the tensor, the offset, the size.
    let mut get = tensor.clone();
    get.extend_from_slice(&0u64.to_le_bytes());
    get.extend_from_slice(&size.to_le_bytes());
    let (mut up, mut down) = (f64::MAX, f64::MAX);
    for _ in 0..COPIES {
        let t = Instant::now();
        send(s, CMD_SET_TENSOR, &[&tensor, &[0u8], &0u64.to_le_bytes(), &data])?;
        call(s, CMD_DEVICE_COUNT, &[], 4)?;
        up = up.min(t.elapsed().as_secs_f64() * 1e3 - rtt_ms);
        let t = Instant::now();
        call(s, CMD_GET_TENSOR, &get, COPY_BYTES)?;
        down = down.min(t.elapsed().as_secs_f64() * 1e3);
    }
    send(s, CMD_FREE_BUFFER, &[&buffer.to_le_bytes()])?;
    #[allow(clippy::cast_precision_loss)]
    let rate = |ms: f64| size as f64 / (ms.max(1e-3) * 1e3);
    Ok(Some(crate::types::Bandwidth { up_mb_s: rate(up), down_mb_s: rate(down) }))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Connects, shakes hands, lists the devices and times the round trip;
/// the connection closes before this returns (a server serves one client
/// at a time).
///
/// # Errors
/// `BadInput` naming the endpoint: not reachable, not an RPC server, or
/// another protocol version than this build's (both named).
pub fn probe(endpoint: &str) -> Result<RpcServer> {
    probe_with(endpoint, false)
}

/// [`probe`], and with `bandwidth` the link's bandwidth timed too.
fn probe_with(endpoint: &str, with_bandwidth: bool) -> Result<RpcServer> {
    let (host, port) = parse_endpoint(endpoint)?;
    let unreachable = |why: String| {
        bad(format!(
            "RPC server {endpoint} is unreachable ({why}); start `ngl-tune rpc-server --host {host} --port {port}` there, or drop it from --rpc"
        ))
    };
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| unreachable(e.to_string()))?
        .next()
        .ok_or_else(|| unreachable("the host has no address".into()))?;
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| unreachable(e.to_string()))?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    let _ = s.set_nodelay(true);
    let not_rpc = |e: std::io::Error| {
        bad(format!(
            "RPC server {endpoint} did not answer llama.cpp's RPC handshake within {} s ({e}); is it an rpc-server, stalled, or serving another client?",
            TIMEOUT.as_secs()
        ))
    };
    let hello = call(&mut s, CMD_HELLO, &[0u8; CONN_CAPS], 4 + CONN_CAPS).map_err(not_rpc)?;
    let theirs = (hello[0], hello[1], hello[2]);
    let ours = protocol();
    if theirs.0 != ours.0 || theirs.1 > ours.1 {
        return Err(bad(format!(
            "RPC server {endpoint} speaks llama.cpp RPC protocol {}, this ngl-tune (llama.cpp {}) speaks {}; run the same llama.cpp revision on both ends (`ngl-tune rpc-server` from this build)",
            version(theirs),
            crate::types::LLAMA_CPP_REVISION,
            version(ours)
        )));
    }
    let mut rtts = Vec::with_capacity(PINGS);
    let mut count = 0u32;
    for _ in 0..PINGS {
        let t = Instant::now();
        let b = call(&mut s, CMD_DEVICE_COUNT, &[], 4).map_err(not_rpc)?;
        rtts.push(t.elapsed().as_secs_f64() * 1e3);
        count = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    let mut devices = Vec::new();
    for index in 0..count {
        let b = call(&mut s, CMD_GET_DEVICE_MEMORY, &index.to_le_bytes(), 16).map_err(not_rpc)?;
        devices.push(RpcDevice { index, memory_free: u64_at(&b, 0), memory_total: u64_at(&b, 8) });
    }
    rtts.sort_by(f64::total_cmp);
    let rtt_ms = rtts[PINGS / 2];
    let bandwidth = if with_bandwidth && !devices.is_empty() {
        s.set_read_timeout(Some(TIMEOUT * 4))?;
        bandwidth(&mut s, rtt_ms).map_err(not_rpc)?
    } else {
        None
    };
    Ok(RpcServer { endpoint: endpoint.to_string(), protocol: version(theirs), devices, rtt_ms, bandwidth })
}

/// Probes every endpoint, in order, each link's bandwidth timed too.
///
/// # Errors
/// The first endpoint that fails [`probe`].
pub fn probe_all(endpoints: &[String]) -> Result<Vec<RpcServer>> {
    endpoints.iter().map(|e| probe_with(e, true)).collect()
}

/// Why a trial that used RPC servers failed, where a server is to blame:
/// the first endpoint that no longer answers.
#[must_use]
pub fn dead_server(endpoints: &[String]) -> Option<String> {
    endpoints.iter().find_map(|e| probe(e).err().map(|err| format!("{err:#}")))
}

/// After a trial that ended badly: the servers that stopped answering, each
/// given `grace` to come back (an `ngl-tune rpc-server` restarts a server
/// that crashed within a second or two), so the next trial does not fail
/// on a server that is only restarting. `None` when every one answers at
/// once; else what happened to each that did not.
#[must_use]
pub fn wait_back(endpoints: &[String], grace: Duration) -> Option<String> {
    let down: Vec<&String> = endpoints.iter().filter(|e| probe(e).is_err()).collect();
    if down.is_empty() {
        return None;
    }
    let t = Instant::now();
    let mut said = Vec::new();
    for e in down {
        loop {
            match probe(e) {
                Ok(_) => {
                    said.push(format!(
                        "the RPC server {e} stopped answering during the trial and came back after {:.1} s (restarted)",
                        t.elapsed().as_secs_f64()
                    ));
                    break;
                }
                Err(err) if t.elapsed() >= grace => {
                    said.push(format!("{err:#}"));
                    break;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
    Some(said.join("; "))
}

/// llama.cpp's warning for a server bound beyond this machine, in one line.
pub const NO_AUTH_WARNING: &str = "llama.cpp's RPC protocol has no authentication or encryption: anyone who reaches this port can run code on these devices; bind to a private network only";

/// Whether the server can listen on host:port.
///
/// # Errors
/// `BadInput` naming the endpoint and the fix.
pub fn listenable(host: &str, port: u16) -> Result<()> {
    let endpoint = format!("{host}:{port}");
    parse_endpoint(&endpoint)?;
    // ggml's server would only print that it cannot bind: say which and why first.
    std::net::TcpListener::bind((host, port)).map(drop).map_err(|e| {
        bad(format!("cannot listen on {endpoint} ({e}); pick another --port, or a --host of this machine"))
    })
}

/// Checks that every device asked for (`--device`) is one of `known`.
///
/// # Errors
/// `BadInput` naming the first unknown device and the choices.
pub fn check_devices(asked: &[String], known: &[String]) -> Result<()> {
    match asked.iter().find(|d| !known.contains(d)) {
        Some(d) => Err(bad(format!("--device {d} is not a llama.cpp device here; choose from {}", known.join(", ")))),
        None => Ok(()),
    }
}

/// The line the server prints once it serves.
pub const SERVING: &str = "ngl-tune rpc-server: serving ";

/// Serves this machine's devices until the process ends; with `mem`, each
/// served device has that many bytes of memory (its total to clients, less
/// what they hold as free; an allocation past it fails as a card's does).
///
/// # Errors
/// `BadInput` for a bad host, port or device name; an error when the
/// server could not start (the port is taken, ...).
pub fn serve(host: &str, port: u16, devices: &[String], threads: u32, mem: Option<u64>) -> Result<()> {
    let endpoint = format!("{host}:{port}");
    // The server goes with its supervisor, however that ends.
    // SAFETY: prctl with PR_SET_PDEATHSIG only sets this process's parent-death signal.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    if std::os::unix::process::parent_id() == 1 {
        anyhow::bail!("the rpc-server that started this server is gone");
    }
    listenable(host, port)?;
    let _backend = llama_cpp_2::llama_backend::LlamaBackend::init()?;
    let known: Vec<String> = crate::probe::ggml::devices().into_iter().map(|d| d.name).collect();
    check_devices(devices, &known)?;
    let mut served = if devices.is_empty() { "every GPU, else the CPU".to_string() } else { devices.join(", ") };
    if let Some(m) = mem {
        served += &format!(" with {} of memory each", crate::model::human_bytes(m));
    }
    eprintln!(
        "{SERVING}{served} on {endpoint} (llama.cpp RPC protocol {}, llama.cpp {}); stop with Ctrl-C",
        version(protocol()),
        crate::types::LLAMA_CPP_REVISION
    );
    let c_endpoint = CString::new(endpoint.clone())?;
    let names: Vec<CString> = devices.iter().map(|d| CString::new(d.as_str()).unwrap_or_default()).collect();
    let pointers: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    // SAFETY: valid C strings that outlive the call (it returns only when the server cannot start).
    let rc = unsafe {
        ngl_tune_rpc_serve(
            c_endpoint.as_ptr(),
            std::ptr::null(),
            threads,
            pointers.as_ptr(),
            u32::try_from(pointers.len()).unwrap_or(0),
            mem.unwrap_or(0),
        )
    };
    anyhow::bail!("the RPC server on {endpoint} could not start (rc {rc}; llama.cpp's reason is above)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_of_another_protocol_is_named_with_both_versions() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = l.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = [0u8; 1 + 8 + CONN_CAPS];
            s.read_exact(&mut req).unwrap();
            assert_eq!(req[0], CMD_HELLO);
            let mut answer = (4 + CONN_CAPS as u64).to_le_bytes().to_vec();
            answer.extend_from_slice(&[3, 0, 0, 0]);
            answer.extend_from_slice(&[0u8; CONN_CAPS]);
            s.write_all(&answer).unwrap();
        });
        let err = format!("{:#}", probe(&endpoint).unwrap_err());
        server.join().unwrap();
        let ours = version(protocol());
        assert!(err.contains(&endpoint) && err.contains("3.0.0") && err.contains(&ours), "{err}");
        let closed = probe(&endpoint).unwrap_err();
        assert_eq!(crate::error::exit_code(&closed), crate::error::exit::BAD_INPUT, "{closed:#}");
    }
}
