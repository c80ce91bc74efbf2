//! Redis: locks and fencing in Lua scripts, one round trip per step.
//!
//! The server runs with `appendonly yes` and `appendfsync always`, so a script's writes
//! are in the fsync'd append-only file before the reply.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Script};

use super::{Peer, Recipes};
use crate::driver::Plan;
use crate::{BenchError, OpError, Worker};

/// Take the lock if free (with a ttl), and only then issue the lock's next epoch.
const ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0";

/// Release only our own acquisition.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

/// The gate: refuse an epoch below the high-water mark, else advance it and write.
const FENCED_WRITE: &str = r"
local hw = tonumber(redis.call('GET', KEYS[1]) or '0')
local epoch = tonumber(ARGV[1])
if epoch < hw then return -hw end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return epoch";

type Lock = super::LockKeys<i64>;

struct RedisWorker {
    conn: MultiplexedConnection,
    locks: Vec<Lock>,
    holder: String,
    ttl_ms: u64,
    value: Bytes,
    acquire: Script,
    release: Script,
    fenced_write: Script,
}

fn code(e: redis::RedisError) -> OpError {
    if e.is_io_error() {
        return OpError::new("io");
    }
    match e.code() {
        Some(code) => OpError::new(format!("redis_{}", code.to_lowercase())),
        None => OpError::new(format!("redis_{:?}", e.kind()).to_lowercase()),
    }
}

pub async fn worker(plan: Arc<Plan>, client: usize) -> Result<Box<dyn Worker>, BenchError> {
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    let conn = redis::Client::open(plan.url.as_str())
        .map_err(|e| plan.setup_error(e))?
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| plan.setup_error(format!("{}: {e}", plan.url)))?;
    let locks = Lock::of_worker(&plan, client, ':');
    let worker = RedisWorker {
        conn,
        locks,
        holder: plan.holder(client),
        ttl_ms: plan.ttl_ms,
        value: plan.value.clone(),
        acquire: Script::new(ACQUIRE),
        release: Script::new(RELEASE),
        fenced_write: Script::new(FENCED_WRITE),
    };
    Peer::prepared(worker, &plan, client).await
}

#[async_trait]
impl Recipes for RedisWorker {
    async fn acquire(&mut self, i: usize, seq: usize) -> Result<bool, OpError> {
        let lock = &self.locks[i];
        // The new epoch, or 0 if the lock is taken.
        let epoch: i64 = self
            .acquire
            .key(&lock.lock_key)
            .key(&lock.epoch_key)
            .arg(format!("{}-{seq}", self.holder))
            .arg(self.ttl_ms)
            .invoke_async(&mut self.conn)
            .await
            .map_err(code)?;
        if epoch != 0 {
            self.locks[i].epoch = epoch;
        }
        Ok(epoch != 0)
    }

    async fn release(&mut self, i: usize, seq: usize) -> Result<(), OpError> {
        let released: i64 = self
            .release
            .key(&self.locks[i].lock_key)
            .arg(format!("{}-{seq}", self.holder))
            .invoke_async(&mut self.conn)
            .await
            .map_err(code)?;
        match released {
            1 => Ok(()),
            _ => Err(OpError::new("lease_lost")),
        }
    }

    async fn fenced_write(&mut self, i: usize, key: usize) -> Result<bool, OpError> {
        let lock = &self.locks[i];
        let admitted: i64 = self
            .fenced_write
            .key(&lock.hw_key)
            .key(&lock.value_keys[key])
            .arg(lock.epoch)
            .arg(&self.value[..])
            .invoke_async(&mut self.conn)
            .await
            .map_err(code)?;
        Ok(admitted == lock.epoch)
    }

    async fn write_plain(&mut self, i: usize, key: usize) -> Result<(), OpError> {
        redis::cmd("SET")
            .arg(&self.locks[i].value_keys[key])
            .arg(&self.value[..])
            .exec_async(&mut self.conn)
            .await
            .map_err(code)
    }

    async fn read(&mut self, i: usize) -> Result<bool, OpError> {
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&self.locks[i].value_keys[0])
            .query_async(&mut self.conn)
            .await
            .map_err(code)?;
        Ok(value.is_some_and(|v| v.len() == self.value.len()))
    }

    fn locks(&self) -> usize {
        self.locks.len()
    }
}
