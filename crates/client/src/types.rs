//! Wire types: the JSON bodies of docs/api.md. Those the server writes too come from
//! [`palisade_api::wire`] and are re-exported here; the rest are the client's own.
//!
//! Fields the API documents as nullable are `Option`s. Unknown fields are ignored so a
//! newer server can add fields without breaking older clients.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use palisade_api::wire::value_b64;
pub use palisade_api::wire::{
    FenceStatus, KeepaliveInfo, Lease, LockStatus, Proclaimed, PublicKey, SessionInfo,
    SessionLease, TokenCheck,
};

/// How to acquire a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireOptions {
    /// Lease length. The server accepts 50 ms ..= 1 h. A [`crate::LeaseGuard`] renews every
    /// `ttl / 3`, so the TTL bounds how long a paused holder can keep the lock.
    pub ttl: Duration,
    /// Wait in the server's first-come first-served queue for up to this long (server
    /// maximum 300 s). `None` answers `lock_held` at once if the lock is taken.
    pub wait: Option<Duration>,
    /// A value the lease carries while it is held (at most
    /// [`palisade_api::recipes::MAX_LOCK_VALUE_BYTES`]): what a leader advertises. Lock
    /// status shows it; the holder replaces it with [`crate::Client::proclaim`].
    pub value: Option<Vec<u8>>,
    /// This lease's lock-delay (the server's `--lock-delay-ms` when `None`, at most its
    /// `--max-lock-delay-ms`): if the lease *expires*, the lock stays ungrantable this
    /// long, for resources that cannot check tokens.
    pub lock_delay: Option<Duration>,
    /// Acquire in this session (its id): the lease has the session's TTL, is renewed by
    /// the session's keepalive and ends with the session. `ttl` is not sent. Prefer
    /// [`crate::SessionGuard::acquire`].
    pub session: Option<String>,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        AcquireOptions {
            ttl: Duration::from_secs(10),
            wait: None,
            value: None,
            lock_delay: None,
            session: None,
        }
    }
}

/// A lock value as the API carries it: standard base64 with padding.
pub(crate) fn encode_value(value: &[u8]) -> String {
    value_b64::encode(value)
}

/// A stored value with its metadata, from `GET /v1/kv/{lock}/{key}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: bytes::Bytes,
    /// The key's revision (the `ETag`), for `If-Match`.
    pub revision: u64,
    /// The epoch of the holder that wrote this value (`Fencing-Epoch`).
    pub epoch: u64,
}

/// Conditions and metadata for a fenced mutation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// Only apply if the key's current revision equals this (`If-Match`).
    pub if_match: Option<u64>,
    /// Only apply if the key does not exist (`If-None-Match: *`).
    pub if_absent: bool,
    /// Makes retries safe: a repeat with the same key returns the first outcome instead
    /// of applying twice. Fencing alone does not deduplicate (S9).
    pub idempotency_key: Option<String>,
    /// `Fencing-Seq`, required in `sequence` namespaces.
    pub seq: Option<u64>,
}

/// The outcome of an admitted mutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteResult {
    pub revision: u64,
    /// The epoch the write was admitted under.
    pub epoch: u64,
    /// True if this is the stored outcome of an earlier request with the same
    /// idempotency key, not a fresh application.
    #[serde(default)]
    pub replayed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_status_with_nulls() {
        let s: LockStatus = serde_json::from_str(
            r#"{"lock":"a","epoch":0,"holder":null,"lease_id":null,"remaining_ms":null,"waiters":0}"#,
        )
        .unwrap();
        assert_eq!(s.holder, None);
        assert_eq!(s.epoch, 0);
    }

    #[test]
    fn token_check_both_shapes() {
        let bad: TokenCheck =
            serde_json::from_str(r#"{"genuine":false,"reason":"bad signature"}"#).unwrap();
        assert!(!bad.genuine);
        assert_eq!(bad.reason.as_deref(), Some("bad signature"));
        let good: TokenCheck = serde_json::from_str(
            r#"{"genuine":true,"lock":"a","epoch":2,"holder":"h","key_id":"k",
                "current_epoch":3,"current":false,"lease_alive":false}"#,
        )
        .unwrap();
        assert_eq!((good.epoch, good.current), (Some(2), Some(false)));
    }

    #[test]
    fn write_result_defaults_replayed_to_false() {
        let r: WriteResult = serde_json::from_str(r#"{"revision":4,"epoch":2}"#).unwrap();
        assert_eq!(
            r,
            WriteResult {
                revision: 4,
                epoch: 2,
                replayed: false
            }
        );
    }
}
