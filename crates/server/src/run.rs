//! Starting and stopping a server.

use std::net::SocketAddr;
use std::sync::Arc;

use palisade_core::lock_table::TableConfig;
use palisade_storage::redb_backend::{RedbBackend, RedbOptions};
use palisade_storage::{FencedStore, IssuerLog};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::api::{router, Shared};
use crate::audit::Audit;
use crate::auth::Auth;
use crate::config::{BackendConfig, ServerConfig};
use crate::keys::{self, KeyRegistry, KeyStore};
use crate::recovery;
use crate::transport::{BindError, Listener};
use palisade_issuer::Issuer;

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
    fn prepare(config: &ServerConfig) -> Result<Front, ServerError> {
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
    fn start(mut self, config: &ServerConfig) -> Result<Front, ServerError> {
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

/// Binds the port, claims the data directory ([`crate::data_dir`]), loads state and
/// starts serving.
///
/// Nothing is written anywhere before the port is bound and the directory is locked: a
/// start refused for its settings, its directory or a port in use leaves no trace.
pub async fn serve(config: ServerConfig) -> Result<RunningServer, ServerError> {
    if config.lock_delay_ms > config.limits.max_lock_delay_ms {
        return Err(ServerError::Config(format!(
            "--lock-delay-ms {} is above --max-lock-delay-ms {}: the default lock-delay must \
             be one an acquisition could choose",
            config.lock_delay_ms, config.limits.max_lock_delay_ms
        )));
    }
    let front = Front::prepare(&config)?;
    if let BackendConfig::Etcd { .. } = config.backend {
        #[cfg(feature = "etcd")]
        {
            let listener = bind(&config).await?;
            let front = front.start(&config)?;
            return crate::cluster::serve(config, front, listener).await;
        }
        #[cfg(not(feature = "etcd"))]
        return Err(ServerError::Config(
            "this palisade was built without the etcd backend; rebuild with `--features etcd`"
                .to_owned(),
        ));
    }
    let dir = &config.data_dir;
    let found = crate::data_dir::inspect(dir)?;
    let listener = bind(&config).await?;
    let claimed = crate::data_dir::DataDir::claim(dir, found)?;
    let front = front.start(&config)?;
    let trusted = keys::trusted_keys(&config.trust_key_files).map_err(ServerError::Key)?;
    // Before the database is opened (which creates it): only a directory without state
    // may get a new key.
    let fresh = !keys::has_database(dir);
    keys::refuse_keys_without_epochs(dir).map_err(ServerError::Key)?;
    let witness = config.witness.path(dir)?;
    // A first start that fails before its state is whole leaves the directory as it was.
    let first_start = fresh
        .then(|| crate::data_dir::FirstStart::begin(dir, witness.as_deref()))
        .transpose()?;
    recovery::check_before_open(dir).map_err(ServerError::Recovery)?;
    let db_path = dir.join(DB_FILE);
    let options = RedbOptions {
        cache_bytes: config.db_cache_bytes,
        limits: config.store_limits,
        commit_hook: palisade_storage::observe::CommitHook::new(front.observe.clone()),
        witness: witness.clone(),
        ..RedbOptions::default()
    };
    match &witness {
        Some(path) => {
            tracing::info!(witness = %path.display(), "witness outside the data directory")
        }
        None => tracing::warn!(
            "no witness (--no-witness): a data directory put back from an older copy will \
             serve, issue epochs a second time and admit tokens it had fenced out"
        ),
    }
    let redb = tokio::task::spawn_blocking(move || RedbBackend::open(&db_path, options))
        .await
        .map_err(|e| ServerError::Serve(std::io::Error::other(e)))?
        .map_err(|e| {
            if fresh {
                // Nothing to recover: what this start made is taken back (`FirstStart`).
                return ServerError::Recovery(format!(
                    "{e}. Nothing was served. This was the directory's first start: the files \
                     it made were removed, so fix the cause (free space on the volume, for \
                     one) and start again"
                ));
            }
            // Refused: damaged, older than its log, or not a Palisade database. Serving it
            // could lose acknowledged writes; say what recovers it.
            ServerError::Recovery(format!(
                "{e}. Nothing was served. If the database or its log was damaged or replaced, \
                 restore a backup with `palisade admin restore --data-dir {} --from <backup>` \
                 (docs/operations.md)",
                dir.display()
            ))
        })?;
    let found = redb.recovery();
    if let Some(floor) = found.raised_to {
        tracing::warn!(
            replayed = found.replayed,
            commit_seq = found.commit_seq,
            floor,
            "the log ended with a record recovery could not vouch for (torn by a crash, or \
             zeroed since by a bad sector or a lost write); it was dropped, and every lock's \
             epoch and every namespace's mark raised to {floor}: every token issued before is \
             refused, and every holder must release and acquire again (docs/guarantees.md)"
        );
    } else {
        tracing::info!(
            replayed = found.replayed,
            commit_seq = found.commit_seq,
            "database opened"
        );
    }
    let seed_file = config.signing_key_file.as_deref();
    let state = match recovery::check_and_refresh(dir, &redb).await {
        Ok(()) => keys::open_for_serving(dir, seed_file, fresh, keys::now_unix())
            .map_err(ServerError::Key),
        Err(e) => Err(ServerError::Recovery(e)),
    };
    let (key_set, origin) = match state {
        Ok(keys) => keys,
        Err(e) => {
            // Closed before anything of a failed first start is taken back.
            redb.close().await;
            return Err(e);
        }
    };
    log_key_origin(&key_set, origin, seed_file);
    if let Some(first_start) = first_start {
        first_start.complete();
    }
    let backend: Arc<dyn FencedStore> = Arc::new(redb.clone());
    let issuer_log: Arc<dyn IssuerLog> = Arc::new(redb.clone());
    let keys = KeyRegistry::new(
        key_set,
        0,
        trusted,
        KeyStore::Dir(dir.clone()),
        config.token_cache,
    );
    let issuer = Issuer::start(
        issuer_log,
        keys.signer(),
        TableConfig {
            lock_delay_ms: config.lock_delay_ms,
            idle_grace_ms: config.idle_grace_ms,
            max_locks: config.limits.max_locks,
            max_waiters_per_lock: config.limits.max_waiters_per_lock,
            max_sessions: config.limits.max_sessions,
            ..Default::default()
        },
    )
    .await?;
    log_recovery(&issuer.recovered());
    let mut state = front.state(&config, Arc::new(issuer), backend.clone(), keys);
    state.backup = Some(Arc::new(recovery::online::OnlineBackup::new(
        dir.clone(),
        redb.clone(),
    )));
    let data_dir = dir.clone();
    let ledger_refresh = recovery::spawn_ledger_refresh(data_dir.clone(), redb.clone());
    let stop_refresh = ledger_refresh.abort_handle();
    let on_stop = async move {
        // Let the writer answer what is queued and release the file.
        ledger_refresh.abort();
        recovery::refresh(&data_dir, &redb).await;
        backend.close().await;
        // The directory stays locked until the database is closed.
        drop(claimed);
    };
    let what = format!("embedded, data dir {}", dir.display());
    listen_and_serve(listener, state, what, on_stop)
        .await
        .inspect_err(|_| stop_refresh.abort())
}

/// The start-up summary of what the records made the issuer honour.
fn log_recovery(r: &palisade_issuer::embedded::Recovered) {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    tracing::info!(
        locks = r.locks,
        leases_honoured = r.leases,
        reservations_blocked = r.blocked_locks,
        blocked_for_ms = r.blocked_for_ms,
        blocked_until_unix_ms = now_ms.saturating_add(r.blocked_for_ms),
        max_epoch_ceiling = r.max_ceiling,
        epoch_floor = r.epoch_floor,
        "recovered: {} lease(s) honoured for a full TTL; {} lock(s) ungrantable for up to {} ms \
         (a lease granted before the stop may still be live); epochs continue above {}",
        r.leases,
        r.blocked_locks,
        r.blocked_for_ms,
        r.max_ceiling.max(r.epoch_floor)
    );
}

impl palisade_storage::observe::CommitObserver for crate::observe::Observe {
    fn committed(&self, report: palisade_storage::observe::CommitReport) {
        self.metrics.committed(report);
    }
}

/// Says where the key set came from when that is news, and warns when
/// `--signing-key-file` no longer names the key that signs.
fn log_key_origin(
    set: &palisade_token::KeySet,
    origin: keys::Origin,
    seed: Option<&std::path::Path>,
) {
    let active = &set.active().key_id;
    match origin {
        keys::Origin::Migrated => tracing::info!(
            key_id = %active,
            "{} became the key set {} (its key stays active)",
            keys::LEGACY_KEY_FILE,
            keys::KEY_SET_FILE
        ),
        keys::Origin::Seeded | keys::Origin::Created => {
            tracing::info!(key_id = %active, "new key set {}", keys::KEY_SET_FILE)
        }
        keys::Origin::Loaded => {}
    }
    if let Some(seed) = seed {
        match keys::load_secret(seed) {
            Ok(signer) if signer.key_id() == active => {}
            _ => tracing::warn!(
                file = %seed.display(),
                active = %active,
                "--signing-key-file is not the active key of the key set: it is read only to \
                 create a key set; the set's active key signs"
            ),
        }
    }
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
