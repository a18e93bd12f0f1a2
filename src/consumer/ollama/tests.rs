//! Ollama's rules, read against its source, in worlds of its environment.

use super::*;
use std::path::Path;

#[test]
fn a_systemd_unit_gives_environment_then_its_files_over_it() {
    let show = "LoadState=loaded\nEnvironment=OLLAMA_HOST=0.0.0.0 \"OLLAMA_NUM_PARALLEL=2\" OLLAMA_FLASH_ATTENTION=1\nEnvironmentFiles=/etc/ollama.env (ignore_errors=no)\nEnvironmentFiles=/gone.env (ignore_errors=yes)\n";
    let read = |p: &Path| (p == Path::new("/etc/ollama.env")).then(|| "OLLAMA_NUM_PARALLEL=4\n".to_string());
    let env = parse_systemctl_show("ollama.service", show, &read).unwrap();
    assert_eq!(env.var("OLLAMA_NUM_PARALLEL").as_deref(), Some("4"), "the file overrides Environment=");
    assert_eq!(env.var("OLLAMA_FLASH_ATTENTION").as_deref(), Some("1"));
    assert_eq!(env.source, "systemd unit ollama.service (Environment=, /etc/ollama.env)");
    assert!(parse_systemctl_show("ollama.service", "LoadState=not-found\nEnvironment=\n", &read).is_none());
}

#[test]
fn ollama_runs_what_its_environment_says_as_it_reads_it() {
    let env = |pairs: &[(&str, &str)]| ServerEnv {
        source: "test".into(),
        found: true,
        vars: pairs.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect(),
    };
    let r = run(
        &env(&[
            ("OLLAMA_NUM_PARALLEL", " 4 "),
            ("OLLAMA_KV_CACHE_TYPE", "\"Q8_0\""),
            ("OLLAMA_FLASH_ATTENTION", "yes"),
        ]),
        "gemma3",
        &[],
    );
    assert_eq!((r.parallel, r.kv_type, r.flash_attn), (4, Some(KvType::Q8_0), Some(FlashAttn::On)));
    // Every type llama-server takes, lowercased as Ollama passes it; others would not start.
    for (raw, k) in [("q5_1", Some(KvType::Q5_1)), ("BF16", Some(KvType::Bf16)), ("iq4_nl", Some(KvType::Iq4Nl))] {
        assert_eq!(run(&env(&[("OLLAMA_KV_CACHE_TYPE", raw)]), "gemma3", &[]).kv_type, k, "{raw}");
    }
    let odd = run(&env(&[("OLLAMA_KV_CACHE_TYPE", "q6_k")]), "gemma3", &[]);
    assert_eq!(odd.kv_type, None);
    assert!(odd.applied[0].contains("not a cache type llama-server takes"), "{:?}", odd.applied);
    let one = run(&env(&[("OLLAMA_NUM_PARALLEL", "4")]), "qwen3vl", &[]);
    assert_eq!(one.parallel, 1);
    assert!(one.applied[0].contains("one slot"), "{:?}", one.applied);
    let bad = run(&env(&[("OLLAMA_NUM_PARALLEL", "four"), ("OLLAMA_FLASH_ATTENTION", "0")]), "gemma3", &[]);
    assert_eq!((bad.parallel, bad.flash_attn), (1, Some(FlashAttn::Off)), "an unparsable number is the default");
    // Unset, Ollama's device check decides: a Maxwell card (5.2) or a Jetson Xavier (7.2) turns it off.
    let cards = |cc: (u32, u32)| vec![("NVIDIA H200".to_string(), (9, 0)), ("old card".to_string(), cc)];
    assert_eq!(run(&env(&[]), "gemma3", &cards((8, 6))).flash_attn, None, "auto where all pass");
    for cc in [(5, 2), (7, 2)] {
        let off = run(&env(&[]), "gemma3", &cards(cc));
        assert_eq!(off.flash_attn, Some(FlashAttn::Off), "{cc:?}");
        assert!(off.applied[0].contains("device check refuses flash attention on old card"), "{:?}", off.applied);
    }
    let set = run(&env(&[("OLLAMA_FLASH_ATTENTION", "1")]), "gemma3", &cards((5, 2)));
    assert_eq!(set.flash_attn, Some(FlashAttn::On), "the user's setting overrides the check");
    assert!(!parse_bool("False") && !parse_bool(" F ") && parse_bool("fAlSe"), "Go's ParseBool, else true");
    assert_eq!([batch(4096), batch(8192), batch(32768), batch(65536)], [512, 1024, 1024, 2048]);
}

/// server/sched.go's step-down, case by case: headroom 60% for 2048,
/// 75% for 1024, the surcharge inside 80%; CUDA without flash attention.
#[test]
fn ollamas_batch_steps_down_where_the_model_leaves_little_room() {
    let gib = 1u64 << 30;
    assert_eq!(batch_for(65536, 4 * gib, 24 * gib, None), 2048, "ample room");
    assert_eq!(batch_for(65536, 16 * gib, 24 * gib, None), 1024, "67% of free: over 60%, under 75%");
    assert_eq!(batch_for(65536, 19 * gib, 24 * gib, None), 512, "79%: over 75%");
    assert_eq!(batch_for(8192, 17 * gib, 24 * gib, None), 1024, "1024's surcharge fits: 19.2 - 17 > 0.75");
    assert_eq!(batch_for(8192, 18 * gib + gib / 2, 24 * gib, None), 512, "0.7 GiB left under 80%");
    assert_eq!(batch_for(4096, 30 * gib, 24 * gib, None), 512, "never below 512");
    assert_eq!(batch_for(65536, 0, 0, None), 2048, "nothing predicted: the context's");
    assert_eq!(batch_for(65536, gib, 24 * gib, Some(8 * gib)), 256, "CUDA, 8 GiB, no flash attention");
    assert_eq!(batch_for(4096, gib, 24 * gib, Some(8 * gib)), 512);
    assert_eq!(batch_for(65536, gib, 24 * gib, Some(24 * gib)), 512);
}

#[test]
fn ollamas_fit_target_follows_its_environment_and_the_projector() {
    let v = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect()
    };
    let mib = 1u64 << 20;
    assert_eq!(fit(&v(&[])), OllamaFit { on: true, target_bytes: None });
    // The projector on the GPU only where every GPU has it plus 1 GiB free.
    assert!(offloads_projector(300 * mib, &[2048 * mib, 1325 * mib]));
    assert!(!offloads_projector(300 * mib, &[2048 * mib, 1323 * mib]));
    assert!(offloads_projector(300 * mib, &[]), "no GPU: nothing to decide");
    assert_eq!((fit_margin(None, 1 << 30), fit_margin(Some(300 * mib + 1), 1 << 30)), (1024 * mib, 1325 * mib));
    assert_eq!(fit(&v(&[("LLAMA_ARG_FIT_TARGET", "2048,512")])).target_bytes, Some(2048 * mib));
    assert!(!fit(&v(&[("LLAMA_ARG_FIT", "off")])).on);
    assert!(fit(&v(&[("LLAMA_ARG_FIT", "on")])).on);
}

/// Issue 54 item 10: a placement over two of this machine's GPUs needs
/// Ollama to spread it (else Ollama runs a model that fits 80% of one
/// GPU on that one); one GPU, or layers on an RPC server, do not.
#[test]
fn a_split_over_local_gpus_asks_ollama_to_spread_it() {
    let base = Placement::default().with_layers(30, 8, Some(8192));
    let spread = |p: &Placement| server_settings(p).contains(&"OLLAMA_SCHED_SPREAD=1".to_string());
    assert!(!spread(&base), "one device");
    let two = base.clone().with_split(&[20, 10], &[]).with_devices(&["CUDA0".into(), "CUDA1".into()]);
    assert!(spread(&two));
    let one_empty = base.clone().with_split(&[30, 0], &[]).with_devices(&["CUDA0".into(), "CUDA1".into()]);
    assert!(!spread(&one_empty), "every layer on one of them");
    let rpc =
        base.clone().with_split(&[20, 10], &["10.0.0.2:50052".into()]).with_devices(&["RPC0".into(), "CUDA0".into()]);
    assert!(!spread(&rpc), "an RPC server is not Ollama's");
    assert!(spread(&base.with_split(&[15, 15], &[])), "-ts over two local devices");
}

#[test]
fn ollamas_context_tier_counts_only_the_gpus_ollama_sees() {
    use crate::types::{DeviceKind, LlamaDevice};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/example-gemma-3-270m-cpu.json");
    let profile: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut hw: crate::types::Hardware = serde_json::from_value(profile["hardware"].clone()).unwrap();
    hw.gpus.clear();
    let dev = |name: &str, description: &str, backend: &str, kind: DeviceKind, gib: u64| LlamaDevice {
        index: 0,
        name: name.into(),
        description: description.into(),
        backend: backend.into(),
        kind,
        memory_total: gib << 30,
        memory_free: gib << 30,
    };
    // A CPU host with two local rpc-servers (llvmpipe 2 GiB, the CPU 23.5 GiB, as llama.cpp lists them).
    hw.llama_devices = vec![
        dev("RPC0", "127.0.0.1:50052", "RPC", DeviceKind::Gpu, 2),
        dev("RPC1", "127.0.0.1:50053", "RPC", DeviceKind::Gpu, 24),
        dev("CPU", "Intel Xeon", "CPU", DeviceKind::Cpu, 24),
    ];
    let none = |_: &str| None;
    assert_eq!(ctx_here(&hw, 131_072, &none), 4096, "RPC servers are not Ollama's GPUs");
    hw.llama_devices.push(dev("Vulkan0", "AMD Radeon 780M", "Vulkan", DeviceKind::Igpu, 24));
    assert_eq!(ctx_here(&hw, 131_072, &none), 4096, "a Vulkan iGPU is dropped by default");
    let on = |k: &str| (k == "OLLAMA_IGPU_ENABLE").then(|| "1".to_string());
    assert_eq!(ctx_here(&hw, 131_072, &on), 32_768, "unless OLLAMA_IGPU_ENABLE");
    hw.llama_devices.push(dev("CUDA0", "NVIDIA GB10", "CUDA", DeviceKind::Igpu, 48));
    assert_eq!(ctx_here(&hw, 1 << 20, &none), 262_144, "a CUDA iGPU counts");
    // Issue 54 item 10: a gfx1151 iGPU (Ryzen AI Max) is admitted by default, through Vulkan here too.
    hw.llama_devices.truncate(3);
    hw.llama_devices.push(dev("Vulkan0", "AMD Radeon 8060S Graphics (RADV GFX1151)", "Vulkan", DeviceKind::Igpu, 96));
    assert_eq!(ctx_here(&hw, 1 << 20, &none), 262_144, "gfx1151 counts by default");
    let off = |k: &str| (k == "OLLAMA_IGPU_ENABLE").then(|| "0".to_string());
    assert_eq!(ctx_here(&hw, 1 << 20, &off), 4096, "OLLAMA_IGPU_ENABLE=0 drops it");
    // OLLAMA_GPU_OVERHEAD lowers the tier's count, and reserves nothing at load: the note says so.
    let env = ServerEnv {
        source: "test".into(),
        found: true,
        vars: vec![("OLLAMA_GPU_OVERHEAD".into(), "1073741824".into())],
    };
    let said = run(&env, "llama", &[]).applied.join("; ");
    assert!(said.contains("reserves nothing at load") && said.contains("LLAMA_ARG_FIT_TARGET"), "{said}");
}

#[test]
fn ollamas_slots_multiply_each_context_and_its_batch_rule_holds_found_or_not() {
    use crate::consumer::{Consumer, Workload};
    let w = || Workload {
        n_ctx: 32768,
        contexts: vec![4096, 32768],
        ctx_rule: None,
        n_parallel: 1,
        kv_type: KvType::F16,
        flash_attn: FlashAttn::Auto,
        n_batch: crate::placement::DEFAULT_N_BATCH,
        n_ubatch: crate::placement::DEFAULT_N_UBATCH,
    };
    let vars = vec![("OLLAMA_NUM_PARALLEL".to_string(), "2".to_string()), ("PATH".into(), "/bin".into())];
    let found = Ollama { env: ServerEnv { source: "test".into(), found: true, vars } };
    let mut got = w();
    let applied = found.apply(&mut got, "gemma3", false, &[]);
    assert_eq!((got.n_ctx, got.contexts.clone(), got.n_parallel), (65536, vec![8192, 65536], 2));
    assert_eq!((got.n_batch, got.n_ubatch), (2048, 2048), "its rule above 32768 tokens");
    assert!(applied.auto_batch);
    assert_eq!(found.vars().len(), 1, "Ollama's own variables only");
    // Not found: its defaults, one slot; its batch rule still holds.
    let none = Ollama { env: ServerEnv::default() };
    let mut got = w();
    none.apply(&mut got, "gemma3", false, &[]);
    assert_eq!((got.n_ctx, got.n_parallel, got.n_batch), (32768, 1, 1024));
}

#[test]
fn ollama_predicts_a_model_as_its_scheduler_does_file_plus_an_f16_cache_plus_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    let spec = crate::synth::SynthSpec::default().with_n_layer(4).with_dims(256, 512, 8).with_kv_heads(2);
    crate::synth::write_model(&p, &spec).unwrap();
    let info = crate::model::inspect(&p).unwrap();
    // llm/llama_server.go PredictServerVRAM: 2 (K, V) x 4 layers x 2 kv heads x 32 (256 / 8) x 4096 x 2 bytes.
    let kv = 2 * 4 * 2 * 32 * 4096 * 2;
    assert_eq!(predict_server_vram(&info, 4096), info.file_size + kv);
    assert_eq!(predict_server_vram(&info, 8192), info.file_size + 2 * kv, "the cache grows with the context");
    // server/sched.go predictedForLoad: the surcharge of the batch it will run.
    assert_eq!(predicted_for_load(&info, 4096, 512), info.file_size + kv);
    assert_eq!(predicted_for_load(&info, 4096, 1024), info.file_size + kv + (768 << 20));
    assert_eq!(predicted_for_load(&info, 4096, 2048), info.file_size + kv + (2 << 30));
}
