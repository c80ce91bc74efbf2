//! The three threads of the engine: writer, syncer, checkpointer.
//!
//! - The **writer** blocks until a request somebody waits for is queued (or a lazy
//!   record's linger is over, see `intake.rs`), takes what is queued (up to `max_batch`,
//!   in order, lazy records included), computes the batch's rows ([`Tx`]), appends them
//!   to the log as one record (one `pwrite`, no fsync; before a record that would hold an
//!   epoch above the epoch horizon, the horizon is raised durably: `horizon.rs`). A batch alone (no other waited
//!   request queued, the syncer idle) it then completes itself; otherwise it hands the record, its rows and its
//!   answers to the syncer and takes the next batch at once: its rows are computed while
//!   the syncer's fdatasync of the previous record runs (pipelined group commit). The
//!   choice and the completion are in `sync.rs`.
//! - The **syncer** takes every record handed over so far, fdatasyncs the log once, then
//!   publishes their rows to readers ([`Layers::published`]) and only then answers, in
//!   order. A batch that wrote nothing (only refusals and replays) is answered in its turn
//!   too, after every record before it is durable: its answers were decided on that state.
//! - The **checkpointer** writes published rows into the database file in the background
//!   (one durable redb transaction, with the sequence number it covers) and deletes the log
//!   segments that are then redundant; it also prepares the next zero-filled segment.
//!
//! A [`Fault`] anywhere (a write, an fdatasync, a checkpoint) latches the backend failed:
//! every answer not yet sent becomes [`StorageError::Failed`] (none of them is known to be
//! durable), and every later request is refused at once.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

use redb::{Database, Durability};
use tokio::sync::oneshot;

use palisade_core::lock_table::Reservation;
use palisade_token::Epoch;

use super::horizon::{self, HORIZON_STEP};
use super::intake::{Intake, Next};
use super::layers::{apply_rows, Layers, View};
use super::overlay::{self, encode, Key, Rows, Val};
use super::resident::RowCache;
use super::schema::{Fault, META_CHECKPOINT_SEQ};
use super::seat::Desk;
use super::spare::Spare;
use super::state::State;
use super::sync::sync_loop;
use super::tx::Tx;
use super::wal::{self, LogDir, LogFile, HEADER_BYTES, RECORD_OVERHEAD};
use super::RedbOptions;
use crate::{Applied, ApplyError, FencedOp, LazyRecord, LeaseRecord, StorageError};

/// One unit of work for the writer, with the channel its answer goes back on.
pub(super) enum Request {
    Apply {
        op: FencedOp,
        reply: oneshot::Sender<Result<Applied, ApplyError>>,
    },
    RemoveLease {
        lease_id: String,
        reply: oneshot::Sender<Result<(), StorageError>>,
    },
    Reserve {
        lock: String,
        reservation: Reservation,
        lease: Option<LeaseRecord>,
        reply: oneshot::Sender<Result<(), StorageError>>,
    },
    /// Written with the batch; nobody waits for it.
    Lazy(LazyRecord),
}

impl Request {
    /// Whether nobody waits for it (a lazy issuer record): it does not wake the writer
    /// (`intake.rs`) and is not counted in flight (`State::submitted`).
    pub(super) fn is_lazy(&self) -> bool {
        matches!(self, Request::Lazy(_))
    }

    pub(super) fn fail(self, err: StorageError) {
        // A caller that stopped waiting has nobody to tell: ignore closed reply channels.
        match self {
            Request::Apply { reply, .. } => drop(reply.send(Err(err.into()))),
            Request::RemoveLease { reply, .. } | Request::Reserve { reply, .. } => {
                drop(reply.send(Err(err)))
            }
            Request::Lazy(_) => {}
        }
    }
}

/// A request's answer, held until its batch is durable.
pub(super) enum Answer {
    Apply(
        oneshot::Sender<Result<Applied, ApplyError>>,
        Result<Applied, ApplyError>,
    ),
    Unit(oneshot::Sender<Result<(), StorageError>>),
    Nobody,
}

impl Answer {
    pub(super) fn send(self) {
        match self {
            Answer::Apply(reply, outcome) => drop(reply.send(outcome)),
            Answer::Unit(reply) => drop(reply.send(Ok(()))),
            Answer::Nobody => {}
        }
    }

    pub(super) fn fail(self, err: StorageError) {
        match self {
            Answer::Apply(reply, _) => drop(reply.send(Err(err.into()))),
            Answer::Unit(reply) => drop(reply.send(Err(err))),
            Answer::Nobody => {}
        }
    }
}

/// Most expired idempotency records one purge removes, so that a purge after a long
/// downtime does not make one huge batch: the rest goes in the next passes.
pub(super) const PURGE_LIMIT: usize = 10_000;

/// What the three threads share.
pub(super) struct Engine {
    pub db: Arc<Database>,
    pub layers: Arc<Layers>,
    /// Rows read from the file; a checkpoint forgets what it wrote.
    pub resident: Arc<RowCache>,
    pub state: Arc<State>,
    pub log: Arc<dyn LogDir>,
    /// Raised before the horizon, when the store keeps one (`witness.rs`).
    pub witness: Option<Arc<super::witness::Witness>>,
    pub store_id: u128,
    /// How the engine runs: the store's options, bounds applied (see `RedbBackend::open`).
    pub config: RedbOptions,
    /// Log segments in order: (base sequence number, file name).
    pub segments: Mutex<Vec<(u64, String)>>,
    /// A prepared zero-filled segment, if any (`spare.rs`).
    pub spare: Spare,
    /// Whether a checkpoint runs; the syncer waits on it when rows pile up.
    pub checkpointing: (Mutex<bool>, Condvar),
}

/// The segment the writer appends to.
pub(super) struct Segment {
    pub file: Arc<dyn LogFile>,
    pub offset: u64,
    pub size: u64,
}

/// A batch on its way to durability.
pub(super) struct Flight {
    /// The record's file, when the batch wrote one.
    pub record: Option<(u64, Arc<dyn LogFile>, Arc<Rows>)>,
    pub answers: Vec<Answer>,
    pub ops: usize,
    pub max_epoch: u64,
}

pub(super) enum Chore {
    Checkpoint { seq: u64, rows: Arc<Rows> },
    PrepareSpare,
}

/// The writer thread. Returns when every sender of the queue is gone and the queue is
/// empty; dropping its channel to the syncer then stops the syncer.
/// `horizon` is the epoch horizon recovery left on disk. The first segment is started by
/// the first record: a segment with a header and no record is, to recovery, a log whose
/// first record may have been zeroed whole (`open.rs`).
/// The writer holds the seat (`seat.rs`) from the start until it is set up; from then on
/// it takes batches like any other holder of the seat.
pub(super) fn run(engine: Arc<Engine>, desk: &Desk, intake: &Intake, horizon: Epoch) {
    let engine = &engine;
    let handoff = desk.handoff();
    let (to_checkpointer, chores) = std::sync::mpsc::channel::<Chore>();
    let syncer = {
        let engine = Arc::clone(engine);
        let handoff = Arc::clone(handoff);
        let chores = to_checkpointer.clone();
        std::thread::Builder::new()
            .name("palisade-syncer".into())
            .spawn(move || sync_loop(&engine, &handoff, &chores))
    };
    let checkpointer = {
        let engine = Arc::clone(engine);
        std::thread::Builder::new()
            .name("palisade-checkpointer".into())
            .spawn(move || checkpoint_loop(&engine, &chores))
    };
    let (Ok(syncer), Ok(checkpointer)) = (syncer, checkpointer) else {
        let err = engine
            .state
            .latch(Fault("cannot start the engine's threads".into()));
        for request in intake.abandon() {
            request.fail(err.clone());
        }
        return;
    };
    let _ = to_checkpointer.send(Chore::PrepareSpare);
    let writer = Writer {
        engine: Arc::clone(engine),
        pending: Rows::new(),
        pending_at: HashMap::new(),
        inflight: Vec::new(),
        next_seq: engine.state.durable_seq() + 1,
        horizon,
        to_checkpointer,
    };
    desk.install(writer);
    intake.leave_seat();
    let max_batch = engine.config.max_batch.max(1);
    loop {
        let Next::Batch(batch) = intake.next(desk.next_purge(), max_batch) else {
            break;
        };
        // Leaves the seat on the way.
        desk.step(batch, intake);
    }
    handoff.close();
    let _ = syncer.join();
    // Its channel to the checkpointer goes with it: the checkpointer stops.
    drop(desk.uninstall());
    let _ = checkpointer.join();
    remove_segments_after_close(engine);
}

/// After a clean close everything is in the database file: the segments go (the spare
/// stays, for the next start).
fn remove_segments_after_close(engine: &Engine) {
    let everything_in_file = !engine.state.is_failed()
        && engine.state.checkpoint_seq() == engine.state.durable_seq()
        && engine.layers.published_len() == 0
        && engine.layers.frozen().is_none();
    if !everything_in_file {
        return;
    }
    let segments = std::mem::take(
        &mut *engine
            .segments
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    for (_, name) in segments {
        if let Err(e) = engine.log.remove(&name) {
            tracing::warn!(file = %engine.log.describe(&name), error = %e, "cannot remove a log segment");
        }
    }
    let _ = engine.log.sync();
}

/// The writer's own state: what it appended and is not yet durable, and where the log
/// goes on. Kept in the seat (`seat.rs`) by whichever thread holds it.
pub(super) struct Writer {
    engine: Arc<Engine>,
    /// Rows of records not yet known to be durable, newest value per key.
    pending: Rows,
    /// For each key in `pending`, the record that wrote it last.
    pending_at: HashMap<Key, u64>,
    /// (record, keys) not yet known to be durable, oldest first.
    inflight: Vec<(u64, Vec<Key>)>,
    next_seq: u64,
    /// The epoch horizon as durably recorded (see `horizon.rs`).
    horizon: Epoch,
    to_checkpointer: Sender<Chore>,
}

pub(super) type Failed = (Fault, Vec<Answer>, Vec<Request>);

impl Writer {
    pub(super) fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Where checkpoints and spare segments are asked for.
    pub(super) fn chores(&self) -> &Sender<Chore> {
        &self.to_checkpointer
    }

    /// Forgets rows that the syncer has published since.
    fn prune(&mut self) {
        let durable = self.engine.state.durable_seq();
        let done = self
            .inflight
            .iter()
            .take_while(|(seq, _)| *seq <= durable)
            .count();
        for (seq, keys) in self.inflight.drain(..done) {
            for key in keys {
                if self.pending_at.get(&key) == Some(&seq) {
                    self.pending_at.remove(&key);
                    self.pending.remove(&key);
                }
            }
        }
    }

    pub(super) fn batch(
        &mut self,
        batch: Vec<Request>,
        purge: bool,
        segment: &mut Option<Segment>,
    ) -> Result<(Flight, usize), Failed> {
        self.prune();
        let engine = Arc::clone(&self.engine);
        // Lazy records are not counted (see `State::submitted`).
        let ops = batch.iter().filter(|r| !r.is_lazy()).count();
        let mut answers = Vec::with_capacity(batch.len());
        let view = match View::begin(&engine.layers, &engine.db) {
            Ok(view) => view,
            Err(fault) => return Err((fault, answers, batch)),
        };
        let now_ms = engine.config.clock.now_ms();
        let mut tx = Tx::new(&view, &self.pending);
        let mut requests = batch.into_iter();
        while let Some(request) = requests.next() {
            let done = match &request {
                Request::Apply { op, .. } => tx.apply(op, &engine.config.limits, now_ms).map(Some),
                Request::Reserve {
                    lock,
                    reservation,
                    lease,
                    ..
                } => tx
                    .reserve(lock, *reservation, lease.as_ref())
                    .map(|()| None),
                Request::RemoveLease { lease_id, .. } => {
                    tx.remove_lease(lease_id);
                    Ok(None)
                }
                Request::Lazy(record) => tx.write_lazy(record).map(|()| None),
            };
            match (done, request) {
                (Ok(Some(outcome)), Request::Apply { reply, .. }) => {
                    answers.push(Answer::Apply(reply, outcome))
                }
                (Ok(_), Request::Reserve { reply, .. } | Request::RemoveLease { reply, .. }) => {
                    answers.push(Answer::Unit(reply))
                }
                (Ok(_), _) => answers.push(Answer::Nobody),
                (Err(fault), request) => {
                    let mut rest = vec![request];
                    rest.extend(requests);
                    return Err((fault, answers, rest));
                }
            }
        }
        let purged = if purge {
            match tx.purge_expired(
                &engine.config.limits,
                engine.config.clock.now_ms(),
                PURGE_LIMIT,
            ) {
                Ok(n) => n,
                Err(fault) => return Err((fault, answers, Vec::new())),
            }
        } else {
            0
        };
        tx.finish();
        let max_epoch = tx.max_epoch;
        let rows = std::mem::take(&mut tx.rows);
        drop(tx);
        drop(view);
        if rows.is_empty() {
            let flight = Flight {
                record: None,
                answers,
                ops,
                max_epoch,
            };
            return Ok((flight, purged));
        }
        if max_epoch >= self.horizon {
            // Every record's epochs are below the horizon durable before it (horizon.rs).
            let next = max_epoch.saturating_add(HORIZON_STEP);
            // The witness first: it bounds every epoch ever written, the horizon only
            // those of this directory's log.
            if let Some(witness) = &engine.witness {
                let seq = engine.state.durable_seq();
                if let Err(fault) = witness.record(next, seq) {
                    return Err((fault, answers, Vec::new()));
                }
            }
            if let Err(fault) = horizon::store(engine.log.as_ref(), next) {
                return Err((fault, answers, Vec::new()));
            }
            self.horizon = next;
        }
        let seq = self.next_seq;
        let file = match self.append(seq, &rows, segment) {
            Ok(file) => file,
            Err(fault) => return Err((fault, answers, Vec::new())),
        };
        self.next_seq += 1;
        let keys: Vec<Key> = rows.keys().cloned().collect();
        for key in &keys {
            self.pending_at.insert(key.clone(), seq);
        }
        self.pending
            .extend(rows.iter().map(|(k, v)| (k.clone(), v.clone())));
        self.inflight.push((seq, keys));
        let flight = Flight {
            record: Some((seq, file, Arc::new(rows))),
            answers,
            ops,
            max_epoch,
        };
        Ok((flight, purged))
    }

    /// Writes record `seq` at the end of the log (rolling to a new segment when it does
    /// not fit); returns the file it went to. No fsync: that is the syncer's.
    fn append(
        &mut self,
        seq: u64,
        rows: &Rows,
        segment: &mut Option<Segment>,
    ) -> Result<Arc<dyn LogFile>, Fault> {
        let mut payload = Vec::new();
        encode(rows.iter(), &mut payload);
        let len = payload.len() as u64 + RECORD_OVERHEAD;
        // Room for a byte of padding too.
        let current = match segment.take() {
            Some(current) if current.offset + len < current.size => current,
            _ => self.roll(seq, len + 1)?,
        };
        let segment = segment.insert(current);
        // No record ends on a sector boundary: then a log that does end on one has lost a
        // record a zeroed sector took away whole, and recovery knows it (`open.rs`).
        if (segment.offset + len) % wal::SECTOR == 0 {
            overlay::pad(&mut payload);
        }
        let mut record = Vec::with_capacity(payload.len() + RECORD_OVERHEAD as usize);
        wal::encode_record(seq, &mut payload, &mut record);
        let len = record.len() as u64;
        segment
            .file
            .write_at(segment.offset, &record)
            .map_err(|e| Fault(format!("cannot append to the log: {e}")))?;
        segment.offset += len;
        self.engine.state.add_log_bytes(len);
        Ok(Arc::clone(&segment.file))
    }

    /// Starts a new segment whose first record is `base`, and asks for the next spare.
    fn roll(&mut self, base: u64, need: u64) -> Result<Segment, Fault> {
        let segment = start_segment(&self.engine, base, need)?;
        let _ = self.to_checkpointer.send(Chore::PrepareSpare);
        Ok(segment)
    }
}

/// Starts a new segment whose first record is `base`: the prepared spare, or a new file
/// when there is none or the record needs more room than a segment has.
fn start_segment(engine: &Engine, base: u64, need: u64) -> Result<Segment, Fault> {
    let io = |e: std::io::Error| Fault(format!("cannot start a log segment: {e}"));
    let size = if HEADER_BYTES + need <= engine.config.segment_bytes {
        engine.config.segment_bytes
    } else {
        (HEADER_BYTES + need).next_multiple_of(1 << 20)
    };
    let name = wal::segment_name(engine.log.stem(), base);
    // The header says which records the file holds; recovery reads it, not the name, so
    // the rename needs no fsync of its own before the first record is acknowledged.
    let header = wal::encode_header(engine.store_id, base);
    let spare = if size == engine.config.segment_bytes {
        engine
            .spare
            .take_as(engine.log.as_ref(), &name, &header)
            .map_err(io)?
    } else {
        None
    };
    let file = match spare {
        Some(file) => file,
        // Made under its own name, not the spare's.
        None => {
            let file = engine.log.create_zeroed(&name, size).map_err(io)?;
            file.write_at(0, &header).map_err(io)?;
            file
        }
    };
    engine
        .segments
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((base, name));
    Ok(Segment {
        file,
        offset: HEADER_BYTES,
        size,
    })
}

/// Takes a spare left by the last run (all zeros) for the first segment of this one, if it
/// has the configured size; otherwise prepares one, so that the first write does not
/// wait for a segment to be zero-filled.
pub(super) fn adopt_spare(engine: &Engine) -> Result<(), Fault> {
    engine
        .spare
        .adopt(engine.log.as_ref(), engine.config.segment_bytes)
        .map_err(|e| Fault(format!("cannot prepare the spare log segment: {e}")))
}

pub(super) fn maybe_checkpoint(engine: &Engine, chores: &Sender<Chore>, last: &mut Instant) {
    let rows = engine.layers.published_len();
    if rows == 0 {
        return;
    }
    let due = rows >= engine.config.checkpoint_rows
        || engine.state.log_bytes() >= engine.config.segment_bytes / 2
        || last.elapsed() >= engine.config.checkpoint_every;
    if !due {
        return;
    }
    {
        let mut running = engine
            .checkpointing
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *running {
            return;
        }
        *running = true;
    }
    if let Some((seq, rows)) = freeze(engine) {
        *last = Instant::now();
        let _ = chores.send(Chore::Checkpoint { seq, rows });
    } else {
        finish_checkpoint(engine);
    }
}

/// Moves the published rows into the frozen layer (none may be frozen already); returns
/// them with the sequence number they cover.
pub(super) fn freeze(engine: &Engine) -> Option<(u64, Arc<Rows>)> {
    let mut published = engine
        .layers
        .published
        .write()
        .unwrap_or_else(PoisonError::into_inner);
    let mut frozen = engine
        .layers
        .frozen
        .write()
        .unwrap_or_else(PoisonError::into_inner);
    if published.is_empty() || frozen.is_some() {
        return None;
    }
    let rows = Arc::new(std::mem::take(&mut *published));
    *frozen = Some(Arc::clone(&rows));
    engine.state.reset_log_bytes();
    Some((engine.state.durable_seq(), rows))
}

pub(super) fn finish_checkpoint(engine: &Engine) {
    let (running, done) = &engine.checkpointing;
    *running.lock().unwrap_or_else(PoisonError::into_inner) = false;
    done.notify_all();
}

fn checkpoint_loop(engine: &Engine, chores: &Receiver<Chore>) {
    while let Ok(chore) = chores.recv() {
        if engine.state.is_failed() {
            finish_checkpoint(engine);
            continue;
        }
        match chore {
            Chore::Checkpoint { seq, rows } => {
                let mut next = Some((seq, rows));
                while let Some((seq, rows)) = next.take() {
                    // redb asserts on what it reads; a file damaged under a running server
                    // must latch the failure, not kill this thread with writers waiting.
                    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        checkpoint(engine, seq, &rows)
                    }))
                    .unwrap_or_else(|_| Err(Fault("the checkpoint panicked".into())));
                    if let Err(fault) = done {
                        engine.state.latch(fault);
                        break;
                    }
                    // Rows that piled up meanwhile go at once, not at the next publish.
                    if engine.layers.published_len() >= engine.config.checkpoint_rows {
                        next = freeze(engine);
                    }
                }
                finish_checkpoint(engine);
            }
            Chore::PrepareSpare => {
                // The spare only saves the next roll the time to create and zero a
                // segment; without one, the roll creates it (and fails the store if it
                // cannot). So a spare that cannot be made now (no file descriptor left,
                // say) is no reason to stop the store: it is tried again at the next roll.
                if let Err(fault) = prepare_spare(engine) {
                    tracing::warn!(error = %fault.0, "could not prepare a spare log segment; the next one will be created when needed");
                }
            }
        }
    }
}

/// Writes `rows` (every durable row up to record `seq` not yet in the file) into the file
/// in one durable transaction, then drops the frozen layer and the segments it made
/// redundant.
pub(super) fn checkpoint(engine: &Engine, seq: u64, rows: &Rows) -> Result<(), Fault> {
    write_checkpoint(&engine.db, seq, rows)?;
    // Before the frozen layer goes, so that no cached row older than the file is left
    // (resident.rs).
    engine.resident.checkpointed(rows.keys());
    engine.layers.drop_frozen();
    engine.state.set_checkpoint_seq(seq);
    let mut segments = engine
        .segments
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    // A segment is redundant when the next one starts at or below `seq + 1`: all its
    // records are in the file now. The last segment stays (the writer appends to it).
    let mut keep = segments.len().saturating_sub(1);
    for i in 0..segments.len().saturating_sub(1) {
        if segments[i + 1].0 > seq + 1 {
            keep = i;
            break;
        }
    }
    let gone: Vec<(u64, String)> = segments.drain(..keep).collect();
    drop(segments);
    for (_, name) in &gone {
        engine
            .log
            .remove(name)
            .map_err(|e| Fault(format!("cannot remove {}: {e}", engine.log.describe(name))))?;
    }
    Ok(())
}

/// One durable redb transaction: `rows`, and the sequence number they bring the file to.
pub(super) fn write_checkpoint(db: &Database, seq: u64, rows: &Rows) -> Result<(), Fault> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate);
    // Two-phase: damage to the newest checkpoint is an error at open, never a silent
    // fallback to the one before (the log that held its rows may be gone by then).
    txn.set_two_phase_commit(true);
    let checkpoint = (
        Key::Meta(META_CHECKPOINT_SEQ.to_owned()),
        Some(Val::U64(seq)),
    );
    apply_rows(
        &txn,
        rows.iter()
            .chain(std::iter::once((&checkpoint.0, &checkpoint.1))),
    )?;
    txn.commit()?;
    Ok(())
}

fn prepare_spare(engine: &Engine) -> Result<(), Fault> {
    let name = wal::spare_name(engine.log.stem());
    engine
        .spare
        .prepare(engine.log.as_ref(), engine.config.segment_bytes)
        .map_err(|e| {
            Fault(format!(
                "cannot prepare {}: {e}",
                engine.log.describe(&name)
            ))
        })
}
