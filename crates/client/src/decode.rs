//! Decoding the server's error bodies into [`Error`].
//!
//! Every server error is `{"error":{"code":"<stable code>","message":"...", ...extra}}`
//! (docs/api.md). Codes a caller is expected to branch on get their own variant, carrying
//! their extra fields as typed values: "you are fenced" is [`Error::Stale`], not a string
//! to grep. Codes this version does not know become [`Error::Api`], so a newer server
//! never makes an older client fail to decode.

use reqwest::StatusCode;
use serde_json::Value;

use palisade_api::wire::{ErrorBody, ErrorEnvelope};
use palisade_api::ErrorCode;

use crate::Error;

/// The longest slice of a non-JSON error body quoted back in [`Error::Decode`].
const SNIPPET_LEN: usize = 200;

/// Turns a non-success answer into an [`Error`].
///
/// A body that is not the documented envelope (a proxy's HTML page, an empty 404 from a
/// wrong base URL) is a [`Error::Decode`], never a guessed code: in particular an empty
/// 404 must not read as "key not found".
pub(crate) fn decode_error(status: StatusCode, body: &[u8]) -> Error {
    match serde_json::from_slice::<ErrorEnvelope>(body) {
        Ok(envelope) => from_body(status, envelope.error),
        Err(_) => {
            let text = String::from_utf8_lossy(body);
            let snippet: String = text.chars().take(SNIPPET_LEN).collect();
            Error::Decode(format!(
                "HTTP {} with a non-JSON error body: {snippet:?}",
                status.as_u16()
            ))
        }
    }
}

fn from_body(status: StatusCode, body: ErrorBody) -> Error {
    let u64_field = |name: &str| body.extra.get(name).and_then(Value::as_u64);
    let decoded = ErrorCode::parse(&body.code).and_then(|code| match code {
        ErrorCode::StaleToken => match (u64_field("high_water"), u64_field("epoch")) {
            (Some(high_water), Some(epoch)) => Some(Error::Stale { high_water, epoch }),
            _ => None,
        },
        ErrorCode::StaleSequence => match (
            u64_field("high_water"),
            u64_field("high_water_seq"),
            u64_field("epoch"),
            u64_field("seq"),
        ) {
            (Some(high_water), Some(high_water_seq), Some(epoch), Some(seq)) => {
                Some(Error::StaleSequence {
                    high_water,
                    high_water_seq,
                    epoch,
                    seq,
                })
            }
            _ => None,
        },
        ErrorCode::LockHeld => match (body.extra.get("holder"), u64_field("retry_after_ms")) {
            (Some(Value::String(h)), Some(retry_after_ms)) => Some(Error::LockHeld {
                holder: Some(h.clone()),
                retry_after_ms,
            }),
            (Some(Value::Null) | None, Some(retry_after_ms)) => Some(Error::LockHeld {
                holder: None,
                retry_after_ms,
            }),
            _ => None,
        },
        ErrorCode::RevisionMismatch => match body.extra.get("current_revision") {
            Some(Value::Null) | None => Some(Error::RevisionMismatch {
                current_revision: None,
            }),
            Some(v) => v.as_u64().map(|r| Error::RevisionMismatch {
                current_revision: Some(r),
            }),
        },
        ErrorCode::WrongLock => match body.extra.get("token_lock") {
            Some(Value::String(lock)) => Some(Error::WrongLock(lock.clone())),
            _ => None,
        },
        ErrorCode::LeaseExpired => Some(Error::LeaseExpired),
        ErrorCode::SessionExpired => Some(Error::SessionExpired),
        ErrorCode::NotFound => Some(Error::NotFound),
        ErrorCode::MissingToken => Some(Error::MissingToken),
        ErrorCode::InvalidToken => Some(Error::InvalidToken(body.message.clone())),
        ErrorCode::PayloadTooLarge => Some(Error::PayloadTooLarge),
        ErrorCode::IdempotencyConflict => Some(Error::IdempotencyConflict),
        ErrorCode::StorageFailed => Some(Error::StorageFailed),
        ErrorCode::BadRequest => Some(Error::BadRequest(body.message.clone())),
        ErrorCode::Unauthenticated => Some(Error::Unauthenticated(body.message.clone())),
        ErrorCode::PermissionDenied => Some(Error::PermissionDenied(body.message.clone())),
        ErrorCode::QuotaExceeded => match (body.extra.get("resource"), u64_field("limit")) {
            (Some(Value::String(resource)), Some(limit)) => Some(Error::QuotaExceeded {
                resource: resource.clone(),
                limit,
            }),
            _ => None,
        },
        _ => None,
    });
    // A known code whose extra fields are missing or mistyped falls back to the generic
    // variant rather than inventing values (a zero high-water mark would be a lie).
    decoded.unwrap_or(Error::Api {
        status: status.as_u16(),
        code: body.code,
        message: body.message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(status: u16, body: &str) -> Error {
        decode_error(StatusCode::from_u16(status).unwrap(), body.as_bytes())
    }

    #[test]
    fn stale_token_carries_high_water_and_epoch() {
        let e = decode(
            409,
            r#"{"error":{"code":"stale_token","message":"m","high_water":2,"epoch":1}}"#,
        );
        assert!(matches!(
            e,
            Error::Stale {
                high_water: 2,
                epoch: 1
            }
        ));
        assert_eq!(e.code(), "stale_token");
        assert!(e.is_fenced());
    }

    #[test]
    fn stale_sequence_carries_all_four_fields() {
        let e = decode(
            409,
            r#"{"error":{"code":"stale_sequence","message":"m","high_water":3,
                "high_water_seq":9,"epoch":3,"seq":9}}"#,
        );
        assert!(matches!(
            e,
            Error::StaleSequence {
                high_water: 3,
                high_water_seq: 9,
                epoch: 3,
                seq: 9
            }
        ));
    }

    #[test]
    fn lock_held_with_and_without_holder() {
        let e = decode(
            409,
            r#"{"error":{"code":"lock_held","message":"m","holder":"h1","retry_after_ms":250}}"#,
        );
        assert!(
            matches!(e, Error::LockHeld { holder: Some(ref h), retry_after_ms: 250 } if h == "h1")
        );
        let e = decode(
            409,
            r#"{"error":{"code":"lock_held","message":"m","holder":null,"retry_after_ms":5}}"#,
        );
        assert!(matches!(
            e,
            Error::LockHeld {
                holder: None,
                retry_after_ms: 5
            }
        ));
    }

    #[test]
    fn revision_mismatch_null_and_number() {
        let e = decode(
            412,
            r#"{"error":{"code":"revision_mismatch","message":"m","current_revision":null}}"#,
        );
        assert!(matches!(
            e,
            Error::RevisionMismatch {
                current_revision: None
            }
        ));
        let e = decode(
            412,
            r#"{"error":{"code":"revision_mismatch","message":"m","current_revision":7}}"#,
        );
        assert!(matches!(
            e,
            Error::RevisionMismatch {
                current_revision: Some(7)
            }
        ));
    }

    #[test]
    fn simple_codes_map_to_their_variants() {
        let cases: &[(u16, &str)] = &[
            (404, "lease_expired"),
            (404, "not_found"),
            (400, "missing_token"),
            (413, "payload_too_large"),
            (422, "idempotency_conflict"),
            (503, "storage_failed"),
        ];
        for (status, code) in cases {
            let body = format!(r#"{{"error":{{"code":"{code}","message":"x"}}}}"#);
            let e = decode(*status, &body);
            assert_eq!(e.code(), *code);
            assert!(
                !matches!(e, Error::Api { .. }),
                "{code} fell through to Api"
            );
        }
    }

    #[test]
    fn messages_are_kept_for_invalid_token_and_bad_request() {
        let e = decode(
            400,
            r#"{"error":{"code":"invalid_token","message":"bad signature"}}"#,
        );
        assert!(matches!(e, Error::InvalidToken(ref m) if m == "bad signature"));
        let e = decode(
            400,
            r#"{"error":{"code":"bad_request","message":"ttl_ms too big"}}"#,
        );
        assert!(matches!(e, Error::BadRequest(ref m) if m == "ttl_ms too big"));
    }

    #[test]
    fn wrong_lock_carries_the_tokens_lock() {
        let e = decode(
            403,
            r#"{"error":{"code":"wrong_lock","message":"m","token_lock":"a"}}"#,
        );
        assert!(matches!(e, Error::WrongLock(ref l) if l == "a"));
    }

    #[test]
    fn unknown_code_is_api_with_status() {
        let e = decode(
            405,
            r#"{"error":{"code":"method_not_allowed","message":"no"}}"#,
        );
        match e {
            Error::Api {
                status,
                ref code,
                ref message,
            } => {
                assert_eq!(
                    (status, code.as_str(), message.as_str()),
                    (405, "method_not_allowed", "no")
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(e.code(), "method_not_allowed");
    }

    #[test]
    fn known_code_with_missing_fields_does_not_invent_values() {
        let e = decode(409, r#"{"error":{"code":"stale_token","message":"m"}}"#);
        assert!(matches!(e, Error::Api { status: 409, .. }));
        assert_eq!(e.code(), "stale_token");
    }

    #[test]
    fn non_json_bodies_are_decode_errors() {
        for body in ["", "<html>bad gateway</html>", r#"{"code":"not_found"}"#] {
            let e = decode(404, body);
            assert!(matches!(e, Error::Decode(_)), "{body:?} gave {e:?}");
            assert_eq!(e.code(), "decode");
        }
    }
}
