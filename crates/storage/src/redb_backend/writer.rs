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

use std::sync::mpsc::Receiver;
use std::sync::Arc;

use redb::{Database, Durability, ReadableTable, Table, WriteTransaction};
use tokio::sync::oneshot;

use palisade_core::gate::{admit, HighWater};

use palisade_core::lock_table::Reservation;

use super::schema::{
    Fault, IdemRecord, EPOCHS, FENCES, IDEMPOTENCY, KV, LEASES, META, META_RESTORE_FLOOR,
    META_REVISION, RESERVATIONS,
};
use super::state::State;
use crate::{
    Action, Applied, ApplyError, FencedOp, LazyRecord, LeaseRecord, Precondition, StorageError,
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

/// Runs until every sender of the queue is gone and the queue is empty.
pub(super) fn run(
    db: Arc<Database>,
    queue: Receiver<Request>,
    state: Arc<State>,
    max_batch: usize,
    two_phase: bool,
) {
    let max_batch = max_batch.max(1);
    while let Ok(first) = queue.recv() {
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
        commit_batch(&db, batch, &state, two_phase);
    }
}

fn commit_batch(db: &Database, batch: Vec<Request>, state: &State, two_phase: bool) {
    let size = batch.len();
    let mut answers = Vec::with_capacity(size);
    let mut pending = batch.into_iter();
    let mut failed_request = None;
    match apply_batch(
        db,
        two_phase,
        &mut pending,
        &mut answers,
        &mut failed_request,
    ) {
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
    two_phase: bool,
    pending: &mut impl Iterator<Item = Request>,
    answers: &mut Vec<Answer>,
    failed: &mut Option<Request>,
) -> Result<u64, Fault> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate);
    // See `RedbOptions::two_phase_commit`.
    txn.set_two_phase_commit(two_phase);
    let max_epoch;
    {
        let mut tables = Tables::open(&txn)?;
        for request in pending.by_ref() {
            match execute(&mut tables, request) {
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
    txn.commit()?;
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
fn execute(t: &mut Tables<'_>, request: Request) -> Result<Answer, Box<(Fault, Request)>> {
    match request {
        Request::Apply { op, reply } => match apply_op(t, &op) {
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

/// Raises the lock's reservation (ceiling and TTL never go down) and records the lease.
fn reserve(
    t: &mut Tables<'_>,
    lock: &str,
    r: Reservation,
    lease: Option<&LeaseRecord>,
) -> Result<(), Fault> {
    let stored = t.reservations.get(lock)?.map(|g| g.value());
    let (ceiling, max_ttl) = stored.map_or((r.ceiling, r.max_ttl_ms), |(c, m, _)| {
        (c.max(r.ceiling), m.max(r.max_ttl_ms))
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

/// Gate + preconditions + mutation. Every check comes before the first write, so an
/// `Ok(Err(_))` (a refusal) has written nothing. `Err(Fault)` aborts the batch.
fn apply_op(t: &mut Tables<'_>, op: &FencedOp) -> Result<Result<Applied, ApplyError>, Fault> {
    let ns = op.namespace.as_str();
    if let Some(idem) = &op.idempotency {
        let stored = t.idempotency.get((ns, idem.key.as_str()))?;
        if let Some(stored) = stored {
            let record: IdemRecord = serde_json::from_str(stored.value())?;
            // The first outcome stands, even if the gate would refuse the request today.
            return Ok(if record.fingerprint == idem.fingerprint {
                Ok(Applied {
                    replayed: true,
                    ..record.applied
                })
            } else {
                Err(ApplyError::IdempotencyConflict)
            });
        }
    }

    let stored = t.fences.get(ns)?.map(|g| {
        let (epoch, seq) = g.value();
        HighWater { epoch, seq }
    });
    let mark = match stored {
        Some(mark) => mark,
        // A namespace this file never saw may have been written before a restore: the
        // restore's floor stands in for its lost mark.
        None => HighWater {
            epoch: t.meta.get(META_RESTORE_FLOOR)?.map_or(0, |g| g.value()),
            seq: 0,
        },
    };
    let next = match admit(mark, op.policy, op.epoch, op.seq) {
        Ok(next) => next,
        Err(refused) => return Ok(Err(refused.into())),
    };
    let revision = match &op.action {
        Action::Put {
            key,
            value,
            precondition,
        } => {
            // An unconditional put needs no look at the key: save a lookup.
            if *precondition != Precondition::None {
                let current = t.kv.get((ns, key.as_str()))?.map(|g| g.value().0);
                if let Err(refused) = precondition.check(current) {
                    return Ok(Err(refused));
                }
            }
            let revision = t.bump_revision()?;
            t.kv.insert((ns, key.as_str()), (revision, op.epoch, value.as_ref()))?;
            revision
        }
        Action::Delete { key, precondition } => {
            let current = t.kv.get((ns, key.as_str()))?.map(|g| g.value().0);
            if let Err(refused) = precondition.check(current) {
                return Ok(Err(refused));
            }
            if current.is_none() {
                return Ok(Err(ApplyError::NotFound));
            }
            let revision = t.bump_revision()?;
            t.kv.remove((ns, key.as_str()))?;
            revision
        }
        Action::Fence => t.revision()?,
    };

    t.fences.insert(ns, (next.epoch, next.seq))?;
    let applied = Applied {
        revision,
        epoch: op.epoch,
        high_water: next,
        replayed: false,
    };
    if let Some(idem) = &op.idempotency {
        let record = serde_json::to_string(&IdemRecord {
            fingerprint: idem.fingerprint.clone(),
            applied,
        })?;
        t.idempotency
            .insert((ns, idem.key.as_str()), record.as_str())?;
    }
    Ok(Ok(applied))
}

fn next_revision(current: u64) -> Result<u64, Fault> {
    current
        .checked_add(1)
        .ok_or_else(|| Fault("store revision counter exhausted".to_string()))
}
