//! The two shapes of etcd transaction Palisade uses.
//!
//! - [`Etcd::read`]: a read-only transaction of several gets, answered at one revision
//!   (a consistent snapshot) and linearizable: etcd serves it through its leader's read
//!   index, so it sees every write acknowledged before it.
//! - [`Etcd::commit`]: `if <compares> then <writes>`. Every decision that changes state is
//!   one of these; the compares pin the revisions the decision was made on.
//!
//! A decision is read, decide locally, commit; when the commit's compares fail, another
//! node changed what we read, so we read again. [`MAX_ATTEMPTS`] bounds that loop, with a
//! short randomised pause between attempts so that racing nodes spread out.

use std::time::Duration;

use etcd_client::{Compare, GetResponse, KeyValue, Txn, TxnOp, TxnOpResponse};
use palisade_storage::StorageError;
use rand::Rng;

use crate::{Etcd, Resend};

/// Attempts of one read-decide-commit loop before giving up with `storage_failed`.
pub(crate) const MAX_ATTEMPTS: u32 = 64;

/// The results of a read-only transaction, one per get, in order.
pub(crate) struct Snapshot {
    /// The store revision the snapshot was taken at.
    pub revision: i64,
    results: Vec<GetResponse>,
}

impl Snapshot {
    /// The only (or first) key-value of the `i`th get, if it found one.
    pub(crate) fn first(&self, i: usize) -> Option<&KeyValue> {
        self.results.get(i).and_then(|r| r.kvs().first())
    }

    /// Every key-value of the `i`th get.
    pub(crate) fn all(&self, i: usize) -> &[KeyValue] {
        self.results.get(i).map_or(&[], |r| r.kvs())
    }

    /// The count reported by the `i`th get (for count-only gets).
    pub(crate) fn count(&self, i: usize) -> i64 {
        self.results.get(i).map_or(0, |r| r.count())
    }
}

impl Etcd {
    /// Runs `gets` in one read-only transaction.
    pub(crate) async fn read(
        &self,
        what: &str,
        gets: Vec<TxnOp>,
    ) -> Result<Snapshot, StorageError> {
        let wanted = gets.len();
        let txn = Txn::new().and_then(gets);
        let response = self
            .call(what, Resend::IfUnavailable, || {
                let (mut kv, txn) = (self.client.kv_client(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let mut results = Vec::with_capacity(wanted);
        for op in response.op_responses() {
            match op {
                TxnOpResponse::Get(get) => results.push(get),
                _ => break,
            }
        }
        if results.len() != wanted {
            return Err(StorageError::Failed(format!(
                "etcd {what}: expected {wanted} results, got {}",
                results.len()
            )));
        }
        Ok(Snapshot { revision, results })
    }

    /// Commits `writes` if every compare holds. `Some(revision)` when it committed (the
    /// store revision after the transaction), `None` when a compare failed (nothing was
    /// written).
    pub(crate) async fn commit(
        &self,
        what: &str,
        compares: Vec<Compare>,
        writes: Vec<TxnOp>,
    ) -> Result<Option<i64>, StorageError> {
        let txn = Txn::new().when(compares).and_then(writes);
        let started = std::time::Instant::now();
        let response = self
            .call(what, Resend::IfNeverReceived, || {
                let (mut kv, txn) = (self.client.kv_client(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await?;
        // Answered: etcd's quorum has decided it (and logged it, when it wrote).
        self.hook.committed(1, started.elapsed());
        if !response.succeeded() {
            return Ok(None);
        }
        response
            .header()
            .map(|h| Some(h.revision()))
            .ok_or_else(|| StorageError::Failed(format!("etcd {what}: answer without a header")))
    }
}

/// The error after [`MAX_ATTEMPTS`] lost races.
pub(crate) fn contended(what: &str) -> StorageError {
    StorageError::Contended(format!(
        "etcd {what}: still contended after {MAX_ATTEMPTS} attempts; try again"
    ))
}

/// A short random pause after a lost race, growing with the attempt number.
pub(crate) async fn backoff(attempt: u32) {
    let cap_ms = 1u64 << attempt.min(5);
    let ms = rand::thread_rng().gen_range(0..=cap_ms);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Reads a mod revision as the store's u64 revision (etcd's are positive i64).
pub(crate) fn revision(rev: i64) -> u64 {
    u64::try_from(rev).unwrap_or(0)
}
