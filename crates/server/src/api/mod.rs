//! The v1 HTTP API: routes, shared state and request parsing helpers.
//!
//! Handlers never use axum's default extractors for anything a client controls in a way
//! that could produce a non-JSON error: bodies, paths and queries are parsed here and
//! every failure becomes an [`ApiError`] with a stable code.

mod admin;
mod front;
mod gates;
pub(crate) mod kv;
pub(crate) mod locks;
mod namespaces;
mod observe;
mod recipes;
mod tokens;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use palisade_storage::FencedStore;
use palisade_token::{validate_lock_name, Verifier};

use crate::audit::Audit;
use crate::auth::Auth;
pub use crate::error::ApiError;
use crate::limits::Limits;
use crate::policies::NamespacePolicies;
use palisade_issuer::LockService;

/// What every handler can reach: one pointer to the [`Shared`] state, so that the copies
/// the router makes for each request (one per extractor and middleware) cost one atomic
/// increment each instead of one per field.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl From<Shared> for AppState {
    fn from(shared: Shared) -> AppState {
        AppState(Arc::new(shared))
    }
}

/// The server's state, set up before serving (its fields are public for that) and then
/// shared by every handler as an [`AppState`].
#[derive(Clone)]
pub struct Shared {
    pub issuer: Arc<dyn LockService>,
    pub backend: Arc<dyn FencedStore>,
    pub verifier: Arc<Verifier>,
    /// The key set: what `verifier` trusts and the issuer signs with, and its changes.
    pub keys: Arc<crate::keys::KeyRegistry>,
    pub policies: Arc<NamespacePolicies>,
    pub max_value_bytes: usize,
    /// The auth file in use; `None` serves every request as `Caller::Open`.
    pub auth: Option<Arc<Auth>>,
    pub audit: Audit,
    pub limits: Limits,
    /// Listings of locks running at once. A page can be thousands of locks; without a
    /// bound, many listers at once would take every core and starve renewals.
    pub listings: Arc<tokio::sync::Semaphore>,
    /// Metrics, the events stream and the rejection log.
    pub observe: Arc<crate::observe::Observe>,
    /// Backups while serving (the embedded backend; `None` over etcd).
    pub backup: Option<Arc<crate::recovery::online::OnlineBackup>>,
}

impl Shared {
    /// A state with the default settings: no authentication, no audit log, default
    /// limits and policies, values up to `DEFAULT_MAX_VALUE_BYTES`. Set the public fields to
    /// change them.
    pub fn new(
        issuer: Arc<dyn LockService>,
        backend: Arc<dyn FencedStore>,
        keys: Arc<crate::keys::KeyRegistry>,
    ) -> Shared {
        Shared {
            issuer,
            backend,
            verifier: keys.verifier(),
            keys,
            policies: Arc::new(NamespacePolicies::default()),
            max_value_bytes: crate::limits::DEFAULT_MAX_VALUE_BYTES,
            auth: None,
            audit: Audit::off(),
            limits: Limits::default(),
            listings: Arc::new(tokio::sync::Semaphore::new(listing_permits())),
            observe: crate::observe::Observe::new(
                crate::observe::DEFAULT_EVENTS_BUFFER,
                crate::observe::DEFAULT_MAX_SUBSCRIBERS,
            ),
            backup: None,
        }
    }
}

/// How many lock listings run at once: half the cores, at least one.
pub fn listing_permits() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// `?prefix=&limit=` of the key listing. Any other parameter (an `after=` for paging, a
/// typo) is refused with `bad_request` rather than ignored: this listing has no
/// continuation, and a caller paging with one would read the first page again and again.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    prefix: String,
    limit: Option<usize>,
}

impl ListQuery {
    /// The requested limit: 1,000 by default, 10,000 at most.
    fn limit(&self) -> usize {
        self.limit.unwrap_or(1000).min(10_000)
    }
}

/// Largest JSON body accepted by the lock routes.
const MAX_JSON_BODY: usize = 64 * 1024;

/// Builds the router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(health))
        .route("/v1/locks", get(locks::list))
        .route("/v1/locks/{lock}", get(locks::status))
        .route("/v1/locks/{lock}/acquire", post(locks::acquire))
        .route("/v1/leases/{lease_id}/keepalive", post(locks::keepalive))
        .route("/v1/leases/{lease_id}/release", post(locks::release))
        .route("/v1/leases/{lease_id}/proclaim", post(recipes::proclaim))
        .route("/v1/sessions", post(recipes::create_session))
        .route("/v1/sessions/{session_id}", get(recipes::session))
        .route(
            "/v1/sessions/{session_id}/keepalive",
            post(recipes::keepalive_session),
        )
        .route(
            "/v1/sessions/{session_id}/close",
            post(recipes::close_session),
        )
        .route("/v1/keys", get(tokens::keys))
        .route("/v1/tokens/check", post(tokens::check))
        .route("/v1/kv/{lock}", get(kv::list))
        .route(
            "/v1/kv/{lock}/{*key}",
            get(kv::get).put(kv::put).delete(kv::delete),
        )
        .route("/v1/fences", get(namespaces::list))
        .route("/v1/gates/report", post(gates::report))
        .route("/v1/gates/marks", get(gates::marks))
        .route("/v1/fences/{lock}", get(kv::high_water).post(kv::fence))
        .route("/v1/openapi.json", get(crate::openapi::document))
        .route("/v1/admin/keys", get(admin::list_keys))
        .route("/v1/admin/keys/rotate", post(admin::rotate_keys))
        .route("/v1/admin/keys/{key_id}/retire", post(admin::retire_key))
        .route("/v1/admin/backup", post(admin::backup))
        .route("/metrics", get(observe::metrics))
        .route("/v1/events", get(observe::all))
        .route("/v1/locks/{lock}/events", get(observe::lock))
        .fallback(not_found)
        // One middleware for everything a route needs around it (timing, identity, the
        // audit record, the unread body, JSON for 405): each layer axum adds costs every
        // request a boxed future and a copy of the service stack (`front`'s docs).
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            front::front,
        ))
        // After the layers: the dashboard's static files pass through none of them, and
        // the API's requests pay nothing for the dashboard.
        .merge(crate::ui::router().layer(axum::middleware::map_response(json_method_not_allowed)))
        .with_state(state)
}

async fn health(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    if state.backend.is_failed() {
        return ApiError::new(
            palisade_api::ErrorDetail::StorageFailed,
            "storage has failed; the server refuses writes",
        )
        .into_response();
    }
    if state.issuer.is_stopped() {
        return ApiError::new(
            palisade_api::ErrorDetail::StorageFailed,
            "the issuer stopped after an internal error; restart the server",
        )
        .into_response();
    }
    Json(palisade_api::wire::Health {
        status: "ok".into(),
    })
    .into_response()
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

/// The dashboard's router has none of the API's middleware ([`front`]), only its JSON 405.
async fn json_method_not_allowed(response: Response) -> Response {
    front::method_not_allowed_as_json(response)
}

/// A route's path parameters, extracted before the handler runs: a malformed one is
/// answered 400 `bad_request` (as [`path`] does, for a handler that reads it first).
pub struct PathParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        path(axum::extract::Path::from_request_parts(parts, state).await).map(PathParams)
    }
}

/// A route's query string, extracted like [`PathParams`] (400 `bad_request`, as
/// [`query_of`]).
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        query_of(axum::extract::Query::from_request_parts(parts, state).await).map(QueryParams)
    }
}

/// A request's body with its headers, read only when the handler asks: after its own
/// checks, so that a refusal (401, 403, a bad path) never depends on the body.
pub struct RequestBody {
    headers: HeaderMap,
    body: Body,
}

impl<S: Send + Sync> FromRequest<S> for RequestBody {
    type Rejection = std::convert::Infallible;

    async fn from_request(request: axum::extract::Request, _: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = request.into_parts();
        Ok(RequestBody {
            headers: parts.headers,
            body,
        })
    }
}

impl RequestBody {
    /// The body as JSON, at most [`MAX_JSON_BODY`] bytes.
    pub async fn json<T: DeserializeOwned>(self) -> Result<T, ApiError> {
        let bytes = read_body(&self.headers, self.body, MAX_JSON_BODY).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("bad JSON body: {e}")))
    }

    /// For the routes that take no parameters: an empty body or an empty JSON object.
    pub async fn empty(self) -> Result<(), ApiError> {
        let bytes = read_body(&self.headers, self.body, 1024).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes) {
            Ok(map) if map.is_empty() => Ok(()),
            _ => Err(ApiError::bad_request(
                "this route takes no parameters: send an empty body or {}",
            )),
        }
    }
}

/// Unpacks a path extraction, turning a rejection into `bad_request`.
fn path<T>(extracted: Result<axum::extract::Path<T>, PathRejection>) -> Result<T, ApiError> {
    extracted
        .map(|p| p.0)
        .map_err(|e| ApiError::bad_request(format!("bad path: {}", e.body_text())))
}

/// Unpacks a query extraction, turning a rejection into `bad_request`.
fn query_of<T>(extracted: Result<axum::extract::Query<T>, QueryRejection>) -> Result<T, ApiError> {
    extracted
        .map(|q| q.0)
        .map_err(|e| ApiError::bad_request(e.body_text()))
}

/// One of the permits of the listings running at once ([`AppState::listings`]). Hold it
/// until the answer is encoded: that is part of the work it bounds.
async fn listing_permit(state: &AppState) -> Result<tokio::sync::SemaphorePermit<'_>, ApiError> {
    state
        .listings
        .acquire()
        .await
        .map_err(|_| ApiError::shutting_down())
}

/// Checks a lock name from a path.
fn lock_name(name: &str) -> Result<(), ApiError> {
    validate_lock_name(name).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Reads a whole body, refusing more than `limit` bytes with `payload_too_large`.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::payload_too_large(limit));
    }
    match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => Ok(bytes),
        Err(e) => {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(err) = source {
                if err.is::<http_body_util::LengthLimitError>() {
                    return Err(ApiError::payload_too_large(limit));
                }
                source = err.source();
            }
            Err(ApiError::bad_request(format!(
                "cannot read request body: {e}"
            )))
        }
    }
}
