//! The marks gates in other resources reported (`POST /v1/gates/report`, its `marks`), so
//! that `GET /v1/gates/marks` and the dashboard can show each lock's mark in every
//! resource that protects it beside the built-in store's: a resource still behind the
//! lock's newest writer has not shut the older ones out yet (S10's ordering boundary).
//!
//! ## Invariants
//! - One entry per lock and kind of resource, holding the highest mark reported for it
//!   (several processes may report the same resource, in any order) and when it was last
//!   reported.
//! - Bounded: at most [`MAX_GATE_MARKS`] entries; a new one past that pushes out the entry
//!   reported longest ago, so names a writer made up cannot keep out the real ones for
//!   good.
//!
//! ## What it does not do
//! - Keep anything across a restart, or share it between nodes: it is what this server
//!   heard since it started, and gates report a lock's mark again each time they admit or
//!   refuse a write to it.
//! - Check a report: a principal that may write a lock can report any mark for it.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Mutex, PoisonError};

use palisade_api::wire::{ResourceKind, ResourceMark};
use palisade_core::page::Page;

/// Most (lock, resource kind) entries kept.
pub const MAX_GATE_MARKS: usize = 10_000;

/// The reported marks. See the module docs.
#[derive(Debug, Default)]
pub struct GateMarks {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_lock: BTreeMap<String, BTreeMap<ResourceKind, Entry>>,
    /// Every entry by the order it was last reported in: the eviction order.
    by_age: BTreeMap<u64, (String, ResourceKind)>,
    tick: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    high_water: u64,
    reported_at_ms: u64,
    tick: u64,
}

impl GateMarks {
    /// Takes one reported mark: the entry keeps the higher of it and what it had.
    pub fn report(&self, lock: &str, resource: ResourceKind, high_water: u64, now_ms: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let inner = &mut *inner;
        inner.tick += 1;
        let tick = inner.tick;
        let old = inner
            .by_lock
            .get(lock)
            .and_then(|kinds| kinds.get(&resource))
            .copied();
        match old {
            Some(old) => {
                inner.by_age.remove(&old.tick);
            }
            None if inner.by_age.len() >= MAX_GATE_MARKS => inner.evict_oldest(),
            None => {}
        }
        let entry = Entry {
            high_water: old.map_or(high_water, |o| o.high_water.max(high_water)),
            reported_at_ms: now_ms,
            tick,
        };
        inner
            .by_lock
            .entry(lock.to_owned())
            .or_default()
            .insert(resource, entry);
        inner.by_age.insert(tick, (lock.to_owned(), resource));
    }

    /// One [`Page`] of the locks with marks, in name order, each with its marks by kind
    /// of resource.
    pub fn page(&self, page: &Page) -> Vec<(String, Vec<ResourceMark>)> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner
            .by_lock
            .range::<str, _>((page.start(), Bound::Unbounded))
            .take_while(|(lock, _)| page.holds(lock))
            .take(page.limit)
            .map(|(lock, kinds)| {
                let marks = kinds
                    .iter()
                    .map(|(resource, e)| ResourceMark {
                        resource: *resource,
                        high_water: e.high_water,
                        reported_at_ms: e.reported_at_ms,
                    })
                    .collect();
                (lock.clone(), marks)
            })
            .collect()
    }

    /// How many entries are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.by_age.len()
    }
}

impl Inner {
    fn evict_oldest(&mut self) {
        let Some((_, (lock, resource))) = self.by_age.pop_first() else {
            return;
        };
        if let Some(kinds) = self.by_lock.get_mut(&lock) {
            kinds.remove(&resource);
            if kinds.is_empty() {
                self.by_lock.remove(&lock);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks_of(marks: &GateMarks, lock: &str) -> Vec<(ResourceKind, u64, u64)> {
        marks
            .page(&Page::first(lock, 1))
            .into_iter()
            .filter(|(l, _)| l == lock)
            .flat_map(|(_, m)| m)
            .map(|m| (m.resource, m.high_water, m.reported_at_ms))
            .collect()
    }

    #[test]
    fn keeps_the_highest_mark_and_the_latest_report() {
        let marks = GateMarks::default();
        marks.report("orders", ResourceKind::Postgres, 8, 100);
        marks.report("orders", ResourceKind::Postgres, 7, 200);
        marks.report("orders", ResourceKind::Redis, 3, 300);
        assert_eq!(
            marks_of(&marks, "orders"),
            [
                (ResourceKind::Postgres, 8, 200),
                (ResourceKind::Redis, 3, 300)
            ]
        );
        assert_eq!(marks.len(), 2);
    }

    #[test]
    fn pages_by_name_within_the_prefix() {
        let marks = GateMarks::default();
        for lock in ["a/1", "a/2", "a/3", "b/1"] {
            marks.report(lock, ResourceKind::Sqlite, 1, 1);
        }
        let names = |page: Vec<(String, Vec<ResourceMark>)>| {
            page.into_iter().map(|(l, _)| l).collect::<Vec<_>>()
        };
        assert_eq!(names(marks.page(&Page::first("a/", 2))), ["a/1", "a/2"]);
        assert_eq!(names(marks.page(&Page::new("a/", Some("a/2"), 2))), ["a/3"]);
        assert_eq!(names(marks.page(&Page::new("", Some("a/3"), 10))), ["b/1"]);
        assert!(marks.page(&Page::first("c", 10)).is_empty());
    }

    #[test]
    fn stays_bounded_pushing_out_the_entry_reported_longest_ago() {
        let marks = GateMarks::default();
        marks.report("kept", ResourceKind::Postgres, 1, 1);
        for i in 0..MAX_GATE_MARKS {
            marks.report(&format!("junk/{i}"), ResourceKind::Other, 1, 2);
            if i == 10 {
                // Reported again: no longer the oldest.
                marks.report("kept", ResourceKind::Postgres, 2, 3);
            }
        }
        assert_eq!(marks.len(), MAX_GATE_MARKS);
        assert_eq!(marks_of(&marks, "kept"), [(ResourceKind::Postgres, 2, 3)]);
        assert!(marks_of(&marks, "junk/0").is_empty(), "the oldest went");
        assert!(!marks.page(&Page::first("junk/11", 1)).is_empty());
    }
}
