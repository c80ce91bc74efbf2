//! [`RedisStore`]: the `redis-gate` target's store in Redis, written through the Rust gate
//! (`palisade_adapters::redis::RedisFence`).
//!
//! A value of key `k` under lock `L` is two Redis keys written by one `fenced_set` (so by
//! one script, atomically with the mark): `{L}:v:k`, the value, and `{L}:e:k`, the epoch of
//! the holder that wrote it (read back as the fenced store's `Fencing-Epoch`). A delete is
//! one `fenced_del` of both; the barrier is `fence`. A token is verified before the call
//! only to learn the epoch to store beside the value; the gate verifies it again and
//! decides.
//!
//! Redis keeps no revision the gate could hand out in the same atomic step, so writes are
//! answered with revision 0, which the workers record as "no revision": the fencing
//! checker leaves them out of its revision-order check (every other check applies).
//!
//! Each request opens its own connection (see [`super::pg_store`] for why). At start, the
//! gate's preflight runs: it passes for the safe settings ([`RedisFence::connect`]), and
//! for the negative control it must refuse; its reason is kept for the report and the
//! control goes on with [`RedisFence::unchecked`].
//!
//! With a replica (`db-failover`), the preflight passes either way (every server persists
//! as it insists; it does not look at replication). The safe gate waits for the replica
//! after every call ([`RedisFence::wait_for_replicas`], at most [`REPLICA_WAIT`]; fewer
//! acknowledgements in time fail the call, whose outcome is then unknown to the worker);
//! the negative control does not, so a call the primary acknowledged may be missing from
//! the replica promoted after it, mark and value alike.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use palisade_adapters::redis::RedisFence;
use palisade_adapters::{AdmitError, Admitted};
use palisade_api::wire::{FenceAnswer, WriteAnswer};
use palisade_token::Verifier;
use redis::aio::MultiplexedConnection;

use super::gate_store::{failed_read, preflight_refused, Entry, GatedDb, Mutation, StoreError};
use crate::VerifyError;

/// How long the safe gate waits for its replica after each call.
pub const REPLICA_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// What makes the negative control with a replica unsafe, as the report says it.
const NO_WAIT: &str = "the gate does not wait for its replica (RedisFence::wait_for_replicas, \
     Redis WAIT): Redis replicates asynchronously, so a replica promoted after a failover \
     can miss calls the primary acknowledged";

/// The gate's store in one Redis.
pub struct RedisStore {
    client: redis::Client,
    fence: RedisFence,
    verifier: Arc<Verifier>,
    unsafe_because: Option<String>,
}

impl RedisStore {
    /// Runs the preflight (see the module docs). `expect_unsafe`: the server was started
    /// with a setting the preflight refuses, or, with `replica`, the gate is not to wait
    /// for the replica; anything else is an error.
    pub async fn install(
        url: &str,
        verifier: Arc<Verifier>,
        expect_unsafe: bool,
        replica: bool,
    ) -> Result<RedisStore, VerifyError> {
        let client = redis::Client::open(url)
            .map_err(|e| VerifyError::Deploy(format!("bad Redis URL {url}: {e}")))?;
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| VerifyError::Deploy(format!("cannot connect to Redis: {e}")))?;
        let (fence, unsafe_because) = match RedisFence::connect(&mut con).await {
            Ok(fence) if replica && expect_unsafe => (fence, Some(NO_WAIT.to_owned())),
            Ok(fence) if replica => (fence.wait_for_replicas(1, REPLICA_WAIT), None),
            Ok(_) if expect_unsafe => {
                return Err(VerifyError::Deploy(
                    "the gate's preflight accepted a Redis started with an unsafe setting".into(),
                ))
            }
            Ok(fence) => (fence, None),
            Err(AdmitError::UnsafeDatabase(why)) if expect_unsafe => (
                RedisFence::unchecked(),
                Some(preflight_refused(&why.to_string())),
            ),
            Err(e) => return Err(VerifyError::Deploy(format!("the gate's preflight: {e}"))),
        };
        Ok(RedisStore {
            client,
            fence,
            verifier,
            unsafe_because,
        })
    }

    /// Why the gate cannot keep its promise here (the negative control): what the
    /// preflight said of the server, or that the gate does not wait for its replica.
    pub fn unsafe_because(&self) -> Option<&str> {
        self.unsafe_because.as_deref()
    }

    async fn connect(&self) -> Result<MultiplexedConnection, StoreError> {
        self.client
            .get_multiplexed_async_connection()
            .await
            .map_err(failed)
    }
}

fn value_key(lock: &str, key: &str) -> String {
    format!("{{{lock}}}:v:{key}")
}

fn epoch_key(lock: &str, key: &str) -> String {
    format!("{{{lock}}}:e:{key}")
}

/// A gate's answer as the store's: the admitted epoch, or why not.
fn admitted(result: Result<Admitted, AdmitError>) -> Result<u64, StoreError> {
    Ok(result?.epoch())
}

#[async_trait]
impl GatedDb for RedisStore {
    async fn mutate(&self, m: Mutation<'_>) -> Result<WriteAnswer, StoreError> {
        let Mutation {
            lock,
            key,
            value,
            token,
        } = m;
        let mut con = self.connect().await?;
        let (vkey, ekey) = (value_key(lock, key), epoch_key(lock, key));
        let result = match &value {
            Some(value) => {
                // An unverifiable token is refused by the gate below, before anything is
                // written; the epoch stored beside the value is then never used.
                let claimed = self.verifier.verify(token).map_or(0, |claims| claims.epoch);
                let claimed = claimed.to_string();
                let pairs: [(&str, &[u8]); 2] = [(&vkey, value), (&ekey, claimed.as_bytes())];
                self.fence
                    .fenced_set(&mut con, &self.verifier, token, lock, &pairs)
                    .await
            }
            None => {
                self.fence
                    .fenced_del(&mut con, &self.verifier, token, lock, &[&vkey, &ekey])
                    .await
            }
        };
        let epoch = admitted(result)?;
        Ok(WriteAnswer { revision: 0, epoch })
    }

    async fn fence(&self, lock: &str, token: &str) -> Result<FenceAnswer, StoreError> {
        let mut con = self.connect().await?;
        let epoch = admitted(
            self.fence
                .fence(&mut con, &self.verifier, token, lock)
                .await,
        )?;
        Ok(FenceAnswer {
            lock: lock.to_owned(),
            high_water: epoch,
            epoch,
        })
    }

    async fn read(&self, lock: &str, key: &str) -> Result<Option<Entry>, StoreError> {
        let mut con = self.connect().await?;
        let (value, epoch): (Option<Vec<u8>>, Option<String>) = redis::cmd("MGET")
            .arg(value_key(lock, key))
            .arg(epoch_key(lock, key))
            .query_async(&mut con)
            .await
            .map_err(failed)?;
        let Some(value) = value else {
            return Ok(None);
        };
        let epoch = epoch
            .and_then(|e| e.parse().ok())
            .ok_or_else(|| StoreError::Failed(format!("no epoch stored beside {key}")))?;
        Ok(Some(Entry {
            value: Bytes::from(value),
            revision: 0,
            epoch,
        }))
    }

    async fn list(&self, lock: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut con = self.connect().await?;
        let head = value_key(lock, "");
        let names: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", glob_escape(&head)))
            .query_async(&mut con)
            .await
            .map_err(failed)?;
        let mut keys: Vec<String> = names
            .iter()
            .filter_map(|name| name.strip_prefix(&head))
            .filter(|key| key.starts_with(prefix))
            .map(str::to_owned)
            .collect();
        keys.sort();
        Ok(keys)
    }

    async fn high_water(&self, lock: &str) -> Result<u64, StoreError> {
        let mut con = self.connect().await?;
        let mark = self
            .fence
            .high_water(&mut con, lock)
            .await
            .map_err(failed_read)?;
        Ok(mark.epoch)
    }
}

/// `text` as a literal in a Redis glob pattern.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn failed(e: redis::RedisError) -> StoreError {
    StoreError::Failed(format!("Redis: {e}"))
}
