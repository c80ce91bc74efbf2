//! The HTML report: one self-contained file (inline CSS and SVG, no scripts, no
//! external resources) with the verdict, the counts, the timeline and every violation.

mod svg;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use palisade_checker::{History, Report, Violation};

use crate::nemesis::FaultRecord;
use crate::summary::Summary;

/// Most violations listed in full; the rest are counted.
const MAX_LISTED: usize = 300;

/// Escapes text for HTML and SVG.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Indices of the operations a violation names (every nested `Op`).
fn named_ops(v: &Violation) -> Vec<usize> {
    fn walk(value: &serde_json::Value, out: &mut Vec<usize>) {
        match value {
            serde_json::Value::Object(map) => {
                let is_op = map.contains_key("invoke") && map.contains_key("outcome");
                if let (true, Some(i)) = (is_op, map.get("index").and_then(|i| i.as_u64())) {
                    out.extend(usize::try_from(i).ok());
                }
                map.values().for_each(|v| walk(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(value) = serde_json::to_value(v) {
        walk(&value, &mut out);
    }
    out
}

/// Renders the whole report.
pub fn render(
    summary: &Summary,
    history: &History,
    faults: &[FaultRecord],
    reports: &[(&'static str, Report)],
) -> String {
    let mut flagged: HashMap<usize, String> = HashMap::new();
    let violations: Vec<(&str, &Violation)> = reports
        .iter()
        .flat_map(|(name, r)| r.violations.iter().map(move |v| (*name, v)))
        .collect();
    for (name, v) in &violations {
        for i in named_ops(v) {
            flagged.entry(i).or_insert_with(|| format!("{name}: {v}"));
        }
    }
    let passed = summary.violations == 0;
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>palisade verify: {} on {}</title><style>{CSS}</style></head><body>",
        escape(&summary.run.workload),
        escape(&summary.run.target)
    );
    let _ = write!(
        h,
        "<h1>palisade verify: {} on {} <span class=\"{}\">{}</span></h1><p><code>{}</code></p>",
        escape(&summary.run.workload),
        escape(&summary.run.target),
        if passed { "pass" } else { "fail" },
        if passed {
            "no violations found".to_owned()
        } else {
            format!("{} violation(s)", summary.violations)
        },
        escape(&summary.run.command)
    );
    let _ = write!(
        h,
        "<h2>Topology: {} (target {})</h2><ul>",
        escape(&summary.run.topology),
        escape(&summary.run.target)
    );
    for line in &summary.run.deployment {
        let _ = write!(h, "<li>{}</li>", escape(line));
    }
    h.push_str("</ul>");
    counts(&mut h, summary);
    let _ = write!(
        h,
        "<h2>Timeline</h2><p class=\"legend\">top lane: the nemesis, one labelled bar per fault &middot; bars: leases, one colour per epoch &middot; \
         <b style=\"color:#080\">|</b> accepted mutation &middot; <b style=\"color:#d00\">&times;</b> \
         refused stale &middot; <b style=\"color:#777\">&#9675;</b> unknown outcome &middot; \
         <b style=\"color:#36c\">&bull;</b> read &middot; shading: <span style=\"background:#ccc\">pause</span> \
         <span style=\"background:#fc8\">partition</span> <span style=\"background:#fe9\">delay</span> \
         <span style=\"background:#e8e\">drop</span> <span style=\"background:#f99\">kill</span> \
         <span style=\"background:#c99\">etcd-kill</span> <span style=\"background:#bbe\">etcd-pause</span> \
         <span style=\"background:#9dd\">node-partition</span> <span style=\"background:#cb9\">disk</span> &middot; \
         <b style=\"color:#d00\">&#9711;</b> named by a violation. Hover for details.</p><div class=\"scroll\">{}</div>",
        svg::timeline(history, faults, summary.run.workers, &flagged)
    );
    h.push_str("<h2>Violations</h2>");
    if violations.is_empty() {
        h.push_str("<p>None observed in this history. That proves only that this run, with these faults and timings, showed none (S16).</p>");
    } else {
        h.push_str("<ol>");
        for (name, v) in violations.iter().take(MAX_LISTED) {
            let _ = write!(h, "<li><b>{name}</b>: {}</li>", escape(&v.to_string()));
        }
        h.push_str("</ol>");
        if violations.len() > MAX_LISTED {
            let _ = write!(h, "<p>... and {} more.</p>", violations.len() - MAX_LISTED);
        }
    }
    h.push_str("<h2>Nemesis timeline</h2><table><tr><th>start (s)</th><th>end (s)</th><th>kind</th><th>target</th><th>detail</th></tr>");
    for f in faults {
        let _ = write!(
            h,
            "<tr><td>{:.2}</td><td>{:.2}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            f.start as f64 / 1e6,
            f.end as f64 / 1e6,
            f.kind,
            f.worker.map_or("deployment".into(), |w| format!("w{w}")),
            escape(&f.detail)
        );
    }
    h.push_str("</table></body></html>\n");
    h
}

/// A table of `counts`: a name (`what`) and its number (`counted`) a row.
fn count_table(h: &mut String, what: &str, counted: &str, counts: &BTreeMap<String, usize>) {
    let _ = write!(h, "<table><tr><th>{what}</th><th>{counted}</th></tr>");
    for (name, n) in counts {
        let _ = write!(h, "<tr><td>{}</td><td>{n}</td></tr>", escape(name));
    }
    h.push_str("</table>");
}

fn counts(h: &mut String, summary: &Summary) {
    let o = &summary.ops;
    let _ = write!(
        h,
        "<h2>Run</h2><p>{} workers, lease TTL {} ms, {} s, seed {}. {} operations: {} ok, {} fail, {} info.</p>",
        summary.run.workers, summary.run.ttl_ms, summary.run.time_secs, summary.run.seed, o.total(), o.ok, o.fail, o.info
    );
    h.push_str("<table><tr><th>operation</th><th>ok</th><th>fail</th><th>info</th></tr>");
    for (kind, c) in &summary.ops_by_kind {
        let _ = write!(
            h,
            "<tr><td>{kind}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            c.ok, c.fail, c.info
        );
    }
    h.push_str("</table>");
    count_table(h, "refusal", "count", &summary.fail_codes);
    count_table(h, "unknown outcome", "count", &summary.unknown_codes);
    count_table(h, "fault", "injected", &summary.faults);
    h.push_str(
        "<h2>Checkers</h2><table><tr><th>checker</th><th>verdict</th><th>violations</th></tr>",
    );
    for (name, v) in &summary.checkers {
        let _ = write!(
            h,
            "<tr><td>{name}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            v.valid, v.valid, v.violations
        );
    }
    h.push_str("</table>");
    for note in &summary.run.notes {
        let _ = write!(h, "<p class=\"note\">note: {}</p>", escape(note));
    }
}

const CSS: &str = "body{font-family:sans-serif;margin:1.5em;color:#222}\
h1 span{font-size:.6em;padding:.2em .5em;border-radius:4px;vertical-align:middle}\
.pass,.valid{background:#cfc}.fail,.invalid{background:#fcc}.unknown{background:#ffc}\
table{border-collapse:collapse;margin:.5em 1em .5em 0;display:inline-table;vertical-align:top}\
td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}\
.scroll{overflow-x:auto;border:1px solid #ddd}.legend{font-size:.9em}.note{color:#a60}\
li{font-family:monospace;font-size:.85em;margin:.2em 0}";
