//! The nemesis: injects faults on a random schedule drawn from the run's seed.
//!
//! Faults come one at a time, separated by a quiet gap. The schedule goes in rounds: each
//! round is a shuffled list of the enabled fault kinds (pauses and delays twice, except in
//! the first round), so a 20 s run with the default TTL injects every kind at least once
//! (the first round takes at most 14 TTL, plus the time a restart takes). Faults aimed
//! at one worker target the current holder of a lock nine times in ten (a pause of a
//! worker that is merely queueing proves little), found by asking the lock service
//! directly, not through the proxies.
//!
//! Durations are multiples of the lease TTL: pauses, partitions and delays outlast it, so
//! the victim's lease expires and another worker gets a newer epoch while the victim
//! still believes it holds the lock. Every fault is healed before the next one starts and
//! before the nemesis returns.
//!
//! Worker faults (pause, delay, drop, partition) are applied here. Faults of the
//! deployment's own processes and files (kill, disk, etcd-kill, etcd-pause,
//! node-partition) are handed to the [`Deployment`] with a [`Hit`] drawn here, so the
//! whole schedule, durations and victims included, comes from the seed.

use std::sync::Arc;
use std::time::Duration;

use indicatif::ProgressBar;
use palisade_client::Client;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde::Serialize;

use crate::args::FaultKind;
use crate::clock::RunClock;
use crate::deploy::{Deployment, Hit};
use crate::procs::WorkerProc;
use crate::proxy::Link;
use crate::worker::EtcdGateway;
use crate::VerifyError;

/// Bound on the holder lookup, so a dead server does not stall the schedule.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// One injected fault, in run-clock microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub kind: FaultKind,
    /// The worker it targeted; `None` for faults of the whole deployment.
    pub worker: Option<u64>,
    pub start: u64,
    pub end: u64,
    pub detail: String,
}

/// What the nemesis acts on.
pub struct Nemesis<'a> {
    pub rng: StdRng,
    pub kinds: Vec<FaultKind>,
    pub ttl: Duration,
    pub clock: RunClock,
    pub deployment: &'a mut dyn Deployment,
    pub workers: &'a mut [WorkerProc],
    /// `links[i]` is the proxy link of `workers[i]`.
    pub links: &'a [Arc<Link>],
    /// Straight to the lock service (not through the proxies), for finding holders.
    pub(crate) probe: Probe,
    pub locks: &'static [&'static str],
    pub progress: &'a ProgressBar,
    pub faults: Vec<FaultRecord>,
    /// Times of server kills, for the history's restart markers.
    pub restarts: Vec<u64>,
}

/// How the nemesis finds the current holder of a lock.
pub(crate) enum Probe {
    /// Palisade's lock status, from the first node that answers.
    Palisade(Vec<Client>),
    /// The first key in line of etcd's lock recipe.
    Etcd(EtcdGateway),
}

impl Probe {
    /// (holder name, epoch) of `lock`'s current holder, if one is found.
    async fn holder(&self, lock: &str) -> Option<(String, u64)> {
        match self {
            Probe::Palisade(nodes) => {
                for node in nodes {
                    let status = tokio::time::timeout(PROBE_TIMEOUT, node.lock_status(lock)).await;
                    if let Ok(Ok(status)) = status {
                        return status.holder.map(|h| (h, status.epoch));
                    }
                }
                None
            }
            Probe::Etcd(etcd) => {
                let owner = tokio::time::timeout(PROBE_TIMEOUT, etcd.owner(lock)).await;
                match owner {
                    Ok(Ok(Some((revision, holder)))) => Some((holder, revision)),
                    _ => None,
                }
            }
        }
    }
}

impl Nemesis<'_> {
    /// Injects faults until `end_us`, then returns with everything healed.
    pub async fn run(&mut self, end_us: u64) -> Result<(), VerifyError> {
        let mut round: Vec<FaultKind> = Vec::new();
        loop {
            let gap = self.ttl_times(0.3, 1.0);
            if !self.sleep_within(gap, end_us).await {
                return Ok(());
            }
            if round.is_empty() {
                round = self.round();
            }
            let Some(kind) = round.pop() else {
                continue; // no faults enabled: just wait out the run
            };
            // After a restart the server holds back grants for a TTL (leases from before
            // the crash are honoured), so its newest commit is its own start-up commit
            // for a while. Give the workload time to commit before damaging "the newest
            // commit", or the disk fault would mostly test the start-up commit.
            if kind == FaultKind::Disk {
                let settle = self.ttl_times(2.0, 3.0);
                if !self.sleep_within(settle, end_us).await {
                    return Ok(());
                }
            }
            self.inject(kind, end_us).await?;
        }
    }

    /// One round of the schedule: every enabled kind once and, after the first round
    /// (kept short so that short runs see every kind), pauses and delays twice: they are
    /// the faults that make two workers hold a lock at once (the others mostly cost a
    /// worker its lease or its connection).
    fn round(&mut self) -> Vec<FaultKind> {
        let mut round = self.kinds.clone();
        let first = self.faults.is_empty();
        for twice in [FaultKind::Pause, FaultKind::Delay] {
            if self.kinds.contains(&twice) && !first {
                round.push(twice);
            }
        }
        round.shuffle(&mut self.rng);
        round
    }

    async fn inject(&mut self, kind: FaultKind, end_us: u64) -> Result<(), VerifyError> {
        let start = self.clock.now_us();
        let limit = Duration::from_micros(end_us.saturating_sub(start));
        let (worker, detail) = match kind {
            _ if !kind.is_worker_fault() => {
                let (lo, hi) = match kind {
                    FaultKind::Kill | FaultKind::Disk => (0.2, 1.0),
                    FaultKind::EtcdKill | FaultKind::DbKill | FaultKind::DbPowerLoss => (0.5, 1.5),
                    // Long enough for whole lock cycles to commit on the primary while its
                    // replica is cut off: what an asynchronous replica then lacks.
                    FaultKind::DbFailover => (2.0, 4.0),
                    _ => (1.5, 3.0),
                };
                let hit = Hit {
                    span: self.ttl_times(lo, hi).min(limit),
                    pick: self.rng.gen(),
                };
                self.progress.set_message(format!("{kind}: in progress"));
                let done = self.deployment.fault(kind, hit).await?;
                if done.crashed {
                    self.restarts.push(start);
                }
                (None, done.detail)
            }
            _ => {
                let (i, why) = self.pick_victim().await;
                let id = self.workers[i].id;
                let detail = self.hit_worker(kind, i, limit).await;
                (Some(id), format!("{detail}{why}"))
            }
        };
        let record = FaultRecord {
            kind,
            worker,
            start,
            end: self.clock.now_us(),
            detail,
        };
        self.progress.set_message(format!(
            "{} faults, last: {} {}",
            self.faults.len() + 1,
            record.kind,
            record
                .worker
                .map_or("deployment".into(), |w| format!("w{w}"))
        ));
        self.faults.push(record);
        Ok(())
    }

    /// Applies a worker-level fault to `workers[i]` and heals it; returns a description.
    async fn hit_worker(&mut self, kind: FaultKind, i: usize, limit: Duration) -> String {
        let link = self.links[i].clone();
        match kind {
            FaultKind::Pause => {
                let span = self.ttl_times(1.5, 3.0).min(limit);
                if let Err(e) = self.workers[i].stop() {
                    return format!("SIGSTOP failed: {e}");
                }
                tokio::time::sleep(span).await;
                // A worker that cannot be resumed has exited; the reaper reports it.
                let _ = self.workers[i].resume();
                format!("SIGSTOP for {} ms", span.as_millis())
            }
            FaultKind::Delay => {
                let hold = self.ttl_times(1.5, 2.5);
                let window = self.ttl_times(1.0, 2.0).min(limit);
                link.set_delay(hold);
                tokio::time::sleep(window).await;
                link.set_delay(Duration::ZERO);
                format!(
                    "requests sent during {} ms held {} ms each",
                    window.as_millis(),
                    hold.as_millis()
                )
            }
            FaultKind::Drop => {
                link.drop_connections();
                "open connections cut".into()
            }
            FaultKind::Partition => {
                let span = self.ttl_times(1.5, 3.0).min(limit);
                link.partition();
                tokio::time::sleep(span).await;
                link.heal();
                format!("traffic refused for {} ms", span.as_millis())
            }
            other => format!("{other} is not a worker fault"),
        }
    }

    /// The index of the worker to hit, preferring a current lock holder.
    async fn pick_victim(&mut self) -> (usize, String) {
        if self.rng.gen_bool(0.9) {
            let lock = self.locks[self.rng.gen_range(0..self.locks.len())];
            if let Some((holder, epoch)) = self.probe.holder(lock).await {
                let id = holder.strip_prefix('w').and_then(|h| h.parse::<u64>().ok());
                if let Some(i) = id.and_then(|id| self.workers.iter().position(|w| w.id == id)) {
                    return (i, format!(" (holder of {lock}, epoch {epoch})"));
                }
            }
        }
        (self.rng.gen_range(0..self.workers.len()), String::new())
    }

    fn ttl_times(&mut self, lo: f64, hi: f64) -> Duration {
        self.ttl.mul_f64(self.rng.gen_range(lo..hi))
    }

    /// Sleeps `d` unless that would pass `end_us`; false if there is no time left.
    async fn sleep_within(&self, d: Duration, end_us: u64) -> bool {
        let now = self.clock.now_us();
        let d_us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        if now.saturating_add(d_us) >= end_us {
            tokio::time::sleep(Duration::from_micros(end_us.saturating_sub(now))).await;
            return false;
        }
        tokio::time::sleep(d).await;
        true
    }
}
