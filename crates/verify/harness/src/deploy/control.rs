//! [`UnfencedControl`]: the negative control deployment.
//!
//! Leases and epochs come from a real Palisade server, so the workers behave exactly as
//! they do against Palisade; only the store differs: the [`ToyStore`] serves the same
//! routes and answers like the fenced store, but never compares a token with anything.
//! The same workload and faults must then produce lost updates. If they do not, the
//! faults are too weak to show anything, and a clean Palisade run would mean nothing.
//!
//! `kill` crashes the lock server only: the toy store keeps its state in memory and has no
//! durable state to recover, so killing it would lose data for reasons unrelated to
//! fencing and muddy the control.

use std::net::SocketAddr;
use std::path::Path;

use async_trait::async_trait;

use super::toy::ToyStore;
use super::{Deployment, EmbeddedServer};
use crate::VerifyError;

/// A real lock service in front of a store that ignores tokens.
pub struct UnfencedControl {
    locks: EmbeddedServer,
    store: ToyStore,
}

impl UnfencedControl {
    pub async fn start(exe: &Path, data_dir: &Path, log: &Path) -> Result<Self, VerifyError> {
        let locks = EmbeddedServer::start(exe, data_dir, log).await?;
        let store = ToyStore::start().await?;
        Ok(UnfencedControl { locks, store })
    }
}

#[async_trait]
impl Deployment for UnfencedControl {
    fn name(&self) -> &'static str {
        "unfenced-control"
    }

    fn lock_addr(&self) -> SocketAddr {
        self.locks.lock_addr()
    }

    fn store_addr(&self) -> SocketAddr {
        self.store.addr()
    }

    fn is_up(&self) -> bool {
        self.locks.is_up()
    }

    async fn kill(&mut self) -> Result<(), VerifyError> {
        self.locks.kill().await
    }

    async fn restart(&mut self) -> Result<(), VerifyError> {
        self.locks.restart().await
    }

    async fn stop(&mut self) {
        self.locks.stop().await;
        self.store.stop();
    }
}
