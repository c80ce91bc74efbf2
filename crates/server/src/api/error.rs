//! API errors: one type, a stable machine code per case, mapped to a JSON body.
//!
//! Every error leaves the server as `{"error":{"code","message",...extra}}`. Codes are
//! part of the API contract ([`ErrorCode`], docs/api.md); messages are for humans and may
//! change. The HTTP status is the code's own ([`ErrorCode::status`]).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use palisade_api::wire::{ErrorBody, ErrorEnvelope};
use palisade_api::ErrorCode;

use crate::audit::AuditEvent;
use palisade_core::gate::GateError;
use palisade_storage::{ApplyError, StorageError};
use palisade_token::TokenError;

use palisade_issuer::{AcquireError, LeaseError, SessionError};

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    code: ErrorCode,
    message: String,
    extra: Map<String, Value>,
    /// A line for the audit log, recorded by the auth middleware with the caller's name.
    audit: Option<Box<AuditEvent>>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            extra: Map::new(),
            audit: None,
        }
    }

    /// Marks this error for the audit log.
    pub fn audited(mut self, event: AuditEvent) -> Self {
        self.audit = Some(Box::new(event));
        self
    }

    /// The extra fields next to `code` and `message`, in the order they were added.
    pub fn fields(&self) -> &Map<String, Value> {
        &self.extra
    }

    /// Takes the audit line this error carries (a protocol without the HTTP middleware
    /// records it itself).
    pub(crate) fn take_audit(&mut self) -> Option<AuditEvent> {
        self.audit.take().map(|event| *event)
    }

    /// An extra field's value, if this error carries it.
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.extra.get(name)
    }

    /// Adds an extra field next to `code` and `message`.
    pub fn with(mut self, field: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(field.to_owned(), value.into());
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::BadRequest, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    pub fn missing_token() -> Self {
        Self::new(
            ErrorCode::MissingToken,
            "this operation needs a Fencing-Token header",
        )
    }

    pub fn invalid_token(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidToken, message)
    }

    pub fn lease_expired() -> Self {
        Self::new(ErrorCode::LeaseExpired, "lease expired or unknown")
    }

    pub fn session_expired() -> Self {
        Self::new(ErrorCode::SessionExpired, "session expired or unknown")
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            ErrorCode::PayloadTooLarge,
            format!("request body exceeds the limit of {limit} bytes"),
        )
        .with("limit", limit)
    }

    /// 429: `resource` is limited to `limit`.
    pub fn quota_exceeded(resource: &str, limit: impl Into<Value>) -> Self {
        let limit = limit.into();
        Self::new(
            ErrorCode::QuotaExceeded,
            format!("quota exceeded: {resource} is limited to {limit}"),
        )
        .with("resource", resource)
        .with("limit", limit)
    }

    /// 503 `unavailable`: the server is shutting down.
    pub fn shutting_down() -> Self {
        Self::new(ErrorCode::Unavailable, "the server is shutting down")
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            ErrorCode::MethodNotAllowed,
            "this route does not accept that method",
        )
    }

    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The human message.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = ErrorEnvelope {
            error: ErrorBody {
                code: self.code.as_str().to_owned(),
                message: self.message,
                extra: self.extra,
            },
        };
        let audit = self.audit;
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the oversized body was never read; the connection cannot carry
            // another request, so tell the client not to reuse it.
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        if let Some(event) = audit {
            response.extensions_mut().insert(*event);
        }
        response
    }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> Self {
        let code = match e {
            // Shutting down (e.g. a queued acquisition answered at shutdown): not a fault.
            StorageError::Closed => ErrorCode::Unavailable,
            StorageError::Failed(_) => ErrorCode::StorageFailed,
        };
        ApiError::new(code, e.to_string())
    }
}

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        ApiError::invalid_token(e.to_string())
    }
}

impl From<GateError> for ApiError {
    fn from(e: GateError) -> Self {
        let message = e.to_string();
        match e {
            GateError::Stale { high_water, epoch } => ApiError::new(ErrorCode::StaleToken, message)
                .with("high_water", high_water)
                .with("epoch", epoch),
            GateError::StaleSequence {
                high_water,
                high_water_seq,
                epoch,
                seq,
            } => ApiError::new(ErrorCode::StaleSequence, message)
                .with("high_water", high_water)
                .with("high_water_seq", high_water_seq)
                .with("epoch", epoch)
                .with("seq", seq),
            GateError::MissingSequence => ApiError::bad_request(message),
        }
    }
}

impl From<ApplyError> for ApiError {
    fn from(e: ApplyError) -> Self {
        match e {
            ApplyError::Gate(g) => g.into(),
            ApplyError::RevisionMismatch { current } => ApiError::new(
                ErrorCode::RevisionMismatch,
                "the key's revision does not match the precondition",
            )
            .with("current_revision", current),
            ApplyError::NotFound => ApiError::not_found("no such key"),
            ApplyError::IdempotencyConflict => ApiError::new(
                ErrorCode::IdempotencyConflict,
                "this Idempotency-Key was already used for a different request",
            ),
            ApplyError::QuotaExceeded { resource, limit } => {
                let resource = match resource {
                    "keys" => "keys_per_namespace",
                    "bytes" => "bytes_per_namespace",
                    other => other,
                };
                ApiError::quota_exceeded(resource, limit)
            }
            ApplyError::Storage(s) => s.into(),
        }
    }
}

impl From<AcquireError> for ApiError {
    fn from(e: AcquireError) -> Self {
        match e {
            AcquireError::Held {
                holder,
                retry_after_ms,
            } => ApiError::new(ErrorCode::LockHeld, "the lock is held")
                .with("holder", holder)
                .with("retry_after_ms", retry_after_ms),
            AcquireError::QuotaExceeded { resource, limit } => {
                ApiError::quota_exceeded(resource, limit)
            }
            AcquireError::NoSession => ApiError::session_expired(),
            AcquireError::Storage(s) => s.into(),
        }
    }
}

impl From<LeaseError> for ApiError {
    fn from(e: LeaseError) -> Self {
        match e {
            LeaseError::Expired => ApiError::lease_expired(),
            // The handlers answer this one for their caller (`locks::as_caller`).
            LeaseError::NotYours(_) => ApiError::new(
                ErrorCode::PermissionDenied,
                "this lease belongs to another principal",
            ),
            LeaseError::Storage(s) => s.into(),
        }
    }
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::Expired => ApiError::session_expired(),
            SessionError::QuotaExceeded { resource, limit } => {
                ApiError::quota_exceeded(resource, limit)
            }
            SessionError::Storage(s) => s.into(),
        }
    }
}
