//! Quotas and forgetting: what each owner holds (leases and waiting acquisitions, counted
//! against its [`super::Owner`] limits), and making room at `max_locks` by forgetting
//! idle locks while the epoch floor rises above them.

use std::collections::HashMap;

use super::{Event, Lock, LockTable, Millis, NOT_IDLE};

/// What one owner holds now.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Held {
    pub(super) leases: u32,
    pub(super) waiters: u32,
}

impl LockTable {
    /// Makes room: every lock that is idle (no lease, no waiter, no lock-delay, no grace,
    /// reservation marked inactive) leaves the table, the floor rises above all their
    /// epochs, and [`Event::Forgotten`] tells the caller. A lock whose last lease expired
    /// goes like one whose lease was released: the removal of the expired lease's record
    /// is queued, and the next grant of the lock, met again, waits for a reservation
    /// written after it, so nothing is granted before the expiry is on disk. One pass over the table; when it frees less
    /// than a sixteenth of `max_locks`, the next pass waits a second, so that a table full
    /// of live locks does not pay a pass for every refused newcomer.
    pub(super) fn forget_idle(&mut self, now: Millis) {
        if now < self.next_sweep_at {
            return;
        }
        let before = self.locks.len();
        let mut floor = self.epoch_floor;
        self.locks.retain(|_, lock| {
            let idle = lock.lease.is_none()
                && lock.queue.is_empty()
                && lock.delay_until <= now
                && !lock.durable.active
                && lock.idle_since == NOT_IDLE;
            if idle {
                floor = floor.max(lock.last_epoch).max(lock.durable.ceiling);
            }
            !idle
        });
        let freed = before - self.locks.len();
        if freed < (self.config.max_locks / 16).max(1) {
            self.next_sweep_at = now.saturating_add(1000);
        }
        if self.locks.len() < self.locks.capacity() / 4 {
            // Most of the table went: give its slots back (a million of them are ~50 MB),
            // keeping room for as many locks again as are left.
            self.locks.shrink_to(self.locks.len() * 2);
        }
        if freed > 0 {
            self.epoch_floor = floor;
            self.events.push(Event::Forgotten {
                count: freed,
                floor,
            });
        }
    }

    /// Whether the table holds lock `name` now (a lock it never met, or forgot to make
    /// room, is not held; its epochs continue above the floor).
    pub fn knows(&self, name: &str) -> bool {
        self.locks.contains_key(name)
    }

    /// Number of locks in the table.
    pub fn lock_count(&self) -> usize {
        self.locks.len()
    }
}

/// The owner of a lock's (just granted) lease.
pub(super) fn grant_owner(lock: &Lock) -> Option<&str> {
    lock.lease.as_ref().and_then(|l| l.owner.as_deref())
}

/// Adds to an owner's counts, dropping owners that hold nothing.
pub(super) fn count(owners: &mut HashMap<Box<str>, Held>, owner: &str, leases: i32, waiters: i32) {
    if !owners.contains_key(owner) {
        owners.insert(owner.into(), Held::default());
    }
    let Some(held) = owners.get_mut(owner) else {
        return;
    };
    held.leases = held.leases.saturating_add_signed(leases);
    held.waiters = held.waiters.saturating_add_signed(waiters);
    if held.leases == 0 && held.waiters == 0 {
        owners.remove(owner);
    }
}
