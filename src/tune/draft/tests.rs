use super::*;
use crate::engine::spec::SpecBuffer;

/// Ollama's CUDA process share counts with the heads' price where one
/// applies (an NVIDIA card measured through another backend), never otherwise.
#[test]
fn the_heads_price_with_ollamas_process_share_must_fit_the_cap() {
    let mib = |n: u64| n << 20;
    #[allow(clippy::cast_precision_loss)]
    let cap = mib(1000) as f64;
    assert!(over_with_share(mib(500), mib(612), cap), "1112 MiB over 1000");
    assert!(!over_with_share(mib(380), mib(612), cap), "992 MiB under it");
    assert!(!over_with_share(mib(1200), 0, cap), "no share: the gate alone decides");
}

/// A target of 100 device bytes at the answer, a draft of 4 layers and
/// its output at 10 bytes each on the device (the rest on the host);
/// generation takes `ns(ngld)` a repetition with the draft, 1 s without.
struct Fake {
    ns: fn(Option<u32>) -> u64,
    /// What a draft length does to `ns` (1.0: nothing).
    len: fn(u32) -> f64,
    loads: Vec<Option<u32>>,
    lengths: Vec<u32>,
    /// The call (from 0) that fails, as a load that ran out of memory.
    fail_at: Option<usize>,
}

impl DraftWorld for Fake {
    /// 100 device bytes at the answer (20 layers), 4 a layer; MTP adds 30.
    fn price_target(&mut self, p: &Placement) -> Result<Price> {
        let mtp = p.draft.as_ref().is_some_and(crate::placement::Draft::is_mtp);
        let layers = 4 * u64::from(p.n_gpu_layers);
        Ok(Some((20 + layers + if mtp { 30 } else { 0 }, 50)))
    }
    fn price_draft(&mut self, ngld: &[Option<u32>], _n_ctx: u32) -> Result<Vec<Price>> {
        Ok(ngld.iter().map(|n| Some((10 * u64::from(n.unwrap_or(5)), 10 * u64::from(5 - n.unwrap_or(5))))).collect())
    }
    fn measure(&mut self, ask: &SpecAsk) -> Result<SpecRun> {
        let ngld = ask.placement.draft.as_ref().and_then(|d| d.n_gpu_layers);
        let n_max = ask.placement.draft.as_ref().map_or(0, |d| d.n_max);
        if self.fail_at == Some(self.loads.len()) {
            self.loads.push(ngld);
            anyhow::bail!("llama.cpp could not create the target's context");
        }
        self.loads.push(ngld);
        self.lengths.push(n_max);
        // As priced: the MTP context 30, a draft model's layers 10 each.
        let draft = match &ask.placement.draft {
            Some(d) if d.is_mtp() => 30,
            Some(_) => 10 * u64::from(ngld.unwrap_or(5)),
            None => 0,
        };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let spec = |i: usize| ((self.ns)(ngld) as f64 * (self.len)(n_max)) as u64 + i as u64;
        let n = ask.repetitions as usize;
        let bytes = |draft: bool, b: u64| SpecBuffer {
            draft,
            buffer: "Vulkan0".into(),
            host: false,
            model: b,
            context: 0,
            compute: 0,
        };
        Ok(SpecRun {
            plain_ns: vec![1_000_000_000; n],
            spec_ns: (0..n).map(spec).collect(),
            n_gen: 32,
            n_depth: 64,
            n_drafted: 90,
            n_accepted: 60,
            n_rounds: 30,
            same_prefix: 32,
            buffers: vec![bytes(false, 20 + 4 * u64::from(ask.placement.n_gpu_layers)), bytes(true, draft)],
        })
    }
}

fn stage(cap: f64, ns: fn(Option<u32>) -> u64) -> (DraftReport, Vec<Option<u32>>) {
    staged(&request(3), cap, ns)
}

fn request(n_max: u32) -> DraftRequest {
    let n_max_fixed = n_max != crate::placement::DRAFT_N_MAX;
    DraftRequest { model: Some("d.gguf".into()), n_gpu_layers: None, n_max, n_max_fixed, prompt_file: None }
}

fn staged(request: &DraftRequest, cap: f64, ns: fn(Option<u32>) -> u64) -> (DraftReport, Vec<Option<u32>>) {
    let (r, world) = staged_with(request, cap, ns, |_| 1.0);
    (r, world.loads)
}

fn staged_with(
    request: &DraftRequest,
    cap: f64,
    ns: fn(Option<u32>) -> u64,
    len: fn(u32) -> f64,
) -> (DraftReport, Fake) {
    staged_in(request, cap, Fake { ns, len, loads: Vec::new(), lengths: Vec::new(), fail_at: None })
}

/// The stage over `world` at a target of 20 layers, 2048 context.
fn staged_in(request: &DraftRequest, cap: f64, mut world: Fake) -> (DraftReport, Fake) {
    let answer = Placement { n_ctx: Some(2048), ..Placement::default() }.with_layers(20, 2, Some(2048));
    let inp = DraftInputs {
        model: Path::new("m.gguf"),
        request,
        answer: &answer,
        cap: Some(cap),
        host_cap: None,
        n_depth: 1024,
        n_gen: 32,
        repetitions: 3,
        draft_full: 5,
    };
    (run(&inp, &mut world).unwrap(), world)
}

fn chosen(r: &DraftReport) -> Option<Option<u32>> {
    r.chosen().map(|o| o.placement.draft.as_ref().unwrap().n_gpu_layers)
}

#[test]
fn the_draft_on_the_device_is_the_answer_where_it_fits_and_pays() {
    let (r, loads) = stage(200.0, |n| if n.is_none() { 500_000_000 } else { 1_250_000_000 });
    assert_eq!(
        loads,
        [Some(0), None, None, None],
        "both measured, each in one load of {MIN_PAIRS} pairs, then the device's at two other lengths"
    );
    assert_eq!(chosen(&r), Some(None), "{r:#?}");
    assert_eq!(
        r.chosen().unwrap().placement.draft.as_ref().unwrap().n_max,
        3,
        "a tie keeps llama-server's default length"
    );
    assert!(r.summary.starts_with("speculation pays at depth 1024"), "{}", r.summary);
    let o = r.chosen().unwrap();
    assert_eq!((o.device_bytes, o.predicted_device_bytes), (Some(150), Some(150)));
    assert!(o.ratio.unwrap()[1] > 1.0 && o.acceptance == Some(60.0 / 90.0), "{o:?}");
}

#[test]
fn where_the_cap_holds_the_target_and_part_of_the_draft_the_most_draft_layers_that_fit_are_tried() {
    // 100 + 10 k <= 125: two of the draft's layers; every layer (150) is over.
    let (r, loads) = stage(125.0, |n| if n == Some(2) { 800_000_000 } else { 1_250_000_000 });
    // The CPU's, the two draft layers', the trade's three pairs (load against load), two lengths.
    let mut expected = vec![Some(0), Some(2)];
    expected.extend([None; 6]);
    expected.extend([Some(2), Some(2)]);
    assert_eq!(loads, expected, "{r:#?}");
    let all = r.options.iter().find(|o| o.placement.draft.as_ref().unwrap().n_gpu_layers.is_none()).unwrap();
    assert!(!all.fits && all.loads == 0 && all.note.starts_with("over the cap with the target"), "{all:?}");
    assert_eq!(chosen(&r), Some(Some(2)));
}

/// The other side of the trade: the whole draft on the device with the
/// target's layers it displaces (20 + 4 k + 50 <= 125: k = 13, 7 fewer),
/// measured load against load with the answer, and the answer where
/// faster beyond the interval.
#[test]
fn where_the_whole_draft_does_not_fit_beside_the_target_the_target_layers_it_costs_are_measured() {
    let (r, _) = stage(125.0, |n| if n.is_none() { 500_000_000 } else { 1_250_000_000 });
    let trade = r.options.iter().find(|o| o.placement.n_gpu_layers == 13).unwrap();
    assert!(trade.label.contains("the target at -ngl 13") && trade.label.contains("(7 fewer)"), "{}", trade.label);
    assert_eq!((trade.predicted_device_bytes, trade.loads), (Some(122), 3), "{trade:?}");
    assert!(trade.note.starts_with("paired load against load with the answer (-ngl 20, no draft)"), "{}", trade.note);
    assert_eq!(r.chosen().map(|o| o.placement.n_gpu_layers), Some(13), "{r:#?}");
    // Where the draft does not win the layers back, the answer keeps them.
    let (r, _) = stage(125.0, |_| 1_250_000_000);
    assert_eq!(r.chosen(), None, "{r:#?}");
}

#[test]
fn mtp_heads_are_priced_with_and_without_them_and_where_they_fit_measured_at_the_answer() {
    // 100 bytes without MTP, 130 with by the dry run and the load: under a cap of 160 both fit.
    let (r, loads) = staged(&DraftRequest::mtp(), 160.0, |_| 500_000_000);
    assert!(r.mtp && r.draft == Path::new("m.gguf"), "{r:#?}");
    assert_eq!(loads, [None, None, None], "one option, at the answer, measured at three lengths");
    let o = r.chosen().expect("twice as fast beyond the noise");
    assert!(o.placement.draft.as_ref().unwrap().is_mtp() && o.placement.n_gpu_layers == 20, "{o:?}");
    assert_eq!(o.predicted_device_bytes, Some(130));
    assert!(o.note.starts_with("the answer without them: 0.00 MiB"), "{}", o.note);
    assert!(r.summary.starts_with("speculation pays with the model's MTP heads"), "{}", r.summary);
}

#[test]
fn where_mtp_heads_do_not_fit_at_the_answer_the_layers_they_cost_are_measured_against_it() {
    // 130 > 120: with MTP, 20 + 4 k + 30 <= 120 holds to k = 17, three layers fewer.
    let (r, world) = staged_with(&DraftRequest::mtp(), 120.0, |_| 500_000_000, |_| 1.0);
    assert_eq!(r.options.len(), 2, "{r:#?}");
    assert!(!r.options[0].fits && r.options[0].note.starts_with("over the cap with the target"), "{r:#?}");
    let fewer = &r.options[1];
    assert!(fewer.label.contains("(3 fewer)") && fewer.placement.n_gpu_layers == 17, "{fewer:?}");
    // Load against load, the answer (no draft: length 0 here) and the heads at 17, in the pairs' order.
    assert_eq!(world.lengths, [0, 3, 3, 0, 3, 0], "three pairs, the answer first, then the heads first twice: {r:#?}");
    assert_eq!(fewer.loads, 3, "{fewer:?}");
    assert!(
        fewer.note.starts_with(
            "paired load against load with the answer (-ngl 20, no draft), 3 pairs: 3 target layers fewer"
        ),
        "{}",
        fewer.note
    );
    // Twice the answer's speed with the heads, beyond the noise: the trade is the answer.
    assert_eq!(r.chosen().map(|o| o.placement.n_gpu_layers), Some(17), "{r:#?}");
    assert!(fewer.ratio.unwrap()[1] > 1.0 && fewer.device_bytes == Some(118), "{fewer:?}");
    assert_eq!(fewer.plain_tg_ts, Some(32.0), "the answer's own generation: 32 tokens a second");
    // Where the heads do not win the layers back, no draft.
    let (r, _) = staged_with(&DraftRequest::mtp(), 120.0, |_| 1_250_000_000, |_| 1.0);
    assert_eq!(r.chosen(), None);
    assert_eq!(r.options[1].verdict, Some(Verdict::Slower), "{r:#?}");
    assert!(r.summary.contains("does not pay"), "{}", r.summary);
}

#[test]
fn a_draft_that_slows_generation_is_not_the_answer_and_the_report_says_so() {
    let (r, _) = stage(200.0, |_| 1_250_000_000);
    assert_eq!(chosen(&r), None);
    assert!(r.summary.contains("does not pay") && r.summary.contains("no draft"), "{}", r.summary);
    assert!(r.options.iter().all(|o| o.verdict == Some(Verdict::Slower)), "{r:#?}");
}

/// A draft whose accepted runs are long pays more at 8 tokens a draft
/// than at llama-server's 3: the best placement is measured again at
/// each other length and the faster length is the answer; a length
/// the user set is kept as asked.
#[test]
fn the_draft_length_is_searched_beside_llama_servers_default_unless_the_user_set_one() {
    let device = |n: Option<u32>| if n.is_none() { 500_000_000 } else { 1_250_000_000 };
    let long = |n: u32| if n == 8 { 0.6 } else { 1.0 };
    let (r, world) = staged_with(&request(3), 200.0, device, long);
    assert_eq!(world.lengths, [3, 3, 1, 8], "{r:#?}");
    let o = r.chosen().unwrap();
    assert_eq!(
        (o.placement.draft.as_ref().unwrap().n_max, o.placement.draft.as_ref().unwrap().n_gpu_layers),
        (8, None)
    );
    assert!(o.label.ends_with("8 tokens a draft (--spec-draft-n-max 8)"), "{}", o.label);
    assert!(o.placement.flags().contains("--spec-draft-n-max 8"), "{}", o.placement.flags());
    // Asked for 5 (--draft-max 5): no other length is tried.
    let (r, world) = staged_with(&request(5), 200.0, device, long);
    assert_eq!(world.lengths, [5, 5], "{r:#?}");
    assert_eq!(r.chosen().unwrap().placement.draft.as_ref().unwrap().n_max, 5);
    // Asked for llama-server's own 3 (--draft-max 3): kept as asked too.
    let fixed = DraftRequest { n_max_fixed: true, ..request(3) };
    let (r, world) = staged_with(&fixed, 200.0, device, long);
    assert_eq!(world.lengths, [3, 3], "{r:#?}");
}

/// A load of the trade that fails in its third pair (out of memory near
/// the cap, say) leaves it not measured, whatever the two pairs before
/// said: it is never the answer.
#[test]
fn a_trade_whose_load_fails_mid_pairs_is_not_measured_and_not_the_answer() {
    let world = Fake { ns: |_| 500_000_000, len: |_| 1.0, loads: Vec::new(), lengths: Vec::new(), fail_at: Some(4) };
    let (r, _) = staged_in(&DraftRequest::mtp(), 120.0, world);
    let fewer = &r.options[1];
    assert_eq!((fewer.loads, fewer.verdict), (2, Some(Verdict::NotMeasured)), "{fewer:?}");
    assert!(fewer.note.contains("not measured: a load failed"), "{}", fewer.note);
    assert_eq!(r.chosen(), None, "{r:#?}");
}

/// llama-server's output limits beside a draft
/// (`common_speculative_get_output_limits`): a verifying batch a slot,
/// capped by the batch.
#[test]
fn a_target_beside_a_draft_is_sized_for_a_verifying_batch_a_slot() {
    use crate::engine::spec::output_limits;
    assert_eq!(output_limits(512, 4, 3), [16, 4]);
    assert_eq!(output_limits(512, 1, 8), [9, 9]);
    assert_eq!(output_limits(8, 4, 8), [8, 8]);
    assert_eq!(longest_length(&request(3)), LONGEST_LENGTH);
    assert_eq!(longest_length(&DraftRequest { n_max_fixed: true, ..request(2) }), 2);
}
