//! Lock and lease routes (the issuer).

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};

use palisade_core::lock_table::{AcquireRequest, LockView};
use palisade_token::MAX_HOLDER_LEN;

use super::{json_body, lock_name, path, ApiError, AppState, ListQuery};

const MIN_TTL_MS: u64 = 50;
const MAX_TTL_MS: u64 = 3_600_000;
const MAX_WAIT_MS: u64 = 300_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    holder: String,
    ttl_ms: u64,
    #[serde(default)]
    wait_ms: u64,
}

#[derive(Serialize)]
pub struct AcquireAnswer {
    lock: String,
    holder: String,
    epoch: u64,
    token: String,
    lease_id: String,
    ttl_ms: u64,
}

pub async fn acquire(
    State(state): State<AppState>,
    lock: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<AcquireAnswer>, ApiError> {
    let lock = path(lock)?;
    lock_name(&lock)?;
    let body: AcquireBody = json_body(&headers, body).await?;
    if body.holder.is_empty()
        || body.holder.len() > MAX_HOLDER_LEN
        || body.holder.chars().any(char::is_control)
    {
        return Err(ApiError::bad_request(format!(
            "holder must be 1 to {MAX_HOLDER_LEN} bytes without control characters"
        )));
    }
    if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&body.ttl_ms) {
        return Err(ApiError::bad_request(format!(
            "ttl_ms must be between {MIN_TTL_MS} and {MAX_TTL_MS}"
        )));
    }
    if body.wait_ms > MAX_WAIT_MS {
        return Err(ApiError::bad_request(format!(
            "wait_ms must be at most {MAX_WAIT_MS}"
        )));
    }
    let lease_id = hex::encode(rand::random::<[u8; 16]>());
    let granted = state
        .issuer
        .acquire(AcquireRequest {
            lock,
            holder: body.holder,
            ttl_ms: body.ttl_ms,
            wait_ms: body.wait_ms,
            lease_id,
        })
        .await?;
    let g = granted.grant;
    Ok(Json(AcquireAnswer {
        lock: g.lock,
        holder: g.holder,
        epoch: g.epoch,
        token: granted.token,
        lease_id: g.lease_id,
        ttl_ms: g.ttl_ms,
    }))
}

#[derive(Serialize)]
pub struct KeepaliveAnswer {
    lease_id: String,
    lock: String,
    epoch: u64,
    ttl_ms: u64,
}

pub async fn keepalive(
    State(state): State<AppState>,
    lease_id: Result<Path<String>, PathRejection>,
) -> Result<Json<KeepaliveAnswer>, ApiError> {
    let lease_id = path(lease_id)?;
    let view = state.issuer.keepalive(&lease_id).await?;
    Ok(Json(KeepaliveAnswer {
        lease_id: view.lease_id,
        lock: view.lock,
        epoch: view.epoch,
        ttl_ms: view.ttl_ms,
    }))
}

#[derive(Serialize)]
pub struct ReleaseAnswer {
    lease_id: String,
    lock: String,
    epoch: u64,
    released: bool,
}

pub async fn release(
    State(state): State<AppState>,
    lease_id: Result<Path<String>, PathRejection>,
) -> Result<Json<ReleaseAnswer>, ApiError> {
    let lease_id = path(lease_id)?;
    let view = state.issuer.release(&lease_id).await?;
    Ok(Json(ReleaseAnswer {
        lease_id: view.lease_id,
        lock: view.lock,
        epoch: view.epoch,
        released: true,
    }))
}

#[derive(Serialize)]
pub struct LockStatus {
    lock: String,
    epoch: u64,
    holder: Option<String>,
    lease_id: Option<String>,
    remaining_ms: Option<u64>,
    waiters: usize,
}

impl From<LockView> for LockStatus {
    fn from(v: LockView) -> Self {
        LockStatus {
            lock: v.lock,
            epoch: v.epoch,
            holder: v.lease.as_ref().map(|l| l.holder.clone()),
            lease_id: v.lease.as_ref().map(|l| l.lease_id.clone()),
            remaining_ms: v.lease.as_ref().map(|l| l.remaining_ms),
            waiters: v.waiters,
        }
    }
}

pub async fn status(
    State(state): State<AppState>,
    lock: Result<Path<String>, PathRejection>,
) -> Result<Json<LockStatus>, ApiError> {
    let lock = path(lock)?;
    lock_name(&lock)?;
    Ok(Json(state.issuer.status(&lock).await?.into()))
}

#[derive(Serialize)]
pub struct LockList {
    locks: Vec<LockStatus>,
}

pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<LockList>, ApiError> {
    let query = query.map_err(|e| ApiError::bad_request(e.body_text()))?.0;
    let limit = query.limit();
    let locks = state.issuer.list(&query.prefix, limit).await?;
    Ok(Json(LockList {
        locks: locks.into_iter().map(Into::into).collect(),
    }))
}
