//! The lock service in etcd: [`EtcdIssuer`], a [`LockService`].
//!
//! A Palisade lease *is* an etcd lease. Acquiring lock `L` is one transaction:
//!
//! ```text
//! if   version(holder/L) == 0                 -- nobody holds L
//! and  mod_revision(epoch/L) == <as read>     -- nobody issued an epoch since we read it
//! and  <the waiting line allows us>           -- see crate::waiting
//! then put epoch/L = n + 1
//!      put holder/L, lease/<id>  (attached to the new etcd lease)
//! ```
//!
//! Keepalive is etcd's lease keepalive, release is a revoke, and expiry is etcd deleting
//! the lease's keys: the holder key exists exactly while the lease is alive, so a lock is
//! never granted twice for overlapping leases, and epochs never repeat, whichever node
//! serves. After an etcd leader change, etcd extends every lease by an election timeout,
//! so a failover never shortens a lease (the safe direction).
//!
//! When a lock may be granted is one rule, in `crate::grantable`: read from a snapshot
//! before trying, and the same conditions compared by the transaction. The recipes (lock
//! values, per-lock lock-delay, sessions) add to the same transaction: a session key that
//! must be present, and the keys they write (see `crate::recipes`).

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, TxnOp};
use palisade_core::lock_table::{LeaseView, LockView, SessionView};
use palisade_issuer::{
    Acquire, AcquireError, Granted, Lease, LeaseError, LockService, MayAct, SessionError,
    SessionRequest,
};
use palisade_storage::{Page, StorageError};
use palisade_token::{ActiveSigner, Epoch};

use crate::error::is_lease_not_found;
use crate::grantable::{self, Asker, Blocked, LockSnapshot};
use crate::keys::{self, from_json, json, DelayRecord, HolderRecord};
use crate::ledger::EpochLedger;
use crate::recipes::Plan;
use crate::txn::{backoff, contended, MAX_ATTEMPTS};
use crate::waiting::{self, EtcdLease};
use crate::{Etcd, Resend};

/// The lock service over etcd. See the module docs.
pub struct EtcdIssuer {
    pub(crate) etcd: Etcd,
    signer: ActiveSigner,
    /// Lock-delay of a lease that does not choose one.
    pub(crate) default_lock_delay_ms: u64,
    /// This node's epoch ledger, outside etcd (see `crate::ledger`).
    ledger: Option<EpochLedger>,
    /// Reports lease changes to an observer (see `crate::watch`).
    pub(crate) watch: crate::watch::Watcher,
}

/// etcd leases count whole seconds: round up.
pub(crate) fn ttl_seconds(ttl_ms: u64) -> i64 {
    i64::try_from(ttl_ms.div_ceil(1000).max(1)).unwrap_or(i64::MAX)
}

/// The lease a holder record describes: etcd holds the epoch and the lease itself, so a
/// grant has nothing else to make durable.
fn lease_of(record: &HolderRecord) -> Lease {
    Lease {
        lock: record.lock.clone(),
        holder: record.holder.clone(),
        epoch: record.epoch,
        lease_id: record.lease_id.clone(),
        ttl_ms: record.ttl_ms,
        value: record
            .value
            .as_deref()
            .and_then(palisade_issuer::value::decode),
        lock_delay_ms: record.lock_delay_ms,
        session: record.session.clone(),
    }
}

/// [`MayAct`] asked about a lease's record, read in the same call that then acts on it
/// (the record's lock and holder never change while the lease lives).
pub(crate) fn may_act(record: &HolderRecord, may: MayAct<'_>) -> Result<(), LeaseError> {
    match may {
        Some(may) if !may.may_act(&record.lock, &record.holder) => Err(LeaseError::NotYours(
            Box::new(view_of(record, record.ttl_ms)),
        )),
        _ => Ok(()),
    }
}

pub(crate) fn view_of(record: &HolderRecord, remaining_ms: u64) -> LeaseView {
    lease_of(record).view(remaining_ms)
}

impl EtcdIssuer {
    /// A lock service signing its tokens with `signer`. Every node of a deployment must
    /// use the same key set (or trust each other's keys), since any node may verify any
    /// token; a rotation replaces the key of `signer` while the issuer runs.
    pub fn new(etcd: Etcd, signer: impl Into<ActiveSigner>) -> Self {
        EtcdIssuer {
            etcd,
            signer: signer.into(),
            default_lock_delay_ms: 0,
            ledger: None,
            watch: crate::watch::Watcher::default(),
        }
    }

    /// Keeps `ledger` above every epoch this node hands out (see `crate::ledger`).
    pub fn with_ledger(mut self, ledger: EpochLedger) -> Self {
        self.ledger = Some(ledger);
        self
    }

    /// The lock-delay of leases that do not choose one (default 0).
    pub fn with_lock_delay(mut self, lock_delay_ms: u64) -> Self {
        self.default_lock_delay_ms = lock_delay_ms;
        self
    }

    /// The signer whose key signs this node's tokens.
    pub fn signer(&self) -> &ActiveSigner {
        &self.signer
    }

    /// Reads a lock's epoch, holder, waiting line and lock-delay marker in one snapshot,
    /// whether the waiter key `ours` (if given) is still in the line, and whether the
    /// session `session` (if given) still exists.
    pub(crate) async fn read_lock(
        &self,
        lock: &str,
        ours: Option<&[u8]>,
        session: Option<&str>,
    ) -> Result<LockSnapshot, StorageError> {
        let keys = &self.etcd.keys;
        let line = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let keys_only = || Some(GetOptions::new().with_keys_only());
        let mut gets = vec![
            TxnOp::get(keys.epoch(lock), None),
            TxnOp::get(keys.holder(lock), None),
            TxnOp::get(keys.waiters(lock), Some(line)),
            TxnOp::get(keys.delay(lock), None),
            // Absent keys answer nothing: the same get stands in when none is asked about.
            TxnOp::get(keys.session(session.unwrap_or("-")), keys_only()),
        ];
        gets.extend(ours.map(|key| TxnOp::get(key, keys_only())));
        // Last, so that the indexes above stay as they are.
        let floor_at = gets.len();
        gets.push(TxnOp::get(keys.epoch_floor(), None));
        let snap = self.etcd.read("read lock", gets).await?;
        let (epoch, epoch_rev) = match snap.first(0) {
            Some(kv) => (keys::decode_epoch(kv.key(), kv.value())?, kv.mod_revision()),
            None => (0, 0),
        };
        let (floor, floor_rev) = match snap.first(floor_at) {
            Some(kv) => (keys::decode_epoch(kv.key(), kv.value())?, kv.mod_revision()),
            None => (0, 0),
        };
        let holder = match snap.first(1) {
            Some(kv) => Some(from_json::<HolderRecord>(kv.key(), kv.value())?),
            None => None,
        };
        Ok(LockSnapshot {
            revision: snap.revision,
            epoch: epoch.max(floor),
            epoch_rev,
            floor_rev,
            holder,
            waiters: usize::try_from(snap.count(2)).unwrap_or(0),
            first_waiter: snap.first(2).map(|kv| kv.key().to_vec()),
            delay: match snap.first(3) {
                Some(kv) => Some(from_json::<DelayRecord>(kv.key(), kv.value())?),
                None => None,
            },
            session_alive: session.is_none() || snap.first(4).is_some(),
            queued: ours.is_some() && snap.first(5).is_some(),
        })
    }

    /// The refusal for a lock that cannot be granted now to a caller outside the line, if
    /// it cannot ([`LockSnapshot::blocked`]), with how long it may stay so.
    pub(crate) async fn busy(&self, snap: &LockSnapshot) -> Option<AcquireError> {
        let (holder, retry_after_ms) = match snap.blocked(Asker::Newcomer)? {
            Blocked::Held(record) => (Some(record.holder.clone()), self.remaining_ms(record).await),
            // No holder, and free once the marker's lease runs out.
            Blocked::Delayed(delay) => (None, self.lease_remaining_ms(delay.delay_lease).await),
            // Free, but someone queued first: they are about to take it (first come,
            // first served), so this is `lock_held` with no holder yet.
            Blocked::LineAhead => (None, 0),
        };
        Some(AcquireError::Held {
            holder,
            retry_after_ms,
        })
    }

    /// What is left of an etcd lease, by etcd's count (whole seconds); 0 if etcd cannot
    /// say or the lease is gone.
    pub(crate) async fn lease_remaining_ms(&self, id: i64) -> u64 {
        let ttl = self.etcd.call("lease ttl", Resend::IfUnavailable, || {
            let mut lease = self.etcd.client.lease_client();
            async move { lease.time_to_live(id, None).await }
        });
        match ttl.await {
            Ok(answer) => u64::try_from(answer.ttl()).map_or(0, |s| s * 1000),
            Err(_) => 0,
        }
    }

    /// What is left of a holder's lease, by etcd's count (whole seconds); the full TTL if
    /// etcd cannot say.
    async fn remaining_ms(&self, record: &HolderRecord) -> u64 {
        let id = record.etcd_lease;
        let ttl = self.etcd.call("lease ttl", Resend::IfUnavailable, || {
            let mut lease = self.etcd.client.lease_client();
            async move { lease.time_to_live(id, None).await }
        });
        match ttl.await {
            Ok(answer) => u64::try_from(answer.ttl()).map_or(0, |s| s * 1000),
            Err(_) => record.ttl_ms,
        }
    }

    /// Tries the acquisition transaction once. `queued` is our waiter key and its create
    /// revision when we come from the waiting line (which the transaction then also
    /// leaves). `Ok(None)` when a compare failed.
    /// [`EtcdIssuer::try_grant`] with the etcd leases in `leases` (made now if there are
    /// none yet): kept when the grant is made, handed back in `leases` for the next try
    /// when it is not.
    pub(crate) async fn grant_with(
        &self,
        leases: &mut Option<(EtcdLease, Option<EtcdLease>)>,
        req: &Acquire,
        plan: &Plan,
        snap: &LockSnapshot,
        queued: Option<(&[u8], i64)>,
    ) -> Result<Option<HolderRecord>, StorageError> {
        let (granted, shadow) = match leases.take() {
            Some(l) => l,
            None => plan.leases(&self.etcd).await?,
        };
        let record = self
            .try_grant(req, plan, &granted, shadow.as_ref(), snap, queued)
            .await?;
        if record.is_some() {
            granted.keep();
            if let Some(shadow) = shadow {
                shadow.keep();
            }
        } else {
            *leases = Some((granted, shadow));
        }
        Ok(record)
    }

    pub(crate) async fn try_grant(
        &self,
        req: &Acquire,
        plan: &Plan,
        lease: &EtcdLease,
        shadow: Option<&EtcdLease>,
        snap: &LockSnapshot,
        queued: Option<(&[u8], i64)>,
    ) -> Result<Option<HolderRecord>, StorageError> {
        let keys = &self.etcd.keys;
        let record = HolderRecord {
            lease_id: req.lease_id.clone(),
            lock: req.lock.clone(),
            holder: req.holder.clone(),
            epoch: snap.epoch + 1,
            ttl_ms: lease.ttl_ms(),
            etcd_lease: lease.id(),
            value: req.value.as_deref().map(palisade_issuer::value::encode),
            lock_delay_ms: plan.lock_delay_ms,
            session: plan.session.as_ref().map(|s| s.session_id.clone()),
            delay_lease: shadow.map(EtcdLease::id),
        };
        let asker = match queued {
            None => Asker::Newcomer,
            Some((key, created)) => Asker::InLine { key, created },
        };
        let mut compares = grantable::guards(keys, &req.lock, snap, asker);
        let attached = Some(etcd_client::PutOptions::new().with_lease(lease.id()));
        let mut writes = vec![
            TxnOp::put(
                keys.epoch(&req.lock),
                keys::encode_epoch(record.epoch),
                None,
            ),
            TxnOp::put(keys.holder(&req.lock), json(&record), attached.clone()),
            TxnOp::put(keys.lease(&req.lease_id), json(&record), attached.clone()),
        ];
        if let Some(session) = &plan.session {
            // The session still exists: its lease is the one we attach to.
            compares.push(Compare::version(
                keys.session(&session.session_id),
                CompareOp::Greater,
                0,
            ));
            writes.push(TxnOp::put(
                keys.session_lease(&session.session_id, &req.lease_id),
                json(&record),
                attached,
            ));
        }
        if let Some(shadow) = shadow {
            let marker = DelayRecord {
                lease_id: req.lease_id.clone(),
                lock_delay_ms: plan.lock_delay_ms,
                delay_lease: shadow.id(),
            };
            let on_shadow = Some(etcd_client::PutOptions::new().with_lease(shadow.id()));
            writes.push(TxnOp::put(keys.delay(&req.lock), json(&marker), on_shadow));
        }
        if let Some((ours, _)) = queued {
            // Out of the line in the same step.
            writes.push(TxnOp::delete(ours, None));
        }
        let Some(revision) = self.etcd.commit("acquire", compares, writes).await? else {
            return Ok(None);
        };
        if let Some(ledger) = &self.ledger {
            // The token must not leave this node before the ledger covers its epoch.
            if let Err(e) = ledger.cover(record.epoch, revision).await {
                tracing::error!(error = %e, lock = %record.lock, epoch = record.epoch,
                    "the epoch ledger could not be raised: grant withdrawn");
                let _ = crate::recipes::release_keys(self, &record).await;
                return Err(e);
            }
        }
        Ok(Some(record))
    }

    /// Acquires without waiting.
    async fn acquire_now(&self, req: &Acquire, plan: &Plan) -> Result<HolderRecord, AcquireError> {
        let mut leases: Option<(EtcdLease, Option<EtcdLease>)> = None;
        for attempt in 0..MAX_ATTEMPTS {
            let session = plan.session.as_ref().map(|s| s.session_id.as_str());
            let snap = self.read_lock(&req.lock, None, session).await?;
            if !snap.session_alive {
                return Err(AcquireError::NoSession);
            }
            if let Some(refusal) = self.busy(&snap).await {
                return Err(refusal);
            }
            // Granted only once the lock looks free, so a refusal costs no lease.
            if let Some(record) = self.grant_with(&mut leases, req, plan, &snap, None).await? {
                return Ok(record);
            }
            backoff(attempt).await;
        }
        Err(contended("acquire").into())
    }

    /// How a request is to be granted: its TTL and etcd lease (its own, or its
    /// session's) and its lock-delay.
    async fn plan(&self, req: &Acquire) -> Result<Plan, AcquireError> {
        let lock_delay_ms = req.lock_delay_ms.unwrap_or(self.default_lock_delay_ms);
        let session = match &req.session {
            Some(id) => Some(
                crate::recipes::session_record(self, id)
                    .await?
                    .ok_or(AcquireError::NoSession)?,
            ),
            None => None,
        };
        let ttl_s = match &session {
            Some(s) => ttl_seconds(s.ttl_ms),
            None => ttl_seconds(req.ttl_ms),
        };
        Ok(Plan {
            session,
            lock_delay_ms,
            ttl_s,
        })
    }

    /// Finds a live lease's record by Palisade lease id.
    pub(crate) async fn lease_record(&self, lease_id: &str) -> Result<HolderRecord, LeaseError> {
        let key = self.etcd.keys.lease(lease_id);
        let snap = self
            .etcd
            .read("read lease", vec![TxnOp::get(key, None)])
            .await?;
        match snap.first(0) {
            Some(kv) => Ok(from_json(kv.key(), kv.value())?),
            None => Err(LeaseError::Expired),
        }
    }

    async fn view(&self, lock: &str, snap: LockSnapshot) -> LockView {
        let lease = match &snap.holder {
            Some(record) => Some(view_of(record, self.remaining_ms(record).await)),
            None => None,
        };
        LockView {
            lock: lock.to_owned(),
            epoch: snap.epoch,
            // Every grant is its own etcd transaction: nothing is granted unrecorded.
            granted_up_to: snap.epoch,
            lease,
            waiters: snap.waiters,
        }
    }
}

impl EtcdIssuer {
    /// Known locks (every lock that was ever granted an epoch), one [`Page`] in name
    /// order, read by one range read of the epoch keys (etcd's ordered index), then one
    /// snapshot per lock for its holder and line. Pass the last name of a page as `after`
    /// for the next.
    pub async fn list_page(&self, page: Page) -> Result<Vec<LockView>, StorageError> {
        let names = self.lock_names(page).await?;
        // One snapshot per lock keeps this simple; listing is for operators, not hot paths.
        let reads = names.iter().map(|(name, _)| async move {
            let snap = self.read_lock(name, None, None).await?;
            Ok::<_, StorageError>(self.view(name, snap).await)
        });
        futures::future::try_join_all(reads).await
    }

    /// One page of known locks with their last epochs, from the epoch keys alone (see
    /// [`Self::list_page`]).
    pub async fn lock_names(&self, page: Page) -> Result<Vec<(String, Epoch)>, StorageError> {
        if page.is_empty() {
            return Ok(Vec::new());
        }
        let base = self.etcd.keys.epoch_prefix();
        let get = keys::page_read(&base, &page, GetOptions::new());
        let snap = self.etcd.read("list locks", vec![get]).await?;
        snap.all(0)
            .iter()
            .filter_map(|kv| {
                let name = kv.key().strip_prefix(base.as_slice())?;
                Some((kv, String::from_utf8_lossy(name).into_owned()))
            })
            .map(|(kv, name)| Ok((name, keys::decode_epoch(kv.key(), kv.value())?)))
            .collect()
    }
}

#[async_trait]
impl LockService for EtcdIssuer {
    async fn acquire(&self, req: Acquire) -> Result<Granted, AcquireError> {
        if req.owner.is_some() {
            // Counting a principal's leases across nodes would need a counter in every
            // grant's transaction; this issuer does not keep one (`counts_owners`).
            return Err(AcquireError::Unsupported {
                what: "per-principal lease and wait quotas",
            });
        }
        let plan = self.plan(&req).await?;
        let record = if req.wait_ms == 0 {
            self.acquire_now(&req, &plan).await?
        } else {
            match self.acquire_now(&req, &plan).await {
                Err(AcquireError::Held { .. }) => {
                    let wait = Duration::from_millis(req.wait_ms);
                    waiting::acquire_in_line(self, &req, &plan, wait).await?
                }
                other => other?,
            }
        };
        let token = self
            .signer
            .issue(&record.lock, record.epoch, &record.holder);
        Ok(Granted {
            lease: lease_of(&record),
            token,
        })
    }

    /// Per-principal quotas are not counted over etcd (docs/security.md).
    fn counts_owners(&self) -> bool {
        false
    }

    async fn keepalive(&self, lease_id: &str, may: MayAct<'_>) -> Result<LeaseView, LeaseError> {
        let record = self.lease_record(lease_id).await?;
        may_act(&record, may)?;
        if let Some(session) = &record.session {
            // One keepalive for the whole session.
            return match crate::recipes::keepalive_session(self, session).await {
                Ok(_) => Ok(view_of(&record, record.ttl_ms)),
                Err(SessionError::Storage(e)) => Err(e.into()),
                Err(_) => Err(LeaseError::Expired),
            };
        }
        if let Some(shadow) = record.delay_lease {
            // The delay lease first: renewed after the holder's, a crash in between could
            // let it end before the holder's lease and take the lock-delay with it.
            crate::recipes::renew(&self.etcd, shadow).await?;
        }
        let id = record.etcd_lease;
        let answer = self.etcd.call_raw("keepalive", Resend::IfUnavailable, || {
            let mut lease = self.etcd.client.lease_client();
            async move { lease.keep_alive(id).await }
        });
        match answer.await? {
            Ok(_) => Ok(view_of(&record, record.ttl_ms)),
            Err(e) if is_lease_not_found(&e) => Err(LeaseError::Expired),
            Err(e) => Err(crate::error::storage("keepalive", e).into()),
        }
    }

    async fn release(&self, lease_id: &str, may: MayAct<'_>) -> Result<LeaseView, LeaseError> {
        let record = self.lease_record(lease_id).await?;
        may_act(&record, may)?;
        // Before the keys go: the watch then reports this end as a release.
        self.watch.releasing(lease_id);
        if record.session.is_some() || record.delay_lease.is_some() {
            return crate::recipes::release_keys(self, &record).await;
        }
        let id = record.etcd_lease;
        let answer = self.etcd.call_raw("release", Resend::IfNeverReceived, || {
            let mut lease = self.etcd.client.lease_client();
            async move { lease.revoke(id).await }
        });
        match answer.await? {
            Ok(_) => Ok(view_of(&record, 0)),
            Err(e) if is_lease_not_found(&e) => Err(LeaseError::Expired),
            Err(e) => Err(crate::error::storage("release", e).into()),
        }
    }

    async fn status(&self, lock: &str) -> Result<LockView, StorageError> {
        let snap = self.read_lock(lock, None, None).await?;
        Ok(self.view(lock, snap).await)
    }

    async fn list(&self, page: Page) -> Result<Vec<LockView>, StorageError> {
        self.list_page(page).await
    }

    async fn proclaim(
        &self,
        lease_id: &str,
        value: Option<Vec<u8>>,
        may: MayAct<'_>,
    ) -> Result<LeaseView, LeaseError> {
        crate::recipes::proclaim(self, lease_id, value, may).await
    }

    async fn create_session(&self, req: SessionRequest) -> Result<SessionView, SessionError> {
        crate::recipes::create_session(self, req).await
    }

    async fn keepalive_session(&self, session_id: &str) -> Result<SessionView, SessionError> {
        crate::recipes::keepalive_session(self, session_id).await
    }

    async fn session(&self, session_id: &str) -> Result<Option<SessionView>, StorageError> {
        crate::recipes::session_view(self, session_id).await
    }

    async fn close_session(&self, session_id: &str) -> Result<SessionView, SessionError> {
        crate::recipes::close_session(self, session_id).await
    }

    fn observe(&self, observer: std::sync::Arc<dyn palisade_issuer::LeaseObserver>) {
        self.watch.start(self.etcd.clone(), observer);
    }

    async fn census(&self) -> Option<palisade_issuer::Census> {
        crate::watch::census(&self.etcd).await
    }
}
