//! `vectors/errors.json`: one error answer per code and shape the server can send, made
//! from [`ErrorDetail::samples`]. Every client decodes all of them in its own tests
//! (`crates/client/tests/error_vectors.rs`, `clients/python/tests/test_error_vectors.py`),
//! so a field renamed or added on the server fails a client's test rather than turning a
//! typed error into a generic one.

use palisade_api::wire::ErrorEnvelope;
use palisade_api::ErrorDetail;
use serde_json::{json, Value};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../vectors/errors.json");

fn generate() -> Value {
    let answers: Vec<Value> = ErrorDetail::samples()
        .into_iter()
        .map(|detail| {
            let code = detail.code();
            let envelope = ErrorEnvelope {
                error: detail.into_body(format!("a {code} answer")),
            };
            json!({"status": code.status(), "body": envelope})
        })
        .collect();
    json!({
        "about": "Every error answer the server can send, one per code and shape \
                  (palisade_api::ErrorDetail::samples). Each client decodes every answer \
                  into its typed error with these fields. Regenerate: \
                  PALISADE_UPDATE_VECTORS=1 cargo test -p palisade-api --test error_vectors",
        "answers": answers,
    })
}

#[test]
fn the_committed_error_vectors_are_the_generators() {
    palisade_test_support::vectors::assert_committed(
        FILE,
        &generate(),
        "cargo test -p palisade-api --test error_vectors",
    );
}
