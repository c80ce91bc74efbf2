//! Every open connection's state, and the choice of which one to close when the cap is
//! reached.
//!
//! A connection is in one of three phases, derived from counters its own task updates
//! (the task that runs hyper on it: the I/O wrapper, the service and the response body
//! all run there) and that the accept loop reads from another thread:
//!
//! - **busy**: the router has a request whose response is not yet fully written
//!   (`started > flushed`). Never chosen for eviction, never timed out.
//! - **reading**: bytes of a request head have arrived since the last response was
//!   written; the head must be complete within the header timeout.
//! - **idle**: nothing in progress since `since`; closed after the idle timeout (the
//!   header timeout if it never sent a request).
//!
//! Eviction picks the non-busy connection whose phase began longest ago: an idle
//! keep-alive connection or a client that is slow to send its head. A connection that
//! turned busy between that choice and its task seeing the order finishes its response
//! first and closes after it (see `connection.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Milliseconds since the server started: cheap to store in an atomic.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    start: Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Clock {
            start: Instant::now(),
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn instant(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }
}

/// What the server asks of a connection's task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Order {
    None = 0,
    /// Close to make room for a new connection (unless busy: then after the response).
    Evict = 1,
    /// The server is stopping: close if not busy, otherwise after the response.
    Drain = 2,
    /// The grace period is over: close now.
    Close = 3,
}

/// One connection's shared state.
#[derive(Debug)]
pub(crate) struct ConnSlot {
    id: u64,
    /// Requests handed to the router.
    pub(crate) started: AtomicU64,
    /// Responses whose body hyper has finished with (dropped).
    pub(crate) finished: AtomicU64,
    /// Responses known to be fully written to the socket.
    pub(crate) flushed: AtomicU64,
    /// Bytes of a new request head arrived since the last response was written.
    pub(crate) reading: AtomicBool,
    /// Start of the current phase, in [`Clock`] milliseconds.
    pub(crate) since: AtomicU64,
    order: AtomicU8,
    pub(crate) wake: Notify,
}

impl ConnSlot {
    fn new(id: u64, now_ms: u64) -> Self {
        ConnSlot {
            id,
            started: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            reading: AtomicBool::new(false),
            since: AtomicU64::new(now_ms),
            order: AtomicU8::new(Order::None as u8),
            wake: Notify::new(),
        }
    }

    /// A request is being served and its response is not fully written.
    pub(crate) fn is_busy(&self) -> bool {
        self.started.load(Relaxed) > self.flushed.load(Relaxed)
    }

    /// May be closed to make room: not busy, and not told to go already.
    fn evictable(&self) -> bool {
        !self.is_busy() && self.order() == Order::None
    }

    /// When the current phase times out (None while busy).
    pub(crate) fn deadline_ms(&self, header_ms: u64, idle_ms: u64) -> Option<u64> {
        let started = self.started.load(Relaxed);
        if started > self.flushed.load(Relaxed) {
            return None;
        }
        let since = self.since.load(Relaxed);
        // A new connection must send its first request as promptly as any head.
        let limit = if started == 0 || self.reading.load(Relaxed) {
            header_ms
        } else {
            idle_ms
        };
        Some(since.saturating_add(limit))
    }

    pub(crate) fn order(&self) -> Order {
        match self.order.load(Relaxed) {
            1 => Order::Evict,
            2 => Order::Drain,
            3 => Order::Close,
            _ => Order::None,
        }
    }

    /// Raises the order (a stronger order is never replaced by a weaker one).
    fn give(&self, order: Order) {
        self.order.fetch_max(order as u8, Relaxed);
        self.wake.notify_one();
    }
}

/// The set of open connections, with the cap.
#[derive(Debug)]
pub(crate) struct Registry {
    slots: Mutex<Slots>,
    cap: usize,
    pub(crate) clock: Clock,
    /// Signalled whenever a connection leaves the set.
    pub(crate) left: Notify,
}

#[derive(Debug, Default)]
struct Slots {
    next_id: u64,
    open: HashMap<u64, Arc<ConnSlot>>,
}

impl Registry {
    pub(crate) fn new(cap: usize) -> Self {
        Registry {
            slots: Mutex::new(Slots::default()),
            cap: cap.max(1),
            clock: Clock::new(),
            left: Notify::new(),
        }
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        // The map stays consistent even if a holder panicked: every update is one call.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn len(&self) -> usize {
        self.slots().open.len()
    }

    /// True if a new connection can be admitted now, by taking a free place or by
    /// evicting a connection that is not busy (and not already leaving).
    pub(crate) fn can_admit(&self) -> bool {
        let slots = self.slots();
        slots.open.len() < self.cap || slots.open.values().any(|s| s.evictable())
    }

    /// Registers a new connection if there is room: a free place, or one made by evicting
    /// the longest-idle connection that is not busy. The evicted one stays in the set,
    /// counted, until it has closed: it refuses any request that reaches it after the
    /// eviction (`connection.rs`), so it closes at once, and a burst of connections that
    /// each send a request cannot take the server past the cap by evicting connections
    /// whose requests then run uncounted. `None` when every connection is busy (they all
    /// became busy since [`Registry::can_admit`] said yes): the caller holds the new
    /// connection, unserved, until [`Registry::left`] says a place may be free.
    pub(crate) fn try_admit(&self) -> Option<Arc<ConnSlot>> {
        let now = self.clock.now_ms();
        let mut slots = self.slots();
        if slots.open.len() >= self.cap {
            let victim = slots
                .open
                .values()
                .filter(|s| s.evictable())
                .min_by_key(|s| s.since.load(Relaxed))?;
            tracing::debug!(
                id = victim.id,
                "connection cap reached: closing the longest-idle connection"
            );
            victim.give(Order::Evict);
        }
        slots.next_id += 1;
        let slot = Arc::new(ConnSlot::new(slots.next_id, now));
        slots.open.insert(slot.id, slot.clone());
        Some(slot)
    }

    /// Removes a connection that ended.
    pub(crate) fn remove(&self, slot: &ConnSlot) {
        self.slots().open.remove(&slot.id);
        self.left.notify_waiters();
    }

    /// Gives every open connection `order`.
    pub(crate) fn order_all(&self, order: Order) {
        for slot in self.slots().open.values() {
            slot.give(order);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn eviction_takes_the_longest_idle_connection_never_a_busy_one() {
        let registry = Registry::new(3);
        let busy = registry.try_admit().unwrap();
        busy.started.store(1, Relaxed);
        let old_idle = registry.try_admit().unwrap();
        let new_idle = registry.try_admit().unwrap();
        old_idle.since.store(5, Relaxed);
        new_idle.since.store(10, Relaxed);
        busy.since.store(0, Relaxed);
        assert!(registry.can_admit());
        let fourth = registry.try_admit().unwrap();
        assert_eq!(old_idle.order(), Order::Evict);
        assert_eq!(new_idle.order(), Order::None);
        assert_eq!(busy.order(), Order::None);
        // The evicted one counts until it has closed, and is not evicted twice.
        assert_eq!(registry.len(), 4);
        new_idle.started.store(1, Relaxed);
        fourth.started.store(1, Relaxed);
        assert!(!registry.can_admit(), "only busy or leaving connections");
        registry.remove(&old_idle);
        assert_eq!(registry.len(), 3);

        // Only busy connections left: the cap holds admission.
        assert!(!registry.can_admit());
    }

    #[test]
    fn deadlines_follow_the_phase() {
        let slot = ConnSlot::new(1, 100);
        // Fresh connection: the header timeout from accept.
        assert_eq!(slot.deadline_ms(10, 60), Some(110));
        slot.started.store(1, Relaxed);
        assert_eq!(slot.deadline_ms(10, 60), None);
        slot.flushed.store(1, Relaxed);
        slot.since.store(200, Relaxed);
        assert_eq!(slot.deadline_ms(10, 60), Some(260));
        slot.reading.store(true, Relaxed);
        assert_eq!(slot.deadline_ms(10, 60), Some(210));
    }
}
