//! The OpenAPI 3 description of the v1 API, served at `GET /v1/openapi.json`.
//!
//! `docs/api.md` is the contract; `api/openapi.json` describes the same API for tools
//! (clients, schemathesis). scripts/test runs schemathesis against a live server with it, so
//! a route or a response shape that drifts from the document fails the build.

use axum::http::header;
use axum::response::IntoResponse;

/// The document, as served.
pub const DOCUMENT: &str = include_str!("api/openapi.json");

/// `GET /v1/openapi.json`.
pub async fn document() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::DOCUMENT;

    /// Every error code of docs/api.md's table is in the document's error schema, and no
    /// other.
    #[test]
    fn documents_exactly_the_error_codes_of_the_contract() {
        let doc: Value = serde_json::from_str(DOCUMENT).expect("valid JSON");
        assert_eq!(doc["openapi"], "3.0.3");
        let enumerated: BTreeSet<String> = doc["components"]["schemas"]["Error"]["properties"]
            ["error"]["properties"]["code"]["enum"]
            .as_array()
            .expect("code enum")
            .iter()
            .filter_map(|c| c.as_str().map(str::to_owned))
            .collect();
        let contract = include_str!("../../../docs/api.md");
        let table = contract
            .split("## Error codes")
            .nth(1)
            .expect("error code table");
        let documented: BTreeSet<String> = table
            .lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|rest| rest.split('`').next().map(str::to_owned))
            .collect();
        assert_eq!(enumerated, documented);
    }

    /// Every error answer the server can send (`palisade_api::ErrorDetail::samples`, the
    /// answers of vectors/errors.json) fits the document's error schema: its code is
    /// listed and each of its fields is a property of the schema's type.
    #[test]
    fn every_error_answer_fits_the_documented_schema() {
        let doc: Value = serde_json::from_str(DOCUMENT).expect("valid JSON");
        let schema = &doc["components"]["schemas"]["Error"]["properties"]["error"];
        let codes = schema["properties"]["code"]["enum"].as_array().unwrap();
        for detail in palisade_api::ErrorDetail::samples() {
            let body = serde_json::to_value(detail.into_body("m")).unwrap();
            assert!(codes.contains(&body["code"]), "{body}");
            for (name, value) in body.as_object().unwrap() {
                let property = &schema["properties"][name.as_str()];
                let fits = match property["type"].as_str() {
                    Some("integer") => value.is_u64(),
                    Some("string") => value.is_string(),
                    _ => false,
                } || (value.is_null() && property["nullable"] == true);
                assert!(fits, "{name} = {value} does not fit {property}");
            }
        }
    }
}
