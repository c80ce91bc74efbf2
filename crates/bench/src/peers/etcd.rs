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
    if plan.job == Job::J2 {
        // The high-water keys the fenced writes compare, before the locks are taken.
        for lock in &worker.locks {
            let hw_key = lock.hw_key.clone();
            worker
                .client
                .put(hw_key, padded(0), None)
                .await
                .map_err(|e| plan.setup_error(e))?;
        }
    }
    Peer::prepared(worker, &plan, client).await
}

#[async_trait]
impl Recipes for EtcdWorker {
    async fn acquire(&mut self, i: usize, seq: usize) -> Result<bool, OpError> {
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
            return Ok(false);
        }
        match answer.op_responses().get(1) {
            Some(TxnOpResponse::Put(put)) => {
                self.locks[i].epoch = put.prev_key().map_or(1, |kv| kv.version() as u64 + 1);
                Ok(true)
            }
            _ => Err(OpError::new("bad_answer")),
        }
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
        let hw_key = lock.hw_key.as_str();
        // Admit when high-water < epoch + 1, i.e. high-water <= epoch.
        let admitted = Compare::value(hw_key, CompareOp::Less, padded(lock.epoch + 1));
        let txn = Txn::new().when([admitted]).and_then([
            TxnOp::put(hw_key, padded(lock.epoch), None),
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

    fn locks(&self) -> usize {
        self.locks.len()
    }
}
