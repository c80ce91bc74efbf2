//! # Transport: accepting connections and serving HTTP/1.1 on them
//!
//! Everything between the listening socket and the router: the accept loop, TLS,
//! and hyper's HTTP/1.1 on each connection, with the limits that keep what an outsider
//! can hold of the server bounded. The router ([`crate::api`]) sees only complete,
//! parsed requests.
//!
//! ## Limits (and why each exists)
//! - **Header timeout** ([`TransportConfig::header_timeout`], default 10 s): a request
//!   head (request line and headers) must arrive in full within it, counted from its
//!   first byte, or for a new connection from the accept (the TLS handshake included).
//!   Otherwise the connection is closed without an answer. This is what stops slowloris:
//!   a client trickling a head holds a connection for at most this long.
//! - **Idle timeout** ([`TransportConfig::idle_timeout`], default 60 s): a keep-alive
//!   connection with no request in progress is closed after it.
//! - **Header size** ([`TransportConfig::max_header_bytes`], default 16 KiB, and at most
//!   [`MAX_HEADERS`] fields): a larger head is refused with 431 `headers_too_large`.
//!   It is also hyper's read buffer, so it bounds what a connection that has not sent a
//!   complete head can make the server hold. A request target over [`MAX_URI_BYTES`]
//!   answers 414 `uri_too_long`.
//! - **Connection cap** ([`TransportConfig::max_connections`], default 4096): when it is
//!   reached, a new connection closes the connection that has been idle or reading its
//!   head for longest, as nginx reuses idle keep-alive connections, so slow clients cannot
//!   keep a prompt one out. Only connections with a request in progress are never
//!   evicted; while all of them are, new connections wait in the listen backlog. An
//!   evicted connection counts until it has closed, and refuses (503) a request that
//!   reaches it after the eviction: the cap bounds the connections served, whatever
//!   races a burst of clients makes.
//! - **Accept errors** are logged (at most once a second); running out of file
//!   descriptors pauses accepting for 100 ms instead of spinning.
//! - **Shutdown**: stops accepting, closes every connection with no request in progress
//!   at once, lets requests in progress finish within [`TransportConfig::shutdown_grace`]
//!   (default 3 s), then closes the rest.
//!
//! Errors that hyper answers itself, below the router (malformed request line or
//! headers, head too large), get the same JSON error body as every other error
//! (`io.rs` explains how).
//!
//! ## What it does not do
//! - No HTTP/2 and no upgrades: HTTP/1.1 only, with or without TLS.
//! - No limit on how slowly a request *body* arrives once its head is complete: such a
//!   request counts as in progress (the handler is reading it) and is not evicted. The
//!   body size limits of the routes bound its memory, not its time.
//! - A closed connection gets no answer for a head it did not complete (as nginx, which
//!   closes on its client header timeout).

mod connection;
mod io;
mod registry;
mod rerun;
mod resp;
mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::time::Instant;

pub use tls::{TlsConfig, TlsError};

use connection::{Protocol, Shared};
use registry::{Order, Registry};
use tls::TlsFiles;

/// Default of [`TransportConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default of [`TransportConfig::header_timeout`], in milliseconds.
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;
/// Default of [`TransportConfig::idle_timeout`], in milliseconds.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
/// Default of [`TransportConfig::max_header_bytes`].
pub const DEFAULT_MAX_HEADER_BYTES: usize = 16 * 1024;
/// Smallest accepted [`TransportConfig::max_header_bytes`] (hyper's smallest read buffer).
pub const MIN_HEADER_BYTES: usize = 8 * 1024;
/// Default of [`TransportConfig::shutdown_grace`], in milliseconds.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 3_000;
/// Most header fields in one request: hyper's default, whose parser keeps them on the
/// stack (any other value costs a heap allocation per request).
pub const MAX_HEADERS: usize = 100;
/// Longest request target (path and query) accepted; longer ones answer 414.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// How connections are accepted and served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportConfig {
    /// Most connections open at once (see the module docs for what happens at the cap).
    pub max_connections: usize,
    /// Longest time for a complete request head (and, for a new connection, the TLS
    /// handshake).
    pub header_timeout: Duration,
    /// Longest time a connection may stay open with no request in progress.
    pub idle_timeout: Duration,
    /// Largest request head (request line and headers) in bytes, at least
    /// [`MIN_HEADER_BYTES`].
    pub max_header_bytes: usize,
    /// How long requests in progress may take to finish once shutdown begins.
    pub shutdown_grace: Duration,
    /// Serve HTTPS with these files; plain HTTP when `None`.
    pub tls: Option<TlsConfig>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_timeout: Duration::from_millis(DEFAULT_HEADER_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(DEFAULT_IDLE_TIMEOUT_MS),
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            shutdown_grace: Duration::from_millis(DEFAULT_SHUTDOWN_GRACE_MS),
            tls: None,
        }
    }
}

pub use crate::auth::ClientCert;

/// The limits in the units the connection tasks use.
#[derive(Debug)]
pub(crate) struct Limits {
    header_ms: u64,
    idle_ms: u64,
    max_header_bytes: usize,
    max_uri_bytes: usize,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A bound listening socket, ready to serve.
pub struct Listener {
    tcp: TcpListener,
    addr: SocketAddr,
    config: TransportConfig,
    tls: Option<Arc<TlsFiles>>,
    /// The RESP listener ([`crate::resp`]), if one was bound.
    resp: Option<(TcpListener, SocketAddr)>,
    /// What its connections run, given before serving.
    resp_state: Option<crate::api::AppState>,
}

impl Listener {
    /// Loads the TLS files (if any) and binds `addr`.
    pub async fn bind(addr: SocketAddr, config: TransportConfig) -> Result<Listener, BindError> {
        if config.max_header_bytes < MIN_HEADER_BYTES {
            return Err(BindError::Config(format!(
                "the header limit must be at least {MIN_HEADER_BYTES} bytes"
            )));
        }
        let tls = match &config.tls {
            Some(files) => Some(Arc::new(TlsFiles::load(files.clone())?)),
            None => None,
        };
        raise_open_files_limit(config.max_connections);
        let tcp = TcpListener::bind(addr)
            .await
            .map_err(|source| BindError::Listen { addr, source })?;
        let addr = tcp
            .local_addr()
            .map_err(|source| BindError::Listen { addr, source })?;
        Ok(Listener {
            tcp,
            addr,
            config,
            tls,
            resp: None,
            resp_state: None,
        })
    }

    /// Binds a RESP listener on `addr` beside the HTTP one: same limits, same TLS, one
    /// connection cap for both.
    pub async fn bind_resp(&mut self, addr: SocketAddr) -> Result<SocketAddr, BindError> {
        let tcp = TcpListener::bind(addr)
            .await
            .map_err(|source| BindError::Listen { addr, source })?;
        let bound = tcp
            .local_addr()
            .map_err(|source| BindError::Listen { addr, source })?;
        self.resp = Some((tcp, bound));
        Ok(bound)
    }

    /// The RESP listener's address, if there is one.
    pub fn resp_addr(&self) -> Option<SocketAddr> {
        self.resp.as_ref().map(|(_, addr)| *addr)
    }

    /// What the RESP connections run (the state the router was built from). Without it
    /// a bound RESP listener closes every connection it accepts.
    pub fn serve_resp_with(&mut self, state: crate::api::AppState) {
        self.resp_state = Some(state);
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https` with TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// Serves `router` until `shutdown` completes, then stops: `on_stopping` runs as soon
    /// as new connections are refused (to answer requests that would otherwise wait, such
    /// as queued acquisitions), and this returns once every connection is closed, at most
    /// the grace period later.
    pub async fn serve(
        self,
        router: Router,
        shutdown: impl Future<Output = ()>,
        on_stopping: impl Future<Output = ()>,
    ) {
        let config = &self.config;
        let registry = Arc::new(Registry::new(config.max_connections));
        let mut http = hyper::server::conn::http1::Builder::new();
        http.max_buf_size(config.max_header_bytes)
            .max_header_size(config.max_header_bytes)
            // The header and idle timeouts are the connection task's (connection.rs).
            .header_read_timeout(None);
        let shared = Arc::new(Shared {
            router,
            registry: registry.clone(),
            limits: Arc::new(Limits {
                header_ms: millis(config.header_timeout),
                idle_ms: millis(config.idle_timeout),
                max_header_bytes: config.max_header_bytes,
                max_uri_bytes: MAX_URI_BYTES,
            }),
            http,
            tls: self.tls.clone(),
            resp: self.resp_state.map(crate::resp::Service::new),
        });
        let resp = self.resp.as_ref().map(|(tcp, _)| tcp);
        accept_loop(&self.tcp, resp, &shared, shutdown).await;
        drop(self.tcp);
        drop(self.resp);
        registry.order_all(Order::Drain);
        on_stopping.await;
        let grace_end = Instant::now() + config.shutdown_grace;
        if !all_closed(&registry, grace_end).await {
            tracing::warn!(
                open = registry.len(),
                "closing connections whose requests did not finish within the shutdown grace"
            );
            registry.order_all(Order::Close);
            all_closed(&registry, Instant::now() + Duration::from_secs(1)).await;
        }
    }
}

/// Waits until no connection is open, or `until`; true if none is.
async fn all_closed(registry: &Registry, until: Instant) -> bool {
    loop {
        let left = registry.left.notified();
        if registry.len() == 0 {
            return true;
        }
        tokio::select! {
            _ = left => {}
            _ = tokio::time::sleep_until(until) => return registry.len() == 0,
        }
    }
}

async fn accept_loop(
    tcp: &TcpListener,
    resp: Option<&TcpListener>,
    shared: &Arc<Shared>,
    shutdown: impl Future<Output = ()>,
) {
    let registry = &shared.registry;
    let mut shutdown = pin!(shutdown);
    let mut hangups = Hangups::new();
    let mut last_warning: Option<Instant> = None;
    let mut times: u64 = 0;
    let mut warn = |message: &str, error: Option<&std::io::Error>| {
        // At most one line a second: a flood of failures must not become a flood of logs.
        // `times` says how often it happened since the previous line.
        times += 1;
        if last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            last_warning = Some(Instant::now());
            let open = registry.len();
            match error {
                Some(e) => tracing::warn!(error = %e, times, open, "{message}"),
                None => tracing::warn!(times, open, "{message}"),
            }
            times = 0;
        }
    };
    loop {
        if !registry.can_admit() {
            warn(
                "connection cap reached and every connection has a request in progress; \
                 new connections wait",
                None,
            );
            tokio::select! {
                _ = &mut shutdown => return,
                _ = registry.left.notified() => {}
                // Connections also become evictable by finishing a request.
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            continue;
        }
        let accepted = tokio::select! {
            biased;
            _ = &mut shutdown => return,
            _ = hangups.recv() => {
                reload_tls(shared);
                continue;
            }
            accepted = tcp.accept() => (accepted, Protocol::Http),
            accepted = accept(resp) => (accepted, Protocol::Resp),
        };
        match accepted {
            (Ok((stream, _peer)), protocol) => {
                // Every place became busy since the check: this connection waits, unread,
                // and nothing more is accepted, until one frees.
                let slot = loop {
                    if let Some(slot) = registry.try_admit() {
                        break slot;
                    }
                    tokio::select! {
                        _ = &mut shutdown => return,
                        _ = registry.left.notified() => {}
                        _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                    }
                };
                tokio::spawn(connection::run(shared.clone(), stream, slot, protocol));
            }
            (Err(e), _) if out_of_descriptors(&e) => {
                warn(
                    "cannot accept connections: out of file descriptors; pausing 100 ms",
                    Some(&e),
                );
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
            // A failure of that one connection (e.g. reset before it was accepted).
            (Err(e), _) => warn("accept failed", Some(&e)),
        }
    }
}

/// The next connection of the RESP listener; never, without one.
async fn accept(
    listener: Option<&TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

fn reload_tls(shared: &Shared) {
    let Some(tls) = &shared.tls else {
        tracing::info!("SIGHUP: no TLS configured, nothing to reload");
        return;
    };
    match tls.reload() {
        Ok(()) => tracing::info!("SIGHUP: TLS certificate reloaded; new connections use it"),
        Err(e) => {
            tracing::error!(error = %e, "SIGHUP: TLS reload failed; keeping the certificate in use")
        }
    }
}

fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// SIGHUP, where there is such a thing.
struct Hangups {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    fn new() -> Self {
        #[cfg(unix)]
        {
            let kind = tokio::signal::unix::SignalKind::hangup();
            let signal = tokio::signal::unix::signal(kind)
                .inspect_err(|e| tracing::warn!(error = %e, "cannot listen for SIGHUP"))
                .ok();
            Hangups { signal }
        }
        #[cfg(not(unix))]
        Hangups {}
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some(signal) = &mut self.signal {
            if signal.recv().await.is_some() {
                return;
            }
        }
        std::future::pending::<()>().await
    }
}

/// Raises the soft limit on open files towards the hard limit, so that the connection cap
/// is reached before the descriptor limit; warns if the hard limit is too low for it.
fn raise_open_files_limit(max_connections: usize) {
    #[cfg(unix)]
    {
        // Room for the database, logs, and connections being accepted or closed.
        let wanted = (max_connections as libc::rlim_t).saturating_add(256);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return;
            }
            if limit.rlim_cur < wanted {
                let raised = libc::rlimit {
                    rlim_cur: limit.rlim_max.min(wanted),
                    rlim_max: limit.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    limit = raised;
                }
            }
        }
        if limit.rlim_cur < wanted {
            tracing::warn!(
                open_files = limit.rlim_cur,
                max_connections,
                "the open-files limit is below the connection cap; raise it (ulimit -n) or \
                 lower --max-connections"
            );
        }
    }
}

/// Why a listener could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests;
