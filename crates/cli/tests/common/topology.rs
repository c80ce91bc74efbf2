//! The deployments the shared end-to-end tests run against (STYLE principle 7: the same
//! behavioural tests for every backend).
//!
//! - [`Topology::embedded`]: one `palisade serve` process on its own data directory.
//! - [`Topology::etcd`] (feature `etcd`): a 3-member etcd cluster and 3 stateless
//!   `palisade serve --backend etcd` nodes sharing one signing key. Tests spread their
//!   requests across the nodes with [`Topology::url`].

use super::Server;

/// A running deployment.
pub enum Topology {
    Embedded(Server),
    #[cfg(feature = "etcd")]
    Etcd(EtcdNodes),
}

/// Three Palisade nodes over a three-member etcd cluster.
#[cfg(feature = "etcd")]
pub struct EtcdNodes {
    pub etcd: super::etcd_cluster::EtcdCluster,
    pub nodes: Vec<Server>,
    _keys: tempfile::TempDir,
}

impl Topology {
    pub fn embedded(extra: &[&str]) -> Topology {
        Topology::Embedded(Server::start(extra))
    }

    #[cfg(feature = "etcd")]
    pub fn etcd(extra: &[&str]) -> Topology {
        let etcd = super::etcd_cluster::EtcdCluster::start(3);
        let keys = tempfile::tempdir().expect("temp dir");
        let key_file = keys.path().join("signing.key");
        write_private(
            &key_file,
            &hex(&palisade_token::Signer::generate().secret()),
        );
        let endpoints = etcd.endpoints();
        let key_file = key_file.to_str().expect("utf-8 temp path").to_owned();
        let mut args = vec![
            "--backend",
            "etcd",
            "--etcd-endpoints",
            &endpoints,
            "--signing-key-file",
            &key_file,
            // Fail fast while a leader is being elected: 503s, not stalls.
            "--etcd-timeout-ms",
            "2000",
        ];
        args.extend_from_slice(extra);
        let nodes = (0..3)
            .map(|i| {
                let data_dir = keys.path().join(format!("node{i}"));
                Server::start_in(&data_dir, 0, &args).expect("palisade node starts")
            })
            .collect();
        Topology::Etcd(EtcdNodes {
            etcd,
            nodes,
            _keys: keys,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Topology::Embedded(_) => "embedded",
            #[cfg(feature = "etcd")]
            Topology::Etcd(_) => "etcd",
        }
    }

    /// Base URLs of every Palisade node.
    pub fn urls(&self) -> Vec<String> {
        match self {
            Topology::Embedded(server) => vec![server.url.clone()],
            #[cfg(feature = "etcd")]
            Topology::Etcd(t) => t.nodes.iter().map(|n| n.url.clone()).collect(),
        }
    }

    /// The URL of node `i` (modulo the number of nodes): spread requests with it.
    pub fn url(&self, i: usize) -> String {
        let urls = self.urls();
        urls[i % urls.len()].clone()
    }

    /// A crash: SIGKILL and restart on the same ports and directories. Embedded: the one
    /// server. etcd: every Palisade node and etcd member `round % 3` at once.
    pub fn crash_and_restart(&mut self, round: usize) {
        match self {
            Topology::Embedded(server) => {
                let _ = round;
                server.crash_and_restart()
            }
            #[cfg(feature = "etcd")]
            Topology::Etcd(t) => {
                let member = round % t.etcd.len();
                for node in &mut t.nodes {
                    node.kill();
                }
                t.etcd.kill(member);
                t.etcd.restart(member);
                for node in &mut t.nodes {
                    node.crash_and_restart();
                }
            }
        }
    }
}

#[cfg(feature = "etcd")]
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a key file with mode 0600, as the server demands.
#[cfg(feature = "etcd")]
pub fn write_private(path: &std::path::Path, text: &str) {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).expect("key file");
    file.write_all(text.as_bytes()).expect("write key file");
}
