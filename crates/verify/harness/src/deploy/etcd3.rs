//! [`Etcd3`]: the high-availability topology. Three etcd members and three stateless
//! `palisade serve --backend etcd` nodes sharing one signing key, all on loopback.
//!
//! Every node reaches etcd through proxies of its own (one per member, sharing one
//! [`Link`]), so the nemesis can cut one node off from etcd (`node-partition`) while the
//! workers still reach it: that node then answers 503 `storage_failed` (after its etcd
//! timeout, [`ETCD_TIMEOUT_MS`]) and the workers fail over to another node. The other
//! faults: `kill` SIGKILLs one node and restarts it on the same port; `etcd-kill` and
//! `etcd-pause` act on the etcd leader ([`EtcdCluster::fault`]).
//!
//! The nodes must come from a `palisade` built with `--features etcd`; a build without
//! it refuses `--backend etcd`, and the start-up error says so.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use super::{Deployment, EmbeddedServer, EtcdCluster, FaultDone, Hit};
use crate::args::FaultKind;
use crate::proxy::{Link, Proxy};
use crate::VerifyError;

/// How many Palisade nodes and etcd members.
pub const NODES: usize = 3;
/// The nodes' `--etcd-timeout-ms`: short, so a node without etcd answers 503 quickly
/// and its workers fail over instead of waiting.
pub const ETCD_TIMEOUT_MS: u64 = 2000;

/// One Palisade node and its proxies to etcd.
struct Node {
    server: EmbeddedServer,
    /// The node's link to etcd (every one of its etcd proxies).
    link: Arc<Link>,
    _proxies: Vec<Proxy>,
}

/// Three Palisade nodes over a three-member etcd cluster.
pub struct Etcd3 {
    etcd: EtcdCluster,
    nodes: Vec<Node>,
}

impl Etcd3 {
    /// Starts the cluster and the nodes, with every directory under `dir` and the logs in
    /// `log_dir` (`etcd.log`, `node0.log`, ...).
    pub async fn start(exe: &Path, dir: &Path, log_dir: &Path) -> Result<Etcd3, VerifyError> {
        Self::start_with(exe, dir, log_dir, Vec::new()).await
    }

    /// [`Etcd3::start`] with extra `serve` flags for every node.
    pub async fn start_with(
        exe: &Path,
        dir: &Path,
        log_dir: &Path,
        more: Vec<OsString>,
    ) -> Result<Etcd3, VerifyError> {
        let etcd = EtcdCluster::start(NODES, &dir.join("etcd"), &log_dir.join("etcd.log")).await?;
        let key_file = dir.join("signing.key");
        write_private(&key_file, &random_key_hex())?;
        let mut nodes = Vec::new();
        for i in 0..NODES {
            let link = Proxy::new_link();
            let mut proxies = Vec::new();
            let mut endpoints = Vec::new();
            for member in etcd.client_addrs() {
                let proxy = Proxy::start(member, link.clone()).await?;
                endpoints.push(format!("http://{}", proxy.addr()));
                proxies.push(proxy);
            }
            let mut extra: Vec<OsString> = vec![
                "--backend".into(),
                "etcd".into(),
                "--etcd-endpoints".into(),
                endpoints.join(",").into(),
                "--etcd-timeout-ms".into(),
                ETCD_TIMEOUT_MS.to_string().into(),
                "--signing-key-file".into(),
                key_file.clone().into_os_string(),
            ];
            extra.extend(more.iter().cloned());
            let log = log_dir.join(format!("node{i}.log"));
            let server =
                EmbeddedServer::start_with(exe, &dir.join(format!("node{i}")), &log, extra)
                    .await
                    .map_err(|e| {
                        VerifyError::Deploy(format!(
                            "Palisade node {i} did not start (the etcd3 topology needs a \
                             palisade built with `--features etcd`): {e}"
                        ))
                    })?;
            nodes.push(Node {
                server,
                link,
                _proxies: proxies,
            });
        }
        Ok(Etcd3 { etcd, nodes })
    }
}

/// A fresh Ed25519 secret key, as the 64 hex characters `--signing-key-file` takes.
fn random_key_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a key file with mode 0600, as the server demands.
fn write_private(path: &Path, text: &str) -> Result<(), VerifyError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e| VerifyError::io(format!("cannot write {}", path.display()), e);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    file.write_all(text.as_bytes()).map_err(io)
}

#[async_trait]
impl Deployment for Etcd3 {
    fn name(&self) -> &'static str {
        "etcd3"
    }

    fn describe(&self) -> Vec<String> {
        let mut lines = self.etcd.describe();
        for (i, node) in self.nodes.iter().enumerate() {
            lines.push(format!(
                "Palisade node {i}: palisade serve --backend etcd at {}, reaching etcd through its own proxies (etcd timeout {ETCD_TIMEOUT_MS} ms)",
                node.server.addr()
            ));
        }
        lines
    }

    fn lock_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.server.addr()).collect()
    }

    fn store_addrs(&self) -> Vec<SocketAddr> {
        self.lock_addrs()
    }

    fn faults(&self) -> &'static [FaultKind] {
        &[
            FaultKind::Kill,
            FaultKind::EtcdKill,
            FaultKind::EtcdPause,
            FaultKind::NodePartition,
        ]
    }

    async fn fault(&mut self, kind: FaultKind, hit: Hit) -> Result<FaultDone, VerifyError> {
        let i = (hit.pick as usize) % self.nodes.len();
        match kind {
            FaultKind::Kill => {
                let server = &mut self.nodes[i].server;
                server.crash().await?;
                tokio::time::sleep(hit.span).await;
                server.restart().await?;
                Ok(FaultDone {
                    detail: format!(
                        "Palisade node {i} SIGKILL, restarted after {} ms",
                        hit.span.as_millis()
                    ),
                    crashed: true,
                })
            }
            FaultKind::NodePartition => {
                let link = self.nodes[i].link.clone();
                link.partition();
                tokio::time::sleep(hit.span).await;
                link.heal();
                Ok(FaultDone {
                    detail: format!(
                        "Palisade node {i} cut off from etcd for {} ms (clients still reach it)",
                        hit.span.as_millis()
                    ),
                    crashed: false,
                })
            }
            FaultKind::EtcdKill | FaultKind::EtcdPause => self.etcd.fault(kind, hit).await,
            other => Err(VerifyError::Internal(format!(
                "{other} is not a fault of the etcd3 topology"
            ))),
        }
    }

    async fn heal(&mut self) -> Result<(), VerifyError> {
        self.etcd.heal().await?;
        for node in &mut self.nodes {
            node.link.heal();
            node.server.restart().await?;
        }
        Ok(())
    }

    async fn stop(&mut self) {
        for node in &mut self.nodes {
            node.server.shut_down().await;
        }
        self.etcd.stop().await;
    }
}
