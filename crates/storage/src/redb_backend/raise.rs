//! Raising every epoch and mark of a database to a floor, in one write transaction: what
//! a restore from backup (`offline/restore.rs`) and a recovery that dropped an ambiguous
//! log tail (`open.rs`) both do to a store that may have forgotten epochs it issued.
//!
//! After [`raise`] with floor `F`:
//! - every known lock's counter is at least `F`: its next acquisition gets `F + 1` or more;
//! - every reservation's ceiling is at least `F`;
//! - every known namespace's high-water mark is at least `F`, so every token of epoch `F`
//!   or below, including one a forgotten write had fenced out, is refused (`stale_token`);
//! - the leases are dropped or kept, as [`After`] says;
//! - the restore floor (`META_RESTORE_FLOOR`) is at least `F`, so a lock or namespace
//!   the file does not know starts above it too.
//!
//! A lock is known when it has a counter, a reservation, a lease record or a mark (every
//! namespace a token exists for is guarded by a lock of the same name), or when the caller
//! names it.

use std::collections::BTreeSet;

use redb::{ReadableTable, WriteTransaction};

use palisade_token::Epoch;

use super::schema::{Fault, EPOCHS, FENCES, LEASES, META, META_RESTORE_FLOOR, RESERVATIONS};

/// What becomes of the leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    /// A restore: the backup's holders are not the current ones, and honouring their
    /// leases would let one be renewed as if it were current. Every lease record goes,
    /// every reservation becomes inactive, and the next grant records a new one at once.
    Restore,
    /// A recovery that dropped an ambiguous tail: the leases it knows are the current
    /// ones, and stay, so that their locks go to nobody new while they live (their
    /// holders' writes are refused by the raised marks; they release and acquire again).
    /// Active reservations stay active, as after any restart.
    Recovery,
}

/// What [`raise`] changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Raised {
    pub locks: usize,
    pub namespaces: usize,
    pub leases_dropped: usize,
}

/// The highest epoch the database holds anywhere: a lock's counter or reservation
/// ceiling, a namespace's mark, the restore floor.
pub(crate) fn highest(txn: &WriteTransaction) -> Result<Epoch, Fault> {
    let mut top = txn
        .open_table(META)?
        .get(META_RESTORE_FLOOR)?
        .map_or(0, |g| g.value());
    for item in txn.open_table(EPOCHS)?.iter()? {
        top = top.max(item?.1.value());
    }
    for item in txn.open_table(RESERVATIONS)?.iter()? {
        top = top.max(item?.1.value().0);
    }
    for item in txn.open_table(FENCES)?.iter()? {
        top = top.max(item?.1.value().0);
    }
    Ok(top)
}

/// Raises everything to `floor` (see the module docs); `locks` are lock names known from
/// elsewhere. The caller commits `txn`.
pub(crate) fn raise(
    txn: &WriteTransaction,
    floor: Epoch,
    locks: &BTreeSet<String>,
    after: After,
) -> Result<Raised, Fault> {
    let mut locks = locks.clone();

    let mut leases = txn.open_table(LEASES)?;
    let mut dropped = Vec::new();
    for item in leases.iter()? {
        let (id, record) = item?;
        let lease: crate::LeaseRecord = serde_json::from_str(record.value())?;
        // A session's record names no lock; with a restore it goes like every other.
        if !lease.is_session() {
            locks.insert(lease.lock);
        }
        if after == After::Restore {
            dropped.push(id.value().to_owned());
        }
    }
    for id in &dropped {
        leases.remove(id.as_str())?;
    }

    let mut epochs = txn.open_table(EPOCHS)?;
    for item in epochs.iter()? {
        locks.insert(item?.0.value().to_owned());
    }
    let mut reservations = txn.open_table(RESERVATIONS)?;
    for item in reservations.iter()? {
        locks.insert(item?.0.value().to_owned());
    }
    let mut fences = txn.open_table(FENCES)?;
    let mut namespaces: BTreeSet<String> = locks.clone();
    for item in fences.iter()? {
        namespaces.insert(item?.0.value().to_owned());
    }
    // Every namespace a token can exist for is guarded by a lock of the same name.
    locks.extend(namespaces.iter().cloned());

    for lock in &locks {
        let current = epochs.get(lock.as_str())?.map_or(0, |g| g.value());
        epochs.insert(lock.as_str(), current.max(floor))?;
        let reserved = reservations.get(lock.as_str())?.map(|g| g.value());
        if let Some((ceiling, max_ttl_ms, active)) = reserved {
            let active = match after {
                After::Restore => 0,
                After::Recovery => active,
            };
            reservations.insert(lock.as_str(), (ceiling.max(floor), max_ttl_ms, active))?;
        }
    }
    for namespace in &namespaces {
        let current = fences.get(namespace.as_str())?.map(|g| g.value());
        let mark = match current {
            Some((epoch, seq)) if epoch >= floor => (epoch, seq),
            _ => (floor, 0),
        };
        fences.insert(namespace.as_str(), mark)?;
    }

    let mut meta = txn.open_table(META)?;
    let before = meta.get(META_RESTORE_FLOOR)?.map_or(0, |g| g.value());
    meta.insert(META_RESTORE_FLOOR, before.max(floor))?;
    Ok(Raised {
        locks: locks.len(),
        namespaces: namespaces.len(),
        leases_dropped: dropped.len(),
    })
}
