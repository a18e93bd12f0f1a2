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
    println!("cargo:rerun-if-changed=build.rs");
    let sys = sys_crate_dir().join("llama.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("shim/predict.cpp")
        .include(sys.join("src"))
        .include(sys.join("include"))
        .include(sys.join("ggml/include"))
        // ggml-backend-impl.h: the device interface `rpc-server --mem` wraps.
        .include(sys.join("ggml/src"))
        .include(sys.join("tools/mtmd"))
        .warnings(false)
        .compile("ngl_tune_shim");
}
