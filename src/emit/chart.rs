//! The tuning curve as an SVG chart (plotters): tg and pp against ngl,
//! device memory on a second axis, the cap, the recommendation and the knee;
//! measured points as markers, fitted lines dashed.

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use crate::profile::Profile;
use crate::types::TrialStatus;

const MIB: f64 = 1024.0 * 1024.0;
const TG: RGBColor = RGBColor(31, 119, 180);
const PP: RGBColor = RGBColor(255, 127, 14);
const MEM: RGBColor = RGBColor(44, 160, 44);
const CAP: RGBColor = RGBColor(214, 39, 40);
const REC: RGBColor = RGBColor(0, 0, 0);
const KNEE: RGBColor = RGBColor(148, 103, 189);
const OTHER_CTX: [RGBColor; 3] = [RGBColor(127, 127, 127), RGBColor(23, 190, 207), RGBColor(188, 189, 34)];

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("cannot draw the chart: {e}")
}

/// What the chart shows, in its units: ngl against t/s and MiB.
struct Data {
    tg: Vec<(f64, f64)>,
    pp: Vec<(f64, f64)>,
    mem: Vec<(f64, f64)>,
    tg_fit: Vec<(f64, f64)>,
    pp_fit: Vec<(f64, f64)>,
    mem_fit: Vec<(f64, f64)>,
    cap_mib: f64,
    x_max: f64,
    y_max: f64,
    m_max: f64,
    cap_visible: bool,
    /// tg measured at ngl values for each other context tuned.
    other_ctx: Vec<(u32, Vec<(f64, f64)>)>,
}

impl Data {
    fn of(p: &Profile) -> Data {
        let n_ctx = p.settings.workload.n_ctx;
        let ok: Vec<_> = p
            .trials
            .iter()
            .filter(|t| t.result.status == TrialStatus::Ok && t.is_search() && t.at_ctx(n_ctx))
            .collect();
        let at = |t: &&crate::profile::ProfileTrial, v: f64| (f64::from(t.result.spec.placement.n_gpu_layers), v);
        let tg: Vec<(f64, f64)> = ok.iter().filter_map(|t| t.result.test(false).map(|x| at(t, x.avg_ts))).collect();
        let pp: Vec<(f64, f64)> = ok.iter().filter_map(|t| t.result.test(true).map(|x| at(t, x.avg_ts))).collect();
        let mem: Vec<(f64, f64)> = ok.iter().filter_map(|t| t.mem_bytes.map(|m| at(t, m / MIB))).collect();
        // The models the tuner chose with: measured points, the partial-offload
        // fit, interpolation between neighbours (see curve::Curve).
        let n_full = p.model.n_layer_full;
        let (tg_c, pp_c, mem_c) = crate::types::Point::curves(&p.search_points(), n_full);
        let speed = |c: &crate::curve::Curve| -> Vec<(f64, f64)> {
            (0..=n_full).filter_map(|n| c.predict(n).filter(|t| *t > 0.0).map(|t| (f64::from(n), 1.0 / t))).collect()
        };
        // One point is no line (a test measured at one setting only): no model drawn or listed.
        let line = |v: Vec<(f64, f64)>| if v.len() < 2 { Vec::new() } else { v };
        let tg_fit = line(speed(&tg_c));
        let pp_fit = line(speed(&pp_c));
        let mem_fit = line((0..=n_full).filter_map(|n| mem_c.predict(n).map(|m| (f64::from(n), m / MIB))).collect());
        let cap_mib = (p.memory.cap_bytes / MIB).max(0.0);
        // Headroom keeps the data below the legend in the upper right.
        // The other contexts' whole-layer searches: one tg line each.
        let other_ctx: Vec<(u32, Vec<(f64, f64)>)> = p
            .settings
            .contexts()
            .into_iter()
            .filter(|c| *c != n_ctx)
            .map(|c| {
                let mut v: Vec<(f64, f64)> = p
                    .trials
                    .iter()
                    .filter(|t| t.result.status == TrialStatus::Ok && t.is_search() && t.at_ctx(c))
                    .filter_map(|t| {
                        t.result.test(false).map(|x| (f64::from(t.result.spec.placement.n_gpu_layers), x.avg_ts))
                    })
                    .collect();
                v.sort_by(|a, b| a.0.total_cmp(&b.0));
                (c, v)
            })
            .collect();
        let y_max = tg
            .iter()
            .chain(&pp)
            .chain(&tg_fit)
            .chain(&pp_fit)
            .chain(other_ctx.iter().flat_map(|(_, v)| v))
            .map(|v| v.1)
            .fold(1.0, f64::max)
            * 1.4;
        let mem_top = mem.iter().chain(&mem_fit).map(|v| v.1).fold(0.0, f64::max);
        // Show the cap when it is within reach of the data; otherwise note it in the caption.
        let cap_visible = cap_mib > 0.0 && cap_mib <= mem_top * 4.0;
        let m_max = (if cap_visible { mem_top.max(cap_mib) } else { mem_top }).max(1.0) * 1.4;
        Data {
            tg,
            pp,
            mem,
            tg_fit,
            pp_fit,
            mem_fit,
            cap_mib,
            x_max: f64::from(n_full) + 1.0,
            y_max,
            m_max,
            cap_visible,
            other_ctx,
        }
    }
}

type Dual<'a, 'b> = plotters::chart::DualCoordChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

fn legend_line(c: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
}

/// Throughput: measured tg and pp, and the models through them.
fn draw_speeds(chart: &mut Dual<'_, '_>, d: &Data) -> Result<()> {
    if !d.tg_fit.is_empty() {
        chart
            .draw_series(DashedLineSeries::new(d.tg_fit.clone(), 6, 4, TG.stroke_width(2)))
            .map_err(err)?
            .label("tg model (fit, interpolation)")
            .legend(legend_line(TG));
    }
    chart
        .draw_series(d.tg.iter().map(|&(x, y)| Circle::new((x, y), 5, TG.filled())))
        .map_err(err)?
        .label("tg measured")
        .legend(|(x, y)| Circle::new((x + 10, y), 5, TG.filled()));
    if !d.pp_fit.is_empty() {
        chart
            .draw_series(DashedLineSeries::new(d.pp_fit.clone(), 6, 4, PP.stroke_width(2)))
            .map_err(err)?
            .label("pp model")
            .legend(legend_line(PP));
    }
    chart
        .draw_series(d.pp.iter().map(|&(x, y)| TriangleMarker::new((x, y), 6, PP.filled())))
        .map_err(err)?
        .label("pp measured")
        .legend(|(x, y)| TriangleMarker::new((x + 10, y), 6, PP.filled()));
    for (i, (c, v)) in d.other_ctx.iter().enumerate() {
        let color = OTHER_CTX[i % OTHER_CTX.len()];
        chart
            .draw_series(LineSeries::new(v.clone(), color.stroke_width(1)).point_size(3))
            .map_err(err)?
            .label(format!("tg at {c} context"))
            .legend(legend_line(color));
    }
    Ok(())
}

/// Device memory on the second axis: measured, the model, the cap.
fn draw_memory(chart: &mut Dual<'_, '_>, d: &Data) -> Result<()> {
    if !d.mem_fit.is_empty() {
        chart
            .draw_secondary_series(DashedLineSeries::new(d.mem_fit.clone(), 6, 4, MEM.stroke_width(2)))
            .map_err(err)?
            .label("device memory model")
            .legend(legend_line(MEM));
    }
    let h = d.m_max * 0.008;
    chart
        .draw_secondary_series(
            d.mem.iter().map(|&(x, y)| Rectangle::new([(x - 0.25, y - h), (x + 0.25, y + h)], MEM.filled())),
        )
        .map_err(err)?
        .label("device memory measured")
        .legend(|(x, y)| Rectangle::new([(x + 5, y - 4), (x + 13, y + 4)], MEM.filled()));
    if d.cap_mib > 0.0 {
        // A cap far above every setting is drawn at the top edge, labelled as off the scale.
        let (cap_y, label) = if d.cap_visible {
            (d.cap_mib, format!("cap {:.0} MiB", d.cap_mib))
        } else {
            (d.m_max * 0.985, format!("cap {:.0} MiB (above this scale)", d.cap_mib))
        };
        chart
            .draw_secondary_series(LineSeries::new(vec![(0.0, cap_y), (d.x_max, cap_y)], CAP.stroke_width(2)))
            .map_err(err)?
            .label(label)
            .legend(legend_line(CAP));
    }
    Ok(())
}

/// The recommendation and the knee as vertical lines.
fn draw_marks(chart: &mut Dual<'_, '_>, d: &Data, p: &Profile) -> Result<()> {
    let rec = p.recommendation.placement.n_gpu_layers;
    let rx = f64::from(rec);
    chart
        .draw_series(LineSeries::new(vec![(rx, 0.0), (rx, d.y_max * 0.92)], REC.stroke_width(2)))
        .map_err(err)?
        .label(format!("recommended ngl {rec}"))
        .legend(legend_line(REC));
    chart
        .draw_series(std::iter::once(Text::new(
            format!("recommended ngl {rec}"),
            (rx + 0.3, d.y_max * 0.95),
            ("sans-serif", 15).into_font().color(&REC),
        )))
        .map_err(err)?;
    if let Some(k) = &p.decision.knee {
        let kx = f64::from(k.ngl);
        chart
            .draw_series(DashedLineSeries::new(vec![(kx, 0.0), (kx, d.y_max * 0.85)], 3, 3, KNEE.stroke_width(2)))
            .map_err(err)?
            .label(format!("knee ngl {}", k.ngl))
            .legend(legend_line(KNEE));
    }
    Ok(())
}

/// Renders the chart of a profile as SVG text.
///
/// # Errors
/// Drawing errors (plotters).
pub fn svg(p: &Profile) -> Result<String> {
    let d = Data::of(p);
    let title = format!(
        "{}: throughput and device memory against ngl at {} context",
        p.model.file_name, p.settings.workload.n_ctx
    );
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (960, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .right_y_label_area_size(76)
            .build_cartesian_2d(0f64..d.x_max, 0f64..d.y_max)
            .map_err(err)?
            .set_secondary_coord(0f64..d.x_max, 0f64..d.m_max);
        chart
            .configure_mesh()
            .x_desc("ngl (layers on the GPU, output layer first)")
            .y_desc("tokens per second")
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        let mem_desc = if p.memory.source == crate::types::Source::Accounted {
            "device memory, MiB (llama.cpp accounted)"
        } else {
            "device memory, MiB (sampled peak)"
        };
        chart.configure_secondary_axes().y_desc(mem_desc).draw().map_err(err)?;
        draw_speeds(&mut chart, &d)?;
        draw_memory(&mut chart, &d)?;
        draw_marks(&mut chart, &d, p)?;
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperMiddle)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(err)?;
        root.draw(&Text::new(
            p.decision.knee_note.clone(),
            (20, 540),
            ("sans-serif", 13).into_font().color(&BLACK.mix(0.7)),
        ))
        .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_measured_at_one_setting_gets_no_model_line_or_legend() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/example-gemma-3-270m-vulkan-llvmpipe.json");
        let mut p = crate::profile::store::read_profile(&path).unwrap();
        assert!(svg(&p).unwrap().contains("pp model"), "three pp points: a line");
        // As adaptive search leaves it: pp measured at ngl 0 only.
        for t in p.trials.iter_mut().filter(|t| t.result.spec.placement.n_gpu_layers > 0) {
            t.result.tests.retain(|x| x.n_gen > 0);
        }
        let out = svg(&p).unwrap();
        assert!(!out.contains("pp model"), "one pp point is no line");
        assert!(out.contains("pp measured") && out.contains("tg model"), "the rest is drawn");
    }
}
