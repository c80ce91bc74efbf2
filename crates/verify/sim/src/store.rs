//! The simulated disk: the node's records and fenced store, with group commit and fsync.
//!
//! It models the contract of `palisade_storage::IssuerLog` and `FencedStore` as the
//! embedded backend keeps it, not the engine itself:
//!
//! - One writer applies queued jobs in arrival order to a *working* copy of the records
//!   (one transaction per batch; each job sees the jobs before it), then an fsync takes
//!   a while, and only when it completes does the batch become *durable* and are its
//!   answers handed out, refusals included.
//! - Reads see durable state only (committed transactions).
//! - A crash throws away the working copy and every queued or in-flight job with its
//!   answer: what was not fsync'd is lost. Optionally (a *torn* commit) the in-flight
//!   batch had reached the disk just before the crash, so it is durable although nobody
//!   was ever told.
//! - Issuer records follow the redb backend: a *reservation* write raises the lock's
//!   ceiling and TTL (never lowers them), overwrites its `active` flag, raises the lock's
//!   last epoch to the ceiling and stores the grant's lease record; *lazy* records (lease
//!   records of covered grants, removals, idle markers) ride along with the next batch
//!   and nobody waits for them.
//! - A fenced mutation is decided by the real rule of every backend
//!   ([`palisade_storage::decide()`]: the gate against the namespace's mark, quotas), and a
//!   refused one writes nothing.
//!
//! Not modelled: partial writes inside a batch (a batch is all or nothing, as a log record
//! is: a torn one is dropped whole); the engine's pipelining (it computes the next batch
//! while the previous one's fsync runs, and answers both in order, each after its own
//! fsync: here the next batch starts after the fsync); the checkpoints into the database
//! file; the real writer thread taking a batch *between* two jobs that one issuer
//! call queues (here jobs queued by one event always share a batch, so orderings such as
//! "a release's removal before its hand-off" are not put to the test); I/O errors and the fail-stop latch, idempotency keys, the `sequence`
//! policy and preconditions. Real fsync semantics of the kernel are out of scope (S16):
//! "fsync done" here simply means durable.

use std::collections::BTreeMap;

use bytes::Bytes;
use palisade_core::gate::{GateError, HighWater, Policy};
use palisade_core::lock_table::Reservation;
use palisade_issuer::core::WriteId;
use palisade_storage::decide::Change;
use palisade_storage::{
    self as storage, decide, ApplyError, Decision, FencedOp, KeyState, Precondition, Seen,
    StoreLimits, Usage,
};
use palisade_token::Epoch;

use crate::config::Bug;
use crate::net::{Action, Reply};

/// A lease as the issuer records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseRecord {
    pub lease_id: String,
    pub lock: String,
    pub holder: String,
    pub epoch: Epoch,
    pub ttl_ms: u64,
}

impl From<palisade_storage::LeaseRecord> for LeaseRecord {
    fn from(r: palisade_storage::LeaseRecord) -> Self {
        LeaseRecord {
            lease_id: r.lease_id,
            lock: r.lock,
            holder: r.holder,
            epoch: r.epoch,
            ttl_ms: r.ttl_ms,
        }
    }
}

impl From<LeaseRecord> for palisade_storage::LeaseRecord {
    fn from(r: LeaseRecord) -> Self {
        palisade_storage::LeaseRecord {
            lease_id: r.lease_id,
            lock: r.lock,
            holder: r.holder,
            epoch: r.epoch,
            ttl_ms: r.ttl_ms,
            ..Default::default()
        }
    }
}

/// One namespace of the fenced store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Namespace {
    pub high_water: HighWater,
    pub values: BTreeMap<String, String>,
    /// The store revision of each key's last write.
    pub revisions: BTreeMap<String, u64>,
    /// Keys and bytes, for the quotas.
    pub usage: Usage,
}

/// Everything on the disk: the issuer's records and the fenced store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Records {
    /// Last epoch issued per lock; never lowered.
    pub epochs: BTreeMap<String, Epoch>,
    pub leases: BTreeMap<String, LeaseRecord>,
    pub reservations: BTreeMap<String, Reservation>,
    pub namespaces: BTreeMap<String, Namespace>,
    /// Global store revision, bumped by every put or delete.
    pub revision: u64,
}

/// A unit of work for the writer.
#[derive(Debug, Clone)]
pub(crate) enum Job {
    /// `IssuerLog::reserve`: the issuer core is told (`IssuerCore::written`) once durable.
    Reserve {
        lock: String,
        reservation: Reservation,
        lease: Option<LeaseRecord>,
        /// The core's name for the write.
        write: WriteId,
    },
    /// `IssuerLog::remove_lease` (also the core's barrier): the core is told once durable.
    RemoveLease { lease_id: String, write: WriteId },
    /// `IssuerLog::record_lazily`: a lease record of a covered grant.
    LazyLease(LeaseRecord),
    /// `IssuerLog::record_lazily`: a removal (expiry, or ahead of a release's hand-off).
    LazyRemoveLease(String),
    /// `IssuerLog::record_lazily`: an idle marker (an inactive reservation).
    LazyReservation {
        lock: String,
        reservation: Reservation,
    },
    Mutate {
        lock: String,
        epoch: Epoch,
        action: Action,
    },
}

/// Who waits for a mutation's answer (the gate decides the answer itself).
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub client: usize,
    pub req_id: u64,
    /// The lock (namespace) the request concerns.
    pub lock: String,
}

/// An answer ready to go out once its batch is durable.
pub(crate) type Outgoing = (Answer, Reply);

/// What a completed fsync releases.
#[derive(Debug, Default)]
pub(crate) struct Durable {
    /// The issuer core's writes now durable, in order (told to the core before any
    /// mutation's answer goes).
    pub written: Vec<WriteId>,
    pub answers: Vec<Outgoing>,
}

/// What starting a batch produced.
#[derive(Debug, Default)]
pub(crate) struct Commit {
    /// Answers a broken variant sends before the fsync (empty for the real contract).
    pub early: Vec<Outgoing>,
    /// Issuer writes a broken variant reports done before the fsync (empty for the real
    /// contract).
    pub early_written: Vec<WriteId>,
    /// (namespace, epoch) of every mutation the gate admitted.
    pub admitted: Vec<(String, Epoch)>,
}

impl Records {
    /// Applies one job to these records; returns the mutation's answer where it has one.
    fn apply(&mut self, job: &Job, bug: Option<Bug>) -> Option<Reply> {
        match job {
            Job::Reserve {
                lock,
                reservation,
                lease,
                ..
            } => {
                self.reserve(lock, *reservation);
                if let Some(lease) = lease {
                    self.leases.insert(lease.lease_id.clone(), lease.clone());
                }
                None
            }
            Job::LazyReservation { lock, reservation } => {
                self.reserve(lock, *reservation);
                None
            }
            Job::LazyLease(lease) => {
                self.leases.insert(lease.lease_id.clone(), lease.clone());
                None
            }
            Job::RemoveLease { lease_id: id, .. } | Job::LazyRemoveLease(id) => {
                self.leases.remove(id);
                None
            }
            Job::Mutate {
                lock,
                epoch,
                action,
            } => Some(self.mutate(lock, *epoch, action, bug)),
        }
    }

    /// As the embedded store does ([`Reservation::merge`]); the last epoch follows the
    /// ceiling.
    fn reserve(&mut self, lock: &str, r: Reservation) {
        self.reservations
            .entry(lock.to_owned())
            .or_default()
            .merge(r);
        let last = self.epochs.entry(lock.to_owned()).or_default();
        *last = (*last).max(r.ceiling);
    }

    /// A fenced mutation, decided by the real rule every backend uses
    /// ([`palisade_storage::decide()`]) on what this disk holds.
    fn mutate(&mut self, lock: &str, epoch: Epoch, action: &Action, bug: Option<Bug>) -> Reply {
        let ns = self.namespaces.entry(lock.to_owned()).or_default();
        let (action, key) = match action {
            Action::Put { key, value } => (
                storage::Action::Put {
                    key: key.clone(),
                    value: Bytes::from(value.clone().into_bytes()),
                    precondition: Precondition::None,
                },
                Some(key),
            ),
            Action::Delete { key } => (
                storage::Action::Delete {
                    key: key.clone(),
                    precondition: Precondition::None,
                },
                Some(key),
            ),
            Action::Fence => (storage::Action::Fence, None),
        };
        let op = FencedOp {
            namespace: lock.to_owned(),
            epoch,
            seq: None,
            policy: Policy::Epoch,
            idempotency: None,
            action,
        };
        let seen = Seen {
            // The planted bug: the gate sees no mark, so a stale epoch passes (and, below,
            // leaves the mark where it was).
            mark: if bug == Some(Bug::GateAdmitsStale) {
                HighWater::default()
            } else {
                ns.high_water
            },
            key: key.and_then(|k| {
                ns.values.get(k).map(|v| KeyState {
                    revision: ns.revisions.get(k).copied().unwrap_or(0),
                    bytes: Usage::entry_bytes(k, v.len()),
                })
            }),
            idempotency: None,
            usage: ns.usage,
        };
        let commit = match decide(&op, &seen, &StoreLimits::default(), 0) {
            Decision::Commit(commit) => commit,
            Decision::Refuse(ApplyError::Gate(GateError::Stale { .. })) => {
                return Reply::Refused("stale_token")
            }
            Decision::Refuse(ApplyError::NotFound) => return Reply::Refused("not_found"),
            Decision::Refuse(_) | Decision::Replay(_) => return Reply::Refused("refused"),
        };
        ns.high_water = ns.high_water.max(commit.high_water);
        ns.usage = commit.usage;
        let revision = match (&op.action, commit.change) {
            (storage::Action::Put { key, value, .. }, Change::Put) => {
                self.revision += 1;
                let value = String::from_utf8_lossy(value).into_owned();
                ns.values.insert(key.clone(), value);
                ns.revisions.insert(key.clone(), self.revision);
                self.revision
            }
            (storage::Action::Delete { key, .. }, Change::Delete) => {
                self.revision += 1;
                ns.values.remove(key);
                ns.revisions.remove(key);
                self.revision
            }
            _ => self.revision,
        };
        Reply::Applied { revision, epoch }
    }
}

/// The disk with its single writer. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Store {
    durable: Records,
    working: Records,
    queue: Vec<(Job, Option<Answer>)>,
    /// The batch whose fsync is running; `Some` while one runs.
    inflight: Option<Durable>,
    /// A batch is due to start (its start event is scheduled).
    starting: bool,
}

impl Store {
    /// Queues a job. True when the caller must schedule a batch start.
    pub(crate) fn submit(&mut self, job: Job, answer: Option<Answer>) -> bool {
        self.queue.push((job, answer));
        let wake = self.inflight.is_none() && !self.starting;
        self.starting |= wake;
        wake
    }

    /// Starts a batch: applies every queued job to the working copy.
    pub(crate) fn begin_commit(&mut self, bug: Option<Bug>) -> Commit {
        self.starting = false;
        let mut held_back = Durable::default();
        let mut commit = Commit::default();
        for (job, answer) in std::mem::take(&mut self.queue) {
            let computed = self.working.apply(&job, bug);
            match &job {
                Job::Reserve { write, .. } if bug == Some(Bug::GrantBeforeFsync) => {
                    commit.early_written.push(*write)
                }
                Job::Reserve { write, .. } | Job::RemoveLease { write, .. } => {
                    held_back.written.push(*write)
                }
                _ => {}
            }
            if let (Job::Mutate { lock, epoch, .. }, Some(Reply::Applied { .. })) =
                (&job, &computed)
            {
                commit.admitted.push((lock.clone(), *epoch));
            }
            let (Some(answer), Some(reply)) = (answer, computed) else {
                continue;
            };
            if bug == Some(Bug::AckBeforeFsync) {
                commit.early.push((answer, reply));
            } else {
                held_back.answers.push((answer, reply));
            }
        }
        self.inflight = Some(held_back);
        commit
    }

    /// The fsync returned: the batch is durable, its answers may go. True when more jobs
    /// are queued (the caller schedules the next batch start).
    pub(crate) fn finish_commit(&mut self) -> (Durable, bool) {
        self.durable = self.working.clone();
        let out = self.inflight.take().unwrap_or_default();
        let more = !self.queue.is_empty();
        self.starting |= more;
        (out, more)
    }

    /// The process died. With `torn`, the in-flight batch had reached the disk.
    pub(crate) fn crash(&mut self, torn: bool) {
        if torn && self.inflight.is_some() {
            self.durable = self.working.clone();
        }
        self.working = self.durable.clone();
        self.queue.clear();
        self.inflight = None;
        self.starting = false;
    }

    pub(crate) fn committing(&self) -> bool {
        self.inflight.is_some()
    }

    /// Nothing queued, nothing being committed.
    pub(crate) fn idle(&self) -> bool {
        self.queue.is_empty() && self.inflight.is_none() && !self.starting
    }

    /// The committed state (what reads and a restart see).
    pub(crate) fn durable(&self) -> &Records {
        &self.durable
    }
}

#[cfg(test)]
mod tests;
