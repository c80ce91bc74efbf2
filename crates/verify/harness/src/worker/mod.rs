//! One worker process (`palisade verify-worker`, started by `palisade verify`).
//!
//! A worker is an ordinary client of Palisade, built on `palisade-client` as a user's
//! service would be: it acquires a lease, keeps it alive in the background, and sends
//! fenced writes carrying its token. It loops over its workload until the stop time and
//! records every call in its own history file ([`Recorder`]). It judges nothing.
//!
//! Where the deployment has several nodes (etcd3), the worker knows all of them and does
//! its own failover between them (`worker/nodes.rs`): `palisade-client` talks to one server. The
//! lease's keepalives fail over the same way, so a holder does not lose its lease only
//! because its node died. For the etcd-lock controls the worker takes etcd's own lock
//! instead (`worker/etcd_lock.rs`).
//!
//! Deliberately, a worker never consults its own view of the lease before writing: that
//! check is racy anyway (the process can pause right after it), and skipping it sends the
//! resource every late write a paused or delayed holder can produce, which is what the run
//! is meant to test. After a fault the worker simply carries on with its current
//! iteration, as a holder that did not notice would.

mod etcd_lock;
mod nodes;
mod workloads;

use std::time::Duration;

use palisade_checker::OpKind;
use palisade_client::{AcquireOptions, Client, Error};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use crate::args::{LockProtocol, WorkerArgs, Workload};
use crate::clock::RunClock;
use crate::record::Recorder;
use crate::VerifyError;

pub(crate) use etcd_lock::EtcdGateway;
pub(crate) use nodes::{unanswered, CallError, Nodes};

/// Where a worker takes its locks.
enum Locks {
    Palisade(Nodes),
    Etcd(EtcdGateway),
}

/// A lock this worker holds (or believes it holds).
pub(crate) struct Held {
    lock: String,
    epoch: u64,
    token: String,
    release: Release,
    /// Renews the lease in the background; aborted on release or drop.
    keeper: JoinHandle<()>,
}

enum Release {
    Palisade { lease_id: String },
    Etcd { lease: i64 },
}

impl Held {
    pub fn lock(&self) -> &str {
        &self.lock
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn token(&self) -> &str {
        &self.token
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// Everything one worker owns.
pub(crate) struct Worker {
    pub id: u64,
    locks: Locks,
    pub store: Nodes,
    pub rec: Recorder,
    pub rng: StdRng,
    pub ttl: Duration,
    pub stop_at_us: u64,
    pub holder: String,
    /// Counter making every written value and lock-set element unique.
    pub next_value: u64,
    /// Counter making every idempotency key unique.
    next_request: u64,
}

/// One client per URL, authenticating with the key in `PALISADE_KEY` when the harness
/// gave one (`palisade verify --auth`).
fn clients(urls: &[String]) -> Result<Vec<Client>, VerifyError> {
    let key = std::env::var(crate::auth::KEY_ENV).ok();
    urls.iter()
        .map(|url| {
            let mut builder = Client::builder(url);
            if let Some(key) = &key {
                builder = builder.bearer_key(key.clone());
            }
            builder
                .build()
                .map_err(|e| VerifyError::Config(format!("bad URL {url:?}: {e}")))
        })
        .collect()
}

/// Runs one worker until its stop time.
pub async fn run(args: WorkerArgs) -> Result<(), VerifyError> {
    if args.lock_urls.is_empty() || args.store_urls.is_empty() {
        return Err(VerifyError::Config(
            "a worker needs lock and store URLs".into(),
        ));
    }
    let clock = RunClock::from_origin(args.clock_origin_ns);
    let home = usize::try_from(args.id.saturating_sub(1)).unwrap_or(0);
    let locks = match args.lock_protocol {
        LockProtocol::Palisade => Locks::Palisade(Nodes::new(clients(&args.lock_urls)?, home)),
        LockProtocol::Etcd => Locks::Etcd(
            EtcdGateway::new(args.lock_urls.clone(), home)
                .map_err(|e| VerifyError::Config(format!("etcd gateway client: {e}")))?,
        ),
    };
    let mut w = Worker {
        id: args.id,
        locks,
        store: Nodes::new(clients(&args.store_urls)?, home),
        rec: Recorder::create(&args.history, args.id, clock)?,
        rng: StdRng::seed_from_u64(args.seed),
        ttl: Duration::from_millis(args.ttl_ms),
        stop_at_us: args.stop_at_us,
        holder: format!("w{}", args.id),
        next_value: 0,
        next_request: 0,
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

/// Renews a Palisade lease every `ttl / 3`, failing over between nodes, until the server
/// says it is gone (or the task is aborted).
async fn keep_alive(nodes: Nodes, lease_id: String, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let id = lease_id.clone();
        let renewed = nodes
            .call(|c| {
                let id = id.clone();
                async move { c.keepalive(&id).await }
            })
            .await;
        if matches!(renewed, Err(ref e) if matches!(e.error, Error::LeaseExpired)) {
            return;
        }
    }
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

    /// A fresh idempotency key: the same on every attempt of one write, never reused.
    pub fn idempotency_key(&mut self) -> String {
        self.next_request += 1;
        format!(
            "w{}-r{}-{:x}",
            self.id,
            self.next_request,
            self.rng.gen::<u32>()
        )
    }

    async fn take(&self, lock: &str) -> Result<Held, CallError> {
        let wait = self.ttl * 3;
        match &self.locks {
            Locks::Palisade(nodes) => {
                let opts = AcquireOptions {
                    ttl: self.ttl,
                    wait: Some(wait),
                    ..AcquireOptions::default()
                };
                let holder = self.holder.clone();
                let lease = nodes
                    .call(|c| {
                        let (lock, holder, opts) = (lock.to_owned(), holder.clone(), opts.clone());
                        async move { c.acquire_raw(&lock, &holder, opts).await }
                    })
                    .await?;
                let keeper = tokio::spawn(keep_alive(
                    nodes.clone(),
                    lease.lease_id.clone(),
                    self.ttl / 3,
                ));
                Ok(Held {
                    lock: lease.lock,
                    epoch: lease.epoch,
                    token: lease.token,
                    release: Release::Palisade {
                        lease_id: lease.lease_id,
                    },
                    keeper,
                })
            }
            Locks::Etcd(etcd) => {
                let held = etcd.acquire(lock, &self.holder, self.ttl, wait).await?;
                Ok(Held {
                    lock: lock.to_owned(),
                    epoch: held.revision,
                    token: etcd_lock::revision_token(lock, &self.holder, held.revision),
                    release: Release::Etcd { lease: held.lease },
                    keeper: held.keeper,
                })
            }
        }
    }

    /// Acquires `lock` (queueing a while), recording the attempt. `None` if not granted.
    pub async fn acquire(&mut self, lock: &str) -> Result<Option<Held>, VerifyError> {
        let mut flight = self.rec.invoke(OpKind::Acquire, |op| op.lock(lock))?;
        match self.take(lock).await {
            Ok(held) => {
                flight.op.epoch = Some(held.epoch);
                self.rec.ok(flight)?;
                Ok(Some(held))
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
    pub async fn release(&mut self, held: Held) -> Result<(), VerifyError> {
        held.keeper.abort();
        let flight = self
            .rec
            .invoke(OpKind::Release, |op| op.lock(&held.lock).epoch(held.epoch))?;
        let released = match (&held.release, &self.locks) {
            (Release::Palisade { lease_id }, Locks::Palisade(nodes)) => {
                nodes
                    .call(|c| {
                        let id = lease_id.clone();
                        async move { c.release(&id).await }
                    })
                    .await
            }
            (Release::Etcd { lease }, Locks::Etcd(etcd)) => etcd.revoke(*lease).await,
            _ => Err(CallError::from(Error::BadRequest(
                "lease and lock service do not match".into(),
            ))),
        };
        match released {
            Ok(()) => self.rec.ok(flight),
            Err(e) => self.rec.error(flight, &e),
        }
    }
}

#[cfg(test)]
mod tests;
