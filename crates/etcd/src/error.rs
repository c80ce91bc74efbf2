//! Mapping etcd's errors onto Palisade's.
//!
//! Anything etcd says that is not a decision Palisade asked for becomes a
//! [`StorageError`]: [`StorageError::Unavailable`] when etcd could not be reached or did
//! not answer, [`StorageError::LeaseGone`] when the lease of the records is gone,
//! [`StorageError::Contended`] after too many lost races, [`StorageError::Failed`] for the
//! rest (a value that does not decode, an answer etcd should not give). The server
//! answers each 503 `storage_failed` and changes nothing it has not had confirmed.
//! Unlike the embedded backend, nothing latches: the next operation asks etcd again, since
//! etcd, not this process, holds the state.

use palisade_storage::StorageError;

/// An etcd call that failed.
pub(crate) fn storage(what: &str, e: etcd_client::Error) -> StorageError {
    let message = format!("etcd {what}: {e}");
    if is_lease_not_found(&e) {
        StorageError::LeaseGone(message)
    } else if unavailable(&e) || never_reached_etcd(&e) || is_transport(&e) {
        StorageError::Unavailable(message)
    } else {
        StorageError::Failed(message)
    }
}

/// Whether the call failed on its way to etcd (the connection, not etcd's answer).
fn is_transport(e: &etcd_client::Error) -> bool {
    matches!(
        e,
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_)
    )
}

/// A value under `key` that does not decode: someone else wrote Palisade's keys, or a
/// newer layout. Refuse rather than guess.
pub(crate) fn corrupt(key: &[u8], why: impl std::fmt::Display) -> StorageError {
    StorageError::Failed(format!(
        "etcd key {:?} holds a value Palisade cannot read: {why}",
        String::from_utf8_lossy(key)
    ))
}

/// Whether etcd said the lease does not exist (expired or revoked).
pub(crate) fn is_lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => status.message().contains("lease not found"),
        etcd_client::Error::LeaseKeepAliveError(message) => message.contains("lease not found"),
        _ => false,
    }
}

/// gRPC's UNAVAILABLE status code.
const GRPC_UNAVAILABLE: i32 = 14;

/// Whether etcd answered UNAVAILABLE: a transient condition (leader changed, no leader,
/// member going away), though a write may still have been applied.
pub(crate) fn unavailable(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => i32::from(status.code()) == GRPC_UNAVAILABLE,
        _ => false,
    }
}

/// Whether etcd certainly did not receive or act on the call: the connection to the
/// member was refused, or the member refused the call because it has no leader.
pub(crate) fn never_reached_etcd(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            let message = status.message();
            message.contains("tcp connect error") || message.contains("no leader")
        }
        _ => false,
    }
}
