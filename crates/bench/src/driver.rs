//! What every target's driver provides: a one-time preparation and one [`Worker`] per
//! client, each holding its own connection.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{BenchError, Job, Target};

/// How an operation ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done: counted in throughput and latency.
    Done,
    /// The lock was taken by someone else (`contended`): a failed attempt, not an error.
    Refused,
}

/// A failed operation, by a short stable code (the server's error code, a SQLSTATE, an
/// I/O class), so a report can count errors by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError {
    pub code: String,
}

impl OpError {
    pub fn new(code: impl Into<String>) -> Self {
        OpError { code: code.into() }
    }
}

/// One client: a connection and the job's loop body.
#[async_trait]
pub trait Worker: Send {
    /// Runs one operation of the job.
    async fn op(&mut self) -> Result<Outcome, OpError>;
    /// Leaves things tidy after the run (releases a lease held for the whole run).
    async fn finish(&mut self) {}
}

/// Everything a driver needs to know about one run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub target: Target,
    pub job: Job,
    pub url: String,
    pub clients: usize,
    /// Distinct locks in all, at least one per client.
    pub locks: usize,
    pub value: Bytes,
    pub wait_ms: u64,
    pub ttl_ms: u64,
    /// Unique to this run; every lock and key name starts with it.
    pub prefix: String,
    /// Bearer key for a Palisade server with an auth file.
    pub key: Option<String>,
}

/// Keys each client cycles through when writing, per lock.
pub const KEYS_PER_LOCK: usize = 64;

/// A lease ttl long enough to outlive any run, for the locks held throughout (`j2`).
pub const LONG_TTL_MS: u64 = 3_600_000;

/// How long a contended client that does not queue sleeps after a failed attempt.
pub const RETRY_SLEEP: std::time::Duration = std::time::Duration::from_millis(1);

/// A contended attempt that found the lock taken: not an error but a refusal, answered
/// after the client's pause before its next try ([`RETRY_SLEEP`], if it sleeps).
pub async fn refused(retry_sleep: bool) -> Outcome {
    if retry_sleep {
        tokio::time::sleep(RETRY_SLEEP).await;
    }
    Outcome::Refused
}

impl Plan {
    /// The locks of client `client`: every lock whose index is `client` modulo `clients`.
    pub fn locks_of(&self, client: usize) -> Vec<String> {
        (client..self.locks.max(self.clients))
            .step_by(self.clients.max(1))
            .map(|i| format!("{}-{i}", self.prefix))
            .collect()
    }

    /// The locks client `client` works on: the one lock of `contended`, its own otherwise.
    pub fn worker_locks(&self, client: usize) -> Vec<String> {
        match self.job {
            Job::Contended => vec![self.contended_lock()],
            _ => self.locks_of(client),
        }
    }

    /// The one lock of `contended`.
    pub fn contended_lock(&self) -> String {
        format!("{}-one", self.prefix)
    }

    /// Whether a refused client pauses before its next try: in `contended` without a queue
    /// wait (the peers' clients always do; a Palisade client that waits in line does not).
    pub fn sleeps_between_tries(&self) -> bool {
        self.job == Job::Contended && self.wait_ms == 0
    }

    /// The holder name client `client` acquires with.
    pub fn holder(&self, client: usize) -> String {
        format!("{}-client-{client}", self.prefix)
    }

    pub fn setup_error(&self, message: impl std::fmt::Display) -> BenchError {
        BenchError::Setup {
            target: self.target,
            message: message.to_string(),
        }
    }
}

/// One-time preparation of the target for this run (a schema, seed rows).
pub async fn prepare(plan: &Plan) -> Result<(), BenchError> {
    match plan.target {
        Target::Palisade => Ok(()),
        Target::Redis | Target::Etcd => Ok(()),
        Target::Postgres => crate::peers::postgres_prepare(plan).await,
    }
}

/// Connects the worker of client `client` and does its per-client setup.
pub async fn worker(plan: Arc<Plan>, client: usize) -> Result<Box<dyn Worker>, BenchError> {
    if plan.target == Target::Palisade && plan.job == Job::Plain {
        return Err(BenchError::Args(
            "Palisade has no unfenced write: use j2 for its durable write".to_string(),
        ));
    }
    if plan.target != Target::Palisade && plan.job == Job::Scale {
        return Err(BenchError::Args(
            "the scale job is for Palisade".to_string(),
        ));
    }
    match plan.target {
        Target::Palisade if is_resp(&plan.url) => resp_worker(plan, client).await,
        Target::Palisade => crate::palisade::worker(plan, client).await,
        Target::Redis => crate::peers::redis_worker(plan, client).await,
        Target::Postgres => crate::peers::postgres_worker(plan, client).await,
        Target::Etcd => crate::peers::etcd_worker(plan, client).await,
    }
}

/// A Palisade URL of its RESP listener (`redis://`, `rediss://`).
fn is_resp(url: &str) -> bool {
    url.starts_with("redis://") || url.starts_with("rediss://")
}

#[allow(unused_variables)]
async fn resp_worker(plan: Arc<Plan>, client: usize) -> Result<Box<dyn Worker>, BenchError> {
    #[cfg(feature = "peers")]
    return crate::resp::worker(plan, client).await;
    #[cfg(not(feature = "peers"))]
    Err(BenchError::NotBuilt {
        target: Target::Palisade,
        feature: "peers",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(clients: usize, locks: usize) -> Plan {
        Plan {
            target: Target::Palisade,
            job: Job::J1,
            url: String::new(),
            clients,
            locks,
            value: Bytes::new(),
            wait_ms: 0,
            ttl_ms: 1000,
            prefix: "p".into(),
            key: None,
        }
    }

    #[test]
    fn locks_are_shared_out_without_overlap() {
        let p = plan(3, 8);
        let all: Vec<String> = (0..3).flat_map(|c| p.locks_of(c)).collect();
        assert_eq!(all.len(), 8);
        let mut unique = all.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 8);
        assert_eq!(p.locks_of(0), ["p-0", "p-3", "p-6"]);
        // Fewer locks than clients still gives every client one.
        assert_eq!(plan(4, 1).locks_of(3), ["p-3"]);
    }
}
