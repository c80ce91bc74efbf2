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
