//! [`EtcdLockControl`]: etcd's own lock, the controls beside the etcd3 topology.
//!
//! The workers take locks straight from the three-member etcd cluster with etcd's lock
//! recipe (`worker::etcd_lock`: a lease, a lock key attached to it, the owner being the
//! key with the smallest create revision, as etcd's `concurrency.Mutex` does), and write
//! to the toy store ([`toy`]):
//!
//! - `etcd-lock` ([`Check::Nothing`]): the store checks nothing. This is the setting in
//!   which Jepsen found etcd 3.4.3's locks unsafe: a holder paused past its lease keeps
//!   writing after another worker took the lock. The checkers must find lost updates.
//! - `etcd-lock-fenced` ([`Check::Epoch`]): the lock key's create revision travels as the
//!   epoch and the store applies the gate rule to it. It must come out clean: safety comes
//!   from the check at the resource, not from the lock.
//!
//! No Palisade server takes part. Its faults are etcd's (`etcd-kill`, `etcd-pause`); the
//! toy store holds nothing durable, so it is never killed.

use std::net::SocketAddr;
use std::path::Path;

use async_trait::async_trait;

use super::gate_store::GateStore;
use super::toy::{self, Check};
use super::{Deployment, EtcdCluster, FaultDone, Hit};
use crate::args::{FaultKind, LockProtocol};
use crate::VerifyError;

/// etcd's lock in front of the toy store.
pub struct EtcdLockControl {
    etcd: EtcdCluster,
    store: GateStore,
    check: Check,
}

impl EtcdLockControl {
    pub async fn start(dir: &Path, log_dir: &Path, check: Check) -> Result<Self, VerifyError> {
        let etcd = EtcdCluster::start(3, &dir.join("etcd"), &log_dir.join("etcd.log")).await?;
        let store = toy::start(check).await?;
        Ok(EtcdLockControl { etcd, store, check })
    }
}

#[async_trait]
impl Deployment for EtcdLockControl {
    fn name(&self) -> &'static str {
        match self.check {
            Check::Nothing => "etcd-lock",
            Check::Epoch => "etcd-lock-fenced",
        }
    }

    fn describe(&self) -> Vec<String> {
        let mut lines = self.etcd.describe();
        lines.push(match self.check {
            Check::Nothing => format!(
                "locks: etcd's lock recipe (lease + lock key, owner = smallest create revision); store: the toy store at {}, which checks no token (negative control)",
                self.store.addr()
            ),
            Check::Epoch => format!(
                "locks: etcd's lock recipe (lease + lock key, owner = smallest create revision); store: the toy store at {}, applying the gate rule to the lock key's create revision",
                self.store.addr()
            ),
        });
        lines
    }

    fn lock_protocol(&self) -> LockProtocol {
        LockProtocol::Etcd
    }

    fn lock_addrs(&self) -> Vec<SocketAddr> {
        self.etcd.client_addrs()
    }

    fn store_addrs(&self) -> Vec<SocketAddr> {
        vec![self.store.addr()]
    }

    fn faults(&self) -> &'static [FaultKind] {
        &[FaultKind::EtcdKill, FaultKind::EtcdPause]
    }

    async fn fault(&mut self, kind: FaultKind, hit: Hit) -> Result<FaultDone, VerifyError> {
        self.etcd.fault(kind, hit).await
    }

    async fn heal(&mut self) -> Result<(), VerifyError> {
        self.etcd.heal().await
    }

    async fn stop(&mut self) {
        self.etcd.stop().await;
        self.store.stop();
    }
}
