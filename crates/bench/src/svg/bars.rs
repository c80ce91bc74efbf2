//! The comparison chart: for each (job, clients), one bar per target; throughput on a
//! linear scale above, p99 latency on a logarithmic scale below (peers' latencies span
//! three orders of magnitude under contention).

use std::fmt::Write;

use super::{escape, legend_entry, nice_ceiling, COLORS};
use crate::report::count;
use crate::{Summary, Target};

const LEFT: f64 = 70.0;
const TOP: f64 = 40.0;
const PANEL_H: f64 = 200.0;
const GROUP_W: f64 = 130.0;
/// Vertical space between the two panels (group labels and the second title).
const BETWEEN: f64 = 80.0;

/// What the chart draws: the groups along the x axis, the targets within each group.
struct Bars<'a> {
    groups: &'a [(crate::Job, usize)],
    targets: &'a [Target],
    runs: &'a [Summary],
}

impl Bars<'_> {
    /// Writes one panel: axis, grid, and the bars. `y_of` maps a value to a height in
    /// `0..=1`; `ticks` are the (value, label) grid lines.
    fn panel(
        &self,
        svg: &mut String,
        top: f64,
        title: &str,
        value: impl Fn(&Summary) -> f64,
        y_of: impl Fn(f64) -> f64,
        ticks: &[(f64, String)],
    ) {
        let Bars {
            groups,
            targets,
            runs,
        } = *self;
        let width = GROUP_W * groups.len() as f64;
        let _ = writeln!(
            svg,
            "<text x=\"{LEFT}\" y=\"{}\" font-size=\"13\" font-weight=\"bold\">{title}</text>",
            top - 14.0
        );
        for (v, label) in ticks {
            let y = top + PANEL_H * (1.0 - y_of(*v));
            let _ = writeln!(
                svg,
                "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>",
                LEFT + width,
                LEFT - 6.0,
                y + 4.0
            );
        }
        let bar_w = GROUP_W / (targets.len() as f64 + 1.0);
        for (g, &(job, clients)) in groups.iter().enumerate() {
            let x0 = LEFT + GROUP_W * g as f64 + bar_w / 2.0;
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{} x{clients}</text>",
                LEFT + GROUP_W * (g as f64 + 0.5),
                top + PANEL_H + 16.0,
                job.name()
            );
            for (t, &target) in targets.iter().enumerate() {
                let Some(r) = runs
                    .iter()
                    .find(|r| r.target == target && r.job == job && r.clients == clients)
                else {
                    continue;
                };
                let h = PANEL_H * y_of(value(r)).clamp(0.0, 1.0);
                let _ = writeln!(
                    svg,
                    "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\">\
                 <title>{} {} x{clients}: {}</title></rect>",
                    x0 + bar_w * t as f64,
                    top + PANEL_H - h,
                    bar_w * 0.9,
                    COLORS[t % COLORS.len()],
                    target.name(),
                    job.name(),
                    escape(&format!("{:.2}", value(r)))
                );
            }
        }
    }
}

/// The comparison chart of `runs` as an SVG document.
pub fn chart(runs: &[Summary]) -> String {
    let mut targets: Vec<Target> = runs.iter().map(|r| r.target).collect();
    targets.sort();
    targets.dedup();
    let mut groups: Vec<(crate::Job, usize)> = runs.iter().map(|r| (r.job, r.clients)).collect();
    groups.sort();
    groups.dedup();
    let width = LEFT + GROUP_W * groups.len() as f64 + 20.0;
    let height = TOP + 2.0 * PANEL_H + BETWEEN + 50.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let max_ops = nice_ceiling(runs.iter().map(|r| r.ops_per_s).fold(0.0, f64::max));
    let ticks: Vec<(f64, String)> = (0..=5)
        .map(|i| max_ops * i as f64 / 5.0)
        .map(|v| (v, count(v)))
        .collect();
    let bars = Bars {
        groups: &groups,
        targets: &targets,
        runs,
    };
    bars.panel(
        &mut svg,
        TOP,
        "throughput (operations/s; contended: acquisitions/s)",
        |r| r.ops_per_s,
        |v| v / max_ops,
        &ticks,
    );
    // p99 in ms on a log scale from 0.1 ms to the next power of ten above the largest.
    let max_p99 = runs.iter().map(|r| r.p99_us).max().unwrap_or(1) as f64 / 1000.0;
    let decades = max_p99.max(1.0).log10().ceil() + 1.0;
    let log_y = move |ms: f64| ((ms.max(0.1) / 0.1).log10() / decades).clamp(0.0, 1.0);
    let ticks: Vec<(f64, String)> = (0..=decades as i32)
        .map(|d| 0.1 * 10f64.powi(d))
        .map(|v| {
            (
                v,
                if v < 1.0 {
                    format!("{v:.1}")
                } else {
                    format!("{v:.0}")
                },
            )
        })
        .collect();
    bars.panel(
        &mut svg,
        TOP + PANEL_H + BETWEEN,
        "p99 latency (ms, log scale)",
        |r| r.p99_us as f64 / 1000.0,
        log_y,
        &ticks,
    );
    let legend_y = TOP + 2.0 * PANEL_H + BETWEEN + 40.0;
    for (t, target) in targets.iter().enumerate() {
        let x = LEFT + 120.0 * t as f64;
        legend_entry(
            &mut svg,
            t,
            target.name(),
            (x, legend_y),
            (12.0, 12.0, 10.0),
        );
    }
    svg.push_str("</svg>\n");
    svg
}
