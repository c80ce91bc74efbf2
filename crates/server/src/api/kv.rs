//! Fenced store routes: the gate's front door.
//!
//! For every mutation: find the token (missing -> `missing_token`), verify it (cached;
//! failure -> `invalid_token`), check it names this namespace's lock (`wrong_lock`), then
//! hand one [`FencedOp`] to storage, which runs the high-water comparison and the
//! mutation in one durable transaction. Nothing is written before all of that passed.

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use palisade_api::ErrorDetail;

use bytes::Bytes;
use palisade_api::headers as h;
use palisade_api::wire::{FenceAnswer, FenceStatus, KeyList, WriteAnswer};
use palisade_storage::{
    Action, Applied, ApplyError, Entry, FencedOp, Idempotency, Page, Precondition,
};

use super::{lock_name, path, query_of, read_body, ApiError, AppState, ListQuery, PathParams};
use crate::audit::AuditEvent;
use crate::auth::{Caller, Verb};

const MAX_KEY_LEN: usize = 1024;
const MAX_IDEMPOTENCY_KEY_LEN: usize = 128;

fn check_key(key: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(ApiError::bad_request(format!(
            "keys are 1 to {MAX_KEY_LEN} bytes"
        )));
    }
    if key.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "keys may not contain control characters",
        ));
    }
    Ok(())
}

/// Reads an optional header as text; a header that is not visible ASCII is refused.
fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    headers
        .get(name)
        .map(|v| {
            v.to_str()
                .map(str::trim)
                .map_err(|_| ApiError::bad_request(format!("header {name} is not visible ASCII")))
        })
        .transpose()
}

/// Where a mutation's fencing and preconditions come from, read in the order the checks
/// need them: the HTTP headers, or a RESP command's arguments ([`crate::resp`]). Each
/// method refuses a malformed value with `bad_request` (`invalid_token` for the token).
pub(crate) trait MutationArgs {
    /// The fencing token; `None` (or empty) is `missing_token`.
    fn token(&self) -> Result<Option<&str>, ApiError>;
    /// `Fencing-Seq` as given, parsed by [`fencing`].
    fn seq(&self) -> Result<Option<&str>, ApiError>;
    /// The idempotency key as given, checked by [`fencing`].
    fn idempotency_key(&self) -> Result<Option<&str>, ApiError>;
    fn precondition(&self) -> Result<Precondition, ApiError>;
}

impl MutationArgs for HeaderMap {
    fn token(&self) -> Result<Option<&str>, ApiError> {
        let mut tokens = self.get_all(h::FENCING_TOKEN).iter();
        match (tokens.next(), tokens.next()) {
            (None, _) => Ok(None),
            (Some(_), Some(_)) => Err(ApiError::bad_request(
                "more than one Fencing-Token header: send exactly one",
            )),
            (Some(v), None) => v
                .to_str()
                .map(|t| Some(t.trim()))
                .map_err(|_| ApiError::invalid_token("token is not visible ASCII")),
        }
    }

    fn seq(&self) -> Result<Option<&str>, ApiError> {
        header_text(self, h::FENCING_SEQ)
    }

    fn idempotency_key(&self) -> Result<Option<&str>, ApiError> {
        header_text(self, h::IDEMPOTENCY_KEY)
    }

    /// `If-Match: "<revision>"` or `If-None-Match: *`.
    fn precondition(&self) -> Result<Precondition, ApiError> {
        let if_match = header_text(self, "if-match")?;
        let if_none_match = header_text(self, "if-none-match")?;
        match (if_match, if_none_match) {
            (Some(_), Some(_)) => Err(ApiError::bad_request(
                "use If-Match or If-None-Match, not both",
            )),
            (Some(tag), None) => tag
                .trim_matches('"')
                .parse::<u64>()
                .map(Precondition::Revision)
                .map_err(|_| ApiError::bad_request("If-Match must be a revision: \"<number>\"")),
            (None, Some("*")) => Ok(Precondition::Absent),
            (None, Some(_)) => Err(ApiError::bad_request("If-None-Match supports only *")),
            (None, None) => Ok(Precondition::None),
        }
    }
}

/// Everything a mutation carries besides its action.
struct Fencing {
    epoch: u64,
    seq: Option<u64>,
    idempotency_key: Option<String>,
}

/// The three checks of a mutation (S14): `write` permission on the lock, a genuine token
/// for it, and the token's holder being the caller (or an admin, or authentication off).
/// Then the fencing arguments.
async fn fencing(
    state: &AppState,
    caller: &Caller,
    lock: &str,
    args: &impl MutationArgs,
) -> Result<Fencing, ApiError> {
    caller.require(Verb::Write, lock)?;
    let token = match args.token()? {
        Some(token) if !token.is_empty() => token,
        _ => return Err(ApiError::missing_token()),
    };
    let claims = state.keys.verify(token).await?;
    if claims.lock != lock {
        return Err(ApiError::new(
            ErrorDetail::WrongLock {
                token_lock: claims.lock.clone(),
            },
            format!("token is for lock {:?}, not {lock:?}", claims.lock),
        ));
    }
    caller.require_owner(&claims.holder, "this token", lock)?;
    let seq = args
        .seq()?
        .map(|s| {
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request("Fencing-Seq must be an unsigned integer"))
        })
        .transpose()?;
    let idempotency_key = args
        .idempotency_key()?
        .map(|k| {
            // Visible ASCII only (no space or tab inside: the header's own surrounding
            // whitespace is already trimmed).
            let ok = !k.is_empty()
                && k.len() <= MAX_IDEMPOTENCY_KEY_LEN
                && k.bytes().all(|b| b.is_ascii_graphic());
            ok.then(|| k.to_owned()).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} visible ASCII characters"
                ))
            })
        })
        .transpose()?;
    Ok(Fencing {
        epoch: claims.epoch,
        seq,
        idempotency_key,
    })
}

async fn apply(
    state: &AppState,
    lock: String,
    f: Fencing,
    action: Action,
) -> Result<Applied, ApiError> {
    let lock_of = lock.clone();
    let op = FencedOp {
        policy: state.policies.policy(&lock),
        namespace: lock,
        epoch: f.epoch,
        seq: f.seq,
        idempotency: f
            .idempotency_key
            .map(|key| Idempotency::for_request(key, f.epoch, f.seq, &action)),
        action,
    };
    let applied = state
        .backend
        .apply(op)
        .await
        .map_err(|e| rejected(e, &lock_of))?;
    state.observe.admitted(&lock_of, &applied);
    Ok(applied)
}

/// What a mutation's handler learnt before it was answered: the namespace (once its name
/// checked out) and the token's epoch (once it verified).
#[derive(Default)]
struct Seen {
    lock: Option<String>,
    epoch: Option<u64>,
}

/// Counts a refused mutation, and reports it on the events stream when it names a valid
/// namespace.
fn observed<T>(state: &AppState, seen: Seen, result: Result<T, ApiError>) -> Result<T, ApiError> {
    if let Err(e) = &result {
        match &seen.lock {
            Some(lock) => {
                let fenced = e.detail().fenced_epochs();
                let epoch = fenced.map(|(epoch, _)| epoch).or(seen.epoch);
                let high_water = fenced.map(|(_, high_water)| high_water);
                state.observe.refused(lock, e.code(), epoch, high_water);
            }
            None => state.observe.metrics.rejected(e.code()),
        }
    }
    result
}

/// A refused mutation. Stale tokens go to the audit log: they are the event fencing
/// exists for, and a flood of them is worth knowing about.
fn rejected(e: ApplyError, lock: &str) -> ApiError {
    let error = ApiError::from(e);
    let Some((epoch, high_water)) = error.detail().fenced_epochs() else {
        return error;
    };
    let event = AuditEvent::new("stale_token")
        .lock(lock)
        .epochs(Some(epoch), Some(high_water));
    error.audited(event)
}

fn written(applied: Applied) -> Response {
    let mut response = Json(WriteAnswer {
        revision: applied.revision,
        epoch: applied.epoch,
    })
    .into_response();
    if applied.replayed {
        response
            .headers_mut()
            .insert(h::IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    params: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (lock, key) = match path(params) {
        Ok(params) => params,
        Err(e) => return observed(&state, Seen::default(), Err(e)),
    };
    let value = read_body(&headers, body, state.max_value_bytes);
    change(&state, &caller, lock, key, &headers, Some(value))
        .await
        .map(written)
}

pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    params: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (lock, key) = match path(params) {
        Ok(params) => params,
        Err(e) => return observed(&state, Seen::default(), Err(e)),
    };
    change(&state, &caller, lock, key, &headers, NO_VALUE)
        .await
        .map(written)
}

/// The value of a delete.
pub(crate) const NO_VALUE: Option<std::future::Ready<Result<Bytes, ApiError>>> = None;

/// A put of `value` (a delete without one), over any protocol: the lock and key, the
/// token, the preconditions, then the value, checked in this order; a refusal is counted
/// and reported as every refused mutation is.
pub(crate) async fn change(
    state: &AppState,
    caller: &Caller,
    lock: String,
    key: String,
    args: &impl MutationArgs,
    value: Option<impl std::future::Future<Output = Result<Bytes, ApiError>>>,
) -> Result<Applied, ApiError> {
    let mut seen = Seen::default();
    // The lock and the token's epoch are noted in `seen` as they become known.
    let result = async {
        lock_name(&lock)?;
        seen.lock = Some(lock.clone());
        check_key(&key)?;
        let f = fencing(state, caller, &lock, args).await?;
        seen.epoch = Some(f.epoch);
        let precondition = args.precondition()?;
        let action = match value {
            Some(value) => Action::Put {
                key,
                value: value.await?,
                precondition,
            },
            None => Action::Delete { key, precondition },
        };
        apply(state, lock, f, action).await
    }
    .await;
    observed(state, seen, result)
}

pub async fn fence(
    State(state): State<AppState>,
    caller: Caller,
    lock: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Json<FenceAnswer>, ApiError> {
    let mut seen = Seen::default();
    let result = fence_seen(&state, caller, lock, headers, &mut seen).await;
    observed(&state, seen, result)
}

async fn fence_seen(
    state: &AppState,
    caller: Caller,
    lock: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    seen: &mut Seen,
) -> Result<Json<FenceAnswer>, ApiError> {
    let lock = path(lock)?;
    lock_name(&lock)?;
    seen.lock = Some(lock.clone());
    if headers.contains_key("if-match") || headers.contains_key("if-none-match") {
        // The barrier writes no key: a precondition on one would be silently meaningless.
        return Err(ApiError::bad_request(
            "the barrier writes no key: If-Match and If-None-Match do not apply to it",
        ));
    }
    let f = fencing(state, &caller, &lock, &headers).await?;
    seen.epoch = Some(f.epoch);
    let applied = apply(state, lock.clone(), f, Action::Fence).await?;
    Ok(Json(FenceAnswer {
        lock,
        high_water: applied.high_water.epoch,
        epoch: applied.epoch,
    }))
}

pub async fn high_water(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(lock): PathParams<String>,
) -> Result<Json<FenceStatus>, ApiError> {
    lock_name(&lock)?;
    caller.require(Verb::Read, &lock)?;
    let hw = state.backend.high_water(&lock).await?;
    Ok(Json(FenceStatus {
        policy: state.policies.policy(&lock).to_string(),
        lock,
        high_water: hw.epoch,
        seq: Some(hw.seq),
    }))
}

pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    PathParams((lock, key)): PathParams<(String, String)>,
) -> Result<Response, ApiError> {
    let entry = read(&state, &caller, &lock, &key)
        .await?
        .ok_or_else(|| ApiError::not_found("no such key"))?;
    let mut response = entry.value.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{}\"", entry.revision)) {
        headers.insert(header::ETAG, etag);
    }
    headers.insert(h::FENCING_EPOCH, HeaderValue::from(entry.epoch));
    Ok(response)
}

/// A read of one key, over any protocol: `read` permission on the lock, then the value.
pub(crate) async fn read(
    state: &AppState,
    caller: &Caller,
    lock: &str,
    key: &str,
) -> Result<Option<Entry>, ApiError> {
    lock_name(lock)?;
    caller.require(Verb::Read, lock)?;
    check_key(key)?;
    Ok(state.backend.get(lock, key).await?)
}

pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(lock): PathParams<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<KeyList>, ApiError> {
    lock_name(&lock)?;
    caller.require(Verb::Read, &lock)?;
    let query = query_of(query)?;
    let limit = query.limit();
    let keys = state
        .backend
        .list(&lock, Page::first(query.prefix, limit))
        .await?;
    Ok(Json(KeyList { lock, keys }))
}
