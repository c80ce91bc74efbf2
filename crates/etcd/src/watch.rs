//! What an etcd node tells its [`LeaseObserver`]: every grant and every end of a lease in
//! the deployment, whichever node made it, read from an etcd watch on the holder keys.
//!
//! - A holder key created (`P holder/<lock>`, version 1) is a grant: [`LeaseChange::Granted`].
//!   Rewrites of the key (a new lock value) are not changes of the lease.
//! - A holder key deleted ends the lease. etcd deletes a lease's keys the same way when
//!   the lease is revoked and when it runs out, so a node can tell only its own
//!   releases: a lease this node was asked to release (or whose session it was asked to
//!   close) is [`LeaseChange::Released`]; every other end, an expiry or a release
//!   through another node, is [`LeaseChange::Ended`].
//!
//! The watch delivers in etcd's revision order, which is the order of the decisions,
//! the same on every node. When the watch breaks (etcd member lost, leader change) it is
//! opened again from the revision after the last one seen, so nothing is missed; if etcd
//! has compacted that history away, the observer is told of a gap
//! ([`LeaseObserver::gap`]) and the watch starts again from now.
//!
//! [`census`]: live leases and waiters of the whole deployment, counted by etcd (two
//! count-only reads in one transaction).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{EventType, GetOptions, TxnOp, WatchOptions};
use palisade_issuer::{Census, LeaseChange, LeaseEvent, LeaseObserver};

use crate::keys::{from_json, HolderRecord};
use crate::Etcd;

/// Lease ids remembered as released by this node, at most; more are reported `Ended`.
const MAX_RELEASING: usize = 4096;
/// How long a release is remembered if its deletion is never seen (the release failed).
const RELEASING_FOR: Duration = Duration::from_secs(60);

/// The watch task of one issuer and the releases it is to recognise.
#[derive(Default)]
pub(crate) struct Watcher {
    releasing: Arc<Mutex<HashMap<String, Instant>>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

impl Watcher {
    /// This node is about to release `lease_id`.
    pub(crate) fn releasing(&self, lease_id: &str) {
        let mut set = self
            .releasing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if set.len() >= MAX_RELEASING {
            set.retain(|_, at| at.elapsed() < RELEASING_FOR);
        }
        if set.len() < MAX_RELEASING {
            set.insert(lease_id.to_owned(), Instant::now());
        }
    }

    /// Starts reporting to `observer` (replacing an earlier one). Needs a Tokio runtime;
    /// without one nothing is reported.
    pub(crate) fn start(&self, etcd: Etcd, observer: Arc<dyn LeaseObserver>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no runtime: lease changes are not observed");
            return;
        };
        let releasing = self.releasing.clone();
        let task = runtime.spawn(follow(etcd, observer, releasing));
        if let Some(old) = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(task)
        {
            old.abort();
        }
    }
}

/// Follows the holder keys for as long as the issuer lives.
async fn follow(
    etcd: Etcd,
    observer: Arc<dyn LeaseObserver>,
    releasing: Arc<Mutex<HashMap<String, Instant>>>,
) {
    // The next revision to see; 0 until the first watch is open.
    let mut next: i64 = 0;
    let mut pause = Duration::from_millis(50);
    loop {
        if next == 0 {
            match etcd.read("watch start", vec![]).await {
                Ok(snap) => next = snap.revision + 1,
                Err(e) => {
                    tracing::debug!(error = %e, "lease watch: etcd does not answer yet");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                    continue;
                }
            }
        }
        let options = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_start_revision(next);
        let opened = etcd
            .client
            .watch_client()
            .watch(etcd.keys.holder_prefix(), Some(options))
            .await;
        let mut stream = match opened {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "lease watch could not be opened; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        loop {
            let message = match stream.message().await {
                Ok(Some(message)) => message,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "lease watch broke off; resuming");
                    break;
                }
            };
            pause = Duration::from_millis(50);
            if message.compact_revision() > 0 {
                // The history we needed is gone: say so, and start again from now.
                tracing::warn!(
                    compacted = message.compact_revision(),
                    "lease watch resumed after etcd compacted its history: changes missed"
                );
                observer.gap();
                next = 0;
                break;
            }
            if message.canceled() {
                tracing::debug!(reason = message.cancel_reason(), "lease watch cancelled");
                break;
            }
            for event in message.events() {
                if let Some(kv) = event.kv() {
                    next = next.max(kv.mod_revision() + 1);
                }
                report(&*observer, &releasing, event);
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

fn report(
    observer: &dyn LeaseObserver,
    releasing: &Mutex<HashMap<String, Instant>>,
    event: &etcd_client::Event,
) {
    let (change, kv) = match event.event_type() {
        EventType::Put => match event.kv() {
            Some(kv) if kv.version() == 1 => (LeaseChange::Granted, kv),
            _ => return,
        },
        EventType::Delete => match event.prev_kv() {
            Some(kv) => (LeaseChange::Ended, kv),
            None => return,
        },
    };
    let record: HolderRecord = match from_json(kv.key(), kv.value()) {
        Ok(record) => record,
        Err(e) => {
            tracing::warn!(error = %e, "lease watch: unreadable holder record skipped");
            return;
        }
    };
    let change = match change {
        LeaseChange::Ended => {
            let mine = releasing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&record.lease_id)
                .is_some();
            if mine {
                LeaseChange::Released
            } else {
                LeaseChange::Ended
            }
        }
        other => other,
    };
    observer.lease_event(&LeaseEvent {
        change,
        lock: &record.lock,
        holder: &record.holder,
        epoch: record.epoch,
        lease_id: &record.lease_id,
        ttl_ms: record.ttl_ms,
    });
}

/// Live leases (holder keys) and waiters (waiter keys) of the deployment; `None` if etcd
/// does not answer.
pub(crate) async fn census(etcd: &Etcd) -> Option<Census> {
    let count = || Some(GetOptions::new().with_prefix().with_count_only());
    let gets = vec![
        TxnOp::get(etcd.keys.holder_prefix(), count()),
        TxnOp::get(etcd.keys.waiters_prefix(), count()),
    ];
    let snap = etcd.read("census", gets).await.ok()?;
    Some(Census {
        leases: u64::try_from(snap.count(0)).unwrap_or(0),
        waiters: u64::try_from(snap.count(1)).unwrap_or(0),
    })
}
