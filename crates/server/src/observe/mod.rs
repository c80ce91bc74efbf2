//! # Observe: metrics, the events stream and the rejection log of one server
//!
//! [`Observe`] is what the request path tells about what happened: an admitted or a
//! refused mutation (from the fenced store's routes), and, as the issuer's
//! [`LeaseObserver`], every grant, release and expiry. It turns each into counters
//! ([`metrics`]), an event for the stream ([`events`]) and, for stale-token refusals, a
//! rate-limited log line ([`RateLimit`]).
//!
//! ## Invariants
//! - Recording costs the request path an atomic add or two; an event costs a short lock
//!   and a few small copies (its JSON is made later, by the first stream that sends it),
//!   and only happens for lease changes, refusals and marks that advanced, not for every
//!   write.
//! - Memory is bounded: the ring and the live channel have fixed sizes, subscribers are
//!   capped, metric labels come from fixed sets, the gates' reported marks are capped
//!   ([`marks::MAX_GATE_MARKS`]).
//!
//! ## What it does not do
//! - It does not see what other nodes did, except what a backend forwards (the etcd
//!   backend forwards lease changes from etcd's watch; see docs/operations.md).

pub mod events;
pub mod marks;
pub mod metrics;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use palisade_api::wire::ResourceKind;
use palisade_api::ErrorCode;
use palisade_issuer::{LeaseChange, LeaseEvent, LeaseObserver};
use palisade_storage::Applied;

pub use events::{Body, EventBus, DEFAULT_EVENTS_BUFFER, DEFAULT_MAX_SUBSCRIBERS};
pub use marks::GateMarks;
pub use metrics::Metrics;

/// Stale-token log lines allowed per second; the rest are counted and summed up in the
/// next line written.
pub const STALE_LINES_PER_SECOND: u64 = 10;

/// Metrics, events and the rejection log of one server. See the module docs.
pub struct Observe {
    pub metrics: Metrics,
    pub events: EventBus,
    stale_log: RateLimit,
    /// Gate refusals published as events, at most [`GATE_EVENTS_PER_SECOND`].
    gate_events: RateLimit,
    /// The marks gates reported, for `GET /v1/gates/marks`.
    pub gate_marks: GateMarks,
}

/// Most `gate_refused` events published per second, from every gate's reports together:
/// gates report what they saw, so a flood of reports cannot flood the events stream (the
/// counts in `/metrics` are always taken).
pub const GATE_EVENTS_PER_SECOND: u64 = 100;

impl Observe {
    /// Keeps the last `events_buffer` events for at most `max_subscribers` streams.
    pub fn new(events_buffer: usize, max_subscribers: usize) -> Arc<Observe> {
        Arc::new(Observe {
            metrics: Metrics::new(),
            events: EventBus::new(events_buffer, max_subscribers),
            stale_log: RateLimit::new(STALE_LINES_PER_SECOND),
            gate_events: RateLimit::new(GATE_EVENTS_PER_SECOND),
            gate_marks: GateMarks::default(),
        })
    }

    /// A mutation of namespace `lock` was admitted.
    pub fn admitted(&self, lock: &str, applied: &Applied) {
        if applied.replayed {
            return;
        }
        self.metrics.fenced_write();
        if applied.advanced {
            self.events.publish(Body::Fenced {
                lock: lock.to_owned(),
                high_water: applied.high_water.epoch,
                seq: applied.high_water.seq,
            });
        }
    }

    /// A gate in a `resource` refused a write to `lock`'s data (from its report): published
    /// as a `gate_refused` event unless this second's share is used up. Whether it was.
    pub fn gate_refused(
        &self,
        lock: &str,
        resource: ResourceKind,
        code: ErrorCode,
        epoch: Option<u64>,
        high_water: Option<u64>,
    ) -> bool {
        if self.gate_events.allow().is_none() {
            return false;
        }
        self.events.publish(Body::GateRefused {
            lock: lock.to_owned(),
            resource: resource.as_str().into(),
            code: code.as_str().into(),
            epoch,
            high_water,
        });
        true
    }

    /// A mutation of namespace `lock` was refused with `code`. `epoch` is the token's
    /// (if it verified), `high_water` the mark that refused it (stale refusals).
    pub fn refused(
        &self,
        lock: &str,
        code: ErrorCode,
        epoch: Option<u64>,
        high_water: Option<u64>,
    ) {
        self.metrics.rejected(code);
        self.events.publish(Body::Rejected {
            lock: lock.to_owned(),
            code: code.as_str().into(),
            epoch,
            high_water,
        });
        if code.is_fenced() {
            match self.stale_log.allow() {
                Some(0) => tracing::info!(
                    %lock,
                    code = code.as_str(),
                    epoch,
                    high_water,
                    "stale token refused"
                ),
                Some(suppressed) => {
                    self.metrics.log_suppressed(suppressed);
                    tracing::info!(
                        %lock,
                        code = code.as_str(),
                        epoch,
                        high_water,
                        suppressed,
                        "stale token refused ({suppressed} more not logged since the last line)"
                    )
                }
                None => {}
            }
        }
    }
}

impl LeaseObserver for Observe {
    fn lease_event(&self, e: &LeaseEvent<'_>) {
        let (lock, holder, epoch) = (e.lock.to_owned(), e.holder.to_owned(), e.epoch);
        let body = match e.change {
            LeaseChange::Granted => {
                self.metrics.grants.inc();
                Body::Granted {
                    lock,
                    epoch,
                    holder,
                    ttl_ms: e.ttl_ms,
                }
            }
            LeaseChange::Released => {
                self.metrics.releases.inc();
                Body::Released {
                    lock,
                    epoch,
                    holder,
                    cause: "release".into(),
                }
            }
            LeaseChange::Ended => {
                self.metrics.ends.inc();
                Body::Released {
                    lock,
                    epoch,
                    holder,
                    cause: "unknown".into(),
                }
            }
            LeaseChange::Expired => {
                self.metrics.expiries.inc();
                Body::Expired {
                    lock,
                    epoch,
                    holder,
                }
            }
        };
        self.events.publish(body);
    }

    fn gap(&self) {
        self.events.publish_gap();
    }
}

/// At most `per_second` passes per wall-clock second; counts the rest.
pub struct RateLimit {
    per_second: u64,
    start: Instant,
    /// The second (since `start`) the count is for, and passes in it: `second << 20 | n`.
    window: AtomicU64,
    suppressed: AtomicU64,
}

impl RateLimit {
    pub fn new(per_second: u64) -> RateLimit {
        RateLimit {
            per_second: per_second.min((1 << 20) - 1),
            start: Instant::now(),
            window: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)` if a line may be written now, `n` being how many were refused since the
    /// last one that passed; `None` if not.
    pub fn allow(&self) -> Option<u64> {
        let second = self.start.elapsed().as_secs();
        let mut current = self.window.load(Ordering::Relaxed);
        loop {
            let (window, n) = (current >> 20, current & ((1 << 20) - 1));
            let next = if window == second {
                if n >= self.per_second {
                    self.suppressed.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                (second << 20) | (n + 1)
            } else {
                (second << 20) | 1
            };
            match self.window.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(self.suppressed.swap(0, Ordering::AcqRel)),
                Err(seen) => current = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_limit_passes_a_few_and_counts_the_rest() {
        let limit = RateLimit::new(3);
        let first_second: Vec<_> = (0..10).map(|_| limit.allow()).collect();
        // Usually all ten fall in one second; if a second boundary fell in between, the
        // line after it passes and reports what was refused before it.
        let passed: Vec<u64> = first_second.iter().flatten().copied().collect();
        let refused = first_second.iter().filter(|p| p.is_none()).count() as u64;
        assert!(passed.len() >= 3);
        assert_eq!(passed.len() as u64 + refused, 10);
        let reported: u64 = passed.iter().sum();
        assert!(reported <= refused);
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let next = limit.allow().unwrap();
        assert_eq!(
            reported + next,
            refused,
            "every refusal is reported exactly once"
        );
    }
}
