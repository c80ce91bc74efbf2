//! Deployments: what the workers run against.
//!
//! A [`Deployment`] owns the servers of one run: it says where the lock service and the
//! store listen (the workers' proxies relay to these addresses), and it can crash and
//! restart them for the `kill` fault. The harness talks to it only through this trait, so
//! another topology (for example an etcd-backed issuer, or several Palisade nodes) plugs
//! in by implementing it; nothing else in the harness changes.
//!
//! Two deployments exist:
//! - [`EmbeddedServer`]: one `palisade serve` child process of this same binary, on a
//!   loopback port, over a data directory that survives its restarts.
//! - [`UnfencedControl`]: the negative control. Locks come from a real embedded server,
//!   but the store is a toy that ignores tokens ([`toy`]); it lives only in this crate.

mod control;
mod embedded;
pub mod toy;

use std::net::SocketAddr;

use async_trait::async_trait;

pub use control::UnfencedControl;
pub use embedded::EmbeddedServer;

use crate::VerifyError;

/// The servers under test.
#[async_trait]
pub trait Deployment: Send {
    /// A short name for summaries and reports.
    fn name(&self) -> &'static str;

    /// Where the lock service (issuer API) listens.
    fn lock_addr(&self) -> SocketAddr;

    /// Where the store listens (may be the same server as the lock service).
    fn store_addr(&self) -> SocketAddr;

    /// True while the servers are up (false between `kill` and `restart`).
    fn is_up(&self) -> bool;

    /// Crashes the servers that hold durable state (SIGKILL: nothing is flushed).
    async fn kill(&mut self) -> Result<(), VerifyError>;

    /// Starts them again on the same data and the same addresses.
    async fn restart(&mut self) -> Result<(), VerifyError>;

    /// Stops everything at the end of the run.
    async fn stop(&mut self);
}
