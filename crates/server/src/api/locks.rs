//! Lock and lease routes (the issuer).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use palisade_api::QuotaResource;
use serde::Deserialize;

use palisade_api::wire::{self, KeepaliveInfo, Lease, LockList, LockStatus, Released};
use palisade_core::lock_table::LockView;
use palisade_core::page::Page;
use palisade_issuer::Acquire;
use palisade_issuer::LeaseError;

use super::{listing_permit, lock_name, ApiError, AppState, PathParams, QueryParams, RequestBody};
use crate::audit::AuditEvent;
use crate::auth::{Caller, LockPattern, Verb};

pub(super) const MIN_TTL_MS: u64 = 50;
const MAX_WAIT_MS: u64 = 300_000;

pub async fn acquire(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(lock): PathParams<String>,
    body: RequestBody,
) -> Result<Json<Lease>, ApiError> {
    grant(&state, &caller, lock, body.json()).await.map(Json)
}

/// An acquisition over any protocol: the lock's name, `acquire` permission, then the
/// request (`body`, read only once both passed), its TTL, wait and limits; then the
/// issuer's grant.
pub(crate) async fn grant(
    state: &AppState,
    caller: &Caller,
    lock: String,
    body: impl std::future::Future<Output = Result<wire::AcquireRequest, ApiError>>,
) -> Result<Lease, ApiError> {
    lock_name(&lock)?;
    caller.require(Verb::Acquire, &lock)?;
    let body = body.await?;
    let holder = caller.holder(body.holder)?;
    let ttl_ms = match (body.ttl_ms, &body.session) {
        (Some(ttl_ms), None) => check_ttl(state, caller, ttl_ms)?,
        (None, Some(session)) => {
            // The session must be the caller's; its TTL was checked when it was made.
            super::recipes::owned_session(state, caller, session).await?;
            0
        }
        (None, None) => return Err(ApiError::bad_request("ttl_ms is required")),
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "ttl_ms and session exclude each other: a lease in a session has the \
                 session's TTL",
            ))
        }
    };
    if body.wait_ms > MAX_WAIT_MS {
        return Err(ApiError::bad_request(format!(
            "wait_ms must be at most {MAX_WAIT_MS}"
        )));
    }
    let value = body
        .value
        .as_deref()
        .map(super::recipes::decode_value)
        .transpose()?;
    let max_delay = state.limits.max_lock_delay_ms;
    if body.lock_delay_ms.is_some_and(|d| d > max_delay) {
        return Err(ApiError::quota_exceeded(
            QuotaResource::LockDelayMs,
            max_delay,
        ));
    }
    let lease_id = hex::encode(rand::random::<[u8; 16]>());
    // An acquisition that may wait long, with authentication on: a reload that revokes
    // the caller ends the wait (it needs the lock's name for that).
    let revocable = (body.wait_ms > 0 && state.auth.is_some()).then(|| lock.clone());
    // Quotas per principal where the issuer counts them (the embedded issuer; not etcd,
    // which would refuse an owner rather than ignore it: docs/security.md).
    let owner = if state.issuer.counts_owners() {
        state.limits.owner_for(caller)
    } else {
        None
    };
    let acquiring = state.issuer.acquire(Acquire {
        lock,
        holder,
        ttl_ms,
        wait_ms: body.wait_ms,
        lease_id,
        owner,
        value,
        lock_delay_ms: body.lock_delay_ms,
        session: body.session,
    });
    let granted = match revocable {
        Some(lock) => {
            crate::auth::Auth::while_granted(state.auth.as_deref(), caller, &lock, async {
                acquiring.await.map_err(ApiError::from)
            })
            .await?
        }
        None => acquiring.await?,
    };
    let g = granted.lease;
    Ok(Lease {
        lock: g.lock,
        holder: g.holder,
        epoch: g.epoch,
        token: granted.token,
        lease_id: g.lease_id,
        ttl_ms: g.ttl_ms,
        lock_delay_ms: g.lock_delay_ms,
        value: g.value,
        session: g.session,
    })
}

/// A lease or session TTL: at least [`MIN_TTL_MS`], at most what the caller may ask for.
pub(super) fn check_ttl(state: &AppState, caller: &Caller, ttl_ms: u64) -> Result<u64, ApiError> {
    let max_ttl_ms = state.limits.max_ttl_for(caller);
    if ttl_ms < MIN_TTL_MS {
        return Err(ApiError::bad_request(format!(
            "ttl_ms must be at least {MIN_TTL_MS}"
        )));
    }
    if ttl_ms > max_ttl_ms {
        return Err(ApiError::quota_exceeded(QuotaResource::TtlMs, max_ttl_ms));
    }
    Ok(ttl_ms)
}

/// The issuer's answer to a keepalive, release or proclaim made with
/// [`Caller::lease_check`]: a lease refused as not the caller's answers 403, as the caller
/// would have been refused for it.
pub(super) fn as_caller<T>(caller: &Caller, answer: Result<T, LeaseError>) -> Result<T, ApiError> {
    match answer {
        Err(LeaseError::NotYours(lease)) => Err(caller.lease_refusal(&lease.lock, &lease.holder)),
        other => Ok(other?),
    }
}

pub async fn keepalive(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(lease_id): PathParams<String>,
) -> Result<Json<KeepaliveInfo>, ApiError> {
    renew(&state, &caller, &lease_id).await.map(Json)
}

/// A keepalive over any protocol.
pub(crate) async fn renew(
    state: &AppState,
    caller: &Caller,
    lease_id: &str,
) -> Result<KeepaliveInfo, ApiError> {
    let answer = state.issuer.keepalive(lease_id, caller.lease_check()).await;
    let view = as_caller(caller, answer)?;
    Ok(KeepaliveInfo {
        lease_id: view.lease_id,
        lock: view.lock,
        epoch: view.epoch,
        ttl_ms: view.ttl_ms,
    })
}

pub async fn release(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(lease_id): PathParams<String>,
) -> Result<Json<Released>, ApiError> {
    give_up(&state, &caller, &lease_id).await.map(Json)
}

/// A release over any protocol; an admin's release of someone else's lease is audited.
pub(crate) async fn give_up(
    state: &AppState,
    caller: &Caller,
    lease_id: &str,
) -> Result<Released, ApiError> {
    let answer = state.issuer.release(lease_id, caller.lease_check()).await;
    let view = as_caller(caller, answer)?;
    if caller
        .principal()
        .is_some_and(|p| !p.owns_holder(&view.holder))
    {
        // An admin released someone else's lease.
        state.audit.record(
            AuditEvent::new("lease_released_by_other")
                .principal(caller.name())
                .lock(&view.lock)
                .lease(lease_id)
                .epochs(Some(view.epoch), None)
                .detail(format!("holder {}", view.holder)),
        );
    }
    Ok(Released {
        lease_id: view.lease_id,
        lock: view.lock,
        epoch: view.epoch,
        released: true,
    })
}

/// A lock as `caller` may see it: the lease id and session only for its owner (and
/// admins).
fn seen_by(v: LockView, caller: &Caller) -> LockStatus {
    let lease = v.lease.as_ref();
    let own = lease.filter(|l| caller.acts_for(&l.holder));
    LockStatus {
        lock: v.lock.clone(),
        epoch: v.epoch,
        holder: lease.map(|l| l.holder.clone()),
        lease_id: own.map(|l| l.lease_id.clone()),
        remaining_ms: lease.map(|l| l.remaining_ms),
        waiters: v.waiters as u64,
        lease_epoch: lease.map(|l| l.epoch),
        value: lease.and_then(|l| l.value.clone()),
        lock_delay_ms: lease.map(|l| l.lock_delay_ms),
        session: own.and_then(|l| l.session.clone()),
        epoch_bound: Some(v.granted_up_to),
    }
}

/// Whether the caller may see a lock at all: it may acquire or read it.
pub(super) fn may_see(caller: &Caller, lock: &str) -> bool {
    caller.may(Verb::Acquire, lock) || caller.may(Verb::Read, lock)
}

pub async fn status(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(lock): PathParams<String>,
) -> Result<Json<LockStatus>, ApiError> {
    lock_name(&lock)?;
    if !may_see(&caller, &lock) {
        caller.require(Verb::Read, &lock)?;
    }
    let view = state.issuer.status(&lock).await?;
    Ok(Json(seen_by(view, &caller)))
}

/// `?prefix=&after=&limit=` of the paged listings (`GET /v1/locks`, `GET /v1/fences`,
/// `GET /v1/gates/marks`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    #[serde(default)]
    pub(super) prefix: String,
    pub(super) after: Option<String>,
    pub(super) limit: Option<usize>,
}

/// Which names a listing reads: everything under a prefix, or one name.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Scan {
    Prefix(String),
    Exact(String),
}

/// The scans that cover what `caller` may see under `prefix`: one scan of the prefix
/// for a caller who may see every lock, else one per grant pattern that meets the prefix.
/// A principal with a grant on `orders*` lists from the `orders` part of the index only,
/// however many other locks there are.
fn scans(caller: &Caller, prefix: &str) -> Vec<Scan> {
    scans_for(caller, prefix, &[Verb::Acquire, Verb::Read])
}

/// [`scans`] of the names on which `caller` may use one of `verbs`.
pub(super) fn scans_for(caller: &Caller, prefix: &str, verbs: &[Verb]) -> Vec<Scan> {
    let Some(principal) = caller.principal() else {
        return vec![Scan::Prefix(prefix.to_owned())];
    };
    let Some(patterns) = principal.visible_patterns(verbs) else {
        return vec![Scan::Prefix(prefix.to_owned())];
    };
    let mut scans = Vec::new();
    for pattern in patterns {
        let scan = match pattern {
            LockPattern::Prefix(p) if prefix.starts_with(p.as_str()) => Scan::Prefix(prefix.into()),
            LockPattern::Prefix(p) if p.starts_with(prefix) => Scan::Prefix(p.clone()),
            LockPattern::Exact(name) if name.starts_with(prefix) => Scan::Exact(name.clone()),
            _ => continue,
        };
        if !scans.contains(&scan) {
            scans.push(scan);
        }
    }
    scans
}

/// One page of a listing over `scans` (see [`scans_for`]), in name order, after
/// `query.after`: `fetch(page)` reads one [`Page`] from the ordered index (its prefix a
/// scan's prefix, or an exact name). Returns at most `query.limit` entries (default 1,000,
/// at most 10,000), without duplicates, and the `next` cursor when a scan may hold more.
pub(super) async fn page<T, F, Fut>(
    scans: Vec<Scan>,
    query: &PageQuery,
    name: impl Fn(&T) -> &str,
    mut fetch: F,
) -> Result<(Vec<T>, Option<String>), ApiError>
where
    F: FnMut(Page) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>, ApiError>>,
{
    let (after, limit) = (
        query.after.as_deref(),
        query.limit.unwrap_or(1000).clamp(1, 10_000),
    );
    let mut found: Vec<T> = Vec::new();
    let mut more = false;
    for scan in scans {
        let page = match scan {
            Scan::Prefix(p) => {
                let page = fetch(Page::new(p, after, limit)).await?;
                more |= page.len() == limit;
                page
            }
            Scan::Exact(exact) => {
                let mut one = fetch(Page::new(exact.as_str(), after, 1)).await?;
                one.retain(|v| name(v) == exact);
                one
            }
        };
        found.extend(page);
    }
    found.sort_by(|a, b| name(a).cmp(name(b)));
    found.dedup_by(|a, b| name(a) == name(b));
    if found.len() > limit {
        found.truncate(limit);
        more = true;
    }
    let next = more
        .then(|| found.last().map(|v| name(v).to_owned()))
        .flatten();
    Ok((found, next))
}

/// `GET /v1/locks?prefix=&after=&limit=`.
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<PageQuery>,
) -> Result<Response, ApiError> {
    let _permit = listing_permit(&state).await?;
    let (found, next) = page(
        scans(&caller, &query.prefix),
        &query,
        |v: &LockView| v.lock.as_str(),
        |page| {
            let issuer = state.issuer.clone();
            async move { Ok(issuer.list(page).await?) }
        },
    )
    .await?;
    let list = LockList {
        locks: found
            .into_iter()
            .filter(|v| may_see(&caller, &v.lock))
            .map(|v| seen_by(v, &caller))
            .collect(),
        next,
    };
    Ok(Json(list).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::parse;

    fn caller(grants: &str) -> Caller {
        let text = format!(
            "[[principal]]\nname = \"p\"\nkey_sha256 = \"{}\"\n{grants}",
            "ab".repeat(32)
        );
        let policy = parse(&text).unwrap();
        Caller::Principal(policy.principals()[0].clone())
    }

    fn grant(locks: &str, verbs: &str) -> String {
        format!("[[principal.grant]]\nlocks = \"{locks}\"\nallow = [{verbs}]\n")
    }

    #[test]
    fn listings_read_only_what_the_grants_cover() {
        let p = caller(&format!(
            "{}{}{}",
            grant("orders*", "\"read\""),
            grant("ledger", "\"acquire\""),
            grant("secret*", "\"write\"")
        ));
        assert_eq!(
            scans(&p, ""),
            vec![Scan::Prefix("orders".into()), Scan::Exact("ledger".into())]
        );
        assert_eq!(
            scans(&p, "orders.eu"),
            vec![Scan::Prefix("orders.eu".into())]
        );
        assert_eq!(scans(&p, "or"), vec![Scan::Prefix("orders".into())]);
        assert_eq!(scans(&p, "led"), vec![Scan::Exact("ledger".into())]);
        assert!(
            scans(&p, "secret").is_empty(),
            "write alone does not show a lock"
        );
        assert_eq!(scans(&Caller::Open, "x"), vec![Scan::Prefix("x".into())]);
        let all = caller(&grant("*", "\"read\""));
        assert_eq!(scans(&all, "a"), vec![Scan::Prefix("a".into())]);
    }
}
