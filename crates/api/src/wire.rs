//! The JSON bodies of the HTTP contract (docs/api.md), defined once for the server that
//! writes them and the clients that read them.
//!
//! Field names and skip rules are the wire format: a field marked
//! `skip_serializing_if` is absent when empty, every other `Option` is sent as `null`.
//! Readers ignore fields they do not know (except in requests, which the server checks
//! strictly), so a newer server may add fields without breaking older clients.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Lock values travel as standard base64 with padding (RFC 4648); this module is the
/// `serde(with)` adapter for an `Option<Vec<u8>>` field.
pub mod value_b64 {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    /// The wire text of a value.
    pub fn encode(value: &[u8]) -> String {
        STANDARD.encode(value)
    }

    pub fn serialize<S: Serializer>(value: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.serialize_some(&encode(v)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| STANDARD.decode(t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// Every error answer: `{"error":{"code":...,"message":...,...extra}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

/// The inside of an error answer. `code` is an [`crate::ErrorCode`]'s text (kept as text
/// so a reader survives codes newer than itself); the extra fields depend on the code
/// (e.g. `high_water` and `epoch` for `stale_token`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    #[serde(default)]
    pub message: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ErrorEnvelope {
    /// An error answer with no extra fields.
    pub fn new(code: crate::ErrorCode, message: impl Into<String>) -> Self {
        ErrorEnvelope {
            error: ErrorBody {
                code: code.as_str().to_owned(),
                message: message.into(),
                extra: Map::new(),
            },
        }
    }
}

/// `POST /v1/locks/{lock}/acquire`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// Who holds the lease. With authentication on, an optional label after the
    /// principal's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Required unless `session` is given (the session's TTL applies then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// How long to wait in the queue; 0 answers `lock_held` at once.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub wait_ms: u64,
    /// What the holder advertises: standard base64 (checked by the server, which
    /// refuses an oversized text before decoding it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// This lease's lock-delay (default: the server's `--lock-delay-ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_delay_ms: Option<u64>,
    /// Acquire inside this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A granted lease: `POST /v1/locks/{lock}/acquire` → 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub lock: String,
    pub holder: String,
    /// The ownership generation, per lock, never repeated.
    pub epoch: u64,
    /// The signed fencing token to attach to every mutation.
    pub token: String,
    pub lease_id: String,
    pub ttl_ms: u64,
    /// The lock-delay that applies if the lease expires (0 from servers before
    /// per-lease lock-delay).
    #[serde(default)]
    pub lock_delay_ms: u64,
    /// The value the lease carries.
    #[serde(default, with = "value_b64", skip_serializing_if = "Option::is_none")]
    pub value: Option<Vec<u8>>,
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

/// One lock's status, from `GET /v1/locks[/{lock}]`. Every field is sent; the optional
/// ones as `null` while the lock is free (or, for `lease_id` and `session`, when the
/// reader is not the holder).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockStatus {
    pub lock: String,
    /// The lock's epoch: the live lease's, or the last one granted (0 if never acquired);
    /// never a reservation's ceiling.
    pub epoch: u64,
    pub holder: Option<String>,
    pub lease_id: Option<String>,
    pub remaining_ms: Option<u64>,
    /// How many acquirers are queued.
    pub waiters: u64,
    /// The live lease's epoch (its token's), equal to `epoch`; null while free.
    #[serde(default)]
    pub lease_epoch: Option<u64>,
    /// What the holder advertises.
    #[serde(default, with = "value_b64")]
    pub value: Option<Vec<u8>>,
    /// The lock-delay that applies if the live lease expires.
    #[serde(default)]
    pub lock_delay_ms: Option<u64>,
    /// The live lease's session (shown to its owner only).
    #[serde(default)]
    pub session: Option<String>,
    /// No epoch above this was granted for the lock: `epoch`, or more where grants may
    /// have gone unrecorded (after a restart of the embedded issuer, the reservation's
    /// ceiling). What `palisade admin raise-marks` raises a restored resource's marks to.
    /// Absent from servers before it.
    #[serde(default)]
    pub epoch_bound: Option<u64>,
}

/// `POST /v1/leases/{lease_id}/release` → 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Released {
    pub lease_id: String,
    pub lock: String,
    pub epoch: u64,
    pub released: bool,
}

/// `POST /v1/leases/{lease_id}/proclaim`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProclaimRequest {
    /// The new value (standard base64), or `null` to clear it.
    pub value: Option<String>,
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

/// `POST /v1/sessions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// Who holds the session (as for a lease: with authentication on, an optional label
    /// after the principal's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    pub ttl_ms: u64,
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

/// `GET /v1/locks` → 200: one page of locks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockList {
    pub locks: Vec<LockStatus>,
    /// Pass as `after` for the next page; `null` on the last page.
    #[serde(default)]
    pub next: Option<String>,
}

/// `POST /v1/tokens/check`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenCheckRequest {
    pub token: String,
}

/// `POST /v1/tokens/check` → 200: the issuer's online verdict on a token (Chubby's
/// CheckSequencer).
///
/// When `genuine` is false only `reason` is set; when true, every other field is.
/// `current && lease_alive` is a snapshot: the answer can be out of date by the time it
/// arrives. Only a resource's high-water check at the moment of the write fences.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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

/// An admitted put or delete: `PUT`/`DELETE /v1/kv/{lock}/{key}` → 200. A replayed
/// answer says so in the `Idempotent-Replayed` header, not in the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteAnswer {
    pub revision: u64,
    /// The epoch the write was admitted under.
    pub epoch: u64,
}

/// An admitted barrier: `POST /v1/fences/{lock}` → 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceAnswer {
    pub lock: String,
    /// The namespace's mark after the barrier.
    pub high_water: u64,
    /// The epoch the barrier carried.
    pub epoch: u64,
}

/// A namespace's fence state: `GET /v1/fences/{lock}` → 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceStatus {
    pub lock: String,
    /// The largest epoch admitted (0 if nothing ever was).
    pub high_water: u64,
    /// The sequence number admitted with `high_water` (sequence namespaces). Always sent;
    /// `None` only from a server that did not send it.
    #[serde(default)]
    pub seq: Option<u64>,
    /// The namespace's equal-epoch policy, e.g. `"epoch"` or `"sequence"`.
    pub policy: String,
}

/// One page of a namespace's keys: `GET /v1/kv/{lock}` → 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyList {
    pub lock: String,
    pub keys: Vec<String>,
}

/// An issuer public key, as `GET /v1/keys` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicKey {
    pub key_id: String,
    /// Always `"Ed25519"` today.
    pub alg: String,
    /// base64url of the 32-byte key.
    pub public_key: String,
    /// `active` (signs new tokens) or `verifying` (its tokens still verify). Absent from
    /// servers before key rotation; readers must not trust a key with any other status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// `GET /v1/keys` → 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysAnswer {
    pub keys: Vec<PublicKey>,
}

/// `GET /healthz` → 200 (`{"status":"ok"}`); a failed store answers `storage_failed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
}

/// One namespace of the fenced store, as `GET /v1/fences` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceInfo {
    pub lock: String,
    /// The largest epoch admitted.
    pub high_water: u64,
    /// The sequence number admitted with `high_water` (sequence namespaces).
    pub seq: u64,
    /// The namespace's equal-epoch policy, e.g. `"epoch"` or `"sequence"`.
    pub policy: String,
    /// How many keys it holds; `null` when the backend has not counted it yet.
    pub keys: Option<u64>,
    /// How many bytes its keys and values take; `null` like `keys`.
    pub bytes: Option<u64>,
}

/// `GET /v1/fences` → 200: one page of namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceList {
    pub namespaces: Vec<NamespaceInfo>,
    /// Pass as `after` for the next page; `null` on the last page.
    #[serde(default)]
    pub next: Option<String>,
}

/// One signing key, as the admin routes (and `palisade admin keys list`) show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminKey {
    pub key_id: String,
    /// Always `"Ed25519"` today.
    pub alg: String,
    /// base64url of the 32-byte key.
    pub public_key: String,
    /// `active`, `verifying` or `retired`.
    pub status: String,
    /// `key_set`, or `trust_file` for a `--trust-key-file` key (always `verifying`).
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired_at: Option<u64>,
}

/// `GET /v1/admin/keys` → 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminKeys {
    /// The active key's id.
    pub active: String,
    pub keys: Vec<AdminKey>,
}

/// `POST /v1/admin/keys/rotate` → 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeysRotated {
    pub active: String,
    /// The key that was active before and is now verifying.
    pub previous: String,
    pub keys: Vec<AdminKey>,
}

/// `POST /v1/admin/keys/{key_id}/retire` → 200.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRetired {
    pub retired: String,
    /// False when the key was already retired (nothing changed).
    pub changed: bool,
    pub active: String,
    pub keys: Vec<AdminKey>,
}

/// One event of the events streams (`GET /v1/events`, `GET /v1/locks/{lock}/events`),
/// the `data` of a Server-Sent Event: `{"id":...,"at_ms":...,"type":...,...}` (docs/api.md,
/// "Events"). `B` is [`EventBody`], or a reference to one for a writer that keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event<B = EventBody> {
    /// Increasing; send the last one seen as `Last-Event-ID` to resume.
    pub id: u64,
    /// Wall-clock milliseconds since the Unix epoch when the server published it.
    pub at_ms: u64,
    #[serde(flatten)]
    pub body: B,
}

/// What an [`Event`] says, by its `type`. A reader skips types it does not know.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventBody {
    /// A lease was granted.
    Granted {
        lock: String,
        epoch: u64,
        holder: String,
        ttl_ms: u64,
    },
    /// A lease ended by release (`cause: "release"`), or (etcd backend) ended through
    /// another node, by a release or an expiry the server cannot tell apart
    /// (`cause: "unknown"`).
    Released {
        lock: String,
        epoch: u64,
        holder: String,
        cause: Cow<'static, str>,
    },
    /// A lease ran past its deadline without renewal.
    Expired {
        lock: String,
        epoch: u64,
        holder: String,
    },
    /// A namespace's high-water mark advanced to `high_water` (and `seq`, for the
    /// sequence policy).
    Fenced {
        lock: String,
        high_water: u64,
        seq: u64,
    },
    /// A mutation of the namespace was refused with `code`; `epoch` is the token's (when
    /// it verified), `high_water` the mark that refused it (stale refusals).
    Rejected {
        lock: String,
        code: Cow<'static, str>,
        epoch: Option<u64>,
        high_water: Option<u64>,
    },
    /// A gate in another resource (`resource`: a [`ResourceKind`]) refused a write to
    /// `lock`'s data with `code`, as its report to the server says (`POST
    /// /v1/gates/report`); `epoch` is the writer's token's, `high_water` the resource's
    /// mark that refused it, when the gate knows them.
    GateRefused {
        lock: String,
        resource: Cow<'static, str>,
        code: Cow<'static, str>,
        epoch: Option<u64>,
        high_water: Option<u64>,
    },
    /// Events may have been missed (`reason`: `unknown_last_event_id`, `lagged` or
    /// `gap`): read the state again.
    Reset { reason: Cow<'static, str> },
}

impl EventBody {
    /// The event's `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            EventBody::Granted { .. } => "granted",
            EventBody::Released { .. } => "released",
            EventBody::Expired { .. } => "expired",
            EventBody::Fenced { .. } => "fenced",
            EventBody::Rejected { .. } => "rejected",
            EventBody::GateRefused { .. } => "gate_refused",
            EventBody::Reset { .. } => "reset",
        }
    }

    /// The lock it is about (none for a reset).
    pub fn lock(&self) -> Option<&str> {
        match self {
            EventBody::Granted { lock, .. }
            | EventBody::Released { lock, .. }
            | EventBody::Expired { lock, .. }
            | EventBody::Fenced { lock, .. }
            | EventBody::Rejected { lock, .. }
            | EventBody::GateRefused { lock, .. } => Some(lock),
            EventBody::Reset { .. } => None,
        }
    }
}

/// The kind of resource a gate guards: the label of the gate counters in `/metrics` and a
/// field of `gate_refused` events. A fixed set, so that the metrics' series stay bounded
/// whatever gates report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceKind {
    Postgres,
    Mysql,
    Redis,
    Sqlite,
    ObjectStore,
    Other,
}

impl ResourceKind {
    pub const ALL: &'static [ResourceKind] = &[
        ResourceKind::Postgres,
        ResourceKind::Mysql,
        ResourceKind::Redis,
        ResourceKind::Sqlite,
        ResourceKind::ObjectStore,
        ResourceKind::Other,
    ];

    /// Its name on the wire and in metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::Postgres => "postgres",
            ResourceKind::Mysql => "mysql",
            ResourceKind::Redis => "redis",
            ResourceKind::Sqlite => "sqlite",
            ResourceKind::ObjectStore => "object_store",
            ResourceKind::Other => "other",
        }
    }
}

/// Most refusals one gate report may carry in `recent`.
pub const MAX_REPORTED_REFUSALS: usize = 100;

/// Most marks one gate report may carry in `marks`.
pub const MAX_REPORTED_MARKS: usize = 100;

/// `POST /v1/gates/report`: what a gate admitted and refused since its last report. The
/// counts go to `/metrics` (by resource kind and code, never by lock), each of `recent`
/// to the events stream as a `gate_refused` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateReport {
    pub resource: ResourceKind,
    /// Writes the gate admitted since its last report.
    #[serde(default)]
    pub admitted: u64,
    /// Writes it refused since its last report, by error code (`stale_token`, ...).
    #[serde(default)]
    pub refused: std::collections::BTreeMap<String, u64>,
    /// The newest refusals, oldest first, at most [`MAX_REPORTED_REFUSALS`].
    #[serde(default)]
    pub recent: Vec<GateRefusal>,
    /// The resource's marks the gate saw since its last report (admitted or refusing), one
    /// per lock, at most [`MAX_REPORTED_MARKS`]: what `GET /v1/gates/marks` shows.
    #[serde(default)]
    pub marks: Vec<GateMark>,
}

/// One lock's mark in a resource, as a gate saw it: the epoch of the newest writer the
/// resource admitted for the lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateMark {
    pub lock: String,
    pub high_water: u64,
}

/// One refusal of a [`GateReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateRefusal {
    pub lock: String,
    pub code: String,
    /// The writer's token's epoch, when the gate read one.
    #[serde(default)]
    pub epoch: Option<u64>,
    /// The resource's mark that refused it, for `stale_token` and `stale_sequence`.
    #[serde(default)]
    pub high_water: Option<u64>,
}

/// `GET /v1/gates/marks`: each lock's mark in every resource whose gate reported one,
/// beside the built-in store's, a page of locks at a time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockMarksList {
    pub locks: Vec<LockMarks>,
    /// Pass as `after` for the next page; `null` on the last page.
    #[serde(default)]
    pub next: Option<String>,
}

/// One lock's marks: the built-in store's (`null` when no write to it was admitted) and
/// the highest each kind of resource reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockMarks {
    pub lock: String,
    pub store: Option<u64>,
    pub resources: Vec<ResourceMark>,
}

/// The highest mark gates of one kind of resource reported for a lock, and when the
/// server last heard of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceMark {
    pub resource: ResourceKind,
    pub high_water: u64,
    pub reported_at_ms: u64,
}

/// The answer to a [`GateReport`]: how many of `recent` went to the events stream, and how
/// many were dropped (the server publishes at most so many gate events a second; the
/// counts are always taken).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateReportAnswer {
    pub published: u64,
    pub dropped: u64,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn lock_status_sends_nulls_and_reads_old_servers() {
        let free = LockStatus {
            lock: "a".into(),
            epoch: 0,
            holder: None,
            lease_id: None,
            remaining_ms: None,
            waiters: 0,
            lease_epoch: None,
            value: None,
            lock_delay_ms: None,
            session: None,
            epoch_bound: None,
        };
        let sent = serde_json::to_value(&free).unwrap();
        assert_eq!(
            sent,
            json!({"lock":"a","epoch":0,"holder":null,"lease_id":null,"remaining_ms":null,
                   "waiters":0,"lease_epoch":null,"value":null,"lock_delay_ms":null,
                   "session":null,"epoch_bound":null})
        );
        let old: LockStatus = serde_json::from_value(json!({"lock":"a","epoch":0,"holder":null,
            "lease_id":null,"remaining_ms":null,"waiters":0}))
        .unwrap();
        assert_eq!(old, free);
    }

    #[test]
    fn lease_value_is_base64_and_optional_fields_are_skipped() {
        let lease = Lease {
            lock: "a".into(),
            holder: "h".into(),
            epoch: 2,
            token: "t".into(),
            lease_id: "l".into(),
            ttl_ms: 100,
            lock_delay_ms: 0,
            value: Some(b"hi".to_vec()),
            session: None,
        };
        let sent = serde_json::to_value(&lease).unwrap();
        assert_eq!(
            sent,
            json!({"lock":"a","holder":"h","epoch":2,"token":"t","lease_id":"l","ttl_ms":100,
                   "lock_delay_ms":0,"value":"aGk="})
        );
        assert_eq!(serde_json::from_value::<Lease>(sent).unwrap(), lease);
        assert!(
            serde_json::from_value::<Lease>(json!({"lock":"a","holder":"h","epoch":2,
            "token":"t","lease_id":"l","ttl_ms":1,"value":"not base64!"}))
            .is_err()
        );
    }

    #[test]
    fn acquire_request_is_strict_and_minimal() {
        let r = AcquireRequest {
            holder: Some("h".into()),
            ttl_ms: Some(500),
            ..AcquireRequest::default()
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"holder":"h","ttl_ms":500})
        );
        assert!(serde_json::from_value::<AcquireRequest>(json!({"ttl":5})).is_err());
    }

    #[test]
    fn error_body_keeps_extra_fields() {
        let text = r#"{"error":{"code":"stale_token","message":"m","high_water":2,"epoch":1}}"#;
        let e: ErrorEnvelope = serde_json::from_str(text).unwrap();
        assert_eq!(e.error.code, "stale_token");
        assert_eq!(e.error.extra.get("high_water"), Some(&json!(2)));
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
    }

    #[test]
    fn token_check_both_shapes() {
        let bad: TokenCheck =
            serde_json::from_str(r#"{"genuine":false,"reason":"bad signature"}"#).unwrap();
        assert_eq!(
            serde_json::to_value(&bad).unwrap(),
            json!({"genuine":false,"reason":"bad signature"})
        );
    }

    #[test]
    fn events_keep_their_field_order_and_read_back() {
        let event = Event {
            id: 7,
            at_ms: 9,
            body: EventBody::Rejected {
                lock: "a".into(),
                code: "stale_token".into(),
                epoch: Some(1),
                high_water: None,
            },
        };
        let text = serde_json::to_string(&Event {
            id: event.id,
            at_ms: event.at_ms,
            body: &event.body,
        })
        .unwrap();
        assert_eq!(
            text,
            r#"{"id":7,"at_ms":9,"type":"rejected","lock":"a","code":"stale_token","epoch":1,"high_water":null}"#
        );
        assert_eq!(serde_json::from_str::<Event>(&text).unwrap(), event);
        let reset: Event =
            serde_json::from_str(r#"{"at_ms":1,"id":2,"reason":"lagged","type":"reset"}"#).unwrap();
        assert_eq!(reset.body.kind(), "reset");
        assert_eq!(reset.body.lock(), None);
        assert!(serde_json::from_str::<Event>(r#"{"id":1,"at_ms":1,"type":"new"}"#).is_err());
    }
}
