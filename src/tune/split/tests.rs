//! The split stage's tests: capacities, candidates, fake worlds of several devices.

use super::*;
use crate::profile::Caps;
use crate::profile::DeviceBudget;
use crate::tune::memory::{device_caps, offload_devices};
use crate::tune::pricer::fake::Curves;

fn dev(name: &str, backend: &str, desc: &str, kind: &str, total: u64) -> LlamaDevice {
    LlamaDevice {
        index: 0,
        name: name.into(),
        description: desc.into(),
        backend: backend.into(),
        kind: serde_json::from_value(serde_json::json!(kind)).unwrap(),
        memory_total: total,
        memory_free: total,
    }
}

pub(crate) fn caps(bytes: &[u64]) -> Vec<DeviceCap> {
    bytes
        .iter()
        .enumerate()
        .map(|(i, b)| DeviceCap {
            device: format!("D{i}"),
            buffer_type: format!("D{i}"),
            description: String::new(),
            cap_bytes: *b,
            cap_reason: String::new(),
        })
        .collect()
}

#[test]
fn devices_come_in_llama_cpps_order_with_their_buffer_types() {
    let devices = vec![
        dev("CPU", "CPU", "EPYC", "cpu", 1 << 34),
        dev("CUDA0", "CUDA", "RTX 3060", "gpu", 12 << 30),
        dev("RPC0", "RPC", "10.0.0.2:50052", "gpu", 8 << 30),
        dev("RPC1", "RPC", "10.0.0.2:50052", "gpu", 8 << 30),
        dev("RPC2", "RPC", "10.0.0.3:50052", "gpu", 24 << 30),
    ];
    let order: Vec<(String, String)> = offload_devices(&devices).into_iter().map(|(d, b)| (d.name, b)).collect();
    let want = [
        ("RPC0", "RPC0[10.0.0.2:50052]"),
        ("RPC1", "RPC1[10.0.0.2:50052]"),
        ("RPC2", "RPC0[10.0.0.3:50052]"),
        ("CUDA0", "CUDA0"),
    ];
    assert_eq!(order, want.map(|(a, b)| (a.to_string(), b.to_string())));
    let budgets = [
        DeviceBudget { device: "10.0.0.3:50052".into(), bytes: 1 << 30 },
        DeviceBudget { device: "CUDA0".into(), bytes: 64 << 30 },
    ];
    let c = device_caps(
        &devices,
        &Caps { vram_budget_bytes: Some(2 << 30), device_budgets: budgets.to_vec(), ..Caps::target(0.5) },
    )
    .unwrap();
    let got: Vec<u64> = c.iter().map(|c| c.cap_bytes).collect();
    assert_eq!(got, [2 << 30, 2 << 30, 1 << 30, 6 << 30], "the stricter of the budget and the target, per device");
    let unknown = [DeviceBudget { device: "CUDA7".into(), bytes: 1 }];
    let e =
        device_caps(&devices, &Caps { device_budgets: unknown.to_vec(), ..Caps::target(0.9) }).unwrap_err().to_string();
    assert!(e.contains("CUDA7") && e.contains("RPC0 (10.0.0.2:50052)"), "{e}");
}

#[test]
fn capacity_follows_cost_per_layer_and_fixed_cost() {
    // Device 0: 10 MB a layer, compute 5 MB; device 1: 20 MB a layer, the
    // output 10 MB, compute 20 MB at full offload and 8 MB at partial.
    let mb = 1_000_000u64;
    let at = |l: &[u32], full: bool| -> Vec<(u64, u64)> {
        vec![
            (u64::from(l[0]) * 10 * mb, 5 * mb),
            (u64::from(l[1]) * 20 * mb + 10 * mb, if full { 20 * mb } else { 8 * mb }),
        ]
    };
    let d = caps(&[105 * mb, 250 * mb]);
    let (a, b) = (vec![21, 20], vec![10, 10]);
    let c = costs((&a, &at(&a, true)), (&b, &at(&b, false)));
    assert_eq!(c[1], DeviceCost { per_layer: 20e6, fixed_full: 30e6, fixed_partial: 18e6 });
    let full: Vec<u32> = c.iter().zip(&d).map(|(c, d)| c.capacity(d.cap_bytes, true, 41)).collect();
    let partial: Vec<u32> = c.iter().zip(&d).map(|(c, d)| c.capacity(d.cap_bytes, false, 41)).collect();
    assert_eq!((full.clone(), partial.clone()), (vec![10, 11], vec![10, 11]));
    assert_eq!(c[1].layers_for(1), 1);
    assert_eq!(c[1].layers_for(41 * mb), 3);
    let cands = candidates(&full, &partial, 41);
    assert_eq!(cands, [("every device at its capacity, the rest on the CPU".to_string(), vec![10, 11])]);
    let wide = candidates(&[30, 20], &[30, 20], 41);
    let splits: Vec<Vec<u32>> = wide.iter().map(|(_, s)| s.clone()).collect();
    assert_eq!(splits, [vec![25, 16], vec![30, 11], vec![21, 20]]);
    for s in &splits {
        assert_eq!(s.iter().sum::<u32>(), 41);
    }
    let most = candidates(&[20, 20], &[30, 30], 41);
    assert_eq!(most[0].1.iter().sum::<u32>(), 40, "the CPU keeps a layer when not everything fits");
}

#[test]
fn proportions_never_exceed_a_devices_capacity() {
    assert_eq!(proportional(41, &[41, 41]), [21, 20]);
    assert_eq!(proportional(10, &[1, 100]), [0, 10]);
    assert_eq!(proportional(5, &[0, 0]), [0, 0]);
    assert_eq!(fill(41, &[30, 20], &[1, 0]), [21, 20]);
}

#[test]
fn the_fastest_split_under_every_cap_is_recommended() {
    let s = crate::tune::worlds::settings();
    let o = |tg: f64, fits: bool, measured: bool| SplitOption {
        label: "x".into(),
        placement: crate::placement::Placement::default().with_layers(41, 4, None),
        tensor_split: vec![20, 21],
        predicted_bytes: vec![1, 1],
        measured,
        tg_ts: Some(tg),
        pp_ts: Some(tg * 10.0),
        fits,
        ..SplitOption::default()
    };
    let mut f = SplitFound {
        options: vec![o(9.0, true, true), o(12.0, false, true), o(10.0, true, true)],
        ..SplitFound::default()
    };
    choose(&mut f, &s);
    assert_eq!(f.best, Some(2), "the faster one over a cap is not eligible");
    assert!(f.options[2].recommended && !f.options[1].recommended);
    assert_eq!(f.options[0].note, "-10% against the recommendation");
    let mut none = SplitFound { options: vec![o(9.0, false, true), o(20.0, true, false)], ..SplitFound::default() };
    choose(&mut none, &s);
    assert_eq!(none.best, None);
    assert!(none.notes[0].to_string().contains("no measured split"));
}

/// Two devices "D0" and "D1": 10 MB a layer on either; D0's compute
/// buffer 5 MB; D1 holds the output (10 MB) and a compute buffer of
/// 20 MB at full offload, 8 MB at partial. `extra_d1` is what the dry
/// run adds on D1 beyond that line (a cost the two probes missed).
fn split_prediction(split: &[u32], extra_d1: u64) -> Prediction {
    split_prediction_kv(split, extra_d1, crate::placement::KvType::F16, 0)
}

/// As [`split_prediction`], a layer 8 MB with a q8_0 KV cache (its
/// cache half the size), the FFN (6 MB of a layer) of the first
/// `cpu_ffn` layers on the CPU (they are on the first device with layers).
fn split_prediction_kv(split: &[u32], extra_d1: u64, kv: crate::placement::KvType, cpu_ffn: u32) -> Prediction {
    let mb = 1_000_000u64;
    let per = if kv.is_quantized() { 8 } else { 10 };
    let first = usize::from(split[0] == 0);
    let spilled = |d: usize| if d == first { u64::from(cpu_ffn.min(split[d])) * 6 * mb } else { 0 };
    let full = split.iter().sum::<u32>() == 21;
    let buf = |name: &str, model: u64, compute: u64| crate::engine::predict::PredictedBuffer {
        buffer_type: name.into(),
        is_host: false,
        model,
        context: 0,
        compute,
    };
    let d1_extra = if split[1] >= 12 { extra_d1 } else { 0 };
    Prediction {
        n_gpu_layers: split.iter().sum(),
        device_bytes: 0,
        device_model_bytes: 0,
        buffers: vec![
            buf("D0", u64::from(split[0]) * per * mb - spilled(0), 5 * mb),
            buf(
                "D1",
                u64::from(split[1]) * per * mb + 10 * mb + d1_extra - spilled(1),
                if full { 20 * mb } else { 8 * mb },
            ),
        ],
        error: None,
        case: None,
        split: split.to_vec(),
        devices: Vec::new(),
    }
}

/// The fake world's inputs: 21 layers (the output one of them), local
/// devices (no link), a layer 10 MB.
fn inputs<'a>(devs: &'a [DeviceCap], rpc: &'a [String]) -> SplitInputs<'a> {
    SplitInputs {
        n_ctx: crate::tune::worlds::settings().workload.n_ctx,
        devs,
        full: 21,
        threads: 2,
        rpc,
        op_offload: true,
        output_layers: 1.0,
        is_moe: false,
        layer_bytes: 10e6,
        links: vec![Link::default(); devs.len()],
        workload: crate::placement::Placement::default(),
    }
}

/// Measures what the dry run priced: per-device buffers as predicted,
/// tg faster the more layers D1 holds.
struct SplitWorld {
    extra_d1: u64,
    measured: Vec<Vec<u32>>,
    /// What `-sm tensor` adds to a token (ms; negative: saves).
    tensor_ms: f64,
    /// The workload's own KV cache type (a server may force q8_0).
    kv_base: crate::placement::KvType,
}

impl SplitWorld {
    fn new(extra_d1: u64, tensor_ms: f64) -> SplitWorld {
        SplitWorld { extra_d1, measured: Vec::new(), tensor_ms, kv_base: crate::placement::KvType::F16 }
    }

    /// The trials' workload: the test spec at the world's own KV type.
    fn base(&self) -> crate::types::TrialSpec {
        let spec = crate::engine::test_spec();
        crate::types::TrialSpec { kv_base: self.kv_base, placement: spec.placement.with_kv(self.kv_base), ..spec }
    }
}

impl crate::tune::executor::TrialExecutor for SplitWorld {
    fn spec(&self, c: Candidate) -> crate::types::TrialSpec {
        let names: Vec<String> = (0..c.split.layers().len()).map(|i| format!("D{i}")).collect();
        crate::tune::executor::spec_of(&self.base(), &names, c, None)
    }

    fn measure(&mut self, c: Candidate, race: Option<crate::types::Race>) -> Result<crate::types::TrialResult> {
        use crate::types::{BufferLine, TestResult, TrialResult};
        let listed = c.split.layers();
        // llama.cpp's default split (no -ts) is recorded as its layer count alone.
        self.measured.push(if listed.is_empty() && c.ngl > 0 { vec![c.ngl] } else { listed.clone() });
        // Without -ts, llama.cpp's default split: by free memory, as much on each.
        let split = if listed.is_empty() { proportional(c.ngl, &[c.ngl, c.ngl]) } else { listed };
        let names: Vec<String> = (0..split.len()).map(|i| format!("D{i}")).collect();
        let spec = crate::tune::executor::spec_of(&self.base(), &names, c, race);
        let mut r = TrialResult::failed(spec, TrialStatus::Ok, String::new());
        r.reason = None;
        for b in split_prediction_kv(&split, self.extra_d1, c.kv.unwrap_or(self.kv_base), c.n_cpu_ffn).buffers {
            let bytes = b.model + b.compute;
            r.model_buffers.push(BufferLine { buffer_type: b.buffer_type, kind: "model".into(), bytes });
        }
        // 20 ms a token on the CPU; a layer on D0 adds 1 ms (slower
        // than the CPU), a layer on D1 saves 0.5 ms.
        let tensor = if c.split.mode() == crate::placement::SplitMode::Tensor { self.tensor_ms } else { 0.0 };
        // A layer whose FFN (0.6 of its work) runs on the CPU gives that share back.
        let gain = [1.0, -0.5];
        let first = usize::from(split[0] == 0);
        let spill = -0.6 * gain[first] * f64::from(c.n_cpu_ffn.min(split[first]));
        let ms = 20.0 + gain[0] * f64::from(split[0]) + gain[1] * f64::from(split[1]) + tensor + spill;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ns = (16.0 * ms * 1e6) as u64;
        r.tests.push(TestResult::from_samples(0, 16, 256, vec![ns; 2]));
        r.tests.push(TestResult::from_samples(64, 0, 256, vec![ns / 10; 2]));
        Ok(r)
    }
}

fn split_world(extra_d1: u64) -> (SplitFound, Vec<Vec<u32>>) {
    split_world_running(extra_d1, crate::placement::Placement::default())
}

/// As [`split_world`], every trial running `workload` (batch sizes, slots).
fn split_world_running(extra_d1: u64, workload: crate::placement::Placement) -> (SplitFound, Vec<Vec<u32>>) {
    let s = crate::tune::worlds::settings();
    let mut world = SplitWorld::new(extra_d1, 0.0);
    let pricer =
        Curves::splits(move |x: &[Split], _, _| x.iter().map(|s| split_prediction(&s.layers(), extra_d1)).collect());
    let mut search = crate::tune::worlds::search(&s, &mut world, 255e6).with_pricer(Box::new(pricer));
    let mb = 1_000_000u64;
    let devs = caps(&[105 * mb, 150 * mb]);
    let inp = SplitInputs { workload, ..inputs(&devs, &[]) };
    let found = split_stage(&mut search, &inp).unwrap();
    drop(search);
    (found, world.measured)
}

#[test]
fn every_split_options_flags_say_the_workload_its_trials_ran() {
    let workload =
        crate::placement::Placement { n_batch: 1024, n_ubatch: 1024, ..crate::placement::Placement::default() };
    let (found, _) = split_world_running(0, workload);
    assert!(found.options.len() > 2, "{:?}", found.options);
    for o in &found.options {
        assert!(o.llama_cpp_args().contains("-b 1024 -ub 1024"), "{}", o.llama_cpp_args());
    }
}

#[test]
fn the_split_stage_prices_trims_and_measures_only_what_fits_every_cap() {
    // Capacities at full offload: D0 (105 - 5) / 10 = 10, D1 (150 - 30) / 10 = 12;
    // at partial offload D1 holds 13. D0 is slower than the CPU, D1 faster.
    let (found, measured) = split_world(0);
    assert_eq!(
        measured,
        [vec![], vec![10, 0], vec![0, 13]],
        "every layer on the CPU, each device alone; no split is predicted faster than D1 alone"
    );
    let best = &found.options[found.best.unwrap()];
    assert_eq!(best.tensor_split, [0, 13], "the slow device left out, the rest on the CPU");
    assert!(found.options.iter().all(|o| o.fits));
    let listed: Vec<(Vec<u32>, bool)> = found.options.iter().map(|o| (o.tensor_split.clone(), o.measured)).collect();
    assert!(listed.contains(&(vec![9, 12], false)), "priced, not measured: {listed:?}");
    assert_eq!(best.accounted_bytes, best.predicted_bytes);
    // The probes are the model's inputs: no prediction of their own.
    assert!(found.options.iter().filter(|o| o.label.starts_with("probe")).all(|o| o.predicted_tg_ts.is_none()));
    // D1 costs 25 MB more at 12 layers than the probes said: [9, 12]
    // is over its cap, loses the layers that covers, and is priced as [9, 9].
    let (found, _) = split_world(25_000_000);
    let splits: Vec<Vec<u32>> = found.options.iter().map(|o| o.tensor_split.clone()).collect();
    assert!(!splits.contains(&vec![9, 12]) && splits.contains(&vec![9, 9]), "trimmed: {splits:?}");
    assert!(found.options.iter().all(|o| o.fits));
}

#[test]
fn where_the_server_forces_a_q8_0_cache_every_split_says_it_and_none_is_held_back_as_lossy() {
    // Ollama's server with OLLAMA_KV_CACHE_TYPE=q8_0: every trial runs q8_0, the tune's own type.
    let mut s = crate::tune::worlds::settings();
    s.workload.kv_type = crate::placement::KvType::Q8_0;
    let mut world = SplitWorld { kv_base: s.workload.kv_type, ..SplitWorld::new(0, 0.0) };
    let pricer = Curves::splits(|x: &[Split], _, _| x.iter().map(|s| split_prediction(&s.layers(), 0)).collect());
    let mut search = crate::tune::worlds::search(&s, &mut world, 255e6).with_pricer(Box::new(pricer));
    let mb = 1_000_000u64;
    let devs = caps(&[105 * mb, 150 * mb]);
    let found = split_stage(&mut search, &inputs(&devs, &[])).unwrap();
    drop(search);
    assert!(
        found.options.iter().all(|o| o.placement.kv_type == crate::placement::KvType::Q8_0),
        "{:#?}",
        found.options
    );
    let best = &found.options[found.best.expect("a split is recommended: the own type is not a lossy hatch")];
    assert_eq!(best.tensor_split, [0, 13], "as at f16: {:#?}", found.options);
    assert!(best.llama_cpp_args().contains("-ctk q8_0 -ctv q8_0"), "{}", best.llama_cpp_args());
}

#[test]
fn with_every_layer_offloaded_the_fast_device_takes_what_it_holds() {
    // --ngl 21: all layers on the devices, so the slow one must take some.
    let mut s = crate::tune::worlds::settings();
    s.policy.grid = Some(vec![21]);
    let mut world = SplitWorld::new(0, 0.0);
    let pricer = Curves::splits(|x: &[Split], _, _| x.iter().map(|s| split_prediction(&s.layers(), 0)).collect());
    let mut search = crate::tune::worlds::search(&s, &mut world, 255e6).with_pricer(Box::new(pricer));
    let mb = 1_000_000u64;
    let devs = caps(&[105 * mb, 150 * mb]);
    let inp = inputs(&devs, &[]);
    let found = split_stage(&mut search, &inp).unwrap();
    drop(search);
    let best = &found.options[found.best.unwrap()];
    assert_eq!(
        found.options.iter().find(|o| o.label.starts_with("fastest")).map(|o| o.tensor_split.clone()),
        Some(vec![9, 12]),
        "D1 filled to its 12, D0 the other 9"
    );
    assert!(best.measured && best.fits);
}

#[test]
fn beside_llama_cpps_default_split_one_probe_a_device_and_the_answer_is_paired_with_llama_cpps() {
    // --ngl 21; the search measured llama.cpp's default split (11 + 10, over D0's cap).
    let fit = crate::engine::predict::LlamaFitSplit {
        margins: Vec::new(),
        n_gpu_layers: Some(21),
        tensor_split: vec![10.0, 11.0],
        error: None,
    };
    let (found, measured) = fixed_world(|search, inp, found| {
        found.against = against_llama(search, found, inp, Some(&fit)).unwrap();
    });
    // D0 (11 layers in the default) leads, D1 (10) is solved from it: only D0 is probed (it cannot
    // hold all 21 layers: alone with the rest on the CPU, beside every layer on the CPU), then the
    // fastest predicted with every layer offloaded.
    let stage: Vec<Vec<u32>> = measured[..4].to_vec();
    assert_eq!(stage, [vec![21], vec![], vec![10, 0], vec![9, 12]], "3 trials beside the search's");
    let best = &found.options[found.best.unwrap()];
    assert_eq!((best.tensor_split.clone(), best.placement.n_gpu_layers), (vec![9, 12], 21));
    // Every measured split beyond the model's inputs (the probe, the default) was predicted:
    // 20 ms a token on the CPU, +1 ms a layer on D0, -0.5 on D1.
    let predicted: Vec<&SplitOption> =
        found.options.iter().filter(|o| o.measured && o.predicted_tg_ts.is_some()).collect();
    assert_eq!(predicted.iter().map(|o| o.tensor_split.clone()).collect::<Vec<_>>(), [vec![9, 12]]);
    for o in predicted {
        let (p, m) = (o.predicted_tg_ts.unwrap(), o.tg_ts.unwrap());
        assert!((p / m - 1.0).abs() < 0.01, "{}: predicted {p}, measured {m}", o.label);
    }
    // Paired with the default split (26 ms a token) and llama.cpp's fit for the caps (10 + 11: 24.5 ms).
    assert_eq!(measured.len(), 4 + 12, "three pairs of two trials against each");
    let a = &found.against;
    assert_eq!(a.len(), 2);
    assert!(a.iter().all(
        |c| c.result.verdict == crate::profile::Verdict::Faster && c.result.pairs == super::super::baseline::PAIRS
    ));
    assert!((a[0].result.tg_ratio.unwrap() - 26.0 / 23.0).abs() < 1e-3, "{:?}", a[0]);
    assert!((a[1].result.tg_ratio.unwrap() - 24.5 / 23.0).abs() < 1e-3, "{:?}", a[1]);
    assert_eq!(a[1].tensor_split(), [10, 11]);
    assert_eq!(a[1].result.llama_cpp_args(), a[1].result.placement.as_ref().unwrap().flags());
    assert!(a[0].tensor_split().is_empty(), "llama.cpp's default split: by free memory");
}

#[test]
fn a_split_in_another_order_is_run_and_emitted_with_its_device_list() {
    let s = crate::tune::worlds::settings();
    let devs = caps(&[1, 1]);
    let rpc = ["10.0.0.2:50052".to_string()];
    let inp = inputs(&devs, &rpc);
    // 13 layers on D1 first, the output's layer on D0 last.
    let split = Split::ordered(&[1, 13], &[1, 0]);
    let o = option_of("x", &split, vec![0, 0], None, &s, &inp);
    assert_eq!((o.tensor_split.clone(), o.order.clone()), (vec![1, 13], vec![1, 0]));
    assert!(
        o.llama_cpp_args().contains("--device D1,D0") && o.llama_cpp_args().contains("-ts 13,1"),
        "{}",
        o.llama_cpp_args()
    );
    assert_eq!(split_of(&o), split);
    let back = crate::placement::args::parse_placement(&o.llama_cpp_args()).unwrap();
    assert_eq!((back.devices, back.tensor_split), (vec!["D1".to_string(), "D0".to_string()], vec![13, 1]));
    let c = Candidate { split, ..Candidate::layers(14, 2) };
    let names = ["D0".to_string(), "D1".to_string()];
    let spec = crate::tune::executor::spec_of(&crate::engine::test_spec(), &names, c, None);
    assert_eq!(
        (spec.placement.devices.clone(), spec.placement.tensor_split.clone()),
        (names.iter().rev().cloned().collect(), vec![13, 1])
    );
    assert!(c.is(&spec));
    let base = crate::tune::worlds::recommendation();
    let r = recommendation(&base, &o, &devs, &rpc);
    assert_eq!(
        (r.placement.devices.clone(), r.placement.tensor_split.clone()),
        (vec!["D1".to_string(), "D0".to_string()], vec![13, 1])
    );
    assert!(r.llama_cpp_args.contains("--device D1,D0"), "{}", r.llama_cpp_args);
    assert!(r.runs().server_env().iter().any(|(k, v)| *k == "LLAMA_ARG_DEVICE" && v == "D1,D0"));
}

/// A recommended option is paired as it ran and as it is recommended: its
/// KV cache and FFN spill too, with llama.cpp's default split as with its own
/// (the pairing once rebuilt the default split's side as whole layers with
/// the workload's cache).
#[test]
fn a_recommended_option_is_paired_as_it_is_recommended_whatever_its_split() {
    let s = crate::tune::worlds::settings();
    let devs = caps(&[1, 1]);
    let inp = inputs(&devs, &[]);
    let names = ["D0".to_string(), "D1".to_string()];
    let base = crate::tune::worlds::recommendation();
    for split in [Split::default(), Split::new(&[6, 8])] {
        let mut o = option_of("x", &split, vec![0, 0], None, &s, &inp);
        (o.placement.n_gpu_layers, o.placement.kv_type, o.placement.n_cpu_ffn) =
            (14, crate::placement::KvType::Q8_0, 3);
        let spec = crate::tune::executor::spec_of(&crate::engine::test_spec(), &names, candidate_of(&o, 2), None);
        let p = &spec.placement;
        assert_eq!((p.n_gpu_layers, p.kv_type, p.n_cpu_ffn), (14, crate::placement::KvType::Q8_0, 3), "{split:?}");
        let r = recommendation(&base, &o, &devs, &[]);
        assert_eq!(
            (r.placement.n_gpu_layers, r.placement.kv_type, r.placement.n_cpu_ffn),
            (p.n_gpu_layers, p.kv_type, p.n_cpu_ffn)
        );
        assert_eq!(r.placement.tensor_split, p.tensor_split, "{split:?}");
    }
}

/// What the search and the stage are given to do `then` with.
pub(crate) type Then<'t> = dyn FnOnce(&mut Search<'_>, &SplitInputs<'_>, &mut SplitFound) + 't;

/// How the fixed world's dry run prices splits (by KV type and FFN layers on the CPU).
type PriceFn = fn(&[Split], crate::placement::KvType, u32) -> Vec<Prediction>;

/// The layer split's price in the fixed world.
fn world_price(x: &[Split], kv: crate::placement::KvType, k: u32) -> Vec<Prediction> {
    x.iter().map(|s| split_prediction_kv(&s.layers(), 0, kv, k)).collect()
}

/// --ngl 21 and llama.cpp's default split measured by the search, the
/// split stage, then `then` (the search, the inputs, what the stage
/// found); what was found and measured.
pub(crate) fn fixed_world(
    then: impl FnOnce(&mut Search<'_>, &SplitInputs<'_>, &mut SplitFound),
) -> (SplitFound, Vec<Vec<u32>>) {
    fixed_world_priced(0.0, &[0.0, 0.0], world_price, Box::new(then))
}

/// As [`fixed_world`], `-sm tensor` adding `tensor_ms` to a token, each
/// device's link round trip `link_ms`.
pub(crate) fn fixed_world_with(
    tensor_ms: f64,
    link_ms: &[f64],
    then: impl FnOnce(&mut Search<'_>, &SplitInputs<'_>, &mut SplitFound),
) -> (SplitFound, Vec<Vec<u32>>) {
    fixed_world_priced(tensor_ms, link_ms, world_price, Box::new(then))
}

/// As [`fixed_world_with`], the dry run pricing by `price`.
fn fixed_world_priced(
    tensor_ms: f64,
    link_ms: &[f64],
    price: PriceFn,
    then: Box<Then<'_>>,
) -> (SplitFound, Vec<Vec<u32>>) {
    let mut s = crate::tune::worlds::settings();
    s.policy.grid = Some(vec![21]);
    let mut world = SplitWorld::new(0, tensor_ms);
    let pricer = Box::new(Curves::splits(price));
    let mut search = crate::tune::worlds::search(&s, &mut world, 255e6).with_pricer(pricer);
    search.measure(Role::Grid, Candidate::layers(21, 2), None).unwrap();
    let mb = 1_000_000u64;
    let devs = caps(&[105 * mb, 150 * mb]);
    let mut inp = inputs(&devs, &[]);
    inp.links = link_ms.iter().map(|l| Link { tg_ms: *l, ..Link::default() }).collect();
    let mut found = split_stage(&mut search, &inp).unwrap();
    assert_eq!(search.take_unpriced(), None, "every dry run answered");
    then(&mut search, &inp, &mut found);
    drop(search);
    (found, world.measured)
}

/// Row refused by the dry run, tensor priced on llama.cpp's meta device
/// (200 MiB), the layer split as in the fixed world.
fn modes_dry_run(x: &[Split], kv: crate::placement::KvType, k: u32) -> Vec<Prediction> {
    if x.iter().all(|s| s.mode() == crate::placement::SplitMode::Layer) {
        return world_price(x, kv, k);
    }
    let mut p = split_prediction(&x[0].layers(), 0);
    match x[0].mode() {
        crate::placement::SplitMode::Row => {
            p.error = Some("dry-run model load failed: device D0 does not support split buffers".into());
        }
        _ => {
            let meta = crate::engine::predict::PredictedBuffer {
                buffer_type: "Meta()".into(),
                is_host: false,
                model: 200 << 20,
                context: 0,
                compute: 0,
            };
            p.buffers = vec![meta];
        }
    }
    vec![p]
}

#[test]
fn split_modes_row_and_tensor_are_priced_measured_where_llama_cpp_can_and_chosen_on_speed() {
    use crate::placement::SplitMode;
    // Tensor 2 ms a token slower than the layer split [9, 12]: measured, not recommended.
    let (found, measured) = fixed_world_priced(
        2.0,
        &[0.0, 0.0],
        modes_dry_run,
        Box::new(|search, inp, found| {
            split_modes(search, inp, found).unwrap();
        }),
    );
    assert_eq!(measured.last(), Some(&vec![9, 12]), "the tensor trial, the answer's proportions");
    let modes = &found.split_modes;
    assert!(modes[0].contains("row") && modes[0].contains("does not support split buffers"), "{modes:?}");
    assert!(modes[1].contains("tensor") && modes[1].contains("200.00 MiB in all, measured: ok"), "{modes:?}");
    let tensor = found.options.iter().find(|o| o.placement.split_mode == SplitMode::Tensor).unwrap();
    assert!(tensor.measured && tensor.fits && tensor.llama_cpp_args().contains("-sm tensor -ts 9,12"), "{tensor:?}");
    let best = &found.options[found.best.unwrap()];
    assert_eq!((best.placement.split_mode, best.tensor_split.clone()), (SplitMode::Layer, vec![9, 12]));
    // Tensor 5 ms a token faster: recommended, emitted as such.
    let (found, _) = fixed_world_priced(
        -5.0,
        &[0.0, 0.0],
        modes_dry_run,
        Box::new(|search, inp, found| {
            split_modes(search, inp, found).unwrap();
        }),
    );
    let best = &found.options[found.best.unwrap()];
    assert_eq!(best.placement.split_mode, SplitMode::Tensor);
    let devs = caps(&[105_000_000, 150_000_000]);
    let r = recommendation(&crate::tune::worlds::recommendation(), best, &devs, &[]);
    assert!(
        r.placement.split_mode == SplitMode::Tensor && r.llama_cpp_args.contains("-sm tensor"),
        "{}",
        r.llama_cpp_args
    );
    // One device holds the answer: nothing to split, nothing measured.
    let layers_only = |x: &[Split], kv, k| {
        assert!(x.iter().all(|s| s.mode() == SplitMode::Layer), "a split mode priced: {x:?}");
        world_price(x, kv, k)
    };
    let (found, _) = fixed_world_priced(
        0.0,
        &[0.0, 0.0],
        layers_only,
        Box::new(|search, inp, found| {
            let one = found.options.iter().position(|o| o.measured && o.tensor_split == [10, 0]).unwrap();
            found.best = Some(one);
            split_modes(search, inp, found).unwrap();
        }),
    );
    assert!(found.split_modes[0].contains("one device"), "{:?}", found.split_modes);
}

/// llama.cpp's default split (no `-ts`), paired and as fast, becomes the
/// recommended row with the layers it ran: its row's flags say them (they
/// were once rendered before its layer count was set, as `-ngl 0`).
#[test]
fn a_paired_default_split_recommended_is_written_with_the_layers_it_ran() {
    let (found, _) = fixed_world(|search, inp, found| {
        // 19 layers by free memory: 10 + 9, under both caps.
        let theirs = Candidate::layers(19, 2);
        search.measure(Role::Paired, theirs, None).unwrap();
        pairing::recommend_paired(search, found, inp, "llama.cpp's default split (by free memory)", theirs);
    });
    let o = &found.options[found.best.unwrap()];
    assert!(o.recommended && o.label.ends_with(", paired") && o.tensor_split.is_empty(), "{o:?}");
    assert_eq!(o.placement.n_gpu_layers, 19);
    assert!(o.llama_cpp_args().contains("-ngl 19 ") && !o.llama_cpp_args().contains("-ts "), "{}", o.llama_cpp_args());
    let v = serde_json::to_value(o).unwrap();
    assert_eq!(
        (v["n_gpu_layers"].as_u64(), v["llama_cpp_args"].as_str()),
        (Some(19), Some(o.llama_cpp_args().as_str()))
    );
}
