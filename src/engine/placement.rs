//! A trial's placement as llama.cpp's model parameters, built in one place
//! (the shim's `make_params`) for the trial's load and the dry run alike:
//! whole layers (`-ngl`), the devices and their order (`--device`),
//! layers per device (`-ts`, `-sm`, `-mg`), tensors kept on the CPU (`-ot PATTERN=CPU`, `--n-cpu-moe`),
//! and whether the MTP blocks load (`--spec-type draft-mtp`).
//! Also registers llama.cpp RPC servers' devices, as `--rpc` does.

use std::ffi::{c_char, c_int, CString};

use llama_cpp_2::model::LlamaModel;

#[repr(C)]
pub(crate) struct RawPlacement {
    n_gpu_layers: i32,
    split_mode: i32,
    main_gpu: i32,
    tensor_split: *const f32,
    n_split: u32,
    cpu_patterns: *const *const c_char,
    n_cpu_patterns: u32,
    devices: *const *const c_char,
    n_devices: u32,
    /// Load the MTP (NextN) blocks, as llama.cpp does for `--spec-type draft-mtp`.
    load_mtp: i32,
}

extern "C" {
    fn ngl_tune_load_model(path: *const c_char, p: *const RawPlacement) -> *mut llama_cpp_sys_2::llama_model;
    fn ngl_tune_add_rpc(endpoint: *const c_char) -> c_int;
}

/// A placement's model parameters and the C strings and numbers their raw form points to.
pub(crate) struct ModelParams {
    ngl: u32,
    split_mode: i32,
    main_gpu: u32,
    split: Vec<f32>,
    patterns: Vec<CString>,
    pointers: Vec<*const c_char>,
    devices: Vec<CString>,
    device_pointers: Vec<*const c_char>,
    load_mtp: bool,
}

impl ModelParams {
    /// Everything a placement puts somewhere: layers, the split, and the
    /// tensors kept on the CPU (experts of `--n-cpu-moe`, dense FFN
    /// weights, `-ot` patterns).
    pub(crate) fn of(p: &crate::placement::Placement) -> Self {
        let patterns = (0..p.n_cpu_moe).map(crate::placement::cpu_moe_pattern).chain(p.cpu_patterns());
        let patterns: Vec<CString> = patterns.map(|p| CString::new(p).unwrap_or_default()).collect();
        let pointers = patterns.iter().map(|p| p.as_ptr()).collect();
        #[allow(clippy::cast_precision_loss)]
        let split = p.tensor_split.iter().map(|&l| l as f32).collect();
        let devices: Vec<CString> = p.devices.iter().map(|d| CString::new(d.as_str()).unwrap_or_default()).collect();
        let device_pointers = devices.iter().map(|d| d.as_ptr()).collect();
        ModelParams {
            ngl: p.n_gpu_layers,
            split_mode: p.split_mode.llama_value(),
            main_gpu: p.main_gpu,
            split,
            patterns,
            pointers,
            devices,
            device_pointers,
            load_mtp: p.draft.as_ref().is_some_and(crate::placement::Draft::is_mtp),
        }
    }

    /// The raw form; valid while `self` lives.
    pub(crate) fn raw(&self) -> RawPlacement {
        debug_assert_eq!(self.patterns.len(), self.pointers.len());
        debug_assert_eq!(self.devices.len(), self.device_pointers.len());
        RawPlacement {
            n_gpu_layers: i32::try_from(self.ngl).unwrap_or(i32::MAX),
            split_mode: self.split_mode,
            main_gpu: i32::try_from(self.main_gpu).unwrap_or(0),
            tensor_split: self.split.as_ptr(),
            n_split: u32::try_from(self.split.len()).unwrap_or(0),
            cpu_patterns: self.pointers.as_ptr(),
            n_cpu_patterns: u32::try_from(self.pointers.len()).unwrap_or(0),
            devices: self.device_pointers.as_ptr(),
            n_devices: u32::try_from(self.device_pointers.len()).unwrap_or(0),
            load_mtp: i32::from(self.load_mtp),
        }
    }

    /// Loads the model for a trial; `None` when llama.cpp cannot (its log says why).
    pub(crate) fn load(&self, path: &std::path::Path) -> Option<LlamaModel> {
        // llama-cpp-2's model handle is one pointer (its `Ptr` is a
        // transparent `NonNull`); its parameters have no tensor split, so
        // the shim loads and the handle takes ownership (and frees it).
        const _: () = assert!(std::mem::size_of::<LlamaModel>() == std::mem::size_of::<*mut u8>());
        let c = CString::new(path.to_string_lossy().as_bytes()).ok()?;
        let raw = self.raw();
        // SAFETY: valid C strings and a placement whose buffers outlive the call.
        let model = unsafe { ngl_tune_load_model(c.as_ptr(), &raw const raw) };
        let model = std::ptr::NonNull::new(model)?;
        // SAFETY: same size and a single pointer field; the model is ours to free.
        Some(unsafe { std::mem::transmute::<std::ptr::NonNull<llama_cpp_sys_2::llama_model>, LlamaModel>(model) })
    }
}

/// Registers each RPC server's devices with llama.cpp (after the backend
/// is up, before a model loads), each probed first: ggml aborts the
/// process on a server it cannot reach, so that is a clean error here.
///
/// # Errors
/// A server that does not answer (named, as [`crate::rpc::probe`] says
/// it), or one with no devices.
pub(crate) fn add_rpc_servers(endpoints: &[String]) -> anyhow::Result<()> {
    for e in endpoints {
        crate::rpc::probe(e)?;
        let c = CString::new(e.as_str())?;
        // SAFETY: a valid C string; ggml copies it.
        if unsafe { ngl_tune_add_rpc(c.as_ptr()) } <= 0 {
            anyhow::bail!("RPC server {e} offers no devices");
        }
    }
    Ok(())
}
