//! Real etcd members for tests: `n` processes on free loopback ports (client and peer
//! URLs), data directories in a temp dir, stopped by process id.
//!
//! Election settings are shortened (50 ms heartbeat, 500 ms election timeout) so that a
//! leader failover takes well under a second; etcd's minimum lease TTL becomes 1 s.
//! Health and status are read through etcd's JSON gateway (`/health`,
//! `/v3/maintenance/status`), so no etcd client library is needed. If `etcd` is not
//! installed (or `ETCD_BIN` names none), starting panics with the fix: scripts/test
//! installs the Debian package `etcd-server`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, http};

/// TLS for the members' client ports: their certificate and key, and the CA whose client
/// certificates they require.
#[derive(Debug, Clone)]
pub struct MemberTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_ca_file: PathBuf,
}

/// How to start a cluster beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Serve the client port over TLS, client certificates required. Health is then read
    /// from a plain metrics port.
    pub tls: Option<MemberTls>,
    /// More flags for every member.
    pub extra: Vec<String>,
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Where `/health` answers in plain HTTP: the client port, or a metrics port with TLS.
    health_port: u16,
    child: Option<Child>,
}

/// A running etcd cluster.
pub struct EtcdCluster {
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
    options: Options,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `n` members and waits until every one reports a healthy cluster.
    pub fn start(n: usize) -> EtcdCluster {
        EtcdCluster::start_with(n, Options::default())
    }

    /// Like [`EtcdCluster::start`], with TLS and extra flags.
    pub fn start_with(n: usize, options: Options) -> EtcdCluster {
        let members: Vec<Member> = (0..n)
            .map(|i| {
                let client_port = free_port();
                Member {
                    name: format!("m{i}"),
                    client_port,
                    peer_port: free_port(),
                    health_port: if options.tls.is_some() {
                        free_port()
                    } else {
                        client_port
                    },
                    child: None,
                }
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            initial_cluster,
            token: format!("palisade-test-{}-{}", std::process::id(), free_port()),
            options,
            dir: tempfile::tempdir().expect("temp dir"),
        };
        for i in 0..n {
            cluster.spawn(i);
        }
        for i in 0..n {
            cluster.wait_healthy(i);
        }
        cluster
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(&self.members[i].name)
    }

    /// The directory the members' data directories are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn scheme(&self) -> &'static str {
        if self.options.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    fn spawn(&mut self, i: usize) {
        let binary = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".to_owned());
        let m = &self.members[i];
        let client = format!("{}://127.0.0.1:{}", self.scheme(), m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let mut command = Command::new(&binary);
        if let Some(tls) = &self.options.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert_file)
                .arg("--key-file")
                .arg(&tls.key_file)
                .arg("--trusted-ca-file")
                .arg(&tls.client_ca_file)
                .arg("--client-cert-auth")
                .arg("--listen-metrics-urls")
                .arg(format!("http://127.0.0.1:{}", m.health_port));
        }
        let child = command
            .args(&self.options.extra)
            .args(["--name", &m.name, "--data-dir"])
            .arg(self.data_dir(i))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {binary:?} ({e}): install etcd-server (scripts/test does)")
            });
        self.members[i].child = Some(child);
    }

    /// Waits until member `i` answers `/health` with a leader.
    pub fn wait_healthy(&self, i: usize) {
        let port = self.members[i].health_port;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if http(port, "GET /health", "").is_some_and(|b| b.contains("\"true\"")) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("etcd member {i} did not become healthy");
    }

    /// The client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!(
            "{}://127.0.0.1:{}",
            self.scheme(),
            self.members[i].client_port
        )
    }

    /// Client URLs, comma-separated (the form `--etcd-endpoints` takes).
    pub fn endpoints(&self) -> String {
        (0..self.members.len())
            .map(|i| self.endpoint(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the current leader, as the live members report it (plain HTTP
    /// clusters only).
    pub fn leader(&self) -> Option<usize> {
        let status = |port: u16| {
            http(port, "POST /v3/maintenance/status", "{}")
                .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
        };
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            let Some(reported) = status(m.client_port) else {
                continue;
            };
            let leader = reported["leader"].as_str().unwrap_or("0").to_owned();
            // Ask each member for its own id to find the leader among them.
            for (j, other) in self.members.iter().enumerate() {
                let id = status(other.client_port)
                    .and_then(|s| s["header"]["member_id"].as_str().map(str::to_owned));
                if id.as_deref() == Some(leader.as_str()) && other.child.is_some() {
                    return Some(j);
                }
            }
        }
        None
    }

    /// The process id of member `i`, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// SIGKILLs member `i` (a crash: nothing is flushed) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data directory and waits until it is healthy.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_healthy(i);
    }

    /// `etcdctl snapshot save` of member `i` into `out` (plain HTTP clusters only).
    /// Panics with the fix if `etcdctl` is missing (Debian: etcd-client).
    pub fn save_snapshot(&self, i: usize, out: &Path) {
        let status = Command::new(etcdctl())
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoint(i), "snapshot", "save"])
            .arg(out)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run etcdctl ({e}): install etcd-client"));
        assert!(status.success(), "etcdctl snapshot save: {status}");
    }

    /// The disaster recovery of a one-member cluster: SIGKILLs the member, removes its
    /// data directory, restores `snapshot` into a fresh one with `etcdctl snapshot
    /// restore` (same name, peer URL and cluster token), starts it and waits until it is
    /// healthy. Everything written after the snapshot is gone.
    pub fn restore_snapshot(&mut self, snapshot: &Path) {
        assert_eq!(self.members.len(), 1, "restore_snapshot is for one member");
        self.kill(0);
        let data_dir = self.data_dir(0);
        std::fs::remove_dir_all(&data_dir).expect("remove the member's data directory");
        let m = &self.members[0];
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let status = Command::new(etcdctl())
            .env("ETCDCTL_API", "3")
            .args(["snapshot", "restore"])
            .arg(snapshot)
            .args(["--name", &m.name, "--data-dir"])
            .arg(&data_dir)
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-advertise-peer-urls", &peer])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run etcdctl ({e}): install etcd-client"));
        assert!(status.success(), "etcdctl snapshot restore: {status}");
        self.spawn(0);
        self.wait_healthy(0);
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

/// The etcdctl binary: `ETCDCTL_BIN`, or `etcdctl` on the path.
fn etcdctl() -> String {
    std::env::var("ETCDCTL_BIN").unwrap_or_else(|_| "etcdctl".to_owned())
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
