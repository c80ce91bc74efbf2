//! [`GateDeployment`]: the gate targets. Locks from a real Palisade server, the data in a
//! real database written through a Rust gate, and faults on the database itself.
//!
//! - locks: an [`EmbeddedServer`] (`kill` crashes and restarts it, as for Palisade);
//! - the database, started by the harness in a [`DbProcess`]: PostgreSQL
//!   ([`pg_server`]), Redis ([`redis_server`]), or for SQLite the application process
//!   that holds the file ([`app_process`]); `db-kill` SIGKILLs every process of it and
//!   restarts it on its files, `db-pause` SIGSTOPs them, then SIGCONT;
//! - for `db-failover` (PostgreSQL, Redis), a replica beside the database ([`Standby`]):
//!   for PostgreSQL a streaming standby, synchronous with safe settings and asynchronous
//!   for `--unsafe-db`; for Redis a replica the gate waits for after every call (`WAIT`),
//!   or for `--unsafe-db` does not; the fault cuts it off, kills the primary and promotes
//!   it;
//! - a [`Proxy`] between the application and the database (for SQLite, between the
//!   workers and the process holding the file): `db-drop` cuts every open connection,
//!   `db-delay` holds what goes through for a while;
//! - the application between them: a [`GateStore`] over the database's [`GatedDb`]
//!   ([`PgStore`], [`RedisStore`], [`super::sqlite_store::SqliteStore`]), verifying tokens
//!   with the keys the lock server lists (`GET /v1/keys`, [`palisade_client::IssuerKeys`]).
//!
//! With the settings the gate's preflight insists on, a run must come out clean. With
//! `--unsafe-db` the database runs with one setting the preflight refuses (its words go
//! in the report): a `db-kill` then loses acknowledged writes, marks included, and the
//! checkers must find it (a negative control).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use palisade_client::{Client, IssuerKeys};

use super::app_process::{self, AppProcess, PythonDb};
use super::db_process::{Database, DbProcess, Durability, Replication};
use super::gate_store::{preflight_refused, GateStore, GatedDb};
use super::pg_server;
use super::pg_store::PgStore;
use super::redis_server;
use super::redis_store::RedisStore;
use super::sqlite_store::Synchronous;
use super::{Deployment, EmbeddedServer, FaultDone, Hit};
use crate::args::{FaultKind, GateLang, Target};
use crate::proxy::Proxy;
use crate::VerifyError;

/// Tokens whose verification the gate's verifier caches.
const VERIFIER_CACHE: usize = 1024;

/// What a gate deployment is made of (from the flags).
pub struct GateSetup {
    pub target: Target,
    pub lang: GateLang,
    /// The interpreter of [`GateLang::Python`].
    pub python: PathBuf,
    pub durability: Durability,
    /// A replica beside the database, for `db-failover` (PostgreSQL, Redis).
    pub replica: bool,
    /// The database's files on a lazy file system, for `db-power-loss` (Redis, SQLite).
    pub lazy_disk: bool,
}

/// How long a new replica may take to stream.
const STANDBY_TIMEOUT: Duration = Duration::from_secs(60);

/// The replica of a `db-failover` run and its link to the primary.
struct Standby {
    /// PostgreSQL's or Redis's ([`Target::PostgresGate`], [`Target::RedisGate`]).
    target: Target,
    db: Database,
    /// The replica's connection to its primary goes through it (cut before a failover);
    /// pointed at each new primary.
    link: Proxy,
    log: PathBuf,
    durability: Durability,
}

impl Standby {
    /// When `setup` asks for a replica: clones the primary at `primary` through a new link
    /// and waits until the clone streams from it; its log is `<name>-replica.log` in `out`.
    async fn beside(
        setup: &GateSetup,
        primary: SocketAddr,
        out: &Path,
        name: &str,
    ) -> Result<Option<Standby>, VerifyError> {
        if !setup.replica {
            return Ok(None);
        }
        let link = Proxy::start(primary, Proxy::new_link()).await?;
        let log = out.join(format!("{name}-replica.log"));
        let (target, durability) = (setup.target, setup.durability);
        Ok(Some(
            Standby::clone_through(target, link, primary, durability, log).await?,
        ))
    }

    /// Clones the primary at `primary` (which `link` relays to) and waits until the clone
    /// streams from it.
    async fn clone_through(
        target: Target,
        link: Proxy,
        primary: SocketAddr,
        durability: Durability,
        log: PathBuf,
    ) -> Result<Standby, VerifyError> {
        let db = match target {
            Target::RedisGate => {
                let db = redis_server::start_replica(&log, link.addr()).await?;
                redis_server::await_replica(primary, STANDBY_TIMEOUT).await?;
                db
            }
            _ => {
                let db = pg_server::start_replica(&log, link.addr(), durability).await?;
                let synchronous = durability == Durability::Safe;
                pg_server::await_standby(primary, synchronous, STANDBY_TIMEOUT).await?;
                db
            }
        };
        Ok(Standby {
            target,
            db,
            link,
            log,
            durability,
        })
    }

    /// Makes the replica a primary.
    async fn promote(&self) -> Result<(), VerifyError> {
        match self.target {
            Target::RedisGate => redis_server::promote(self.db.addr).await,
            _ => pg_server::promote(self.db.addr).await,
        }
    }

    /// How the primary waited for it, as the report says it.
    fn kind(&self) -> &'static str {
        match (self.target, self.durability) {
            (Target::RedisGate, Durability::Safe) => "replica (waited for by the gate)",
            (Target::RedisGate, Durability::Unsafe) => "replica (not waited for by the gate)",
            (_, Durability::Safe) => "synchronous replica",
            (_, Durability::Unsafe) => "asynchronous replica",
        }
    }
}

/// Where the application that writes through the gate runs.
enum Application {
    /// A task of this process (the Rust gate over PostgreSQL or Redis).
    InProcess(GateStore),
    /// A process of its own beside the database (the Python gate over PostgreSQL).
    Process(Box<DbProcess>),
    /// The database's own process (SQLite: the process holding the file).
    Database,
}

/// A Palisade lock server, a database, and the gated application between them.
pub struct GateDeployment {
    setup: GateSetup,
    locks: EmbeddedServer,
    db: DbProcess,
    db_description: String,
    /// Between the application and the database, or the workers and the SQLite
    /// application (db-drop, db-delay).
    db_proxy: Proxy,
    app: Application,
    /// The primary's address (the database's, without a replica).
    db_addr: SocketAddr,
    /// The replica of a `db-failover` run.
    standby: Option<Standby>,
    /// Where the workers reach the application.
    store_addr: SocketAddr,
    /// Why the gate cannot keep its promise here (a negative control), as the report says it.
    unsafe_because: Option<String>,
}

impl GateDeployment {
    pub async fn start(
        setup: GateSetup,
        exe: &Path,
        data_dir: &Path,
        out: &Path,
    ) -> Result<Self, VerifyError> {
        let locks = EmbeddedServer::start(exe, data_dir, &out.join("server.log")).await?;
        let lock_addr = locks.addr();
        let expect_unsafe = setup.durability == Durability::Unsafe;
        let (target, lang) = (setup.target, setup.lang);
        let in_process = |gated: Arc<dyn GatedDb>| async move {
            let store = GateStore::start(gated).await?;
            let addr = store.addr();
            Ok::<_, VerifyError>((Application::InProcess(store), addr))
        };
        // The application reaches its database through a proxy of its own (db-drop,
        // db-delay); the database's own probes go around it. SQLite has no connection to
        // cut: its proxy stands between the workers and the process holding the file.
        let link = Proxy::new_link();
        let app_log = out.join("app.log");
        let mut standby = None;
        let replication = match setup.replica {
            true => Replication::Standby,
            false => Replication::None,
        };
        let (database, db_proxy, (app, store_addr), unsafe_because) = match (target, lang) {
            (Target::PostgresGate, _) => {
                let log = out.join("postgres.log");
                let database = pg_server::start(&log, setup.durability, replication).await?;
                // Before the gate's preflight, which counts the connected replicas.
                standby = Standby::beside(&setup, database.addr, out, "postgres").await?;
                let proxy = Proxy::start(database.addr, link).await?;
                let config = pg_server::client_config(proxy.addr());
                let (app, refusal) = if lang == GateLang::Python {
                    let dsn = PythonDb::Postgres {
                        dsn: config,
                        unsafe_db: expect_unsafe,
                    };
                    let python = &setup.python;
                    let app =
                        app_process::python(python, out, &app_log, dsn, lock_addr, false).await?;
                    let addr = app.database.addr;
                    (
                        (Application::Process(Box::new(app.database.process)), addr),
                        app.preflight_refusal.as_deref().map(preflight_refused),
                    )
                } else {
                    let keys = issuer_keys(lock_addr).await?;
                    let gated = PgStore::install(config, keys.verifier(), expect_unsafe).await?;
                    let refusal = gated.preflight_refusal().map(preflight_refused);
                    (in_process(Arc::new(gated)).await?, refusal)
                };
                (database, proxy, app, refusal)
            }
            (Target::RedisGate, GateLang::Rust) => {
                let log = out.join("redis.log");
                let (durability, lazy) = (setup.durability, setup.lazy_disk);
                let database = redis_server::start(&log, durability, replication, lazy).await?;
                standby = Standby::beside(&setup, database.addr, out, "redis").await?;
                let proxy = Proxy::start(database.addr, link).await?;
                let url = redis_server::client_url(proxy.addr());
                let keys = issuer_keys(lock_addr).await?;
                let (verifier, replica) = (keys.verifier(), setup.replica);
                let gated = RedisStore::install(&url, verifier, expect_unsafe, replica).await?;
                let refusal = gated.unsafe_because().map(str::to_owned);
                (database, proxy, in_process(Arc::new(gated)).await?, refusal)
            }
            // Unsafe only on a lazy file system (see app_process).
            (Target::SqliteGate, _) if !expect_unsafe || setup.lazy_disk => {
                let (synchronous, unsafe_because) = match expect_unsafe {
                    false => (Synchronous::Full, None),
                    true => (Synchronous::Off, Some(SQLITE_OFF.to_owned())),
                };
                let lazy = setup.lazy_disk;
                let AppProcess { database, .. } = match lang {
                    GateLang::Rust => {
                        app_process::rust_sqlite(exe, &app_log, lock_addr, synchronous, lazy)
                            .await?
                    }
                    GateLang::Python => {
                        let (python, db) = (&setup.python, PythonDb::Sqlite(synchronous));
                        app_process::python(python, out, &app_log, db, lock_addr, lazy).await?
                    }
                };
                let proxy = Proxy::start(database.addr, link).await?;
                let addr = proxy.addr();
                (
                    database,
                    proxy,
                    (Application::Database, addr),
                    unsafe_because,
                )
            }
            (other, lang) => {
                return Err(VerifyError::Internal(format!(
                    "no gate deployment for {} with the {} gate{}",
                    other.as_str(),
                    lang.as_str(),
                    if expect_unsafe {
                        " and --unsafe-db"
                    } else {
                        ""
                    }
                )))
            }
        };
        Ok(GateDeployment {
            setup,
            locks,
            db_addr: database.addr,
            standby,
            db: database.process,
            db_description: database.description,
            db_proxy,
            app,
            store_addr,
            unsafe_because,
        })
    }
}

/// What makes the SQLite control unsafe, as the report says it (SQLite has no preflight to
/// quote: `docs/protecting-your-database.md` asks for `synchronous = FULL`).
const SQLITE_OFF: &str = "synchronous=OFF: SQLite acknowledges a commit it never fsyncs \
     (the gate's durability needs synchronous=FULL), so a power loss takes it back";

/// The deployment-level faults of the gate target `target`.
pub fn faults(target: Target) -> &'static [FaultKind] {
    use FaultKind::*;
    match target {
        Target::PostgresGate => &[Kill, DbKill, DbPause, DbDrop, DbDelay, DbFailover],
        Target::RedisGate => &[
            Kill,
            DbKill,
            DbPause,
            DbDrop,
            DbDelay,
            DbFailover,
            DbPowerLoss,
        ],
        _ => &[Kill, DbKill, DbPause, DbDrop, DbDelay, DbPowerLoss],
    }
}

/// The issuer's keys, from the lock server at `addr` (`GET /v1/keys`).
async fn issuer_keys(addr: SocketAddr) -> Result<Arc<IssuerKeys>, VerifyError> {
    let client = Client::new(&format!("http://{addr}"))
        .map_err(|e| VerifyError::Deploy(format!("cannot make a client: {e}")))?;
    IssuerKeys::fetch(client, VERIFIER_CACHE)
        .await
        .map_err(|e| VerifyError::Deploy(format!("cannot fetch the issuer's keys: {e}")))
}

impl GateDeployment {
    /// `db-failover`: cut the replica off its primary for `hit.span` (a partition, or a
    /// replica fallen behind), SIGKILL the primary, half a span later promote the replica, point the
    /// application's proxy at it, and clone a new replica from it (the old primary's files
    /// are dropped: it never comes back as a primary). While the replica is cut off, a
    /// synchronous primary acknowledges no commit; an asynchronous one goes on, and what it
    /// acknowledged then is not on the replica it fails over to.
    async fn fail_over(&mut self, hit: Hit) -> Result<FaultDone, VerifyError> {
        let replica = self.standby.take().ok_or_else(|| {
            VerifyError::Internal("db-failover in a run started without a replica".into())
        })?;
        replica.link.link().partition();
        tokio::time::sleep(hit.span).await;
        self.db.crash().await?;
        // Until a failover manager notices: at least one TTL, so that no holder that read
        // from the old primary writes to the new one within the same critical section
        // (which would write back what the replica missed, and hide the loss).
        let noticed = hit.span / 2;
        tokio::time::sleep(noticed).await;
        replica.link.link().heal();
        replica.promote().await?;
        let kind = replica.kind();
        let Standby {
            target,
            db: promoted,
            link,
            log,
            durability,
        } = replica;
        self.db_proxy.retarget(promoted.addr);
        // The old primary (reaped by crash()) and its files are dropped here.
        self.db = promoted.process;
        self.db_addr = promoted.addr;
        link.retarget(promoted.addr);
        let standby = Standby::clone_through(target, link, promoted.addr, durability, log).await?;
        let detail = format!(
            "{kind} cut off for {} ms, then the primary SIGKILLed; {} ms later the replica \
             promoted at {}, the application pointed at it, a new replica cloned from it at {}",
            hit.span.as_millis(),
            noticed.as_millis(),
            promoted.addr,
            standby.db.addr
        );
        self.standby = Some(standby);
        Ok(FaultDone {
            detail,
            crashed: false,
        })
    }

    /// The two ends of the link `db-drop` and `db-delay` act on.
    fn db_link(&self) -> (&'static str, &'static str) {
        match self.app {
            Application::InProcess(_) | Application::Process(_) => {
                ("the application", "the database")
            }
            Application::Database => ("the workers", "the SQLite application"),
        }
    }
}

#[async_trait]
impl Deployment for GateDeployment {
    fn name(&self) -> &'static str {
        self.setup.target.as_str()
    }

    fn describe(&self) -> Vec<String> {
        let store = match self.app {
            Application::InProcess(_) => "an application",
            Application::Process(_) => "the application process",
            Application::Database => "the application process, through a proxy,",
        };
        let gate = match self.setup.lang {
            GateLang::Rust => "the Rust gate",
            GateLang::Python => "the Python gate",
        };
        let mut lines = vec![
            format!("locks: one palisade serve process at {}", self.locks.addr()),
            format!("database: {}", self.db_description),
            format!(
                "store: {store} at {} writing to the database through {gate} \
                 (the admit and the write in one transaction or script)",
                self.store_addr
            ),
        ];
        if let Some(why) = &self.unsafe_because {
            lines.push(format!("UNSAFE (negative control): {why}"));
        }
        lines
    }

    fn lock_addrs(&self) -> Vec<SocketAddr> {
        vec![self.locks.addr()]
    }

    fn store_addrs(&self) -> Vec<SocketAddr> {
        vec![self.store_addr]
    }

    fn faults(&self) -> &'static [FaultKind] {
        faults(self.setup.target)
    }

    async fn fault(&mut self, kind: FaultKind, hit: Hit) -> Result<FaultDone, VerifyError> {
        match kind {
            FaultKind::Kill => self.locks.fault(kind, hit).await,
            FaultKind::DbKill => {
                self.db.crash().await?;
                tokio::time::sleep(hit.span).await;
                self.db.restart().await?;
                Ok(FaultDone {
                    detail: format!(
                        "database SIGKILL (every process), restarted after {} ms",
                        hit.span.as_millis()
                    ),
                    crashed: false,
                })
            }
            FaultKind::DbDrop => {
                self.db_proxy.link().drop_connections();
                let (from, to) = self.db_link();
                Ok(FaultDone {
                    detail: format!("connections between {from} and {to} cut"),
                    crashed: false,
                })
            }
            FaultKind::DbDelay => {
                let link = self.db_proxy.link();
                link.set_delay(hit.span);
                tokio::time::sleep(hit.span).await;
                link.set_delay(std::time::Duration::ZERO);
                let (from, to) = self.db_link();
                Ok(FaultDone {
                    detail: format!(
                        "what {from} sent {to} during {0} ms held {0} ms",
                        hit.span.as_millis()
                    ),
                    crashed: false,
                })
            }
            FaultKind::DbPause => {
                self.db.freeze()?;
                tokio::time::sleep(hit.span).await;
                self.db.thaw()?;
                Ok(FaultDone {
                    detail: format!("database SIGSTOP for {} ms", hit.span.as_millis()),
                    crashed: false,
                })
            }
            FaultKind::DbFailover => self.fail_over(hit).await,
            FaultKind::DbPowerLoss => {
                let files = self.db.lose_power().await?;
                tokio::time::sleep(hit.span).await;
                self.db.restart().await?;
                Ok(FaultDone {
                    detail: format!(
                        "database SIGKILL (every process) and power loss: the writes to {files} \
                         file(s) that no fsync reached dropped; restarted after {} ms",
                        hit.span.as_millis()
                    ),
                    crashed: false,
                })
            }
            other => Err(VerifyError::Internal(format!(
                "{other} is not a fault of the gate targets"
            ))),
        }
    }

    async fn heal(&mut self) -> Result<(), VerifyError> {
        self.db_proxy.link().heal();
        self.db.heal().await?;
        if let Application::Process(app) = &mut self.app {
            app.heal().await?;
        }
        self.locks.restart().await
    }

    async fn stop(&mut self) {
        self.locks.shut_down().await;
        self.db_proxy.shutdown();
        match &mut self.app {
            Application::InProcess(store) => store.stop(),
            Application::Process(app) => app.stop().await,
            Application::Database => {}
        }
        self.db.stop().await;
    }
}
