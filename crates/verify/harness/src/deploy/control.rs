//! [`UnfencedControl`]: the negative control deployment of the embedded topology.
//!
//! Leases and epochs come from a real Palisade server, so the workers behave exactly as
//! they do against Palisade; only the store differs: the toy store ([`toy`]) serves the
//! same routes and answers like the fenced store, but never compares a token with anything.
//! The same workload and faults must then produce lost updates. If they do not, the
//! faults are too weak to show anything, and a clean Palisade run would mean nothing.
//!
//! `kill` crashes the lock server only: the toy store keeps its state in memory and has no
//! durable state to recover, so killing it would lose data for reasons unrelated to
//! fencing and muddy the control.

use std::net::SocketAddr;
use std::path::Path;

use async_trait::async_trait;

use super::gate_store::GateStore;
use super::toy::{self, Check};
use super::{Deployment, EmbeddedServer, FaultDone, Hit};
use crate::args::FaultKind;
use crate::VerifyError;

/// A real lock service in front of a store that ignores tokens.
pub struct UnfencedControl {
    locks: EmbeddedServer,
    store: GateStore,
}

impl UnfencedControl {
    pub async fn start(exe: &Path, data_dir: &Path, log: &Path) -> Result<Self, VerifyError> {
        let locks = EmbeddedServer::start(exe, data_dir, log).await?;
        let store = toy::start(Check::Nothing).await?;
        Ok(UnfencedControl { locks, store })
    }
}

#[async_trait]
impl Deployment for UnfencedControl {
    fn name(&self) -> &'static str {
        "unfenced-control"
    }

    fn describe(&self) -> Vec<String> {
        vec![
            format!("locks: one palisade serve process at {}", self.locks.addr()),
            format!(
                "store: the toy store at {}, which checks no token (negative control)",
                self.store.addr()
            ),
        ]
    }

    fn lock_addrs(&self) -> Vec<SocketAddr> {
        vec![self.locks.addr()]
    }

    fn store_addrs(&self) -> Vec<SocketAddr> {
        vec![self.store.addr()]
    }

    fn faults(&self) -> &'static [FaultKind] {
        &[FaultKind::Kill]
    }

    async fn fault(&mut self, kind: FaultKind, hit: Hit) -> Result<FaultDone, VerifyError> {
        self.locks.fault(kind, hit).await
    }

    async fn heal(&mut self) -> Result<(), VerifyError> {
        self.locks.restart().await
    }

    async fn stop(&mut self) {
        self.locks.shut_down().await;
        self.store.stop();
    }
}
