//! The demo's event lines and the timeline they are assembled into.
//!
//! Workers print one JSON [`Event`] per line on stdout; the parent reads them, adds its
//! own steps (starting the server, freezing and thawing A) and prints one table. All
//! times are wall-clock Unix milliseconds, because the workers are separate processes and
//! the wall clock is the one clock they share; the table shows them relative to the
//! start of the demo.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// One step of one worker, as printed on its stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// Wall-clock time of the step, Unix milliseconds.
    pub t_ms: u64,
    pub worker: String,
    /// The worker's epoch, once it has one.
    pub epoch: Option<u64>,
    pub step: String,
    /// `ok`, or the stable error code (e.g. `stale_token`).
    pub outcome: String,
    /// The high-water mark reported with a `stale_token` rejection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_water: Option<u64>,
    /// Human detail: the value written, the revision, the lease id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Event {
    pub fn new(worker: &str, epoch: Option<u64>, step: &str, outcome: &str) -> Event {
        Event {
            t_ms: now_ms(),
            worker: worker.to_owned(),
            epoch,
            step: step.to_owned(),
            outcome: outcome.to_owned(),
            high_water: None,
            detail: None,
        }
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Event {
        self.detail = Some(detail.into());
        self
    }

    pub fn is_ok(&self) -> bool {
        self.outcome == "ok"
    }

    /// A compact description for error messages.
    pub fn describe(&self) -> String {
        let epoch = self.epoch.map_or("-".to_owned(), |e| e.to_string());
        let mut s = format!(
            "{} {} (epoch {epoch}): {}",
            self.worker, self.step, self.outcome
        );
        if let Some(hw) = self.high_water {
            s.push_str(&format!(", high_water {hw}"));
        }
        if let Some(d) = &self.detail {
            s.push_str(&format!(" [{d}]"));
        }
        s
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Everything that happened, in the order it was learned.
pub struct Timeline {
    start_ms: u64,
    events: Vec<Event>,
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline {
            start_ms: now_ms(),
            events: Vec::new(),
        }
    }

    pub fn push(&mut self, event: Event) {
        self.events.push(event);
    }

    /// Records a step taken by the parent itself.
    pub fn note(&mut self, step: &str, outcome: &str, detail: impl Into<String>) {
        self.push(Event::new("demo", None, step, outcome).detail(detail));
    }

    /// Prints the table, ordered by time (ties keep the order they were learned in).
    pub fn print(&self) {
        let mut rows: Vec<&Event> = self.events.iter().collect();
        rows.sort_by_key(|e| e.t_ms);
        println!();
        println!(
            "{:>7}  {:<6}  {:>5}  {:<14}  outcome",
            "t (ms)", "worker", "epoch", "step"
        );
        println!("{}", "-".repeat(78));
        for e in rows {
            let t = e.t_ms.saturating_sub(self.start_ms);
            let epoch = e.epoch.map_or("-".to_owned(), |n| n.to_string());
            let mut outcome = e.outcome.clone();
            if let Some(hw) = e.high_water {
                outcome.push_str(&format!(" (high_water {hw})"));
            }
            if let Some(d) = &e.detail {
                outcome.push_str(&format!(": {d}"));
            }
            println!(
                "{t:>7}  {:<6}  {epoch:>5}  {:<14}  {outcome}",
                e.worker, e.step
            );
        }
        println!();
    }
}
