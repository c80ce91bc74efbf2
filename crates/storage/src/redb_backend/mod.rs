//! # The embedded backend: a write-ahead log in front of one redb file
//!
//! [`RedbBackend`] keeps the issuer's records (last epoch and reservation per lock, live
//! leases) and the fenced store (keys, per-namespace high-water marks and usage counters,
//! idempotency records, the global store revision). Its shape is the one every fast
//! durable system uses for small writes: **append a log, fsync once per batch, apply to
//! memory, checkpoint in the background** (the choice and its measurements:
//! `docs/storage-engine.md`).
//!
//! ## The write path: pipelined group commit
//! One **writer** thread takes every request waiting in its queue (at most
//! [`RedbOptions::max_batch`]), computes in arrival order what each writes (each seeing
//! the effects of the ones before it), appends the batch's rows to the log as **one
//! record** (one `pwrite` into a zero-filled segment, see [`newest_commit`] for the
//! format), and hands it to the **syncer** thread, which fdatasyncs the log once for every
//! record handed over so far, makes their rows visible to readers and only then answers
//! their callers. The writer does not wait: it computes the next batch while the syncer's
//! fdatasync of the previous one runs. Throughput comes from batching and that overlap,
//! never from skipping the fdatasync. A lazy issuer record (one nobody waits for) does not
//! wake the writer: it waits in the queue, in its place, for the next request somebody
//! waits for, or at most [`RedbOptions::lazy_linger`] (`intake.rs`).
//!
//! The rows live in memory (an ordered index of only the rows written since the last
//! checkpoint) until the **checkpointer** thread writes them into the redb file in one
//! durable two-phase transaction, recording the commit sequence number it covers, and
//! deletes the log segments that are then redundant. A checkpoint starts after
//! [`RedbOptions::checkpoint_rows`] rows, half a segment of log, or
//! [`RedbOptions::checkpoint_every`]; writers wait for it when rows pile up far past that,
//! so memory stays bounded. A clean close checkpoints everything and removes the log.
//!
//! Reads see durable state only: the published rows over one snapshot of the file
//! (`layers.rs` says why no checkpoint can hide a row from them). They never block the
//! writer. A point read (a value, a mark, a lock's record) whose rows are in memory (in
//! the log's rows, or in a bounded cache of rows read from the file before) is answered
//! on the caller's own thread; only what needs the file goes to the blocking pool
//! (`resident.rs`). So is a write that those rows already refuse (a stale epoch, a failed
//! precondition, a quota) or replay (an idempotent retry) while no other request is in
//! flight: the writer's own rule decides it on the state the writer would see, and the
//! writer is not woken.
//!
//! ## Recovery, and never rolling back silently
//! Opening replays the log into the file (one checkpoint) before anything reads it. A
//! record cut by a crash before its fdatasync returned (**torn**: a sector of it is still
//! zeros) ends the log; it was never acknowledged, and neither was anything after it. A
//! record that is complete but does not verify (**damaged**: flipped bytes), a segment
//! header that does not verify, a segment of another store, or a gap between the file's
//! last checkpoint and the log (an older database file put beside a newer log) is refused
//! with an error naming the file: serving would roll back acknowledged commits and could
//! admit a stale epoch again. Damage to the file itself is refused by redb's checksums,
//! all verified at open ([`RedbOptions::verify_on_open`]); checkpoints use two-phase
//! commit, so a damaged newest checkpoint is an error, not a silent fall back to the one
//! before. What is left, an older copy of the whole data directory or of the file after a
//! clean stop, is the server's epoch ledger's to notice: [`RedbBackend::commit_seq`] is
//! what it records.
//!
//! ## Fail-stop
//! If anything fails (an append, an fdatasync, a checkpoint, a read of the file, a row
//! that does not decode), every answer not yet sent is [`StorageError::Failed`] (none of
//! them is known to be durable) and the backend latches: every later write is refused at
//! once, and [`FencedStore::is_failed`] says so. Why not retry? After a failed fsync the
//! kernel may already have dropped the dirty pages and a second fsync can report success
//! for data that never reached the disk. Continuing could acknowledge writes a restart
//! then loses: a high-water mark that goes back down, or an epoch issued twice, which is
//! exactly the failure a fencing service exists to prevent. The only state we can vouch
//! for is the one recovery rebuilds when the files are opened again, so the process should
//! be restarted. Reads keep being attempted.
//!
//! ## Invariants
//! - An `Ok` from a write means its log record was fdatasync'd, and so was every record
//!   before it.
//! - A refused operation writes nothing: not the mark, the key, nor an idempotency record.
//! - Answers go out in commit order; an answer decided on rows not yet durable (a refusal
//!   because of a mark a batch in flight raised) waits for those rows too.
//! - Opening never serves partial or older state: see above.
//!
//! ## What this backend does not do
//! - It is one node: no replication; the etcd backend is the answer to high availability.
//! - Idempotency records are kept for [`StoreLimits::idempotency_retention`] (wall clock,
//!   so a restart does not reset it); an expired record is forgotten at once and purged
//!   within [`RedbOptions::purge_every`] (in passes of at most 10,000).
//! - The namespace quotas of [`StoreLimits`] bound what one namespace holds, not how
//!   many namespaces there are.
//! - A caller that stops waiting (a dropped future) does not cancel its operation: it may
//!   still be applied and committed, as with any database.
//! - Two processes cannot open the same file (redb takes a file lock, and the log lives
//!   beside it); in one process, await [`FencedStore::close`] before opening the same path
//!   again.
//! - A torn record is told from a damaged one by its zero sectors; a disk that tears
//!   inside a 512-byte sector is taken for damage. Damage that zeroes whole sectors of the
//!   newest records cannot be told from a torn write: recovery drops those records and
//!   raises every epoch and mark to the epoch horizon (`horizon.rs`), so no token they had
//!   fenced out passes again; every holder releases and acquires again.

mod horizon;
mod intake;
mod layers;
pub mod offline;
mod open;
mod overlay;
mod raise;
mod reads;
mod resident;
mod schema;
mod seat;
mod spare;
mod state;
mod sync;
mod tx;
mod wal;
pub mod witness;
mod writer;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use redb::Database;
use tokio::sync::{oneshot, watch};

use palisade_core::gate::HighWater;

use self::intake::Intake;
use self::layers::{Layers, View};
use self::reads::{Point, ReadError};
use self::resident::{Filling, Resident, RowCache};
use self::schema::Fault;
use self::state::{ExitGuard, State};
use self::tx::Inputs;
use self::wal::{FsLogDir, LogDir};
use self::writer::Request;

pub use self::state::CommitStats;
pub use self::wal::newest_commit;
use crate::{
    decide, Applied, ApplyError, Decision, Entry, FencedOp, FencedStore, IssuerLog, IssuerState,
    LeaseRecord, NamespaceSummary, Page, StorageError, StoreLimits, WallClock,
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
    /// Bytes of redb's page cache (its read cache and the write buffer of a commit). The
    /// working set of a lock service is small (one mark and a few records per lock), so
    /// the default is far below redb's own 1 GiB; a larger cache helps only when the
    /// stored values are large and read often.
    pub cache_bytes: usize,
    /// Bytes of rows read from the file kept in memory in front of it, so that a point
    /// read (a value, a mark, a lock's record) of a row not written since the last
    /// checkpoint is answered on the caller's thread (see `resident.rs`); 0 turns it off.
    pub resident_bytes: usize,
    /// Namespace quotas and the idempotency retention.
    pub limits: StoreLimits,
    /// The wall clock that stamps idempotency records.
    pub clock: WallClock,
    /// How often the writer purges expired idempotency records (a pass between batches,
    /// or when idle).
    pub purge_every: Duration,
    /// A checkpoint starts once this many rows were written since the last one (or half a
    /// log segment, or [`RedbOptions::checkpoint_every`]). The in-memory index holds about
    /// three times this many rows at most: writers wait for a running checkpoint once
    /// twice this many are published.
    pub checkpoint_rows: usize,
    /// Longest time between checkpoints while anything is written (bounds the log a
    /// restart replays).
    pub checkpoint_every: Duration,
    /// Bytes of one log segment, zero-filled ahead of use.
    pub segment_bytes: u64,
    /// Told about every group made durable (for metrics; see [`crate::observe`]).
    pub commit_hook: crate::observe::CommitHook,
    /// Longest time a lazy issuer record ([`crate::LazyRecord`]) waits in the queue for a
    /// commit to ride with before it gets one of its own (see `intake.rs`). Zero commits
    /// each at once, waking the writer for it.
    pub lazy_linger: Duration,
    /// Where the store's witness lives, outside the data directory (`witness.rs`): a
    /// database that opens older than its witness is refused. None keeps no witness.
    pub witness: Option<PathBuf>,
}

/// What opening a database found in its log (see [`RedbBackend::recovery`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The newest commit the database holds after recovery.
    pub commit_seq: u64,
    /// Commits replayed from the log into the database file.
    pub replayed: u64,
    /// Whether the log ended with a torn record: a write cut by a crash before its
    /// fdatasync returned, so never acknowledged, and dropped; or an acknowledged one
    /// damaged since, which recovery cannot tell apart (see `raised_to`).
    pub torn: bool,
    /// Set when the log's tail was ambiguous (a torn record, or an end where a zeroed
    /// record would leave no trace): every lock's epoch and every namespace's mark was
    /// raised to this floor, so no token issued before it is admitted again.
    pub raised_to: Option<Epoch>,
}

/// Default of [`RedbOptions::cache_bytes`]: 16 MiB. What is hot lives in memory in front
/// of the file (the log's rows, the issuer's table); the file is read for cold keys and by
/// checkpoints, and a start's full scans leave the cache full of cold pages. 32 MiB
/// measured no faster (J1, J2, reads at 64 clients) and kept 16 MiB more resident.
pub const DEFAULT_CACHE_BYTES: usize = 16 * 1024 * 1024;
/// Default of [`RedbOptions::resident_bytes`]: 8 MiB, some 40,000 small values.
pub const DEFAULT_RESIDENT_BYTES: usize = 8 * 1024 * 1024;
/// Default of [`RedbOptions::purge_every`]: one minute.
pub const DEFAULT_PURGE_EVERY: Duration = Duration::from_secs(60);
/// Default of [`RedbOptions::checkpoint_rows`].
pub const DEFAULT_CHECKPOINT_ROWS: usize = 16_384;
/// Default of [`RedbOptions::lazy_linger`]: 10 ms. Under load a lazy record rides with
/// the next waited commit long before; with one client at a time, a J1 cycle's acquisition
/// record rides with its release's removal (one fdatasync per cycle instead of two).
pub const DEFAULT_LAZY_LINGER: Duration = Duration::from_millis(10);
/// Default of [`RedbOptions::segment_bytes`]: 16 MiB.
pub const DEFAULT_SEGMENT_BYTES: u64 = 16 * 1024 * 1024;

impl Default for RedbOptions {
    fn default() -> Self {
        RedbOptions {
            max_batch: 256,
            verify_on_open: true,
            cache_bytes: DEFAULT_CACHE_BYTES,
            resident_bytes: DEFAULT_RESIDENT_BYTES,
            limits: StoreLimits::default(),
            clock: WallClock::system(),
            purge_every: DEFAULT_PURGE_EVERY,
            checkpoint_rows: DEFAULT_CHECKPOINT_ROWS,
            checkpoint_every: Duration::from_secs(30),
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            commit_hook: crate::observe::CommitHook::default(),
            lazy_linger: DEFAULT_LAZY_LINGER,
            witness: None,
        }
    }
}

/// The embedded [`IssuerLog`] and [`FencedStore`]: a handle to one redb file and its writer thread. Cheap to
/// clone; the writer stops once the last handle is dropped (after finishing the queue),
/// or on [`FencedStore::close`].
#[derive(Clone)]
pub struct RedbBackend {
    inner: Arc<Inner>,
}

/// The lock is a std `RwLock` held only for an `Arc` clone or a `take`, never across an
/// `.await`; it exists so `close` can retire the database while other handles are alive.
struct Inner {
    state: Arc<State>,
    layers: Arc<Layers>,
    resident: Arc<RowCache>,
    /// What a refusal decided without the writer is decided with (the writer's own).
    limits: StoreLimits,
    clock: WallClock,
    recovered: RecoveryReport,
    /// `None` once closed. Readers clone the `Arc` and drop the lock at once.
    db: RwLock<Option<Arc<Database>>>,
    /// The writer's queue; closed by `close`, or when the last handle is dropped.
    intake: Arc<Intake>,
    /// The writer's seat, which a fenced write takes when the log is idle (`seat.rs`).
    desk: Arc<seat::Desk>,
    writer_exited: watch::Receiver<bool>,
    /// The store's witness, if it keeps one (`witness.rs`); let go by `close`, so the
    /// file can be opened again in this process.
    witness: Mutex<Option<Arc<witness::Witness>>>,
}

impl Drop for Inner {
    /// The last handle is gone: the writer finishes what is queued and stops.
    fn drop(&mut self) {
        self.intake.close();
    }
}

impl RedbBackend {
    /// Opens the database file at `path`, creating it if it does not exist, and starts the
    /// writer thread. A file that exists but is not a readable Palisade redb database is
    /// refused with [`StorageError::Failed`] naming it. Blocking: call it before serving,
    /// or from `spawn_blocking`.
    ///
    /// ```
    /// use palisade_storage::redb_backend::{RedbBackend, RedbOptions};
    /// use palisade_storage::FencedStore;
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
        Self::start(db, Arc::new(FsLogDir::for_db(path)), label, opts)
    }

    /// Recovers an opened database with its log and starts the engine. `label` names it
    /// in errors.
    fn start(
        db: Database,
        log: Arc<dyn LogDir>,
        label: String,
        opts: RedbOptions,
    ) -> Result<RedbBackend, StorageError> {
        let fail = |fault: Fault| fault.into_storage(&label);
        // A damaged file that passed the checks can still make redb panic on the first
        // write: that is a refusal too, never a crash.
        let now_ms = opts.clock.now_ms();
        let checked = open::guarded("prepare", || {
            open::prepare(&db, now_ms)?;
            open::recover(&db, log.as_ref())
        });
        let recovered = match checked {
            Ok(Ok(recovered)) => recovered,
            Ok(Err(fault)) | Err(fault) => {
                open::discard(db);
                return Err(fail(fault));
            }
        };
        let witness = match &opts.witness {
            Some(path) => {
                match witness::Witness::open(path, &label, recovered.seq, recovered.horizon) {
                    Ok(witness) => Some(Arc::new(witness)),
                    Err(fault) => {
                        open::discard(db);
                        return Err(fail(fault));
                    }
                }
            }
            None => None,
        };
        let db = Arc::new(db);
        let state = Arc::new(State::new(label.clone()));
        state.set_durable_seq(recovered.seq);
        state.set_checkpoint_seq(recovered.seq);
        let layers = Arc::new(Layers::default());
        let resident = Arc::new(RowCache::new(opts.resident_bytes as u64));
        let (limits, clock) = (opts.limits, opts.clock.clone());
        let config = RedbOptions {
            checkpoint_rows: opts.checkpoint_rows.max(1),
            segment_bytes: opts.segment_bytes.max(2 * wal::HEADER_BYTES),
            ..opts
        };
        let engine = Arc::new(writer::Engine {
            db: Arc::clone(&db),
            layers: Arc::clone(&layers),
            resident: Arc::clone(&resident),
            state: Arc::clone(&state),
            log,
            witness: witness.clone(),
            store_id: recovered.store_id,
            config,
            segments: Default::default(),
            spare: Default::default(),
            checkpointing: Default::default(),
        });
        writer::adopt_spare(&engine).map_err(fail)?;
        let intake = Arc::new(Intake::new(opts.lazy_linger));
        let desk = Arc::new(seat::Desk::new(&engine));
        let (exited, writer_exited) = watch::channel(false);
        let guard = ExitGuard {
            state: Arc::clone(&state),
            intake: Arc::clone(&intake),
            exited,
        };
        // Detached: `close` waits on `writer_exited`, which can be awaited, unlike a join.
        let writer_desk = Arc::clone(&desk);
        std::thread::Builder::new()
            .name("palisade-writer".to_string())
            .spawn(move || {
                writer::run(engine, &writer_desk, &guard.intake, recovered.horizon);
                drop(guard);
            })
            .map_err(|e| StorageError::Failed(format!("cannot start the writer thread: {e}")))?;
        Ok(RedbBackend {
            inner: Arc::new(Inner {
                state,
                layers,
                resident,
                limits,
                clock,
                recovered: RecoveryReport {
                    commit_seq: recovered.seq,
                    replayed: recovered.replayed,
                    torn: recovered.torn,
                    raised_to: recovered.raised_to,
                },
                db: RwLock::new(Some(db)),
                intake,
                desk,
                writer_exited,
                witness: Mutex::new(witness),
            }),
        })
    }

    /// What opening found in the log.
    pub fn recovery(&self) -> RecoveryReport {
        self.inner.recovered
    }

    /// The newest commit the database file holds (the last checkpoint's).
    pub fn checkpoint_seq(&self) -> u64 {
        self.inner.state.checkpoint_seq()
    }

    /// The newest commit (its sequence number) that is durable: every acknowledged write
    /// is at or below it. It only grows, across restarts too; the server records it beside
    /// its epoch ledger to recognise a store that came back older.
    pub fn commit_seq(&self) -> u64 {
        self.inner.state.durable_seq()
    }

    /// Records in the witness (`witness.rs`) the newest durable commit, when it moved;
    /// blocking (a small file written and fsync'd), so call it off the async threads. The
    /// server calls it about every second: a copy of the directory older than the last
    /// call is recognised at the next open. Without a witness, does nothing.
    pub fn refresh_witness(&self) -> Result<(), StorageError> {
        let witness = self
            .inner
            .witness
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(witness) = witness else {
            return Ok(());
        };
        witness
            .record(0, self.inner.state.durable_seq())
            .map_err(|fault| fault.into_storage(&self.inner.state.path))
    }

    /// Whether the backend has latched a failure (both roles share the latch).
    pub fn is_failed(&self) -> bool {
        self.inner.state.is_failed()
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
        self.submit_by(request, Intake::push)
    }

    /// Like [`RedbBackend::submit`], but a request that finds the log idle is written on
    /// the caller's thread (`seat.rs`): its answer is ready on return.
    fn submit_seated(&self, request: Request) -> Result<(), StorageError> {
        self.submit_by(request, |intake, request| {
            self.inner.desk.submit(intake, request)
        })
    }

    fn submit_by(
        &self,
        request: Request,
        push: impl FnOnce(&Intake, Request) -> Result<(), intake::Closed>,
    ) -> Result<(), StorageError> {
        let state = &self.inner.state;
        if state.is_failed() {
            return Err(state.refusal());
        }
        // Lazy records are not counted: nobody waits for them, and no fenced decision
        // reads what they write (issuer records), so they do not hold up
        // `answer_without_writing` while they wait for a commit to ride with.
        if !request.is_lazy() {
            state.submitted();
        }
        push(&self.inner.intake, request).map_err(|_| StorageError::Closed)
    }

    /// Whether a fenced write submitted now would take the writer's seat (`seat.rs`).
    #[cfg(test)]
    fn log_idle(&self) -> bool {
        self.inner.intake.seat_free() && self.inner.desk.idle()
    }

    /// The writer's answer to a request already submitted (or its refusal), as a future
    /// that owns what it needs.
    fn answer_later(
        &self,
        queued: Result<(), StorageError>,
        answer: oneshot::Receiver<Result<(), StorageError>>,
    ) -> crate::Queued {
        let this = self.clone();
        Box::pin(async move {
            queued?;
            this.answer(answer).await
        })
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

    /// The answer to `op` when the durable rows in memory already decide that it writes
    /// nothing: a refusal (a stale epoch, a failed precondition, a quota) or the replay of
    /// an idempotent retry, answered on the caller's thread by the writer's own rule
    /// ([`decide`](crate::decide())). `None`: the writer decides (a row is not in memory,
    /// the operation would commit, or a request is in flight). Only when nothing is in
    /// flight: then the durable rows are exactly what the writer would decide on, so the
    /// answer is the writer's, in the order the requests came (a caller that sends a write
    /// and, without waiting, a second one gets the second decided after the first).
    fn answer_without_writing(&self, op: &FencedOp) -> Option<Result<Applied, ApplyError>> {
        // A failed or closed store answers that, from `submit`.
        if !self.inner.state.nothing_in_flight()
            || self.inner.state.is_failed()
            || self.inner.intake.is_closed()
        {
            return None;
        }
        let resident = Resident {
            layers: &self.inner.layers,
            cache: &self.inner.resident,
        };
        let inputs = Inputs::read(&resident, op).ok()?;
        let now_ms = self.inner.clock.now_ms();
        match decide(op, &inputs.seen(), &self.inner.limits, now_ms) {
            Decision::Refuse(refused) => Some(Err(refused)),
            Decision::Replay(applied) => Some(Ok(applied)),
            Decision::Commit(_) => None,
        }
    }

    /// A point read: answered on the caller's thread when every row it needs is in
    /// memory (`resident.rs`), else run like [`RedbBackend::read`] on the blocking pool,
    /// where the rows it reads from the file are kept for the next time.
    async fn point<T, F>(&self, read: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: Fn(&dyn Point) -> Result<T, ReadError> + Send + 'static,
    {
        if self
            .inner
            .db
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
        {
            return Err(StorageError::Closed);
        }
        let resident = Resident {
            layers: &self.inner.layers,
            cache: &self.inner.resident,
        };
        match read(&resident) {
            Ok(value) => return Ok(value),
            Err(ReadError::Miss) => {}
            Err(ReadError::Fault(fault)) => return Err(self.inner.state.latch(fault)),
        }
        let cache = Arc::clone(&self.inner.resident);
        self.read(move |layers, db| {
            let view = Filling::begin(layers, db, &cache)?;
            read(&view).map_err(Fault::from)
        })
        .await
    }

    /// A read over a [`View`] (ranges), on the blocking pool.
    async fn scan<T, F>(&self, read: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&View<'_>) -> Result<T, Fault> + Send + 'static,
    {
        self.read(move |layers, db| read(&View::begin(layers, db)?))
            .await
    }

    /// Runs `read` on a fresh read transaction, on tokio's blocking pool. Reads are short,
    /// but a page-cache miss is a disk read, and a sick disk can stall one for seconds:
    /// that must tie up a blocking-pool thread, not a runtime worker serving every other
    /// connection. (The cost is one thread hand-off per read; [`RedbBackend::point`] avoids
    /// it when the rows are in memory.)
    async fn read<T, F>(&self, read: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Layers, &Database) -> Result<T, Fault> + Send + 'static,
    {
        let db = self
            .inner
            .db
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(StorageError::Closed)?;
        let layers = Arc::clone(&self.inner.layers);
        let outcome = tokio::task::spawn_blocking(move || read(&layers, &db)).await;
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
impl IssuerLog for RedbBackend {
    async fn load_issuer(&self) -> Result<IssuerState, StorageError> {
        self.scan(reads::load_issuer).await
    }

    fn reserve(
        &self,
        lock: &str,
        reservation: Reservation,
        lease: Option<LeaseRecord>,
    ) -> crate::Queued {
        let (reply, answer) = oneshot::channel();
        let queued = self.submit(Request::Reserve {
            lock: lock.to_owned(),
            reservation,
            lease,
            reply,
        });
        self.answer_later(queued, answer)
    }

    fn record_lazily(&self, record: crate::LazyRecord) {
        // A refusal (failed or closed backend) needs no answer: lazy records are optional.
        let _ = self.submit(Request::Lazy(record));
    }

    fn remove_lease(&self, lease_id: &str) -> crate::Queued {
        let (reply, answer) = oneshot::channel();
        let lease_id = lease_id.to_string();
        let queued = self.submit(Request::RemoveLease { lease_id, reply });
        self.answer_later(queued, answer)
    }

    async fn list_locks(&self, page: Page) -> Result<Vec<(String, Epoch)>, StorageError> {
        self.scan(move |txn| reads::list_locks(txn, &page)).await
    }

    async fn lock_record(&self, lock: &str) -> Result<Option<(Epoch, Reservation)>, StorageError> {
        let lock = lock.to_owned();
        self.point(move |txn| reads::lock_record(txn, &lock)).await
    }

    fn is_failed(&self) -> bool {
        RedbBackend::is_failed(self)
    }
}

#[async_trait]
impl FencedStore for RedbBackend {
    async fn apply(&self, op: FencedOp) -> Result<Applied, ApplyError> {
        if let Some(answer) = self.answer_without_writing(&op) {
            return answer;
        }
        let (reply, answer) = oneshot::channel();
        // A fenced write is submitted on a runtime worker holding no lock: it may take the
        // writer's seat (`seat.rs`).
        self.submit_seated(Request::Apply { op, reply })?;
        self.answer(answer).await
    }

    async fn get(&self, namespace: &str, key: &str) -> Result<Option<Entry>, StorageError> {
        let (namespace, key) = (namespace.to_string(), key.to_string());
        self.point(move |txn| reads::get(txn, &namespace, &key))
            .await
    }

    async fn list(&self, namespace: &str, page: Page) -> Result<Vec<String>, StorageError> {
        let namespace = namespace.to_string();
        self.scan(move |txn| reads::list(txn, &namespace, &page))
            .await
    }

    async fn high_water(&self, namespace: &str) -> Result<HighWater, StorageError> {
        let namespace = namespace.to_string();
        self.point(move |txn| reads::high_water(txn, &namespace))
            .await
    }

    async fn namespaces(&self, page: Page) -> Result<Vec<NamespaceSummary>, StorageError> {
        self.scan(move |txn| reads::namespaces(txn, &page)).await
    }

    fn is_failed(&self) -> bool {
        RedbBackend::is_failed(self)
    }

    /// Stops taking writes, lets the writer commit and answer everything already queued,
    /// waits for the writer thread to exit, and releases the file (once in-flight reads
    /// finish). Later calls on any handle answer [`StorageError::Closed`]. Idempotent.
    async fn close(&self) {
        self.inner.intake.close();
        let mut exited = self.inner.writer_exited.clone();
        // An error means the writer's side is gone, which also means it has exited.
        let _ = exited.wait_for(|done| *done).await;
        let witness = self
            .inner
            .witness
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(witness) = witness {
            // Every commit is durable now: after a graceful stop, any older copy is seen.
            let seq = self.inner.state.durable_seq();
            let recorded = tokio::task::spawn_blocking(move || witness.record(0, seq)).await;
            if let Ok(Err(fault)) = recorded {
                tracing::warn!(error = %fault.0, "could not record the last commit in the witness");
            }
        }
        drop(
            self.inner
                .db
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
    }
}
