//! Hand-written SVG charts, no dependencies, readable in any browser:
//!
//! - for one target's sweep: throughput (left) and p99 latency (right) by client count,
//!   one line per job;
//! - for a comparison of targets (`--merge`): grouped bars per job, in [`bars`].

mod bars;

use std::fmt::Write;

use crate::report::count;
use crate::Summary;

const PANEL_W: f64 = 400.0;
const PANEL_H: f64 = 240.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 40.0;
const GAP: f64 = 110.0;
pub(super) const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
];

/// The chart that suits `runs`: bars when they compare several targets, else lines.
pub fn chart(runs: &[Summary]) -> String {
    let mut targets: Vec<_> = runs.iter().map(|r| r.target).collect();
    targets.sort();
    targets.dedup();
    if targets.len() > 1 {
        bars::chart(runs)
    } else {
        lines(runs)
    }
}

/// The smallest of 1, 2, 2.5, 5 times a power of ten that is at least `v`.
pub(super) fn nice_ceiling(v: f64) -> f64 {
    if v.is_nan() || v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|&c| c >= v * 0.999_999)
        .unwrap_or(10.0 * magnitude)
}

/// A latency axis label: no more digits than it needs.
fn short(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// One legend entry: series `i`'s colour as a `w` x `h` swatch whose top is `above` over
/// the text's baseline `y`, then `label` 6 px to its right.
pub(super) fn legend_entry(
    svg: &mut String,
    i: usize,
    label: &str,
    (x, y): (f64, f64),
    (w, h, above): (f64, f64, f64),
) {
    let _ = writeln!(
        svg,
        "<rect x=\"{x}\" y=\"{}\" width=\"{w}\" height=\"{h}\" fill=\"{}\"/>\
         <text x=\"{}\" y=\"{y}\">{}</text>",
        y - above,
        COLORS[i % COLORS.len()],
        x + w + 6.0,
        escape(label)
    );
}

pub(super) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

struct Panel<'a> {
    title: &'a str,
    x0: f64,
    value: fn(&Summary) -> f64,
    label: fn(f64) -> String,
}

/// Throughput and p99 by client count, one line per (target, job).
fn lines(runs: &[Summary]) -> String {
    let mut xs: Vec<usize> = runs.iter().map(|r| r.clients).collect();
    xs.sort_unstable();
    xs.dedup();
    let mut series: Vec<(String, Vec<&Summary>)> = Vec::new();
    for r in runs {
        let name = format!("{} {}", r.target.name(), r.job.name());
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, points)) => points.push(r),
            None => series.push((name, vec![r])),
        }
    }
    for (_, points) in &mut series {
        points.sort_by_key(|r| r.clients);
    }
    let legend_rows = series.len().div_ceil(3);
    let width = LEFT + 2.0 * PANEL_W + GAP + 30.0;
    let height = TOP + PANEL_H + 60.0 + 20.0 * legend_rows as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let panels = [
        Panel {
            title: "throughput (operations/s)",
            x0: LEFT,
            value: |r| r.ops_per_s,
            label: count,
        },
        Panel {
            title: "p99 latency (ms)",
            x0: LEFT + PANEL_W + GAP,
            value: |r| r.p99_us as f64 / 1000.0,
            label: short,
        },
    ];
    let x_of = |clients: usize| {
        let i = xs.iter().position(|&x| x == clients).unwrap_or(0);
        if xs.len() <= 1 {
            PANEL_W / 2.0
        } else {
            20.0 + (PANEL_W - 40.0) * i as f64 / (xs.len() - 1) as f64
        }
    };
    for panel in &panels {
        let max = nice_ceiling(runs.iter().map(panel.value).fold(0.0, f64::max));
        let y_of = |v: f64| TOP + PANEL_H - PANEL_H * (v / max).clamp(0.0, 1.0);
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">{}</text>",
            panel.x0,
            TOP - 14.0,
            panel.title
        );
        for step in 0..=5 {
            let v = max * step as f64 / 5.0;
            let y = y_of(v);
            let _ = writeln!(
                svg,
                "<line x1=\"{x0}\" x2=\"{x1}\" y1=\"{y}\" y2=\"{y}\" stroke=\"#ddd\"/>\
                 <text x=\"{tx}\" y=\"{ty}\" text-anchor=\"end\">{}</text>",
                (panel.label)(v),
                x0 = panel.x0,
                x1 = panel.x0 + PANEL_W,
                tx = panel.x0 - 6.0,
                ty = y + 4.0,
            );
        }
        for &clients in &xs {
            let _ = writeln!(
                svg,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{clients}</text>",
                panel.x0 + x_of(clients),
                TOP + PANEL_H + 16.0
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">clients</text>",
            panel.x0 + PANEL_W / 2.0,
            TOP + PANEL_H + 32.0
        );
        for (i, (name, points)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let coords: Vec<String> = points
                .iter()
                .map(|r| {
                    let (x, y) = (panel.x0 + x_of(r.clients), y_of((panel.value)(r)));
                    format!("{x:.1},{y:.1}")
                })
                .collect();
            if coords.len() > 1 {
                let _ = writeln!(
                    svg,
                    "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                    coords.join(" ")
                );
            }
            for (r, xy) in points.iter().zip(&coords) {
                let (x, y) = xy.split_once(',').unwrap_or(("0", "0"));
                let _ = writeln!(
                    svg,
                    "<circle cx=\"{x}\" cy=\"{y}\" r=\"3.5\" fill=\"{color}\">\
                     <title>{} x{}: {}</title></circle>",
                    escape(name),
                    r.clients,
                    (panel.label)((panel.value)(r))
                );
            }
        }
    }
    for (i, (name, _)) in series.iter().enumerate() {
        let x = LEFT + (i % 3) as f64 * 260.0;
        let y = TOP + PANEL_H + 56.0 + 20.0 * (i / 3) as f64;
        legend_entry(&mut svg, i, name, (x, y), (14.0, 4.0, 5.0));
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(1800.0), 2000.0);
        assert_eq!(nice_ceiling(2100.0), 2500.0);
        assert_eq!(nice_ceiling(0.3), 0.5);
    }
}
