//! [`PostgresGate`]: the `postgres-gate` target. Locks from a real Palisade server, data in
//! a real PostgreSQL written through the Rust gate, and faults on the database itself.
//!
//! - locks: an [`EmbeddedServer`] (`kill` crashes and restarts it, as for Palisade);
//! - the database: a [`PgCluster`] started by the harness (`db-kill`: SIGKILL to the
//!   postmaster and every backend, then a restart through crash recovery; `db-pause`:
//!   SIGSTOP to all of them, then SIGCONT);
//! - the application between them: a [`GateStore`] over a [`PgStore`], verifying tokens
//!   with the keys the lock server lists (`GET /v1/keys`, [`palisade_client::IssuerKeys`]).
//!
//! With PostgreSQL's durability settings the run must come out clean. With
//! `--unsafe-db` the database runs with `synchronous_commit=off`, which the gate's
//! preflight refuses (its words go in the report): a `db-kill` then loses acknowledged
//! commits, marks included, and the checkers must find it (a negative control).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use palisade_client::{Client, IssuerKeys};

use super::gate_store::GateStore;
use super::pg_store::PgStore;
use super::postgres::{Durability, PgCluster};
use super::{Deployment, EmbeddedServer, FaultDone, Hit};
use crate::args::FaultKind;
use crate::VerifyError;

/// Tokens whose verification the gate's verifier caches.
const VERIFIER_CACHE: usize = 1024;

/// A Palisade lock server, PostgreSQL, and the gated application between them.
pub struct PostgresGate {
    locks: EmbeddedServer,
    db: PgCluster,
    store: GateStore,
    preflight_refusal: Option<String>,
}

impl PostgresGate {
    pub async fn start(
        exe: &Path,
        data_dir: &Path,
        out: &Path,
        durability: Durability,
    ) -> Result<Self, VerifyError> {
        let locks = EmbeddedServer::start(exe, data_dir, &out.join("server.log")).await?;
        let db = PgCluster::start(&out.join("postgres.log"), durability).await?;
        let client = Client::new(&format!("http://{}", locks.addr()))
            .map_err(|e| VerifyError::Deploy(format!("cannot make a client: {e}")))?;
        let keys = IssuerKeys::fetch(client, VERIFIER_CACHE)
            .await
            .map_err(|e| VerifyError::Deploy(format!("cannot fetch the issuer's keys: {e}")))?;
        let pg = PgStore::install(
            db.config(),
            keys.verifier(),
            durability.unsafe_setting().is_some(),
        )
        .await?;
        let preflight_refusal = pg.preflight_refusal().map(str::to_owned);
        let store = GateStore::start(Arc::new(pg)).await?;
        Ok(PostgresGate {
            locks,
            db,
            store,
            preflight_refusal,
        })
    }
}

#[async_trait]
impl Deployment for PostgresGate {
    fn name(&self) -> &'static str {
        "postgres-gate"
    }

    fn describe(&self) -> Vec<String> {
        let mut lines = vec![
            format!("locks: one palisade serve process at {}", self.locks.addr()),
            format!("database: {}", self.db.describe()),
            format!(
                "store: an application at {} writing to PostgreSQL through the Rust gate \
                 (palisade_adapters::postgres::admit and the write in one transaction)",
                self.store.addr()
            ),
        ];
        if let Some(why) = &self.preflight_refusal {
            lines.push(format!(
                "UNSAFE (negative control): the gate's preflight refuses this database: {why}"
            ));
        }
        lines
    }

    fn lock_addrs(&self) -> Vec<SocketAddr> {
        vec![self.locks.addr()]
    }

    fn store_addrs(&self) -> Vec<SocketAddr> {
        vec![self.store.addr()]
    }

    fn faults(&self) -> &'static [FaultKind] {
        &[FaultKind::Kill, FaultKind::DbKill, FaultKind::DbPause]
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
                        "PostgreSQL SIGKILL (postmaster and backends), restarted after {} ms",
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
                    detail: format!("PostgreSQL SIGSTOP for {} ms", hit.span.as_millis()),
                    crashed: false,
                })
            }
            other => Err(VerifyError::Internal(format!(
                "{other} is not a fault of the postgres-gate target"
            ))),
        }
    }

    async fn heal(&mut self) -> Result<(), VerifyError> {
        self.db.heal().await?;
        self.locks.restart().await
    }

    async fn stop(&mut self) {
        self.locks.shut_down().await;
        self.db.stop().await;
    }
}
