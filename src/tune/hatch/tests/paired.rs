//! The hatch stage's choices paired across loads (`paired_choice`), in
//! worlds whose loads differ.

use super::*;

/// A q8_0 cache that fits at full offload measures 2% faster than the
/// layer split in its one load (its repetitions agree exactly), while
/// loads differ by up to 10%: paired with the lossless answer, a tie, so
/// the lossless answer stays and the cache's note says why.
#[test]
fn a_lossy_cache_is_chosen_by_the_paired_statistic_not_by_one_loads_spread() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    fn tg(c: Candidate, _depth: u32) -> f64 {
        const LOADS: [f64; 7] = [1.0, 1.08, 0.93, 1.05, 0.96, 1.1, 0.9];
        let load = LOADS[CALLS.fetch_add(1, Ordering::Relaxed) % LOADS.len()];
        match (c.ngl, c.kv) {
            (11, Some(KvType::Q8_0)) => 10.2 * load,
            (11, _) => 10.4 * load,
            _ => 10.0 * load,
        }
    }
    let (h, measured) = hatch_world_at(3000.0, 6, 0, tg);
    let kv = h.options.iter().find(|o| o.kind == HatchKind::KvCache && o.placement.kv_type == KvType::Q8_0).unwrap();
    assert!(kv.note.contains("paired with the best lossless option"), "{}", kv.note);
    // Loads 10% apart: five pairs cannot tell 2% (the interval reaches past 10% either way).
    assert!(kv.note.contains("not decided") && kv.note.contains('['), "{}", kv.note);
    assert!(!kv.recommended);
    assert_eq!(picked(&h.options), [HatchKind::LayerSplit], "{:?}", h.options);
    assert!(h.notes.is_empty(), "no hatch is the answer: {:?}", h.notes);
    let q8 = measured.iter().filter(|c| c.ngl == 11 && c.kv == Some(KvType::Q8_0)).count();
    assert_eq!(q8, 6, "its hatch trial and five paired (not decided after three): {measured:?}");
}

/// Whole layers (ngl 6) and the FFN spill measured once each: the spill's
/// one load was slow and came in 5% behind; paired, it is 20% faster in
/// every load, so it becomes the answer (the rig's dense24 long miss:
/// one trial each decided between two lossless placements 13% apart).
#[test]
fn a_lossless_option_close_behind_on_one_trial_is_paired_and_wins_where_faster() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SPILLS: AtomicUsize = AtomicUsize::new(0);
    fn tg(c: Candidate, _depth: u32) -> f64 {
        match (c.ngl, c.kv, c.n_cpu_ffn) {
            (11, None, k) if k > 0 => {
                let first = SPILLS.fetch_add(1, Ordering::Relaxed) < 2;
                if first {
                    9.5
                } else {
                    12.0
                }
            }
            (11, _, _) => 9.0,
            _ => 10.0,
        }
    }
    // Full offload takes 4377 bytes at 32k, 60 fewer a spilled layer: K = 3 and 4 fit 4250.
    let (h, measured) = hatch_world_at(4250.0, 6, 0, tg);
    assert_eq!(picked(&h.options), [HatchKind::FfnSpill], "{:#?}", h.options);
    let spill = h.options.iter().find(|o| o.recommended).unwrap();
    assert!(spill.note.contains("paired with the recommendation") && spill.note.contains("faster"), "{}", spill.note);
    let whole = h.options.iter().find(|o| o.kind == HatchKind::LayerSplit).unwrap();
    assert!(whole.note.contains("paired trials were not"), "{}", whole.note);
    let paired_whole = measured.iter().filter(|c| c.ngl == 6).count();
    assert_eq!(paired_whole, 3, "three pairs, the same ratio in each: {measured:?}");
}

/// A lossless rival far behind the answer on its one trial (the FFN
/// spill at 13.6 t/s, whole layers at 4.8) is not paired.
#[test]
fn a_lossless_option_far_behind_is_not_paired() {
    fn tg(c: Candidate, _depth: u32) -> f64 {
        match (c.ngl, c.kv, c.n_cpu_ffn) {
            (11, None, _) => 13.6,
            (11, _, _) => 5.0,
            (n, _, _) => 3.0 + 0.3 * f64::from(n),
        }
    }
    let (h, measured) = hatch_world_at(4250.0, 6, 0, tg);
    assert_eq!(picked(&h.options), [HatchKind::FfnSpill], "{:#?}", h.options);
    assert!(h.options.iter().all(|o| !o.note.contains("paired")), "{:#?}", h.options);
    assert!(measured.iter().all(|c| c.ngl != 6), "the layer split is not measured again: {measured:?}");
}

/// docs/truth.md's smol tight cell: no quantized cache lets a layer more
/// on, yet a q8_0 cache at the answer's own layers reads half the cache
/// for each token at depth. It is measured beside the answer, its quality
/// read only where its one trial is ahead, and it becomes the answer only
/// where the pairs find it faster than f16.
#[test]
fn a_q8_0_cache_at_the_answers_own_layers_is_measured_and_kept_only_where_the_pairs_find_it_faster() {
    fn ahead(c: Candidate, _depth: u32) -> f64 {
        match (c.ngl, c.kv, c.n_cpu_ffn) {
            (11, Some(KvType::Q8_0), 0) => 46.0,
            (11, None, 0) => 40.0,
            (n, _, _) => 3.0 + 0.3 * f64::from(n),
        }
    }
    // 4400: f16 fits at full offload (4370), its cache (10 x 327) over a quarter of the cap.
    let (h, measured) = hatch_world_at(4400.0, 11, 0, ahead);
    assert!(h.fits_fully, "{:?}", h.options);
    let kv: Vec<(Option<KvType>, u32)> =
        hatch_trials(&measured).filter(|c| c.kv.is_some()).map(|c| (c.kv, c.ngl)).collect();
    assert_eq!(kv, [(Some(KvType::Q8_0), 11)], "q8_0 at the answer's layers, q4_0 not tried: {measured:?}");
    let pick = h.options.iter().find(|o| o.recommended).unwrap();
    assert_eq!(
        (pick.kind, pick.placement.kv_type, pick.placement.n_gpu_layers),
        (HatchKind::KvCache, KvType::Q8_0, 11)
    );
    assert_eq!(pick.quality.as_ref().map(|q| q.kl_mean), Some(0.002), "its quality, checked");
    assert!(
        pick.note.contains("paired with the best lossless option") && pick.note.contains("faster"),
        "{}",
        pick.note
    );

    // Where it is behind on its one trial (37 against 40), it is measured once, its quality never read.
    let (h, measured) = hatch_world_at(4400.0, 11, 0, guide_tg);
    let q8 = h.options.iter().find(|o| o.kind == HatchKind::KvCache && o.placement.kv_type == KvType::Q8_0).unwrap();
    assert!(q8.measured && !q8.recommended && q8.quality.is_none(), "{q8:?}");
    assert!(q8.note.contains("quality not checked"), "{}", q8.note);
    assert_eq!(picked(&h.options), [HatchKind::LayerSplit], "{:?}", h.options);
    assert_eq!(measured.iter().filter(|c| c.kv == Some(KvType::Q8_0)).count(), 1, "{measured:?}");
}
