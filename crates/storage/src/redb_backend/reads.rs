//! Read paths: plain functions over one redb read transaction (a consistent snapshot).
//! They never block the writer, and the writer never blocks them.

use std::ops::Bound;

use redb::{ReadTransaction, ReadableTable};

use palisade_core::gate::HighWater;

use palisade_core::lock_table::Reservation;

use super::schema::{Fault, EPOCHS, FENCES, KV, LEASES, META, META_RESTORE_FLOOR, RESERVATIONS};
use crate::{Entry, IssuerState, LeaseRecord};

pub(super) fn load_issuer(txn: &ReadTransaction) -> Result<IssuerState, Fault> {
    let mut state = IssuerState {
        epoch_floor: restore_floor(txn)?,
        ..IssuerState::default()
    };
    for item in txn.open_table(EPOCHS)?.iter()? {
        let (lock, epoch) = item?;
        state.epochs.push((lock.value().to_string(), epoch.value()));
    }
    for item in txn.open_table(LEASES)?.iter()? {
        let (_, record) = item?;
        let lease: LeaseRecord = serde_json::from_str(record.value())?;
        state.leases.push(lease);
    }
    for item in txn.open_table(RESERVATIONS)?.iter()? {
        let (lock, value) = item?;
        let (ceiling, max_ttl_ms, active) = value.value();
        let reservation = Reservation {
            ceiling,
            max_ttl_ms,
            active: active != 0,
        };
        state
            .reservations
            .push((lock.value().to_string(), reservation));
    }
    Ok(state)
}

/// Known locks in name order from the epoch table (every reservation also raises its
/// lock's epoch there, so it names every lock with a record): names above `after` that
/// start with `prefix`, at most `limit`.
pub(super) fn list_locks(
    txn: &ReadTransaction,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, u64)>, Fault> {
    let mut locks = Vec::new();
    if limit == 0 {
        return Ok(locks);
    }
    let table = txn.open_table(EPOCHS)?;
    let range = match after {
        Some(after) if after >= prefix => {
            table.range::<&str>((Bound::Excluded(after), Bound::Unbounded))?
        }
        _ => table.range::<&str>(prefix..)?,
    };
    for item in range {
        let (lock, epoch) = item?;
        let lock = lock.value();
        if !lock.starts_with(prefix) {
            break;
        }
        locks.push((lock.to_owned(), epoch.value()));
        if locks.len() == limit {
            break;
        }
    }
    Ok(locks)
}

/// One lock's epoch (raised to its reservation's ceiling) and reservation.
pub(super) fn lock_record(
    txn: &ReadTransaction,
    lock: &str,
) -> Result<Option<(u64, Reservation)>, Fault> {
    let epoch = txn.open_table(EPOCHS)?.get(lock)?.map(|g| g.value());
    let reservation = txn.open_table(RESERVATIONS)?.get(lock)?.map(|g| {
        let (ceiling, max_ttl_ms, active) = g.value();
        Reservation {
            ceiling,
            max_ttl_ms,
            active: active != 0,
        }
    });
    Ok(match (epoch, reservation) {
        (None, None) => None,
        (epoch, reservation) => {
            // A lock with an epoch but no reservation was granted by an older version, one
            // grant at a time: nothing above its epoch was issued, and no lease is live
            // unless its record is among the issuer's leases.
            let reservation = reservation.unwrap_or(Reservation {
                ceiling: epoch.unwrap_or(0),
                max_ttl_ms: 0,
                active: false,
            });
            let epoch = epoch.unwrap_or(0).max(reservation.ceiling);
            Some((epoch, reservation))
        }
    })
}

pub(super) fn get(
    txn: &ReadTransaction,
    namespace: &str,
    key: &str,
) -> Result<Option<Entry>, Fault> {
    let table = txn.open_table(KV)?;
    let entry = table.get((namespace, key))?.map(|g| {
        let (revision, epoch, value) = g.value();
        Entry {
            value: bytes::Bytes::copy_from_slice(value),
            revision,
            epoch,
        }
    });
    Ok(entry)
}

/// Keys of one namespace sort together (the key is the tuple (namespace, key)), and keys
/// sharing a prefix sort together within it: one forward scan from (namespace, prefix).
pub(super) fn list(
    txn: &ReadTransaction,
    namespace: &str,
    prefix: &str,
    limit: usize,
) -> Result<Vec<String>, Fault> {
    let mut keys = Vec::new();
    if limit == 0 {
        return Ok(keys);
    }
    let table = txn.open_table(KV)?;
    for item in table.range((namespace, prefix)..)? {
        let (stored, _) = item?;
        let (ns, key) = stored.value();
        if ns != namespace || !key.starts_with(prefix) {
            break;
        }
        keys.push(key.to_string());
        if keys.len() == limit {
            break;
        }
    }
    Ok(keys)
}

pub(super) fn high_water(txn: &ReadTransaction, namespace: &str) -> Result<HighWater, Fault> {
    let table = txn.open_table(FENCES)?;
    let mark = table.get(namespace)?.map(|g| {
        let (epoch, seq) = g.value();
        HighWater { epoch, seq }
    });
    match mark {
        Some(mark) => Ok(mark),
        None => Ok(HighWater {
            epoch: restore_floor(txn)?,
            seq: 0,
        }),
    }
}

/// The epoch floor left by the last restore (0 if the file was never restored).
fn restore_floor(txn: &ReadTransaction) -> Result<u64, Fault> {
    let meta = txn.open_table(META)?;
    let floor = meta.get(META_RESTORE_FLOOR)?.map_or(0, |g| g.value());
    Ok(floor)
}
