//! The steer-rate bar chart (SVG, plotters): one group of bars per scenario, one bar per
//! sysctl value, labelled with its rate.

use super::results::{by_scenario, Row};
use anyhow::anyhow;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const X: i32 = 1000;

/// Colour of the n-th sysctl value (0: baseline, 1: LLC affinity on, then others).
const BAR_COLOURS: [RGBColor; 5] = [
    RGBColor(214, 96, 77),
    RGBColor(67, 147, 195),
    RGBColor(120, 120, 120),
    RGBColor(77, 172, 38),
    RGBColor(153, 112, 171),
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
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}
