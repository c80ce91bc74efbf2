//! Point reads answered from memory, on the caller's own thread.
//!
//! A read of one key (a value, a high-water mark, a lock's record) whose row is in memory
//! needs no disk and no other thread. [`Resident`] looks a key up in the durable
//! in-memory layers (`published`, then the current `frozen`) and then in a [`RowCache`] of
//! rows read from the file before; only a miss in all three goes to the blocking pool,
//! where a [`Filling`] view reads the file and puts what it read into the cache. A page
//! that is not in memory may stall on the disk, and that must not stall a runtime worker
//! serving every other connection; a row in memory cannot.
//!
//! ## Why the cache never answers older than the file
//! A cached row is the durable value of its key when it was read. It stops being that
//! only when a newer value of the key is written; that value is published first (and
//! `published` and `frozen` are looked at before the cache), and it leaves memory only
//! when a checkpoint has written it into the file. So a checkpoint, after its commit and
//! before it drops its frozen layer, forgets every key it wrote from the cache
//! ([`RowCache::checkpointed`]). What is left is a filler that read a key from a file
//! snapshot older than that checkpoint and puts it in the cache after the forgetting: each
//! checkpoint moves the cache's generation on, and a filler puts a row in only under the
//! generation it read before opening its snapshot (the generation and the insert share one
//! mutex, so no insert can slip between a checkpoint's step and its forgetting).
//!
//! Test: `reads_from_memory_never_go_back_across_checkpoints` (`tests/resident.rs`).
//!
//! ## What this does not do
//! - Ranges (lists, the issuer's start-up load) always read the file on the blocking pool.
//! - The cache is bounded by weight ([`RedbOptions::resident_bytes`](super::RedbOptions)),
//!   not by age: a key read once stays until evicted or rewritten.

use std::sync::{Mutex, PoisonError};

use super::layers::{Layers, View};
use super::overlay::{Key, Val};
use super::reads::{Point, ReadError};
use super::schema::Fault;

/// Rows read from the file, bounded by weight.
pub(super) struct RowCache {
    rows: quick_cache::sync::Cache<Key, Option<Val>, Weight>,
    /// The generation: moved on by every checkpoint. Fillers insert only under the
    /// generation they began with; see the module docs.
    generation: Mutex<u64>,
}

/// An entry's weight: about the bytes it holds.
#[derive(Clone)]
struct Weight;

/// Bytes an entry costs beyond its strings and value (the enum, the cache's bookkeeping).
const ENTRY_OVERHEAD: u64 = 96;

impl quick_cache::Weighter<Key, Option<Val>> for Weight {
    fn weight(&self, key: &Key, val: &Option<Val>) -> u64 {
        let key = match key {
            Key::Epoch(a)
            | Key::Reservation(a)
            | Key::Lease(a)
            | Key::Fence(a)
            | Key::Meta(a)
            | Key::Usage(a) => a.len(),
            Key::Kv(a, b) | Key::Idem(a, b) | Key::IdemExpiry(_, a, b) => a.len() + b.len(),
        };
        let val = match val {
            Some(Val::Text(t)) => t.len(),
            Some(Val::Entry(_, _, v)) => v.len(),
            _ => 0,
        };
        ENTRY_OVERHEAD + key as u64 + val as u64
    }
}

impl RowCache {
    /// A cache of about `bytes` (0: none).
    pub fn new(bytes: u64) -> RowCache {
        let items = (bytes / 256).clamp(1, 1 << 20) as usize;
        RowCache {
            rows: quick_cache::sync::Cache::with_weighter(items, bytes.max(1), Weight),
            generation: Mutex::new(0),
        }
    }

    pub(super) fn generation(&self) -> u64 {
        *self
            .generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `key`'s durable value in, if no checkpoint finished since `generation`.
    pub(super) fn fill(&self, generation: u64, key: &Key, val: &Option<Val>) {
        let current = self
            .generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *current == generation {
            self.rows.insert(key.clone(), val.clone());
        }
    }

    /// A checkpoint wrote `rows` into the file: forget them (call after the commit, before
    /// dropping the frozen layer).
    pub fn checkpointed<'r>(&self, rows: impl Iterator<Item = &'r Key>) {
        *self
            .generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += 1;
        for key in rows {
            self.rows.remove(key);
        }
    }

    /// Entries held (for tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.rows.len()
    }
}

/// The in-memory answer to a point read, or [`ReadError::Miss`].
pub(super) struct Resident<'a> {
    pub layers: &'a Layers,
    pub cache: &'a RowCache,
}

impl Point for Resident<'_> {
    fn row(&self, key: &Key) -> Result<Option<Val>, ReadError> {
        match self.layers.in_memory(key) {
            Some(v) => Ok(v),
            None => self.cache.rows.get(key).ok_or(ReadError::Miss),
        }
    }
}

/// A [`View`] that puts every row it reads into the cache.
pub(super) struct Filling<'v, 'a> {
    view: View<'a>,
    cache: &'v RowCache,
    generation: u64,
}

impl<'v, 'a> Filling<'v, 'a> {
    /// Reads the generation, then begins the view (in this order: see the module docs).
    pub fn begin(
        layers: &'a Layers,
        db: &redb::Database,
        cache: &'v RowCache,
    ) -> Result<Filling<'v, 'a>, Fault> {
        let generation = cache.generation();
        let view = View::begin(layers, db)?;
        Ok(Filling {
            view,
            cache,
            generation,
        })
    }
}

impl Point for Filling<'_, '_> {
    fn row(&self, key: &Key) -> Result<Option<Val>, ReadError> {
        let val = self.view.get(key)?;
        self.cache.fill(self.generation, key, &val);
        Ok(val)
    }
}
