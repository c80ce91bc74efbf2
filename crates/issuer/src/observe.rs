//! Hooks for metrics and the events stream: what an issuer tells about its leases.
//!
//! An issuer given a [`LeaseObserver`] ([`crate::LockService::observe`]) calls it once
//! per change of a lease: granted, released, expired. The embedded issuer calls it while
//! it holds its table's lock, right where the table decided, so the order of the calls is
//! the order of the decisions (a release comes before the grant to the waiter it hands
//! the lock to). An observer must therefore only record (count, queue an event) and
//! return: it must not block, and must not call back into the issuer.
//!
//! A grant is reported when the issuer decides it. If recording it durably fails, the
//! grant is withdrawn and reported [`LeaseChange::Released`] right after.

use palisade_token::Epoch;

/// What happened to a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseChange {
    Granted,
    /// Released by its holder (or withdrawn, see the module docs).
    Released,
    /// Ran past its deadline without renewal.
    Expired,
    /// Ended, but this node cannot tell whether by a release or an expiry (the etcd
    /// backend, for leases released through another node: etcd deletes a lease's keys
    /// the same way for both).
    Ended,
}

impl LeaseChange {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseChange::Granted => "granted",
            LeaseChange::Released => "released",
            LeaseChange::Expired => "expired",
            LeaseChange::Ended => "ended",
        }
    }
}

/// One change of one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseEvent<'a> {
    pub change: LeaseChange,
    pub lock: &'a str,
    pub holder: &'a str,
    pub epoch: Epoch,
    pub lease_id: &'a str,
    /// The lease's TTL (0 where unknown).
    pub ttl_ms: u64,
}

/// Receives [`LeaseEvent`]s. See the module docs for what it may do.
pub trait LeaseObserver: Send + Sync + 'static {
    fn lease_event(&self, event: &LeaseEvent<'_>);

    /// Changes may have been missed (a backend's view of other nodes broke off and was
    /// re-established). Default: nothing.
    fn gap(&self) {}
}

/// Live leases and waiting acquisitions at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    pub leases: u64,
    pub waiters: u64,
}
