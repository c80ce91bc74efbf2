//! Shared helpers for the end-to-end tests: a real `palisade serve` process on a free
//! loopback port, in a temp dir, stopped by its process id.

#![allow(dead_code)]

#[cfg(feature = "etcd")]
pub mod etcd_cluster;
pub mod principals;
pub mod topology;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A server process.
pub struct Server {
    child: Child,
    pub url: String,
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

    /// Starts a server on `data_dir` and `port` (0 = any free port).
    pub fn start_in(data_dir: &Path, port: u16, extra: &[&str]) -> Result<Server, String> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("read: {e}"))?;
        let Some(url) = palisade_api::listening::parse(&line) else {
            let mut err = String::new();
            if let Some(mut stderr) = child.stderr.take() {
                use std::io::Read;
                let _ = stderr.read_to_string(&mut err);
            }
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("server did not start: {line:?} {err}"));
        };
        let url = url.to_owned();
        let port = url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or("no port")?;
        Ok(Server {
            child,
            url,
            port,
            data_dir: data_dir.to_owned(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            _dir: None,
        })
    }

    /// Kills the process with SIGKILL (a crash: nothing gets flushed) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the server and starts a new one on the same port and data directory.
    pub fn crash_and_restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
            match Server::start_in(&self.data_dir, self.port, &extra) {
                Ok(mut next) => {
                    std::mem::swap(&mut self.child, &mut next.child);
                    // `next` now owns the dead child; dropping it is harmless.
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
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
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
        let (status, body) = self
            .send(
                self.client
                    .post(format!("{}/v1/locks/{lock}/acquire", self.base))
                    .json(&serde_json::json!({"holder": holder, "ttl_ms": ttl_ms})),
            )
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
        let url = format!("{}/v1/locks/{lock}/acquire", self.base);
        let (status, body) = self.send(self.client.post(url).json(&body)).await;
        assert_eq!(status, 200, "acquire {lock}: {body}");
        body
    }

    pub async fn high_water(&self, lock: &str) -> u64 {
        let (status, body) = self
            .send(self.client.get(format!("{}/v1/fences/{lock}", self.base)))
            .await;
        assert_eq!(status, 200, "{body}");
        body["high_water"].as_u64().expect("high_water")
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

/// Calls `check` until it returns Some or `within` has passed (then None). For state that
/// another process or task produces: poll for it instead of sleeping and hoping.
pub fn poll<T>(within: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check() {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
