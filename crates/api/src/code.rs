//! [`ErrorCode`]: the one list of machine codes an error answer can carry.

use std::fmt;
use std::str::FromStr;

macro_rules! codes {
    ($( $(#[$doc:meta])* $variant:ident = $text:literal, $status:literal; )*) => {
        /// A stable machine code of an error answer (`{"error":{"code":...}}`).
        ///
        /// The text of a code and its HTTP status are part of the API contract
        /// (docs/api.md): they never change once released. New codes may be added, so
        /// clients must treat a code they do not know as a generic failure of its status.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum ErrorCode {
            $( $(#[$doc])* $variant, )*
        }

        impl ErrorCode {
            /// Every code, in the order of docs/api.md.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),*];

            /// The code as it appears on the wire.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( ErrorCode::$variant => $text, )*
                }
            }

            /// The HTTP status an answer with this code has.
            pub const fn status(self) -> u16 {
                match self {
                    $( ErrorCode::$variant => $status, )*
                }
            }

            /// The code for a wire text, if it is one this version knows.
            pub fn parse(text: &str) -> Option<ErrorCode> {
                match text {
                    $( $text => Some(ErrorCode::$variant), )*
                    _ => None,
                }
            }
        }
    };
}

codes! {
    /// The request is malformed: bad JSON, path, header or parameter.
    BadRequest = "bad_request", 400;
    /// No such route, key or lock.
    NotFound = "not_found", 404;
    /// The route exists but not with this method.
    MethodNotAllowed = "method_not_allowed", 405;
    /// The request line's target is longer than the server accepts.
    UriTooLong = "uri_too_long", 414;
    /// The request's headers are larger than the server accepts.
    HeadersTooLarge = "headers_too_large", 431;
    /// The body is larger than the route accepts.
    PayloadTooLarge = "payload_too_large", 413;
    /// No credentials, or credentials that name no principal.
    Unauthenticated = "unauthenticated", 401;
    /// A known principal without the permission, or not the owner of the lease or token.
    PermissionDenied = "permission_denied", 403;
    /// A limit on locks, leases, waiters, keys, bytes or TTL would be exceeded.
    QuotaExceeded = "quota_exceeded", 429;
    /// A mutation without a fencing token.
    MissingToken = "missing_token", 400;
    /// A token that is malformed, from an unknown or retired key, or badly signed.
    InvalidToken = "invalid_token", 400;
    /// A genuine token for another lock than the namespace's.
    WrongLock = "wrong_lock", 403;
    /// The token's epoch is below the resource's high-water mark: a newer holder wrote.
    StaleToken = "stale_token", 409;
    /// Sequence policy: (epoch, seq) does not exceed the mark.
    StaleSequence = "stale_sequence", 409;
    /// The lock is held by someone else (or in its lock-delay).
    LockHeld = "lock_held", 409;
    /// The key is the issuer's active signing key, which cannot be retired: rotate first.
    KeyActive = "key_active", 409;
    /// The lease expired, was released or never existed.
    LeaseExpired = "lease_expired", 404;
    /// The session expired, was closed or never existed (and with it every lease in it).
    SessionExpired = "session_expired", 404;
    /// An `If-Match` / `If-None-Match` precondition on the key's revision failed.
    RevisionMismatch = "revision_mismatch", 412;
    /// The idempotency key was used before for a different request.
    IdempotencyConflict = "idempotency_conflict", 422;
    /// Another writer changed a guarded resource between read and write (an adapter's lost
    /// compare-and-swap or serialisation failure); nothing was written, retry the whole
    /// operation.
    WriteConflict = "write_conflict", 409;
    /// The server's storage failed (it refuses writes) or cannot be reached (etcd without
    /// quorum).
    StorageFailed = "storage_failed", 503;
    /// The server is shutting down and does not take this request.
    Unavailable = "unavailable", 503;
}

impl ErrorCode {
    /// True for the refusals that mean "you are fenced": a newer holder has written.
    pub fn is_fenced(self) -> bool {
        matches!(self, ErrorCode::StaleToken | ErrorCode::StaleSequence)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A wire text that is not a code this version knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCode(pub String);

impl fmt::Display for UnknownCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown error code {:?}", self.0)
    }
}

impl std::error::Error for UnknownCode {}

impl FromStr for ErrorCode {
    type Err = UnknownCode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ErrorCode::parse(s).ok_or_else(|| UnknownCode(s.to_owned()))
    }
}

impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        ErrorCode::parse(&text).ok_or_else(|| serde::de::Error::custom(UnknownCode(text.into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_is_unique() {
        let mut seen = std::collections::HashSet::new();
        for &code in ErrorCode::ALL {
            assert!(seen.insert(code.as_str()), "{code} listed twice");
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            assert_eq!(code.as_str().parse::<ErrorCode>(), Ok(code));
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{code}\""));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
            assert!((400..600).contains(&code.status()), "{code}");
            assert!(code
                .as_str()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_'));
        }
        assert_eq!(ErrorCode::parse("no_such_code"), None);
        assert!(serde_json::from_str::<ErrorCode>("\"no_such_code\"").is_err());
    }

    #[test]
    fn statuses_that_clients_branch_on() {
        assert_eq!(ErrorCode::Unauthenticated.status(), 401);
        assert_eq!(ErrorCode::PermissionDenied.status(), 403);
        assert_eq!(ErrorCode::QuotaExceeded.status(), 429);
        assert_eq!(ErrorCode::StaleToken.status(), 409);
        assert!(ErrorCode::StaleSequence.is_fenced());
        assert!(!ErrorCode::LockHeld.is_fenced());
    }
}
