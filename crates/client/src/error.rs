//! The client's error type: one variant per error a caller is expected to branch on,
//! carrying the server's extra fields as typed values, plus [`Error::Api`] for codes this
//! version does not know. Decoding lives in `decode.rs`.

use palisade_api::ErrorCode;

/// Everything a Palisade call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `stale_token`: the resource has admitted a newer epoch; this holder is fenced off.
    #[error("stale token: epoch {epoch} is below the high-water mark {high_water}")]
    Stale { high_water: u64, epoch: u64 },
    /// `stale_sequence`: in a `sequence` namespace, (epoch, seq) did not strictly increase.
    #[error(
        "stale sequence: ({epoch}, {seq}) is not above the high-water mark \
         ({high_water}, {high_water_seq})"
    )]
    StaleSequence {
        high_water: u64,
        high_water_seq: u64,
        epoch: u64,
        seq: u64,
    },
    /// `lock_held`: someone else holds the lock. `holder` is `None` while the lock sits in
    /// its lock-delay after an expiry.
    #[error("lock held by {}; retry after {retry_after_ms} ms", holder.as_deref().unwrap_or("nobody (lock-delay)"))]
    LockHeld {
        holder: Option<String>,
        retry_after_ms: u64,
    },
    /// `lease_expired`: the lease expired or was released; it cannot be renewed.
    #[error("lease expired or released")]
    LeaseExpired,
    /// `session_expired`: the session expired or was closed, and every lease in it ended
    /// with it.
    #[error("session expired or closed")]
    SessionExpired,
    /// `not_found`: the key does not exist (only surfaced where absence is an error).
    #[error("not found")]
    NotFound,
    /// `missing_token`: a mutation arrived without a fencing token.
    #[error("missing fencing token")]
    MissingToken,
    /// `invalid_token`: the token did not verify; carries the server's message.
    #[error("invalid token: {0}")]
    InvalidToken(String),
    /// `wrong_lock`: the token is genuine but for another lock; carries that lock's name.
    #[error("token is for lock {0:?}, not for this namespace")]
    WrongLock(String),
    /// `revision_mismatch`: an `If-Match` / `If-None-Match` precondition failed.
    #[error("revision mismatch: {}", match current_revision {
        Some(r) => format!("the key is at revision {r}"),
        None => "the key does not exist".to_owned(),
    })]
    RevisionMismatch { current_revision: Option<u64> },
    /// `payload_too_large`: the value exceeds the server's limit.
    #[error("payload too large")]
    PayloadTooLarge,
    /// `idempotency_conflict`: the idempotency key was used before for a different request.
    #[error("idempotency key reused for a different request")]
    IdempotencyConflict,
    /// `storage_failed`: the server latched a storage failure and refuses writes.
    #[error("server storage failed")]
    StorageFailed,
    /// `bad_request`, from the server or raised locally before sending (e.g. a key that
    /// cannot be expressed in a URL).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// `unauthenticated`: no key, or a key that names no principal (HTTP 401).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// `permission_denied`: the principal may not do this on this lock, or does not own
    /// the lease or token it used (HTTP 403).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// `quota_exceeded`: a server limit (`resource`, at most `limit`) would be exceeded;
    /// nothing was changed (HTTP 429).
    #[error("quota exceeded: {resource} is limited to {limit}")]
    QuotaExceeded {
        resource: palisade_api::QuotaResource,
        limit: u64,
    },
    /// Any other well-formed JSON error, e.g. `method_not_allowed` or a code newer than
    /// this client.
    #[error("{code} (HTTP {status}): {message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// The request did not complete: connection refused, timeout, reset.
    ///
    /// For a mutation this means the outcome is unknown: it may have been applied.
    ///
    /// The message includes the whole cause chain (reqwest's own message stops at "error
    /// sending request"), so it is not repeated as `source()`.
    #[error("request failed: {}", cause_chain(.0))]
    Transport(reqwest::Error),
    /// The server answered something this client cannot read.
    #[error("undecodable response: {0}")]
    Decode(String),
    /// The client's own settings are unusable (a CA, certificate or key file that cannot
    /// be read or used, a key file others may read); raised before any request.
    #[error("client configuration: {0}")]
    Config(String),
}

impl Error {
    /// The stable machine code: the wire code for server errors, `"transport"`,
    /// `"decode"` and `"config"` for failures on this side.
    pub fn code(&self) -> &str {
        let code = match self {
            Error::Stale { .. } => ErrorCode::StaleToken,
            Error::StaleSequence { .. } => ErrorCode::StaleSequence,
            Error::LockHeld { .. } => ErrorCode::LockHeld,
            Error::LeaseExpired => ErrorCode::LeaseExpired,
            Error::SessionExpired => ErrorCode::SessionExpired,
            Error::NotFound => ErrorCode::NotFound,
            Error::MissingToken => ErrorCode::MissingToken,
            Error::InvalidToken(_) => ErrorCode::InvalidToken,
            Error::WrongLock(_) => ErrorCode::WrongLock,
            Error::RevisionMismatch { .. } => ErrorCode::RevisionMismatch,
            Error::PayloadTooLarge => ErrorCode::PayloadTooLarge,
            Error::IdempotencyConflict => ErrorCode::IdempotencyConflict,
            Error::StorageFailed => ErrorCode::StorageFailed,
            Error::BadRequest(_) => ErrorCode::BadRequest,
            Error::Unauthenticated(_) => ErrorCode::Unauthenticated,
            Error::PermissionDenied(_) => ErrorCode::PermissionDenied,
            Error::QuotaExceeded { .. } => ErrorCode::QuotaExceeded,
            Error::Api { code, .. } => return code,
            Error::Transport(_) => return "transport",
            Error::Decode(_) => return "decode",
            Error::Config(_) => return "config",
        };
        code.as_str()
    }

    /// True when the server positively said this holder's epoch is fenced off.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Stale { .. } | Error::StaleSequence { .. })
    }
}

impl From<reqwest::Error> for Error {
    fn from(err: reqwest::Error) -> Self {
        Error::Transport(err)
    }
}

/// `err: cause: cause ...`, skipping a cause whose text its parent already contains.
fn cause_chain(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(err);
    while let Some(c) = cause {
        let part = c.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        cause = c.source();
    }
    text
}
