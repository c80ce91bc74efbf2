//! What a checker returns: a verdict, the violations found, and counts.

use std::fmt;

use serde::Serialize;

use crate::history::{Op, Outcome};
use crate::violation::Violation;

/// A checker's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Validity {
    /// No violation was found in this history (which proves nothing beyond it, S16).
    Valid,
    /// At least one violation was found.
    Invalid,
    /// The checker could not decide (time budget spent, final state not recorded).
    Unknown,
}

impl fmt::Display for Validity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Validity::Valid => "valid",
            Validity::Invalid => "invalid",
            Validity::Unknown => "unknown",
        })
    }
}

/// Counts of what a checker looked at.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Operations the checker examined, by outcome.
    pub ok: usize,
    pub fail: usize,
    pub info: usize,
    /// Operations that concerned this checker but lacked data it needs (e.g. a write
    /// without a key); they were left out, which can only hide violations.
    pub skipped: usize,
    /// Search states explored (linearizability only).
    pub explored: u64,
    /// Free-form remarks: why a verdict is unknown, what was left out.
    pub notes: Vec<String>,
}

impl Stats {
    pub(crate) fn count(&mut self, op: &Op) {
        match op.outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::Fail => self.fail += 1,
            Outcome::Info => self.info += 1,
        }
    }
}

/// A checker's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub valid: Validity,
    pub violations: Vec<Violation>,
    pub stats: Stats,
}

impl Report {
    /// Invalid if there is any violation, else unknown if `undecided`, else valid.
    pub(crate) fn new(violations: Vec<Violation>, stats: Stats, undecided: bool) -> Report {
        let valid = if !violations.is_empty() {
            Validity::Invalid
        } else if undecided {
            Validity::Unknown
        } else {
            Validity::Valid
        };
        Report {
            valid,
            violations,
            stats,
        }
    }

    /// A few lines for a human: the verdict, counts by outcome, notes, every violation.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        let mut out = format!(
            "{}: {} ops examined ({} ok, {} fail, {} info), {} skipped, {} violation(s)",
            self.valid,
            s.ok + s.fail + s.info,
            s.ok,
            s.fail,
            s.info,
            s.skipped,
            self.violations.len()
        );
        if s.explored > 0 {
            out.push_str(&format!(", {} states explored", s.explored));
        }
        for note in &s.notes {
            out.push_str(&format!("\n  note: {note}"));
        }
        for v in &self.violations {
            out.push_str(&format!("\n  - {v}"));
        }
        out
    }
}

impl fmt::Display for Op {
    /// `#12 p3 write ns/k="v" e4 [100..250] ok rev7`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} p{} {}",
            self.index,
            self.process,
            self.kind.as_str()
        )?;
        match (&self.lock, &self.key) {
            (Some(l), Some(k)) => write!(f, " {l}/{k}")?,
            (Some(l), None) => write!(f, " {l}")?,
            (None, Some(k)) => write!(f, " ?/{k}")?,
            (None, None) => {}
        }
        if let Some(v) = &self.value {
            write!(f, "={v:?}")?;
        }
        if let Some(e) = self.epoch {
            write!(f, " e{e}")?;
        }
        match self.complete {
            Some(c) => write!(f, " [{}..{}]", self.invoke, c)?,
            None => write!(f, " [{}..]", self.invoke)?,
        }
        match self.outcome {
            Outcome::Ok => f.write_str(" ok")?,
            Outcome::Fail => f.write_str(" fail")?,
            Outcome::Info => f.write_str(" info")?,
        }
        if let Some(code) = &self.error {
            write!(f, ":{code}")?;
        }
        if let Some(r) = self.revision {
            write!(f, " rev{r}")?;
        }
        Ok(())
    }
}
