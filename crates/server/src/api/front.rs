//! The one middleware in front of every API route: everything a request needs around its
//! handler, in one step.
//!
//! In order, around the route:
//! 1. **timing** ([`Timing`]): under the route's template, with the access log line;
//! 2. **the unread body** ([`BodyWatch`]): a request answered before its body was read
//!    gets `Connection: close`;
//! 3. **identity** ([`crate::auth::authenticate`]): the caller, or 401 and nothing runs;
//!    then the audit record the handler left in its response;
//! 4. **JSON for 405**: axum's empty 405 for a known path with another method becomes the
//!    same error shape as every other answer.
//!
//! Why one middleware rather than one layer each: axum wraps every route in each layer,
//! and each layer costs every request a copy of the service stack beneath it and a boxed
//! future of its own. With four layers that was about a fifth of the instructions of a
//! read answered from memory (`bench/budget`, job `read`; `bench/analysis.md`).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use super::observe::Timing;
use super::{ApiError, AppState};

/// The middleware (`axum::middleware::from_fn_with_state`).
pub async fn front(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let timing = Timing::start(&req);
    let (mut req, watch) = BodyWatch::wrap(req);
    let mut response =
        match crate::auth::authenticate(state.auth.as_deref(), &state.audit, &mut req) {
            Ok(admitted) => {
                let mut response = method_not_allowed_as_json(next.run(req).await);
                admitted.finish(&state.audit, &mut response);
                response
            }
            Err(refused) => refused.into_response(),
        };
    if let Some(watch) = watch {
        watch.finish(&mut response);
    }
    timing.finish(&state, &response);
    response
}

/// axum answers a known path with an unsupported method with an empty 405; this gives it
/// the same JSON error shape as everything else.
pub(super) fn method_not_allowed_as_json(response: Response) -> Response {
    if response.status() == StatusCode::METHOD_NOT_ALLOWED {
        return ApiError::method_not_allowed().into_response();
    }
    response
}

/// A request refused before its body was read (no token, no permission, a bad header)
/// leaves the unread body on the connection, and the connection cannot carry another
/// request: the answer says so with `Connection: close`, so that clients do not send
/// their next request into a socket about to close. A request without a body needs no
/// watch.
struct BodyWatch {
    finished: Arc<AtomicBool>,
}

impl BodyWatch {
    fn wrap(req: Request) -> (Request, Option<BodyWatch>) {
        let headers = req.headers();
        let has_body = headers.contains_key(header::TRANSFER_ENCODING)
            || headers
                .get(header::CONTENT_LENGTH)
                .is_some_and(|v| v.as_bytes() != b"0");
        if !has_body {
            return (req, None);
        }
        let finished = Arc::new(AtomicBool::new(false));
        let (parts, body) = req.into_parts();
        let body = Body::new(Tracked {
            inner: body,
            finished: finished.clone(),
        });
        (
            Request::from_parts(parts, body),
            Some(BodyWatch { finished }),
        )
    }

    fn finish(self, response: &mut Response) {
        if !self.finished.load(Relaxed) {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
}

/// A request body that records when it has been read to its end.
struct Tracked {
    inner: Body,
    finished: Arc<AtomicBool>,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        if let std::task::Poll::Ready(None) = polled {
            this.finished.store(true, Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
