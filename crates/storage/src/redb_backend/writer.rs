//! The writer thread: the only code that opens write transactions.
//!
//! It blocks for one request, drains whatever else is already queued (up to
//! `max_batch`), applies the batch in order inside one write transaction, commits once with
//! `Durability::Immediate` (and two-phase commit) and only then answers. Each request sees the effects of the
//! ones before it in the batch, exactly as if they had been committed one by one.
//!
//! A request that is refused (gate, precondition, not found, idempotency conflict) returns
//! before its first write, so sharing the transaction with others cannot leak any part of
//! it. A [`Fault`] anywhere aborts the whole transaction: every request of the batch is
//! answered [`StorageError::Failed`] (none of them is durable) and the backend latches.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::{Database, Durability, ReadableTable, Table, WriteTransaction};
use tokio::sync::oneshot;

use palisade_core::gate::HighWater;

use palisade_core::lock_table::Reservation;

use super::schema::{
    Fault, IdemRecord, EPOCHS, FENCES, IDEMPOTENCY, IDEM_EXPIRY, KV, LEASES, META,
    META_RESTORE_FLOOR, META_REVISION, RESERVATIONS, USAGE,
};
use super::state::State;
use crate::decide::Change;
use crate::{
    decide, Action, Applied, ApplyError, Decision, FencedOp, KeyState, LazyRecord, LeaseRecord,
    Seen, StorageError, StoreLimits, Usage, WallClock,
};

/// One unit of work for the writer, with the channel its answer goes back on.
pub(super) enum Request {
    Apply {
        op: FencedOp,
        reply: oneshot::Sender<Result<Applied, ApplyError>>,
    },
    Grant {
        lease: LeaseRecord,
        reply: oneshot::Sender<Result<(), StorageError>>,
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
    fn fail(self, err: StorageError) {
        // A caller that stopped waiting has nobody to tell: ignore closed reply channels.
        match self {
            Request::Apply { reply, .. } => drop(reply.send(Err(err.into()))),
            Request::Grant { reply, .. }
            | Request::RemoveLease { reply, .. }
            | Request::Reserve { reply, .. } => drop(reply.send(Err(err))),
            Request::Lazy(_) => {}
        }
    }
}

/// A request whose effect sits in the open transaction, waiting for the commit.
enum Answer {
    Apply(
        oneshot::Sender<Result<Applied, ApplyError>>,
        Result<Applied, ApplyError>,
    ),
    Unit(oneshot::Sender<Result<(), StorageError>>),
    Nobody,
}

impl Answer {
    fn send(self) {
        match self {
            Answer::Apply(reply, outcome) => drop(reply.send(outcome)),
            Answer::Unit(reply) => drop(reply.send(Ok(()))),
            Answer::Nobody => {}
        }
    }

    fn fail(self, err: StorageError) {
        match self {
            Answer::Apply(reply, _) => drop(reply.send(Err(err.into()))),
            Answer::Unit(reply) => drop(reply.send(Err(err))),
            Answer::Nobody => {}
        }
    }
}

/// What the writer is told at start.
pub(super) struct WriterConfig {
    pub max_batch: usize,
    pub two_phase: bool,
    pub limits: StoreLimits,
    pub clock: WallClock,
    /// How often expired idempotency records are purged.
    pub purge_every: Duration,
    /// Told about each commit (metrics).
    pub commit_hook: crate::observe::CommitHook,
}

/// Runs until every sender of the queue is gone and the queue is empty. Between batches,
/// and when idle, it purges expired idempotency records every `purge_every`.
pub(super) fn run(
    db: Arc<Database>,
    queue: Receiver<Request>,
    state: Arc<State>,
    config: WriterConfig,
) {
    let max_batch = config.max_batch.max(1);
    let mut next_purge = Instant::now() + config.purge_every;
    loop {
        let wait = next_purge.saturating_duration_since(Instant::now());
        let first = match queue.recv_timeout(wait) {
            Ok(request) => Some(request),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if let Some(first) = first {
            let mut batch = Vec::with_capacity(max_batch.min(64));
            batch.push(first);
            while batch.len() < max_batch {
                match queue.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            if state.is_failed() {
                for request in batch {
                    request.fail(state.refusal());
                }
                continue;
            }
            commit_batch(&db, batch, &state, &config);
        }
        if Instant::now() >= next_purge && !state.is_failed() {
            next_purge = Instant::now() + config.purge_every;
            match purge_expired(&db, &config.limits, config.clock.now_ms()) {
                // A full pass: more may be due; go again after the next batch.
                Ok(PURGE_LIMIT) => next_purge = Instant::now(),
                Ok(removed) => {
                    if removed > 0 {
                        tracing::debug!(removed, "purged expired idempotency records");
                    }
                }
                Err(fault) => {
                    state.latch(fault);
                }
            }
        }
    }
}

fn commit_batch(db: &Database, batch: Vec<Request>, state: &State, config: &WriterConfig) {
    let size = batch.len();
    let mut answers = Vec::with_capacity(size);
    let mut pending = batch.into_iter();
    let mut failed_request = None;
    match apply_batch(db, config, &mut pending, &mut answers, &mut failed_request) {
        Ok(max_epoch) => {
            state.record_commit(size, max_epoch);
            for answer in answers {
                answer.send();
            }
        }
        Err(fault) => {
            // Dropping the transaction (on the way out of `apply_batch`) aborted it.
            let err = state.latch(fault);
            let requests = failed_request.into_iter().chain(pending);
            for answer in answers {
                answer.fail(err.clone());
            }
            for request in requests {
                request.fail(err.clone());
            }
        }
    }
}

/// Applies requests taken from `pending` in one transaction and commits it; returns the
/// highest epoch written into an epoch counter. On a fault the request being applied is
/// left in `failed`; the ones not reached stay in `pending`.
fn apply_batch(
    db: &Database,
    config: &WriterConfig,
    pending: &mut impl Iterator<Item = Request>,
    answers: &mut Vec<Answer>,
    failed: &mut Option<Request>,
) -> Result<u64, Fault> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate);
    // See `RedbOptions::two_phase_commit`.
    txn.set_two_phase_commit(config.two_phase);
    // One reading of the wall clock for the batch: its operations share one commit.
    let now_ms = config.clock.now_ms();
    let max_epoch;
    {
        let mut tables = Tables::open(&txn)?;
        for request in pending.by_ref() {
            match execute(&mut tables, request, &config.limits, now_ms) {
                Ok(answer) => answers.push(answer),
                Err(fault_and_request) => {
                    let (fault, request) = *fault_and_request;
                    *failed = Some(request);
                    return Err(fault);
                }
            }
        }
        tables.finish()?;
        max_epoch = tables.max_epoch;
    }
    let sync = Instant::now();
    txn.commit()?;
    config.commit_hook.committed(answers.len(), sync.elapsed());
    Ok(max_epoch)
}

/// The tables of one write transaction.
struct Tables<'txn> {
    epochs: Table<'txn, &'static str, u64>,
    reservations: Table<'txn, &'static str, (u64, u64, u64)>,
    leases: Table<'txn, &'static str, &'static str>,
    fences: Table<'txn, &'static str, (u64, u64)>,
    kv: Table<'txn, (&'static str, &'static str), (u64, u64, &'static [u8])>,
    meta: Table<'txn, &'static str, u64>,
    idempotency: Table<'txn, (&'static str, &'static str), &'static str>,
    idem_expiry: Table<'txn, (u64, &'static str, &'static str), ()>,
    usage: Table<'txn, &'static str, (u64, u64)>,
    /// The store revision as this transaction has moved it: read at the first write that
    /// needs it, kept here and written back once, by [`Tables::finish`], instead of a read
    /// and a write of the meta table per operation.
    revision: Option<u64>,
    revision_dirty: bool,
    /// Highest epoch written into `epochs` by this transaction.
    max_epoch: u64,
}

impl<'txn> Tables<'txn> {
    fn open(txn: &'txn WriteTransaction) -> Result<Self, Fault> {
        Ok(Tables {
            epochs: txn.open_table(EPOCHS)?,
            reservations: txn.open_table(RESERVATIONS)?,
            leases: txn.open_table(LEASES)?,
            fences: txn.open_table(FENCES)?,
            kv: txn.open_table(KV)?,
            meta: txn.open_table(META)?,
            idempotency: txn.open_table(IDEMPOTENCY)?,
            idem_expiry: txn.open_table(IDEM_EXPIRY)?,
            usage: txn.open_table(USAGE)?,
            revision: None,
            revision_dirty: false,
            max_epoch: 0,
        })
    }

    /// The store's current revision, as of the operations applied so far.
    fn revision(&mut self) -> Result<u64, Fault> {
        if let Some(revision) = self.revision {
            return Ok(revision);
        }
        let revision = self.meta.get(META_REVISION)?.map_or(0, |g| g.value());
        self.revision = Some(revision);
        Ok(revision)
    }

    /// Takes the next revision for a write.
    fn bump_revision(&mut self) -> Result<u64, Fault> {
        let next = next_revision(self.revision()?)?;
        self.revision = Some(next);
        self.revision_dirty = true;
        Ok(next)
    }

    fn set_epoch(&mut self, lock: &str, epoch: u64) -> Result<(), Fault> {
        self.epochs.insert(lock, epoch)?;
        self.max_epoch = self.max_epoch.max(epoch);
        Ok(())
    }

    /// Writes what was kept in memory during the batch. Called once, before the commit.
    fn finish(&mut self) -> Result<(), Fault> {
        if self.revision_dirty {
            if let Some(revision) = self.revision {
                self.meta.insert(META_REVISION, revision)?;
            }
        }
        Ok(())
    }
}

/// Applies one request. On a fault the request comes back (boxed: faults are rare and a
/// request is large) so that it can be answered with the batch's error.
fn execute(
    t: &mut Tables<'_>,
    request: Request,
    limits: &StoreLimits,
    now_ms: u64,
) -> Result<Answer, Box<(Fault, Request)>> {
    match request {
        Request::Apply { op, reply } => match apply_op(t, &op, limits, now_ms) {
            Ok(outcome) => Ok(Answer::Apply(reply, outcome)),
            Err(fault) => Err(Box::new((fault, Request::Apply { op, reply }))),
        },
        Request::Grant { lease, reply } => match record_grant(t, &lease) {
            Ok(()) => Ok(Answer::Unit(reply)),
            Err(fault) => Err(Box::new((fault, Request::Grant { lease, reply }))),
        },
        Request::Reserve {
            lock,
            reservation,
            lease,
            reply,
        } => match reserve(t, &lock, reservation, lease.as_ref()) {
            Ok(()) => Ok(Answer::Unit(reply)),
            Err(fault) => Err(Box::new((
                fault,
                Request::Reserve {
                    lock,
                    reservation,
                    lease,
                    reply,
                },
            ))),
        },
        Request::Lazy(record) => match write_lazy(t, &record) {
            Ok(()) => Ok(Answer::Nobody),
            Err(fault) => Err(Box::new((fault, Request::Lazy(record)))),
        },
        Request::RemoveLease { lease_id, reply } => match t.leases.remove(lease_id.as_str()) {
            Ok(_) => Ok(Answer::Unit(reply)),
            Err(e) => Err(Box::new((
                e.into(),
                Request::RemoveLease { lease_id, reply },
            ))),
        },
    }
}

fn record_grant(t: &mut Tables<'_>, lease: &LeaseRecord) -> Result<(), Fault> {
    let last = t.epochs.get(lease.lock.as_str())?.map(|g| g.value());
    let epoch = last.map_or(lease.epoch, |last| last.max(lease.epoch));
    t.set_epoch(lease.lock.as_str(), epoch)?;
    let record = serde_json::to_string(lease)?;
    t.leases.insert(lease.lease_id.as_str(), record.as_str())?;
    Ok(())
}

/// Records the lock's reservation and the lease. The ceiling never goes down. The TTL
/// never goes down while the reservation stays active; an inactive reservation (the lock
/// fell idle) has no live lease to cover, so its TTL is what it says (0), and the next
/// active one starts from its own.
fn reserve(
    t: &mut Tables<'_>,
    lock: &str,
    r: Reservation,
    lease: Option<&LeaseRecord>,
) -> Result<(), Fault> {
    let stored = t.reservations.get(lock)?.map(|g| g.value());
    let (ceiling, max_ttl) = stored.map_or((r.ceiling, r.max_ttl_ms), |(c, m, active)| {
        let still_active = active != 0 && r.active;
        let ttl = if still_active {
            m.max(r.max_ttl_ms)
        } else {
            r.max_ttl_ms
        };
        (c.max(r.ceiling), ttl)
    });
    t.reservations
        .insert(lock, (ceiling, max_ttl, u64::from(r.active)))?;
    let last = t.epochs.get(lock)?.map_or(0, |g| g.value());
    t.set_epoch(lock, last.max(ceiling))?;
    if let Some(lease) = lease {
        let record = serde_json::to_string(lease)?;
        t.leases.insert(lease.lease_id.as_str(), record.as_str())?;
    }
    Ok(())
}

fn write_lazy(t: &mut Tables<'_>, record: &LazyRecord) -> Result<(), Fault> {
    match record {
        LazyRecord::Lease(lease) => {
            let text = serde_json::to_string(lease)?;
            t.leases.insert(lease.lease_id.as_str(), text.as_str())?;
        }
        LazyRecord::RemoveLease(id) => {
            t.leases.remove(id.as_str())?;
        }
        LazyRecord::Reservation { lock, reservation } => reserve(t, lock, *reservation, None)?,
    }
    Ok(())
}

/// Reads what [`decide`] needs, then writes exactly what it decided. A refusal returns
/// before the first write, so it leaves nothing in the batch's transaction. `Err(Fault)`
/// aborts the batch.
fn apply_op(
    t: &mut Tables<'_>,
    op: &FencedOp,
    limits: &StoreLimits,
    now_ms: u64,
) -> Result<Result<Applied, ApplyError>, Fault> {
    let ns = op.namespace.as_str();
    let stored_idem: Option<IdemRecord> = match &op.idempotency {
        Some(idem) => match t.idempotency.get((ns, idem.key.as_str()))? {
            Some(stored) => Some(serde_json::from_str(stored.value())?),
            None => None,
        },
        None => None,
    };
    let stored_mark = t.fences.get(ns)?.map(|g| {
        let (epoch, seq) = g.value();
        HighWater { epoch, seq }
    });
    let mark = match stored_mark {
        Some(mark) => mark,
        // A namespace this file never saw may have been written before a restore: the
        // restore's floor stands in for its lost mark.
        None => HighWater {
            epoch: t.meta.get(META_RESTORE_FLOOR)?.map_or(0, |g| g.value()),
            seq: 0,
        },
    };
    let key = match &op.action {
        Action::Put { key, .. } | Action::Delete { key, .. } => Some(key.as_str()),
        Action::Fence => None,
    };
    let (key_state, usage) = match key {
        Some(key) => {
            let state = t.kv.get((ns, key))?.map(|g| {
                let (revision, _, value) = g.value();
                KeyState {
                    revision,
                    bytes: Usage::entry_bytes(key, value.len()),
                }
            });
            let usage = t.usage.get(ns)?.map_or(Usage::default(), |g| {
                let (keys, bytes) = g.value();
                Usage { keys, bytes }
            });
            (state, usage)
        }
        None => (None, Usage::default()),
    };
    let seen = Seen {
        mark,
        key: key_state,
        idempotency: stored_idem.as_ref(),
        usage,
    };
    let commit = match decide(op, &seen, limits, now_ms) {
        Decision::Replay(applied) => return Ok(Ok(applied)),
        Decision::Refuse(refused) => return Ok(Err(refused)),
        Decision::Commit(commit) => commit,
    };
    let revision = match (&op.action, commit.change) {
        (Action::Put { key, value, .. }, Change::Put) => {
            let revision = t.bump_revision()?;
            t.kv.insert((ns, key.as_str()), (revision, op.epoch, value.as_ref()))?;
            revision
        }
        (Action::Delete { key, .. }, Change::Delete) => {
            let revision = t.bump_revision()?;
            t.kv.remove((ns, key.as_str()))?;
            revision
        }
        _ => t.revision()?,
    };
    if commit.mark_changed || stored_mark.is_none() {
        t.fences
            .insert(ns, (commit.high_water.epoch, commit.high_water.seq))?;
    }
    if commit.usage_changed {
        if commit.usage == Usage::default() {
            t.usage.remove(ns)?;
        } else {
            t.usage
                .insert(ns, (commit.usage.keys, commit.usage.bytes))?;
        }
    }
    let applied = commit.applied(op, revision);
    if let (Some(idem), Some(record)) = (&op.idempotency, commit.record(op, applied, now_ms)) {
        let idem_key = idem.key.as_str();
        if let Some(old) = commit.replaces_expired {
            t.idem_expiry.remove((old, ns, idem_key))?;
        }
        let text = serde_json::to_string(&record)?;
        t.idempotency.insert((ns, idem_key), text.as_str())?;
        t.idem_expiry.insert((now_ms, ns, idem_key), ())?;
    }
    Ok(Ok(applied))
}

/// Most expired idempotency records one purge transaction removes, so a purge after a long
/// downtime does not hold up the writer: the rest goes in the next passes.
pub(super) const PURGE_LIMIT: usize = 10_000;

/// Removes idempotency records whose retention has run out at `now_ms`, at most
/// [`PURGE_LIMIT`], in one durable transaction. Returns how many it removed. Losing a
/// purge in a crash is harmless: the records are still expired and go in the next one.
pub(super) fn purge_expired(
    db: &Database,
    limits: &StoreLimits,
    now_ms: u64,
) -> Result<usize, Fault> {
    let Some(cutoff) = now_ms.checked_sub(limits.retention_ms()) else {
        return Ok(0);
    };
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate);
    let removed;
    {
        let mut expiry = txn.open_table(IDEM_EXPIRY)?;
        let mut records = txn.open_table(IDEMPOTENCY)?;
        let mut due = Vec::new();
        // Every entry created at or before the cutoff: strictly below (cutoff + 1, "", "").
        let end = (cutoff.saturating_add(1), "", "");
        for item in expiry.range(..end)? {
            let (key, _) = item?;
            let (at, ns, idem_key) = key.value();
            due.push((at, ns.to_owned(), idem_key.to_owned()));
            if due.len() == PURGE_LIMIT {
                break;
            }
        }
        for (at, ns, idem_key) in &due {
            expiry.remove((*at, ns.as_str(), idem_key.as_str()))?;
            records.remove((ns.as_str(), idem_key.as_str()))?;
        }
        removed = due.len();
    }
    if removed > 0 {
        txn.commit()?;
    } else {
        txn.abort()?;
    }
    Ok(removed)
}

fn next_revision(current: u64) -> Result<u64, Fault> {
    current
        .checked_add(1)
        .ok_or_else(|| Fault("store revision counter exhausted".to_string()))
}
