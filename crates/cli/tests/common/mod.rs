//! Shared helpers for the end-to-end tests: a real `palisade serve` process on a free
//! loopback port, in a temp dir, stopped by its process id.

#![allow(dead_code)]

#[cfg(feature = "etcd")]
pub mod etcd_cluster;
pub mod events;
pub mod pki;
pub mod principals;
pub mod raw;
pub mod sqlite_gate;
pub mod topology;
pub mod verify;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use palisade_test_support::ServerProcess;
#[allow(unused_imports)]
pub use palisade_test_support::{alive, free_port, poll, Signal};

/// The `palisade` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// A server process.
pub struct Server {
    process: ServerProcess,
    pub url: String,
    /// `redis://127.0.0.1:PORT` when started with `--resp-listen`.
    pub resp_url: Option<String>,
    pub port: u16,
    pub data_dir: PathBuf,
    /// The extra flags it was started with, reused on restart.
    extra: Vec<String>,
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    /// Starts a server in a new temp dir.
    pub fn start(extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let data_dir = dir.path().join("data");
        let mut server = Server::start_in(&data_dir, 0, extra).expect("server starts");
        server._dir = Some(dir);
        server
    }

    /// [`Server::start`] with flags built as strings.
    pub fn start_with(extra: &[String]) -> Server {
        Server::start(&extra.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Starts a server on `data_dir` and `port` (0 = any free port).
    pub fn start_in(data_dir: &Path, port: u16, extra: &[&str]) -> Result<Server, String> {
        let mut command = Command::new(BIN);
        command
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra);
        let process = ServerProcess::spawn(command)?;
        Ok(Server {
            url: process.url.clone(),
            resp_url: process.resp_url.clone(),
            port: process.port,
            process,
            data_dir: data_dir.to_owned(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            _dir: None,
        })
    }

    /// Kills the process with SIGKILL (a crash: nothing gets flushed) and reaps it.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Kills the server and starts a new one on the same port and data directory.
    pub fn crash_and_restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
            match Server::start_in(&self.data_dir, self.port, &extra) {
                Ok(mut next) => {
                    std::mem::swap(&mut self.process, &mut next.process);
                    // `next` now owns the dead process; dropping it is harmless.
                    return;
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("restart retry: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("server did not restart: {e}"),
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Sends `signal` (e.g. `Signal::SIGTERM`) to the server process.
    pub fn signal(&self, signal: Signal) {
        palisade_test_support::signal(self.pid(), signal);
    }

    /// Waits up to `limit` for the process to exit; its status, or None if it still runs.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        self.process.wait_exit(limit)
    }

    /// The server's stderr, read line by line on a thread into the returned buffer (so the
    /// process never blocks on a full pipe). Call at most once.
    pub fn capture_stderr(&mut self) -> std::sync::Arc<std::sync::Mutex<String>> {
        self.process.capture_stderr()
    }
}

/// A raw HTTP helper, for tests that must see exact statuses and bodies.
pub struct Http {
    pub base: String,
    pub client: reqwest::Client,
}

impl Http {
    pub fn new(base: &str) -> Http {
        Http {
            base: base.to_owned(),
            client: reqwest::Client::new(),
        }
    }

    pub async fn acquire(&self, lock: &str, holder: &str, ttl_ms: u64) -> Value {
        let body = serde_json::json!({"holder": holder, "ttl_ms": ttl_ms});
        let (status, body) = self
            .post_json(&format!("/v1/locks/{lock}/acquire"), &body)
            .await;
        assert_eq!(status, 200, "acquire {lock}: {body}");
        body
    }

    /// PUT with an optional token header value.
    pub async fn put(
        &self,
        lock: &str,
        key: &str,
        token: Option<&str>,
        value: &str,
    ) -> (u16, Value) {
        let mut req = self
            .client
            .put(format!("{}/v1/kv/{lock}/{key}", self.base))
            .body(value.to_owned());
        if let Some(t) = token {
            req = req.header("Fencing-Token", t);
        }
        self.send(req).await
    }

    /// Reads a value: Some(text) or None on 404.
    pub async fn get_value(&self, lock: &str, key: &str) -> Option<String> {
        let resp = self
            .client
            .get(format!("{}/v1/kv/{lock}/{key}", self.base))
            .send()
            .await
            .expect("GET");
        match resp.status().as_u16() {
            200 => Some(resp.text().await.expect("body")),
            404 => None,
            other => panic!("GET value: unexpected status {other}"),
        }
    }

    /// Acquires, waiting in line up to `wait_ms`.
    pub async fn acquire_waiting(
        &self,
        lock: &str,
        holder: &str,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Value {
        let body = serde_json::json!({"holder": holder, "ttl_ms": ttl_ms, "wait_ms": wait_ms});
        let (status, body) = self
            .post_json(&format!("/v1/locks/{lock}/acquire"), &body)
            .await;
        assert_eq!(status, 200, "acquire {lock}: {body}");
        body
    }

    /// Releases the lease of `grant` (an acquire's answer); asserts it was released.
    pub async fn release(&self, grant: &Value) {
        let id = grant["lease_id"].as_str().expect("lease_id");
        let (status, body) = self.post(&format!("/v1/leases/{id}/release")).await;
        assert_eq!(status, 200, "release: {body}");
    }

    pub async fn high_water(&self, lock: &str) -> u64 {
        let (status, body) = self.get(&format!("/v1/fences/{lock}")).await;
        assert_eq!(status, 200, "{body}");
        body["high_water"].as_u64().expect("high_water")
    }

    /// Polls the lock's status until `n` acquisitions wait in its line (at most 20 s).
    pub async fn wait_for_waiters(&self, lock: &str, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, status) = self.get(&format!("/v1/locks/{lock}")).await;
            if status["waiters"] == n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{n} waiters never queued: {status}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// GETs `path` (from `/v1/...`) and returns (status, JSON body or Null).
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.client.get(format!("{}{path}", self.base)))
            .await
    }

    /// POSTs `path` with no body and returns (status, JSON body or Null).
    pub async fn post(&self, path: &str) -> (u16, Value) {
        self.send(self.client.post(format!("{}{path}", self.base)))
            .await
    }

    /// POSTs `body` as JSON to `path` and returns (status, JSON body or Null).
    pub async fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(self.client.post(format!("{}{path}", self.base)).json(body))
            .await
    }

    /// Sends and returns (status, JSON body or Null).
    pub async fn send(&self, req: reqwest::RequestBuilder) -> (u16, Value) {
        let resp = req.send().await.expect("request sent");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

/// The `error.code` of an error body.
pub fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no code>")
}
