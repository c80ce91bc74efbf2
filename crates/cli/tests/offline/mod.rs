//! Helpers for the recovery tests: run `palisade` commands to completion (with a
//! deadline), and drive locks over HTTP.

#![allow(dead_code)]

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::Http;

/// A finished `palisade` process.
pub struct Finished {
    pub success: bool,
    /// The exit code (None if a signal ended it).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout))
    }
}

/// Runs `palisade <args>`; kills it and fails the test if it runs past `limit`.
pub fn palisade(args: &[&str], limit: Duration) -> Finished {
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn palisade");
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("palisade {args:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    Finished {
        success: status.success(),
        code: status.code(),
        stdout,
        stderr,
    }
}

pub fn admin(args: &[&str]) -> Finished {
    let mut all = vec!["admin"];
    all.extend_from_slice(args);
    palisade(&all, Duration::from_secs(60))
}

pub fn backup(data: &Path, out: &Path) -> Finished {
    admin(&[
        "backup",
        "--data-dir",
        &data.display().to_string(),
        "--out",
        &out.display().to_string(),
    ])
}

pub fn restore(data: &Path, from: &Path, extra: &[&str]) -> Finished {
    let data = data.display().to_string();
    let from = from.display().to_string();
    let mut args = vec!["restore", "--data-dir", &data, "--from", &from];
    args.extend_from_slice(extra);
    admin(&args)
}

/// `palisade serve` that must refuse to start: returns its stderr.
pub fn serve_refused(data: &Path) -> String {
    serve_refused_with(data, &[])
}

/// [`serve_refused`] with more flags.
pub fn serve_refused_with(data: &Path, extra: &[&str]) -> String {
    let data = data.display().to_string();
    let mut args = vec!["serve", "--listen", "127.0.0.1:0", "--data-dir", &data];
    args.extend_from_slice(extra);
    let run = palisade(&args, Duration::from_secs(30));
    assert!(!run.success, "server started: {}", run.stdout);
    assert!(
        !run.stdout.contains("listening"),
        "server listened: {}",
        run.stdout
    );
    run.stderr
}

/// Acquires `lock`, records the epoch in `issued`, returns the grant.
pub async fn acquire(
    http: &Http,
    lock: &str,
    ttl_ms: u64,
    issued: &mut Vec<(String, u64)>,
) -> Value {
    let grant = http.acquire(lock, "worker", ttl_ms).await;
    let epoch = grant["epoch"].as_u64().expect("epoch");
    issued.push((lock.to_owned(), epoch));
    grant
}

/// Acquires and releases `lock` `n` times.
pub async fn cycle(http: &Http, lock: &str, n: usize, issued: &mut Vec<(String, u64)>) {
    for _ in 0..n {
        let grant = acquire(http, lock, 60_000, issued).await;
        http.release(&grant).await;
    }
}

pub fn max_issued(issued: &[(String, u64)], lock: &str) -> u64 {
    issued
        .iter()
        .filter(|(l, _)| l == lock)
        .map(|(_, e)| *e)
        .max()
        .unwrap_or(0)
}

/// No (lock, epoch) was ever returned twice.
pub fn assert_unique(issued: &[(String, u64)]) {
    let mut seen = std::collections::HashSet::new();
    for (lock, epoch) in issued {
        assert!(
            seen.insert((lock.clone(), *epoch)),
            "epoch {epoch} of {lock} issued twice; all issued: {issued:?}"
        );
    }
}

/// A fenced PUT with an explicit token.
pub async fn put(http: &Http, lock: &str, key: &str, token: &Value, value: &str) -> (u16, Value) {
    http.put(lock, key, token.as_str(), value).await
}

pub fn acquire_body(holder: &str, ttl_ms: u64, wait_ms: u64) -> Value {
    json!({"holder": holder, "ttl_ms": ttl_ms, "wait_ms": wait_ms})
}
