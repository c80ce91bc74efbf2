//! Read paths: plain functions over a [`View`] (the durable rows of the in-memory index
//! over one snapshot of the database file). They never block the writer, and the writer
//! never blocks them; they see only durable state.
//!
//! The point reads (one value, a high-water mark, a lock's record) are written once over
//! [`Point`], so that the same rule answers from memory on the caller's thread
//! ([`Resident`](super::resident::Resident)) and from the file on the blocking pool.

use std::ops::Bound;

use palisade_core::gate::HighWater;
use palisade_core::lock_table::Reservation;

use super::layers::View;
use super::overlay::{Key, Val};
use super::schema::{Fault, META_RESTORE_FLOOR};
use crate::{Entry, IssuerState, LeaseRecord, NamespaceSummary, Page, Usage};

/// Where a point read finds a key's durable row.
pub(super) trait Point {
    /// The durable value of `key` (`None`: no such row), or [`ReadError::Miss`] when this
    /// source cannot tell without reading the file.
    fn row(&self, key: &Key) -> Result<Option<Val>, ReadError>;
}

/// Why a point read has no answer.
#[derive(Debug)]
pub(super) enum ReadError {
    /// Not in memory: read it from the file, off the runtime's threads.
    Miss,
    Fault(Fault),
}

impl From<Fault> for ReadError {
    fn from(fault: Fault) -> Self {
        ReadError::Fault(fault)
    }
}

impl From<ReadError> for Fault {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Fault(fault) => fault,
            ReadError::Miss => Fault("a read of the file found no row source".to_string()),
        }
    }
}

impl Point for View<'_> {
    fn row(&self, key: &Key) -> Result<Option<Val>, ReadError> {
        Ok(self.get(key)?)
    }
}

/// Feeds `each` every row of `start`'s table.
pub(super) fn each_row(
    view: &View<'_>,
    start: Key,
    each: &mut dyn FnMut(Key, Val) -> Result<(), Fault>,
) -> Result<(), Fault> {
    let mut failed = None;
    view.scan(
        None,
        Bound::Included(&start),
        &|_| true,
        &mut |k, v| match each(k, v) {
            Ok(()) => true,
            Err(fault) => {
                failed = Some(fault);
                false
            }
        },
    )?;
    failed.map_or(Ok(()), Err)
}

pub(super) fn load_issuer(view: &View<'_>) -> Result<IssuerState, Fault> {
    let mut state = IssuerState {
        epoch_floor: restore_floor(view).map_err(Fault::from)?,
        ..IssuerState::default()
    };
    each_row(view, Key::Epoch(String::new()), &mut |key, val| {
        if let (Key::Epoch(lock), Val::U64(epoch)) = (key, val) {
            state.epochs.push((lock, epoch));
        }
        Ok(())
    })?;
    each_row(view, Key::Lease(String::new()), &mut |_, val| {
        if let Val::Text(text) = val {
            let lease: LeaseRecord = serde_json::from_str(&text)?;
            state.leases.push(lease);
        }
        Ok(())
    })?;
    each_row(view, Key::Reservation(String::new()), &mut |key, val| {
        if let (Key::Reservation(lock), Val::Triple(ceiling, max_ttl_ms, active)) = (key, val) {
            let reservation = Reservation {
                ceiling,
                max_ttl_ms,
                active: active != 0,
            };
            state.reservations.push((lock, reservation));
        }
        Ok(())
    })?;
    Ok(state)
}

/// Known locks in name order from the epoch table (every reservation also raises its
/// lock's epoch there, so it names every lock with a record): one [`Page`].
pub(super) fn list_locks(view: &View<'_>, page: &Page) -> Result<Vec<(String, u64)>, Fault> {
    if page.is_empty() {
        return Ok(Vec::new());
    }
    let start = page.start().map(|name| Key::Epoch(name.to_owned()));
    let keep = |k: &Key| matches!(k, Key::Epoch(lock) if page.holds(lock));
    let rows = view.range(None, start.as_ref(), &keep, page.limit)?;
    Ok(rows
        .into_iter()
        .filter_map(|(k, v)| match (k, v) {
            (Key::Epoch(lock), Val::U64(epoch)) => Some((lock, epoch)),
            _ => None,
        })
        .collect())
}

/// One lock's last granted epoch and its reservation (see [`crate::IssuerLog::lock_record`]).
pub(super) fn lock_record(
    view: &(impl Point + ?Sized),
    lock: &str,
) -> Result<Option<(u64, Reservation)>, ReadError> {
    let epoch = match view.row(&Key::Epoch(lock.to_owned()))? {
        Some(Val::U64(e)) => Some(e),
        _ => None,
    };
    let reservation = match view.row(&Key::Reservation(lock.to_owned()))? {
        Some(Val::Triple(ceiling, max_ttl_ms, active)) => Some(Reservation {
            ceiling,
            max_ttl_ms,
            active: active != 0,
        }),
        _ => None,
    };
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
            // The row of a version that raised it to the ceiling may say more than was
            // granted; it never says less.
            Some((epoch.unwrap_or(0), reservation))
        }
    })
}

pub(super) fn get(
    view: &(impl Point + ?Sized),
    namespace: &str,
    key: &str,
) -> Result<Option<Entry>, ReadError> {
    Ok(
        match view.row(&Key::Kv(namespace.to_owned(), key.to_owned()))? {
            Some(Val::Entry(revision, epoch, value)) => Some(Entry {
                value,
                revision,
                epoch,
            }),
            _ => None,
        },
    )
}

/// Keys of one namespace sort together (the key is the tuple (namespace, key)), and keys
/// sharing a prefix sort together within it: one forward scan from (namespace, page start).
pub(super) fn list(view: &View<'_>, namespace: &str, page: &Page) -> Result<Vec<String>, Fault> {
    if page.is_empty() {
        return Ok(Vec::new());
    }
    let start = page
        .start()
        .map(|key| Key::Kv(namespace.to_owned(), key.to_owned()));
    let keep = |k: &Key| matches!(k, Key::Kv(ns, key) if ns == namespace && page.holds(key));
    let rows = view.range(None, start.as_ref(), &keep, page.limit)?;
    Ok(rows
        .into_iter()
        .filter_map(|(k, _)| match k {
            Key::Kv(_, key) => Some(key),
            _ => None,
        })
        .collect())
}

pub(super) fn high_water(
    view: &(impl Point + ?Sized),
    namespace: &str,
) -> Result<HighWater, ReadError> {
    match view.row(&Key::Fence(namespace.to_owned()))? {
        Some(Val::Pair(epoch, seq)) => Ok(HighWater { epoch, seq }),
        // A namespace this file never saw may have been written before a restore: the
        // restore's floor stands in for its lost mark (stored marks were raised to it).
        _ => Ok(HighWater::default().at_least(restore_floor(view)?)),
    }
}

/// Namespaces with a mark, in name order from the fences table: one [`Page`], each with
/// its usage counter (no counter: the namespace holds nothing).
pub(super) fn namespaces(view: &View<'_>, page: &Page) -> Result<Vec<NamespaceSummary>, Fault> {
    if page.is_empty() {
        return Ok(Vec::new());
    }
    let start = page.start().map(|name| Key::Fence(name.to_owned()));
    let keep = |k: &Key| matches!(k, Key::Fence(ns) if page.holds(ns));
    let mut out = Vec::new();
    for (key, val) in view.range(None, start.as_ref(), &keep, page.limit)? {
        let (Key::Fence(name), Val::Pair(epoch, seq)) = (key, val) else {
            continue;
        };
        let usage = match view.get(&Key::Usage(name.clone()))? {
            Some(Val::Pair(keys, bytes)) => Usage { keys, bytes },
            _ => Usage::default(),
        };
        out.push(NamespaceSummary {
            name,
            high_water: HighWater { epoch, seq },
            usage: Some(usage),
        });
    }
    Ok(out)
}

/// The epoch floor left by the last restore (0 if the file was never restored).
pub(super) fn restore_floor(view: &(impl Point + ?Sized)) -> Result<u64, ReadError> {
    Ok(match view.row(&Key::Meta(META_RESTORE_FLOOR.to_owned()))? {
        Some(Val::U64(floor)) => floor,
        _ => 0,
    })
}
