//! API errors: one type, a stable machine code per case, mapped to a JSON body.
//!
//! Every error leaves the server as `{"error":{"code","message",...extra}}`. Codes are
//! part of the API contract (docs/api.md); messages are for humans and may change.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use palisade_core::gate::GateError;
use palisade_storage::{ApplyError, StorageError};
use palisade_token::TokenError;

use palisade_issuer::{AcquireError, LeaseError};

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    extra: Map<String, Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            extra: Map::new(),
        }
    }

    /// Adds an extra field next to `code` and `message`.
    pub fn with(mut self, field: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(field.to_owned(), value.into());
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn missing_token() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "missing_token",
            "this operation needs a Fencing-Token header",
        )
    }

    pub fn invalid_token(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_token", message)
    }

    pub fn lease_expired() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "lease_expired",
            "lease expired or unknown",
        )
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request body exceeds the limit of {limit} bytes"),
        )
        .with("limit", limit)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "this route does not accept that method",
        )
    }

    pub fn code(&self) -> &'static str {
        self.code
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert("code".into(), self.code.into());
        body.insert("message".into(), self.message.into());
        body.extend(self.extra);
        let mut response = (self.status, axum::Json(json!({ "error": body }))).into_response();
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the oversized body was never read; the connection cannot carry
            // another request, so tell the client not to reuse it.
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_failed",
            e.to_string(),
        )
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
            GateError::Stale { high_water, epoch } => {
                ApiError::new(StatusCode::CONFLICT, "stale_token", message)
                    .with("high_water", high_water)
                    .with("epoch", epoch)
            }
            GateError::StaleSequence {
                high_water,
                high_water_seq,
                epoch,
                seq,
            } => ApiError::new(StatusCode::CONFLICT, "stale_sequence", message)
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
                StatusCode::PRECONDITION_FAILED,
                "revision_mismatch",
                "the key's revision does not match the precondition",
            )
            .with("current_revision", current),
            ApplyError::NotFound => ApiError::not_found("no such key"),
            ApplyError::IdempotencyConflict => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_conflict",
                "this Idempotency-Key was already used for a different request",
            ),
            ApplyError::QuotaExceeded { resource, limit } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "quota_exceeded",
                format!("the namespace may hold at most {limit} {resource}"),
            )
            .with("resource", resource)
            .with("limit", limit),
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
            } => ApiError::new(StatusCode::CONFLICT, "lock_held", "the lock is held")
                .with("holder", holder)
                .with("retry_after_ms", retry_after_ms),
            AcquireError::Storage(s) => s.into(),
        }
    }
}

impl From<LeaseError> for ApiError {
    fn from(e: LeaseError) -> Self {
        match e {
            LeaseError::Expired => ApiError::lease_expired(),
            LeaseError::Storage(s) => s.into(),
        }
    }
}
