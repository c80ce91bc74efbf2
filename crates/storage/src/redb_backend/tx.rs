//! What each request writes: the rows of one batch, computed by the writer.
//!
//! A [`Tx`] reads through the batch's own rows, then the writer's rows not yet durable,
//! then the durable layers ([`View`]), so each request sees the effects of the ones before
//! it, exactly as if they had been committed one by one; it buffers its writes as rows.
//! A request that is refused (gate, precondition, not found, idempotency conflict, quota)
//! returns before its first write, so sharing the batch cannot leak any part of it.

use std::ops::Bound;

use palisade_core::gate::HighWater;
use palisade_core::lock_table::Reservation;

use super::layers::View;
use super::overlay::{Key, Rows, Val};
use super::reads::{self, Point, ReadError};
use super::schema::{Fault, IdemRecord, META_REVISION};
use crate::decide::Change;
use crate::{
    decide, Action, Applied, ApplyError, Decision, FencedOp, KeyState, LazyRecord, LeaseRecord,
    Seen, StoreLimits, Usage,
};

/// One batch's reads and writes. See the module docs.
pub(super) struct Tx<'v, 'a> {
    view: &'v View<'a>,
    /// The writer's rows of earlier batches, not yet durable.
    pending: &'v Rows,
    /// This batch's rows.
    pub rows: Rows,
    /// The store revision as this batch has moved it (written back by [`Tx::finish`]).
    revision: Option<u64>,
    revision_dirty: bool,
    /// Highest epoch written: a lock's counter (a reservation's ceiling raises it too) or
    /// a namespace's mark.
    pub max_epoch: u64,
}

impl<'v, 'a> Tx<'v, 'a> {
    pub fn new(view: &'v View<'a>, pending: &'v Rows) -> Self {
        Tx {
            view,
            pending,
            rows: Rows::new(),
            revision: None,
            revision_dirty: false,
            max_epoch: 0,
        }
    }

    fn get(&self, key: &Key) -> Result<Option<Val>, Fault> {
        if let Some(v) = self.rows.get(key).or_else(|| self.pending.get(key)) {
            return Ok(v.clone());
        }
        self.view.get(key)
    }

    fn put(&mut self, key: Key, val: Val) {
        self.rows.insert(key, Some(val));
    }

    fn remove(&mut self, key: Key) {
        self.rows.insert(key, None);
    }

    fn get_u64(&self, key: &Key) -> Result<Option<u64>, Fault> {
        match self.get(key)? {
            None => Ok(None),
            Some(Val::U64(v)) => Ok(Some(v)),
            Some(other) => Err(shape(key, &other)),
        }
    }

    fn revision(&mut self) -> Result<u64, Fault> {
        if let Some(revision) = self.revision {
            return Ok(revision);
        }
        let revision = self.get_u64(&meta(META_REVISION))?.unwrap_or(0);
        self.revision = Some(revision);
        Ok(revision)
    }

    fn bump_revision(&mut self) -> Result<u64, Fault> {
        let next = self
            .revision()?
            .checked_add(1)
            .ok_or_else(|| Fault("store revision counter exhausted".to_string()))?;
        self.revision = Some(next);
        self.revision_dirty = true;
        Ok(next)
    }

    fn set_epoch(&mut self, lock: &str, epoch: u64) {
        self.put(Key::Epoch(lock.to_owned()), Val::U64(epoch));
        self.max_epoch = self.max_epoch.max(epoch);
    }

    /// Writes back what was kept aside during the batch. Called once, at its end.
    pub fn finish(&mut self) {
        if let (true, Some(revision)) = (self.revision_dirty, self.revision) {
            self.put(meta(META_REVISION), Val::U64(revision));
        }
    }

    /// Records the lock's reservation, merged over the stored one by the one rule
    /// ([`Reservation::merge`]), and the lease.
    pub fn reserve(
        &mut self,
        lock: &str,
        r: Reservation,
        lease: Option<&LeaseRecord>,
    ) -> Result<(), Fault> {
        let key = Key::Reservation(lock.to_owned());
        let stored = match self.get(&key)? {
            None => None,
            Some(Val::Triple(c, m, active)) => Some((c, m, active)),
            Some(other) => return Err(shape(&key, &other)),
        };
        let merged = match stored {
            None => r,
            Some((ceiling, max_ttl_ms, active)) => {
                let mut merged = Reservation {
                    ceiling,
                    max_ttl_ms,
                    active: active != 0,
                };
                merged.merge(r);
                merged
            }
        };
        let ceiling = merged.ceiling;
        self.put(
            key,
            Val::Triple(ceiling, merged.max_ttl_ms, u64::from(merged.active)),
        );
        // The lock's epoch row says the last epoch granted (written with the lease
        // records), not the ceiling; it is made here so that the lock is listed.
        let epoch_key = Key::Epoch(lock.to_owned());
        if self.get_u64(&epoch_key)?.is_none() {
            self.put(epoch_key, Val::U64(0));
        }
        self.max_epoch = self.max_epoch.max(ceiling);
        if let Some(lease) = lease {
            self.put_lease(lease)?;
        }
        Ok(())
    }

    /// Records a lease, and its epoch as its lock's last granted one.
    fn put_lease(&mut self, lease: &LeaseRecord) -> Result<(), Fault> {
        let text = serde_json::to_string(lease)?;
        self.put(Key::Lease(lease.lease_id.clone()), Val::Text(text));
        if !lease.is_session() {
            let key = Key::Epoch(lease.lock.clone());
            if self.get_u64(&key)?.is_none_or(|last| last < lease.epoch) {
                self.set_epoch(&lease.lock, lease.epoch);
            }
        }
        Ok(())
    }

    pub fn remove_lease(&mut self, lease_id: &str) {
        self.remove(Key::Lease(lease_id.to_owned()));
    }

    pub fn write_lazy(&mut self, record: &LazyRecord) -> Result<(), Fault> {
        match record {
            LazyRecord::Lease(lease) => self.put_lease(lease),
            LazyRecord::RemoveLease(id) => {
                self.remove_lease(id);
                Ok(())
            }
            LazyRecord::Reservation { lock, reservation } => self.reserve(lock, *reservation, None),
        }
    }

    /// Reads what [`decide()`] needs, then writes exactly what it decided. A refusal writes
    /// nothing. `Err(Fault)` fails the batch.
    pub fn apply(
        &mut self,
        op: &FencedOp,
        limits: &StoreLimits,
        now_ms: u64,
    ) -> Result<Result<Applied, ApplyError>, Fault> {
        let ns = op.namespace.as_str();
        let inputs = Inputs::read(self, op).map_err(Fault::from)?;
        let commit = match decide(op, &inputs.seen(), limits, now_ms) {
            Decision::Replay(applied) => return Ok(Ok(applied)),
            Decision::Refuse(refused) => return Ok(Err(refused)),
            Decision::Commit(commit) => commit,
        };
        let revision = match (&op.action, commit.change) {
            (Action::Put { key, value, .. }, Change::Put) => {
                let revision = self.bump_revision()?;
                let row = Key::Kv(ns.to_owned(), key.clone());
                self.put(row, Val::Entry(revision, op.epoch, value.clone()));
                revision
            }
            (Action::Delete { key, .. }, Change::Delete) => {
                let revision = self.bump_revision()?;
                self.remove(Key::Kv(ns.to_owned(), key.clone()));
                revision
            }
            _ => self.revision()?,
        };
        if commit.mark_changed || inputs.stored_mark.is_none() {
            let mark = Val::Pair(commit.high_water.epoch, commit.high_water.seq);
            self.put(Key::Fence(ns.to_owned()), mark);
            self.max_epoch = self.max_epoch.max(commit.high_water.epoch);
        }
        if commit.usage_changed {
            let key = Key::Usage(ns.to_owned());
            if commit.usage == Usage::default() {
                self.remove(key);
            } else {
                self.put(key, Val::Pair(commit.usage.keys, commit.usage.bytes));
            }
        }
        let applied = commit.applied(op, revision);
        if let (Some(idem), Some(record)) = (&op.idempotency, commit.record(op, applied, now_ms)) {
            if let Some(old) = commit.replaces_expired {
                self.remove(Key::IdemExpiry(old, ns.to_owned(), idem.key.clone()));
            }
            let text = serde_json::to_string(&record)?;
            self.put(Key::Idem(ns.to_owned(), idem.key.clone()), Val::Text(text));
            self.put(
                Key::IdemExpiry(now_ms, ns.to_owned(), idem.key.clone()),
                Val::Unit,
            );
        }
        Ok(Ok(applied))
    }

    /// Removes idempotency records whose retention has run out at `now_ms`, at most
    /// `limit`. Returns how many.
    pub fn purge_expired(
        &mut self,
        limits: &StoreLimits,
        now_ms: u64,
        limit: usize,
    ) -> Result<usize, Fault> {
        let Some(cutoff) = now_ms.checked_sub(limits.retention_ms()) else {
            return Ok(0);
        };
        let start = Key::IdemExpiry(0, String::new(), String::new());
        let due = self.view.range(
            Some(&merged(self.pending, &self.rows)),
            Bound::Included(&start),
            &|k| matches!(k, Key::IdemExpiry(at, ..) if *at <= cutoff),
            limit,
        )?;
        for (key, _) in &due {
            if let Key::IdemExpiry(_, ns, idem_key) = key {
                self.remove(Key::Idem(ns.clone(), idem_key.clone()));
            }
            self.remove(key.clone());
        }
        Ok(due.len())
    }
}

impl Point for Tx<'_, '_> {
    fn row(&self, key: &Key) -> Result<Option<Val>, ReadError> {
        Ok(self.get(key)?)
    }
}

/// What [`decide()`] needs for one operation, read from one source: the batch in the
/// writer ([`Tx`]), or the durable rows in memory, where a refusal or a replay can be
/// answered without the writer (`RedbBackend::apply`).
pub(super) struct Inputs {
    idempotency: Option<IdemRecord>,
    /// The namespace's stored mark (`None`: it has none yet, and one is written with the
    /// first commit).
    stored_mark: Option<HighWater>,
    mark: HighWater,
    key: Option<KeyState>,
    usage: Usage,
}

impl Inputs {
    pub fn read(p: &(impl Point + ?Sized), op: &FencedOp) -> Result<Inputs, ReadError> {
        let ns = op.namespace.as_str();
        let idempotency: Option<IdemRecord> = match &op.idempotency {
            Some(idem) => {
                let row = Key::Idem(ns.to_owned(), idem.key.clone());
                match p.row(&row)? {
                    None => None,
                    Some(Val::Text(t)) => Some(serde_json::from_str(&t).map_err(Fault::from)?),
                    Some(other) => return Err(shape(&row, &other).into()),
                }
            }
            None => None,
        };
        let stored_mark =
            pair(p, &Key::Fence(ns.to_owned()))?.map(|(epoch, seq)| HighWater { epoch, seq });
        let mark = match stored_mark {
            Some(mark) => mark,
            // A namespace this file never saw may have been written before a restore: the
            // restore's floor stands in for its lost mark.
            None => HighWater::default().at_least(reads::restore_floor(p)?),
        };
        let (key, usage) = match &op.action {
            Action::Put { key, .. } | Action::Delete { key, .. } => {
                let row = Key::Kv(ns.to_owned(), key.clone());
                let state = match p.row(&row)? {
                    None => None,
                    Some(Val::Entry(revision, _, value)) => Some(KeyState {
                        revision,
                        bytes: Usage::entry_bytes(key, value.len()),
                    }),
                    Some(other) => return Err(shape(&row, &other).into()),
                };
                let usage = pair(p, &Key::Usage(ns.to_owned()))?
                    .map_or(Usage::default(), |(keys, bytes)| Usage { keys, bytes });
                (state, usage)
            }
            Action::Fence => (None, Usage::default()),
        };
        Ok(Inputs {
            idempotency,
            stored_mark,
            mark,
            key,
            usage,
        })
    }

    pub fn seen(&self) -> Seen<'_> {
        Seen {
            mark: self.mark,
            key: self.key,
            idempotency: self.idempotency.as_ref(),
            usage: self.usage,
        }
    }
}

fn pair(p: &(impl Point + ?Sized), key: &Key) -> Result<Option<(u64, u64)>, ReadError> {
    match p.row(key)? {
        None => Ok(None),
        Some(Val::Pair(a, b)) => Ok(Some((a, b))),
        Some(other) => Err(shape(key, &other).into()),
    }
}

/// `pending` overlaid by `rows`.
fn merged(pending: &Rows, rows: &Rows) -> Rows {
    let mut all = pending.clone();
    all.extend(rows.iter().map(|(k, v)| (k.clone(), v.clone())));
    all
}

fn meta(name: &str) -> Key {
    Key::Meta(name.to_owned())
}

fn shape(key: &Key, val: &Val) -> Fault {
    Fault(format!(
        "row {key:?} holds a value of another shape: {val:?}"
    ))
}
