//! What every start-up shares, whichever the backend: the errors, the front (auth, audit,
//! observers, checked before anything is bound), binding the listeners, serving until a
//! signal, and the running server's handle. `start.rs` picks the backend;
//! `embedded.rs` and `cluster.rs` start it.

use std::net::SocketAddr;
use std::sync::Arc;

use palisade_storage::FencedStore;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::{router, Shared};
use crate::audit::Audit;
use crate::auth::Auth;
use crate::config::ServerConfig;
use crate::keys::KeyRegistry;
use crate::transport::{BindError, Listener};

pub use palisade_datadir::DB_FILE;

/// Why a server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The data directory is refused, in use by another server, or cannot be created.
    #[error(transparent)]
    DataDir(#[from] crate::data_dir::DataDirError),
    #[error("{0}")]
    Key(String),
    /// A combination of settings this build or backend cannot run.
    #[error("{0}")]
    Config(String),
    /// The data directory's database is missing or behind its epoch ledger.
    #[error("{0}")]
    Recovery(String),
    #[error(transparent)]
    Storage(#[from] palisade_storage::StorageError),
    #[error("cannot listen on {addr}: {}", listen_reason(source))]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("server failed: {0}")]
    Serve(std::io::Error),
    /// The TLS certificate, key or client CA could not be loaded.
    #[error(transparent)]
    Tls(#[from] crate::transport::TlsError),
}

/// A server running in this process.
pub struct RunningServer {
    addr: SocketAddr,
    scheme: &'static str,
    resp_addr: Option<SocketAddr>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    /// The address actually bound (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL clients use: `http://ADDR`, or `https://ADDR` with TLS.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// The RESP listener's URL (`redis://ADDR`, `rediss://ADDR` with TLS), if it has one.
    pub fn resp_url(&self) -> Option<String> {
        let scheme = if self.scheme == "https" {
            "rediss"
        } else {
            "redis"
        };
        self.resp_addr.map(|addr| format!("{scheme}://{addr}"))
    }

    /// Stops accepting connections, closes idle ones, answers queued acquisitions with
    /// 503 (the embedded issuer; see [`palisade_issuer::LockService::close`]), lets
    /// requests in flight finish within the shutdown grace and waits.
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.wait().await
    }

    /// Waits until the server stops.
    pub async fn wait(self) -> Result<(), ServerError> {
        match self.task.await {
            Ok(result) => result,
            Err(e) => Err(ServerError::Serve(std::io::Error::other(e))),
        }
    }

    /// Runs until SIGINT or SIGTERM, then shuts down gracefully.
    pub async fn run_until_signal(self) -> Result<(), ServerError> {
        shutdown_signal().await;
        tracing::info!("shutting down");
        self.shutdown().await
    }
}

/// Who may call, and the audit log: the parts of [`Shared`] every backend shares.
pub(crate) struct Front {
    pub auth: Option<Arc<Auth>>,
    pub audit: Audit,
    /// Metrics, events and the rejection log (the storage hook and the issuer report to it).
    pub observe: Arc<crate::observe::Observe>,
}

impl Front {
    /// Checks the listen addresses against the auth settings and loads the auth file.
    /// Runs before anything is written: a refused start leaves no trace.
    pub(crate) fn prepare(config: &ServerConfig) -> Result<Front, ServerError> {
        let auth = match &config.auth_file {
            Some(path) => Some(Arc::new(Auth::load(path).map_err(ServerError::Config)?)),
            None => None,
        };
        // A host name counts as loopback only if every address it resolved to is one.
        let exposed = std::iter::once(&config.listen)
            .chain(&config.listen_resolved)
            .chain(&config.resp_listen)
            .find(|addr| !addr.ip().is_loopback());
        if let (None, Some(exposed)) = (&auth, exposed) {
            if !config.insecure_no_auth {
                return Err(ServerError::Config(format!(
                    "refusing to listen on {exposed} without authentication: anyone who can \
                     reach it could release any lease and read every value. Give --auth-file \
                     FILE (docs/security.md), listen on a loopback address, or accept the \
                     risk with --insecure-no-auth"
                )));
            }
            tracing::warn!(
                listen = %exposed,
                "serving WITHOUT authentication on a non-loopback address (--insecure-no-auth): \
                 anyone who can reach this port can acquire and release any lock and read \
                 every value"
            );
        }
        Ok(Front {
            auth,
            audit: Audit::off(),
            observe: crate::observe::Observe::new(
                config.events_buffer,
                config.max_event_subscribers,
            ),
        })
    }

    /// Opens the audit log (a write, so after the port is bound and the data directory
    /// claimed) and starts reloading the auth file on SIGHUP.
    pub(crate) fn start(mut self, config: &ServerConfig) -> Result<Front, ServerError> {
        if let Some(path) = &config.audit_log {
            self.audit =
                Audit::open(path, config.audit_log_max_bytes).map_err(ServerError::Config)?;
        }
        if let Some(auth) = &self.auth {
            reload_on_sighup(Arc::downgrade(auth));
        }
        Ok(self)
    }

    pub(crate) fn state(
        self,
        config: &ServerConfig,
        issuer: Arc<dyn palisade_issuer::LockService>,
        backend: Arc<dyn FencedStore>,
        keys: Arc<KeyRegistry>,
    ) -> Shared {
        issuer.observe(self.observe.clone());
        Shared {
            policies: Arc::new(config.policies.clone()),
            max_value_bytes: config.max_value_bytes,
            auth: self.auth,
            audit: self.audit,
            limits: config.limits,
            observe: self.observe,
            ..Shared::new(issuer, backend, keys)
        }
    }
}

/// Reads the auth file again on every SIGHUP; a file that does not check out is logged and
/// the one in use stays.
fn reload_on_sighup(auth: std::sync::Weak<Auth>) {
    #[cfg(unix)]
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot watch SIGHUP: the auth file is read only at start");
            return;
        };
        while hangups.recv().await.is_some() {
            let Some(auth) = auth.upgrade() else { return };
            match auth.reload() {
                Ok(n) => {
                    tracing::info!(file = %auth.path().display(), principals = n, "auth file reloaded")
                }
                Err(e) => {
                    tracing::error!(error = %e, "auth file NOT reloaded; the previous one stays in use")
                }
            }
        }
    });
    #[cfg(not(unix))]
    let _ = auth;
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Binds the listening sockets (and loads TLS), the first thing a start does that the
/// outside world can see.
pub(crate) async fn bind(config: &ServerConfig) -> Result<Listener, ServerError> {
    let failed = |e| match e {
        BindError::Config(message) => ServerError::Config(message),
        BindError::Tls(e) => ServerError::Tls(e),
        BindError::Listen { addr, source } => ServerError::Listen { addr, source },
    };
    let mut listener = Listener::bind(config.listen, config.transport.clone())
        .await
        .map_err(failed)?;
    if let Some(addr) = config.resp_listen {
        listener.bind_resp(addr).await.map_err(failed)?;
    }
    Ok(listener)
}

/// Why a bind failed, in words that say what to do for the common cases.
fn listen_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            "the port is already in use (another palisade, or another program): stop it or \
             pick another port"
                .to_owned()
        }
        std::io::ErrorKind::AddrNotAvailable => {
            "no network interface of this machine has that address".to_owned()
        }
        std::io::ErrorKind::PermissionDenied => {
            "permission denied (ports below 1024 need privileges)".to_owned()
        }
        _ => e.to_string(),
    }
}

/// Serves `state` on `listener` until shut down, then runs `on_stop` (for backends with
/// something to flush or release). At shutdown the issuer is closed first, so that queued
/// acquisitions are answered rather than waited for.
pub(crate) async fn listen_and_serve(
    listener: Listener,
    state: Shared,
    what: String,
    on_stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<RunningServer, ServerError> {
    let mut listener = listener;
    let addr = listener.local_addr();
    let scheme = listener.scheme();
    let resp_addr = listener.resp_addr();
    let (tx, rx) = oneshot::channel::<()>();
    let issuer = state.issuer.clone();
    let observe = state.observe.clone();
    let auth = state.auth.is_some();
    let state = crate::api::AppState::from(state);
    if resp_addr.is_some() {
        listener.serve_resp_with(state.clone());
    }
    let app = router(state);
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = rx.await;
        };
        let closing = async move {
            // Open event streams end now, so that they do not hold the shutdown up.
            observe.events.close();
            issuer.close().await
        };
        listener.serve(app, shutdown, closing).await;
        on_stop.await;
        tracing::info!("palisade stopped");
        Ok(())
    });
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        listen = %format!("{scheme}://{addr}"),
        backend = %what,
        auth = if auth { "on" } else { "off" },
        tls = if scheme == "https" { "on" } else { "off" },
        "palisade {} serving on {scheme}://{addr} ({what}; authentication {}; TLS {})",
        env!("CARGO_PKG_VERSION"),
        if auth { "on" } else { "off" },
        if scheme == "https" { "on" } else { "off" },
    );
    if let Some(resp) = resp_addr {
        tracing::info!(listen = %resp, "serving the hot routes over RESP on {resp}");
    }
    Ok(RunningServer {
        addr,
        scheme,
        resp_addr,
        shutdown: Some(tx),
        task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(listen: &str, resolved: &[&str]) -> ServerConfig {
        let mut config = ServerConfig::new(listen.parse().unwrap(), "unused".into());
        config.listen_resolved = resolved.iter().map(|a| a.parse().unwrap()).collect();
        config
    }

    /// A host name is loopback only if every address it resolved to is: one public
    /// address among them refuses a start without authentication, naming that address.
    #[test]
    fn every_resolved_address_must_be_loopback_without_auth() {
        let name = config("127.0.0.1:7700", &["127.0.0.1:7700", "[::1]:7700"]);
        assert!(Front::prepare(&name).is_ok());
        let mixed = config("127.0.0.1:7700", &["127.0.0.1:7700", "192.0.2.7:7700"]);
        match Front::prepare(&mixed) {
            Err(ServerError::Config(message)) => {
                assert!(message.contains("192.0.2.7:7700"), "{message}")
            }
            other => panic!("expected a refusal, got {:?}", other.err()),
        }
        let mut allowed = mixed;
        allowed.insecure_no_auth = true;
        assert!(Front::prepare(&allowed).is_ok());
    }

    /// The RESP listener's address is held to the same rule as the HTTP one.
    #[test]
    fn a_public_resp_address_needs_auth_too() {
        let mut resp = config("127.0.0.1:7700", &[]);
        resp.resp_listen = Some("127.0.0.1:7701".parse().unwrap());
        assert!(Front::prepare(&resp).is_ok());
        resp.resp_listen = Some("192.0.2.7:7701".parse().unwrap());
        match Front::prepare(&resp) {
            Err(ServerError::Config(message)) => {
                assert!(message.contains("192.0.2.7:7701"), "{message}")
            }
            other => panic!("expected a refusal, got {:?}", other.err()),
        }
    }
}
