//! Seeing it work: `GET /metrics`, the events streams, and the timing of every request
//! with its access log line (debug level).
//!
//! - `GET /metrics`: Prometheus text ([`crate::observe::metrics`]). With authentication
//!   on, for principals with the `metrics` verb (in any grant) and admins.
//! - `GET /v1/events?prefix=<p>` and `GET /v1/locks/{lock}/events`: Server-Sent Events
//!   ([`crate::observe::events`]): `granted`, `released`, `expired`, `fenced`, `rejected`
//!   and `reset`. A `Last-Event-ID` header resumes after that id while the server still
//!   holds what followed it; otherwise the stream starts with `reset`. Without one,
//!   `?backlog=N` (at most [`MAX_BACKLOG`]) starts it with the newest N events the server
//!   holds of the stream's locks, so that a dashboard that opens shows what just happened. With
//!   authentication on, a stream carries only the locks its principal may `read` or
//!   `acquire` (as checked when the stream opened), takes one of its principal's places
//!   (`max_event_subscribers`), and ends when a reload of the auth file removes or
//!   changes its principal.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::rejection::QueryRejection;
use axum::extract::{MatchedPath, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::watch;

use super::{lock_name, query_of, ApiError, AppState, PathParams, QueryParams};
use crate::auth::{Auth, Caller, Verb};
use crate::observe::events::{reset_json, Live, ResetReason, Start, Subscription};
use crate::observe::{metrics, Observe};

/// How often an idle stream sends a comment, so that proxies and clients see it alive.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `GET /metrics`.
pub async fn metrics(State(state): State<AppState>, caller: Caller) -> Result<Response, ApiError> {
    caller.require_any(Verb::Metrics)?;
    let census = state.issuer.census().await;
    let observe = &state.observe;
    let failed = state.backend.is_failed() || state.issuer.is_stopped();
    observe.metrics.storage_failed().set(i64::from(failed));
    observe
        .metrics
        .subscribers()
        .set(i64::try_from(observe.events.subscribers()).unwrap_or(i64::MAX));
    let text = observe.metrics.render(census);
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(metrics::CONTENT_TYPE),
    );
    Ok(response)
}

/// One request's timing, from before its route runs to its response head: recorded under
/// its route template, and one access line per request at debug level. Started and
/// finished by the API's middleware ([`super::front`]).
pub(super) struct Timing {
    started: Instant,
    route: Option<MatchedPath>,
    method: Method,
    /// The path, kept only when the access log (debug level) is on.
    access: Option<String>,
}

impl Timing {
    pub(super) fn start(req: &axum::extract::Request) -> Timing {
        Timing {
            started: Instant::now(),
            route: req.extensions().get::<MatchedPath>().cloned(),
            method: req.method().clone(),
            access: tracing::enabled!(tracing::Level::DEBUG).then(|| req.uri().path().to_owned()),
        }
    }

    pub(super) fn finish(self, state: &AppState, response: &Response) {
        let took = self.started.elapsed();
        let template = self.route.as_ref().map_or("unmatched", |r| r.as_str());
        state.observe.metrics.request(template, took);
        if let Some(path) = self.access {
            tracing::debug!(
                method = %self.method,
                path,
                route = template,
                status = response.status().as_u16(),
                micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
                "request"
            );
        }
    }
}

/// Most events `?backlog=` may ask for.
pub const MAX_BACKLOG: usize = 1000;

/// `?prefix=` and `?backlog=` of `GET /v1/events`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    #[serde(default)]
    prefix: String,
    backlog: Option<usize>,
}

/// `?backlog=` of `GET /v1/locks/{lock}/events`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockEventsQuery {
    backlog: Option<usize>,
}

/// `?backlog=`, checked.
fn backlog(asked: Option<usize>) -> Result<usize, ApiError> {
    match asked {
        Some(n) if n > MAX_BACKLOG => Err(ApiError::bad_request(format!(
            "backlog must be at most {MAX_BACKLOG} events"
        ))),
        asked => Ok(asked.unwrap_or(0)),
    }
}

/// Which locks a stream follows.
enum Scope {
    Lock(String),
    Prefix(String),
}

impl Scope {
    fn covers(&self, lock: &str) -> bool {
        match self {
            Scope::Lock(name) => name == lock,
            Scope::Prefix(prefix) => lock.starts_with(prefix.as_str()),
        }
    }
}

/// `GET /v1/events?prefix=<p>`: every lock whose name starts with `p` (all without it).
pub async fn all(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let EventsQuery {
        prefix,
        backlog: asked,
    } = query;
    let backlog = backlog(asked)?;
    let valid = prefix.len() <= 128
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !valid {
        return Err(ApiError::bad_request(
            "prefix must be the start of a lock name ([A-Za-z0-9._-])",
        ));
    }
    if !(caller.may_any(Verb::Read) || caller.may_any(Verb::Acquire)) {
        caller.require_any(Verb::Read)?;
    }
    open(&state, caller, Scope::Prefix(prefix), &headers, backlog)
}

/// `GET /v1/locks/{lock}/events`: one lock.
pub async fn lock(
    State(state): State<AppState>,
    caller: Caller,
    PathParams(lock): PathParams<String>,
    query: Result<Query<LockEventsQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    lock_name(&lock)?;
    let backlog = backlog(query_of(query)?.backlog)?;
    if !super::locks::may_see(&caller, &lock) {
        caller.require(Verb::Read, &lock)?;
    }
    open(&state, caller, Scope::Lock(lock), &headers, backlog)
}

/// The `Last-Event-ID` header, if any.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get(palisade_api::headers::LAST_EVENT_ID) else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::bad_request("Last-Event-ID is not visible ASCII"))?
        .trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|_| ApiError::bad_request("Last-Event-ID must be an event id (an integer)"))
}

fn open(
    state: &AppState,
    caller: Caller,
    scope: Scope,
    headers: &HeaderMap,
    backlog: usize,
) -> Result<Response, ApiError> {
    let last = last_event_id(headers)?;
    let bus = &state.observe.events;
    if bus.is_closed() {
        return Err(ApiError::shutting_down());
    }
    let owner = state.limits.event_streams_for(&caller);
    // A resume takes precedence: it already says where to start.
    let covers = |lock: &str| scope.covers(lock);
    let start = match last {
        Some(id) => Start::After(id),
        None if backlog > 0 => Start::Newest(backlog, &covers),
        None => Start::Now,
    };
    let sub = bus
        .subscribe(start, owner)
        .map_err(|full| ApiError::quota_exceeded(full.resource, full.limit as u64))?;
    let revocable = match (&state.auth, &caller) {
        (Some(auth), Caller::Principal(_)) => Some((auth.clone(), auth.reloads())),
        _ => None,
    };
    let stream = Follower {
        sub,
        caller,
        scope,
        last_seen: last.unwrap_or(0),
        observe: state.observe.clone(),
        revocable,
    }
    .into_stream();
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response();
    // Proxies that buffer responses would hold events back.
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// One open stream.
struct Follower {
    sub: Subscription,
    caller: Caller,
    scope: Scope,
    /// The id of the last event this stream passed by (sent or filtered out).
    last_seen: u64,
    observe: Arc<Observe>,
    /// With authentication on: the auth file's reloads, after each of which the stream
    /// ends unless its principal stands exactly as it did.
    revocable: Option<(Arc<Auth>, watch::Receiver<u64>)>,
}

impl Follower {
    /// The SSE event for `item`, if this stream shows it.
    fn render(&mut self, item: Live) -> Option<Event> {
        match item {
            Live::Event(e) => {
                self.last_seen = e.id;
                let shown = self.scope.covers(e.lock())
                    && (self.caller.may(Verb::Read, e.lock())
                        || self.caller.may(Verb::Acquire, e.lock()));
                shown.then(|| {
                    Event::default()
                        .event(e.kind())
                        .id(e.id.to_string())
                        .data(e.json())
                })
            }
            Live::Reset { id, reason } => Some(self.reset(id, reason)),
        }
    }

    fn reset(&mut self, id: u64, reason: ResetReason) -> Event {
        self.last_seen = id;
        self.observe.metrics.reset_sent();
        Event::default()
            .event("reset")
            .id(id.to_string())
            .data(reset_json(id, reason))
    }

    /// The next event to send; `None` ends the stream (shutdown).
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(item) = self.sub.backlog.pop_front() {
                if let Some(event) = self.render(item) {
                    return Some(event);
                }
                continue;
            }
            let received = tokio::select! {
                received = self.sub.live.recv() => Some(received),
                _ = self.sub.closed.wait_for(|closed| *closed) => return None,
                () = reloaded(&mut self.revocable) => None,
            };
            let Some(received) = received else {
                if self.revoked() {
                    return None;
                }
                continue;
            };
            match received {
                Ok(item) => {
                    if let Some(event) = self.render(item) {
                        return Some(event);
                    }
                }
                Err(RecvError::Lagged(skipped)) => {
                    // Every message on the channel took one id.
                    let id = self.last_seen.saturating_add(skipped);
                    return Some(self.reset(id, ResetReason::Lagged));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    }

    /// After a reload: whether the stream's principal was removed or changed.
    fn revoked(&self) -> bool {
        let (Some((auth, _)), Caller::Principal(principal)) = (&self.revocable, &self.caller)
        else {
            return false;
        };
        let revoked = !auth.still_grants(principal);
        if revoked {
            tracing::info!(principal = %principal.name, "the auth file changed this principal: its events stream ends");
        }
        revoked
    }

    fn into_stream(self) -> impl Stream<Item = Result<Event, Infallible>> + Send {
        futures::stream::unfold(self, |mut follower| async move {
            let event = follower.next().await?;
            Some((Ok(event), follower))
        })
    }
}

/// Resolves at the next reload of the auth file; never without one.
async fn reloaded(revocable: &mut Option<(Arc<Auth>, watch::Receiver<u64>)>) {
    if let Some((_, reloads)) = revocable {
        if reloads.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use palisade_api::ErrorCode;

    #[test]
    fn scopes() {
        assert!(Scope::Lock("a".into()).covers("a"));
        assert!(!Scope::Lock("a".into()).covers("ab"));
        assert!(Scope::Prefix("a".into()).covers("ab"));
        assert!(Scope::Prefix(String::new()).covers("x"));
        assert!(!Scope::Prefix("b".into()).covers("ab"));
    }

    #[test]
    fn last_event_ids() {
        let mut h = HeaderMap::new();
        assert_eq!(last_event_id(&h).unwrap(), None);
        h.insert("last-event-id", HeaderValue::from_static(" 42 "));
        assert_eq!(last_event_id(&h).unwrap(), Some(42));
        h.insert("last-event-id", HeaderValue::from_static("x"));
        assert_eq!(last_event_id(&h).unwrap_err().code(), ErrorCode::BadRequest);
    }
}
