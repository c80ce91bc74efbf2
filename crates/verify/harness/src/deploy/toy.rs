//! The toy store of the negative control: Palisade's store routes, without the gate.
//!
//! **Deliberately unsafe; never use it for anything but the control.** It answers `PUT`,
//! `DELETE` and `POST /v1/fences/{lock}` with 200 whatever token they carry (or none),
//! exactly the "number in a header that nobody checks" that S2 warns about. It reads the
//! epoch out of the token's payload only to echo it back the way the real store does,
//! without verifying the signature or comparing it with anything. State lives in memory,
//! behind one mutex that is never held across an `.await`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine;
use bytes::Bytes;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::VerifyError;

#[derive(Default)]
struct Toy {
    revision: u64,
    /// (namespace, key) -> (value, revision, epoch that wrote it)
    values: BTreeMap<(String, String), (Bytes, u64, u64)>,
}

type Shared = Arc<Mutex<Toy>>;

/// A running toy store on a loopback port.
pub struct ToyStore {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl ToyStore {
    pub async fn start() -> Result<ToyStore, VerifyError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| VerifyError::io("cannot bind the toy store", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| VerifyError::io("cannot read the toy store's port", e))?;
        let state: Shared = Arc::default();
        let app = Router::new()
            .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
            .route("/v1/kv/{lock}", get(list))
            .route("/v1/kv/{lock}/{*key}", get(read).put(write).delete(delete))
            .route("/v1/fences/{lock}", get(high_water).post(fence))
            .with_state(state);
        let task = tokio::spawn(async move {
            // Ends only when aborted; a failing accept loop ends the control run, which
            // then reports its workers' transport errors.
            let _ = axum::serve(listener, app).await;
        });
        Ok(ToyStore { addr, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for ToyStore {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Shared) -> std::sync::MutexGuard<'_, Toy> {
    // A panic elsewhere cannot leave the map half-updated (every update is one insert).
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The epoch written in a token's payload, unverified; 0 if there is none.
fn claimed_epoch(headers: &HeaderMap) -> u64 {
    let token = headers
        .get("fencing-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let payload = token.split('.').nth(1).unwrap_or("");
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .and_then(|claims| claims.get("e").and_then(serde_json::Value::as_u64))
        .unwrap_or(0)
}

fn not_found() -> Response {
    let body = json!({"error": {"code": "not_found", "message": "no such key"}});
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

async fn read(State(state): State<Shared>, Path((ns, key)): Path<(String, String)>) -> Response {
    let found = lock(&state).values.get(&(ns, key)).cloned();
    match found {
        Some((value, revision, epoch)) => (
            [
                ("etag", format!("\"{revision}\"")),
                ("fencing-epoch", epoch.to_string()),
            ],
            value,
        )
            .into_response(),
        None => not_found(),
    }
}

async fn write(
    State(state): State<Shared>,
    Path((ns, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let epoch = claimed_epoch(&headers);
    let mut toy = lock(&state);
    toy.revision += 1;
    let revision = toy.revision;
    toy.values.insert((ns, key), (body, revision, epoch));
    Json(json!({"revision": revision, "epoch": epoch})).into_response()
}

async fn delete(
    State(state): State<Shared>,
    Path((ns, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let epoch = claimed_epoch(&headers);
    let mut toy = lock(&state);
    if toy.values.remove(&(ns, key)).is_none() {
        return not_found();
    }
    toy.revision += 1;
    Json(json!({"revision": toy.revision, "epoch": epoch})).into_response()
}

async fn list(
    State(state): State<Shared>,
    Path(ns): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let prefix = query.get("prefix").cloned().unwrap_or_default();
    let keys: Vec<String> = lock(&state)
        .values
        .keys()
        .filter(|(n, k)| *n == ns && k.starts_with(&prefix))
        .map(|(_, k)| k.clone())
        .collect();
    Json(json!({"lock": ns, "keys": keys})).into_response()
}

/// The barrier, as a no-op: it "succeeds" and establishes nothing.
async fn fence(Path(ns): Path<String>, headers: HeaderMap) -> Response {
    let epoch = claimed_epoch(&headers);
    Json(json!({"lock": ns, "high_water": epoch, "epoch": epoch})).into_response()
}

async fn high_water(Path(ns): Path<String>) -> Response {
    Json(json!({"lock": ns, "high_water": 0, "seq": 0, "policy": "none"})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_client::Client;

    #[tokio::test]
    async fn accepts_any_token_and_echoes_its_epoch() {
        let store = ToyStore::start().await.unwrap();
        let client = Client::new(&format!("http://{}", store.addr())).unwrap();
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"l":"set","e":7,"h":"x","k":"k"}"#);
        let newer = client.fenced_kv("set", &format!("pal1.{payload}.forged"));
        let older = client.fenced_kv("set", "not-a-token");
        assert_eq!(newer.put("a", "new").await.unwrap().epoch, 7);
        // The late write of an older holder lands: nothing compares epochs here.
        assert_eq!(older.put("a", "old").await.unwrap().epoch, 0);
        let entry = client.kv("set").get("a").await.unwrap().unwrap();
        assert_eq!(&entry.value[..], b"old");
        assert_eq!(client.kv("set").list("").await.unwrap(), vec!["a"]);
        assert_eq!(older.fence().await.unwrap(), 0);
        assert!(client.kv("set").get("missing").await.unwrap().is_none());
    }
}
