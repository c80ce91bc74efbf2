//! # Storage: where Palisade's promises become durable
//!
//! Two traits, one per role that needs a disk:
//!
//! - [`IssuerLog`], the **issuer's records**: the last epoch issued per lock, its durable
//!   reservation and the live lease records, so that after a crash no epoch is reissued
//!   and leases granted before the crash are honoured for a full TTL;
//! - [`FencedStore`], the **fenced store**: namespaces of keys, each guarded by the lock of
//!   the same name, with the namespace's high-water mark stored beside its data.
//!
//! Every fenced mutation is one [`FencedOp`]: the backend reads the namespace's mark, the
//! key, the idempotency record and the namespace's usage, asks the one pure rule
//! ([`decide()`]: idempotency, the gate, preconditions, quotas) what to do and, only if it
//! admits the operation, writes the new mark and the mutation **in one transaction**, then
//! makes it durable before answering. A distributed backend expresses the same as one
//! compare-and-put transaction (compare the revisions it read, put what was decided).
//!
//! The embedded backend ([`redb_backend::RedbBackend`]) is a write-ahead log in front of
//! one redb file: a single writer thread groups waiting operations into one log record,
//! a syncer fdatasyncs the log once per group (overlapping with the next group's work) and
//! only then answers each caller, and a checkpointer writes the rows into the redb file
//! in the background. Opening replays the log and refuses a log or file that would roll
//! acknowledged commits back.
//!
//! ## Invariants
//! - "Ok" means fsync'd. A crash may lose only operations that were never acknowledged.
//! - A rejected operation writes nothing (not the mark, not the data, not an idempotency
//!   record).
//! - After an I/O error the backend latches into a failed state and refuses every later
//!   write with [`StorageError::Failed`] (fail-stop): it never continues from a state it
//!   cannot vouch for.
//! - There is no unfenced write path: [`FencedStore`] offers no way to change a namespace
//!   without passing the gate.
//!
//! ## What this layer does not do
//! - It does not verify token signatures or check that a token names the namespace's lock;
//!   the server does that before building a [`FencedOp`]. The backend trusts the epoch it
//!   is given.
//! - It does not look at the lock table to decide anything: a namespace learns a newer
//!   epoch only by seeing it in an operation (S10).

use palisade_api::QuotaResource;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use palisade_core::gate::{GateError, HighWater, Policy};
use palisade_core::lock_table::Reservation;
use palisade_token::Epoch;

pub mod atomic_file;
pub mod decide;
pub mod fingerprint;
pub mod observe;
pub mod redb_backend;

pub use decide::{decide, Decision, IdemRecord, KeyState, Seen, Usage};
pub use fingerprint::fingerprint;
pub use palisade_core::page::Page;

/// A lease as the issuer records it, so it can be honoured after a restart.
///
/// A record whose `lock` is empty (no lock has an empty name) is a **session's** record:
/// `lease_id` is then the session id, `session` names it too, and `epoch` is 0. The fields
/// after `ttl_ms` are absent from records written before they existed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub lease_id: String,
    pub lock: String,
    pub holder: String,
    pub epoch: Epoch,
    pub ttl_ms: u64,
    /// The value the holder advertises (standard base64), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The lease's own lock-delay, if it chose one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_delay_ms: Option<u64>,
    /// The session the lease belongs to (for a session's own record: its id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

impl LeaseRecord {
    /// Whether this is a session's record rather than a lease's.
    pub fn is_session(&self) -> bool {
        self.lock.is_empty()
    }
}

/// What the issuer needs back after a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IssuerState {
    /// Last epoch issued, per lock.
    pub epochs: Vec<(String, Epoch)>,
    /// Leases that were live (not released) when last recorded.
    pub leases: Vec<LeaseRecord>,
    /// The durable reservation of each lock (see `palisade_core::lock_table`).
    pub reservations: Vec<(String, Reservation)>,
    /// Locks with no record start above this epoch (set by a restore from backup, which
    /// cannot know every lock used after the backup was taken).
    pub epoch_floor: Epoch,
}

/// An issuer record written with the next commit, without anyone waiting for it. Losing
/// one in a crash is safe by construction: a lost lease record makes its holder's lease
/// unknown after a restart (its lock still waits out the reservation's TTL), a lost
/// removal or idle marker only makes a lock wait one TTL after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LazyRecord {
    Lease(LeaseRecord),
    RemoveLease(String),
    Reservation {
        lock: String,
        reservation: Reservation,
    },
}

/// A precondition on the key's current revision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Precondition {
    #[default]
    None,
    /// The key must exist with exactly this revision (`If-Match`).
    Revision(u64),
    /// The key must not exist (`If-None-Match: *`).
    Absent,
}

impl Precondition {
    /// Checks the key's current revision (`None`: no such key). Every backend checks it
    /// before "not found", as HTTP orders them: a delete with `If-Match` on a missing key
    /// is a mismatch.
    pub fn check(self, current: Option<u64>) -> Result<(), ApplyError> {
        let ok = match self {
            Precondition::None => true,
            Precondition::Revision(wanted) => current == Some(wanted),
            Precondition::Absent => current.is_none(),
        };
        if ok {
            Ok(())
        } else {
            Err(ApplyError::RevisionMismatch { current })
        }
    }
}

/// The mutation a fenced operation carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Put {
        key: String,
        value: Bytes,
        precondition: Precondition,
    },
    Delete {
        key: String,
        precondition: Precondition,
    },
    /// Barrier: advance the high-water mark, write no data.
    Fence,
}

/// An idempotency key with a fingerprint of the request it was first used for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    pub key: String,
    /// Digest of the request ([`fingerprint()`]: action, key, value, precondition, epoch,
    /// sequence); a reuse of the key for a different request is refused with
    /// [`ApplyError::IdempotencyConflict`].
    pub fingerprint: String,
}

impl Idempotency {
    /// The idempotency of a request under `key`, fingerprinted with [`fingerprint()`].
    pub fn for_request(key: String, epoch: Epoch, seq: Option<u64>, action: &Action) -> Self {
        Idempotency {
            key,
            fingerprint: fingerprint(epoch, seq, action),
        }
    }
}

/// One fenced mutation of namespace `namespace`, already verified to carry a genuine
/// token for the lock of the same name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedOp {
    pub namespace: String,
    pub epoch: Epoch,
    pub seq: Option<u64>,
    pub policy: Policy,
    pub idempotency: Option<Idempotency>,
    pub action: Action,
}

/// The outcome of an admitted operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// Store revision of the write (for a fence: the store's current revision).
    pub revision: u64,
    /// The epoch the operation carried.
    pub epoch: Epoch,
    /// The namespace's mark after the operation.
    pub high_water: HighWater,
    /// True when this outcome was replayed from an earlier request with the same
    /// idempotency key, and nothing was applied now.
    #[serde(default)]
    pub replayed: bool,
    /// True when this operation raised the namespace's mark (its epoch, or with the
    /// sequence policy its sequence): what the events stream reports as `fenced`. False
    /// for a replay.
    #[serde(default)]
    pub advanced: bool,
}

/// One namespace in a listing ([`FencedStore::namespaces`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceSummary {
    pub name: String,
    pub high_water: HighWater,
    /// Its keys and bytes, as its quota counter holds them; `None` when the backend has
    /// no counter for it (etcd, for a namespace only ever fenced, or last written before
    /// counters existed: its next put or delete counts it).
    pub usage: Option<Usage>,
}

/// A stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: Bytes,
    /// Store revision of the write that produced this value.
    pub revision: u64,
    /// Epoch carried by that write.
    pub epoch: Epoch,
}

/// Default of [`StoreLimits::max_keys_per_namespace`]: one million keys.
pub const DEFAULT_MAX_KEYS_PER_NAMESPACE: u64 = 1_000_000;
/// Default of [`StoreLimits::max_bytes_per_namespace`]: 1 GiB of keys and values.
pub const DEFAULT_MAX_BYTES_PER_NAMESPACE: u64 = 1 << 30;
/// Default of [`StoreLimits::idempotency_retention`]: 24 hours.
pub const DEFAULT_IDEMPOTENCY_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// What the fenced store lets one namespace hold, and how long it remembers an
/// idempotency key. Every backend enforces the same limits with the same rule
/// ([`decide()`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Most keys one namespace may hold. A put that would create a key beyond it is
    /// refused with [`ApplyError::QuotaExceeded`] (`resource: "keys"`).
    pub max_keys_per_namespace: u64,
    /// Most bytes of keys plus values one namespace may hold (key length + value length
    /// per entry, without any storage overhead). A put that would grow the namespace
    /// beyond it is refused (`resource: "bytes"`).
    pub max_bytes_per_namespace: u64,
    /// How long an idempotency record is kept. After it, the key is forgotten: a request
    /// carrying it is neither replayed nor refused as a conflict, but applied afresh, and
    /// the record is purged in the background so the disk stays bounded. Measured on the
    /// wall clock, so that it survives restarts.
    pub idempotency_retention: Duration,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            max_keys_per_namespace: DEFAULT_MAX_KEYS_PER_NAMESPACE,
            max_bytes_per_namespace: DEFAULT_MAX_BYTES_PER_NAMESPACE,
            idempotency_retention: DEFAULT_IDEMPOTENCY_RETENTION,
        }
    }
}

impl StoreLimits {
    /// The retention in milliseconds (saturating).
    pub fn retention_ms(&self) -> u64 {
        u64::try_from(self.idempotency_retention.as_millis()).unwrap_or(u64::MAX)
    }
}

/// The wall clock a backend stamps idempotency records with: milliseconds since the Unix
/// epoch. Wall-clock time, unlike a monotonic clock, means the same after a restart.
/// Tests pass a clock they move by hand.
#[derive(Clone)]
pub struct WallClock(Arc<dyn Fn() -> u64 + Send + Sync>);

impl WallClock {
    /// The system clock. A clock set before 1970 reads as 0.
    pub fn system() -> Self {
        WallClock(Arc::new(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        }))
    }

    /// A clock reading `now`.
    pub fn from_fn(now: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        WallClock(Arc::new(now))
    }

    /// Milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        (self.0)()
    }
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock::system()
    }
}

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WallClock")
    }
}

/// Two clocks are equal when they are the same clock.
impl PartialEq for WallClock {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for WallClock {}

/// Storage failures. Not the caller's fault. Every variant but [`StorageError::Closed`]
/// answers 503 `storage_failed` on the wire; the variants tell the code that handles them
/// what happened, so none of it has to read a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// An I/O or database error happened, or stored data cannot be read; the embedded
    /// backend refuses writes from now on (latched).
    #[error("storage failed: {0}")]
    Failed(String),
    /// The backend could not be asked or did not answer in time (etcd: unreachable, no
    /// leader, no answer within the request timeout). Nothing latched: the next operation
    /// asks again. A write may or may not have been applied.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The operation lost its compare-and-swap race every time it tried (etcd); nothing
    /// was written by it. Trying again later may succeed.
    #[error("storage contended: {0}")]
    Contended(String),
    /// The backend lease that records were attached to is gone (etcd: expired or
    /// revoked); the records went with it.
    #[error("storage lease gone: {0}")]
    LeaseGone(String),
    /// The backend is shutting down.
    #[error("storage is shut down")]
    Closed,
}

/// Why a fenced operation was not applied. In every case nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Gate(#[from] GateError),
    #[error("revision mismatch (current revision {current:?})")]
    RevisionMismatch { current: Option<u64> },
    #[error("key not found")]
    NotFound,
    #[error("idempotency key reused for a different request")]
    IdempotencyConflict,
    /// The put would take its namespace over a quota of [`StoreLimits`]; nothing was
    /// written.
    #[error("namespace quota exceeded: {resource} is limited to {limit}")]
    QuotaExceeded {
        /// `"keys"` or `"bytes"` (keys plus values).
        resource: QuotaResource,
        limit: u64,
    },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A durable write already handed to the log: it resolves once the write is on disk (or
/// with the failure that keeps it from getting there). The write is queued when the call
/// that returns this is made, in the order of those calls, not when this is first polled;
/// dropping it does not withdraw the write.
pub type Queued =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StorageError>> + Send>>;

/// The issuer's durable records: epochs, reservations and lease records. Only the
/// embedded issuer keeps them here; the etcd issuer keeps its own in etcd.
///
/// Writes are queued in call order, lazy or waited: the issuer queues them under its own
/// lock, in the order it decided them, and awaits the waited ones afterwards.
#[async_trait]
pub trait IssuerLog: Send + Sync + 'static {
    /// Reads back the issuer's records (at startup).
    async fn load_issuer(&self) -> Result<IssuerState, StorageError>;

    /// Durably records a lock's reservation (raising its last epoch to the ceiling, never
    /// lowering it), and the lease of the grant that needed it. Queued now; resolves once
    /// fsync'd.
    fn reserve(&self, lock: &str, reservation: Reservation, lease: Option<LeaseRecord>) -> Queued;

    /// Queues an issuer record for the next commit without waiting (see [`LazyRecord`]).
    fn record_lazily(&self, record: LazyRecord);

    /// Removes a lease record (released or expired). Removing an unknown lease is Ok.
    /// Queued now; resolves once fsync'd.
    fn remove_lease(&self, lease_id: &str) -> Queued;

    /// Known locks (every lock that ever had a durable epoch or reservation record), in
    /// name order, one [`Page`], each with the last epoch granted that a record reached the disk for
    /// (0 if none; never a reservation's ceiling). Read from the ordered on-disk index in one read transaction: it sees
    /// committed state only and never holds up the writer, so listing a million locks
    /// page by page costs the issuer nothing.
    async fn list_locks(&self, page: Page) -> Result<Vec<(String, Epoch)>, StorageError>;

    /// One lock's durable record: the last epoch granted that a record reached the disk
    /// for, and its reservation, whose ceiling bounds every epoch granted (`None`: no
    /// record at all; the issuer's epoch floor applies). For an issuer that dropped an
    /// idle lock from memory. Sees committed state only: a record queued with
    /// [`IssuerLog::record_lazily`] shows once its batch has committed.
    async fn lock_record(&self, lock: &str) -> Result<Option<(Epoch, Reservation)>, StorageError>;

    /// Whether the log has latched a failure.
    fn is_failed(&self) -> bool;
}

/// The fenced store: namespaces of keys, each guarded by the lock of the same name. Every
/// mutation is one [`FencedOp`] decided by [`decide()`] and committed in one durable
/// transaction; there is no other way to change a namespace.
#[async_trait]
pub trait FencedStore: Send + Sync + 'static {
    /// Gate + mutation in one durable transaction.
    async fn apply(&self, op: FencedOp) -> Result<Applied, ApplyError>;

    /// Reads one key.
    async fn get(&self, namespace: &str, key: &str) -> Result<Option<Entry>, StorageError>;

    /// Lists one [`Page`] of a namespace's keys, in order.
    async fn list(&self, namespace: &str, page: Page) -> Result<Vec<String>, StorageError>;

    /// The namespace's high-water mark (default if never written).
    async fn high_water(&self, namespace: &str) -> Result<HighWater, StorageError>;

    /// Namespaces with a high-water mark (every namespace a mutation was ever admitted
    /// to), in name order, one [`Page`], each with its mark and what it holds. One page of an
    /// ordered index, read without holding up the writer: paging through a million
    /// namespaces costs each page only its own rows.
    async fn namespaces(&self, page: Page) -> Result<Vec<NamespaceSummary>, StorageError>;

    /// Whether the backend has latched a failure.
    fn is_failed(&self) -> bool;

    /// Graceful shutdown: stops taking writes, finishes and answers the ones already
    /// queued, and releases the backend's resources (for a file: so it can be opened
    /// again). Later calls on any handle answer [`StorageError::Closed`]. Idempotent. The
    /// default does nothing, for backends with nothing to release.
    async fn close(&self) {}
}

/// [`FencedStore`] under the name it had when one trait covered both roles, for callers
/// that have not moved to the new name yet.
pub use self::FencedStore as Backend;
