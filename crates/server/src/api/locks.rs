//! Lock and lease routes (the issuer).

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};

use palisade_core::lock_table::{AcquireRequest, LeaseView, LockView};

use super::{json_body, lock_name, path, ApiError, AppState, ListQuery};
use crate::audit::AuditEvent;
use crate::auth::{Caller, Verb};

const MIN_TTL_MS: u64 = 50;
const MAX_WAIT_MS: u64 = 300_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// Who holds the lease. With authentication on, an optional label after the
    /// principal's name.
    holder: Option<String>,
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
    caller: Caller,
    lock: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<AcquireAnswer>, ApiError> {
    let lock = path(lock)?;
    lock_name(&lock)?;
    caller.require(Verb::Acquire, &lock)?;
    let body: AcquireBody = json_body(&headers, body).await?;
    let holder = caller.holder(body.holder)?;
    let max_ttl_ms = state.limits.max_ttl_for(&caller);
    if body.ttl_ms < MIN_TTL_MS {
        return Err(ApiError::bad_request(format!(
            "ttl_ms must be at least {MIN_TTL_MS}"
        )));
    }
    if body.ttl_ms > max_ttl_ms {
        return Err(ApiError::quota_exceeded("ttl_ms", max_ttl_ms));
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
            holder,
            ttl_ms: body.ttl_ms,
            wait_ms: body.wait_ms,
            lease_id,
            owner: state.limits.owner_for(&caller),
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

/// Ownership of a lease, checked before anything changes: the caller may `acquire` the
/// lease's lock and the lease is its own (or the caller is an admin). Lease ids never
/// change hands, so what this reads stays true for the call that follows. Returns the
/// lease with authentication on; nothing to look up with it off.
async fn owned_lease(
    state: &AppState,
    caller: &Caller,
    lease_id: &str,
) -> Result<Option<LeaseView>, ApiError> {
    if caller.principal().is_none() {
        return Ok(None);
    }
    let lease = state
        .issuer
        .lease(lease_id)
        .await?
        .ok_or_else(ApiError::lease_expired)?;
    caller.require(Verb::Acquire, &lease.lock)?;
    caller.require_owner(&lease.holder, "this lease", &lease.lock)?;
    Ok(Some(lease))
}

pub async fn keepalive(
    State(state): State<AppState>,
    caller: Caller,
    lease_id: Result<Path<String>, PathRejection>,
) -> Result<Json<KeepaliveAnswer>, ApiError> {
    let lease_id = path(lease_id)?;
    owned_lease(&state, &caller, &lease_id).await?;
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
    caller: Caller,
    lease_id: Result<Path<String>, PathRejection>,
) -> Result<Json<ReleaseAnswer>, ApiError> {
    let lease_id = path(lease_id)?;
    let lease = owned_lease(&state, &caller, &lease_id).await?;
    let view = state.issuer.release(&lease_id).await?;
    if let Some(lease) = lease.filter(|l| {
        caller
            .principal()
            .is_some_and(|p| !p.owns_holder(&l.holder))
    }) {
        state.audit.record(
            AuditEvent::new("lease_released_by_other")
                .principal(caller.name())
                .lock(&lease.lock)
                .lease(&lease_id)
                .epochs(Some(lease.epoch), None)
                .detail(format!("holder {}", lease.holder)),
        );
    }
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

impl LockStatus {
    /// A lock as `caller` may see it: the lease id only for its owner (and admins).
    fn seen_by(v: LockView, caller: &Caller) -> Self {
        let lease = v.lease.as_ref();
        LockStatus {
            lock: v.lock.clone(),
            epoch: v.epoch,
            holder: lease.map(|l| l.holder.clone()),
            lease_id: lease
                .filter(|l| caller.acts_for(&l.holder))
                .map(|l| l.lease_id.clone()),
            remaining_ms: lease.map(|l| l.remaining_ms),
            waiters: v.waiters,
        }
    }
}

/// Whether the caller may see a lock at all: it may acquire or read it.
fn may_see(caller: &Caller, lock: &str) -> bool {
    caller.may(Verb::Acquire, lock) || caller.may(Verb::Read, lock)
}

pub async fn status(
    State(state): State<AppState>,
    caller: Caller,
    lock: Result<Path<String>, PathRejection>,
) -> Result<Json<LockStatus>, ApiError> {
    let lock = path(lock)?;
    lock_name(&lock)?;
    if !may_see(&caller, &lock) {
        caller.require(Verb::Read, &lock)?;
    }
    let view = state.issuer.status(&lock).await?;
    Ok(Json(LockStatus::seen_by(view, &caller)))
}

#[derive(Serialize)]
pub struct LockList {
    locks: Vec<LockStatus>,
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<LockList>, ApiError> {
    let query = query.map_err(|e| ApiError::bad_request(e.body_text()))?.0;
    let limit = query.limit();
    let locks = state.issuer.list(&query.prefix, limit).await?;
    Ok(Json(LockList {
        locks: locks
            .into_iter()
            .filter(|v| may_see(&caller, &v.lock))
            .map(|v| LockStatus::seen_by(v, &caller))
            .collect(),
    }))
}
