//! Many seeds, on every core: the CI entry point.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::run::{run, Outcome, RunStats};

/// The result of a sweep.
#[derive(Debug, Default)]
pub struct SweepReport {
    /// Seeds actually run.
    pub runs: u64,
    /// Failed seeds, lowest first.
    pub failures: Vec<Outcome>,
    /// (seed, note) of runs where some checker could not decide.
    pub undecided: Vec<(u64, String)>,
    /// Sums over every run.
    pub totals: RunStats,
    pub elapsed: Duration,
}

impl SweepReport {
    /// One line of totals.
    pub fn summary(&self) -> String {
        let t = &self.totals;
        format!(
            "{} seeds in {:.1?}: {} failed, {} undecided; {} ops ({} ok, {} fail, {} info), \
             {} stale refusals, {} late old-epoch writes admitted (S10), {} grants, {} crashes ({} torn commits), {} partitions, \
             {} pauses, {} held and {} dropped messages",
            self.runs,
            self.elapsed,
            self.failures.len(),
            self.undecided.len(),
            t.ops,
            t.ok,
            t.fail,
            t.info,
            t.stale_refusals,
            t.late_admitted,
            t.acquisitions,
            t.crashes,
            t.torn_commits,
            t.partitions,
            t.pauses,
            t.net.held,
            t.net.dropped + t.net.cut,
        )
    }
}

fn add(total: &mut RunStats, s: &RunStats) {
    total.ops += s.ops;
    total.ok += s.ok;
    total.fail += s.fail;
    total.info += s.info;
    total.stale_refusals += s.stale_refusals;
    total.late_admitted += s.late_admitted;
    total.acquisitions += s.acquisitions;
    total.commits += s.commits;
    total.crashes += s.crashes;
    total.torn_commits += s.torn_commits;
    total.restarts += s.restarts;
    total.partitions += s.partitions;
    total.pauses += s.pauses;
    total.lost_to_crash += s.lost_to_crash;
    total.net.sent += s.net.sent;
    total.net.dropped += s.net.dropped;
    total.net.held += s.net.held;
    total.net.cut += s.net.cut;
    total.end_ms = total.end_ms.max(s.end_ms);
}

/// Runs seeds `first..first + count` on all cores. With `stop_at_first_failure`, stops
/// handing out seeds once one failed (seeds already running still finish).
pub fn sweep(config: &Config, first: u64, count: u64, stop_at_first_failure: bool) -> SweepReport {
    let started = Instant::now();
    let next = AtomicU64::new(first);
    let stop = AtomicBool::new(false);
    let report = Mutex::new(SweepReport::default());
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(count.max(1) as usize);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= first + count {
                    return;
                }
                let mut outcome = run(seed, config);
                // Keep the history of failures only; a sweep of passing runs stays small.
                let failed = !outcome.passed();
                if !failed {
                    outcome.history = Default::default();
                }
                let mut report = report.lock().unwrap_or_else(|e| e.into_inner());
                report.runs += 1;
                add(&mut report.totals, &outcome.stats);
                for note in &outcome.undecided {
                    report.undecided.push((seed, note.clone()));
                }
                if failed {
                    stop.store(stop_at_first_failure, Ordering::Relaxed);
                    report.failures.push(outcome);
                }
            });
        }
    });
    let mut report = report.into_inner().unwrap_or_else(|e| e.into_inner());
    report.failures.sort_by_key(|o| o.seed);
    report.undecided.sort();
    report.elapsed = started.elapsed();
    report
}
