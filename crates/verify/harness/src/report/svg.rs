//! The SVG timeline: the nemesis's lane on top, then one lane per worker, time left to
//! right.
//!
//! - the nemesis lane: every fault as a labelled bar in its colour (kind and target), so
//!   the schedule reads at a glance;
//! - leases: a bar from grant to release, coloured by epoch (each epoch its own hue);
//! - faults: pauses shaded grey, partitions orange, delays yellow on the victim's lane, a
//!   dropped connection as a magenta line; a fault of the deployment (a server or etcd
//!   member killed or paused, a node cut off from etcd, a damaged disk) as a band across
//!   all lanes;
//! - operations: accepted mutations as green ticks, stale refusals as red crosses, unknown
//!   outcomes as grey rings, reads as small blue dots (left out of very long runs);
//! - violations: a red circle around every operation a violation names.
//!
//! Every mark has a `<title>`, so hovering shows what it is.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

use palisade_checker::{History, Op, OpKind, Outcome};

use super::escape;
use crate::args::FaultKind;
use crate::nemesis::FaultRecord;

const LEFT: f64 = 70.0;
const TOP: f64 = 30.0;
const LANE: f64 = 34.0;
/// Past this many operations, reads are not drawn (the file would be too large).
const MAX_DRAWN_READS: usize = 20_000;

struct Scale {
    end_us: f64,
    width: f64,
}

impl Scale {
    fn x(&self, t: u64) -> f64 {
        LEFT + (t as f64 / self.end_us) * self.width
    }
}

/// Top of worker `process`'s lane (lane 0, above the workers, is the nemesis's).
fn lane_y(process: u64) -> f64 {
    TOP + (process as f64) * LANE
}

/// The colour of a fault kind, in the nemesis lane and the shading.
pub(crate) fn fault_colour(kind: FaultKind) -> &'static str {
    match kind {
        FaultKind::Pause => "#999",
        FaultKind::Partition => "#f90",
        FaultKind::Delay => "#fd3",
        FaultKind::Drop => "#c0c",
        FaultKind::Kill => "#e22",
        FaultKind::EtcdKill => "#900",
        FaultKind::EtcdPause => "#66c",
        FaultKind::NodePartition => "#2aa",
        FaultKind::Disk => "#850",
        FaultKind::DbKill => "#a0f",
        FaultKind::DbPause => "#48f",
        FaultKind::DbDrop => "#c6c",
        FaultKind::DbDelay => "#cb3",
        FaultKind::DbFailover => "#606",
        FaultKind::DbPowerLoss => "#c06",
    }
}

fn epoch_colour(epoch: u64) -> String {
    // Consecutive epochs get distant hues; `% 360` first keeps any epoch from overflowing.
    format!("hsl({},65%,55%)", (epoch % 360) * 47 % 360)
}

/// Draws the timeline of `history` for `workers` lanes; `flagged` ops get a red circle,
/// with the violation text of `notes[index]` as their title.
pub fn timeline(
    history: &History,
    faults: &[FaultRecord],
    workers: u32,
    flagged: &HashMap<usize, String>,
) -> String {
    let last = faults
        .iter()
        .map(|f| f.end)
        .chain([history.last_time(), 1])
        .max()
        .unwrap_or(1);
    let secs = last as f64 / 1e6;
    let scale = Scale {
        end_us: last as f64,
        width: (secs * 60.0).clamp(900.0, 60_000.0),
    };
    let height = TOP + f64::from(workers + 1) * LANE + 20.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{:.0}" height="{height:.0}" font-family="sans-serif" font-size="11">"#,
        LEFT + scale.width + 20.0
    );
    axis(&mut s, &scale, secs, height);
    let _ = write!(
        s,
        r#"<text x="8" y="{:.1}" font-weight="bold">nemesis</text>"#,
        TOP + LANE / 2.0 + 4.0
    );
    for w in 1..=u64::from(workers) {
        let y = lane_y(w);
        let _ = write!(
            s,
            r##"<text x="8" y="{:.1}">w{w}</text><line x1="{LEFT}" x2="{:.0}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            y + LANE / 2.0 + 4.0,
            LEFT + scale.width,
            y + LANE / 2.0,
            y + LANE / 2.0
        );
    }
    for f in faults {
        fault(&mut s, &scale, f, height);
        nemesis_bar(&mut s, &scale, f);
    }
    leases(&mut s, &scale, history);
    let draw_reads = history.ops().len() <= MAX_DRAWN_READS;
    for op in history.ops() {
        mark(&mut s, &scale, op, draw_reads);
    }
    for op in history.ops() {
        if let Some(text) = flagged.get(&op.index) {
            let t = op.end().unwrap_or(op.invoke);
            let _ = write!(
                s,
                r##"<circle cx="{:.1}" cy="{:.1}" r="8" fill="none" stroke="#d00" stroke-width="2.5"><title>{}</title></circle>"##,
                scale.x(t),
                lane_y(op.process) + LANE / 2.0,
                escape(text)
            );
        }
    }
    s.push_str("</svg>");
    s
}

fn axis(s: &mut String, scale: &Scale, secs: f64, height: f64) {
    let step = if secs <= 60.0 {
        1.0
    } else if secs <= 600.0 {
        10.0
    } else {
        60.0
    };
    let mut t = 0.0;
    while t <= secs {
        let x = scale.x((t * 1e6) as u64);
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{:.0}" y2="{height:.0}" stroke="#f0f0f0"/><text x="{x:.1}" y="14" text-anchor="middle" fill="#666">{t}s</text>"##,
            TOP - 8.0
        );
        t += step;
    }
}

fn fault(s: &mut String, scale: &Scale, f: &FaultRecord, height: f64) {
    let (x0, x1) = (scale.x(f.start), scale.x(f.end).max(scale.x(f.start) + 1.5));
    let title = format!(
        "{} {}: {}",
        f.kind,
        f.worker.map_or("deployment".into(), |w| format!("w{w}")),
        f.detail
    );
    let (top, h) = match f.worker {
        Some(w) => (lane_y(w), LANE),
        None => (lane_y(1), height - lane_y(1) - 14.0),
    };
    let colour = fault_colour(f.kind);
    let _ = write!(
        s,
        r#"<rect x="{x0:.1}" y="{top:.1}" width="{:.1}" height="{h:.1}" fill="{colour}" fill-opacity="0.3"><title>{}</title></rect>"#,
        x1 - x0,
        escape(&title)
    );
}

/// The fault's bar in the nemesis lane, labelled with its kind and target.
fn nemesis_bar(s: &mut String, scale: &Scale, f: &FaultRecord) {
    let (x0, x1) = (scale.x(f.start), scale.x(f.end).max(scale.x(f.start) + 3.0));
    let y = TOP + 4.0;
    let target = f.worker.map_or(String::new(), |w| format!(" w{w}"));
    let _ = write!(
        s,
        r##"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="12" rx="2" fill="{}"><title>{}</title></rect><text x="{x0:.1}" y="{:.1}" font-size="9" fill="#333">{}{}</text>"##,
        x1 - x0,
        fault_colour(f.kind),
        escape(&format!(
            "{:.2}-{:.2} s {}{target}: {}",
            f.start as f64 / 1e6,
            f.end as f64 / 1e6,
            f.kind,
            f.detail
        )),
        y + 22.0,
        f.kind,
        target
    );
}

/// Lease bars: from each granted acquire to its release (or the worker's last operation
/// under that epoch).
fn leases(s: &mut String, scale: &Scale, history: &History) {
    let mut last_use: HashMap<(u64, &str, u64), u64> = HashMap::new();
    for op in history.ops() {
        if let (Some(lock), Some(epoch)) = (op.lock.as_deref(), op.epoch) {
            let t = op.complete.unwrap_or(op.invoke);
            let e = last_use.entry((op.process, lock, epoch)).or_insert(t);
            *e = (*e).max(t);
        }
    }
    let mut seen = BTreeSet::new();
    for op in history.ops() {
        let (OpKind::Acquire, Outcome::Ok) = (op.kind, op.outcome) else {
            continue;
        };
        let (Some(lock), Some(epoch), Some(start)) = (op.lock.as_deref(), op.epoch, op.complete)
        else {
            continue;
        };
        if !seen.insert((op.process, lock, epoch)) {
            continue;
        }
        let end = last_use
            .get(&(op.process, lock, epoch))
            .copied()
            .unwrap_or(start);
        let (x0, x1) = (scale.x(start), scale.x(end).max(scale.x(start) + 2.0));
        let _ = write!(
            s,
            r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="10" rx="2" fill="{}"><title>{} epoch {epoch} (w{})</title></rect>"#,
            lane_y(op.process) + LANE / 2.0 - 5.0,
            x1 - x0,
            epoch_colour(epoch),
            escape(lock),
            op.process
        );
    }
}

fn mark(s: &mut String, scale: &Scale, op: &Op, draw_reads: bool) {
    let y = lane_y(op.process) + LANE / 2.0;
    let t = op.end().unwrap_or(op.invoke);
    let x = scale.x(t);
    let title = escape(&op.to_string());
    let mutation = op.kind.is_mutation() && op.kind != OpKind::Fence;
    match op.outcome {
        _ if op.is_stale_rejection() => {
            let _ = write!(
                s,
                r##"<path d="M{:.1} {:.1}l8 8m0 -8l-8 8" stroke="#d00" stroke-width="2"><title>{title}</title></path>"##,
                x - 4.0,
                y - 13.0
            );
        }
        Outcome::Ok if mutation => {
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="#080" stroke-width="2"><title>{title}</title></line>"##,
                y - 12.0,
                y - 5.0
            );
        }
        Outcome::Info if op.kind.is_mutation() => {
            let _ = write!(
                s,
                r##"<circle cx="{x:.1}" cy="{:.1}" r="3.5" fill="none" stroke="#777"><title>{title}</title></circle>"##,
                y + 10.0
            );
        }
        Outcome::Ok if draw_reads && matches!(op.kind, OpKind::Read | OpKind::ReadSet) => {
            let _ = write!(
                s,
                r##"<circle cx="{x:.1}" cy="{:.1}" r="2" fill="#36c"><title>{title}</title></circle>"##,
                y + 9.0
            );
        }
        _ => {}
    }
}
