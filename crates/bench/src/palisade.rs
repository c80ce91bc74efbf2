//! The Palisade driver: the HTTP API of `docs/api.md`, one connection per client.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use hyper::header::HeaderValue;
use hyper::Method;
use palisade_api::wire::{AcquireRequest, Lease};
use palisade_api::ErrorCode;

use crate::driver::{refused, Plan, KEYS_PER_LOCK, LONG_TTL_MS};
use crate::http::Conn;
use crate::{BenchError, Job, OpError, Outcome, Worker};

/// One lock this client works on, with its request paths computed once.
struct LockPaths {
    acquire: String,
    /// `/v1/kv/{lock}/k{i}` for each key the client cycles through.
    keys: Vec<String>,
}

struct PalisadeWorker {
    conn: Conn,
    job: Job,
    locks: Vec<LockPaths>,
    /// The acquire body (holder, ttl, and for `contended` the wait).
    acquire_body: Bytes,
    value: Bytes,
    /// Leases held for the whole run (`j2`, `read`), released by `finish`.
    held: Vec<String>,
    /// The token for each lock in `locks` (`j2`).
    tokens: Vec<HeaderValue>,
    n: usize,
    /// `contended` without a queue wait: pause after a refusal, as the peers do.
    retry_sleep: bool,
}

pub(crate) fn acquire_body(holder: &str, ttl_ms: u64, wait_ms: u64) -> Bytes {
    let request = AcquireRequest {
        holder: Some(holder.to_owned()),
        ttl_ms: Some(ttl_ms),
        wait_ms,
        ..AcquireRequest::default()
    };
    serde_json::to_vec(&request).unwrap_or_default().into()
}

pub(crate) async fn acquire(conn: &mut Conn, path: &str, body: Bytes) -> Result<Lease, OpError> {
    conn.post_json(path, body).await?.json()
}

pub(crate) async fn release(conn: &mut Conn, lease_id: &str) -> Result<(), OpError> {
    let path = format!("/v1/leases/{lease_id}/release");
    let answer = conn.post_json(&path, Bytes::new()).await?;
    match answer.status {
        200 => Ok(()),
        _ => Err(answer.error()),
    }
}

pub(crate) async fn put(
    conn: &mut Conn,
    path: &str,
    token: &HeaderValue,
    value: Bytes,
) -> Result<(), OpError> {
    let answer = conn
        .send(Method::PUT, path, &[("fencing-token", token)], value)
        .await?;
    match answer.status {
        200 => Ok(()),
        _ => Err(answer.error()),
    }
}

pub(crate) async fn worker(plan: Arc<Plan>, client: usize) -> Result<Box<dyn Worker>, BenchError> {
    let conn = Conn::open(&plan.url, plan.key.as_deref())
        .await
        .map_err(|e| plan.setup_error(format!("{}: {}", plan.url, e.code)))?;
    let names = plan.worker_locks(client);
    let keys_per_lock = match plan.job {
        Job::Read => 1,
        _ => KEYS_PER_LOCK,
    };
    let locks = names
        .iter()
        .map(|name| LockPaths {
            acquire: format!("/v1/locks/{name}/acquire"),
            keys: (0..keys_per_lock)
                .map(|k| format!("/v1/kv/{name}/k{k}"))
                .collect(),
        })
        .collect();
    let holder = plan.holder(client);
    let (ttl, wait) = match plan.job {
        Job::Contended => (plan.ttl_ms, plan.wait_ms),
        _ => (plan.ttl_ms, 0),
    };
    let mut worker = PalisadeWorker {
        conn,
        job: plan.job,
        locks,
        acquire_body: acquire_body(&holder, ttl, wait),
        value: plan.value.clone(),
        held: Vec::new(),
        tokens: Vec::new(),
        n: client,
        retry_sleep: plan.sleeps_between_tries(),
    };
    let held = match plan.job {
        Job::J2 | Job::Read => worker.hold_all(&holder).await,
        _ => Ok(()),
    };
    held.map_err(|e| plan.setup_error(format!("acquiring the client's locks: {}", e.code)))?;
    Ok(Box::new(worker))
}

impl PalisadeWorker {
    /// Acquires every lock of this client for the whole run; `read` also writes the value
    /// it will read.
    async fn hold_all(&mut self, holder: &str) -> Result<(), OpError> {
        let body = acquire_body(holder, LONG_TTL_MS, 0);
        for i in 0..self.locks.len() {
            let granted = acquire(&mut self.conn, &self.locks[i].acquire, body.clone()).await?;
            self.held.push(granted.lease_id);
            let token =
                HeaderValue::from_str(&granted.token).map_err(|_| OpError::new("bad_token"))?;
            if self.job == Job::Read {
                for path in self.locks[i].keys.clone() {
                    put(&mut self.conn, &path, &token, self.value.clone()).await?;
                }
            }
            self.tokens.push(token);
        }
        Ok(())
    }

    fn next_lock(&mut self) -> usize {
        self.n = self.n.wrapping_add(1);
        self.n % self.locks.len()
    }
}

#[async_trait]
impl Worker for PalisadeWorker {
    async fn op(&mut self) -> Result<Outcome, OpError> {
        let i = self.next_lock();
        match self.job {
            Job::J1 => {
                let body = self.acquire_body.clone();
                let granted = acquire(&mut self.conn, &self.locks[i].acquire, body).await?;
                release(&mut self.conn, &granted.lease_id).await?;
                Ok(Outcome::Done)
            }
            Job::Contended => {
                let body = self.acquire_body.clone();
                match acquire(&mut self.conn, &self.locks[i].acquire, body).await {
                    Ok(granted) => {
                        release(&mut self.conn, &granted.lease_id).await?;
                        Ok(Outcome::Done)
                    }
                    Err(e) if e.code == ErrorCode::LockHeld.as_str() => {
                        Ok(refused(self.retry_sleep).await)
                    }
                    Err(e) => Err(e),
                }
            }
            Job::J2 => {
                let keys = &self.locks[i].keys;
                let path = &keys[(self.n / self.locks.len()) % keys.len()];
                put(&mut self.conn, path, &self.tokens[i], self.value.clone()).await?;
                Ok(Outcome::Done)
            }
            Job::Read => {
                let answer = self
                    .conn
                    .send(Method::GET, &self.locks[i].keys[0], &[], Bytes::new())
                    .await?;
                match answer.status {
                    200 if answer.body.len() == self.value.len() => Ok(Outcome::Done),
                    200 => Err(OpError::new("wrong_value")),
                    _ => Err(answer.error()),
                }
            }
            Job::Plain | Job::Scale => Err(OpError::new("unsupported_job")),
        }
    }

    async fn finish(&mut self) {
        for lease_id in std::mem::take(&mut self.held) {
            let _ = release(&mut self.conn, &lease_id).await;
        }
    }
}
