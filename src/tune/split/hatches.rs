//! The escape hatches over several devices: a q8_0 KV cache that lets more
//! layers onto the faster devices, and FFN weights on the CPU.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The escape hatch with several devices: a q8_0 KV cache (half an f16
/// cache's bytes per token) where it lets more layers onto the faster
/// devices. Each device's capacity is priced again with that cache (two dry
/// runs), the fastest split by each device's speed under those capacities
/// is priced exactly and, where it differs from every split measured and is
/// predicted faster than the recommendation, measured once, and the
/// cache's quality against f16 measured (`assess`, as for one device: it
/// does not depend on where the layers run). It is recommended only where
/// its quality passes the gate and it is faster than the best lossless
/// split by [`LOSSY_MARGIN`]. Not where the consumer's server fixes the
/// cache type.
///
/// # Errors
/// What the executor or `assess` returns (an interrupt).
pub fn kv_hatch(
    search: &mut Search<'_>,
    inp: &SplitInputs<'_>,
    found: &mut SplitFound,
    assess: &mut crate::tune::placement::Assessor<'_>,
) -> Result<()> {
    let s = search.settings();
    let (Some(m), Some(best)) = (found.speed.clone(), found.best.map(|i| found.options[i].clone())) else {
        return Ok(());
    };
    if s.kv_type.is_quantized() {
        return Ok(());
    }
    let (devs, full) = (inp.devs, inp.full);
    let q8 = KvType::Q8_0;
    let Ok((cost, full_cap, partial_cap)) = capacities(&mut |x: &[Split]| search.price_splits(x, q8, 0), devs, full)
    else {
        return Ok(());
    };
    let best_score = crate::tune::choose::score_for(s, best.tg_ts, best.pp_ts).unwrap_or(0.0);
    let todo: Vec<Labelled> = speed_candidates(&m, s, full, &full_cap, &partial_cap)
        .into_iter()
        .filter(|(_, x)| !found.options.iter().any(|o| o.measured && split_of(o).layers() == x.layers()))
        .filter(|(_, x)| predicted_score(&m, s, x) > best_score)
        .map(|(_, x)| ("q8_0 KV cache: more layers on the faster devices".to_string(), x))
        .collect();
    let priced = price_all(todo, &mut |x: &[Split]| search.price_splits(x, q8, 0), devs, &cost);
    let Some((label, split, p)) = priced.into_iter().next() else {
        return Ok(());
    };
    let ngl: u32 = split.layers().iter().sum();
    let c = Candidate { split, kv: Some(q8), ..Candidate::layers(ngl, inp.threads) };
    let race = search.race();
    let t = search.measure(Role::Hatch, c, Some(race))?.clone();
    // The check reads the text twice (minutes on a slow host): only for a cache that measured faster.
    let faster = crate::tune::search::trial_score(&t, s).is_some_and(|v| v > best_score);
    let quality = if t.result.status == TrialStatus::Ok && faster { assess(q8)? } else { None };
    let mut o = option_of(&label, &split, per_device(&p, devs), Some(&t), s, inp);
    o.quality = quality;
    let (tg, pp) = m.predict(&split);
    (o.predicted_tg_ts, o.predicted_pp_ts) = (Some(tg), pp);
    found.options.push(o);
    choose_again(found, s);
    Ok(())
}

/// The CPU's own time per layer (tg, pp in ms) for a spill's prediction:
/// 0 where the costs are relative to the CPU, else from the search's
/// trial with every layer on the CPU (its time over the layers and the
/// output's work); `None` without one.
pub(super) fn cpu_layer_ms(search: &Search<'_>, m: &SpeedModel, inp: &SplitInputs<'_>) -> Option<(f64, f64)> {
    if m.cpu_tg_ms > 0.0 {
        return Some((0.0, 0.0));
    }
    let t = all_cpu(&search.trials, inp.threads)?;
    let work = f64::from(inp.full.saturating_sub(1)) + inp.output_layers;
    let per = |ts: Option<f64>| ts.filter(|v| *v > 0.0).map_or(0.0, |v| 1000.0 / v / work);
    let (tg, pp) = rates(t);
    tg.is_some().then(|| (per(tg), per(pp)))
}

/// FFN spill with several devices: the fastest device alone with every
/// layer, the dense FFN weights of its first K layers on the CPU (`-ot`),
/// where the answer leaves it layers short. K is the fewest that fit its
/// cap, solved from two dry runs (K = 1 and every layer) and priced
/// exactly (one more while over, three times at most). The split is
/// measured once where each device's speed predicts it faster than the
/// recommendation (a spilled layer gives the CPU back its FFN's share of
/// the layer and crosses to it and back), or where the costs cannot
/// predict it (absolute, without a trial on the CPU); it is lossless and
/// chosen with the rest. Only where every layer may be offloaded (the
/// spilled layers are the first ones) and the model is dense.
///
/// # Errors
/// What the executor returns (an interrupt).
pub fn ffn_hatch(search: &mut Search<'_>, inp: &SplitInputs<'_>, found: &mut SplitFound) -> Result<()> {
    let s = search.settings();
    let (Some(m), Some(best)) = (found.speed.clone(), found.best.map(|i| found.options[i].clone())) else {
        return Ok(());
    };
    let (devs, full, n_layer) = (inp.devs, inp.full, inp.full.saturating_sub(1));
    let Some(d) = m.fastest(s.objective, (s.n_prompt, s.n_gen)) else { return Ok(()) };
    if inp.is_moe || n_layer < 2 || !eligible(s, full, full) || best.tensor_split.get(d).is_some_and(|l| *l >= full) {
        return Ok(());
    }
    let mut layers = vec![0; devs.len()];
    layers[d] = full;
    let alone = Split::new(&layers);
    let (kv, cap) = (s.kv_type, devs[d].cap_bytes);
    let mut at = |k: u32| search.price_splits(&[alone], kv, k).into_iter().next().filter(|p| p.error.is_none());
    let (Some(one), Some(all)) = (at(1), at(n_layer)) else { return Ok(()) };
    let bytes = |p: &Prediction| parts(p, devs)[d].0;
    let dev = &devs[d].device;
    if per_device(&all, devs)[d] > cap {
        found.notes.push(crate::types::Note::split(format!(
            "FFN spill across devices not tried: {dev} does not hold every layer even with every FFN on the CPU"
        )));
        return Ok(());
    }
    #[allow(clippy::cast_precision_loss)]
    let ffn = bytes(&one).saturating_sub(bytes(&all)) as f64 / f64::from(n_layer - 1);
    if ffn <= 0.0 {
        return Ok(());
    }
    #[allow(clippy::cast_precision_loss)]
    let over = per_device(&one, devs)[d].saturating_sub(cap) as f64;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let mut k = (1 + (over / ffn).ceil() as u32).min(n_layer);
    let mut priced = (all, n_layer);
    for _ in 0..3 {
        match at(k) {
            Some(p) if per_device(&p, devs)[d] <= cap => {
                priced = (p, k);
                break;
            }
            _ if k < n_layer => k += 1,
            _ => break,
        }
    }
    let (p, k) = priced;
    let share = (ffn / inp.layer_bytes.max(1.0)).clamp(0.0, 1.0);
    let predicted = cpu_layer_ms(search, &m, inp).map(|cpu| m.predict_spilled(&alone, (d, k, share), cpu));
    let score = |tg: Option<f64>, pp| crate::tune::choose::score_for(s, tg, pp);
    let best_score = score(best.tg_ts, best.pp_ts).unwrap_or(0.0);
    if let Some((tg, pp)) = predicted.filter(|(tg, pp)| score(Some(*tg), *pp).unwrap_or(0.0) <= best_score) {
        let pp = pp.map_or(String::new(), |v| format!(", pp {v:.2}"));
        found.notes.push(crate::types::Note::split(format!(
            "FFN spill across devices not measured: {dev} alone with the FFN of {k} layers on the CPU is predicted slower (tg {tg:.2}{pp} t/s) than the recommendation"
        )));
        return Ok(());
    }
    search.predicted.push(p.clone());
    let c = Candidate { split: alone, n_cpu_ffn: k, ..Candidate::layers(full, inp.threads) };
    let race = search.race();
    let t = search.measure(Role::Hatch, c, Some(race))?.clone();
    let label = format!("FFN spill: {dev} alone, the FFN of its first {k} layers on the CPU");
    let mut o = option_of(&label, &alone, per_device(&p, devs), Some(&t), s, inp);
    (o.predicted_tg_ts, o.predicted_pp_ts) = predicted.map_or((None, None), |(tg, pp)| (Some(tg), pp));
    found.options.push(o);
    choose_again(found, s);
    Ok(())
}
