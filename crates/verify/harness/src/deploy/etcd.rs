//! [`EtcdCluster`]: three etcd member processes on loopback, and the faults that act on
//! them (kill and restart the leader, SIGSTOP a member past the election timeout).
//!
//! Each member has its own data directory under the run's temp dir and its own client and
//! peer ports, kept across restarts. Election settings are shortened (50 ms heartbeat,
//! [`ELECTION_TIMEOUT`]) so a failover takes well under a second; etcd's minimum lease
//! TTL becomes 1 s, so the default 1 s worker TTL is granted as asked. The harness talks
//! to etcd through its JSON gateway (`/health`, `/v3/maintenance/status`), so it needs no
//! gRPC client. `etcd` comes from `$ETCD_BIN` or the `PATH` (Debian: `etcd-server`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::{FaultDone, Hit};
use crate::args::FaultKind;
use crate::procs::{free_port, signal};
use crate::VerifyError;

/// The members' election timeout; a pause fault lasts longer than this.
pub const ELECTION_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a (re)started member may take to report a healthy cluster.
const HEALTHY_WITHIN: Duration = Duration::from_secs(30);
const STATUS_TIMEOUT: Duration = Duration::from_millis(500);

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    paused: bool,
}

/// A running etcd cluster.
pub struct EtcdCluster {
    binary: String,
    members: Vec<Member>,
    initial_cluster: String,
    token: String,
    dir: PathBuf,
    log: PathBuf,
    http: reqwest::Client,
}

impl EtcdCluster {
    /// Starts `n` members with their data under `dir`, logging to `log`, and waits until
    /// every one reports a healthy cluster.
    pub async fn start(n: usize, dir: &Path, log: &Path) -> Result<EtcdCluster, VerifyError> {
        let mut members = Vec::new();
        for i in 0..n {
            members.push(Member {
                name: format!("m{i}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                child: None,
                paused: false,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let http = reqwest::Client::builder()
            .timeout(STATUS_TIMEOUT)
            .build()
            .map_err(|e| VerifyError::Internal(format!("http client: {e}")))?;
        let mut cluster = EtcdCluster {
            binary: std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".to_owned()),
            members,
            initial_cluster,
            token: format!("palisade-verify-{}", std::process::id()),
            dir: dir.to_owned(),
            log: log.to_owned(),
            http,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        for i in 0..n {
            cluster.wait_healthy(i).await?;
        }
        Ok(cluster)
    }

    /// The members' client addresses.
    pub fn client_addrs(&self) -> Vec<SocketAddr> {
        self.members
            .iter()
            .map(|m| SocketAddr::from(([127, 0, 0, 1], m.client_port)))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn describe(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| {
                format!(
                    "etcd member {}: client 127.0.0.1:{}, peer 127.0.0.1:{}",
                    m.name, m.client_port, m.peer_port
                )
            })
            .collect()
    }

    fn spawn(&mut self, i: usize) -> Result<(), VerifyError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| VerifyError::io(format!("cannot open {}", self.log.display()), e))?;
        let m = &self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new(&self.binary)
            .args(["--name", &m.name, "--data-dir"])
            .arg(self.dir.join(&m.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", "50", "--election-timeout"])
            .arg(ELECTION_TIMEOUT.as_millis().to_string())
            .args(["--logger", "zap", "--log-level", "error"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                VerifyError::Deploy(format!(
                    "cannot start {:?} ({e}): install etcd (Debian: etcd-server) or set ETCD_BIN",
                    self.binary
                ))
            })?;
        self.members[i].child = Some(child);
        self.members[i].paused = false;
        Ok(())
    }

    async fn get(&self, i: usize, path: &str) -> Option<Value> {
        let url = format!("http://127.0.0.1:{}{path}", self.members[i].client_port);
        let resp = self.http.get(url).send().await.ok()?;
        resp.json().await.ok()
    }

    async fn status(&self, i: usize) -> Option<Value> {
        let url = format!(
            "http://127.0.0.1:{}/v3/maintenance/status",
            self.members[i].client_port
        );
        let resp = self.http.post(url).body("{}").send().await.ok()?;
        resp.json().await.ok()
    }

    /// Waits until member `i` answers `/health` with a leader.
    async fn wait_healthy(&self, i: usize) -> Result<(), VerifyError> {
        let deadline = Instant::now() + HEALTHY_WITHIN;
        while Instant::now() < deadline {
            let health = self.get(i, "/health").await;
            if health.is_some_and(|h| h["health"] == "true") {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(VerifyError::Deploy(format!(
            "etcd member {} did not become healthy within {HEALTHY_WITHIN:?} (see {})",
            self.members[i].name,
            self.log.display()
        )))
    }

    /// The index of the current leader, as the running members report it.
    pub async fn leader(&self) -> Option<usize> {
        let mut ids = Vec::new();
        let mut leader = None;
        for (i, m) in self.members.iter().enumerate() {
            if m.child.is_none() || m.paused {
                ids.push(None);
                continue;
            }
            let status = self.status(i).await;
            let id = status
                .as_ref()
                .and_then(|s| s["header"]["member_id"].as_str().map(str::to_owned));
            if let Some(l) = status.as_ref().and_then(|s| s["leader"].as_str()) {
                leader.get_or_insert(l.to_owned());
            }
            ids.push(id);
        }
        let leader = leader?;
        ids.iter()
            .position(|id| id.as_deref() == Some(leader.as_str()))
    }

    /// SIGKILL member `i` and reap it.
    async fn kill(&mut self, i: usize) -> Result<(), VerifyError> {
        if let Some(mut child) = self.members[i].child.take() {
            child
                .kill()
                .await
                .map_err(|e| VerifyError::io("cannot kill an etcd member", e))?;
        }
        self.members[i].paused = false;
        Ok(())
    }

    /// Starts member `i` again (if it is down) and waits until it is healthy.
    async fn restart(&mut self, i: usize) -> Result<(), VerifyError> {
        if self.members[i].child.is_none() {
            self.spawn(i)?;
        }
        self.wait_healthy(i).await
    }

    fn pause(&mut self, i: usize) -> Result<(), VerifyError> {
        if let Some(child) = &self.members[i].child {
            signal(child, libc::SIGSTOP)?;
            self.members[i].paused = true;
        }
        Ok(())
    }

    fn resume(&mut self, i: usize) -> Result<(), VerifyError> {
        if let Some(child) = &self.members[i].child {
            if self.members[i].paused {
                signal(child, libc::SIGCONT)?;
            }
        }
        self.members[i].paused = false;
        Ok(())
    }

    /// The member a fault aims at: the leader (most of the time), else one by `pick`.
    async fn victim(&self, hit: &Hit) -> (usize, &'static str) {
        if hit.pick % 4 != 0 {
            if let Some(leader) = self.leader().await {
                return (leader, " (the leader)");
            }
        }
        ((hit.pick as usize) % self.members.len(), "")
    }

    /// Injects `etcd-kill` or `etcd-pause` and heals it before returning.
    pub async fn fault(&mut self, kind: FaultKind, hit: Hit) -> Result<FaultDone, VerifyError> {
        let (i, role) = self.victim(&hit).await;
        let name = self.members[i].name.clone();
        match kind {
            FaultKind::EtcdKill => {
                self.kill(i).await?;
                tokio::time::sleep(hit.span).await;
                let down = Instant::now();
                self.restart(i).await?;
                Ok(FaultDone {
                    detail: format!(
                        "etcd {name}{role} SIGKILL, restarted after {} ms, healthy {} ms later",
                        hit.span.as_millis(),
                        down.elapsed().as_millis()
                    ),
                    crashed: true,
                })
            }
            FaultKind::EtcdPause => {
                let span = hit.span.max(ELECTION_TIMEOUT * 2);
                self.pause(i)?;
                tokio::time::sleep(span).await;
                self.resume(i)?;
                Ok(FaultDone {
                    detail: format!("etcd {name}{role} SIGSTOP for {} ms", span.as_millis()),
                    crashed: false,
                })
            }
            other => Err(VerifyError::Internal(format!(
                "{other} is not an etcd fault"
            ))),
        }
    }

    /// Every member running and healthy again.
    pub async fn heal(&mut self) -> Result<(), VerifyError> {
        for i in 0..self.members.len() {
            self.resume(i)?;
            self.restart(i).await?;
        }
        Ok(())
    }

    /// Stops every member (SIGKILL: the data directory is thrown away with the run).
    pub async fn stop(&mut self) {
        for i in 0..self.members.len() {
            let _ = self.kill(i).await;
        }
    }
}
