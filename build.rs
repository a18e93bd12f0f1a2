//! Builds the small C++ shim that reads llama.cpp's memory accounting
//! (`llama_get_memory_breakdown`, C++ only) against the llama.cpp sources
//! that llama-cpp-sys-2 ships, found through `cargo metadata`.

use std::path::PathBuf;
use std::process::Command;

fn sys_crate_dir() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--filter-platform", &target, "--manifest-path"])
        .arg(PathBuf::from(&manifest).join("Cargo.toml"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let pkg = v["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "llama-cpp-sys-2")
        .expect("llama-cpp-sys-2 is a dependency");
    PathBuf::from(pkg["manifest_path"].as_str().expect("manifest_path")).parent().expect("crate dir").to_path_buf()
}

fn main() {
    println!("cargo:rerun-if-changed=shim/predict.cpp");
    println!("cargo:rerun-if-changed=shim/spec.cpp");
    println!("cargo:rerun-if-changed=build.rs");
    let sys = sys_crate_dir().join("llama.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("shim/predict.cpp")
        .file("shim/spec.cpp")
        // common/: llama.cpp's speculative loop, sampler and server parameters (shim/spec.cpp).
        .include(sys.join("common"))
        .include(sys.join("src"))
        .include(sys.join("include"))
        .include(sys.join("ggml/include"))
        // ggml-backend-impl.h: the device interface `rpc-server --mem` wraps.
        .include(sys.join("ggml/src"))
        .include(sys.join("tools/mtmd"))
        .warnings(false)
        .compile("ngl_tune_shim");
    cuda_links();
}

/// The CUDA build (scripts/setup-cuda, scripts/build): cuBLAS from the
/// machine's CUDA at run time (llama-cpp-sys-2 asks for static cuBLAS, which
/// empty archives in the toolkit's lib64 answer), found first in the
/// toolkit the build used (a run path) and then where the system keeps it.
fn cuda_links() {
    println!("cargo:rerun-if-env-changed=NGL_TUNE_CUDA_LIB");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let lib = std::env::var("NGL_TUNE_CUDA_LIB").expect(
        "the cuda feature builds through scripts/build --backend cuda (scripts/setup-cuda writes vendor/cuda/env)",
    );
    println!("cargo:rustc-link-arg=-L{lib}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    for l in ["cublas", "cublasLt", "dl", "rt", "pthread"] {
        println!("cargo:rustc-link-arg=-l{l}");
    }
}
