//! The fenced store in etcd: [`EtcdStore`], a [`FencedStore`].
//!
//! One fenced operation is one read-decide-commit loop (see [`crate::txn`]):
//!
//! 1. read, in one snapshot: the namespace's mark, its usage counter, the key and the
//!    idempotency record (and, the first time a namespace without a counter is written,
//!    its data, to count it);
//! 2. decide locally with the rule every backend shares ([`decide()`]: idempotency, the
//!    gate, preconditions, quotas); a refusal ends here and writes nothing;
//! 3. commit `if mark, counter, key and idempotency record are as read then write`: the
//!    new mark (only when it changed), the value or the deletion, the counter, and the
//!    idempotency record (attached to a lease that ends after the retention). A failed
//!    compare means another node moved first: go back to 1. The counter's compare makes
//!    writes that change a namespace's size serialise on it, which is what keeps the
//!    quota exact across nodes.
//!
//! Because the mark's compare is in every commit, no write can land after a larger epoch
//! was admitted in the same namespace, on any node (S5, S6, S7).

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{Compare, CompareOp, GetOptions, TxnOp};
use palisade_core::gate::HighWater;
use palisade_storage::decide::Change;
use palisade_storage::{
    decide, Action, Applied, ApplyError, Decision, Entry, FencedOp, FencedStore, KeyState,
    NamespaceSummary, Page, Seen, StorageError, StoreLimits, Usage, WallClock,
};

use crate::keys::{self, from_json, json, IdemRecord};
use crate::txn::{backoff, contended, revision, MAX_ATTEMPTS};
use crate::Etcd;

/// The fenced store in etcd. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    etcd: Etcd,
    limits: StoreLimits,
    clock: WallClock,
    /// The etcd lease idempotency records are attached to now (see [`IdemLease`]).
    idem_lease: Arc<Mutex<Option<IdemLease>>>,
}

/// Idempotency records are attached to etcd leases, so etcd deletes them once expired and
/// the cluster's disk stays bounded without a scan. Records written during one bucket of
/// time share a lease that lives `retention + bucket` from the bucket's start: each record
/// lives at least its retention. Whether a record still counts is decided from its own
/// timestamp, not from the lease, so expiry is exact whenever etcd gets round to deleting.
#[derive(Debug, Clone, Copy)]
struct IdemLease {
    id: i64,
    /// Wall-clock end of the bucket (ms): after it, a new lease.
    until_ms: u64,
}

impl EtcdStore {
    /// A store with the default [`StoreLimits`] and the system clock.
    pub fn new(etcd: Etcd) -> Self {
        EtcdStore::with_limits(etcd, StoreLimits::default(), WallClock::system())
    }

    /// A store enforcing `limits`, stamping idempotency records with `clock`.
    pub fn with_limits(etcd: Etcd, limits: StoreLimits, clock: WallClock) -> Self {
        EtcdStore {
            etcd,
            limits,
            clock,
            idem_lease: Arc::new(Mutex::new(None)),
        }
    }

    /// The lease for a record written at `now_ms`, granting a new one when the bucket ran
    /// out.
    async fn idem_lease(&self, now_ms: u64) -> Result<i64, StorageError> {
        let cached = *self
            .idem_lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(lease) = cached.filter(|l| now_ms < l.until_ms) {
            return Ok(lease.id);
        }
        let retention = self.limits.retention_ms();
        let bucket = (retention / 16).clamp(1_000, 600_000);
        let ttl_s =
            i64::try_from(retention.saturating_add(bucket).div_ceil(1000)).unwrap_or(i64::MAX);
        let lease = crate::waiting::EtcdLease::grant(&self.etcd, ttl_s).await?;
        let id = lease.id();
        // etcd ends it (and deletes its records) when its TTL runs out; no keepalive.
        lease.keep();
        *self
            .idem_lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(IdemLease {
            id,
            until_ms: now_ms.saturating_add(bucket),
        });
        Ok(id)
    }

    fn forget_idem_lease(&self) {
        *self
            .idem_lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// One attempt: `Ok(None)` when the commit lost a race. With `count_usage`, the
    /// namespace's data is read too, to count a namespace that has no counter yet.
    async fn try_apply(&self, op: &FencedOp, count_usage: bool) -> Result<Attempt, ApplyError> {
        let keys = &self.etcd.keys;
        let ns = op.namespace.as_str();
        let fence_key = keys.fence(ns);
        let usage_key = keys.usage(ns);
        let data_key = match &op.action {
            Action::Put { key, .. } | Action::Delete { key, .. } => Some(keys.data(ns, key)),
            Action::Fence => None,
        };
        let idem_key = op
            .idempotency
            .as_ref()
            .map(|i| keys.idempotency(ns, &i.key));
        // Gets, in this order: mark, usage, then the key, the record and the scan if any.
        let mut gets = vec![
            TxnOp::get(fence_key.clone(), None),
            TxnOp::get(usage_key.clone(), None),
        ];
        let data_at = gets.len();
        gets.extend(data_key.iter().map(|k| TxnOp::get(k.clone(), None)));
        let idem_at = gets.len();
        gets.extend(idem_key.iter().map(|k| TxnOp::get(k.clone(), None)));
        let scan_at = gets.len();
        if count_usage {
            let prefix = keys.data_prefix(ns);
            gets.push(TxnOp::get(prefix, Some(GetOptions::new().with_prefix())));
        }
        // Last, so that the indexes above stay as they are.
        let floor_key = keys.epoch_floor();
        let floor_at = gets.len();
        gets.push(TxnOp::get(floor_key.clone(), None));
        let snap = self.etcd.read("read for a fenced write", gets).await?;
        let data = data_key.as_ref().and_then(|_| snap.first(data_at));
        let idem = idem_key.as_ref().and_then(|_| snap.first(idem_at));
        let now_ms = self.clock.now_ms();

        let (mark, mark_rev) = match snap.first(0) {
            Some(kv) => (
                from_json::<HighWater>(kv.key(), kv.value())?,
                kv.mod_revision(),
            ),
            None => (HighWater::default(), 0),
        };
        // After a restore, the epoch floor (`palisade admin etcd-raise`) is every
        // namespace's mark at least: tokens from before the restore are stale.
        let (floor, floor_rev) = match snap.first(floor_at) {
            Some(kv) => (keys::decode_epoch(kv.key(), kv.value())?, kv.mod_revision()),
            None => (0, 0),
        };
        let mark = mark.at_least(floor);
        let (usage, usage_rev) = match snap.first(1) {
            Some(kv) => (from_json::<Usage>(kv.key(), kv.value())?, kv.mod_revision()),
            None if data_key.is_none() => (Usage::default(), 0),
            None if !count_usage => return Ok(Attempt::CountUsage),
            None => (
                count(keys.data_prefix(ns).as_slice(), snap.all(scan_at))?,
                0,
            ),
        };
        let key_state = match data {
            Some(kv) => {
                let (_, value) = keys::decode_value(kv.key(), kv.value())?;
                let name = kv
                    .key()
                    .get(keys.data_prefix(ns).len()..)
                    .unwrap_or_default();
                Some(KeyState {
                    revision: revision(kv.mod_revision()),
                    bytes: (name.len() + value.len()) as u64,
                })
            }
            None => None,
        };
        let stored_idem = match idem {
            Some(kv) => {
                let record: IdemRecord = from_json(kv.key(), kv.value())?;
                Some(palisade_storage::IdemRecord {
                    fingerprint: record.fingerprint,
                    // Records of before expiry existed have no time: they never expire.
                    created_at_ms: record.created_at_ms.unwrap_or(now_ms),
                    applied: Applied {
                        revision: revision(kv.mod_revision()),
                        epoch: record.epoch,
                        high_water: record.high_water,
                        replayed: false,
                        advanced: false,
                    },
                })
            }
            None => None,
        };
        let seen = Seen {
            mark,
            key: key_state,
            idempotency: stored_idem.as_ref(),
            usage,
        };
        let commit = match decide(op, &seen, &self.limits, now_ms) {
            Decision::Replay(applied) => return Ok(Attempt::Done(applied)),
            Decision::Refuse(refused) => return Err(refused),
            Decision::Commit(commit) => commit,
        };

        let mut compares = vec![
            Compare::mod_revision(fence_key.clone(), CompareOp::Equal, mark_rev),
            Compare::mod_revision(floor_key, CompareOp::Equal, floor_rev),
        ];
        let mut writes = Vec::new();
        if commit.mark_changed {
            writes.push(TxnOp::put(fence_key, json(&commit.high_water), None));
        }
        if let Some(data_key) = data_key {
            compares.push(Compare::mod_revision(
                data_key.clone(),
                CompareOp::Equal,
                data.map_or(0, |kv| kv.mod_revision()),
            ));
            // The counter is compared with every put and delete, also unchanged, so that
            // a namespace counted from its data (`usage_rev` 0) is counted once.
            compares.push(Compare::mod_revision(
                usage_key.clone(),
                CompareOp::Equal,
                usage_rev,
            ));
            match (&op.action, commit.change) {
                (Action::Put { value, .. }, Change::Put) => writes.push(TxnOp::put(
                    data_key,
                    keys::encode_value(op.epoch, value),
                    None,
                )),
                (Action::Delete { .. }, Change::Delete) => {
                    writes.push(TxnOp::delete(data_key, None))
                }
                _ => {}
            }
            if commit.usage_changed || usage_rev == 0 {
                writes.push(TxnOp::put(usage_key, json(&commit.usage), None));
            }
        }
        if let (Some(idem_key), Some(wanted)) = (idem_key, &op.idempotency) {
            // An expired record is replaced; otherwise there must still be none.
            compares.push(match (commit.replaces_expired, idem) {
                (Some(_), Some(kv)) => {
                    Compare::mod_revision(idem_key.clone(), CompareOp::Equal, kv.mod_revision())
                }
                _ => Compare::version(idem_key.clone(), CompareOp::Equal, 0),
            });
            let record = IdemRecord {
                fingerprint: wanted.fingerprint.clone(),
                epoch: op.epoch,
                high_water: commit.high_water,
                created_at_ms: Some(now_ms),
            };
            let lease = self.idem_lease(now_ms).await?;
            let attached = etcd_client::PutOptions::new().with_lease(lease);
            writes.push(TxnOp::put(idem_key, json(&record), Some(attached)));
        }
        match self.etcd.commit("fenced write", compares, writes).await {
            Ok(Some(rev)) => Ok(Attempt::Done(commit.applied(op, revision(rev)))),
            Ok(None) => Ok(Attempt::Lost),
            // The lease of the records ended early (revoked by hand, or a clock jump): take
            // a new one and try again.
            Err(StorageError::LeaseGone(_)) => {
                self.forget_idem_lease();
                Ok(Attempt::Lost)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// How one attempt of a fenced write ended.
enum Attempt {
    Done(Applied),
    /// A compare failed: another writer got there first.
    Lost,
    /// The namespace has no counter: read again, counting its data.
    CountUsage,
}

/// Counts a namespace's data (keys under `prefix`) as [`Usage`].
fn count(prefix: &[u8], data: &[etcd_client::KeyValue]) -> Result<Usage, StorageError> {
    let mut usage = Usage::default();
    for kv in data {
        let (_, value) = keys::decode_value(kv.key(), kv.value())?;
        let name = kv.key().get(prefix.len()..).unwrap_or_default();
        usage.keys += 1;
        usage.bytes += (name.len() + value.len()) as u64;
    }
    Ok(usage)
}

#[async_trait]
impl FencedStore for EtcdStore {
    async fn apply(&self, op: FencedOp) -> Result<Applied, ApplyError> {
        let mut count_usage = false;
        for attempt in 0..MAX_ATTEMPTS {
            match self.try_apply(&op, count_usage).await? {
                Attempt::Done(applied) => return Ok(applied),
                Attempt::CountUsage => {
                    count_usage = true;
                    continue;
                }
                Attempt::Lost => backoff(attempt).await,
            }
        }
        Err(contended("fenced write").into())
    }

    async fn get(&self, namespace: &str, key: &str) -> Result<Option<Entry>, StorageError> {
        let data_key = self.etcd.keys.data(namespace, key);
        let snap = self
            .etcd
            .read("get", vec![TxnOp::get(data_key, None)])
            .await?;
        let Some(kv) = snap.first(0) else {
            return Ok(None);
        };
        let (epoch, value) = keys::decode_value(kv.key(), kv.value())?;
        Ok(Some(Entry {
            value: Bytes::copy_from_slice(value),
            revision: revision(kv.mod_revision()),
            epoch,
        }))
    }

    async fn list(&self, namespace: &str, page: Page) -> Result<Vec<String>, StorageError> {
        if page.is_empty() {
            return Ok(Vec::new());
        }
        let base = self.etcd.keys.data_prefix(namespace);
        let get = keys::page_read(&base, &page, GetOptions::new().with_keys_only());
        let snap = self.etcd.read("list", vec![get]).await?;
        snap.all(0)
            .iter()
            .map(|kv| {
                let key = kv.key().strip_prefix(base.as_slice()).unwrap_or_default();
                String::from_utf8(key.to_vec())
                    .map_err(|_| crate::error::corrupt(kv.key(), "key is not UTF-8"))
            })
            .collect()
    }

    async fn high_water(&self, namespace: &str) -> Result<HighWater, StorageError> {
        let key = self.etcd.keys.fence(namespace);
        let gets = vec![
            TxnOp::get(key, None),
            TxnOp::get(self.etcd.keys.epoch_floor(), None),
        ];
        let snap = self.etcd.read("high-water mark", gets).await?;
        let mark = match snap.first(0) {
            Some(kv) => from_json(kv.key(), kv.value())?,
            None => HighWater::default(),
        };
        match snap.first(1) {
            Some(kv) => Ok(mark.at_least(keys::decode_epoch(kv.key(), kv.value())?)),
            None => Ok(mark),
        }
    }

    /// One range read of the page's marks ([`keys::page_read`]), then one read of the page's usage counters. The two reads are not one snapshot: a
    /// counter may be a write newer than its mark.
    async fn namespaces(&self, page: Page) -> Result<Vec<NamespaceSummary>, StorageError> {
        if page.is_empty() {
            return Ok(Vec::new());
        }
        let keys = &self.etcd.keys;
        let base = keys.fence("");
        let gets = vec![
            keys::page_read(&base, &page, GetOptions::new()),
            TxnOp::get(keys.epoch_floor(), None),
        ];
        let snap = self.etcd.read("list namespaces", gets).await?;
        // After a restore the epoch floor is every namespace's mark at least, as in
        // `high_water`.
        let floor = match snap.first(1) {
            Some(kv) => keys::decode_epoch(kv.key(), kv.value())?,
            None => 0,
        };
        let mut marks = Vec::new();
        for kv in snap.all(0) {
            let name = kv.key().strip_prefix(base.as_slice()).unwrap_or_default();
            let name = String::from_utf8(name.to_vec())
                .map_err(|_| crate::error::corrupt(kv.key(), "namespace is not UTF-8"))?;
            let mark: HighWater = from_json(kv.key(), kv.value())?;
            marks.push((name, mark.at_least(floor)));
        }
        let mut out = Vec::with_capacity(marks.len());
        // etcd refuses a transaction of more than 128 operations (`--max-txn-ops`).
        for chunk in marks.chunks(100) {
            let gets = chunk
                .iter()
                .map(|(name, _)| TxnOp::get(keys.usage(name), None))
                .collect();
            let usages = self.etcd.read("namespace usage", gets).await?;
            for (i, (name, high_water)) in chunk.iter().enumerate() {
                let usage = usages
                    .first(i)
                    .map(|kv| from_json::<Usage>(kv.key(), kv.value()))
                    .transpose()?;
                out.push(NamespaceSummary {
                    name: name.clone(),
                    high_water: *high_water,
                    usage,
                });
            }
        }
        Ok(out)
    }

    /// Never: nothing latches here. Each operation asks etcd afresh and fails on its own
    /// when etcd cannot answer.
    fn is_failed(&self) -> bool {
        false
    }
}
