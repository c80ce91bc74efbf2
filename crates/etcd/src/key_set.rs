//! The issuer key set in etcd: one key set shared by every node of a deployment.
//!
//! The set ([`palisade_token::KeySet`], in its stored JSON form) lives under
//! `P keys/set`. Every change is one etcd transaction:
//!
//! - creation, at a node's first start on an empty cluster: `if create_revision(keys/set)
//!   == 0 then put` (compare-and-create). Two nodes starting together both try; one wins,
//!   and the other reads and uses the winner's set, so they agree;
//! - rotation and retirement, on any node: read the set and its mod revision, decide
//!   locally, `if mod_revision(keys/set) == <as read> then put` (compare-and-swap). A lost
//!   race reads again, a bounded number of times.
//!
//! Nodes learn of a change by reading the set again ([`EtcdKeySet::read`]); the server
//! polls it and re-reads it at once when a token names a key it does not know.
//!
//! ## Why the secret may live in etcd
//! The active key's secret is stored here, readable by whoever may read the prefix. That
//! does not widen what an etcd credential gives: whoever can write under the prefix
//! already controls every epoch, holder and high-water mark, and so can let any writer
//! through or fence any holder out without a token. Protect etcd access as the signing
//! key itself (TLS, a user with rights on the prefix only).

use etcd_client::{Compare, CompareOp, TxnOp};
use palisade_storage::StorageError;
use palisade_token::{KeySet, KeySetError, Signer};

use crate::error::corrupt;
use crate::txn::{backoff, contended, MAX_ATTEMPTS};
use crate::{Etcd, Resend};

/// The key set as stored in etcd, with the mod revision it was read at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredKeySet {
    pub set: KeySet,
    /// etcd's mod revision of the key: grows with every change.
    pub revision: i64,
}

/// The outcome of [`EtcdKeySet::update`]: etcd answered, and the change was made, was not
/// needed, or was refused by the key set's rules.
pub type Updated = Result<Option<StoredKeySet>, KeySetError>;

/// The deployment's key set in etcd. Cheap to clone.
#[derive(Clone)]
pub struct EtcdKeySet {
    etcd: Etcd,
}

impl EtcdKeySet {
    pub fn new(etcd: Etcd) -> Self {
        EtcdKeySet { etcd }
    }

    /// The stored set, or `None` if none was created yet.
    pub async fn read(&self) -> Result<Option<StoredKeySet>, StorageError> {
        let key = self.etcd.keys.key_set();
        let response = self
            .etcd
            .call("read key set", Resend::IfUnavailable, || {
                let (mut kv, key) = (self.etcd.client.kv_client(), key.clone());
                async move { kv.get(key, None).await }
            })
            .await?;
        let Some(kv) = response.kvs().first() else {
            return Ok(None);
        };
        let set = KeySet::decode(kv.value()).map_err(|e| corrupt(&key, e))?;
        Ok(Some(StoredKeySet {
            set,
            revision: kv.mod_revision(),
        }))
    }

    /// The stored set; if there is none, one whose only key is `seed` is created (a
    /// compare-and-create, so that nodes starting together agree on one). `Ok(None)` when
    /// there is none and no seed was given.
    pub async fn load_or_create(
        &self,
        seed: Option<Signer>,
        now: u64,
    ) -> Result<Option<StoredKeySet>, StorageError> {
        if let Some(stored) = self.read().await? {
            return Ok(Some(stored));
        }
        let Some(seed) = seed else { return Ok(None) };
        let key = self.etcd.keys.key_set();
        let set = KeySet::new(seed, now);
        let created = self
            .etcd
            .commit(
                "create key set",
                vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)],
                vec![TxnOp::put(key, set.encode(), None)],
            )
            .await?;
        match created {
            Some(revision) => Ok(Some(StoredKeySet { set, revision })),
            // Another node created it first: use theirs.
            None => self.read().await,
        }
    }

    /// Changes the stored set with `change` (given the set as read; `Ok(None)`: nothing to
    /// change) by compare-and-swap, reading again after a lost race. The outer `Err` is
    /// etcd's (unreachable, contended past `MAX_ATTEMPTS` attempts, an unreadable set); the inner
    /// one is the key set's own refusal, and nothing was written.
    pub async fn update(
        &self,
        change: impl Fn(&KeySet) -> Result<Option<KeySet>, KeySetError>,
    ) -> Result<Updated, StorageError> {
        let key = self.etcd.keys.key_set();
        for attempt in 0..MAX_ATTEMPTS {
            let Some(current) = self.read().await? else {
                return Err(StorageError::Failed(
                    "etcd holds no key set (a node creates it at its first start)".to_owned(),
                ));
            };
            let next = match change(&current.set) {
                Ok(Some(next)) => next,
                Ok(None) => return Ok(Ok(None)),
                Err(refused) => return Ok(Err(refused)),
            };
            let committed = self
                .etcd
                .commit(
                    "change key set",
                    vec![Compare::mod_revision(
                        key.clone(),
                        CompareOp::Equal,
                        current.revision,
                    )],
                    vec![TxnOp::put(key.clone(), next.encode(), None)],
                )
                .await?;
            if let Some(revision) = committed {
                return Ok(Ok(Some(StoredKeySet {
                    set: next,
                    revision,
                })));
            }
            backoff(attempt).await;
        }
        Err(contended("change key set"))
    }
}
