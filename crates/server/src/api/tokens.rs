//! Key and token routes: how resources learn the issuer's public keys, and Chubby's
//! CheckSequencer (is this token genuine, is its epoch current, is its lease alive?).

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{json_body, ApiError, AppState};

#[derive(Serialize)]
struct PublicKey {
    key_id: String,
    alg: &'static str,
    public_key: String,
}

pub async fn keys(State(state): State<AppState>) -> Json<Value> {
    let keys: Vec<PublicKey> = state
        .verifier
        .keys()
        .public_keys()
        .into_iter()
        .map(|(key_id, public_key)| PublicKey {
            key_id,
            alg: "Ed25519",
            public_key,
        })
        .collect();
    Json(json!({ "keys": keys }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckBody {
    token: String,
}

pub async fn check(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let body: CheckBody = json_body(&headers, body).await?;
    let claims = match state.verifier.verify(&body.token) {
        Ok(claims) => claims,
        Err(e) => return Ok(Json(json!({ "genuine": false, "reason": e.to_string() }))),
    };
    let view = state.issuer.status(&claims.lock).await?;
    let lease_alive = view.lease.as_ref().is_some_and(|l| l.epoch == claims.epoch);
    Ok(Json(json!({
        "genuine": true,
        "lock": claims.lock,
        "epoch": claims.epoch,
        "holder": claims.holder,
        "key_id": claims.key_id,
        "current_epoch": view.epoch,
        "current": view.epoch == claims.epoch,
        "lease_alive": lease_alive,
    })))
}
