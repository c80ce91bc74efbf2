//! Decoding the server's error bodies into [`Error`].
//!
//! Every server error is `{"error":{"code":"<stable code>","message":"...", ...extra}}`
//! (docs/api.md). Codes a caller is expected to branch on get their own variant, carrying
//! their extra fields as typed values: "you are fenced" is [`Error::Stale`], not a string
//! to grep. Codes this version does not know become [`Error::Api`], so a newer server
//! never makes an older client fail to decode.

use palisade_api::wire::{ErrorBody, ErrorEnvelope};
use palisade_api::ErrorDetail;
use reqwest::StatusCode;

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
    // The detail is read with the server's own definition (`palisade_api::ErrorDetail`);
    // a code this version does not know, or a known code whose fields are missing or
    // mistyped, is the generic variant rather than invented values (a zero high-water
    // mark would be a lie).
    let generic = |body: ErrorBody| Error::Api {
        status: status.as_u16(),
        code: body.code,
        message: body.message,
    };
    let Some(detail) = ErrorDetail::from_body(&body) else {
        return generic(body);
    };
    match detail {
        ErrorDetail::StaleToken { high_water, epoch } => Error::Stale { high_water, epoch },
        ErrorDetail::StaleSequence {
            high_water,
            high_water_seq,
            epoch,
            seq,
        } => Error::StaleSequence {
            high_water,
            high_water_seq,
            epoch,
            seq,
        },
        ErrorDetail::LockHeld {
            holder,
            retry_after_ms,
        } => Error::LockHeld {
            holder,
            retry_after_ms,
        },
        ErrorDetail::RevisionMismatch { current_revision } => {
            Error::RevisionMismatch { current_revision }
        }
        ErrorDetail::WrongLock { token_lock } => Error::WrongLock(token_lock),
        ErrorDetail::LeaseExpired => Error::LeaseExpired,
        ErrorDetail::SessionExpired => Error::SessionExpired,
        ErrorDetail::NotFound { .. } => Error::NotFound,
        ErrorDetail::MissingToken => Error::MissingToken,
        ErrorDetail::InvalidToken => Error::InvalidToken(body.message),
        ErrorDetail::PayloadTooLarge { .. } => Error::PayloadTooLarge,
        ErrorDetail::IdempotencyConflict => Error::IdempotencyConflict,
        ErrorDetail::StorageFailed => Error::StorageFailed,
        ErrorDetail::BadRequest => Error::BadRequest(body.message),
        ErrorDetail::Unauthenticated => Error::Unauthenticated(body.message),
        ErrorDetail::PermissionDenied { .. } => Error::PermissionDenied(body.message),
        ErrorDetail::QuotaExceeded { resource, limit } => Error::QuotaExceeded { resource, limit },
        ErrorDetail::MethodNotAllowed
        | ErrorDetail::UriTooLong
        | ErrorDetail::HeadersTooLarge
        | ErrorDetail::KeyActive { .. }
        | ErrorDetail::WriteConflict
        | ErrorDetail::Unavailable => generic(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_api::ErrorCode;

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
    /// Every answer of `vectors/errors.json` (the server's own definitions, one per code
    /// and shape) decodes into its typed variant with the answer's fields, except the
    /// codes this client reads as the generic variant on purpose.
    #[test]
    fn every_error_the_server_can_send_decodes_with_its_fields() {
        const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../vectors/errors.json");
        const GENERIC: &[&str] = &[
            "method_not_allowed",
            "uri_too_long",
            "headers_too_large",
            "key_active",
            "unavailable",
        ];
        let file: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(FILE).unwrap()).unwrap();
        let answers = file["answers"].as_array().unwrap();
        assert!(answers.len() >= ErrorCode::ALL.len() - 1);
        for answer in answers {
            let status = answer["status"].as_u64().unwrap() as u16;
            let error = &answer["body"]["error"];
            let code = error["code"].as_str().unwrap();
            let decoded = decode(status, &answer["body"].to_string());
            assert_eq!(decoded.code(), code, "{answer}");
            if let Error::Api { .. } = decoded {
                assert!(
                    GENERIC.contains(&code),
                    "{code} decoded as generic: {answer}"
                );
                continue;
            }
            assert!(
                !GENERIC.contains(&code),
                "{code} has a variant now: update GENERIC"
            );
            let carried = match &decoded {
                Error::Stale { high_water, epoch } => {
                    serde_json::json!({"high_water": high_water, "epoch": epoch})
                }
                Error::StaleSequence {
                    high_water,
                    high_water_seq,
                    epoch,
                    seq,
                } => serde_json::json!({
                    "high_water": high_water, "high_water_seq": high_water_seq,
                    "epoch": epoch, "seq": seq,
                }),
                Error::LockHeld {
                    holder,
                    retry_after_ms,
                } => serde_json::json!({"holder": holder, "retry_after_ms": retry_after_ms}),
                Error::RevisionMismatch { current_revision } => {
                    serde_json::json!({"current_revision": current_revision})
                }
                Error::WrongLock(lock) => serde_json::json!({"token_lock": lock}),
                Error::QuotaExceeded { resource, limit } => {
                    serde_json::json!({"resource": resource, "limit": limit})
                }
                _ => serde_json::json!({}),
            };
            for (name, value) in carried.as_object().unwrap() {
                assert_eq!(&error[name], value, "{name} of {answer}");
            }
        }
    }
}
