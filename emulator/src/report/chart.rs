//! The steer-rate bar chart (SVG, plotters): one group of bars per scenario, one bar per
//! sysctl value, labelled with its rate; and a scenario's steer calls second by second.

use super::results::{by_scenario, Row};
use anyhow::anyhow;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const X: i32 = 1000;

/// The series legend every chart here draws: boxed, half-transparent, at `pos`.
fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    pos: SeriesLabelPosition,
    font: u32,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", font))
        .draw()
}

/// Colour of the n-th sysctl value (0: baseline, 1: LLC affinity on, then others).
const BAR_COLOURS: [RGBColor; 5] = [
    RGBColor(214, 96, 77),
    RGBColor(67, 147, 195),
    RGBColor(120, 120, 120),
    RGBColor(77, 172, 38),
    RGBColor(153, 112, 171),
];

/// Colours of the runs of a per-second chart whose runs share their sysctl value.
const RUN_COLOURS: [RGBColor; 8] = [
    RGBColor(214, 96, 77),
    RGBColor(67, 147, 195),
    RGBColor(77, 172, 38),
    RGBColor(153, 112, 171),
    RGBColor(230, 171, 2),
    RGBColor(27, 158, 119),
    RGBColor(120, 120, 120),
    RGBColor(102, 61, 20),
];

/// Distinct sysctl values: numeric ones in numeric order, then the rest (`-`).
fn sysctl_values(rows: &[Row]) -> Vec<&str> {
    let mut v: Vec<&str> = Vec::new();
    for r in rows {
        if !v.contains(&r.sysctl.as_str()) {
            v.push(&r.sysctl);
        }
    }
    v.sort_by(|a, b| match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => x.total_cmp(&y),
        (Ok(_), Err(_)) => std::cmp::Ordering::Less,
        (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
        (Err(_), Err(_)) => a.cmp(b),
    });
    v
}

fn legend_label(sysctl: &str) -> String {
    if sysctl == "-" {
        "arfs_llc_affinity unset".into()
    } else {
        format!("arfs_llc_affinity={sysctl}")
    }
}

fn rate_label(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Grouped bar chart of Steer-C/s: one group per scenario, one bar per run, coloured by
/// the run's `net.core.arfs_llc_affinity` (legend), the value written on each bar.
/// Runs without a steer rate get no bar.
pub fn svg_chart(rows: &[Row], title: &str) -> anyhow::Result<String> {
    let groups = by_scenario(rows);
    let sysctls = sysctl_values(rows);
    let colour = |s: &str| BAR_COLOURS[sysctls.iter().position(|v| *v == s).unwrap_or(0) % BAR_COLOURS.len()];
    // (sysctl, x0, x1, value) of each bar; group i spans [i*X, (i+1)*X] on the x axis
    // (integers: plotters has no default formatting for f64 axes with own key points).
    let mut bars: Vec<(&str, i32, i32, f64)> = Vec::new();
    for (i, (_, g)) in groups.iter().enumerate() {
        let mut runs: Vec<(&str, f64)> = g.iter().filter_map(|r| Some((r.sysctl.as_str(), r.steer_c_per_s?))).collect();
        runs.sort_by_key(|(s, _)| sysctls.iter().position(|v| v == s));
        let k_all = runs.len().max(1) as i32;
        let w = (X * 7 / 10) / k_all;
        let left = i as i32 * X + (X - w * k_all) / 2;
        for (k, (s, v)) in runs.into_iter().enumerate() {
            let x0 = left + k as i32 * w;
            bars.push((s, x0 + X / 100, x0 + w - X / 100, v.max(0.0)));
        }
    }
    let y_max = bars.iter().map(|b| b.3).fold(0.0, f64::max);
    // Head room for the value labels and the legend.
    let y_top = if y_max > 0.0 { y_max * 1.3 } else { 1.0 };
    let n = groups.len().max(1);
    let names: Vec<String> = groups.iter().map(|(s, _)| s.to_string()).collect();
    let width = (160 * n as u32 + 260).max(640);

    let mut svg = String::new();
    {
        let err = |e: &dyn std::fmt::Display| anyhow!("drawing the steer-rate chart: {e}");
        let root = SVGBackend::with_string(&mut svg, (width, 440)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let centres: Vec<i32> = (0..groups.len()).map(|i| i as i32 * X + X / 2).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((0..n as i32 * X).with_key_points(centres), 0f64..y_top)
            .map_err(|e| err(&e))?;
        let x_fmt = |x: &i32| usize::try_from(x / X).ok().and_then(|i| names.get(i).cloned()).unwrap_or_default();
        let y_fmt = |y: &f64| if y_top < 10.0 { format!("{y:.1}") } else { format!("{y:.0}") };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .max_light_lines(1)
            .x_desc("scenario")
            .y_desc("Steer-C/s (ndo_rx_flow_steer calls/s)")
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(|e| err(&e))?;
        for s in &sysctls {
            let c = colour(s);
            let mine: Vec<_> = bars.iter().filter(|b| b.0 == *s).collect();
            chart
                .draw_series(mine.iter().map(|b| Rectangle::new([(b.1, 0.0), (b.2, b.3)], c.filled())))
                .map_err(|e| err(&e))?
                .label(legend_label(s))
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
            let text = TextStyle::from(("sans-serif", 15).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
            chart
                .draw_series(mine.iter().map(|b| Text::new(rate_label(b.3), ((b.1 + b.2) / 2, b.3), text.clone())))
                .map_err(|e| err(&e))?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight, 15).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// Steer calls second by second (`guest.per_second`, the `funccount -i 1` view) of one
/// scenario's runs: one line per run, coloured by its `net.core.arfs_llc_affinity` as in
/// [`svg_chart`], a dashed line where the rates' window starts (after the warm-up).
/// `None` when no run of the report has a time series.
pub fn per_second_chart(report: &super::schema::Report) -> anyhow::Result<Option<String>> {
    let rows = super::results::rows(report);
    let sysctls = sysctl_values(&rows);
    // (run label, sysctl value, (second, steer calls) points) per run with a series.
    type Series<'a> = (&'a str, &'a str, Vec<(f64, f64)>);
    let series: Vec<Series> = report
        .runs
        .iter()
        .zip(&rows)
        .filter_map(|(run, row)| {
            let d = run.driver()?;
            let pts: Vec<(f64, f64)> = d.per_second.iter().map(|p| (p.t_s as f64, p.steer_calls as f64)).collect();
            (!pts.is_empty()).then_some((run.label.as_str(), row.sysctl.as_str(), pts))
        })
        .collect();
    if series.is_empty() {
        return Ok(None);
    }
    // By the sysctl as in the bar chart when it tells the runs apart, else one colour per run.
    let by_sysctl = sysctls.len() > 1;
    let colour = |i: usize, s: &str| match by_sysctl {
        true => BAR_COLOURS[sysctls.iter().position(|v| *v == s).unwrap_or(0) % BAR_COLOURS.len()],
        false => RUN_COLOURS[i % RUN_COLOURS.len()],
    };
    let x_max = series.iter().flat_map(|s| s.2.iter().map(|p| p.0)).fold(1.0, f64::max);
    let y_max = series.iter().flat_map(|s| s.2.iter().map(|p| p.1)).fold(0.0, f64::max);
    let y_top = if y_max > 0.0 { y_max * 1.35 } else { 1.0 };
    let warmup = report.runs.iter().find_map(|r| r.driver()?.rates_from_s);
    let mut svg = String::new();
    {
        let err = |e: &dyn std::fmt::Display| anyhow!("drawing the per-second chart: {e}");
        let root = SVGBackend::with_string(&mut svg, (760, 400)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{}: steer calls per second", report.scenario), ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..x_max, 0f64..y_top)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .x_desc("seconds of traffic")
            .y_desc("ndo_rx_flow_steer calls in the second")
            .x_labels((x_max as usize + 1).min(13))
            // Whole seconds only: a short run's axis would repeat rounded half seconds.
            .x_label_formatter(&|x: &f64| match (x - x.round()).abs() < 1e-6 {
                true => format!("{x:.0}"),
                false => String::new(),
            })
            .y_label_formatter(&|y: &f64| if y_top < 10.0 { format!("{y:.1}") } else { format!("{y:.0}") })
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| err(&e))?;
        if let Some(w) = warmup.filter(|w| *w > 0.0 && *w < x_max) {
            let grey = RGBColor(120, 120, 120);
            // Dashes by hand: one short segment per 2 % of the height.
            let step = y_top / 50.0;
            let dashes = (0..25).map(|i| {
                let y0 = 2.0 * i as f64 * step;
                PathElement::new(vec![(w, y0), (w, y0 + step)], grey.stroke_width(1))
            });
            chart.draw_series(dashes).map_err(|e| err(&e))?;
            let text = TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Left, VPos::Top));
            chart
                .draw_series(std::iter::once(Text::new(format!(" rates from {w:.1} s"), (w, y_top * 0.98), text)))
                .map_err(|e| err(&e))?;
        }
        for (i, (label, sysctl, pts)) in series.iter().enumerate() {
            let c = colour(i, sysctl);
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(3)))
                .map_err(|e| err(&e))?
                .label(format!("{label} ({})", legend_label(sysctl)))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, c.filled()))).map_err(|e| err(&e))?;
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight, 14).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(Some(svg))
}

const LINE_COLOURS: [RGBColor; 4] =
    [RGBColor(214, 96, 77), RGBColor(67, 147, 195), RGBColor(77, 172, 38), RGBColor(153, 112, 171)];

/// Lines over a log2 x axis (table sizes, CPU counts), one per named series of (x, y)
/// points; x values of 0 are drawn at 1.
pub fn log2_lines(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(u64, f64)>)],
) -> anyhow::Result<String> {
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing {title}: {e}");
    let lg = |x: u64| x.max(1).ilog2() as i32;
    let mut xs: Vec<i32> = series.iter().flat_map(|(_, p)| p.iter().map(|&(x, _)| lg(x))).collect();
    xs.sort_unstable();
    xs.dedup();
    let (x0, x1) = (xs.first().copied().unwrap_or(0), xs.last().copied().unwrap_or(1).max(1));
    let y_max = series.iter().flat_map(|(_, p)| p.iter().map(|&(_, y)| y)).fold(0.0, f64::max).max(1e-9) * 1.15;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (760, 440)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(80)
            .build_cartesian_2d((x0 - 1..x1 + 1).with_key_points(xs.clone()), 0f64..y_max)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&|x: &i32| {
                if *x >= 0 {
                    (1u64 << x.unsigned_abs().min(40)).to_string()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|y: &f64| if y_max < 10.0 { format!("{y:.2}") } else { format!("{y:.0}") })
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| err(&e))?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let c = LINE_COLOURS[i % LINE_COLOURS.len()];
            let pts: Vec<(i32, f64)> = pts.iter().map(|&(x, y)| (lg(x), y)).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(3)))
                .map_err(|e| err(&e))?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
            chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled()))).map_err(|e| err(&e))?;
        }
        // The legend goes where the lines are low: the left for rising curves.
        let last: f64 = series.iter().filter_map(|(_, p)| p.last()).map(|&(_, y)| y).sum();
        let first: f64 = series.iter().filter_map(|(_, p)| p.first()).map(|&(_, y)| y).sum();
        let rising = last > first;
        let pos = if rising { SeriesLabelPosition::UpperLeft } else { SeriesLabelPosition::UpperRight };
        legend(&mut chart, pos, 15).map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(out)
}
