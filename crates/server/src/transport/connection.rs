//! One connection's task: the TLS handshake (if any), hyper's HTTP/1.1 on the stream,
//! and the timeouts and orders of the [`Registry`](super::registry::Registry).
//!
//! The task is the only owner of the connection: closing it means returning, which drops
//! the socket. It returns when hyper is done, when the current phase's deadline passes
//! (header timeout for a head, idle timeout between requests; both without an answer),
//! when it is evicted or told to close, or, while stopping, as soon as no request is in
//! progress. A request the router has (`busy`) is never cut short by eviction or by the
//! start of a shutdown: hyper is told to finish it and then close; only the end of the
//! shutdown grace period closes it regardless.

use palisade_api::ErrorDetail;
use std::convert::Infallible;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{header, HeaderValue, Request, Response};
use axum::response::IntoResponse;
use axum::Router;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::io::TrackedIo;
use super::registry::{ConnSlot, Order, Registry};
use super::rerun::Rerun;
use super::tls::{client_cert, TlsFiles};
use super::{ClientCert, Limits};
use crate::error::ApiError;

/// What every connection task shares.
pub(crate) struct Shared {
    pub(crate) router: Router,
    pub(crate) registry: Arc<Registry>,
    pub(crate) limits: Arc<Limits>,
    pub(crate) http: hyper::server::conn::http1::Builder,
    pub(crate) tls: Option<Arc<TlsFiles>>,
    /// The RESP commands, when the server has a RESP listener.
    pub(crate) resp: Option<crate::resp::Service>,
}

/// What a connection speaks: which listener accepted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    Http,
    Resp,
}

/// Removes the connection from the registry however the task ends.
struct Leave<'a>(&'a Registry, &'a ConnSlot);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.remove(self.1);
    }
}

/// Serves one accepted connection until it closes.
pub(crate) async fn run(
    shared: Arc<Shared>,
    tcp: TcpStream,
    slot: Arc<ConnSlot>,
    protocol: Protocol,
) {
    let _leave = Leave(&shared.registry, &slot);
    // Requests and answers are small; do not let Nagle hold a segment back.
    let _ = tcp.set_nodelay(true);
    let Some(tls) = &shared.tls else {
        return serve(&shared, tcp, &slot, None, protocol).await;
    };
    let clock = shared.registry.clock;
    let deadline = clock.instant(
        slot.since
            .load(Relaxed)
            .saturating_add(shared.limits.header_ms),
    );
    let handshake = tokio::select! {
        result = tls.acceptor().accept(tcp) => result,
        _ = tokio::time::sleep_until(deadline) => {
            tracing::debug!("TLS handshake not completed within the header timeout");
            return;
        }
        _ = ordered(&slot) => return,
    };
    match handshake {
        Ok(stream) => {
            let cert = client_cert(stream.get_ref().1);
            serve(&shared, stream, &slot, cert, protocol).await;
        }
        Err(e) => tracing::debug!(error = %e, "TLS handshake failed"),
    }
}

/// Serves the connection in its protocol.
async fn serve<S>(
    shared: &Shared,
    stream: S,
    slot: &Arc<ConnSlot>,
    cert: Option<ClientCert>,
    protocol: Protocol,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match protocol {
        Protocol::Http => serve_http(shared, stream, slot, cert).await,
        Protocol::Resp => super::resp::serve(shared, stream, slot, cert).await,
    }
}

/// Waits for any order (used before HTTP starts, where every order means close).
async fn ordered(slot: &ConnSlot) {
    while slot.order() == Order::None {
        slot.wake.notified().await;
    }
}

async fn serve_http<S>(shared: &Shared, stream: S, slot: &Arc<ConnSlot>, cert: Option<ClientCert>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let clock = shared.registry.clock;
    let limits = &shared.limits;
    let io = TrackedIo::new(stream, slot.clone(), clock, limits.clone());
    let service = ConnService {
        router: shared.router.clone(),
        slot: slot.clone(),
        cert,
        max_uri_bytes: limits.max_uri_bytes,
    };
    // Its body channel wakes the task while it is polled: polled again at once instead
    // (`rerun.rs`).
    let mut conn = Rerun::new(Box::pin(
        shared.http.serve_connection(TokioIo::new(io), service),
    ));
    let mut closing = false;
    // Wakes at the phase's deadline, and at least every header timeout: a head that
    // begins later than now cannot have an earlier deadline than now + header timeout.
    let next_check = |now: u64| {
        let deadline = slot.deadline_ms(limits.header_ms, limits.idle_ms);
        deadline
            .unwrap_or(u64::MAX)
            .min(now.saturating_add(limits.header_ms))
    };
    let mut timer = pin!(tokio::time::sleep_until(
        clock.instant(next_check(clock.now_ms()))
    ));
    loop {
        tokio::select! {
            biased;
            result = &mut conn => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = slot.wake.notified() => match slot.order() {
                Order::None => {}
                Order::Close => return,
                Order::Evict | Order::Drain => {
                    if !slot.is_busy() {
                        return;
                    }
                    if !closing {
                        // Finish the response in progress, then close.
                        conn.inner_mut().as_mut().graceful_shutdown();
                        closing = true;
                    }
                }
            },
            _ = &mut timer => {
                let now = clock.now_ms();
                if slot.deadline_ms(limits.header_ms, limits.idle_ms).is_some_and(|d| d <= now) {
                    tracing::debug!(
                        reading = slot.reading.load(Relaxed),
                        "closing a connection: header or idle timeout"
                    );
                    return;
                }
                timer.as_mut().reset(clock.instant(next_check(now)));
            }
        }
    }
}

/// The router, as hyper calls it on one connection.
struct ConnService {
    router: Router,
    slot: Arc<ConnSlot>,
    cert: Option<ClientCert>,
    max_uri_bytes: usize,
}

type ServiceFuture =
    Pin<Box<dyn Future<Output = Result<Response<TrackedBody>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = ServiceFuture;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        self.slot.started.fetch_add(1, Relaxed);
        let done = Finished(self.slot.clone());
        if self.slot.order() == Order::Evict {
            // Closed to make room (the cap was full): a request that arrives now is not
            // served, or it would hold a place the cap no longer counts on. The client
            // can send it again on a new connection; nothing was done.
            let mut answer = ApiError::new(
                ErrorDetail::Unavailable,
                "the server closed this connection to make room for another (its connection \
                 cap is reached); nothing was done: send the request again on a new connection",
            )
            .into_response();
            answer
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return Box::pin(std::future::ready(Ok(TrackedBody::wrap(answer, done))));
        }
        let target = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
        if target > self.max_uri_bytes {
            let answer = ApiError::new(
                ErrorDetail::UriTooLong,
                format!("the request target exceeds {} bytes", self.max_uri_bytes),
            )
            .into_response();
            return Box::pin(std::future::ready(Ok(TrackedBody::wrap(answer, done))));
        }
        if let Some(cert) = &self.cert {
            req.extensions_mut().insert(cert.clone());
        }
        let routed = tower_service::Service::call(&mut self.router.clone(), req);
        Box::pin(async move {
            let response = routed.await?;
            Ok(TrackedBody::wrap(response, done))
        })
    }
}

/// Counts a response as finished when hyper drops its body (after writing it into its
/// buffer), or when the request is abandoned.
struct Finished(Arc<ConnSlot>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Relaxed);
    }
}

/// A response body that reports its end to the connection's slot.
pub(crate) struct TrackedBody {
    inner: Body,
    _done: Finished,
}

impl TrackedBody {
    fn wrap(response: Response<Body>, done: Finished) -> Response<TrackedBody> {
        response.map(|inner| TrackedBody { inner, _done: done })
    }
}

impl hyper::body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
