//! The fenced store in etcd: [`EtcdStore`], a [`Backend`].
//!
//! One fenced operation is one read-decide-commit loop (see [`crate::txn`]):
//!
//! 1. read, in one snapshot: the namespace's mark, the key and the idempotency record;
//! 2. decide locally: replay or refuse on the idempotency record, run the gate rule
//!    ([`admit`]), check the preconditions; a refusal ends here and writes nothing;
//! 3. commit `if mark, key and idempotency record are as read then write`: the new mark
//!    (only when it changed, so equal-epoch writers to different keys do not collide), the
//!    value or the deletion, and the idempotency record. A failed compare means another
//!    node moved first: go back to 1.
//!
//! Because the mark's compare is in every commit, no write can land after a larger epoch
//! was admitted in the same namespace, on any node (S5, S6, S7).

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{Compare, CompareOp, GetOptions, TxnOp};
use palisade_core::gate::{admit, HighWater};
use palisade_storage::{
    Action, Applied, ApplyError, Backend, Entry, FencedOp, IssuerState, LeaseRecord, StorageError,
};

use crate::keys::{self, from_json, json, IdemRecord};
use crate::txn::{backoff, contended, revision, MAX_ATTEMPTS};
use crate::{Etcd, Resend};

/// The fenced store (and the issuer records of [`Backend`]) in etcd. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    etcd: Etcd,
}

impl EtcdStore {
    pub fn new(etcd: Etcd) -> Self {
        EtcdStore { etcd }
    }

    /// One attempt: `Ok(None)` when the commit lost a race.
    async fn try_apply(&self, op: &FencedOp) -> Result<Option<Applied>, ApplyError> {
        let keys = &self.etcd.keys;
        let ns = op.namespace.as_str();
        let fence_key = keys.fence(ns);
        let data_key = match &op.action {
            Action::Put { key, .. } | Action::Delete { key, .. } => Some(keys.data(ns, key)),
            Action::Fence => None,
        };
        let idem_key = op
            .idempotency
            .as_ref()
            .map(|i| keys.idempotency(ns, &i.key));
        let mut gets = vec![TxnOp::get(fence_key.clone(), None)];
        gets.extend(data_key.iter().map(|k| TxnOp::get(k.clone(), None)));
        gets.extend(idem_key.iter().map(|k| TxnOp::get(k.clone(), None)));
        let snap = self.etcd.read("read for a fenced write", gets).await?;
        let data = data_key.as_ref().and_then(|_| snap.first(1));
        let idem = idem_key
            .as_ref()
            .and_then(|_| snap.first(gets_len(&data_key)));

        if let (Some(wanted), Some(stored)) = (&op.idempotency, idem) {
            // The first outcome stands, even if the gate would refuse the request today.
            let record: IdemRecord = from_json(stored.key(), stored.value())?;
            if record.fingerprint != wanted.fingerprint {
                return Err(ApplyError::IdempotencyConflict);
            }
            return Ok(Some(Applied {
                revision: revision(stored.mod_revision()),
                epoch: record.epoch,
                high_water: record.high_water,
                replayed: true,
            }));
        }

        let (mark, mark_rev) = match snap.first(0) {
            Some(kv) => (
                from_json::<HighWater>(kv.key(), kv.value())?,
                kv.mod_revision(),
            ),
            None => (HighWater::default(), 0),
        };
        let next = admit(mark, op.policy, op.epoch, op.seq)?;
        let mut compares = vec![Compare::mod_revision(
            fence_key.clone(),
            CompareOp::Equal,
            mark_rev,
        )];
        let mut writes = Vec::new();
        if next != mark {
            writes.push(TxnOp::put(fence_key, json(&next), None));
        }
        if let Some(data_key) = data_key {
            let current = data.map(|kv| revision(kv.mod_revision()));
            let seen = data.map_or(0, |kv| kv.mod_revision());
            compares.push(Compare::mod_revision(
                data_key.clone(),
                CompareOp::Equal,
                seen,
            ));
            match &op.action {
                Action::Put {
                    value,
                    precondition,
                    ..
                } => {
                    precondition.check(current)?;
                    writes.push(TxnOp::put(
                        data_key,
                        keys::encode_value(op.epoch, value),
                        None,
                    ));
                }
                Action::Delete { precondition, .. } => {
                    precondition.check(current)?;
                    if current.is_none() {
                        return Err(ApplyError::NotFound);
                    }
                    writes.push(TxnOp::delete(data_key, None));
                }
                Action::Fence => {}
            }
        }
        if let (Some(idem_key), Some(wanted)) = (idem_key, &op.idempotency) {
            compares.push(Compare::version(idem_key.clone(), CompareOp::Equal, 0));
            let record = IdemRecord {
                fingerprint: wanted.fingerprint.clone(),
                epoch: op.epoch,
                high_water: next,
            };
            writes.push(TxnOp::put(idem_key, json(&record), None));
        }
        let committed = self.etcd.commit("fenced write", compares, writes).await?;
        Ok(committed.map(|rev| Applied {
            revision: revision(rev),
            epoch: op.epoch,
            high_water: next,
            replayed: false,
        }))
    }
}

/// Index of the idempotency record's get: after the mark and, if any, the key.
fn gets_len(data_key: &Option<Vec<u8>>) -> usize {
    1 + usize::from(data_key.is_some())
}

#[async_trait]
impl Backend for EtcdStore {
    async fn load_issuer(&self) -> Result<IssuerState, StorageError> {
        let keys = &self.etcd.keys;
        let snap = self
            .etcd
            .read(
                "load issuer records",
                vec![
                    TxnOp::get(keys.epoch_prefix(), Some(GetOptions::new().with_prefix())),
                    TxnOp::get(keys.record_prefix(), Some(GetOptions::new().with_prefix())),
                ],
            )
            .await?;
        let mut state = IssuerState::default();
        let epoch_prefix = keys.epoch_prefix();
        for kv in snap.all(0) {
            let name = kv
                .key()
                .strip_prefix(epoch_prefix.as_slice())
                .unwrap_or_default();
            let lock = String::from_utf8_lossy(name).into_owned();
            state
                .epochs
                .push((lock, keys::decode_epoch(kv.key(), kv.value())?));
        }
        for kv in snap.all(1) {
            state.leases.push(from_json(kv.key(), kv.value())?);
        }
        Ok(state)
    }

    async fn record_grant(&self, lease: LeaseRecord) -> Result<(), StorageError> {
        let keys = &self.etcd.keys;
        let epoch_key = keys.epoch(&lease.lock);
        for attempt in 0..MAX_ATTEMPTS {
            let snap = self
                .etcd
                .read("read epoch", vec![TxnOp::get(epoch_key.clone(), None)])
                .await?;
            let (last, seen) = match snap.first(0) {
                Some(kv) => (keys::decode_epoch(kv.key(), kv.value())?, kv.mod_revision()),
                None => (0, 0),
            };
            let compares = vec![Compare::mod_revision(
                epoch_key.clone(),
                CompareOp::Equal,
                seen,
            )];
            let writes = vec![
                TxnOp::put(
                    epoch_key.clone(),
                    keys::encode_epoch(last.max(lease.epoch)),
                    None,
                ),
                TxnOp::put(keys.record(&lease.lease_id), json(&lease), None),
            ];
            if self
                .etcd
                .commit("record grant", compares, writes)
                .await?
                .is_some()
            {
                return Ok(());
            }
            backoff(attempt).await;
        }
        Err(contended("record grant"))
    }

    async fn remove_lease(&self, lease_id: &str) -> Result<(), StorageError> {
        let key = self.etcd.keys.record(lease_id);
        self.etcd
            .call("remove lease record", Resend::IfUnavailable, || {
                let (mut kv, key) = (self.etcd.client.kv_client(), key.clone());
                async move { kv.delete(key, None).await }
            })
            .await
            .map(drop)
    }

    async fn apply(&self, op: FencedOp) -> Result<Applied, ApplyError> {
        for attempt in 0..MAX_ATTEMPTS {
            if let Some(applied) = self.try_apply(&op).await? {
                return Ok(applied);
            }
            backoff(attempt).await;
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

    async fn list(
        &self,
        namespace: &str,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, StorageError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let base = self.etcd.keys.data_prefix(namespace);
        let mut start = base.clone();
        start.extend_from_slice(prefix.as_bytes());
        let options = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        let snap = self
            .etcd
            .read("list", vec![TxnOp::get(start, Some(options))])
            .await?;
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
        let snap = self
            .etcd
            .read("high-water mark", vec![TxnOp::get(key, None)])
            .await?;
        match snap.first(0) {
            Some(kv) => from_json(kv.key(), kv.value()),
            None => Ok(HighWater::default()),
        }
    }

    /// Never: nothing latches here. Each operation asks etcd afresh and fails on its own
    /// when etcd cannot answer.
    fn is_failed(&self) -> bool {
        false
    }
}
