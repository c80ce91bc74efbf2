//! Routes of the recipes built on leases: lock values (`proclaim`) and sessions.
//!
//! - `POST /v1/leases/{lease_id}/proclaim` `{"value": "<base64>" | null}`: the lease's
//!   holder replaces what it advertises.
//! - `POST /v1/sessions` `{"ttl_ms", "holder"?}`: a session, one keepalive for many
//!   leases (acquire with `"session": "<id>"`).
//! - `GET /v1/sessions/{id}`, `POST /v1/sessions/{id}/keepalive`,
//!   `POST /v1/sessions/{id}/close`.
//!
//! Ownership (S14): a session belongs to the principal its holder names, as a lease
//! does; renewing, reading, closing it or acquiring in it by anyone else is 403
//! `permission_denied` (admins excepted). Creating one needs permission to acquire some
//! lock; it counts as one lease against the principal's quota, and each lease in it as
//! one more.

use std::sync::Arc;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::Json;
use palisade_api::ErrorDetail;

use palisade_api::recipes::MAX_LOCK_VALUE_BYTES;
use palisade_api::wire::{self, ProclaimRequest, Proclaimed, SessionInfo, SessionLease};
use palisade_core::lock_table::{LeaseView, SessionView};
use palisade_issuer::{LockService, SessionRequest};

use super::locks::{as_caller, check_ttl};
use super::{ApiError, AppState, PathParams, RequestBody};
use crate::audit::AuditEvent;
use crate::auth::{Caller, Verb};

/// Longest session id accepted in a path (the server makes 32 hex characters).
const MAX_SESSION_ID_LEN: usize = 128;

/// A value from its wire form: standard base64, at most [`MAX_LOCK_VALUE_BYTES`] decoded.
pub(super) fn decode_value(text: &str) -> Result<Vec<u8>, ApiError> {
    // Four characters of base64 carry three bytes: refuse a long text before decoding.
    if text.len() > MAX_LOCK_VALUE_BYTES.div_ceil(3) * 4 {
        return Err(value_too_large());
    }
    let value = palisade_issuer::value::decode(text).ok_or_else(|| {
        ApiError::bad_request("value must be standard base64 with padding (RFC 4648)")
    })?;
    if value.len() > MAX_LOCK_VALUE_BYTES {
        return Err(value_too_large());
    }
    Ok(value)
}

fn value_too_large() -> ApiError {
    ApiError::new(
        ErrorDetail::PayloadTooLarge {
            limit: Some(MAX_LOCK_VALUE_BYTES as u64),
        },
        format!("a lock value may be at most {MAX_LOCK_VALUE_BYTES} bytes"),
    )
}

pub async fn proclaim(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(lease_id): PathParams<String>,
    body: RequestBody,
) -> Result<Json<Proclaimed>, ApiError> {
    // A missing field and `null` both clear: `Option` cannot tell them apart, and
    // `deny_unknown_fields` keeps typos from passing as a clear.
    let body: ProclaimRequest = body.json().await?;
    let value = body.value.as_deref().map(decode_value).transpose()?;
    let answer = state
        .issuer
        .proclaim(&lease_id, value, caller.lease_check())
        .await;
    let view = as_caller(&caller, answer)?;
    Ok(Json(Proclaimed {
        lease_id: view.lease_id,
        lock: view.lock,
        epoch: view.epoch,
        value: view.value,
    }))
}

fn session_info(v: SessionView) -> SessionInfo {
    SessionInfo {
        session_id: v.session_id,
        holder: v.holder,
        ttl_ms: v.ttl_ms,
        remaining_ms: v.remaining_ms,
        leases: v.leases.into_iter().map(session_lease).collect(),
    }
}

fn session_lease(l: LeaseView) -> SessionLease {
    SessionLease {
        lease_id: l.lease_id,
        lock: l.lock,
        epoch: l.epoch,
    }
}

pub async fn create_session(
    State(state): State<AppState>,
    caller: Caller,
    body: RequestBody,
) -> Result<Json<SessionInfo>, ApiError> {
    if !caller.may_any(Verb::Acquire) {
        return Err(denied(
            &caller,
            "may not acquire any lock, so may not hold a session",
        ));
    }
    let body: wire::SessionRequest = body.json().await?;
    let holder = caller.holder(body.holder)?;
    let ttl_ms = check_ttl(&state, &caller, body.ttl_ms)?;
    let view = state
        .issuer
        .create_session(SessionRequest {
            session_id: hex::encode(rand::random::<[u8; 16]>()),
            holder,
            ttl_ms,
            owner: state.limits.owner_for(&caller),
        })
        .await?;
    Ok(Json(session_info(view)))
}

pub async fn session(owned: OwnedSession) -> Json<SessionInfo> {
    Json(session_info(owned.view))
}

pub async fn keepalive_session(owned: OwnedSession) -> Result<Json<SessionInfo>, ApiError> {
    let view = owned.issuer.keepalive_session(&owned.id).await?;
    Ok(Json(session_info(view)))
}

pub async fn close_session(owned: OwnedSession) -> Result<Json<SessionInfo>, ApiError> {
    let view = owned.issuer.close_session(&owned.id).await?;
    Ok(Json(session_info(view)))
}

/// The session a route's path names, checked before the handler runs: a well-formed id
/// ([`check_session_id`]) of a live session the caller owns ([`owned_session`]).
pub struct OwnedSession {
    id: String,
    /// The session as the ownership check read it.
    view: SessionView,
    /// Where the session lives.
    issuer: Arc<dyn LockService>,
}

impl FromRequestParts<AppState> for OwnedSession {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let caller = Caller::from_request_parts(parts, state).await?;
        let PathParams(id) = PathParams::<String>::from_request_parts(parts, state).await?;
        check_session_id(&id)?;
        let view = owned_session(state, &caller, &id).await?;
        let issuer = Arc::clone(&state.issuer);
        Ok(OwnedSession { id, view, issuer })
    }
}

/// A session id from a path: visible ASCII without `/`, at most [`MAX_SESSION_ID_LEN`].
fn check_session_id(id: &str) -> Result<(), ApiError> {
    let visible = id.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
    if id.is_empty() || id.len() > MAX_SESSION_ID_LEN || !visible {
        return Err(ApiError::bad_request(format!(
            "a session id is 1 to {MAX_SESSION_ID_LEN} visible ASCII characters without '/'"
        )));
    }
    Ok(())
}

/// Ownership of a session, checked before anything is done with it: it is live and the
/// caller acts for its holder (always true with authentication off). Session ids never
/// change hands, so what this reads stays true for the call that follows.
pub(super) async fn owned_session(
    state: &AppState,
    caller: &Caller,
    session_id: &str,
) -> Result<SessionView, ApiError> {
    let view = state
        .issuer
        .session(session_id)
        .await?
        .ok_or_else(ApiError::session_expired)?;
    if !caller.acts_for(&view.holder) {
        return Err(denied(caller, "this session belongs to another principal"));
    }
    Ok(view)
}

/// 403 `permission_denied`, audited like the other refusals of [`Caller`].
fn denied(caller: &Caller, message: &str) -> ApiError {
    ApiError::permission_denied(caller.name(), message)
        .audited(AuditEvent::new("permission_denied").principal(caller.name()))
}
