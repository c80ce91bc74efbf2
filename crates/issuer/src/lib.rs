//! # Issuer: the lock service
//!
//! [`LockService`] is what the HTTP layer calls to acquire, renew, release and inspect
//! locks. Every implementation promises the same things:
//!
//! - each successful acquisition of lock `L` gets an epoch larger than every epoch of `L`
//!   issued before, by any node, before or after any crash (S1, S3, S4);
//! - the epoch is durable before [`LockService::acquire`] returns;
//! - a lock is never granted while another lease on it is live;
//! - the returned token is signed by the issuer key, so clients cannot mint or edit one.
//!
//! [`embedded::Issuer`] keeps the lock table in memory (the pure state machine from
//! `palisade-core`) and records grants through a storage [`IssuerLog`]: one node. A
//! distributed implementation keeps the table in a replicated store instead.
//!
//! ## Recipes
//! Both issuers offer the same recipes on top of plain leases: a **value** a lease
//! carries and its holder replaces ([`LockService::proclaim`]), a **lock-delay per
//! lease** ([`Acquire::lock_delay_ms`]), and **sessions** (one keepalive for many
//! leases that expire or are released together: [`LockService::create_session`]).
//! Leader election is built from these by the clients (docs/election.md); the server
//! has nothing election-specific.
//!
//! ## What an issuer does not do
//! - It does not tell resources about new epochs: a resource learns an epoch only by
//!   seeing it (S10).
//! - It does not authenticate anyone (S14).
//!
//! [`IssuerLog`]: palisade_storage::IssuerLog

use async_trait::async_trait;
use palisade_api::QuotaResource;

pub use palisade_core::lock_table::Owner;
use palisade_core::lock_table::{LeaseId, LeaseView, LockView, SessionId, SessionView};
use palisade_core::Millis;
use palisade_storage::{Page, StorageError};
use palisade_token::Epoch;

pub mod core;
pub mod embedded;
pub mod observe;
pub mod value;

pub use embedded::Issuer;
pub use observe::{Census, LeaseChange, LeaseEvent, LeaseObserver};

/// An acquisition, as every [`LockService`] takes it: the lock table's own request (one
/// type, so that a field added to one cannot be dropped on the way to the other). Its
/// `owner` is taken only by an issuer that counts quotas ([`LockService::counts_owners`]);
/// another refuses the acquisition with [`AcquireError::Unsupported`] rather than ignore it.
pub use palisade_core::lock_table::AcquireRequest as Acquire;

/// A lease an issuer granted: what every backend can say of it. How an issuer made it
/// durable (the embedded issuer's reservations) stays inside that issuer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lease {
    pub lock: String,
    pub holder: String,
    pub epoch: Epoch,
    pub lease_id: LeaseId,
    /// The TTL granted (an issuer may round it: etcd counts whole seconds).
    pub ttl_ms: Millis,
    /// The lease's value, if it carries one.
    pub value: Option<Vec<u8>>,
    /// The lock-delay that applies if this lease expires.
    pub lock_delay_ms: Millis,
    /// The session the lease belongs to, if any.
    pub session: Option<SessionId>,
}

impl Lease {
    /// The lease as a view, with `remaining_ms` of its TTL left.
    pub fn view(self, remaining_ms: Millis) -> LeaseView {
        LeaseView {
            lease_id: self.lease_id,
            lock: self.lock,
            holder: self.holder,
            epoch: self.epoch,
            ttl_ms: self.ttl_ms,
            remaining_ms,
            value: self.value,
            lock_delay_ms: self.lock_delay_ms,
            session: self.session,
        }
    }
}

/// A durable grant, with its signed token.
#[derive(Debug, Clone)]
pub struct Granted {
    pub lease: Lease,
    pub token: String,
}

/// Why an acquisition did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    #[error("lock is held")]
    Held {
        holder: Option<String>,
        retry_after_ms: Millis,
    },
    /// A quota would be exceeded (`resource` is limited to `limit`); nothing changed.
    #[error("quota exceeded: {resource} is limited to {limit}")]
    QuotaExceeded { resource: QuotaResource, limit: u64 },
    /// The acquisition names a session that has ended or never existed; nothing changed.
    #[error("session expired or unknown")]
    NoSession,
    /// The acquisition asks for something this issuer does not do (`what`); nothing
    /// changed. An issuer refuses what it cannot honour rather than ignore it.
    #[error("this issuer does not support {what}")]
    Unsupported { what: &'static str },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Why a keepalive, release or proclaim did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("lease expired or unknown")]
    Expired,
    /// The caller may not act on this live lease (its [`MayAct`] said no); nothing
    /// changed. Carries the lease, so that the caller can say why (its lock, its holder).
    #[error("the lease is not the caller's to act on")]
    NotYours(Box<LeaseView>),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Why a session call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The session expired, was closed or never existed.
    #[error("session expired or unknown")]
    Expired,
    /// A quota would be exceeded (`resource` is limited to `limit`); nothing changed.
    #[error("quota exceeded: {resource} is limited to {limit}")]
    QuotaExceeded { resource: QuotaResource, limit: u64 },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Who may act on a lease: asked with the live lease's lock and holder by the issuer
/// itself, in the same step as the keepalive, release or proclaim it guards, so that
/// nothing can change between the check and the act and the lease is looked up once.
/// `None`: anyone may (authentication off). A `false` answers [`LeaseError::NotYours`].
pub type MayAct<'a> = Option<&'a dyn Ownership>;

/// The check behind [`MayAct`]. Called under the issuer's lock: it must be quick and
/// must not call the issuer.
pub trait Ownership: Send + Sync {
    /// Whether the caller may act on the live lease on `lock` held by `holder`.
    fn may_act(&self, lock: &str, holder: &str) -> bool;
}

impl<F: Fn(&str, &str) -> bool + Send + Sync> Ownership for F {
    fn may_act(&self, lock: &str, holder: &str) -> bool {
        self(lock, holder)
    }
}

/// A session to create: its id (chosen by the caller, unique), holder and TTL, and whose
/// lease quota it counts against.
pub type SessionRequest = palisade_core::lock_table::SessionRequest;

/// The lock service, as the API layer sees it.
#[async_trait]
pub trait LockService: Send + Sync + 'static {
    /// Acquires a lock, waiting up to `req.wait_ms` in line. The epoch is durable when
    /// this returns Ok.
    async fn acquire(&self, req: Acquire) -> Result<Granted, AcquireError>;
    /// Whether this issuer counts leases and waits against [`Acquire::owner`]'s quotas;
    /// one that does not refuses an acquisition that names an owner.
    fn counts_owners(&self) -> bool;
    /// Renews a lease for a full TTL from now, if `may` lets the caller act on it.
    async fn keepalive(&self, lease_id: &str, may: MayAct<'_>) -> Result<LeaseView, LeaseError>;
    /// Releases a lease, if `may` lets the caller act on it; the lock passes to the next
    /// waiter.
    async fn release(&self, lease_id: &str, may: MayAct<'_>) -> Result<LeaseView, LeaseError>;
    /// A lock's state (epoch 0 and no lease if never acquired).
    async fn status(&self, lock: &str) -> Result<LockView, StorageError>;
    /// Known locks, one [`Page`] in name order. Read from an ordered index, not by sorting
    /// every lock, and never holding up acquisitions and renewals while it reads.
    async fn list(&self, page: Page) -> Result<Vec<LockView>, StorageError>;
    /// Replaces the value of a live lease (`None` clears it), if `may` lets the caller
    /// act on it. Answers once the new value is as durable as the lease itself (see each
    /// issuer).
    async fn proclaim(
        &self,
        lease_id: &str,
        value: Option<Vec<u8>>,
        may: MayAct<'_>,
    ) -> Result<LeaseView, LeaseError>;
    /// Creates a session: one keepalive for every lease acquired in it
    /// ([`AcquireRequest::session`]).
    async fn create_session(&self, req: SessionRequest) -> Result<SessionView, SessionError>;
    /// Renews a session and every lease in it for a full TTL from now.
    async fn keepalive_session(&self, session_id: &str) -> Result<SessionView, SessionError>;
    /// A live session with its leases (to check who owns it before acting on it).
    async fn session(&self, session_id: &str) -> Result<Option<SessionView>, StorageError>;
    /// Ends a session: releases every lease in it at once (no lock-delay) and answers
    /// the leases it released.
    async fn close_session(&self, session_id: &str) -> Result<SessionView, SessionError>;
    /// The server is stopping: answer every acquisition waiting in line now, and any
    /// that would start waiting from now on, with [`StorageError::Closed`] (HTTP 503
    /// `unavailable`),
    /// instead of letting them wait. Locks held stay held. Default: nothing to answer.
    async fn close(&self) {}

    /// Whether the service stopped for good: every call fails until the server restarts
    /// (the embedded issuer after an internal error). `GET /healthz` reports it. Default:
    /// never.
    fn is_stopped(&self) -> bool {
        false
    }

    /// Tells `observer` of every grant, release and expiry from now on (see
    /// [`observe`]). Default: nothing is told.
    fn observe(&self, observer: std::sync::Arc<dyn LeaseObserver>) {
        let _ = observer;
    }

    /// Live leases and waiting acquisitions right now, for metrics (`None`: this service
    /// cannot say).
    async fn census(&self) -> Option<Census> {
        None
    }
}
