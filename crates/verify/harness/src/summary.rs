//! The run's summary: operations by outcome, faults by kind, checker verdicts. Printed for
//! a human and written as `summary.json` for scripts and tests.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use palisade_checker::{History, OpKind, Outcome, Report, Validity, Violation};
use serde::Serialize;

use crate::nemesis::FaultRecord;

/// Counts by outcome.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Outcomes {
    pub ok: usize,
    pub fail: usize,
    pub info: usize,
}

impl Outcomes {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::Fail => self.fail += 1,
            Outcome::Info => self.info += 1,
        }
    }

    pub fn total(&self) -> usize {
        self.ok + self.fail + self.info
    }
}

/// One checker's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub valid: Validity,
    pub violations: usize,
    pub summary: String,
}

/// Everything `summary.json` holds: the run's facts, then what the history and the
/// checkers made of it.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    #[serde(flatten)]
    pub run: RunFacts,
    pub ops: Outcomes,
    pub ops_by_kind: BTreeMap<String, Outcomes>,
    /// Refusal codes of `fail` operations (e.g. `stale_token`, `lock_held`).
    pub fail_codes: BTreeMap<String, usize>,
    /// Why `info` operations have no known outcome (`transport`, `storage_failed`, ...).
    pub unknown_codes: BTreeMap<String, usize>,
    pub faults: BTreeMap<String, usize>,
    pub checkers: BTreeMap<String, Verdict>,
    /// Violations over all checkers.
    pub violations: usize,
    /// Of which lost updates (lock-set).
    pub lost_updates: usize,
}

/// What went into the summary besides the history.
#[derive(Debug, Clone, Serialize)]
pub struct RunFacts {
    pub command: String,
    pub workload: String,
    /// `embedded` or `etcd3`.
    pub topology: String,
    /// The deployment's name (`embedded`, `etcd3`, `unfenced-control`, `etcd-lock`, ...).
    pub target: String,
    /// One line per process of the deployment, and how the workers reach it.
    pub deployment: Vec<String>,
    pub seed: u64,
    pub time_secs: u64,
    pub workers: u32,
    pub ttl_ms: u64,
    /// Things the reader should know (workers killed at the end, unreadable lines, ...).
    pub notes: Vec<String>,
}

impl Summary {
    pub fn new(
        facts: RunFacts,
        history: &History,
        faults: &[FaultRecord],
        reports: &[(&'static str, Report)],
    ) -> Summary {
        let mut ops = Outcomes::default();
        let mut ops_by_kind: BTreeMap<String, Outcomes> = BTreeMap::new();
        let mut fail_codes: BTreeMap<String, usize> = BTreeMap::new();
        let mut unknown_codes: BTreeMap<String, usize> = BTreeMap::new();
        for op in history.ops().iter().filter(|op| op.kind != OpKind::Restart) {
            ops.add(op.outcome);
            ops_by_kind
                .entry(op.kind.as_str().to_owned())
                .or_default()
                .add(op.outcome);
            let code = || op.error.clone().unwrap_or_else(|| "?".into());
            match op.outcome {
                Outcome::Fail => *fail_codes.entry(code()).or_default() += 1,
                Outcome::Info => *unknown_codes.entry(code()).or_default() += 1,
                Outcome::Ok => {}
            }
        }
        let mut fault_counts: BTreeMap<String, usize> = BTreeMap::new();
        for f in faults {
            *fault_counts.entry(f.kind.as_str().to_owned()).or_default() += 1;
        }
        let checkers: BTreeMap<String, Verdict> = reports
            .iter()
            .map(|(name, r)| {
                let verdict = Verdict {
                    valid: r.valid,
                    violations: r.violations.len(),
                    summary: r.summary(),
                };
                ((*name).to_owned(), verdict)
            })
            .collect();
        let all = reports.iter().flat_map(|(_, r)| &r.violations);
        let lost_updates = all
            .clone()
            .filter(|v| matches!(v, Violation::LostUpdate { .. }))
            .count();
        Summary {
            run: facts,
            ops,
            ops_by_kind,
            fail_codes,
            unknown_codes,
            faults: fault_counts,
            checkers,
            violations: all.count(),
            lost_updates,
        }
    }

    /// The text printed at the end of a run.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let o = &self.ops;
        let _ = writeln!(
            out,
            "\n{} on {} ({}): {} operations ({} ok, {} fail, {} info)",
            self.run.workload,
            self.run.topology,
            self.run.target,
            o.total(),
            o.ok,
            o.fail,
            o.info
        );
        for (kind, c) in &self.ops_by_kind {
            let _ = writeln!(
                out,
                "  {kind:<9} {:>6} ok {:>6} fail {:>6} info",
                c.ok, c.fail, c.info
            );
        }
        if !self.fail_codes.is_empty() {
            let _ = writeln!(out, "  refusals: {}", counts(&self.fail_codes));
        }
        if !self.unknown_codes.is_empty() {
            let _ = writeln!(out, "  unknown outcomes: {}", counts(&self.unknown_codes));
        }
        let faults = if self.faults.is_empty() {
            "none".to_owned()
        } else {
            counts(&self.faults)
        };
        let _ = writeln!(out, "faults injected: {faults}");
        let _ = writeln!(out, "checkers:");
        for (name, v) in &self.checkers {
            let text = clip_violations(&v.summary, 10).replace('\n', "\n    ");
            let _ = writeln!(out, "  {name}: {text}");
        }
        for note in &self.run.notes {
            let _ = writeln!(out, "note: {note}");
        }
        let _ = writeln!(
            out,
            "violations: {} ({} lost updates)",
            self.violations, self.lost_updates
        );
        let _ = writeln!(
            out,
            "seed {}: rerun with `{}`",
            self.run.seed, self.run.command
        );
        out
    }
}

/// `name n, name n, ...`
fn counts(map: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = map.iter().map(|(name, n)| format!("{name} {n}")).collect();
    parts.join(", ")
}

/// At most `max` lines of a checker's summary, for the terminal (the report has all).
fn clip_violations(text: &str, max: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= max {
        return text.to_owned();
    }
    let mut out = lines[..max].join("\n");
    let _ = write!(out, "\n    ... {} more (see the report)", lines.len() - max);
    out
}
