//! Captures llama.cpp's and ggml's log output inside a trial worker and reads
//! what llama.cpp accounted for: buffers per device and layers offloaded.
//!
//! The worker's stderr carries the raw log (the parent shows it with
//! `--verbose` and keeps its tail for failure reports); this module keeps a
//! copy to parse, because llama.cpp prints its allocations but does not
//! expose them through the C API.

use crate::types::BufferLine;
use std::ffi::{c_char, c_void, CStr};
use std::io::Write;
use std::sync::Mutex;

static CAPTURED: Mutex<String> = Mutex::new(String::new());
static ECHO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Keep llama.cpp's log off stderr (it is still captured).
pub fn quiet() {
    ECHO.store(false, std::sync::atomic::Ordering::Relaxed);
}

unsafe extern "C" fn capture(_level: llama_cpp_sys_2::ggml_log_level, text: *const c_char, _data: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for this call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    if ECHO.load(std::sync::atomic::Ordering::Relaxed) {
        let _ = std::io::stderr().write_all(text.as_bytes());
    }
    if let Ok(mut buf) = CAPTURED.lock() {
        buf.push_str(&text);
    }
}

/// Routes llama.cpp's, ggml's and mtmd's logs through [`capture`]. Call once, before the
/// backend is initialized.
pub fn install() {
    // SAFETY: `capture` is a valid callback for the life of the process and
    // ignores its user data pointer.
    unsafe {
        llama_cpp_sys_2::llama_log_set(Some(capture), std::ptr::null_mut());
        llama_cpp_sys_2::ggml_log_set(Some(capture), std::ptr::null_mut());
        // The projector's loader (tools/mtmd) logs through its own hook.
        llama_cpp_sys_2::mtmd_log_set(Some(capture), std::ptr::null_mut());
    }
}

/// Returns and clears what was captured since the last call.
#[must_use]
pub fn take() -> String {
    CAPTURED.lock().map(|mut b| std::mem::take(&mut *b)).unwrap_or_default()
}

/// Parses buffer-size lines. Sizes are printed in MiB with two decimals, so
/// each value is good to about 5 KiB.
#[must_use]
pub fn parse_buffers(log: &str) -> Vec<BufferLine> {
    let mut out = Vec::new();
    for line in log.lines() {
        let Some((left, right)) = line.split_once(" buffer size =") else {
            continue;
        };
        let Some(mib) = right.trim().strip_suffix("MiB").and_then(|v| v.trim().parse::<f64>().ok()) else {
            continue;
        };
        // left: "llama_kv_cache:    Vulkan0 KV" or "load_tensors:   CPU_Mapped model"
        // (an RPC buffer type names its server: "RPC0[10.0.0.2:50052]")
        let left = left.split_once(": ").map_or(left, |(_, l)| l);
        let mut words = left.split_whitespace().collect::<Vec<_>>();
        let Some(kind) = words.pop() else { continue };
        let buffer_type = words.join(" ");
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let bytes = (mib * 1024.0 * 1024.0).round() as u64;
        out.push(BufferLine { buffer_type, kind: kind.to_string(), bytes });
    }
    out
}

/// What mtmd's log says a projector allocated: its weights ("model
/// size: 12.34 MiB", on the backend of "CLIP using Vulkan0 backend") as
/// kind `mmproj`, its encoder's compute buffers as kind `mmproj-compute`.
#[must_use]
pub fn parse_projector(log: &str) -> Vec<BufferLine> {
    let backend = log
        .lines()
        .find_map(|l| l.split("CLIP using ").nth(1)?.strip_suffix(" backend").map(|b| b.trim().to_string()))
        .unwrap_or_else(|| "CPU".to_string());
    let weights = log.lines().find_map(|l| {
        let v = l.split("model size:").nth(1)?.trim().strip_suffix("MiB")?.trim().parse::<f64>().ok()?;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Some((v * 1024.0 * 1024.0).round() as u64)
    });
    let compute = parse_buffers(log).into_iter().filter(|b| b.kind == "compute").map(|mut b| {
        b.kind = "mmproj-compute".into();
        b
    });
    weights
        .map(|bytes| BufferLine { buffer_type: backend, kind: "mmproj".into(), bytes })
        .into_iter()
        .chain(compute)
        .collect()
}

/// "offloaded 10/19 layers to GPU" → (10, 19).
#[must_use]
pub fn parse_offloaded(log: &str) -> Option<(u32, u32)> {
    log.lines().rev().find_map(|line| {
        let rest = line.split("offloaded ").nth(1)?;
        let frac = rest.split_whitespace().next()?;
        let (a, b) = frac.split_once('/')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_projectors_weights_and_encoder_buffers_are_read_from_mtmds_log() {
        let log = "clip_ctx: CLIP using Vulkan0 backend
load_hparams: model size:         19.03 MiB
load_hparams: metadata size:      0.04 MiB
alloc_compute_meta:    Vulkan0 compute buffer size =     2.00 MiB
alloc_compute_meta:        CPU compute buffer size =     0.06 MiB
";
        let lines = parse_projector(log);
        let got: Vec<(&str, &str, u64)> =
            lines.iter().map(|b| (b.buffer_type.as_str(), b.kind.as_str(), b.bytes)).collect();
        let mib = |v: f64| (v * 1024.0 * 1024.0).round() as u64;
        assert_eq!(
            got,
            [
                ("Vulkan0", "mmproj", mib(19.03)),
                ("Vulkan0", "mmproj-compute", mib(2.0)),
                ("CPU", "mmproj-compute", mib(0.06))
            ]
        );
        // Without a GPU, mtmd says so and the weights are the CPU's.
        let cpu = parse_projector("clip_ctx: CLIP using CPU backend\nload_hparams: model size: 1.00 MiB\n");
        assert_eq!((cpu[0].buffer_type.as_str(), cpu[0].on_device()), ("CPU", false));
    }

    const LOG: &str = "load_tensors: offloading output layer to GPU
load_tensors: offloading 9 repeating layers to GPU
load_tensors: offloaded 10/19 layers to GPU
load_tensors:      Vulkan0 model buffer size =    32.77 MiB
load_tensors:   CPU_Mapped model buffer size =   241.38 MiB
llama_kv_cache:    Vulkan0 KV buffer size =    28.00 MiB
llama_context:    Vulkan0 compute buffer size =    27.01 MiB
llama_context: Vulkan_Host compute buffer size =   514.50 MiB
llama_context:  CPU  output buffer size =     1.00 MiB
load_tensors: RPC0[127.0.0.1:50052] model buffer size =    12.50 MiB
";

    #[test]
    fn parses_llama_cpp_buffer_lines() {
        let b = parse_buffers(LOG);
        assert_eq!(b.len(), 7);
        assert_eq!(b[6].buffer_type, "RPC0[127.0.0.1:50052]", "the port's colon is not the prefix's");
        assert!(b[6].on_device());
        assert_eq!(b[0].buffer_type, "Vulkan0");
        assert_eq!(b[0].kind, "model");
        assert_eq!(b[0].bytes, (32.77f64 * 1048576.0).round() as u64);
        assert_eq!(b[3].buffer_type, "Vulkan0");
        assert_eq!(b[3].kind, "compute");
        assert!(!b[4].on_device(), "Vulkan_Host is pinned host memory");
        assert!(!b[1].on_device());
        assert_eq!(b[5].buffer_type, "CPU");
        assert_eq!(b[5].kind, "output");
        let device: u64 = b.iter().filter(|l| l.on_device()).map(|l| l.bytes).sum();
        let mib = |v: f64| (v * 1048576.0).round() as u64;
        assert_eq!(device, mib(32.77) + mib(28.0) + mib(27.01) + mib(12.5));
    }

    #[test]
    fn parses_offloaded_layers() {
        assert_eq!(parse_offloaded(LOG), Some((10, 19)));
        assert_eq!(parse_offloaded("nothing here"), None);
    }
}
