//! The token test vectors (`vectors/tokens.json`, `docs/token-format.md`): made here, by
//! the Rust signer, from fixed keys, and checked here against the Rust verifier. Every
//! other implementation runs the same file in its own tests (Python:
//! `clients/python/tests/test_vectors.py`).
//!
//! The file is generated, never edited: this test fails when the committed file differs
//! from what the generator makes now; `PALISADE_UPDATE_VECTORS=1 cargo test -p
//! palisade-token --test vectors` rewrites it.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ed25519_dalek::{Signer as _, SigningKey};
use serde_json::{json, Value};

use palisade_token::{KeyRing, Signer, TokenError, Verifier, MAX_TOKEN_LEN};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../vectors/tokens.json");

/// The keys of the vectors: (name, secret, trusted by the verifier).
const KEYS: [(&str, [u8; 32], bool); 3] = [
    ("active", [1; 32], true),
    ("retired", [2; 32], false),
    ("foreign", [3; 32], false),
];

fn signer(name: &str) -> Signer {
    let (_, secret, _) = KEYS.iter().find(|(n, _, _)| *n == name).unwrap();
    Signer::from_secret(*secret)
}

/// A token over a payload written by hand (any text), signed correctly with `key`: only
/// the format rules can refuse it.
fn signed_payload(key: &str, payload: &str) -> String {
    let (_, secret, _) = KEYS.iter().find(|(n, _, _)| *n == key).unwrap();
    let signed = format!("pal1.{}", B64.encode(payload));
    let signature = SigningKey::from_bytes(secret).sign(signed.as_bytes());
    format!("{signed}.{}", B64.encode(signature.to_bytes()))
}

/// Replaces the payload of `token` with `payload`, keeping its signature.
fn edited(token: &str, payload: &str) -> String {
    let parts: Vec<&str> = token.split('.').collect();
    format!("pal1.{}.{}", B64.encode(payload), parts[2])
}

fn valid(name: &str, lock: &str, token: String, epoch: u64, holder: &str) -> Value {
    json!({
        "name": name,
        "token": token,
        "lock": lock,
        "expect": "valid",
        "claims": {"lock": lock, "epoch": epoch, "holder": holder, "key_id": signer("active").key_id()},
    })
}

fn refused(name: &str, lock: &str, token: String, class: &str) -> Value {
    json!({"name": name, "token": token, "lock": lock, "expect": class})
}

/// The whole file, as the generator makes it.
fn generate() -> Value {
    let active = signer("active");
    let kid = active.key_id().to_owned();
    let genuine = active.issue("orders", 7, "worker-1");
    let canonical = format!(r#"{{"l":"orders","e":7,"h":"worker-1","k":"{kid}"}}"#);
    let long_lock = "L".repeat(128);
    let mut flipped = genuine.clone().into_bytes();
    let last = flipped.len() - 5;
    flipped[last] = if flipped[last] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    let vectors = vec![
        valid("genuine", "orders", genuine.clone(), 7, "worker-1"),
        valid(
            "genuine, unicode holder",
            "orders",
            active.issue("orders", 1, "équipe/ночь 夜"),
            1,
            "équipe/ночь 夜",
        ),
        valid(
            "genuine, longest lock name",
            &long_lock,
            active.issue(&long_lock, u64::MAX, "h"),
            u64::MAX,
            "h",
        ),
        valid(
            "hand-written canonical payload",
            "orders",
            signed_payload("active", &canonical),
            7,
            "worker-1",
        ),
        refused("flipped signature byte", "orders", flipped, "bad_signature"),
        refused(
            "edited epoch, signature kept",
            "orders",
            edited(&genuine, &canonical.replace("\"e\":7", "\"e\":8")),
            "bad_signature",
        ),
        refused(
            "edited holder, signature kept",
            "orders",
            edited(&genuine, &canonical.replace("worker-1", "worker-2")),
            "bad_signature",
        ),
        refused(
            "signed by a key not trusted",
            "orders",
            signer("foreign").issue("orders", 7, "worker-1"),
            "unknown_key",
        ),
        refused(
            "signed by a retired key",
            "orders",
            signer("retired").issue("orders", 7, "worker-1"),
            "unknown_key",
        ),
        refused(
            "genuine token for another lock",
            "invoices",
            genuine.clone(),
            "wrong_lock",
        ),
        refused(
            "space after a colon",
            "orders",
            signed_payload("active", &canonical.replace("\"e\":7", "\"e\": 7")),
            "malformed",
        ),
        refused(
            "fields reordered",
            "orders",
            signed_payload(
                "active",
                &format!(r#"{{"e":7,"l":"orders","h":"worker-1","k":"{kid}"}}"#),
            ),
            "malformed",
        ),
        refused(
            "escaped ASCII in a string",
            "orders",
            signed_payload("active", &canonical.replace("worker-1", "worker\\u002d1")),
            "malformed",
        ),
        refused(
            "unknown field",
            "orders",
            signed_payload("active", &canonical.replace('}', ",\"x\":1}")),
            "malformed",
        ),
        refused(
            "missing field",
            "orders",
            signed_payload("active", r#"{"l":"orders","e":7,"h":"worker-1"}"#),
            "malformed",
        ),
        refused(
            "epoch zero",
            "orders",
            signed_payload("active", &canonical.replace("\"e\":7", "\"e\":0")),
            "malformed",
        ),
        refused(
            "epoch as a string",
            "orders",
            signed_payload("active", &canonical.replace("\"e\":7", "\"e\":\"7\"")),
            "malformed",
        ),
        refused(
            "illegal lock name",
            "orders",
            signed_payload(
                "active",
                &canonical.replace("\"l\":\"orders\"", "\"l\":\"a/b\""),
            ),
            "malformed",
        ),
        refused(
            "holder longer than 256 bytes",
            "orders",
            active.issue("orders", 7, &"h".repeat(257)),
            "malformed",
        ),
        refused(
            "oversize: longer than 4096 bytes",
            "orders",
            format!("{genuine}{}", "A".repeat(MAX_TOKEN_LEN)),
            "malformed",
        ),
        refused(
            "truncated signature",
            "orders",
            genuine[..genuine.len() - 4].to_owned(),
            "malformed",
        ),
        refused(
            "truncated to two parts",
            "orders",
            genuine[..genuine.rfind('.').unwrap()].to_owned(),
            "malformed",
        ),
        refused(
            "another version prefix",
            "orders",
            genuine.replacen("pal1", "pal2", 1),
            "malformed",
        ),
        refused(
            "padded base64",
            "orders",
            {
                let parts: Vec<&str> = genuine.split('.').collect();
                format!("{}.{}=.{}", parts[0], parts[1], parts[2])
            },
            "malformed",
        ),
        refused(
            "surrounded by white space",
            "orders",
            format!(" {genuine}\n"),
            "malformed",
        ),
        refused("empty", "orders", String::new(), "malformed"),
    ];
    let keys: Vec<Value> = KEYS
        .iter()
        .map(|(name, secret, trusted)| {
            let s = Signer::from_secret(*secret);
            json!({
                "name": name,
                "public_key": B64.encode(s.public_key().as_bytes()),
                "key_id": s.key_id(),
                "trusted": trusted,
            })
        })
        .collect();
    json!({
        "about": "Token test vectors: generated by crates/token/tests/vectors.rs, never edited; \
                  docs/token-format.md says what each field means.",
        "version": 1,
        "classes": ["valid", "malformed", "unknown_key", "bad_signature", "wrong_lock"],
        "keys": keys,
        "vectors": vectors,
    })
}

/// What the Rust verifier and the lock check say about a vector.
fn outcome(verifier: &Verifier, token: &str, lock: &str) -> (String, Option<Value>) {
    match verifier.verify_uncached(token) {
        Ok(claims) if claims.lock != lock => ("wrong_lock".into(), None),
        Ok(claims) => (
            "valid".into(),
            Some(json!({
                "lock": claims.lock, "epoch": claims.epoch,
                "holder": claims.holder, "key_id": claims.key_id,
            })),
        ),
        Err(TokenError::Malformed(_)) => ("malformed".into(), None),
        Err(TokenError::UnknownKey(_)) => ("unknown_key".into(), None),
        Err(TokenError::BadSignature) => ("bad_signature".into(), None),
    }
}

#[test]
fn the_committed_vectors_are_the_generators() {
    palisade_test_support::vectors::assert_committed(
        FILE,
        &generate(),
        "cargo test -p palisade-token --test vectors",
    );
}

#[test]
fn the_rust_verifier_agrees_with_every_vector() {
    let file: Value = serde_json::from_str(&std::fs::read_to_string(FILE).unwrap()).unwrap();
    let mut ring = KeyRing::new();
    for key in file["keys"].as_array().unwrap() {
        if key["trusted"] == true {
            let raw = B64.decode(key["public_key"].as_str().unwrap()).unwrap();
            let id = ring.insert_bytes(&raw.try_into().unwrap()).unwrap();
            assert_eq!(id, key["key_id"].as_str().unwrap());
        }
    }
    let verifier = Verifier::new(ring, 16);
    let classes = file["classes"].as_array().unwrap();
    let vectors = file["vectors"].as_array().unwrap();
    for class in classes {
        assert!(
            vectors.iter().any(|v| v["expect"] == *class),
            "no vector of class {class}"
        );
    }
    for v in vectors {
        let (got, claims) = outcome(
            &verifier,
            v["token"].as_str().unwrap(),
            v["lock"].as_str().unwrap(),
        );
        assert_eq!(got, v["expect"].as_str().unwrap(), "{}", v["name"]);
        if let Some(claims) = claims {
            assert_eq!(claims, v["claims"], "{}", v["name"]);
        }
    }
}
