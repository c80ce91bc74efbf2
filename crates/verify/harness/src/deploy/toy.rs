//! The toy store of the controls: Palisade's store routes, in memory, in two modes.
//!
//! - [`Check::Nothing`]: **deliberately unsafe; never use it for anything but a negative
//!   control.** It answers `PUT`, `DELETE` and `POST /v1/fences/{lock}` with 200 whatever
//!   token they carry (or none), exactly the "number in a header that nobody checks" that
//!   S2 warns about. It reads the epoch out of the token's payload only to echo it back
//!   the way the real store does, without verifying the signature or comparing it.
//! - [`Check::Epoch`]: the same store with the gate rule ([`palisade_core::gate::admit`],
//!   epoch policy) applied to that claimed epoch, under the same mutex as the mutation
//!   (S5, S6): a smaller epoch than the namespace's mark is refused with `stale_token`.
//!   The etcd-lock-fenced control uses it with etcd's lock revision as the epoch. The
//!   epoch is *not* authenticated (no signature): this mode shows what checking at the
//!   resource buys, not what signed tokens buy (S14).
//!
//! State lives in memory, behind one mutex that is never held across an `.await`; it has
//! nothing durable, so the controls never kill it.

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
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use palisade_api::wire::{ErrorEnvelope, FenceAnswer, FenceStatus, Health, KeyList, WriteAnswer};
use palisade_api::{headers, ErrorCode};
use palisade_core::gate::{self, HighWater, Policy};

use crate::VerifyError;

/// What the toy store checks before a mutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Nothing: every mutation is applied.
    Nothing,
    /// The gate rule on the token's claimed epoch.
    Epoch,
}

struct Toy {
    check: Check,
    revision: u64,
    /// (namespace, key) -> (value, revision, epoch that wrote it)
    values: BTreeMap<(String, String), (Bytes, u64, u64)>,
    /// Per namespace: the largest epoch admitted ([`Check::Epoch`] only).
    marks: HashMap<String, HighWater>,
}

impl Toy {
    /// Runs the gate for a mutation of `ns` with `epoch`; on refusal, the answer to send.
    fn gate(&mut self, ns: &str, epoch: u64) -> Result<(), Box<Response>> {
        if self.check == Check::Nothing {
            return Ok(());
        }
        let mark = self.marks.get(ns).copied().unwrap_or_default();
        match gate::admit(mark, Policy::Epoch, epoch, None) {
            Ok(next) => {
                self.marks.insert(ns.to_owned(), next);
                Ok(())
            }
            Err(_) => {
                let mut body = ErrorEnvelope::new(
                    ErrorCode::StaleToken,
                    "epoch below the namespace's high-water mark",
                );
                body.error
                    .extra
                    .insert("high_water".into(), mark.epoch.into());
                body.error.extra.insert("epoch".into(), epoch.into());
                Err(Box::new((StatusCode::CONFLICT, Json(body)).into_response()))
            }
        }
    }

    fn mark(&self, ns: &str) -> u64 {
        self.marks.get(ns).map_or(0, |m| m.epoch)
    }
}

type Shared = Arc<Mutex<Toy>>;

/// A running toy store on a loopback port.
pub struct ToyStore {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl ToyStore {
    pub async fn start(check: Check) -> Result<ToyStore, VerifyError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| VerifyError::io("cannot bind the toy store", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| VerifyError::io("cannot read the toy store's port", e))?;
        let state: Shared = Arc::new(Mutex::new(Toy {
            check,
            revision: 0,
            values: BTreeMap::new(),
            marks: HashMap::new(),
        }));
        let app = Router::new()
            .route(
                "/healthz",
                get(|| async {
                    Json(Health {
                        status: "ok".into(),
                    })
                }),
            )
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
        .get(headers::FENCING_TOKEN)
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
    let body = ErrorEnvelope::new(ErrorCode::NotFound, "no such key");
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

async fn read(State(state): State<Shared>, Path((ns, key)): Path<(String, String)>) -> Response {
    let found = lock(&state).values.get(&(ns, key)).cloned();
    match found {
        Some((value, revision, epoch)) => (
            [
                ("etag", format!("\"{revision}\"")),
                (headers::FENCING_EPOCH, epoch.to_string()),
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
    if let Err(refused) = toy.gate(&ns, epoch) {
        return *refused;
    }
    toy.revision += 1;
    let revision = toy.revision;
    toy.values.insert((ns, key), (body, revision, epoch));
    Json(WriteAnswer { revision, epoch }).into_response()
}

async fn delete(
    State(state): State<Shared>,
    Path((ns, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let epoch = claimed_epoch(&headers);
    let mut toy = lock(&state);
    if !toy.values.contains_key(&(ns.clone(), key.clone())) {
        return not_found();
    }
    if let Err(refused) = toy.gate(&ns, epoch) {
        return *refused;
    }
    toy.values.remove(&(ns, key));
    toy.revision += 1;
    Json(WriteAnswer {
        revision: toy.revision,
        epoch,
    })
    .into_response()
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
    Json(KeyList { lock: ns, keys }).into_response()
}

/// The barrier: with [`Check::Nothing`] a no-op that "succeeds" and establishes
/// nothing; with [`Check::Epoch`] it raises the mark like a write.
async fn fence(
    State(state): State<Shared>,
    Path(ns): Path<String>,
    headers: HeaderMap,
) -> Response {
    let epoch = claimed_epoch(&headers);
    let mut toy = lock(&state);
    if let Err(refused) = toy.gate(&ns, epoch) {
        return *refused;
    }
    let high_water = match toy.check {
        Check::Nothing => epoch,
        Check::Epoch => toy.mark(&ns),
    };
    Json(FenceAnswer {
        lock: ns,
        high_water,
        epoch,
    })
    .into_response()
}

async fn high_water(State(state): State<Shared>, Path(ns): Path<String>) -> Response {
    let toy = lock(&state);
    let policy = match toy.check {
        Check::Nothing => "none",
        Check::Epoch => "epoch",
    };
    let mark = toy.mark(&ns);
    Json(FenceStatus {
        lock: ns,
        high_water: mark,
        seq: Some(0),
        policy: policy.into(),
    })
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_client::Client;

    fn token(epoch: u64) -> String {
        let claims = format!(r#"{{"l":"set","e":{epoch},"h":"x","k":"k"}}"#);
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims);
        format!("pal1.{payload}.forged")
    }

    #[tokio::test]
    async fn accepts_any_token_and_echoes_its_epoch() {
        let store = ToyStore::start(Check::Nothing).await.unwrap();
        let client = Client::new(&format!("http://{}", store.addr())).unwrap();
        let newer = client.fenced_kv("set", &token(7));
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

    #[tokio::test]
    async fn the_epoch_check_refuses_older_epochs() {
        let store = ToyStore::start(Check::Epoch).await.unwrap();
        let client = Client::new(&format!("http://{}", store.addr())).unwrap();
        let (old, new) = (
            client.fenced_kv("set", &token(3)),
            client.fenced_kv("set", &token(5)),
        );
        // The old holder writes first: nothing newer has been seen yet (S10).
        assert_eq!(old.put("a", "old").await.unwrap().epoch, 3);
        assert_eq!(new.fence().await.unwrap(), 5);
        let refused = old.put("a", "late").await.unwrap_err();
        assert!(matches!(
            refused,
            palisade_client::Error::Stale {
                high_water: 5,
                epoch: 3
            }
        ));
        assert!(old.delete("a").await.unwrap_err().is_fenced());
        assert!(old.fence().await.unwrap_err().is_fenced());
        assert_eq!(new.put("a", "new").await.unwrap().epoch, 5);
        let entry = client.kv("set").get("a").await.unwrap().unwrap();
        assert_eq!(&entry.value[..], b"new");
        assert_eq!(client.high_water("set").await.unwrap().high_water, 5);
    }
}
