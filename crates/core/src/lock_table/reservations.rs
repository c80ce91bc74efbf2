//! Reservations and idle marks: what must be durable before a grant is answered (see
//! the parent module's docs), how a confirmed write raises it, and when a lock that fell
//! idle says so ([`Event::Idle`]), at once or after [`super::TableConfig::idle_grace_ms`].

use std::cmp::Reverse;

use super::{lock_entry, Epoch, Event, LockTable, Millis, NOT_IDLE};

/// The durable promise about one lock; see the module docs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reservation {
    /// No epoch above this has been issued.
    pub ceiling: Epoch,
    /// While active, a lease of up to this TTL may be live.
    pub max_ttl_ms: Millis,
    /// Whether a lease may be live.
    pub active: bool,
}

impl Reservation {
    pub(super) fn covers(&self, epoch: Epoch, ttl_ms: Millis) -> bool {
        self.active && epoch <= self.ceiling && ttl_ms <= self.max_ttl_ms
    }

    /// What is durable once `next` is written over `self`: the ceiling never goes down;
    /// the TTL never goes down while the reservation stays active, and is `next`'s
    /// otherwise (an inactive reservation has no live lease to cover, and the next active
    /// one starts from its own); `active` is `next`'s.
    ///
    /// The one rule for the table's picture of the disk, the embedded store's records
    /// (`palisade_storage`'s `Tx::reserve`) and the simulator's disk.
    pub fn merge(&mut self, next: Reservation) {
        let still_active = self.active && next.active;
        self.ceiling = self.ceiling.max(next.ceiling);
        self.max_ttl_ms = if still_active {
            self.max_ttl_ms.max(next.max_ttl_ms)
        } else {
            next.max_ttl_ms
        };
        self.active = next.active;
    }
}

impl LockTable {
    /// Rebuilds reservations after a restart: epochs continue above each ceiling, and a
    /// lock whose reservation was active stays ungrantable for its `max_ttl_ms` (plus the
    /// lock-delay) from `now`, since a lease granted under it may still be live (its record may not have
    /// reached the disk).
    pub fn restore_reservations(
        &mut self,
        now: Millis,
        reservations: impl IntoIterator<Item = (String, Reservation)>,
    ) {
        for (name, r) in reservations {
            let lock = lock_entry(&mut self.locks, self.epoch_floor, name.clone());
            lock.last_epoch = lock.last_epoch.max(r.ceiling);
            lock.durable.merge(r);
            if r.active {
                let block = r.max_ttl_ms.saturating_add(self.config.lock_delay_ms);
                lock.delay_until = lock.delay_until.max(now.saturating_add(block));
                self.timers.push(Reverse((lock.delay_until, name)));
            }
        }
    }

    /// Makes every lock the table does not know yet start above `floor`. A restore from
    /// backup sets one: locks first used after the backup was taken are not in it.
    pub fn set_epoch_floor(&mut self, floor: Epoch) {
        self.epoch_floor = floor;
        for lock in self.locks.values_mut() {
            lock.last_epoch = lock.last_epoch.max(floor);
        }
    }

    /// Records that `reservation` of `lock`, made for a grant of `generation`, is durable.
    ///
    /// A reservation made before the lock's latest idle marker is ignored: the marker was
    /// queued after it, so on disk the marker wins (the lock is inactive, its TTL reset),
    /// and the table must not believe otherwise.
    pub fn confirm(&mut self, now: Millis, lock: &str, reservation: Reservation, generation: u32) {
        if let Some(l) = self
            .locks
            .get_mut(lock)
            .filter(|l| l.generation == generation)
        {
            let idle = l.lease.is_none() && l.queue.is_empty() && l.delay_until <= now;
            l.durable.merge(reservation);
            // The lock fell idle while the reservation was being written: say so again.
            if idle {
                self.fell_idle(now, lock);
            }
        }
    }

    /// The lock is free with nobody waiting: mark it idle now, or once it has stayed so
    /// for [`TableConfig::idle_grace_ms`] (a timer brings it back here).
    pub(super) fn fell_idle(&mut self, now: Millis, name: &str) {
        let grace = self.config.idle_grace_ms;
        let Some(lock) = self.locks.get_mut(name) else {
            return;
        };
        if !lock.durable.active {
            lock.idle_since = NOT_IDLE;
            return;
        }
        if lock.idle_since == NOT_IDLE {
            lock.idle_since = now;
        }
        let since = lock.idle_since;
        let due = since.saturating_add(grace);
        if due <= now {
            lock.idle_since = NOT_IDLE;
            self.mark_idle(name);
        } else if since == now {
            self.timers.push(Reverse((due, name.to_owned())));
        }
    }

    /// Emits [`Event::Idle`] once for a lock whose durable reservation is still active.
    fn mark_idle(&mut self, name: &str) {
        if let Some(lock) = self.locks.get_mut(name) {
            if lock.durable.active {
                lock.durable.active = false;
                lock.durable.max_ttl_ms = 0;
                lock.generation = lock.generation.wrapping_add(1);
                self.events.push(Event::Idle {
                    lock: name.to_owned(),
                    reservation: lock.durable,
                });
            }
        }
    }
}
