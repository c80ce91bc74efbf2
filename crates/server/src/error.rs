//! API errors: one type, a stable machine code per case, mapped to a JSON body.
//!
//! Every error leaves the server as `{"error":{"code","message",...fields}}`, built from
//! its [`ErrorDetail`]: the code and its typed fields are part of the API contract
//! (`palisade_api::detail`, docs/api.md); messages are for humans and may change. The
//! HTTP status is the code's own ([`ErrorCode::status`]).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use palisade_api::{ErrorCode, ErrorDetail, QuotaResource};

use crate::audit::AuditEvent;
use palisade_core::gate::GateError;
use palisade_storage::{ApplyError, StorageError};
use palisade_token::TokenError;

use palisade_issuer::{AcquireError, LeaseError, SessionError};

/// An error answer: its code and typed fields ([`ErrorDetail`]), and a message for humans.
#[derive(Debug)]
pub struct ApiError {
    detail: ErrorDetail,
    message: String,
    /// A line for the audit log, recorded by the auth middleware with the caller's name.
    audit: Option<Box<AuditEvent>>,
}

impl ApiError {
    pub fn new(detail: ErrorDetail, message: impl Into<String>) -> Self {
        ApiError {
            detail,
            message: message.into(),
            audit: None,
        }
    }

    /// Marks this error for the audit log.
    pub fn audited(mut self, event: AuditEvent) -> Self {
        self.audit = Some(Box::new(event));
        self
    }

    /// The code and its fields.
    pub fn detail(&self) -> &ErrorDetail {
        &self.detail
    }

    /// Takes the audit line this error carries (a protocol without the HTTP middleware
    /// records it itself).
    pub(crate) fn take_audit(&mut self) -> Option<AuditEvent> {
        self.audit.take().map(|event| *event)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(ErrorDetail::BadRequest, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorDetail::NotFound { key_id: None }, message)
    }

    pub fn missing_token() -> Self {
        Self::new(
            ErrorDetail::MissingToken,
            "this operation needs a Fencing-Token header",
        )
    }

    pub fn invalid_token(message: impl Into<String>) -> Self {
        Self::new(ErrorDetail::InvalidToken, message)
    }

    pub fn lease_expired() -> Self {
        Self::new(ErrorDetail::LeaseExpired, "lease expired or unknown")
    }

    pub fn session_expired() -> Self {
        Self::new(ErrorDetail::SessionExpired, "session expired or unknown")
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            ErrorDetail::PayloadTooLarge {
                limit: Some(limit as u64),
            },
            format!("request body exceeds the limit of {limit} bytes"),
        )
    }

    /// 429: `resource` is limited to `limit`.
    pub fn quota_exceeded(resource: QuotaResource, limit: u64) -> Self {
        Self::new(
            ErrorDetail::QuotaExceeded { resource, limit },
            format!("quota exceeded: {resource} is limited to {limit}"),
        )
    }

    /// 403 `permission_denied`, naming the principal refused when there is one.
    pub fn permission_denied(principal: Option<&str>, message: impl Into<String>) -> Self {
        Self::new(
            ErrorDetail::PermissionDenied {
                principal: principal.map(str::to_owned),
            },
            message,
        )
    }

    /// 503 `unavailable`: the server is shutting down.
    pub fn shutting_down() -> Self {
        Self::new(ErrorDetail::Unavailable, "the server is shutting down")
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            ErrorDetail::MethodNotAllowed,
            "this route does not accept that method",
        )
    }

    pub fn code(&self) -> ErrorCode {
        self.detail.code()
    }

    /// The human message.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code().status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let audit = self.audit;
        let body = self.detail.answer(&self.message);
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
        let detail = match e {
            // Shutting down (e.g. a queued acquisition answered at shutdown): not a fault.
            StorageError::Closed => ErrorDetail::Unavailable,
            StorageError::Failed(_)
            | StorageError::Unavailable(_)
            | StorageError::Contended(_)
            | StorageError::LeaseGone(_) => ErrorDetail::StorageFailed,
        };
        ApiError::new(detail, e.to_string())
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
                ApiError::new(ErrorDetail::StaleToken { high_water, epoch }, message)
            }
            GateError::StaleSequence {
                high_water,
                high_water_seq,
                epoch,
                seq,
            } => ApiError::new(
                ErrorDetail::StaleSequence {
                    high_water,
                    high_water_seq,
                    epoch,
                    seq,
                },
                message,
            ),
            GateError::MissingSequence => ApiError::bad_request(message),
        }
    }
}

impl From<ApplyError> for ApiError {
    fn from(e: ApplyError) -> Self {
        match e {
            ApplyError::Gate(g) => g.into(),
            ApplyError::RevisionMismatch { current } => ApiError::new(
                ErrorDetail::RevisionMismatch {
                    current_revision: current,
                },
                "the key's revision does not match the precondition",
            ),
            ApplyError::NotFound => ApiError::not_found("no such key"),
            ApplyError::IdempotencyConflict => ApiError::new(
                ErrorDetail::IdempotencyConflict,
                "this Idempotency-Key was already used for a different request",
            ),
            ApplyError::QuotaExceeded { resource, limit } => {
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
            } => ApiError::new(
                ErrorDetail::LockHeld {
                    holder,
                    retry_after_ms,
                },
                "the lock is held",
            ),
            AcquireError::QuotaExceeded { resource, limit } => {
                ApiError::quota_exceeded(resource, limit)
            }
            AcquireError::NoSession => ApiError::session_expired(),
            // The server asks only what its issuer does (`counts_owners`); should it ever
            // not, the caller learns what was refused, and nothing changed.
            AcquireError::Unsupported { what } => {
                ApiError::bad_request(format!("this server's backend does not support {what}"))
            }
            AcquireError::Storage(s) => s.into(),
        }
    }
}

impl From<LeaseError> for ApiError {
    fn from(e: LeaseError) -> Self {
        match e {
            LeaseError::Expired => ApiError::lease_expired(),
            // The handlers answer this one for their caller (`locks::as_caller`).
            LeaseError::NotYours(_) => {
                ApiError::permission_denied(None, "this lease belongs to another principal")
            }
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
