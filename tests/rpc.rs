//! Several devices over llama.cpp's RPC protocol: two `ngl-tune
//! rpc-server` processes on localhost (the CPU backend each) and a
//! synthetic 40-layer model. Outcomes asserted are ones no noise can flip:
//! what fits each device's cap, what the dry run predicted against what
//! llama.cpp allocated, that the flags load and run, which trials were
//! kept when a server died, and what bad input says.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// An `ngl-tune rpc-server` on a free localhost port, killed when dropped.
struct Server {
    child: Child,
    endpoint: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Server {
    fn start() -> Server {
        Server::start_with(&[])
    }

    /// A server with more options (`--mem 64MiB`).
    fn start_with(more: &[&str]) -> Server {
        let port = free_port();
        let child = Command::new(BIN)
            .args(["rpc-server", "--port", &port.to_string(), "-t", "1"])
            .args(more)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let endpoint = format!("127.0.0.1:{port}");
        let s = Server { child, endpoint };
        let t = Instant::now();
        // Ready when the handshake answers (the probe closes its connection).
        while ngl_tune::rpc::probe(&s.endpoint).is_err() {
            assert!(t.elapsed() < Duration::from_secs(20), "rpc-server on {} did not start", s.endpoint);
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The server process `rpc-server` supervises (its one child).
    fn serving_pid(&self) -> u32 {
        serving_pid(self.child.id())
    }
}

fn serving_pid(supervisor: u32) -> u32 {
    let f = format!("/proc/{supervisor}/task/{supervisor}/children");
    let t = Instant::now();
    loop {
        let kids = std::fs::read_to_string(&f).unwrap_or_default();
        if let Some(pid) = kids.split_whitespace().next().and_then(|p| p.parse().ok()) {
            return pid;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "rpc-server {supervisor} has no server process");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// 40 layers of 256 wide F32 weights: about 2.6 MiB of weights a layer.
fn model(dir: &Path) -> PathBuf {
    let p = dir.join("synth-40L.gguf");
    let spec = ngl_tune::synth::SynthSpec::default().with_n_layer(40).with_dims(256, 512, 2);
    ngl_tune::synth::write_model(&p, &spec).unwrap();
    p
}

const MIB: u64 = 1 << 20;
/// Caps that force a split: neither device takes all 41 layers (~112 MiB at 1k context), both together not either.
const CAPS: [u64; 2] = [40 * MIB, 50 * MIB];

fn u64s(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect()).unwrap_or_default()
}

#[test]
fn a_split_across_two_rpc_servers_keeps_every_cap_and_its_flags_run() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let (a, b) = (Server::start(), Server::start());
    let rpc = format!("{},{}", a.endpoint, b.endpoint);
    let store = dir.path().join("store");
    let budget = format!("RPC0={}MiB,{}={}MiB", CAPS[0] / MIB, b.endpoint, CAPS[1] / MIB);
    let args = [m.to_str().unwrap(), "--rpc", &rpc, "--vram-budget", &budget, "-c", "1024", "-p", "16", "-n", "8"];
    let o = run(&[&args[..], &["-r", "2", "-t", "2", "--profiles", store.to_str().unwrap(), "-q", "--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
    assert_eq!(p["hardware"]["rpc_servers"].as_array().unwrap().len(), 2);
    let split = &p["placements"].as_array().unwrap().last().unwrap()["split"];
    let devices = split["devices"].as_array().unwrap();
    let caps: Vec<u64> = devices.iter().map(|d| d["cap_bytes"].as_u64().unwrap()).collect();
    assert_eq!(caps, CAPS, "one cap per device, named by llama.cpp's name and by endpoint");
    assert_eq!(devices[1]["buffer_type"], format!("RPC0[{}]", b.endpoint));

    let options = split["options"].as_array().unwrap();
    let measured: Vec<&serde_json::Value> =
        options.iter().filter(|o| o["measured"] == true && !u64s(&o["tensor_split"]).is_empty()).collect();
    assert!(!measured.is_empty(), "a split was measured: {options:?}");
    for o in &measured {
        let (pred, acc) = (u64s(&o["predicted_bytes"]), u64s(&o["accounted_bytes"]));
        assert_eq!(acc.len(), 2, "{o}");
        for d in 0..2 {
            assert!(acc[d] <= CAPS[d], "device {d} over its cap: {o}");
            #[allow(clippy::cast_precision_loss)]
            let err = (pred[d] as f64 - acc[d] as f64).abs() / (acc[d] as f64).max(1.0);
            assert!(err <= 0.02, "the dry run is within 2% on device {d}: {o}");
        }
        let ts = u64s(&o["tensor_split"]);
        assert_eq!(ts.iter().sum::<u64>(), o["n_gpu_layers"].as_u64().unwrap());
        // A device may be left out where its speed says so; a probe holds exactly one.
        let probe = o["label"].as_str().unwrap().starts_with("probe");
        assert!(ts.iter().any(|l| *l > 0), "some device holds layers: {o}");
        assert!(!probe || ts.iter().filter(|l| **l > 0).count() == 1, "a probe holds one device: {o}");
        // The flags load and run in llama.cpp, with each device under its cap.
        let flags = o["llama_cpp_args"].as_str().unwrap();
        assert!(flags.starts_with(&format!("--rpc {rpc} ")) && flags.contains(" -sm layer -ts "), "{flags}");
        let out =
            run(&["bench", m.to_str().unwrap(), "--llama-args", flags, "-p", "8", "-n", "4", "-r", "1", "-o", "json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let rows: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        for row in rows.as_array().unwrap() {
            assert_eq!(row["status"], "ok", "{row}");
            let by = row["accounted_bytes_by_device"].as_object().unwrap();
            for (d, s) in [&a, &b].iter().enumerate() {
                // A device the split leaves out (a probe's) holds nothing.
                let bytes = by.get(&format!("RPC0[{}]", s.endpoint)).map_or(0, |b| b.as_u64().unwrap());
                assert!(bytes <= CAPS[d], "{row}");
            }
        }
    }
    // The recommendation satisfies every cap, by what llama.cpp allocated.
    let best: Vec<&serde_json::Value> = options.iter().filter(|o| o["recommended"] == true).collect();
    assert_eq!(best.len(), 1, "{options:?}");
    let acc = u64s(&best[0]["accounted_bytes"]);
    assert!(acc.iter().zip(CAPS).all(|(a, c)| *a <= c), "{}", best[0]);
    assert_eq!(best[0]["fits"], true);
    let r = &p["recommendation"];
    assert_eq!(r["n_gpu_layers"], best[0]["n_gpu_layers"]);
    assert!(split["llama_fit"]["n_gpu_layers"].is_i64(), "llama.cpp's fit is shown beside: {split}");
    assert_eq!(split["rpc_links"].as_array().unwrap().len(), 2);
    // Each link's bandwidth timed both ways through ggml-rpc's own tensor copies.
    for l in split["rpc_links"].as_array().unwrap() {
        let bw = &l["bandwidth"];
        assert!(bw["up_mb_s"].as_f64().unwrap() > 0.0 && bw["down_mb_s"].as_f64().unwrap() > 0.0, "{l}");
    }
    // FFN spill with several devices was weighed: measured, or a note says why not.
    let notes = p["notes"].as_array().unwrap();
    let spill_noted = notes.iter().any(|n| n["text"].as_str().unwrap_or("").starts_with("FFN spill across devices"));
    let spill_measured = options.iter().any(|o| o["label"].as_str().unwrap().starts_with("FFN spill"));
    assert!(spill_noted || spill_measured, "{notes:?}");
    // The answer is measured alternately with llama.cpp's default split (and its fit for the same
    // caps where that differs), each side's flags as llama.cpp runs them.
    let against = split["against"].as_array().expect("paired with llama.cpp's splits");
    assert!(!against.is_empty() && against.len() <= 2, "{split}");
    for a in against {
        assert!(a["against"].as_str().unwrap().starts_with("llama.cpp's"), "{a}");
        assert!(a["llama_cpp_args"].as_str().unwrap().starts_with(&format!("--rpc {rpc} ")), "{a}");
        // Three pairs (two where the other side was cut short in both; up to five where three could
        // not decide), or the answer is that split.
        let pairs = a["pairs"].as_u64().unwrap_or(0);
        assert!((2..=5).contains(&pairs) || a["verdict"] == "same", "alternated pairs, or that split: {a}");
    }
    // llama.cpp's default split at a measured ngl, where it breaks a cap, is not recommended.
    for o in options.iter().filter(|o| o["fits"] == false) {
        assert_eq!(o["recommended"], false, "{o}");
    }
}

/// `rpc-server --mem`: a served device of a size of its own, as a card of
/// that size. Its total and free memory are what clients see, a trial that
/// needs more is a recorded out-of-memory, and the sweep goes on.
#[test]
fn a_served_device_with_a_memory_size_is_a_card_of_that_size() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let server = Server::start_with(&["--mem", "64MiB"]);
    let hw: serde_json::Value =
        serde_json::from_str(&stdout(&run(&["hw", "--rpc", &server.endpoint, "--json"]))).unwrap();
    let dev = &hw["rpc_servers"][0]["devices"][0];
    assert_eq!(dev["memory_total"].as_u64(), Some(64 * MIB), "{hw}");
    assert_eq!(dev["memory_free"].as_u64(), Some(64 * MIB), "nothing held yet: {hw}");
    // 41 layers need about 112 MiB at a 1k context: full offload is out of memory, 10 layers are not.
    let tail: Vec<&str> = "-ngl 10,41,0 -p 8 -n 4 -r 1 -c 1024 -o json -q".split_whitespace().collect();
    let o = run(&[&["bench", m.to_str().unwrap(), "--rpc", &server.endpoint], &tail[..]].concat());
    let rows: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let status = |ngl: u64| {
        let r: Vec<&serde_json::Value> =
            rows.as_array().unwrap().iter().filter(|r| r["n_gpu_layers"].as_u64() == Some(ngl)).collect();
        assert!(!r.is_empty(), "ngl {ngl} measured: {rows}");
        r[0]["status"].as_str().unwrap().to_string()
    };
    assert_eq!(status(41), "oom", "an allocation past the device's size fails as on a card: {rows}");
    assert_eq!(status(10), "ok", "{rows}");
    assert_eq!(status(0), "ok", "the sweep goes on after the out-of-memory: {rows}");
    // The server's memory is given back when the client goes: all free again.
    let hw: serde_json::Value =
        serde_json::from_str(&stdout(&run(&["hw", "--rpc", &server.endpoint, "--json"]))).unwrap();
    assert_eq!(hw["rpc_servers"][0]["devices"][0]["memory_free"].as_u64(), Some(64 * MIB), "{hw}");
    assert_bad_input(&run(&["rpc-server", "--mem", "lots"]), "--mem 'lots' is not a size");
}

/// The rig's first tune: llama.cpp's default (its fit sees the server's
/// whole free memory, the host's RAM) offloads every layer, over the user's
/// cap; whatever the speeds, the answer is under the cap, and the default
/// is reported as over it.
/// A tune of `m` on `server`'s device under `budget` (`--vram-budget`)
/// with `workload`, kept in `store`: its profile, valid by the schema.
fn tuned(m: &Path, server: &Server, budget: &str, workload: &str, store: &Path) -> serde_json::Value {
    let workload: Vec<&str> = workload.split_whitespace().collect();
    let head = [m.to_str().unwrap(), "--rpc", &server.endpoint, "--vram-budget", budget];
    let o = run(&[&head[..], &workload, &["--profiles", store.to_str().unwrap()]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
    p
}

#[test]
fn a_default_over_the_users_cap_is_never_the_answer() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let server = Server::start();
    let store = dir.path().join("store");
    let cap = 40 * MIB;
    let budget = format!("RPC0={}MiB", cap / MIB);
    let p = tuned(&m, &server, &budget, "-c 1024 --depth 0 -p 16 -n 8 -r 2 -t 1 -q --json", &store);
    let r = &p["recommendation"];
    let ngl = r["n_gpu_layers"].as_u64().unwrap();
    assert!(ngl < 41, "full offload needs about 112 MiB, over the 40 MiB cap: {r}");
    #[allow(clippy::cast_precision_loss)]
    let cap_f = cap as f64;
    assert!(r["mem_bytes"].as_f64().is_some_and(|b| b <= cap_f), "{r}");
    assert!(r["llama_cpp_args"].as_str().unwrap().contains(&format!("-ngl {ngl} ")), "{r}");
    let d = &p["placements"].as_array().unwrap().last().unwrap()["default"];
    assert_eq!(d["n_gpu_layers"].as_u64(), Some(41), "llama.cpp's fit offloads every layer here: {d}");
    assert_eq!(d["over_cap"], true, "{d}");
    assert!(d["note"].as_str().unwrap().contains("over the cap"), "{d}");
    assert_ne!(r["llama_default"], true, "{r}");
}

/// A model with MTP heads on a served device, every layer on it (`--ngl
/// 6`): the heads at the answer priced as llama.cpp's fit prices its extra
/// model (the MTP block loaded where -ngl puts it, the MTP context beside
/// the model's) against the answer's own price without them. Under a cap
/// between the two they are not run at the answer: the most layers that
/// fit with them are measured load against load with the answer, every
/// load under the cap; under a cap that holds both, one load measures
/// them, and the dry run's price is within a few percent of what
/// llama.cpp allocated, never under it.
#[test]
fn mtp_heads_are_priced_with_and_without_them_and_never_run_over_the_cap() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth_mtp(dir.path());
    let server = Server::start();
    // At 1024 context every layer is 50.5 MiB without the heads, 67.8 MiB with them (the dry run).
    for cap_mib in [60u64, 80] {
        let store = dir.path().join(format!("store-{cap_mib}"));
        let budget = format!("RPC0={cap_mib}MiB");
        let p = tuned(&m, &server, &budget, "--ngl 6 -c 1024 --depth 64 -p 16 -n 8 -r 2 -t 1 -q --json", &store);
        let ngl = p["recommendation"]["n_gpu_layers"].as_u64().unwrap();
        let d = &p["placements"][0]["draft"];
        let options = d["options"].as_array().unwrap();
        let first = &options[0];
        assert_eq!(first["placement"]["n_gpu_layers"].as_u64(), Some(ngl), "{d}");
        let priced = first["predicted_device_bytes"].as_u64().unwrap();
        assert!(first["note"].as_str().unwrap().contains("the answer without them"), "{d}");
        let cap = cap_mib * MIB;
        if cap_mib == 60 {
            assert_eq!(ngl, 6, "{}", p["recommendation"]);
            assert!(priced > cap && first["fits"] == false && first.get("loads").is_none(), "{d}");
            let fewer = &options[1];
            assert_eq!(fewer["placement"]["n_gpu_layers"].as_u64(), Some(5), "the MTP block takes a layer's room: {d}");
            assert!(fewer["predicted_device_bytes"].as_u64().unwrap() <= cap, "{d}");
            assert!(fewer["loads"].as_u64().unwrap() >= 3 && fewer["device_bytes"].as_u64().unwrap() <= cap, "{d}");
            assert!(fewer["note"].as_str().unwrap().starts_with("paired load against load with the answer"), "{d}");
        } else {
            assert_eq!(first["loads"], 1, "{d}");
            let took = first["device_bytes"].as_u64().unwrap();
            assert!(took <= cap && took <= priced && took * 11 >= priced * 10, "took {took}, priced {priced}: {d}");
        }
        let lines = p["recommendation"]["modelfile"].to_string();
        let n = options
            .iter()
            .find(|o| o["chosen"] == true)
            .map_or(0, |o| o["placement"]["draft"]["n_max"].as_u64().unwrap_or(3));
        assert!(lines.contains(&format!("PARAMETER draft_num_predict {n}")), "{lines}");
    }
}

/// A MoE model on a card just too small for llama.cpp's default: its fit
/// (1 GiB margin, `-c 0`) keeps the last offloaded layers' experts on the
/// CPU. The paired default runs exactly those overrides at fit's context,
/// its flags show them, and what it took is what fit's dry run priced.
#[test]
fn the_default_of_a_moe_model_runs_fits_expert_overrides() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("moe-6L.gguf");
    let synth =
        "--layers 6 --experts 4 --n-embd 256 --n-ff 512 --heads 4 --kv-heads 2 --vocab 4096 --ctx-train 8192 --q8-0";
    let o = run(&[&["__synth", m.to_str().unwrap()][..], &synth.split_whitespace().collect::<Vec<_>>()].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    // 1 GiB of fit's margin and about 20 MiB: three of seven layers, two of them without their experts.
    let server = Server::start_with(&["--mem", "1044MiB"]);
    let store = dir.path().join("store");
    let workload: Vec<&str> = "-c 1024 --depth 0 -p 16 -n 8 -r 2 -t 1 -q --json".split_whitespace().collect();
    let head = [m.to_str().unwrap(), "--rpc", &server.endpoint, "--profiles", store.to_str().unwrap()];
    let o = run(&[&head[..], &workload].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(schema_errors(&p).is_empty(), "{:?}", schema_errors(&p));
    let d = &p["placements"][0]["default"];
    let spill: Vec<&str> = d["cpu_overrides"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    assert!(!spill.is_empty() && spill.iter().all(|x| x.ends_with("_(ch|)exps")), "fit keeps experts on the CPU: {d}");
    let args = d["llama_cpp_args"].as_str().unwrap();
    assert!(args.contains(" -ot ") && args.contains(&format!("{}=CPU", spill[0])), "{args}");
    assert_eq!(d["n_ctx"].as_u64(), Some(4096), "-c 0: 8192 trained, shrunk by fit to its 4096 floor: {d}");
    assert!(args.contains("-c 4096"), "{args}");
    let pairs = d["pairs"].as_u64().unwrap_or(0);
    assert!(
        (3..=5).contains(&pairs) || (pairs == 2 && d["note"].as_str().unwrap_or("").contains("cut short")),
        "paired: {d}"
    );
    let (took, priced) = (d["mem_bytes"].as_f64().unwrap(), d["predicted_bytes"].as_f64().unwrap());
    assert!((took - priced).abs() <= 0.02 * priced, "accounted {took} against fit's dry run {priced}");
    // Whatever won, the trials of the default ran exactly fit's overrides.
    let paired: Vec<&serde_json::Value> =
        p["trials"].as_array().unwrap().iter().filter(|t| t["role"] == "paired").collect();
    let ran = |t: &&&serde_json::Value| t["spec"]["cpu_overrides"] == d["cpu_overrides"];
    let n = usize::try_from(pairs).unwrap();
    assert_eq!(paired.iter().filter(ran).count(), n, "a paired trial with fit's overrides in each pair");
    // Ollama's own run (num_gpu unset) keeps fit's expert spill at Ollama's context; num_gpu is
    // written only where the answer's layers beat it.
    let o = &p["placements"][0]["ollama"];
    assert!(o["cpu_overrides"].as_array().is_some_and(|a| !a.is_empty()), "fit spills experts under Ollama too: {o}");
    assert_eq!(o["n_ctx"].as_u64(), Some(1024), "Ollama passes -c num_ctx: {o}");
    let num_gpu = p["recommendation"]["modelfile"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l.as_str().unwrap().starts_with("PARAMETER num_gpu"));
    assert_eq!(num_gpu, o["verdict"] == "faster", "{o}");
}

/// Lines of a child's stderr, read on a thread, with a way to wait for one.
struct Lines(std::sync::mpsc::Receiver<String>);

impl Lines {
    fn of(child: &mut Child) -> Lines {
        let (tx, rx) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        Lines(rx)
    }

    fn wait_for(&self, prefix: &str) -> Vec<String> {
        let mut seen = Vec::new();
        while let Ok(l) = self.0.recv_timeout(Duration::from_secs(120)) {
            let hit = l.starts_with(prefix);
            seen.push(l);
            if hit {
                return seen;
            }
        }
        panic!("no '{prefix}' line: {seen:?}");
    }
}

#[test]
fn a_server_that_dies_mid_sweep_loses_no_finished_trial() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let (a, mut b) = (Server::start(), Server::start());
    let rpc = format!("{},{}", a.endpoint, b.endpoint);

    // bench: the rows after the death fail naming the server; the first is kept.
    let mut child = Command::new(BIN)
        .args(["bench", m.to_str().unwrap(), "--rpc", &rpc, "-ngl", "41,41,41", "-p", "16", "-n", "8", "-r", "2"])
        .args(["-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut child);
    lines.wait_for("trial 1/3");
    b.kill();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "two of three rows failed, not all: {:?}", out.status);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows[0]["status"], "ok", "the finished trial is kept");
    let last = rows.last().unwrap();
    assert_ne!(last["status"], "ok");
    assert!(last["reason"].as_str().unwrap().contains(&b.endpoint), "the dead server is named: {last}");

    // tune: the same death after its first trial; the finished trials are in the profile.
    let b2 = Server::start();
    let rpc = format!("{},{}", a.endpoint, b2.endpoint);
    let mut b2 = b2;
    let store = dir.path().join("store");
    let mut child = Command::new(BIN)
        .args([m.to_str().unwrap(), "--rpc", &rpc, "--vram-budget", "RPC0=40MiB,RPC1=50MiB", "-c", "1024"])
        .args(["-p", "16", "-n", "8", "-r", "2", "-t", "2", "--profiles", store.to_str().unwrap(), "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut child);
    let first = lines.wait_for("trial 1/");
    b2.kill();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{first:?} {}", String::from_utf8_lossy(&out.stdout));
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let trials = p["trials"].as_array().unwrap();
    let offloaded =
        trials.iter().find(|t| t["spec"]["n_gpu_layers"].as_u64() > Some(0)).expect("the first trial offloaded");
    assert_eq!(offloaded["status"], "ok", "measured before the server died, and kept: {offloaded}");
    let notes: Vec<&str> = p["notes"].as_array().unwrap().iter().filter_map(|n| n["text"].as_str()).collect();
    assert!(notes.iter().any(|n| n.contains(&b2.endpoint) && n.contains("unreachable")), "{notes:?}");
    assert!(profiles_in(&store).len() == 1 && checkpoints_in(&store).is_empty());
}

#[test]
fn a_server_that_stalls_mid_sweep_ends_at_the_trial_timeout_named() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let (a, b) = (Server::start(), Server::start());
    let rpc = format!("{},{}", a.endpoint, b.endpoint);
    let mut child = Command::new(BIN)
        .args(["bench", m.to_str().unwrap(), "--rpc", &rpc, "-ngl", "41,41", "-p", "16", "-n", "8", "-r", "2"])
        .args(["--trial-timeout", "3", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut child);
    lines.wait_for("trial 1/2");
    let pid = b.serving_pid().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    assert!(out.status.success(), "{:?}", out.status);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows[0]["status"], "ok", "the finished trial is kept");
    let last = rows.last().unwrap();
    assert_eq!(last["status"], "timeout", "{last}");
    let why = last["reason"].as_str().unwrap();
    assert!(why.contains(&b.endpoint) && why.contains("did not answer"), "{why}");
}

#[test]
fn an_unreachable_or_foreign_server_is_one_line_and_nothing_is_measured() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 4);
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let closed = format!("127.0.0.1:{}", free_port());
    for args in [
        vec![m.to_str().unwrap(), "--rpc", &closed, "--profiles", store.to_str().unwrap()],
        vec!["bench", m.to_str().unwrap(), "--rpc", &closed],
        vec!["bench", m.to_str().unwrap(), "--llama-args", &format!("--rpc {closed} -ngl 99")],
        vec!["hw", "--rpc", &closed],
    ] {
        let o = run(&args);
        assert_bad_input(&o, &format!("RPC server {closed} is unreachable"));
    }
    assert!(std::fs::read_dir(&store).unwrap().next().is_none(), "nothing written");
    assert_bad_input(&run(&["bench", m.to_str().unwrap(), "--rpc", "nohost"]), "is not host:port");
    // A budget that names no device is refused before anything is measured.
    let a = Server::start();
    let o = run(&[
        m.to_str().unwrap(),
        "--rpc",
        &a.endpoint,
        "--vram-budget",
        "CUDA3=1GiB",
        "--profiles",
        store.to_str().unwrap(),
    ]);
    assert_bad_input(&o, "no offload device is called CUDA3");
    assert!(std::fs::read_dir(&store).unwrap().next().is_none(), "nothing written");
}

#[test]
fn a_server_beyond_localhost_says_it_has_no_authentication() {
    let port = free_port().to_string();
    let mut child = Command::new(BIN)
        .args(["rpc-server", "--host", "0.0.0.0", "--port", &port, "-t", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut child);
    let first = lines.wait_for("warning:");
    let _ = child.kill();
    let _ = child.wait();
    assert!(first.last().unwrap().contains("no authentication"), "{first:?}");
    let help = stdout(&run(&["rpc-server", "--help"]));
    assert!(help.contains("no authentication"), "{help}");
    // A port that is taken is one line, exit 2.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    assert_bad_input(&run(&["rpc-server", "--port", &port]), "cannot listen on 127.0.0.1:");
}

#[test]
fn a_changed_or_gone_remote_device_makes_a_profile_stale_with_the_reason() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), 4);
    let mut a = Server::start();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    let o = run(&[
        m.to_str().unwrap(),
        "--rpc",
        &a.endpoint,
        "-c",
        "256",
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "--profiles",
        s,
        "-q",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let path = profiles_in(&store).pop().unwrap();
    let fresh = run(&["reprofile", "--profiles", s, "--dry-run"]);
    assert!(stdout(&fresh).contains("fresh"), "same servers, same devices: {}", stdout(&fresh));
    // The profile was made when the server had another device.
    let mut p = read_json(&path);
    p["hardware"]["rpc_servers"][0]["devices"][0]["memory_total"] = 8_589_934_592u64.into();
    p["fingerprint"] = "0000000000000000".into();
    std::fs::write(&path, serde_json::to_string(&p).unwrap()).unwrap();
    let stale = stdout(&run(&["reprofile", "--profiles", s, "--dry-run"]));
    assert!(stale.contains(&format!("RPC server {} devices changed", a.endpoint)), "{stale}");
    a.kill();
    let gone = run(&["reprofile", "--profiles", s, "--dry-run", "--json"]);
    let text = stdout(&gone);
    assert!(text.contains(&a.endpoint) && text.contains("unreachable"), "{text}");
}

#[test]
fn ollamas_default_context_counts_no_rpc_server() {
    let _heavy = heavy();
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("long.gguf");
    let spec = ngl_tune::synth::SynthSpec::default().with_n_layer(4).with_ctx_train(65536);
    ngl_tune::synth::write_model(&m, &spec).unwrap();
    // Two local servers of this machine's CPU: llama.cpp lists each with the host's memory.
    let (a, b) = (Server::start(), Server::start());
    let rpc = format!("{},{}", a.endpoint, b.endpoint);
    let store = dir.path().join("store");
    let o = run(&[
        m.to_str().unwrap(),
        "--rpc",
        &rpc,
        "--ngl",
        "0",
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "1",
        "--depth",
        "0",
        "--profiles",
        store.to_str().unwrap(),
        "-q",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let p: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let devices = p["hardware"]["llama_devices"].as_array().unwrap();
    assert!(devices.iter().filter(|d| d["backend"] == "RPC").count() == 2, "{devices:?}");
    // Ollama never starts RPC servers: this CPU host has no GPU of its own, so its tier is 4k.
    assert_eq!(p["settings"]["n_ctx"], 4096, "{}", p["settings"]);
    assert!(p["settings"]["ctx_rule"].as_str().unwrap().contains("what current Ollama gives"), "{}", p["settings"]);
}

#[test]
fn a_server_that_crashes_is_restarted_and_says_how_it_died() {
    let port = free_port().to_string();
    let endpoint = format!("127.0.0.1:{port}");
    let mut sup = Command::new(BIN)
        .args(["rpc-server", "--port", &port, "-t", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Lines::of(&mut sup);
    lines.wait_for("ngl-tune rpc-server: serving");
    let first = serving_pid(sup.id());
    // What a bad pointer or a failed assertion in ggml's server does.
    assert!(Command::new("kill").args(["-ABRT", &first.to_string()]).status().unwrap().success());
    let said = lines.wait_for("ngl-tune rpc-server: the server");
    let died = said.last().unwrap();
    assert!(
        died.contains(&format!("the server on {endpoint} died (killed by signal 6 (SIGABRT))"))
            && died.contains("restarting it (restart 1)"),
        "{said:?}"
    );
    lines.wait_for("ngl-tune rpc-server: serving");
    let t = Instant::now();
    while ngl_tune::rpc::probe(&endpoint).is_err() {
        assert!(t.elapsed() < Duration::from_secs(20), "{endpoint} did not come back");
        std::thread::sleep(Duration::from_millis(100));
    }
    let second = serving_pid(sup.id());
    assert_ne!(first, second, "a new server process");
    // SIGTERM stops both, as a service manager stops it.
    assert!(Command::new("kill").args(["-TERM", &sup.id().to_string()]).status().unwrap().success());
    let status = sup.wait().unwrap();
    assert!(status.success(), "{status:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !Path::new(&format!("/proc/{second}")).exists() || ngl_tune::rpc::probe(&endpoint).is_err(),
        "the server went with it"
    );
}
