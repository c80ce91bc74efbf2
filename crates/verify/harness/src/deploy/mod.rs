//! Deployments: what the workers run against.
//!
//! A [`Deployment`] owns the servers of one run: it says where the lock service and the
//! store listen (one address per node; the workers' proxies relay to these), which faults
//! of its own it supports (crashing a server, damaging its disk, etcd faults), injects
//! them when the nemesis asks, and heals everything at the end. The harness talks to it
//! only through this trait.
//!
//! - [`EmbeddedServer`]: one `palisade serve` child process of this same binary, on a
//!   loopback port, over a data directory that survives its restarts (`kill`, `disk`).
//! - [`UnfencedControl`]: the embedded negative control. Locks come from a real embedded
//!   server, but the store is a toy that ignores tokens ([`toy`]).
//! - [`Etcd3`]: three etcd members ([`EtcdCluster`]) and three stateless Palisade nodes,
//!   each reaching etcd through its own proxies (`kill`, `etcd-kill`, `etcd-pause`,
//!   `node-partition`).
//! - [`EtcdLockControl`]: the same etcd cluster, etcd's own lock, and the toy store
//!   either unchecked or checking the lock's revision (`etcd-kill`, `etcd-pause`).
//! - [`GateDeployment`]: locks from an embedded server, data in a PostgreSQL, a Redis or
//!   a SQLite file the harness starts ([`db_process`], [`pg_server`], [`redis_server`],
//!   [`app_process`]), written through the Rust gate by a small application
//!   ([`gate_store`], [`pg_store`], [`redis_store`], [`sqlite_store`]) or through the
//!   Python gate by `gate_app.py` ([`app_process`]) (`kill`, `db-kill`, `db-pause`,
//!   `db-drop`, `db-delay`).

pub mod app_process;
mod control;
pub mod db_process;
mod embedded;
pub mod etcd;
mod etcd3;
mod etcd_lock;
pub mod gate;
pub mod gate_store;
pub mod pg_server;
pub mod pg_store;
pub mod redis_server;
pub mod redis_store;
pub mod sqlite_store;
pub mod toy;

use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;

pub use control::UnfencedControl;
pub use db_process::Durability;
pub use embedded::EmbeddedServer;
pub use etcd::EtcdCluster;
pub use etcd3::Etcd3;
pub use etcd_lock::EtcdLockControl;
pub use gate::{GateDeployment, GateSetup};

use crate::args::{FaultKind, LockProtocol};
use crate::VerifyError;

/// The random choices of one deployment fault, drawn by the nemesis from the run's seed.
#[derive(Debug, Clone, Copy)]
pub struct Hit {
    /// How long the fault lasts (down time, pause or partition length).
    pub span: Duration,
    /// Picks the node or member (and, for `disk`, the bytes).
    pub pick: u64,
}

/// What a deployment fault did.
#[derive(Debug, Clone)]
pub struct FaultDone {
    pub detail: String,
    /// A process holding durable state was SIGKILLed (the history gets a restart marker).
    pub crashed: bool,
}

/// The servers under test.
#[async_trait]
pub trait Deployment: Send {
    /// A short name for summaries and reports.
    fn name(&self) -> &'static str;

    /// One line per process of the deployment, for the report.
    fn describe(&self) -> Vec<String>;

    /// How the workers take locks from [`Deployment::lock_addrs`].
    fn lock_protocol(&self) -> LockProtocol {
        LockProtocol::Palisade
    }

    /// Where the lock service listens: one address per node (Palisade nodes, or etcd
    /// members for the etcd-lock controls).
    fn lock_addrs(&self) -> Vec<SocketAddr>;

    /// Where the store listens: one address per node (may be the lock addresses).
    fn store_addrs(&self) -> Vec<SocketAddr>;

    /// The deployment-level faults it can inject (the worker faults always apply).
    fn faults(&self) -> &'static [FaultKind];

    /// Injects one of [`Deployment::faults`] and heals it before returning.
    async fn fault(&mut self, kind: FaultKind, hit: Hit) -> Result<FaultDone, VerifyError>;

    /// Brings everything back up at the end of the run, whatever the nemesis left.
    async fn heal(&mut self) -> Result<(), VerifyError>;

    /// Stops everything at the end of the run.
    async fn stop(&mut self);
}

/// The last lines of a log file, for start-up errors.
pub(crate) fn log_tail(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}
