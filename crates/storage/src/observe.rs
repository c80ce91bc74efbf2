//! Hooks for metrics: what the embedded writer reports about each commit.
//!
//! Kept apart from the engine on purpose: the writer calls [`CommitObserver::committed`]
//! once per durable commit, after the commit returned and before its callers are answered,
//! and nothing else in this crate knows who listens. The server turns the reports into
//! `palisade_fsync_duration_seconds` and `palisade_commit_batch_size`.
//!
//! An observer runs on the writer thread, inside the commit path: it must only record
//! (an atomic add, a histogram bucket), never block or do I/O.

use std::sync::Arc;
use std::time::Duration;

/// One durable commit of the writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitReport {
    /// Requests the commit carried (refused operations and lazy records included).
    pub requests: usize,
    /// How long the durable write took: the commit call that ends in the fsync.
    pub sync: Duration,
}

/// Receives a [`CommitReport`] per commit. See the module docs for what it may do.
pub trait CommitObserver: Send + Sync + 'static {
    fn committed(&self, report: CommitReport);
}

/// An optional observer, as the backend's options carry it. Two handles are equal when
/// they share the same observer (or both have none).
#[derive(Clone, Default)]
pub struct CommitHook(Option<Arc<dyn CommitObserver>>);

impl CommitHook {
    /// A hook reporting to `observer`.
    pub fn new(observer: Arc<dyn CommitObserver>) -> Self {
        CommitHook(Some(observer))
    }

    /// Reports one commit (nothing without an observer).
    pub fn committed(&self, requests: usize, sync: Duration) {
        if let Some(observer) = &self.0 {
            observer.committed(CommitReport { requests, sync });
        }
    }
}

impl std::fmt::Debug for CommitHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "CommitHook(observer)"
        } else {
            "CommitHook(none)"
        })
    }
}

impl PartialEq for CommitHook {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

impl Eq for CommitHook {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Count(AtomicUsize);

    impl CommitObserver for Count {
        fn committed(&self, report: CommitReport) {
            self.0.fetch_add(report.requests, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_hook_reports_to_its_observer_only() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let hook = CommitHook::new(count.clone());
        hook.committed(3, Duration::from_millis(1));
        CommitHook::default().committed(5, Duration::ZERO);
        assert_eq!(count.0.load(Ordering::Relaxed), 3);
        assert_eq!(hook, hook.clone());
        assert_ne!(hook, CommitHook::default());
    }
}
