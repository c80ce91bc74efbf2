//! What clients may make the server hold: the server-wide limits and their defaults,
//! and each principal's share of them.

/// Default of [`ServerConfig::max_value_bytes`](crate::ServerConfig::max_value_bytes): 1 MiB.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 1024 * 1024;

/// Limits on what clients may make the server hold. Exceeding one answers 429
/// `quota_exceeded` and changes nothing. The per-principal ones apply with authentication
/// on, where an auth file principal may lower or raise them for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest lease TTL anyone may ask for (a principal's `max_ttl_ms` may lower it).
    pub max_ttl_ms: u64,
    /// Live leases one principal may hold at once.
    pub max_leases_per_principal: u32,
    /// Acquisitions one principal may have waiting in line at once.
    pub max_waiters_per_principal: u32,
    /// Acquisitions that may wait in line for one lock.
    pub max_waiters_per_lock: u32,
    /// Locks the issuer keeps in memory at once (idle locks whose state is on disk leave
    /// memory to make room; a lock that cannot get a place is refused).
    pub max_locks: usize,
    /// Longest lock-delay an acquisition may choose (`lock_delay_ms`).
    pub max_lock_delay_ms: u64,
    /// Sessions the embedded issuer keeps at once (each is also one lease of its
    /// principal's quota).
    pub max_sessions: usize,
    /// Events streams one principal may have open at once (of the server's
    /// `max_event_subscribers`).
    pub max_event_subscribers_per_principal: u32,
}

impl Limits {
    /// The quota an acquisition by `caller` counts against: its principal's (with its own
    /// limits where the auth file sets them); none with authentication off.
    pub fn owner_for(
        &self,
        caller: &crate::auth::Caller,
    ) -> Option<palisade_core::lock_table::Owner> {
        let p = caller.principal()?;
        Some(palisade_core::lock_table::Owner {
            name: p.name.as_str().into(),
            max_leases: p.limits.max_leases.unwrap_or(self.max_leases_per_principal),
            max_waiters: p
                .limits
                .max_waiters
                .unwrap_or(self.max_waiters_per_principal),
        })
    }

    /// Whose place an events stream of `caller` takes, and how many that principal may
    /// have open; none with authentication off.
    pub fn event_streams_for<'c>(
        &self,
        caller: &'c crate::auth::Caller,
    ) -> Option<(&'c str, usize)> {
        let p = caller.principal()?;
        let limit = p
            .limits
            .max_event_subscribers
            .unwrap_or(self.max_event_subscribers_per_principal);
        Some((p.name.as_str(), limit as usize))
    }

    /// The longest TTL `caller` may ask for.
    pub fn max_ttl_for(&self, caller: &crate::auth::Caller) -> u64 {
        caller
            .principal()
            .and_then(|p| p.limits.max_ttl_ms)
            .map_or(self.max_ttl_ms, |own| own.min(self.max_ttl_ms))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_ttl_ms: 3_600_000,
            max_leases_per_principal: 10_000,
            max_waiters_per_principal: 10_000,
            max_waiters_per_lock: 1_000,
            max_locks: 1_000_000,
            max_lock_delay_ms: palisade_api::recipes::DEFAULT_MAX_LOCK_DELAY_MS,
            max_sessions: 100_000,
            max_event_subscribers_per_principal: 16,
        }
    }
}
