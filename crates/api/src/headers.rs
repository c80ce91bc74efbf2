//! Header names of the fenced store's routes (lower case, as HTTP/2 and `http` spell them).

/// The fencing token a mutation carries (request).
pub const FENCING_TOKEN: &str = "fencing-token";
/// The sequence number of a write in a `sequence` namespace (request).
pub const FENCING_SEQ: &str = "fencing-seq";
/// An idempotency key: a retried write with the same key is answered, not applied again
/// (request).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// `true` when a write's answer was replayed from an earlier request with the same
/// idempotency key (response).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// The epoch of the write that produced a value (response of a read).
pub const FENCING_EPOCH: &str = "fencing-epoch";
/// The id of the last event a client received, to resume an events stream after it
/// (request of `GET /v1/events`, `GET /v1/locks/{lock}/events`; what browsers'
/// `EventSource` sends on reconnect).
pub const LAST_EVENT_ID: &str = "last-event-id";
/// The id of a backup taken while serving (response of `POST /v1/admin/backup`).
pub const BACKUP_ID: &str = "palisade-backup-id";
/// No lock had an epoch above this in a backup taken while serving (an upper bound that
/// counts reservation ceilings; response of `POST /v1/admin/backup`).
pub const BACKUP_EPOCH_BOUND: &str = "palisade-backup-epoch-bound";
