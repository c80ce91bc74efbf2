//! What an error answer says beside its message: the code and its fields, as one typed
//! value.
//!
//! On the wire an error is flat, `{"error":{"code":"stale_token","message":"...",
//! "high_water":7,"epoch":5}}`. [`ErrorDetail`] is that object without the message,
//! tagged by `code`: the server builds every error answer from one, its own observers
//! (events, metrics, audit) read the fields from it rather than by name, and the clients
//! decode into it. Each code with fields names them here once; a code and fields that do
//! not belong together cannot be built.
//!
//! `vectors/errors.json` holds one answer per code, made from [`ErrorDetail::samples`];
//! every client decodes all of them in its tests into its own typed error, so a field
//! renamed on one side fails a test instead of turning a typed error into a generic one.
//!
//! Readers stay tolerant: a field they do not know is ignored, and a code they do not know
//! (or a known code whose fields they cannot read, such as a quota resource newer than
//! them) is read as the generic error with its code and message.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::wire::ErrorBody;
use crate::ErrorCode;

/// `{"error":{"code",...fields,"message"}}`, serialised straight from an [`ErrorDetail`]
/// ([`ErrorDetail::answer`]).
#[derive(Debug, Serialize)]
pub struct ErrorAnswer<'a> {
    error: AnswerBody<'a>,
}

#[derive(Debug, Serialize)]
struct AnswerBody<'a> {
    #[serde(flatten)]
    detail: &'a ErrorDetail,
    message: &'a str,
}

/// An error's code and the fields that come with it (docs/api.md, "Error codes").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum ErrorDetail {
    BadRequest,
    NotFound {
        /// The key an admin key route did not find.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key_id: Option<String>,
    },
    MethodNotAllowed,
    UriTooLong,
    HeadersTooLarge,
    PayloadTooLarge {
        /// The largest body the route takes, in bytes (absent when the connection's own
        /// limit refused the request before a route saw it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u64>,
    },
    Unauthenticated,
    PermissionDenied {
        /// The principal that was refused, when the caller named one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        principal: Option<String>,
    },
    QuotaExceeded {
        resource: QuotaResource,
        limit: u64,
    },
    MissingToken,
    InvalidToken,
    WrongLock {
        /// The lock the token was issued for.
        token_lock: String,
    },
    StaleToken {
        high_water: u64,
        epoch: u64,
    },
    StaleSequence {
        high_water: u64,
        high_water_seq: u64,
        epoch: u64,
        seq: u64,
    },
    LockHeld {
        /// Who holds it (`null` when the caller may not see holders).
        #[serde(default)]
        holder: Option<String>,
        retry_after_ms: u64,
    },
    KeyActive {
        key_id: String,
    },
    LeaseExpired,
    SessionExpired,
    RevisionMismatch {
        /// The key's revision now (`null`: the key does not exist).
        #[serde(default)]
        current_revision: Option<u64>,
    },
    IdempotencyConflict,
    WriteConflict,
    StorageFailed,
    Unavailable,
}

/// What a `quota_exceeded` answer says ran out (docs/security.md, "Quotas").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaResource {
    /// Locks the issuer keeps state for.
    Locks,
    LeasesPerPrincipal,
    WaitersPerLock,
    WaitersPerPrincipal,
    Sessions,
    /// Keys in one namespace of the fenced store.
    KeysPerNamespace,
    /// Bytes of keys and values in one namespace of the fenced store.
    BytesPerNamespace,
    VerifyingKeys,
    ConcurrentBackups,
    /// A requested lock delay over the server's maximum.
    LockDelayMs,
    /// A requested TTL over the server's maximum.
    TtlMs,
    EventSubscribers,
    EventSubscribersPerPrincipal,
}

impl QuotaResource {
    pub const ALL: &'static [QuotaResource] = &[
        QuotaResource::Locks,
        QuotaResource::LeasesPerPrincipal,
        QuotaResource::WaitersPerLock,
        QuotaResource::WaitersPerPrincipal,
        QuotaResource::Sessions,
        QuotaResource::KeysPerNamespace,
        QuotaResource::BytesPerNamespace,
        QuotaResource::VerifyingKeys,
        QuotaResource::ConcurrentBackups,
        QuotaResource::LockDelayMs,
        QuotaResource::TtlMs,
        QuotaResource::EventSubscribers,
        QuotaResource::EventSubscribersPerPrincipal,
    ];

    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaResource::Locks => "locks",
            QuotaResource::LeasesPerPrincipal => "leases_per_principal",
            QuotaResource::WaitersPerLock => "waiters_per_lock",
            QuotaResource::WaitersPerPrincipal => "waiters_per_principal",
            QuotaResource::Sessions => "sessions",
            QuotaResource::KeysPerNamespace => "keys_per_namespace",
            QuotaResource::BytesPerNamespace => "bytes_per_namespace",
            QuotaResource::VerifyingKeys => "verifying_keys",
            QuotaResource::ConcurrentBackups => "concurrent_backups",
            QuotaResource::LockDelayMs => "lock_delay_ms",
            QuotaResource::TtlMs => "ttl_ms",
            QuotaResource::EventSubscribers => "event_subscribers",
            QuotaResource::EventSubscribersPerPrincipal => "event_subscribers_per_principal",
        }
    }
}

impl std::fmt::Display for QuotaResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ErrorDetail {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ErrorDetail::BadRequest => ErrorCode::BadRequest,
            ErrorDetail::NotFound { .. } => ErrorCode::NotFound,
            ErrorDetail::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            ErrorDetail::UriTooLong => ErrorCode::UriTooLong,
            ErrorDetail::HeadersTooLarge => ErrorCode::HeadersTooLarge,
            ErrorDetail::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            ErrorDetail::Unauthenticated => ErrorCode::Unauthenticated,
            ErrorDetail::PermissionDenied { .. } => ErrorCode::PermissionDenied,
            ErrorDetail::QuotaExceeded { .. } => ErrorCode::QuotaExceeded,
            ErrorDetail::MissingToken => ErrorCode::MissingToken,
            ErrorDetail::InvalidToken => ErrorCode::InvalidToken,
            ErrorDetail::WrongLock { .. } => ErrorCode::WrongLock,
            ErrorDetail::StaleToken { .. } => ErrorCode::StaleToken,
            ErrorDetail::StaleSequence { .. } => ErrorCode::StaleSequence,
            ErrorDetail::LockHeld { .. } => ErrorCode::LockHeld,
            ErrorDetail::KeyActive { .. } => ErrorCode::KeyActive,
            ErrorDetail::LeaseExpired => ErrorCode::LeaseExpired,
            ErrorDetail::SessionExpired => ErrorCode::SessionExpired,
            ErrorDetail::RevisionMismatch { .. } => ErrorCode::RevisionMismatch,
            ErrorDetail::IdempotencyConflict => ErrorCode::IdempotencyConflict,
            ErrorDetail::WriteConflict => ErrorCode::WriteConflict,
            ErrorDetail::StorageFailed => ErrorCode::StorageFailed,
            ErrorDetail::Unavailable => ErrorCode::Unavailable,
        }
    }

    /// `(epoch, high_water)` of a fenced refusal (`stale_token`, `stale_sequence`).
    pub fn fenced_epochs(&self) -> Option<(u64, u64)> {
        match *self {
            ErrorDetail::StaleToken { high_water, epoch }
            | ErrorDetail::StaleSequence {
                high_water, epoch, ..
            } => Some((epoch, high_water)),
            _ => None,
        }
    }

    /// The fields beside `code`, as they go on the wire (sorted by name).
    pub fn fields(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut fields)) => {
                fields.remove("code");
                fields
            }
            // An internally tagged enum of plain fields always serialises to an object.
            _ => Map::new(),
        }
    }

    /// The answer's body: this detail and `message`.
    pub fn into_body(self, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            code: self.code().as_str().to_owned(),
            message: message.into(),
            extra: self.fields(),
        }
    }

    /// The answer's body, borrowed and written in one pass (no intermediate map): what
    /// the server sends. The same JSON as [`ErrorDetail::into_body`]'s.
    pub fn answer<'a>(&'a self, message: &'a str) -> ErrorAnswer<'a> {
        ErrorAnswer {
            error: AnswerBody {
                detail: self,
                message,
            },
        }
    }

    /// Reads the detail out of an answer's body; `None` for a code this version does not
    /// know, or a known code whose fields are missing or of another type.
    pub fn from_body(body: &ErrorBody) -> Option<ErrorDetail> {
        ErrorCode::parse(&body.code)?;
        let mut object = body.extra.clone();
        object.insert("code".to_owned(), Value::String(body.code.clone()));
        serde_json::from_value(Value::Object(object)).ok()
    }

    /// One detail of every code the server sends, with every field it may send (and, for
    /// fields it may leave out, a second without them): what `vectors/errors.json` holds.
    /// `write_conflict` is not among them: a gate raises it in its caller's process, and
    /// no server answer carries it.
    pub fn samples() -> Vec<ErrorDetail> {
        let mut samples = vec![
            ErrorDetail::BadRequest,
            ErrorDetail::NotFound { key_id: None },
            ErrorDetail::NotFound {
                key_id: Some("0123456789abcdef".into()),
            },
            ErrorDetail::MethodNotAllowed,
            ErrorDetail::UriTooLong,
            ErrorDetail::HeadersTooLarge,
            ErrorDetail::PayloadTooLarge { limit: None },
            ErrorDetail::PayloadTooLarge {
                limit: Some(1 << 20),
            },
            ErrorDetail::Unauthenticated,
            ErrorDetail::PermissionDenied { principal: None },
            ErrorDetail::PermissionDenied {
                principal: Some("billing".into()),
            },
            ErrorDetail::MissingToken,
            ErrorDetail::InvalidToken,
            ErrorDetail::WrongLock {
                token_lock: "orders".into(),
            },
            ErrorDetail::StaleToken {
                high_water: 7,
                epoch: 5,
            },
            ErrorDetail::StaleSequence {
                high_water: 7,
                high_water_seq: 12,
                epoch: 7,
                seq: 11,
            },
            ErrorDetail::LockHeld {
                holder: Some("worker-1".into()),
                retry_after_ms: 2500,
            },
            ErrorDetail::LockHeld {
                holder: None,
                retry_after_ms: 0,
            },
            ErrorDetail::KeyActive {
                key_id: "0123456789abcdef".into(),
            },
            ErrorDetail::LeaseExpired,
            ErrorDetail::SessionExpired,
            ErrorDetail::RevisionMismatch {
                current_revision: Some(42),
            },
            ErrorDetail::RevisionMismatch {
                current_revision: None,
            },
            ErrorDetail::IdempotencyConflict,
            ErrorDetail::StorageFailed,
            ErrorDetail::Unavailable,
        ];
        samples.extend(
            QuotaResource::ALL
                .iter()
                .map(|&resource| ErrorDetail::QuotaExceeded {
                    resource,
                    limit: 1000,
                }),
        );
        samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code has its detail, each sample comes back from its body as itself, and the
    /// body is the flat wire form.
    #[test]
    fn every_code_has_a_detail_that_round_trips_through_its_body() {
        let samples = ErrorDetail::samples();
        for &code in ErrorCode::ALL {
            if code == ErrorCode::WriteConflict {
                continue;
            }
            assert!(
                samples.iter().any(|d| d.code() == code),
                "no sample of {code}"
            );
        }
        for detail in samples {
            let body = detail.clone().into_body("m");
            assert_eq!(body.code, detail.code().as_str());
            assert!(!body.extra.contains_key("code"));
            assert_eq!(ErrorDetail::from_body(&body), Some(detail.clone()));
            let envelope = crate::wire::ErrorEnvelope { error: body };
            assert_eq!(
                serde_json::to_value(detail.answer("m")).unwrap(),
                serde_json::to_value(&envelope).unwrap(),
                "the one-pass answer of {detail:?}"
            );
        }
        let body = ErrorDetail::StaleToken {
            high_water: 2,
            epoch: 1,
        }
        .into_body("stale");
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"code": "stale_token", "message": "stale", "high_water": 2, "epoch": 1})
        );
    }

    #[test]
    fn readers_ignore_new_fields_and_refuse_what_they_cannot_read() {
        let read = |json: Value| ErrorDetail::from_body(&serde_json::from_value(json).unwrap());
        assert_eq!(
            read(
                serde_json::json!({"code": "stale_token", "high_water": 2, "epoch": 1, "added_later": true})
            ),
            Some(ErrorDetail::StaleToken {
                high_water: 2,
                epoch: 1
            })
        );
        assert_eq!(
            read(serde_json::json!({"code": "stale_token", "epoch": 1})),
            None
        );
        assert_eq!(
            read(serde_json::json!({"code": "stale_token", "high_water": "2", "epoch": 1})),
            None
        );
        assert_eq!(read(serde_json::json!({"code": "from_the_future"})), None);
        assert_eq!(
            read(
                serde_json::json!({"code": "quota_exceeded", "resource": "from_the_future", "limit": 1})
            ),
            None
        );
    }

    #[test]
    fn quota_resources_are_named_once() {
        for &resource in QuotaResource::ALL {
            assert_eq!(
                serde_json::to_value(resource).unwrap(),
                Value::String(resource.as_str().into())
            );
        }
    }
}
