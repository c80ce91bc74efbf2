//! The one error type every adapter returns, with the server's stable codes.

pub use palisade_api::{ErrorCode, ErrorDetail};
use palisade_token::{Epoch, TokenError};

/// A backend failure, boxed so the error type does not depend on which adapters are built.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a fenced operation was refused or could not run.
///
/// Every variant but [`AdmitError::Backend`] means "refused, nothing of this operation may
/// commit": the SQL adapters expect the caller to roll back its transaction, the Redis and
/// object-store adapters wrote nothing. [`AdmitError::code`] gives the same machine codes
/// the Palisade server uses, so logs and dashboards read the same for both.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdmitError {
    /// No token was given (an empty or blank string).
    #[error("this operation needs a fencing token")]
    MissingToken,
    /// The token is malformed, from an unknown key, or its signature does not verify.
    #[error("invalid token: {0}")]
    InvalidToken(#[from] TokenError),
    /// A genuine token, but for another lock than the one guarding this resource.
    #[error("token is for lock {token_lock:?}, not {expected:?}")]
    WrongLock {
        /// The lock guarding the resource.
        expected: String,
        /// The lock named in the token.
        token_lock: String,
    },
    /// A genuine token for this lock, held by another principal than the one the resource
    /// requires ([`crate::Trust::held_by`]).
    #[error("token is held by {token_holder:?}, not by principal {principal:?}")]
    NotHolder {
        /// The principal the resource requires.
        principal: String,
        /// The holder named in the token.
        token_holder: String,
    },
    /// The token's epoch is below the resource's high-water mark: a newer holder wrote here.
    #[error("stale token: epoch {epoch} is below the high-water mark {high_water}")]
    Stale {
        /// The largest epoch this resource has admitted for the lock.
        high_water: Epoch,
        /// The epoch the rejected token carries.
        epoch: Epoch,
    },
    /// Sequence policy only: same epoch, but the sequence number does not exceed the mark.
    #[error("stale sequence: ({epoch}, {seq}) does not exceed ({high_water}, {high_water_seq})")]
    StaleSequence {
        high_water: Epoch,
        high_water_seq: u64,
        epoch: Epoch,
        seq: u64,
    },
    /// Another writer changed the resource between our read and our write (a lost
    /// compare-and-swap, a serialisation failure, a busy database). Nothing was written;
    /// retrying the whole operation is safe as far as fencing is concerned.
    #[error("concurrent update of the fenced resource; retry")]
    Conflict,
    /// The database or store failed, or holds a fence record this crate cannot read.
    /// Whether anything was written is the backend's business: treat it as failed and roll
    /// back.
    #[error("resource backend failed: {0}")]
    Backend(#[source] BoxError),
    /// The database's settings cannot keep a mark durable (see [`crate::preflight`]):
    /// nothing was done.
    #[error(transparent)]
    UnsafeDatabase(#[from] crate::preflight::UnsafeDatabase),
}

impl AdmitError {
    /// The stable machine code, as the Palisade server spells it.
    pub fn code(&self) -> ErrorCode {
        match self {
            AdmitError::MissingToken => ErrorCode::MissingToken,
            AdmitError::InvalidToken(_) => ErrorCode::InvalidToken,
            AdmitError::WrongLock { .. } => ErrorCode::WrongLock,
            AdmitError::NotHolder { .. } => ErrorCode::PermissionDenied,
            AdmitError::Stale { .. } => ErrorCode::StaleToken,
            AdmitError::StaleSequence { .. } => ErrorCode::StaleSequence,
            AdmitError::Conflict => ErrorCode::WriteConflict,
            AdmitError::Backend(_) | AdmitError::UnsafeDatabase(_) => ErrorCode::StorageFailed,
        }
    }

    /// True for the refusals that mean "you are fenced": a newer holder has written here.
    /// The error as the server would answer it (code and fields), for a service that puts
    /// a gate behind its own HTTP API and answers its callers in Palisade's error shape.
    pub fn detail(&self) -> ErrorDetail {
        match self {
            AdmitError::MissingToken => ErrorDetail::MissingToken,
            AdmitError::InvalidToken(_) => ErrorDetail::InvalidToken,
            AdmitError::WrongLock { token_lock, .. } => ErrorDetail::WrongLock {
                token_lock: token_lock.clone(),
            },
            AdmitError::NotHolder { principal, .. } => ErrorDetail::PermissionDenied {
                principal: Some(principal.clone()),
            },
            AdmitError::Stale { high_water, epoch } => ErrorDetail::StaleToken {
                high_water: *high_water,
                epoch: *epoch,
            },
            AdmitError::StaleSequence {
                high_water,
                high_water_seq,
                epoch,
                seq,
            } => ErrorDetail::StaleSequence {
                high_water: *high_water,
                high_water_seq: *high_water_seq,
                epoch: *epoch,
                seq: *seq,
            },
            AdmitError::Conflict => ErrorDetail::WriteConflict,
            AdmitError::Backend(_) | AdmitError::UnsafeDatabase(_) => ErrorDetail::StorageFailed,
        }
    }

    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            AdmitError::Stale { .. } | AdmitError::StaleSequence { .. }
        )
    }

    pub(crate) fn backend(e: impl Into<BoxError>) -> Self {
        AdmitError::Backend(e.into())
    }
}

/// A fence record that does not hold what this crate writes (edited by hand, or written by
/// something else). Reported as [`AdmitError::Backend`]; the adapter refuses to guess.
#[derive(Debug, thiserror::Error)]
#[error("unreadable fence record: {0}")]
pub struct CorruptFence(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_match_the_server() {
        let cases = [
            (AdmitError::MissingToken, ErrorCode::MissingToken),
            (
                AdmitError::InvalidToken(TokenError::BadSignature),
                ErrorCode::InvalidToken,
            ),
            (
                AdmitError::WrongLock {
                    expected: "a".into(),
                    token_lock: "b".into(),
                },
                ErrorCode::WrongLock,
            ),
            (
                AdmitError::Stale {
                    high_water: 2,
                    epoch: 1,
                },
                ErrorCode::StaleToken,
            ),
            (AdmitError::Conflict, ErrorCode::WriteConflict),
            (
                AdmitError::backend(CorruptFence("x".into())),
                ErrorCode::StorageFailed,
            ),
        ];
        for (error, code) in cases {
            assert_eq!(error.code(), code, "{error}");
            assert_eq!(error.detail().code(), code, "{error}");
        }
        let stale = AdmitError::Stale {
            high_water: 7,
            epoch: 5,
        };
        assert_eq!(stale.detail().fenced_epochs(), Some((5, 7)));
    }
}
