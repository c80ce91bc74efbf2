//! The Palisade driver over RESP (`palisade serve --resp-listen`): the same jobs as the
//! HTTP driver (`palisade.rs`) through the Redis client library, one connection per
//! client. Chosen by a `redis://` URL for the Palisade target; built with the `peers`
//! feature, which links that library.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};

use palisade_api::ErrorCode;

use crate::driver::{refused, Plan, KEYS_PER_LOCK, LONG_TTL_MS};
use crate::{BenchError, Job, OpError, Outcome, Worker};

struct Lock {
    name: String,
    keys: Vec<String>,
}

struct RespWorker {
    conn: MultiplexedConnection,
    job: Job,
    locks: Vec<Lock>,
    holder: String,
    ttl_ms: u64,
    wait_ms: u64,
    value: Bytes,
    /// Leases held for the whole run (`j2`, `read`), released by `finish`.
    held: Vec<String>,
    /// The token for each lock in `locks` (`j2`).
    tokens: Vec<String>,
    n: usize,
    retry_sleep: bool,
}

/// The server's error code (`-STALE_TOKEN ...` gives `stale_token`), or the failure's
/// class.
fn code(e: redis::RedisError) -> OpError {
    if e.is_io_error() {
        return OpError::new("io");
    }
    match e.code() {
        Some(code) => OpError::new(code.to_ascii_lowercase()),
        None => OpError::new(format!("resp_{:?}", e.kind()).to_lowercase()),
    }
}

/// A field of a map reply (a RESP2 flat array of names and values).
fn field(reply: &Value, name: &str) -> Result<String, OpError> {
    let items: Vec<&Value> = match reply {
        Value::Array(items) => items.iter().collect(),
        Value::Map(pairs) => pairs.iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => return Err(OpError::new("bad_reply")),
    };
    items
        .chunks(2)
        .find(|pair| matches!(pair[0], Value::BulkString(k) if k == name.as_bytes()))
        .and_then(|pair| match pair.get(1) {
            Some(Value::BulkString(v)) => String::from_utf8(v.clone()).ok(),
            _ => None,
        })
        .ok_or_else(|| OpError::new("bad_reply"))
}

pub(crate) async fn worker(plan: Arc<Plan>, client: usize) -> Result<Box<dyn Worker>, BenchError> {
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    let mut conn = redis::Client::open(plan.url.as_str())
        .map_err(|e| plan.setup_error(e))?
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| plan.setup_error(format!("{}: {e}", plan.url)))?;
    if let Some(key) = &plan.key {
        redis::cmd("AUTH")
            .arg(key)
            .exec_async(&mut conn)
            .await
            .map_err(|e| plan.setup_error(format!("AUTH: {e}")))?;
    }
    let keys_per_lock = match plan.job {
        Job::Read => 1,
        _ => KEYS_PER_LOCK,
    };
    let locks = plan
        .worker_locks(client)
        .into_iter()
        .map(|name| Lock {
            keys: (0..keys_per_lock).map(|k| format!("k{k}")).collect(),
            name,
        })
        .collect();
    let mut worker = RespWorker {
        conn,
        job: plan.job,
        locks,
        holder: plan.holder(client),
        ttl_ms: plan.ttl_ms,
        wait_ms: if plan.job == Job::Contended {
            plan.wait_ms
        } else {
            0
        },
        value: plan.value.clone(),
        held: Vec::new(),
        tokens: Vec::new(),
        retry_sleep: plan.sleeps_between_tries(),
        n: client,
    };
    if matches!(plan.job, Job::J2 | Job::Read) {
        let held = worker.hold_all().await;
        held.map_err(|e| plan.setup_error(format!("acquiring the client's locks: {}", e.code)))?;
    }
    Ok(Box::new(worker))
}

impl RespWorker {
    /// `(lease_id, token)` of a grant.
    async fn acquire(
        &mut self,
        i: usize,
        ttl_ms: u64,
        wait_ms: u64,
    ) -> Result<(String, String), OpError> {
        let mut cmd = redis::cmd("LOCK.ACQUIRE");
        cmd.arg(&self.locks[i].name)
            .arg(ttl_ms)
            .arg("HOLDER")
            .arg(&self.holder);
        if wait_ms > 0 {
            cmd.arg("WAIT").arg(wait_ms);
        }
        let reply: Value = cmd.query_async(&mut self.conn).await.map_err(code)?;
        Ok((field(&reply, "lease_id")?, field(&reply, "token")?))
    }

    async fn release(&mut self, lease_id: &str) -> Result<(), OpError> {
        redis::cmd("LOCK.RELEASE")
            .arg(lease_id)
            .exec_async(&mut self.conn)
            .await
            .map_err(code)
    }

    async fn put(&mut self, i: usize, key: usize, token: &str) -> Result<(), OpError> {
        let lock = &self.locks[i];
        redis::cmd("KV.PUT")
            .arg(&lock.name)
            .arg(&lock.keys[key])
            .arg(&self.value[..])
            .arg(token)
            .exec_async(&mut self.conn)
            .await
            .map_err(code)
    }

    async fn hold_all(&mut self) -> Result<(), OpError> {
        for i in 0..self.locks.len() {
            let (lease_id, token) = self.acquire(i, LONG_TTL_MS, 0).await?;
            self.held.push(lease_id);
            if self.job == Job::Read {
                for k in 0..self.locks[i].keys.len() {
                    self.put(i, k, &token).await?;
                }
            }
            self.tokens.push(token);
        }
        Ok(())
    }
}

#[async_trait]
impl Worker for RespWorker {
    async fn op(&mut self) -> Result<Outcome, OpError> {
        self.n = self.n.wrapping_add(1);
        let i = self.n % self.locks.len();
        match self.job {
            Job::J1 => {
                let (lease_id, _) = self.acquire(i, self.ttl_ms, 0).await?;
                self.release(&lease_id).await?;
                Ok(Outcome::Done)
            }
            Job::Contended => match self.acquire(i, self.ttl_ms, self.wait_ms).await {
                Ok((lease_id, _)) => {
                    self.release(&lease_id).await?;
                    Ok(Outcome::Done)
                }
                Err(e) if e.code == ErrorCode::LockHeld.as_str() => {
                    Ok(refused(self.retry_sleep).await)
                }
                Err(e) => Err(e),
            },
            Job::J2 => {
                let key = (self.n / self.locks.len()) % self.locks[i].keys.len();
                let token = self.tokens[i].clone();
                self.put(i, key, &token).await?;
                Ok(Outcome::Done)
            }
            Job::Read => {
                let lock = &self.locks[i];
                let value: Option<Vec<u8>> = redis::cmd("KV.GET")
                    .arg(&lock.name)
                    .arg(&lock.keys[0])
                    .query_async(&mut self.conn)
                    .await
                    .map_err(code)?;
                match value {
                    Some(v) if v.len() == self.value.len() => Ok(Outcome::Done),
                    _ => Err(OpError::new("wrong_value")),
                }
            }
            Job::Plain | Job::Scale => Err(OpError::new("unsupported_job")),
        }
    }

    async fn finish(&mut self) {
        for lease_id in std::mem::take(&mut self.held) {
            let _ = self.release(&lease_id).await;
        }
    }
}
