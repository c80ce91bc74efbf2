//! Wire types: serde mirrors of the JSON bodies in docs/api.md.
//!
//! Fields the API documents as nullable are `Option`s. Unknown fields are ignored so a
//! newer server can add fields without breaking older clients.

use std::time::Duration;

use serde::{Deserialize, Serialize};

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
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(value)
}

/// Reads a base64 lock value as the server sends it.
mod value_b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.serialize_some(&super::encode_value(v)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| {
            base64::engine::general_purpose::STANDARD
                .decode(t)
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

/// A granted lease: `POST /v1/locks/{lock}/acquire` → 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub lock: String,
    pub holder: String,
    /// The ownership generation: 1, 2, 3, ... per lock, never repeated.
    pub epoch: u64,
    /// The signed fencing token to attach to every mutation.
    pub token: String,
    pub lease_id: String,
    pub ttl_ms: u64,
    /// The value the lease carries (absent from servers before lock values).
    #[serde(default, with = "value_b64", skip_serializing_if = "Option::is_none")]
    pub value: Option<Vec<u8>>,
    /// The lock-delay that applies if the lease expires.
    #[serde(default)]
    pub lock_delay_ms: u64,
    /// The session the lease belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// `POST /v1/leases/{lease_id}/keepalive` → 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepaliveInfo {
    pub lease_id: String,
    pub lock: String,
    pub epoch: u64,
    /// The lease runs this long from the moment the server handled the keepalive.
    pub ttl_ms: u64,
}

/// One lock's status, from `GET /v1/locks[/{lock}]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockStatus {
    pub lock: String,
    /// The last epoch issued (0 if never acquired).
    pub epoch: u64,
    /// `None` while the lock is free.
    pub holder: Option<String>,
    pub lease_id: Option<String>,
    pub remaining_ms: Option<u64>,
    /// How many acquirers are queued.
    pub waiters: u64,
    /// The live lease's epoch (its token's); `epoch` is the last one issued, which can be
    /// higher after a restart of the embedded issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_epoch: Option<u64>,
    /// What the holder advertises (`None` while free or when it advertises nothing).
    #[serde(default, with = "value_b64", skip_serializing_if = "Option::is_none")]
    pub value: Option<Vec<u8>>,
    /// The lock-delay that applies if the live lease expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_delay_ms: Option<u64>,
    /// The live lease's session (shown to its owner only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

/// `POST /v1/leases/{lease_id}/proclaim` → 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proclaimed {
    pub lease_id: String,
    pub lock: String,
    pub epoch: u64,
    #[serde(default, with = "value_b64")]
    pub value: Option<Vec<u8>>,
}

/// A session, from `POST /v1/sessions` and the session routes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub session_id: String,
    pub holder: String,
    pub ttl_ms: u64,
    pub remaining_ms: u64,
    /// Its live leases (for a close: the ones the close released).
    pub leases: Vec<SessionLease>,
}

/// A lease of a session, as [`SessionInfo`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionLease {
    pub lease_id: String,
    pub lock: String,
    pub epoch: u64,
}

/// An issuer public key, from `GET /v1/keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicKey {
    pub key_id: String,
    /// Always `"Ed25519"` today.
    pub alg: String,
    /// base64url of the 32-byte key.
    pub public_key: String,
    /// `active` (signs new tokens) or `verifying` (its tokens still verify). Absent from
    /// servers before key rotation. A key listed with any other status is not trusted
    /// by [`crate::IssuerKeys`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// `POST /v1/tokens/check` → 200: the issuer's online verdict on a token (Chubby's
/// CheckSequencer).
///
/// When `genuine` is false only `reason` is set; when true, every other field is.
/// Note that `current && lease_alive` is a snapshot: the answer can be out of date by the
/// time it arrives. Only a resource's high-water check at the moment of the write fences.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenCheck {
    pub genuine: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_epoch: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_alive: Option<bool>,
    /// Why the token is not genuine (the `invalid_token` message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A namespace's fence state, from `GET /v1/fences/{lock}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceStatus {
    pub lock: String,
    /// The largest epoch admitted (0 if nothing ever was).
    pub high_water: u64,
    /// The sequence number admitted with `high_water` (sequence namespaces).
    #[serde(default)]
    pub seq: Option<u64>,
    /// The namespace's equal-epoch policy, e.g. `"epoch"` or `"sequence"`.
    pub policy: String,
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

/// `{"locks":[...]}`
#[derive(Deserialize)]
pub(crate) struct LocksBody {
    pub locks: Vec<LockStatus>,
}

/// `{"keys":[...]}` from `GET /v1/keys`.
#[derive(Deserialize)]
pub(crate) struct KeysBody {
    pub keys: Vec<PublicKey>,
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
