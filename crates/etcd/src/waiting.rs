//! Waiting in line for a lock across nodes, and the etcd leases this module hands out.
//!
//! The line is etcd's lock recipe: each waiter puts a key under `P wait/<lock>/`, and
//! waiters are served in the order of those keys' create revisions, whichever node they
//! arrived at. The head of the line takes the lock with the acquisition transaction of
//! [`crate::issuer`], which also checks that no older waiter key exists and deletes ours.
//! Everyone else watches the holder key and the line for deletions and looks again when
//! one happens, or gives up when `wait_ms` runs out.
//!
//! A waiter key is attached to a short lease of its own ([`WAITER_TTL_S`]) that this node
//! keeps alive while the request waits. If the node crashes, the key vanishes within that
//! TTL and the line moves on; if the request is dropped or times out, the lease is revoked
//! at once, which deletes the key.

use std::time::Duration;

use etcd_client::{PutOptions, WatchFilterType, WatchOptions};
use palisade_issuer::{Acquire, AcquireError};
use palisade_storage::StorageError;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::storage;
use crate::grantable::Asker;
use crate::issuer::EtcdIssuer;
use crate::keys::HolderRecord;
use crate::recipes::Plan;
use crate::txn::{backoff, contended, MAX_ATTEMPTS};
use crate::{Etcd, Resend};

/// TTL of a waiter key's lease, in seconds (etcd raises it to its minimum). Short, so a
/// crashed node's waiters leave the line quickly; renewed three times per TTL.
pub(crate) const WAITER_TTL_S: i64 = 1;

/// An etcd lease this node granted. Revoked when dropped unless [`EtcdLease::keep`] was
/// called, so a lease whose acquisition failed, or whose request went away, is not left
/// holding anything.
pub(crate) struct EtcdLease {
    etcd: Etcd,
    id: i64,
    ttl_s: i64,
    /// A task renewing the lease (waiter leases only).
    renewer: Option<JoinHandle<()>>,
    keep: bool,
}

impl EtcdLease {
    /// Grants a lease; etcd may raise the TTL to its minimum, and [`Self::ttl_ms`] reports
    /// the TTL actually granted.
    pub(crate) async fn grant(etcd: &Etcd, ttl_s: i64) -> Result<EtcdLease, StorageError> {
        let answer = etcd
            .call("grant lease", Resend::IfUnavailable, || {
                let mut client = etcd.client.lease_client();
                async move { client.grant(ttl_s, None).await }
            })
            .await?;
        if !answer.error().is_empty() {
            return Err(StorageError::Failed(format!(
                "etcd grant lease: {}",
                answer.error()
            )));
        }
        Ok(EtcdLease {
            etcd: etcd.clone(),
            id: answer.id(),
            ttl_s: answer.ttl().max(ttl_s),
            renewer: None,
            keep: false,
        })
    }

    /// A lease this request did not grant and must not revoke (a session's): dropping the
    /// handle leaves it alone.
    pub(crate) fn borrowed(etcd: &Etcd, id: i64, ttl_s: i64) -> EtcdLease {
        EtcdLease {
            etcd: etcd.clone(),
            id,
            ttl_s,
            renewer: None,
            keep: true,
        }
    }

    pub(crate) fn id(&self) -> i64 {
        self.id
    }

    pub(crate) fn ttl_s(&self) -> i64 {
        self.ttl_s
    }

    pub(crate) fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl_s).map_or(0, |s| s * 1000)
    }

    /// Keeps the lease alive from a background task until dropped.
    fn renew_in_background(&mut self) {
        let etcd = self.etcd.clone();
        let id = self.id;
        let every = Duration::from_millis(self.ttl_ms() / 3).max(Duration::from_millis(100));
        self.renewer = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let renew = etcd.call("renew waiter lease", Resend::IfUnavailable, || {
                    let mut client = etcd.client.lease_client();
                    async move { client.keep_alive(id).await }
                });
                if let Err(e) = renew.await {
                    tracing::warn!(error = %e, "cannot renew a waiter's lease");
                }
            }
        }));
    }

    /// The lease now belongs to a holder: do not revoke it on drop.
    pub(crate) fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for EtcdLease {
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        if self.keep {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // No runtime left: the lease expires by itself.
        };
        let etcd = self.etcd.clone();
        let id = self.id;
        runtime.spawn(async move {
            // Best effort: an unrevoked lease only lives until its TTL runs out.
            let revoke = etcd.call("revoke lease", Resend::IfUnavailable, || {
                let mut client = etcd.client.lease_client();
                async move { client.revoke(id).await }
            });
            let _ = revoke.await;
        });
    }
}

/// Queues for `req.lock` and takes it when our turn comes, or answers `lock_held` when
/// `wait` runs out first.
pub(crate) async fn acquire_in_line(
    issuer: &EtcdIssuer,
    req: &Acquire,
    plan: &Plan,
    wait: Duration,
) -> Result<HolderRecord, AcquireError> {
    let deadline = Instant::now() + wait;
    let etcd = &issuer.etcd;
    let ours = etcd.keys.waiter(&req.lock, &req.lease_id);
    let session = plan.session.as_ref().map(|s| s.session_id.as_str());
    let mut place = Place::join(etcd, req, &ours).await?;
    let mut leases: Option<(EtcdLease, Option<EtcdLease>)> = None;
    let mut lost_races = 0;
    loop {
        let snap = issuer.read_lock(&req.lock, Some(&ours), session).await?;
        if !snap.session_alive {
            // The session ended while we waited: out of line (dropping our place).
            return Err(AcquireError::NoSession);
        }
        if !snap.queued && Instant::now() < deadline {
            // Our waiter lease lapsed (etcd was out of reach for longer than its TTL):
            // join again, at the back of the line.
            place = Place::join(etcd, req, &ours).await?;
            continue;
        }
        let created = place.created;
        let asker = Asker::InLine {
            key: &ours,
            created,
        };
        if snap.blocked(asker).is_none() {
            let queued = Some((ours.as_slice(), created));
            if let Some(record) = issuer
                .grant_with(&mut leases, req, plan, &snap, queued)
                .await?
            {
                return Ok(record);
            }
            lost_races += 1;
            if lost_races >= MAX_ATTEMPTS {
                return Err(contended("acquire from the line").into());
            }
            backoff(lost_races).await;
            continue;
        }
        if Instant::now() >= deadline {
            let holder = snap.holder.as_ref().map(|h| h.holder.clone());
            return Err(AcquireError::Held {
                holder,
                retry_after_ms: 0,
            });
        }
        wait_for_change(etcd, &req.lock, session, snap.revision, deadline).await?;
    }
}

/// Our key in the line, attached to its own short, renewed lease (revoked on drop).
struct Place {
    _lease: EtcdLease,
    created: i64,
}

impl Place {
    async fn join(etcd: &Etcd, req: &Acquire, key: &[u8]) -> Result<Place, StorageError> {
        let mut lease = EtcdLease::grant(etcd, WAITER_TTL_S).await?;
        lease.renew_in_background();
        let id = lease.id();
        let answer = etcd
            .call("join the line", Resend::IfNeverReceived, || {
                let mut kv = etcd.client.kv_client();
                let (key, holder) = (key.to_vec(), req.holder.clone());
                let attached = PutOptions::new().with_lease(id);
                async move { kv.put(key, holder, Some(attached)).await }
            })
            .await?;
        Ok(Place {
            _lease: lease,
            created: answer.header().map_or(0, |h| h.revision()),
        })
    }
}

/// Returns after the holder key, the lock-delay marker or a waiter key of `lock` (or the
/// key of `session`) was deleted after `revision`, or at `deadline`.
async fn wait_for_change(
    etcd: &Etcd,
    lock: &str,
    session: Option<&str>,
    revision: i64,
    deadline: Instant,
) -> Result<(), StorageError> {
    let deletions = || {
        WatchOptions::new()
            .with_start_revision(revision + 1)
            .with_filters([WatchFilterType::NoPut])
    };
    let holder = etcd.keys.holder(lock);
    let watch = etcd.call("watch", Resend::IfUnavailable, || {
        let (mut client, holder) = (etcd.client.watch_client(), holder.clone());
        async move { client.watch(holder, Some(deletions())).await }
    });
    let mut stream = watch.await?;
    let line = etcd.keys.waiters(lock);
    stream
        .watch(line, Some(deletions().with_prefix()))
        .await
        .map_err(|e| storage("watch", e))?;
    stream
        .watch(etcd.keys.delay(lock), Some(deletions()))
        .await
        .map_err(|e| storage("watch", e))?;
    if let Some(session) = session {
        stream
            .watch(etcd.keys.session(session), Some(deletions()))
            .await
            .map_err(|e| storage("watch", e))?;
    }
    loop {
        tokio::select! {
            message = stream.message() => match message {
                Ok(Some(answer)) if answer.events().is_empty() && !answer.canceled() => continue,
                Ok(Some(_)) => return Ok(()),
                // The stream ended or broke (a member went away): look again after a
                // short pause; if etcd cannot answer that read, the read reports it.
                Ok(None) | Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return Ok(());
                }
            },
            _ = tokio::time::sleep_until(deadline) => return Ok(()),
        }
    }
}
