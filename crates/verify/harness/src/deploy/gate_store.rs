//! [`GateStore`]: the store routes the workers speak, served by an application that writes
//! to a user's database through a Palisade gate (or, for the controls, by the toy store).
//!
//! The gate targets put the workers in front of what a user builds: a service that takes
//! a fencing token with each request and writes to its own database through
//! `palisade-adapters`, the admit and the write in one transaction. This module is that
//! service's HTTP side: the same routes and answers as Palisade's fenced store
//! (`/v1/kv/{lock}/{*key}` get, put and delete, `/v1/kv/{lock}` list, `/v1/fences/{lock}`
//! get and post, `/healthz`), so the workers, the final read and the checkers are the
//! ones every other target uses. What happens behind a route is a [`GatedDb`]'s (one per
//! kind of database: [`super::pg_store`]).
//!
//! Answers follow the server's: a refused admit is the error the server would send for
//! it ([`palisade_adapters::AdmitError::detail`]), so a stale writer gets `409
//! stale_token` with both epochs; a database that cannot be reached, or does not answer
//! within [`DEADLINE`], is `503 storage_failed`, which the workers record as "may have
//! happened" (the transaction's commit may have reached the database before it went
//! away). Nothing here decides anything about fencing: that is the gate's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use tokio::task::JoinHandle;

use palisade_adapters::{AdmitError, ErrorDetail};
use palisade_api::headers;
use palisade_api::wire::{FenceAnswer, FenceStatus, Health, KeyList, WriteAnswer};

use crate::VerifyError;

/// The longest a request may wait on the database (a frozen database holds it that long).
pub const DEADLINE: Duration = Duration::from_secs(5);

/// One stored value.
#[derive(Debug, Clone)]
pub struct Entry {
    pub value: Bytes,
    pub revision: u64,
    /// The epoch of the holder that wrote it.
    pub epoch: u64,
}

/// Why a store operation did not happen (or may not have).
#[derive(Debug)]
pub enum StoreError {
    /// The gate refused the token; nothing was written.
    Refused(AdmitError),
    /// No such key (a delete); nothing was written.
    NotFound,
    /// The database failed or went away: the operation may or may not have happened.
    Failed(String),
}

impl From<AdmitError> for StoreError {
    /// A gate's refusal, or (for a backend error) a database that failed.
    fn from(e: AdmitError) -> StoreError {
        match e {
            AdmitError::Backend(e) => StoreError::Failed(e.to_string()),
            refused => StoreError::Refused(refused),
        }
    }
}

impl StoreError {
    fn into_response(self) -> Response {
        let (detail, message) = match self {
            StoreError::Refused(e) => (e.detail(), e.to_string()),
            StoreError::NotFound => (
                ErrorDetail::NotFound { key_id: None },
                "no such key".to_owned(),
            ),
            StoreError::Failed(why) => (ErrorDetail::StorageFailed, why),
        };
        let status = StatusCode::from_u16(detail.code().status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(detail.answer(&message))).into_response()
    }
}

/// A gate's preflight refusal (`why`), as the report of a negative control says it.
pub fn preflight_refused(why: &str) -> String {
    format!("the gate's preflight refuses this database: {why}")
}

/// A read of the gate's own table that failed: whatever the gate says, nothing was
/// refused, so it is the database's failure.
pub fn failed_read(e: AdmitError) -> StoreError {
    StoreError::Failed(e.to_string())
}

/// An epoch as the database's signed 64-bit integer.
pub fn signed(n: u64) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|_| StoreError::Failed(format!("epoch {n} does not fit an i64")))
}

/// A revision or epoch read back from the database.
pub fn unsigned(n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| StoreError::Failed(format!("negative number {n} in verify_kv")))
}

/// One write through a gate: `token` admitted for `lock`, then `key` set to `value`
/// (`Some`) or deleted (`None`), in one transaction.
pub struct Mutation<'a> {
    pub lock: &'a str,
    pub key: &'a str,
    pub value: Option<Bytes>,
    pub token: &'a str,
}

/// A database written through a gate (or the controls' toy store): what each store
/// route does there.
#[async_trait]
pub trait GatedDb: Send + Sync + 'static {
    /// Admits the mutation's token for its lock and, in the same transaction, writes its
    /// key (`value: Some`) or deletes it (`None`).
    async fn mutate(&self, m: Mutation<'_>) -> Result<WriteAnswer, StoreError>;

    /// Admits `token` for `lock` with no write: the barrier (raises the mark).
    async fn fence(&self, lock: &str, token: &str) -> Result<FenceAnswer, StoreError>;

    async fn read(&self, lock: &str, key: &str) -> Result<Option<Entry>, StoreError>;

    async fn list(&self, lock: &str, prefix: &str) -> Result<Vec<String>, StoreError>;

    /// The lock's committed mark (0 if the database never admitted it).
    async fn high_water(&self, lock: &str) -> Result<u64, StoreError>;

    /// The policy `GET /v1/fences/{lock}` reports.
    fn policy(&self) -> &'static str {
        "epoch"
    }
}

type Shared = Arc<dyn GatedDb>;

/// The service on a loopback port.
pub struct GateStore {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl GateStore {
    /// Serves `db` on a free loopback port, in a task of this process.
    pub async fn start(db: Shared) -> Result<GateStore, VerifyError> {
        let (listener, addr) = crate::procs::loopback_listener("the gate's store").await?;
        let task = tokio::spawn(GateStore::serve(listener, db));
        Ok(GateStore { addr, task })
    }

    /// Serves `db` on `listener` until the process ends (the application process of the
    /// `sqlite-gate` target) or the task is aborted.
    pub async fn serve(listener: tokio::net::TcpListener, db: Shared) {
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
            .with_state(db);
        // Ends only when aborted (or the listener fails).
        let _ = axum::serve(listener, app).await;
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for GateStore {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs `op` within [`DEADLINE`], answering `ok` with its value.
async fn answer<T>(
    op: impl std::future::Future<Output = Result<T, StoreError>>,
    ok: impl FnOnce(T) -> Response,
) -> Response {
    match tokio::time::timeout(DEADLINE, op).await {
        Ok(Ok(value)) => ok(value),
        Ok(Err(e)) => e.into_response(),
        Err(_) => StoreError::Failed(format!("the database did not answer within {DEADLINE:?}"))
            .into_response(),
    }
}

fn token(headers: &HeaderMap) -> &str {
    headers
        .get(headers::FENCING_TOKEN)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

async fn read(State(db): State<Shared>, Path((lock, key)): Path<(String, String)>) -> Response {
    answer(db.read(&lock, &key), |found| match found {
        Some(entry) => (
            [
                ("etag", format!("\"{}\"", entry.revision)),
                (headers::FENCING_EPOCH, entry.epoch.to_string()),
            ],
            entry.value,
        )
            .into_response(),
        None => StoreError::NotFound.into_response(),
    })
    .await
}

async fn write(
    State(db): State<Shared>,
    Path((lock, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    answer(
        db.mutate(Mutation {
            lock: &lock,
            key: &key,
            value: Some(body),
            token: token(&headers),
        }),
        |a| Json(a).into_response(),
    )
    .await
}

async fn delete(
    State(db): State<Shared>,
    Path((lock, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    answer(
        db.mutate(Mutation {
            lock: &lock,
            key: &key,
            value: None,
            token: token(&headers),
        }),
        |a| Json(a).into_response(),
    )
    .await
}

async fn list(
    State(db): State<Shared>,
    Path(lock): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let prefix = query.get("prefix").cloned().unwrap_or_default();
    answer(db.list(&lock, &prefix), |keys| {
        Json(KeyList {
            lock: lock.clone(),
            keys,
        })
        .into_response()
    })
    .await
}

async fn fence(State(db): State<Shared>, Path(lock): Path<String>, headers: HeaderMap) -> Response {
    answer(db.fence(&lock, token(&headers)), |a| {
        Json(a).into_response()
    })
    .await
}

async fn high_water(State(db): State<Shared>, Path(lock): Path<String>) -> Response {
    answer(db.high_water(&lock), |mark| {
        Json(FenceStatus {
            lock: lock.clone(),
            high_water: mark,
            seq: Some(0),
            policy: db.policy().into(),
        })
        .into_response()
    })
    .await
}
