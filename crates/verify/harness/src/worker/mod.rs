//! One worker process (`palisade verify-worker`, started by `palisade verify`).
//!
//! A worker is an ordinary client of Palisade, built on `palisade-client` exactly as a
//! user's service would be: a [`LeaseGuard`] with background keepalive, and a fenced store
//! handle carrying its token. It loops over its workload until the stop time and records
//! every call in its own history file ([`Recorder`]). It judges nothing.
//!
//! Deliberately, a worker never consults its own view of the lease before writing
//! ([`LeaseGuard::is_lost`]): that check is racy anyway (the process can pause right after
//! it), and skipping it sends the resource every late write a paused or delayed holder
//! can produce, which is what the run is meant to test. After a fault the worker simply
//! carries on with its current iteration, as a holder that did not notice would.

mod workloads;

use std::time::Duration;

use palisade_checker::OpKind;
use palisade_client::{AcquireOptions, Client, LeaseGuard};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::args::{WorkerArgs, Workload};
use crate::clock::RunClock;
use crate::record::Recorder;
use crate::VerifyError;

/// Everything one worker owns.
pub(crate) struct Worker {
    pub id: u64,
    pub locks: Client,
    pub store: Client,
    pub rec: Recorder,
    pub rng: StdRng,
    pub ttl: Duration,
    pub stop_at_us: u64,
    pub holder: String,
    /// Counter making every written value and lock-set element unique.
    pub next_value: u64,
}

/// Runs one worker until its stop time.
pub async fn run(args: WorkerArgs) -> Result<(), VerifyError> {
    let client = |url: &str| {
        Client::new(url).map_err(|e| VerifyError::Config(format!("bad URL {url:?}: {e}")))
    };
    let clock = RunClock::from_origin(args.clock_origin_ns);
    let mut w = Worker {
        id: args.id,
        locks: client(&args.lock_url)?,
        store: client(&args.store_url)?,
        rec: Recorder::create(&args.history, args.id, clock)?,
        rng: StdRng::seed_from_u64(args.seed),
        ttl: Duration::from_millis(args.ttl_ms),
        stop_at_us: args.stop_at_us,
        holder: format!("w{}", args.id),
        next_value: 0,
    };
    while clock.now_us() < w.stop_at_us {
        match args.workload {
            Workload::LockSet => workloads::lock_set(&mut w).await?,
            Workload::Register => workloads::register(&mut w).await?,
            Workload::Tokens => workloads::tokens(&mut w).await?,
        }
    }
    Ok(())
}

impl Worker {
    /// A fraction of the TTL, randomised within `[lo, hi)` of it.
    pub fn ttl_fraction(&mut self, lo: f64, hi: f64) -> Duration {
        self.ttl.mul_f64(self.rng.gen_range(lo..hi))
    }

    pub fn unique_value(&mut self) -> String {
        self.next_value += 1;
        format!("w{}-{}", self.id, self.next_value)
    }

    /// Acquires `lock` (queueing a while), recording the attempt. `None` if not granted.
    pub async fn acquire(&mut self, lock: &str) -> Result<Option<LeaseGuard>, VerifyError> {
        let opts = AcquireOptions {
            ttl: self.ttl,
            wait: Some(self.ttl * 3),
        };
        let mut flight = self.rec.invoke(OpKind::Acquire, |op| op.lock(lock))?;
        match self.locks.acquire(lock, &self.holder, opts).await {
            Ok(guard) => {
                flight.op.epoch = Some(guard.epoch());
                self.rec.ok(flight)?;
                Ok(Some(guard))
            }
            Err(e) => {
                self.rec.error(flight, &e)?;
                // Let the lock pass, or the server come back, before asking again.
                let pause = self.ttl_fraction(0.1, 0.4);
                tokio::time::sleep(pause).await;
                Ok(None)
            }
        }
    }

    /// Releases the lease, recording the attempt.
    pub async fn release(&mut self, guard: LeaseGuard) -> Result<(), VerifyError> {
        let lock = guard.lock().to_owned();
        let epoch = guard.epoch();
        let flight = self
            .rec
            .invoke(OpKind::Release, |op| op.lock(&lock).epoch(epoch))?;
        match guard.release().await {
            Ok(()) => self.rec.ok(flight),
            Err(e) => self.rec.error(flight, &e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_worker_past_its_stop_time_does_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let history = dir.path().join("w1.jsonl");
        let args = WorkerArgs {
            id: 1,
            lock_url: "http://127.0.0.1:1".into(),
            store_url: "http://127.0.0.1:1".into(),
            workload: Workload::Tokens,
            ttl_ms: 100,
            seed: 1,
            history: history.clone(),
            clock_origin_ns: crate::clock::monotonic_ns(),
            stop_at_us: 0,
        };
        run(args).await.unwrap();
        assert_eq!(std::fs::read_to_string(history).unwrap(), "");
    }
}
