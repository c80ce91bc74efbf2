//! The state the handles and the writer thread share: the fail-stop latch and the
//! commit counters.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::watch;

use super::intake::Intake;
use super::schema::Fault;
use crate::StorageError;

/// Counters of the writer, for metrics: `ops / commits` is the mean batch size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Successful commits.
    pub commits: u64,
    /// Requests carried by those commits that somebody waited for (refused operations
    /// included, lazy issuer records not).
    pub ops: u64,
}

/// What the handles and the writer thread share: the failure latch and the counters.
pub(super) struct State {
    pub(super) path: String,
    failed: AtomicBool,
    /// The first failure, repeated in every later refusal.
    reason: OnceLock<String>,
    commits: AtomicU64,
    ops: AtomicU64,
    /// Requests handed to the writer. The writer takes them in order and `ops` counts
    /// each once its batch is durable and published (before its answer goes out), so
    /// `ops == submitted` means that no request is in flight.
    submitted: AtomicU64,
    /// The highest epoch a successful commit wrote into the issuer's epoch counters since
    /// the file was opened (0 if none).
    max_epoch: AtomicU64,
    /// The newest log record known durable (published to readers).
    durable_seq: AtomicU64,
    /// The newest record the database file holds.
    checkpoint_seq: AtomicU64,
    /// Log bytes appended since the last checkpoint began.
    log_bytes: AtomicU64,
}

impl State {
    pub(super) fn new(path: String) -> Self {
        State {
            path,
            failed: AtomicBool::new(false),
            reason: OnceLock::new(),
            commits: AtomicU64::new(0),
            ops: AtomicU64::new(0),
            submitted: AtomicU64::new(0),
            max_epoch: AtomicU64::new(0),
            durable_seq: AtomicU64::new(0),
            checkpoint_seq: AtomicU64::new(0),
            log_bytes: AtomicU64::new(0),
        }
    }

    pub(super) fn durable_seq(&self) -> u64 {
        self.durable_seq.load(Ordering::Acquire)
    }

    pub(super) fn set_durable_seq(&self, seq: u64) {
        self.durable_seq.fetch_max(seq, Ordering::AcqRel);
    }

    pub(super) fn checkpoint_seq(&self) -> u64 {
        self.checkpoint_seq.load(Ordering::Acquire)
    }

    pub(super) fn set_checkpoint_seq(&self, seq: u64) {
        self.checkpoint_seq.fetch_max(seq, Ordering::AcqRel);
    }

    pub(super) fn add_log_bytes(&self, n: u64) {
        self.log_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn log_bytes(&self) -> u64 {
        self.log_bytes.load(Ordering::Relaxed)
    }

    pub(super) fn reset_log_bytes(&self) {
        self.log_bytes.store(0, Ordering::Relaxed);
    }

    pub(super) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Latches the failed state and returns the error to answer with.
    pub(super) fn latch(&self, fault: Fault) -> StorageError {
        let _ = self.reason.set(fault.0.clone());
        let err = fault.into_storage(&self.path);
        if !self.failed.swap(true, Ordering::AcqRel) {
            tracing::error!(error = %err, "storage failed; refusing all writes from now on");
        }
        err
    }

    /// The answer to a write after the latch.
    pub(super) fn refusal(&self) -> StorageError {
        let reason = self.reason.get().map_or("unknown", String::as_str);
        StorageError::Failed(format!(
            "redb database {}: refusing writes after an earlier failure ({reason}); restart to recover",
            self.path
        ))
    }

    pub(super) fn stats(&self) -> CommitStats {
        CommitStats {
            commits: self.commits.load(Ordering::Relaxed),
            ops: self.ops.load(Ordering::Relaxed),
        }
    }

    /// Counts a request handed to the writer that somebody waits for. Lazy issuer records
    /// are not counted here nor in `ops`: nobody waits for them, and no fenced decision
    /// reads the rows they write.
    pub(super) fn submitted(&self) {
        self.submitted.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether every request handed to the writer so far is durable and published (or
    /// refused in its turn): then the durable rows are what the writer would decide on.
    pub(super) fn nothing_in_flight(&self) -> bool {
        let submitted = self.submitted.load(Ordering::Acquire);
        self.ops.load(Ordering::Acquire) >= submitted
    }

    /// Counts a successful commit of `ops` requests that wrote epochs up to `max_epoch`
    /// (after its rows are published, before its answers go out).
    pub(super) fn record_commit(&self, ops: usize, max_epoch: u64) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.ops.fetch_add(ops as u64, Ordering::Release);
        self.max_epoch.fetch_max(max_epoch, Ordering::AcqRel);
    }

    pub(super) fn max_epoch(&self) -> u64 {
        self.max_epoch.load(Ordering::Acquire)
    }
}

/// Signals the writer's exit, also when it unwinds from a panic: it then latches and fails
/// every request still queued, so that no caller waits forever.
pub(super) struct ExitGuard {
    pub(super) state: Arc<State>,
    pub(super) intake: Arc<Intake>,
    pub(super) exited: watch::Sender<bool>,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let err = self
                .state
                .latch(Fault("the writer thread panicked".to_string()));
            for request in self.intake.abandon() {
                request.fail(err.clone());
            }
        }
        self.exited.send_replace(true);
    }
}
