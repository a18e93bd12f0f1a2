//! The split modes beside the layer split: row and tensor, with the
//! answer's proportions, priced by the dry run and measured where llama.cpp
//! can run them.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The split modes beside layer for the recommended split: row (each
/// matrix's rows across the devices; llama.cpp needs a backend with split
/// buffers, CUDA or SYCL) and tensor (every weight and the KV cache across
/// the devices, llama.cpp's experimental meta device), each priced by
/// llama.cpp's dry run with the recommended proportions and, where it
/// answers and stays under the caps (tensor: its whole under the caps of
/// the devices it uses, as the meta device does not say its bytes per
/// device), measured once and chosen with the rest. What each came to, in
/// words, goes to `found.split_modes`. Where the answer holds layers on one
/// device, there is nothing to split.
///
/// # Errors
/// What the executor returns (an interrupt).
pub fn split_modes(search: &mut Search<'_>, inp: &SplitInputs<'_>, found: &mut SplitFound) -> Result<()> {
    use crate::placement::SplitMode;
    let devs = inp.devs;
    let Some(best) = found.best.map(|i| found.options[i].clone()) else { return Ok(()) };
    let layers = &best.tensor_split;
    if layers.iter().filter(|l| **l > 0).count() < 2 {
        found.split_modes = vec!["split modes row and tensor: not tried, the answer holds layers on one device".into()];
        return Ok(());
    }
    let mut measured = false;
    for mode in [SplitMode::Row, SplitMode::Tensor] {
        let split = split_of(&best).with_mode(mode);
        let said = match super::dry_run(search, &[split]).into_iter().next() {
            None => "no answer from llama.cpp's dry run".to_string(),
            Some(p) => match &p.error {
                Some(e) => format!("llama.cpp refuses it: {}", e.split(": ").last().unwrap_or(e)),
                None => {
                    let total: u64 = p.per_device().iter().map(|(_, b)| *b).sum();
                    if !under_caps(&p.per_device(), &split, devs) {
                        format!("priced {} in all: over the caps", crate::model::human_bytes(total))
                    } else {
                        let ngl: u32 = layers.iter().sum();
                        let c = Candidate {
                            split,
                            kv: Some(best.placement.kv_type),
                            ..Candidate::layers(ngl, inp.threads)
                        };
                        let race = search.race();
                        let t = search.measure(Role::Split, c, Some(race))?.clone();
                        let s = search.settings();
                        let label = format!("the same proportions, -sm {}", mode.as_str());
                        let mut o = option_of(&label, &split, per_device(&p, devs), Some(&t), s, inp);
                        o.quality.clone_from(&best.quality);
                        found.options.push(o);
                        measured = true;
                        format!(
                            "priced {} in all, measured: {}",
                            crate::model::human_bytes(total),
                            t.result.status.as_str()
                        )
                    }
                }
            },
        };
        found.split_modes.push(format!("split mode {} with the answer's proportions: {said}", mode.as_str()));
    }
    if measured {
        choose_again(found, search.settings());
    }
    Ok(())
}
