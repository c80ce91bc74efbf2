//! Fencing for stores that cannot compare tokens but can write conditionally (S13):
//! object stores through the `object_store` crate (feature `object-store`).
//!
//! ```
//! # async fn example(verifier: &palisade_token::Verifier, token: &str) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use object_store::{memory::InMemory, path::Path};
//! use palisade_adapters::objects::FencedObjects;
//!
//! let objects = FencedObjects::new(Arc::new(InMemory::new()));
//! let path = Path::from("orders/manifest.json");
//! objects.put(verifier, token, "orders", &path, "{\"v\":1}".into()).await?;
//! let stored = objects.get(&path).await?;
//! assert_eq!(stored.and_then(|o| o.value).as_deref(), Some(&b"{\"v\":1}"[..]));
//! # Ok(()) }
//! ```
//!
//! ## How it works
//! Each object is stored in an [`Envelope`]: a header line carrying the lock the object is
//! bound to and the largest epoch that wrote it (its high-water mark), then the payload.
//! A fenced write reads the object and its version (ETag), applies the gate rule to the
//! header, and writes the new envelope with `PutMode::Update(version)` (or
//! `PutMode::Create` for a new object). The store accepts the write only if nobody wrote
//! in between, so the epoch check and the write land together or not at all; a lost race
//! is [`AdmitError::Conflict`]: read again and retry.
//!
//! ## What it protects, and what it cannot
//! - The mark is **per object**. An object that epoch 2 wrote refuses epoch 1 from then on;
//!   an object epoch 2 never touched still accepts epoch 1. A new holder that must cut the
//!   old one off everywhere calls [`FencedObjects::fence`] on every object it will own
//!   before working (S10).
//! - It protects the object's bytes, nothing else. Side effects the writer performs
//!   outside this one object (other objects, emails, API calls) are not fenced, and no two
//!   objects change atomically together.
//! - Every reader and writer must use the envelope. A tool that overwrites or deletes the
//!   object directly bypasses the fence and can erase the mark (S11). That is why
//!   [`FencedObjects::delete`] writes a tombstone instead of deleting.
//! - It needs a store with real conditional updates (S3 with conditional writes, GCS,
//!   Azure, `InMemory`). A store without them (e.g. `LocalFileSystem` for updates) fails
//!   with [`AdmitError::Backend`]; it never falls back to an unconditional write.
//! - Whole objects are read and rewritten, so this suits manifests and state files, not
//!   large blobs.

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, UpdateVersion};
use palisade_core::gate::{HighWater, Policy};

use crate::admission::{decide, Admitted, Trust};
use crate::error::{AdmitError, CorruptFence};
use crate::report::ResourceKind;

mod envelope;
pub use envelope::Envelope;

/// Fenced reads and writes over any [`ObjectStore`] with conditional puts.
#[derive(Debug, Clone)]
pub struct FencedObjects {
    store: Arc<dyn ObjectStore>,
}

/// What to do with the payload once admitted.
enum Change {
    Put(Bytes),
    Delete,
    Keep,
}

impl FencedObjects {
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        FencedObjects { store }
    }

    /// The underlying store, for reads that do not need the envelope decoded.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Writes `value` at `path` if `token` is admitted for `lock` by the object's mark.
    pub async fn put<'t>(
        &self,
        trust: impl Into<Trust<'t>>,
        token: &str,
        lock: &str,
        path: &Path,
        value: Bytes,
    ) -> Result<Admitted, AdmitError> {
        self.write(trust.into(), token, lock, path, Change::Put(value))
            .await
    }

    /// Replaces the object by a tombstone that keeps its mark, so a stale holder cannot
    /// recreate it.
    pub async fn delete<'t>(
        &self,
        trust: impl Into<Trust<'t>>,
        token: &str,
        lock: &str,
        path: &Path,
    ) -> Result<Admitted, AdmitError> {
        self.write(trust.into(), token, lock, path, Change::Delete)
            .await
    }

    /// A barrier: raises the object's mark to the token's epoch, keeping its payload
    /// (creating a tombstone if the object does not exist yet).
    pub async fn fence<'t>(
        &self,
        trust: impl Into<Trust<'t>>,
        token: &str,
        lock: &str,
        path: &Path,
    ) -> Result<Admitted, AdmitError> {
        self.write(trust.into(), token, lock, path, Change::Keep)
            .await
    }

    /// Reads and decodes the object; `None` if it was never written.
    pub async fn get(&self, path: &Path) -> Result<Option<Envelope>, AdmitError> {
        Ok(self.read(path).await?.map(|(envelope, _)| envelope))
    }

    async fn read(&self, path: &Path) -> Result<Option<(Envelope, UpdateVersion)>, AdmitError> {
        let found = match self.store.get(path).await {
            Ok(found) => found,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(AdmitError::backend(e)),
        };
        let version = UpdateVersion {
            e_tag: found.meta.e_tag.clone(),
            version: found.meta.version.clone(),
        };
        let stored = found.bytes().await.map_err(AdmitError::backend)?;
        let envelope = Envelope::decode(stored).map_err(AdmitError::backend)?;
        Ok(Some((envelope, version)))
    }

    async fn write(
        &self,
        trust: Trust<'_>,
        token: &str,
        lock: &str,
        path: &Path,
        change: Change,
    ) -> Result<Admitted, AdmitError> {
        let outcome = async {
            let claims = trust.verify_for_lock(token, lock)?;
            let (current, mode) = match self.read(path).await? {
                None => (None, PutMode::Create),
                Some((
                    _,
                    UpdateVersion {
                        e_tag: None,
                        version: None,
                    },
                )) => {
                    return Err(AdmitError::backend(CorruptFence(format!(
                        "{path}: the store reports no version, so it cannot write conditionally"
                    ))))
                }
                Some((envelope, version)) => (Some(envelope), PutMode::Update(version)),
            };
            let mark = HighWater {
                epoch: current.as_ref().map_or(0, |e| e.epoch),
                seq: 0,
            };
            if let Some(bound) = current.as_ref().filter(|e| e.lock != lock) {
                return Err(AdmitError::WrongLock {
                    expected: bound.lock.clone(),
                    token_lock: claims.lock.clone(),
                });
            }
            let admitted = decide(mark, Policy::Epoch, &claims, None)?;
            let value = match change {
                Change::Put(value) => Some(value),
                Change::Delete => None,
                Change::Keep => current.and_then(|e| e.value),
            };
            let next = Envelope {
                lock: lock.to_owned(),
                epoch: admitted.high_water.epoch,
                value,
            };
            let options = PutOptions {
                mode,
                ..PutOptions::default()
            };
            match self
                .store
                .put_opts(path, next.encode().into(), options)
                .await
            {
                Ok(_) => Ok(admitted),
                Err(
                    object_store::Error::Precondition { .. }
                    | object_store::Error::AlreadyExists { .. },
                ) => Err(AdmitError::Conflict),
                Err(e) => Err(AdmitError::backend(e)),
            }
        }
        .await;
        trust.record(ResourceKind::ObjectStore, lock, &outcome);
        outcome
    }
}
