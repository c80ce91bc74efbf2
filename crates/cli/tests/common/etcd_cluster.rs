//! A real etcd cluster for end-to-end tests: `n` member processes on free loopback ports
//! (client and peer URLs), data directories in a temp dir, stopped by process id.
//!
//! Election settings are shortened (50 ms heartbeat, 500 ms election timeout) so that a
//! leader failover takes well under a second; etcd's minimum lease TTL becomes 1 s. The
//! harness talks to etcd through its JSON gateway (`/health`, `/v3/maintenance/status`),
//! so the tests need no etcd client library. If `etcd` is not installed, it panics with
//! the fix (scripts/test installs the Debian package `etcd-server`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A running etcd cluster.
pub struct EtcdCluster {
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// One HTTP/1.0 exchange with a member; the body, or None if it does not answer.
fn http(port: u16, request_line: &str, body: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let head = format!(
        "{request_line} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(body.as_bytes()).ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}

impl EtcdCluster {
    /// Starts `n` members and waits until every one reports a healthy cluster.
    pub fn start(n: usize) -> EtcdCluster {
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
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
            token: format!("palisade-test-{}", std::process::id()),
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

    fn spawn(&mut self, i: usize) {
        let binary = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".to_owned());
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new(&binary)
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
        let port = self.members[i].client_port;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if http(port, "GET /health", "").is_some_and(|b| b.contains("\"true\"")) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("etcd member {i} did not become healthy");
    }

    /// Client URLs, comma-separated (the form `--etcd-endpoints` takes).
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the current leader, as the live members report it.
    pub fn leader(&self) -> Option<usize> {
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            let Some(body) = http(m.client_port, "POST /v3/maintenance/status", "{}") else {
                continue;
            };
            let Ok(status) = serde_json::from_str::<serde_json::Value>(&body) else {
                continue;
            };
            let leader = status["leader"].as_str().unwrap_or("0").to_owned();
            // Ask each member for its own id to find the leader among them.
            for (j, other) in self.members.iter().enumerate() {
                let id = http(other.client_port, "POST /v3/maintenance/status", "{}")
                    .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
                    .and_then(|s| s["header"]["member_id"].as_str().map(str::to_owned));
                if id.as_deref() == Some(leader.as_str()) && other.child.is_some() {
                    return Some(j);
                }
            }
        }
        None
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

    pub fn len(&self) -> usize {
        self.members.len()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
