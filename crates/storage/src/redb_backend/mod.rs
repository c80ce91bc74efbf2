//! # The embedded backend: one redb file, one writer thread
//!
//! [`RedbBackend`] keeps the issuer's records (last epoch per lock, live leases) and the
//! fenced store (keys, per-namespace high-water marks, idempotency records, the global
//! store revision) in a single [redb](https://docs.rs/redb) file.
//!
//! ## Group commit
//! A durable answer costs an fsync, and an fsync costs milliseconds whatever it carries.
//! So one dedicated writer **thread** (not a tokio task: a commit blocks on fsync and
//! would stall a runtime worker) owns every write transaction. Callers send it a request
//! with a `oneshot` reply channel. The writer blocks for the first request, takes whatever
//! else is already queued (at most [`RedbOptions::max_batch`] in all), applies them in
//! arrival order inside **one** write transaction, each seeing the effects of the ones
//! before it, commits once (`Durability::Immediate`: one fsync), and only after the
//! commit returns answers every caller. Throughput comes from batching, never from skipping the fsync:
//! under load a batch grows by itself while the previous fsync runs.
//!
//! Sharing a transaction is safe because an operation that is refused (stale epoch,
//! failed precondition, missing key, idempotency conflict) does every check before its
//! first write: it leaves nothing behind in the batch's transaction.
//!
//! ## Fail-stop
//! If any database call fails (a commit, an fsync, a read, a record that does not decode),
//! the whole batch is answered [`StorageError::Failed`], also the operations that would
//! have succeeded, since none of them is known to be durable, and the backend latches:
//! every later write is refused at once, and [`Backend::is_failed`] says so. Why not retry?
//! After a failed fsync the kernel may already have dropped the dirty pages and a second
//! fsync can report success for data that never reached the disk. Continuing could
//! acknowledge writes a restart then loses: a high-water mark that goes back down, or an
//! epoch issued twice, which is exactly the failure a fencing service exists to prevent.
//! The only state we can vouch for is the one redb recovers when the file is opened again,
//! so the process should be restarted. Reads keep being attempted: they see committed
//! (durable) state, and redb refuses them itself if it cannot serve them.
//!
//! ## Invariants
//! - An `Ok` from a write means its transaction was committed with fsync.
//! - A refused operation writes nothing: not the mark, the key, nor an idempotency record.
//! - Opening never serves partial state: a file that is not a Palisade redb database, that
//!   redb cannot recover, or (with [`RedbOptions::verify_on_open`]) whose checksums do not
//!   verify, is refused with an error naming it. A torn commit (one whose fsync never
//!   returned, so never acknowledged) is rolled back by redb at open; see
//!   [`RedbOptions::two_phase_commit`] for the stricter mode.
//!
//! ## What this backend does not do
//! - It is one node: no replication; the etcd backend is the answer to high availability.
//! - Idempotency records are kept for [`StoreLimits::idempotency_retention`] (wall clock,
//!   so a restart does not reset it); an expired record is forgotten at once and purged
//!   from the file within [`RedbOptions::purge_every`] (in passes of at most 10,000).
//! - The namespace quotas of [`StoreLimits`] bound what one namespace holds, not how
//!   many namespaces there are.
//! - A caller that stops waiting (a dropped future) does not cancel its operation: it may
//!   still be applied and committed, as with any database.
//! - Two processes cannot open the same file (redb takes a file lock); in one process,
//!   await [`Backend::close`] before opening the same path again.

pub mod offline;
mod open;
mod reads;
mod schema;
mod state;
mod writer;

#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::{mpsc, Arc, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use redb::{Database, ReadTransaction};
use tokio::sync::{oneshot, watch};

use palisade_core::gate::HighWater;

use self::schema::Fault;
use self::state::{ExitGuard, State};
use self::writer::Request;

pub use self::state::CommitStats;
use crate::{
    Applied, ApplyError, Backend, Entry, FencedOp, IssuerState, LeaseRecord, StorageError,
    StoreLimits, WallClock,
};
use palisade_core::lock_table::Reservation;
use palisade_token::Epoch;

/// Tuning of a [`RedbBackend`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedbOptions {
    /// Most requests one commit carries (values below 1 count as 1). A larger batch
    /// amortises the fsync over more callers; a smaller one bounds the latency that a
    /// burst adds to the last caller of the batch.
    pub max_batch: usize,
    /// Verify every page checksum when opening an existing file (redb's
    /// `check_integrity`), so that damage anywhere in the file is refused at startup
    /// instead of being read later. Costs one full read of the file per start.
    pub verify_on_open: bool,
    /// Use redb's two-phase commit (two fsyncs per batch) instead of its default
    /// one-phase commit with checksums (one fsync). Both are crash-safe for acknowledged
    /// data: with one phase, a commit whose fsync returned is complete on disk, and only a
    /// torn, never-acknowledged commit is rolled back at open. Two-phase additionally turns
    /// later media damage of the newest commit into an error at open instead of a
    /// fallback to the commit before it, at the price of a second fsync per batch.
    pub two_phase_commit: bool,
    /// Bytes of redb's page cache (its read cache and the write buffer of a commit). The
    /// working set of a lock service is small (one mark and a few records per lock), so
    /// the default is far below redb's own 1 GiB; a larger cache helps only when the
    /// stored values are large and read often.
    pub cache_bytes: usize,
    /// Namespace quotas and the idempotency retention.
    pub limits: StoreLimits,
    /// The wall clock that stamps idempotency records.
    pub clock: WallClock,
    /// How often the writer purges expired idempotency records (a pass between batches,
    /// or when idle).
    pub purge_every: Duration,
    /// Told about every commit (for metrics; see [`crate::observe`]).
    pub commit_hook: crate::observe::CommitHook,
}

/// Default of [`RedbOptions::cache_bytes`]: 32 MiB.
pub const DEFAULT_CACHE_BYTES: usize = 32 * 1024 * 1024;
/// Default of [`RedbOptions::purge_every`]: one minute.
pub const DEFAULT_PURGE_EVERY: Duration = Duration::from_secs(60);

impl Default for RedbOptions {
    fn default() -> Self {
        RedbOptions {
            max_batch: 256,
            verify_on_open: true,
            two_phase_commit: false,
            cache_bytes: DEFAULT_CACHE_BYTES,
            limits: StoreLimits::default(),
            clock: WallClock::system(),
            purge_every: DEFAULT_PURGE_EVERY,
            commit_hook: crate::observe::CommitHook::default(),
        }
    }
}

/// The embedded [`Backend`]: a handle to one redb file and its writer thread. Cheap to
/// clone; the writer stops once the last handle is dropped (after finishing the queue),
/// or on [`Backend::close`].
#[derive(Clone)]
pub struct RedbBackend {
    inner: Arc<Inner>,
}

/// The locks are std `RwLock`s held only for an `Arc` clone, a channel send or a `take`,
/// never across an `.await`; they exist so `close` can retire the queue and the database
/// while other handles are alive.
struct Inner {
    state: Arc<State>,
    /// `None` once closed. Readers clone the `Arc` and drop the lock at once.
    db: RwLock<Option<Arc<Database>>>,
    /// `None` once closed: dropping the sender is what tells the writer to finish.
    queue: RwLock<Option<mpsc::Sender<Request>>>,
    writer_exited: watch::Receiver<bool>,
}

impl RedbBackend {
    /// Opens the database file at `path`, creating it if it does not exist, and starts the
    /// writer thread. A file that exists but is not a readable Palisade redb database is
    /// refused with [`StorageError::Failed`] naming it. Blocking: call it before serving,
    /// or from `spawn_blocking`.
    ///
    /// ```
    /// use palisade_storage::redb_backend::{RedbBackend, RedbOptions};
    /// use palisade_storage::Backend;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = tempfile::tempdir()?;
    /// let store = RedbBackend::open(&dir.path().join("palisade.redb"), RedbOptions::default())?;
    /// assert_eq!(store.high_water("orders").await?.epoch, 0);
    /// store.close().await;
    /// # Ok(())
    /// # }
    /// ```
    pub fn open(path: &Path, opts: RedbOptions) -> Result<RedbBackend, StorageError> {
        let label = path.display().to_string();
        let db = open::open_file(path, opts.verify_on_open, opts.cache_bytes)
            .map_err(|fault| fault.into_storage(&label))?;
        Self::start(db, label, opts)
    }

    /// Prepares an opened database and starts its writer. `label` names it in errors.
    fn start(db: Database, label: String, opts: RedbOptions) -> Result<RedbBackend, StorageError> {
        open::prepare(&db, opts.clock.now_ms()).map_err(|fault| fault.into_storage(&label))?;
        let db = Arc::new(db);
        let state = Arc::new(State::new(label));
        let (queue, requests) = mpsc::channel();
        let (exited, writer_exited) = watch::channel(false);
        let guard = ExitGuard {
            state: Arc::clone(&state),
            exited,
        };
        let writer_db = Arc::clone(&db);
        let writer_state = Arc::clone(&state);
        // Detached: `close` waits on `writer_exited`, which can be awaited, unlike a join.
        std::thread::Builder::new()
            .name("palisade-redb-writer".to_string())
            .spawn(move || {
                let _guard = guard;
                let config = writer::WriterConfig {
                    max_batch: opts.max_batch,
                    two_phase: opts.two_phase_commit,
                    limits: opts.limits,
                    clock: opts.clock,
                    purge_every: opts.purge_every,
                    commit_hook: opts.commit_hook,
                };
                writer::run(writer_db, requests, writer_state, config);
            })
            .map_err(|e| {
                StorageError::Failed(format!("cannot start the redb writer thread: {e}"))
            })?;
        Ok(RedbBackend {
            inner: Arc::new(Inner {
                state,
                db: RwLock::new(Some(db)),
                queue: RwLock::new(Some(queue)),
                writer_exited,
            }),
        })
    }

    /// The writer's counters.
    pub fn commit_stats(&self) -> CommitStats {
        self.inner.state.stats()
    }

    /// The highest epoch that a durable commit of this handle's writer wrote into a lock's
    /// epoch counter (a grant or a reservation ceiling) since the file was opened; 0 if
    /// none. Cheap (one atomic load), for a caller that follows the issued epochs without
    /// scanning the database.
    pub fn committed_epoch_max(&self) -> palisade_token::Epoch {
        self.inner.state.max_epoch()
    }

    /// Queues a request for the writer, or refuses at once when failed or closed.
    fn submit(&self, request: Request) -> Result<(), StorageError> {
        let state = &self.inner.state;
        if state.is_failed() {
            return Err(state.refusal());
        }
        let queue = self
            .inner
            .queue
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(queue) = queue.as_ref() else {
            return Err(StorageError::Closed);
        };
        // The receiver lives as long as the writer, and the writer leaves only when every
        // sender is gone, unless it panicked.
        queue
            .send(request)
            .map_err(|_| state.latch(Fault("the writer thread is gone".to_string())))
    }

    /// Waits for the writer's answer.
    async fn answer<T, E: From<StorageError>>(
        &self,
        answer: oneshot::Receiver<Result<T, E>>,
    ) -> Result<T, E> {
        match answer.await {
            Ok(result) => result,
            // The writer answers every request it takes, even when failing; a dropped
            // reply means it died mid-batch.
            Err(_) => Err(self
                .inner
                .state
                .latch(Fault(
                    "the writer thread stopped without answering".to_string(),
                ))
                .into()),
        }
    }

    /// Runs `read` on a fresh read transaction, on tokio's blocking pool. Reads are short,
    /// but a page-cache miss is a disk read, and a sick disk can stall one for seconds:
    /// that must tie up a blocking-pool thread, not a runtime worker serving every other
    /// connection. (The cost is one thread hand-off per read.)
    async fn read<T, F>(&self, read: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&ReadTransaction) -> Result<T, Fault> + Send + 'static,
    {
        let db = self
            .inner
            .db
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(StorageError::Closed)?;
        let outcome = tokio::task::spawn_blocking(move || {
            let txn = db.begin_read()?;
            read(&txn)
        })
        .await;
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(fault)) => Err(self.inner.state.latch(fault)),
            Err(join) => Err(self.inner.state.latch(Fault(format!("read task: {join}")))),
        }
    }
}

impl std::fmt::Debug for RedbBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbBackend")
            .field("path", &self.inner.state.path)
            .field("failed", &self.inner.state.is_failed())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Backend for RedbBackend {
    async fn load_issuer(&self) -> Result<IssuerState, StorageError> {
        self.read(reads::load_issuer).await
    }

    async fn record_grant(&self, lease: LeaseRecord) -> Result<(), StorageError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Request::Grant { lease, reply })?;
        self.answer(answer).await
    }

    async fn reserve(
        &self,
        lock: &str,
        reservation: Reservation,
        lease: Option<LeaseRecord>,
    ) -> Result<(), StorageError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Request::Reserve {
            lock: lock.to_owned(),
            reservation,
            lease,
            reply,
        })?;
        self.answer(answer).await
    }

    fn record_lazily(&self, record: crate::LazyRecord) {
        // A refusal (failed or closed backend) needs no answer: lazy records are optional.
        let _ = self.submit(Request::Lazy(record));
    }

    async fn remove_lease(&self, lease_id: &str) -> Result<(), StorageError> {
        let (reply, answer) = oneshot::channel();
        let lease_id = lease_id.to_string();
        self.submit(Request::RemoveLease { lease_id, reply })?;
        self.answer(answer).await
    }

    async fn list_locks(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Epoch)>, StorageError> {
        let (prefix, after) = (prefix.to_owned(), after.map(str::to_owned));
        self.read(move |txn| reads::list_locks(txn, &prefix, after.as_deref(), limit))
            .await
    }

    async fn lock_record(&self, lock: &str) -> Result<Option<(Epoch, Reservation)>, StorageError> {
        let lock = lock.to_owned();
        self.read(move |txn| reads::lock_record(txn, &lock)).await
    }

    async fn apply(&self, op: FencedOp) -> Result<Applied, ApplyError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Request::Apply { op, reply })?;
        self.answer(answer).await
    }

    async fn get(&self, namespace: &str, key: &str) -> Result<Option<Entry>, StorageError> {
        let (namespace, key) = (namespace.to_string(), key.to_string());
        self.read(move |txn| reads::get(txn, &namespace, &key))
            .await
    }

    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, StorageError> {
        let (namespace, prefix) = (namespace.to_string(), prefix.to_string());
        self.read(move |txn| reads::list(txn, &namespace, &prefix, limit))
            .await
    }

    async fn high_water(&self, namespace: &str) -> Result<HighWater, StorageError> {
        let namespace = namespace.to_string();
        self.read(move |txn| reads::high_water(txn, &namespace))
            .await
    }

    fn is_failed(&self) -> bool {
        self.inner.state.is_failed()
    }

    /// Stops taking writes, lets the writer commit and answer everything already queued,
    /// waits for the writer thread to exit, and releases the file (once in-flight reads
    /// finish). Later calls on any handle answer [`StorageError::Closed`]. Idempotent.
    async fn close(&self) {
        drop(
            self.inner
                .queue
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let mut exited = self.inner.writer_exited.clone();
        // An error means the writer's side is gone, which also means it has exited.
        let _ = exited.wait_for(|done| *done).await;
        drop(
            self.inner
                .db
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }
}
