//! What the gates admitted and refused, counted so that a refusal at the resource shows
//! where operators look (the server's `/metrics` and events stream, through
//! `POST /v1/gates/report`).
//!
//! A [`GateTally`] is handed to the gates through [`Trust::reporting_to`]: every admit
//! made with that trust counts as admitted, or as refused by its error code, by the kind
//! of resource that decided; and the resource's mark for the lock, as the admit saw it,
//! is kept for the server's view of each resource's marks (`GET /v1/gates/marks`).
//! Counting takes a short lock and allocates only for a refusal or the first write to a
//! lock since the last report; nothing is sent on the write's path. The tally keeps
//! counters (fixed size), the newest [`MAX_REPORTED_REFUSALS`] refusals and at most
//! [`MAX_REPORTED_MARKS`] marks of each kind, so it stays bounded however long the
//! server is away. With the `report` feature, a [`Reporter`] sends it to the server on a
//! task of its own.
//!
//! What is counted:
//! - **admitted**: an admit that passed. In a SQL transaction the caller may still roll
//!   back; the count is of admits, not of commits.
//! - **refused**, by code: a missing, invalid, other-lock or other-principal token
//!   (`missing_token`, `invalid_token`, `wrong_lock`, `permission_denied`), or a stale
//!   one (`stale_token`, `stale_sequence`, with the writer's epoch and the resource's mark).
//! - Not counted: lost races (`write_conflict`, which the caller retries) and backend
//!   failures (`storage_failed`): neither is a decision about the writer.
//! - **marks**: for each lock, the highest mark an admit committed with its write
//!   (`Admitted::high_water`) or a stale refusal read. A SQL transaction the caller rolled
//!   back after its admit leaves the resource's mark lower than the one reported.
//!
//! [`Trust::reporting_to`]: crate::Trust::reporting_to

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};

pub use palisade_api::wire::{
    GateMark, GateRefusal, GateReport, ResourceKind, MAX_REPORTED_MARKS, MAX_REPORTED_REFUSALS,
};

use crate::error::AdmitError;

/// Admits and refusals of the gates that report to it, by resource kind, since the last
/// [`GateTally::take`]. Share it (an `Arc`) between every trust that reports to it.
#[derive(Debug, Default)]
pub struct GateTally {
    kinds: Mutex<BTreeMap<ResourceKind, Counts>>,
}

#[derive(Debug, Default)]
struct Counts {
    admitted: u64,
    refused: BTreeMap<String, u64>,
    recent: VecDeque<GateRefusal>,
    /// Each lock's highest mark seen since the last take, with the order it was last seen
    /// in (to push out the one seen longest ago past [`MAX_REPORTED_MARKS`]).
    marks: BTreeMap<String, (u64, u64)>,
    tick: u64,
}

impl Counts {
    /// Keeps the newest [`MAX_REPORTED_REFUSALS`].
    fn push_recent(&mut self, refusal: GateRefusal) {
        if self.recent.len() == MAX_REPORTED_REFUSALS {
            self.recent.pop_front();
        }
        self.recent.push_back(refusal);
    }

    /// Keeps the higher of `mark` and what `lock` had, for at most [`MAX_REPORTED_MARKS`]
    /// locks: a new lock past that pushes out the one seen longest ago.
    fn see_mark(&mut self, lock: &str, mark: u64) {
        self.tick += 1;
        let tick = self.tick;
        if let Some((high, seen)) = self.marks.get_mut(lock) {
            *high = (*high).max(mark);
            *seen = tick;
            return;
        }
        if self.marks.len() == MAX_REPORTED_MARKS {
            let oldest = self
                .marks
                .iter()
                .min_by_key(|(_, (_, seen))| *seen)
                .map(|(lock, _)| lock.clone());
            if let Some(oldest) = oldest {
                self.marks.remove(&oldest);
            }
        }
        self.marks.insert(lock.to_owned(), (mark, tick));
    }
}

/// The refusal a report carries for `error`, or `None` if `error` is not a decision about
/// the writer (see the module docs).
fn refusal(lock: &str, error: &AdmitError) -> Option<GateRefusal> {
    let (epoch, high_water) = match error {
        AdmitError::Stale { high_water, epoch }
        | AdmitError::StaleSequence {
            high_water, epoch, ..
        } => (Some(*epoch), Some(*high_water)),
        AdmitError::MissingToken
        | AdmitError::InvalidToken(_)
        | AdmitError::WrongLock { .. }
        | AdmitError::NotHolder { .. } => (None, None),
        AdmitError::Conflict | AdmitError::Backend(_) | AdmitError::UnsafeDatabase(_) => {
            return None
        }
    };
    Some(GateRefusal {
        lock: lock.to_owned(),
        code: error.code().as_str().to_owned(),
        epoch,
        high_water,
    })
}

impl GateTally {
    pub fn new() -> Self {
        GateTally::default()
    }

    /// Counts the outcome of one admit of `lock`'s data in a resource of kind `resource`:
    /// `Ok(mark)` when it was admitted with the resource's mark now at `mark`, or the
    /// error it was refused with.
    pub fn record(&self, resource: ResourceKind, lock: &str, outcome: Result<u64, &AdmitError>) {
        let seen = match outcome {
            Ok(mark) => Ok(mark),
            Err(e) => match refusal(lock, e) {
                Some(r) => Err(r),
                None => return,
            },
        };
        let mut kinds = self.kinds.lock().unwrap_or_else(PoisonError::into_inner);
        let counts = kinds.entry(resource).or_default();
        match seen {
            Ok(mark) => {
                counts.admitted += 1;
                counts.see_mark(lock, mark);
            }
            Err(refusal) => {
                *counts.refused.entry(refusal.code.clone()).or_default() += 1;
                if let Some(mark) = refusal.high_water {
                    counts.see_mark(lock, mark);
                }
                counts.push_recent(refusal);
            }
        }
    }

    /// Takes everything counted so far, one report per resource kind that saw anything,
    /// and starts again from zero.
    pub fn take(&self) -> Vec<GateReport> {
        let kinds = std::mem::take(&mut *self.kinds.lock().unwrap_or_else(PoisonError::into_inner));
        kinds
            .into_iter()
            .map(|(resource, c)| GateReport {
                resource,
                admitted: c.admitted,
                refused: c.refused,
                recent: c.recent.into(),
                marks: c
                    .marks
                    .into_iter()
                    .map(|(lock, (high_water, _))| GateMark { lock, high_water })
                    .collect(),
            })
            .collect()
    }

    /// Puts back a report that could not be sent: its counts are added to what was
    /// counted since, its refusals kept before the newer ones (the newest
    /// [`MAX_REPORTED_REFUSALS`] in all), its marks as if seen before the newer ones.
    /// Nothing grows without bound.
    pub fn put_back(&self, report: GateReport) {
        let mut kinds = self.kinds.lock().unwrap_or_else(PoisonError::into_inner);
        let counts = kinds.entry(report.resource).or_default();
        counts.admitted = counts.admitted.saturating_add(report.admitted);
        for (code, n) in report.refused {
            let count = counts.refused.entry(code).or_default();
            *count = count.saturating_add(n);
        }
        let newer = std::mem::take(&mut counts.recent);
        for refusal in report.recent.into_iter().chain(newer) {
            counts.push_recent(refusal);
        }
        let newer = std::mem::take(&mut counts.marks);
        let mut newer: Vec<_> = newer.into_iter().collect();
        newer.sort_by_key(|(_, (_, seen))| *seen);
        let older = report.marks.into_iter().map(|m| (m.lock, m.high_water));
        for (lock, mark) in older.chain(newer.into_iter().map(|(lock, (mark, _))| (lock, mark))) {
            counts.see_mark(&lock, mark);
        }
    }
}

#[cfg(feature = "report")]
pub use reporter::Reporter;

#[cfg(feature = "report")]
mod reporter {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use palisade_client::{Client, Error};

    use super::GateTally;

    /// Sends a [`GateTally`] to the server (`POST /v1/gates/report`, with the client's
    /// credentials: a `write` grant on every lock a refusal names) every `every`, on a task
    /// of its own, so a write never waits for it. Needs the `report` feature and a tokio
    /// runtime. Dropping it stops the task; [`Reporter::flush`] sends at once (before a
    /// clean shutdown, say).
    ///
    /// When the server is away (a transport error, a 5xx answer) the report is put back
    /// into the tally, which stays bounded (counters, and the newest refusals), and goes
    /// with the next one; a report whose answer was lost on the way may so be counted
    /// twice. A report the server refuses (4xx: no grant, a code it does not know) is
    /// dropped rather than sent again for ever; [`Reporter::refused_reports`] counts those.
    pub struct Reporter {
        shared: Arc<Shared>,
        task: tokio::task::JoinHandle<()>,
    }

    struct Shared {
        client: Client,
        tally: Arc<GateTally>,
        put_back: AtomicU64,
        refused: AtomicU64,
    }

    impl Shared {
        async fn send(&self) -> Result<(), Error> {
            let mut first_error = None;
            for report in self.tally.take() {
                match self.client.report_gate(&report).await {
                    Ok(_) => {}
                    Err(e) => {
                        if server_away(&e) {
                            self.tally.put_back(report);
                            self.put_back.fetch_add(1, Ordering::Relaxed);
                        } else {
                            self.refused.fetch_add(1, Ordering::Relaxed);
                        }
                        first_error.get_or_insert(e);
                    }
                }
            }
            first_error.map_or(Ok(()), Err)
        }
    }

    /// Whether the report may go through later (the server was not reached, or could not
    /// take it now), as opposed to a refusal of the report itself.
    fn server_away(e: &Error) -> bool {
        match e {
            Error::Transport(_) | Error::StorageFailed => true,
            Error::Api { status, .. } => *status >= 500,
            _ => false,
        }
    }

    impl Reporter {
        /// Starts reporting `tally` through `client` every `every` (at least 100 ms).
        pub fn spawn(client: Client, tally: Arc<GateTally>, every: Duration) -> Reporter {
            let shared = Arc::new(Shared {
                client,
                tally,
                put_back: AtomicU64::new(0),
                refused: AtomicU64::new(0),
            });
            let every = every.max(Duration::from_millis(100));
            let task = tokio::spawn({
                let shared = shared.clone();
                async move {
                    let mut tick = tokio::time::interval(every);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    tick.tick().await;
                    loop {
                        tick.tick().await;
                        let _ = shared.send().await;
                    }
                }
            });
            Reporter { shared, task }
        }

        /// Sends what was counted since the last report now; the first error, if a report
        /// did not go through (it was put back or dropped as the type's docs say).
        pub async fn flush(&self) -> Result<(), Error> {
            self.shared.send().await
        }

        /// Reports put back into the tally because the server was away.
        pub fn put_back_reports(&self) -> u64 {
            self.shared.put_back.load(Ordering::Relaxed)
        }

        /// Reports the server refused, and that were dropped.
        pub fn refused_reports(&self) -> u64 {
            self.shared.refused.load(Ordering::Relaxed)
        }
    }

    impl Drop for Reporter {
        fn drop(&mut self) {
            self.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::CorruptFence;

    fn stale(epoch: u64) -> AdmitError {
        AdmitError::Stale {
            high_water: 100,
            epoch,
        }
    }

    #[test]
    fn admits_and_refusals_are_counted_by_kind_and_code_and_taken_once() {
        let tally = GateTally::new();
        tally.record(ResourceKind::Postgres, "orders", Ok(100));
        tally.record(ResourceKind::Postgres, "orders", Err(&stale(7)));
        tally.record(ResourceKind::Redis, "cache", Err(&AdmitError::MissingToken));
        // Neither a lost race nor a backend failure is a decision about the writer.
        tally.record(ResourceKind::Postgres, "orders", Err(&AdmitError::Conflict));
        let broken = AdmitError::backend(CorruptFence("x".into()));
        tally.record(ResourceKind::Postgres, "orders", Err(&broken));
        let reports = tally.take();
        assert_eq!(reports.len(), 2);
        let pg = &reports[0];
        assert_eq!((pg.resource, pg.admitted), (ResourceKind::Postgres, 1));
        assert_eq!(pg.refused, BTreeMap::from([("stale_token".to_owned(), 1)]));
        assert_eq!(
            pg.recent,
            [GateRefusal {
                lock: "orders".into(),
                code: "stale_token".into(),
                epoch: Some(7),
                high_water: Some(100),
            }]
        );
        assert_eq!(
            pg.marks,
            [GateMark {
                lock: "orders".into(),
                high_water: 100
            }]
        );
        let redis = &reports[1];
        assert_eq!((redis.resource, redis.admitted), (ResourceKind::Redis, 0));
        assert_eq!(redis.recent[0].code, "missing_token");
        assert_eq!(
            (redis.recent[0].epoch, redis.recent[0].high_water),
            (None, None)
        );
        assert!(redis.marks.is_empty(), "a missing token shows no mark");
        assert!(tally.take().is_empty(), "taken once");
    }

    #[test]
    fn the_tally_keeps_the_newest_refusals_and_every_count_however_long_it_waits() {
        let tally = GateTally::new();
        for epoch in 0..250 {
            tally.record(ResourceKind::Sqlite, "orders", Err(&stale(epoch)));
        }
        let report = tally.take().pop().unwrap();
        assert_eq!(report.refused["stale_token"], 250);
        assert_eq!(report.recent.len(), MAX_REPORTED_REFUSALS);
        assert_eq!(report.recent[0].epoch, Some(150), "the oldest were dropped");
        // Put back while newer refusals came: the counts add up, the newest are kept.
        for epoch in 250..260 {
            tally.record(ResourceKind::Sqlite, "orders", Err(&stale(epoch)));
        }
        tally.record(ResourceKind::Sqlite, "orders", Ok(100));
        tally.put_back(report);
        let merged = tally.take().pop().unwrap();
        assert_eq!(merged.refused["stale_token"], 260);
        assert_eq!(merged.admitted, 1);
        let epochs: Vec<u64> = merged.recent.iter().filter_map(|r| r.epoch).collect();
        assert_eq!(epochs, (160..260).collect::<Vec<_>>());
    }

    #[test]
    fn marks_keep_the_highest_per_lock_for_the_locks_seen_last() {
        let tally = GateTally::new();
        let kind = ResourceKind::Postgres;
        tally.record(kind, "orders", Ok(8));
        tally.record(
            kind,
            "orders",
            Err(&AdmitError::Stale {
                high_water: 5,
                epoch: 4,
            }),
        );
        for i in 0..MAX_REPORTED_MARKS {
            tally.record(kind, &format!("other.{i}"), Ok(1));
            if i == 0 {
                tally.record(kind, "orders", Ok(8));
            }
        }
        let report = tally.take().pop().unwrap();
        assert_eq!(report.marks.len(), MAX_REPORTED_MARKS);
        let orders = report.marks.iter().find(|m| m.lock == "orders");
        assert_eq!(orders.map(|m| m.high_water), Some(8), "the highest, kept");
        assert!(
            report.marks.iter().all(|m| m.lock != "other.0"),
            "the lock seen longest ago went"
        );
        // Put back under newer marks: the newer ones win the room.
        tally.record(kind, "orders", Ok(9));
        tally.put_back(report);
        let merged = tally.take().pop().unwrap();
        assert_eq!(merged.marks.len(), MAX_REPORTED_MARKS);
        let orders = merged.marks.iter().find(|m| m.lock == "orders");
        assert_eq!(orders.map(|m| m.high_water), Some(9));
    }
}
