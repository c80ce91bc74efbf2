//! etcd: locks and fencing as single transactions (etcd's defaults fsync the WAL before
//! answering a write).
//!
//! The epoch of a lock is the *version* of its epoch key: the acquire transaction puts
//! that key with `prev_kv`, and a put raises a key's version by exactly one, so the new
//! epoch is the previous version + 1, atomically with taking the lock (the key is never
//! deleted, so its version never resets). Each client grants one lease at the start and
//! attaches its lock keys to it.

use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use palisade_api::ErrorCode;

use super::{padded, Peer, Recipes};
use crate::driver::{Plan, LONG_TTL_MS};
use crate::{BenchError, Job, OpError, Worker};

type Lock = super::LockKeys<u64>;

struct EtcdWorker {
    client: Client,
    lease: i64,
    locks: Vec<Lock>,
    holder: String,
    value: Vec<u8>,
}

fn code(e: etcd_client::Error) -> OpError {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            OpError::new(format!("etcd_{:?}", status.code()).to_lowercase())
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => {
            OpError::new("io")
        }
        _ => OpError::new("etcd_error"),
    }
}

pub async fn worker(plan: Arc<Plan>, client: usize) -> Result<Box<dyn Worker>, BenchError> {
    // One client, one channel: each worker has its own HTTP/2 connection.
    let mut conn = Client::connect([plan.url.as_str()], None)
        .await
        .map_err(|e| plan.setup_error(format!("{}: {e}", plan.url)))?;
    let lease = conn
        .lease_grant((LONG_TTL_MS / 1000) as i64, None)
        .await
        .map_err(|e| plan.setup_error(e))?
        .id();
    let locks = Lock::of_worker(&plan, client, '/');
    let mut worker = EtcdWorker {
        client: conn,
        lease,
        locks,
        holder: plan.holder(client),
        value: plan.value.to_vec(),
    };
    let setup = async {
        for i in 0..worker.locks.len() {
            match plan.job {
                Job::J2 => {
                    let hw_key = worker.locks[i].hw_key.clone();
                    worker
                        .client
                        .put(hw_key, padded(0), None)
                        .await
                        .map_err(code)?;
                    match worker.try_acquire(i, 0).await? {
                        Some(epoch) => worker.locks[i].epoch = epoch,
                        None => return Err(OpError::new(ErrorCode::LockHeld.as_str())),
                    }
                }
                Job::Read => worker.write_plain(i, 0).await?,
                _ => {}
            }
        }
        Ok(())
    };
    setup.await.map_err(|e| plan.setup_error(e.code))?;
    let locks = worker.locks.len();
    Ok(Peer::boxed(worker, plan.job, locks, client))
}

impl EtcdWorker {
    /// The new epoch, or None if the lock is taken.
    async fn try_acquire(&mut self, i: usize, seq: usize) -> Result<Option<u64>, OpError> {
        let lock = &self.locks[i];
        let txn = Txn::new()
            .when([Compare::version(
                lock.lock_key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    lock.lock_key.as_str(),
                    format!("{}-{seq}", self.holder),
                    Some(PutOptions::new().with_lease(self.lease)),
                ),
                TxnOp::put(
                    lock.epoch_key.as_str(),
                    "",
                    Some(PutOptions::new().with_prev_key()),
                ),
            ]);
        let answer = self.client.txn(txn).await.map_err(code)?;
        if !answer.succeeded() {
            return Ok(None);
        }
        match answer.op_responses().get(1) {
            Some(TxnOpResponse::Put(put)) => {
                Ok(Some(put.prev_key().map_or(1, |kv| kv.version() as u64 + 1)))
            }
            _ => Err(OpError::new("bad_answer")),
        }
    }
}

#[async_trait]
impl Recipes for EtcdWorker {
    async fn acquire(&mut self, i: usize, seq: usize) -> Result<bool, OpError> {
        Ok(self.try_acquire(i, seq).await?.is_some())
    }

    async fn release(&mut self, i: usize, seq: usize) -> Result<(), OpError> {
        let key = self.locks[i].lock_key.as_str();
        let txn = Txn::new()
            .when([Compare::value(
                key,
                CompareOp::Equal,
                format!("{}-{seq}", self.holder),
            )])
            .and_then([TxnOp::delete(key, None)]);
        match self.client.txn(txn).await.map_err(code)?.succeeded() {
            true => Ok(()),
            false => Err(OpError::new("lease_lost")),
        }
    }

    async fn write_plain(&mut self, i: usize, key: usize) -> Result<(), OpError> {
        let key = self.locks[i].value_keys[key].as_str();
        self.client
            .put(key, self.value.clone(), None)
            .await
            .map(drop)
            .map_err(code)
    }

    async fn fenced_write(&mut self, i: usize, key: usize) -> Result<bool, OpError> {
        let lock = &self.locks[i];
        // Admit when high-water < epoch + 1, i.e. high-water <= epoch.
        let txn = Txn::new()
            .when([Compare::value(
                lock.hw_key.as_str(),
                CompareOp::Less,
                padded(lock.epoch + 1),
            )])
            .and_then([
                TxnOp::put(lock.hw_key.as_str(), padded(lock.epoch), None),
                TxnOp::put(lock.value_keys[key].as_str(), self.value.clone(), None),
            ]);
        Ok(self.client.txn(txn).await.map_err(code)?.succeeded())
    }

    async fn read(&mut self, i: usize) -> Result<bool, OpError> {
        let key = self.locks[i].value_keys[0].as_str();
        let answer = self.client.get(key, None).await.map_err(code)?;
        Ok(answer
            .kvs()
            .first()
            .is_some_and(|kv| kv.value().len() == self.value.len()))
    }

    async fn finish(&mut self) {
        let _ = self.client.lease_revoke(self.lease).await;
    }
}
