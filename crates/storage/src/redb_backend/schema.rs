//! The on-disk layout: table definitions, record encodings and the error type of the
//! redb code paths.
//!
//! Every record is either a fixed-width redb type or small JSON; redb checks the types of
//! a table against the stored definition when it is opened, so a file written with a
//! different layout fails loudly instead of being misread. [`FORMAT_VERSION`] is kept in
//! the meta table for the same reason: a later layout change bumps it and an older binary
//! refuses the file.

use redb::TableDefinition;

pub(super) use crate::IdemRecord;
use crate::StorageError;

/// Version of this layout, stored under [`META_FORMAT`]. Version 1 had no usage counters
/// and no expiry index; [`super::open`] migrates it.
pub(super) const FORMAT_VERSION: u64 = 2;

/// lock name -> last epoch issued for it.
pub(super) const EPOCHS: TableDefinition<&str, u64> = TableDefinition::new("issuer_epochs");
/// lock name -> reservation (ceiling, max TTL in ms, active as 0/1).
pub(super) const RESERVATIONS: TableDefinition<&str, (u64, u64, u64)> =
    TableDefinition::new("issuer_reservations");
/// lease id -> JSON [`crate::LeaseRecord`].
pub(super) const LEASES: TableDefinition<&str, &str> = TableDefinition::new("issuer_leases");
/// namespace -> high-water mark (epoch, seq).
pub(super) const FENCES: TableDefinition<&str, (u64, u64)> = TableDefinition::new("fences");
/// (namespace, key) -> (revision, epoch, value).
pub(super) const KV: TableDefinition<(&str, &str), (u64, u64, &[u8])> = TableDefinition::new("kv");
/// Named counters: [`META_REVISION`] and [`META_FORMAT`].
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// (namespace, idempotency key) -> JSON [`IdemRecord`].
pub(super) const IDEMPOTENCY: TableDefinition<(&str, &str), &str> =
    TableDefinition::new("idempotency");
/// (created at, namespace, idempotency key) -> (): the idempotency records in the order
/// they expire, so the purge reads only expired ones. One entry per record, always.
pub(super) const IDEM_EXPIRY: TableDefinition<(u64, &str, &str), ()> =
    TableDefinition::new("idempotency_expiry");
/// namespace -> (keys, bytes of keys and values): the quota counters, kept in the same
/// transaction as every write. A namespace without data has no entry.
pub(super) const USAGE: TableDefinition<&str, (u64, u64)> = TableDefinition::new("ns_usage");

/// Global store revision: bumped by every put and delete, in any namespace (as etcd's).
pub(super) const META_REVISION: &str = "revision";
pub(super) const META_FORMAT: &str = "format_version";
/// The newest log record the file holds (its commit sequence number); 0 if none.
pub(crate) const META_CHECKPOINT_SEQ: &str = "checkpoint_seq";
/// The store's random id, in two halves: every log segment names it, so a segment of
/// another store is never replayed into this one.
pub(super) const META_STORE_ID_HI: &str = "store_id_hi";
pub(super) const META_STORE_ID_LO: &str = "store_id_lo";
/// The floor the last restore raised every epoch counter and mark to: locks and
/// namespaces the restored file does not know start there, not at zero.
pub(crate) const META_RESTORE_FLOOR: &str = "restore_epoch_floor";

/// Something went wrong below the backend: an I/O or database error, or a record that
/// does not decode. Never the caller's fault; it latches the backend failed.
#[derive(Debug)]
pub(super) struct Fault(pub String);

macro_rules! fault_from {
    ($($t:ty),+ $(,)?) => {$(
        impl From<$t> for Fault {
            fn from(e: $t) -> Self {
                Fault(e.to_string())
            }
        }
    )+};
}

fault_from!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    serde_json::Error,
);

impl Fault {
    /// The error callers see, naming the database file so an operator knows where to look.
    pub(super) fn into_storage(self, path: &str) -> StorageError {
        StorageError::Failed(format!("redb database {path}: {}", self.0))
    }
}
