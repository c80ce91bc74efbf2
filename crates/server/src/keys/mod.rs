//! # Keys: the issuer's signing keys while the server runs (rotation)
//!
//! A server signs with the active key of its [`KeySet`] and verifies with its active and
//! verifying keys, plus any `--trust-key-file` keys. The set lives in the data directory
//! ([`mod@file`], embedded backend) or in etcd (`palisade_etcd::EtcdKeySet`, shared by every
//! node); [`KeyRegistry`] holds it while serving and applies every change at once:
//!
//! - **rotate**: a new random key becomes active, the previous one verifying. The new set
//!   is made durable first (file fsync'd and renamed, or etcd transaction committed),
//!   then the verifier trusts the new key, then the issuer signs with it. Tokens answered
//!   after the rotation's answer carry the new key; old tokens keep verifying.
//! - **retire**: a verifying key is retired. Durable first, then the verifier drops it:
//!   from the answer on, its tokens get `invalid_token`, even those the verifier had
//!   cached (the cache re-checks the key on every hit, see `palisade_token::Verifier`).
//!   The active key cannot be retired.
//!
//! Changes on one node are serialised (one at a time); over etcd, nodes serialise through
//! etcd's compare-and-swap. Each node of an etcd deployment reads the set again every
//! [`KEY_SET_POLL`], and at once (at most every [`MIN_REFRESH_GAP`]) when a token names a
//! key it does not know, so a key rotated in on one node verifies on the others from the
//! first token it signs.
//!
//! ## What this does not do
//! - It does not know which tokens are outstanding: retiring a key refuses the tokens of
//!   leases still being renewed, whose holders must acquire again.
//! - Over etcd, a retirement reaches the other nodes within [`KEY_SET_POLL`] (plus the
//!   time of one etcd read), not at once: until then they still accept the retired key's
//!   tokens, and may still sign with a key that another node rotated out.

use palisade_datadir::keys::file;
pub use palisade_datadir::keys::offline;

use palisade_api::{ErrorDetail, QuotaResource};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use palisade_token::{
    ActiveSigner, Claims, KeySetError, Signer, TokenError, Verifier, VerifyingKey,
};
pub use palisade_token::{KeySet, KeyState};

pub use file::{
    has_database, load_secret, open_for_serving, read_legacy, read_set, refuse_keys_without_epochs,
    remove_legacy, store, trusted_keys, way_out, Origin, KEY_SET_FILE, LEGACY_KEY_FILE,
};

use crate::error::ApiError;

/// How often each node of an etcd deployment reads the key set again.
pub const KEY_SET_POLL: Duration = Duration::from_secs(1);

/// Shortest time between two reads of the key set caused by tokens of unknown keys: a
/// flood of tokens naming made-up keys costs etcd at most ten reads a second.
pub const MIN_REFRESH_GAP: Duration = Duration::from_millis(100);

pub use palisade_datadir::now_unix;

/// Where a running server's key set is kept.
pub enum KeyStore {
    /// `signing-keys.json` in this data directory.
    Dir(std::path::PathBuf),
    /// Under the etcd prefix, shared by every node.
    #[cfg(feature = "etcd")]
    Etcd(Box<palisade_etcd::EtcdKeySet>),
}

/// Why a rotation or retirement did not happen. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum KeyChangeError {
    #[error(transparent)]
    Refused(#[from] KeySetError),
    #[error("cannot store the key set: {0}")]
    Storage(String),
}

impl From<KeyChangeError> for ApiError {
    fn from(e: KeyChangeError) -> Self {
        let message = e.to_string();
        match e {
            KeyChangeError::Refused(KeySetError::UnknownKey(id)) => {
                ApiError::new(ErrorDetail::NotFound { key_id: Some(id) }, message)
            }
            KeyChangeError::Refused(KeySetError::ActiveKey(id)) => {
                ApiError::new(ErrorDetail::KeyActive { key_id: id }, message)
            }
            KeyChangeError::Refused(KeySetError::TooManyKeys(n)) => {
                let detail = ErrorDetail::QuotaExceeded {
                    resource: QuotaResource::VerifyingKeys,
                    limit: n as u64,
                };
                ApiError::new(detail, message)
            }
            KeyChangeError::Refused(KeySetError::DuplicateKey(_) | KeySetError::Damaged(_))
            | KeyChangeError::Storage(_) => ApiError::new(ErrorDetail::StorageFailed, message),
        }
    }
}

/// One key as the API and `admin keys list` show it.
pub use palisade_api::wire::AdminKey;

pub use palisade_datadir::keys::views;

/// The set in use and the store revision it came from (a poll must never put back an
/// older set than one a change here already applied).
struct Applied {
    set: Arc<KeySet>,
    revision: i64,
}

/// The key set of a running server. See the module docs.
pub struct KeyRegistry {
    signer: ActiveSigner,
    verifier: Arc<Verifier>,
    /// `--trust-key-file` keys: verified unless the set retired them.
    trusted: Vec<VerifyingKey>,
    applied: Mutex<Applied>,
    store: KeyStore,
    /// One change at a time on this node.
    changing: tokio::sync::Mutex<()>,
    /// When the last read of the key set for an unknown key started.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
}

impl KeyRegistry {
    /// A registry serving `set` (read from `store` at `revision`), trusting `trusted` too,
    /// with a verifier caching up to `token_cache` tokens.
    pub fn new(
        set: KeySet,
        revision: i64,
        trusted: Vec<VerifyingKey>,
        store: KeyStore,
        token_cache: usize,
    ) -> Arc<KeyRegistry> {
        let ring = ring_of(&set, &trusted);
        Arc::new(KeyRegistry {
            signer: ActiveSigner::new(set.signer()),
            verifier: Arc::new(Verifier::new(ring, token_cache)),
            trusted,
            applied: Mutex::new(Applied {
                set: Arc::new(set),
                revision,
            }),
            store,
            changing: tokio::sync::Mutex::new(()),
            refreshed: tokio::sync::Mutex::new(None),
        })
    }

    /// The signer the issuer signs with; a rotation replaces its key.
    pub fn signer(&self) -> ActiveSigner {
        self.signer.clone()
    }

    /// The verifier of every token this server checks.
    pub fn verifier(&self) -> Arc<Verifier> {
        self.verifier.clone()
    }

    /// The key set in use.
    pub fn key_set(&self) -> Arc<KeySet> {
        self.lock().set.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Applied> {
        // Held only to compare and swap two fields: a panic cannot leave them torn.
        self.applied.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every key of the set and every trusted key, as `GET /v1/admin/keys` lists them.
    pub fn all_keys(&self) -> Vec<AdminKey> {
        let set = self.key_set();
        let mut keys = views(&set);
        keys.extend(self.trust_file_views(&set));
        keys
    }

    /// The keys whose tokens verify, as `GET /v1/keys` lists them.
    pub fn verifying_keys(&self) -> Vec<AdminKey> {
        let mut keys = self.all_keys();
        keys.retain(|k| k.status != KeyState::Retired.as_str());
        keys
    }

    fn trust_file_views(&self, set: &KeySet) -> Vec<AdminKey> {
        self.trusted
            .iter()
            .filter(|k| set.get(&palisade_token::key_id_of(k)).is_none())
            .map(|k| AdminKey {
                key_id: palisade_token::key_id_of(k),
                alg: "Ed25519".into(),
                public_key: base64_url(k),
                status: KeyState::Verifying.as_str().into(),
                source: "trust_file".into(),
                created_at: None,
                replaced_at: None,
                retired_at: None,
            })
            .collect()
    }

    /// Makes `set` (stored at `revision`) the one in use, unless a newer one already is.
    /// The verifier learns the new ring before the signer changes key, so no token is
    /// signed by a key this node does not yet trust.
    fn apply(&self, set: KeySet, revision: i64) -> bool {
        let mut applied = self.lock();
        if revision <= applied.revision || *applied.set == set {
            applied.revision = applied.revision.max(revision);
            return false;
        }
        self.verifier.set_keys(ring_of(&set, &self.trusted));
        if set.active().key_id != applied.set.active().key_id {
            self.signer.replace(set.signer());
        }
        tracing::info!(
            active = %set.active().key_id,
            keys = set.keys().len(),
            revision,
            "key set applied"
        );
        *applied = Applied {
            set: Arc::new(set),
            revision,
        };
        true
    }

    /// Makes a new random key active; the active one becomes verifying. Returns the new
    /// set, durable and applied.
    pub async fn rotate(&self, now: u64) -> Result<Arc<KeySet>, KeyChangeError> {
        let next_key = Signer::generate();
        self.change(move |set| set.rotate(next_key.clone(), now).map(Some))
            .await
            .map(|(set, _)| set)
    }

    /// Retires a verifying key. Returns the set and whether anything changed (retiring a
    /// retired key changes nothing).
    pub async fn retire(
        &self,
        key_id: &str,
        now: u64,
    ) -> Result<(Arc<KeySet>, bool), KeyChangeError> {
        self.change(|set| set.retire(key_id, now)).await
    }

    async fn change(
        &self,
        change: impl Fn(&KeySet) -> Result<Option<KeySet>, KeySetError> + Send + Sync,
    ) -> Result<(Arc<KeySet>, bool), KeyChangeError> {
        let _one_at_a_time = self.changing.lock().await;
        match &self.store {
            KeyStore::Dir(dir) => {
                let (current, revision) = {
                    let applied = self.lock();
                    (applied.set.clone(), applied.revision)
                };
                let Some(next) = change(&current)? else {
                    return Ok((current, false));
                };
                let (dir, stored) = (dir.clone(), next.clone());
                tokio::task::spawn_blocking(move || file::store(&dir, &stored))
                    .await
                    .map_err(|e| KeyChangeError::Storage(e.to_string()))?
                    .map_err(KeyChangeError::Storage)?;
                self.apply(next, revision + 1);
                Ok((self.key_set(), true))
            }
            #[cfg(feature = "etcd")]
            KeyStore::Etcd(etcd) => {
                let updated = etcd
                    .update(change)
                    .await
                    .map_err(|e| KeyChangeError::Storage(e.to_string()))??;
                match updated {
                    Some(stored) => {
                        self.apply(stored.set, stored.revision);
                        Ok((self.key_set(), true))
                    }
                    None => Ok((self.key_set(), false)),
                }
            }
        }
    }

    /// Reads the shared key set again and applies it if it changed. Nothing to do for a
    /// data directory's set, which only this server changes.
    pub async fn refresh(&self) -> Result<bool, String> {
        match &self.store {
            KeyStore::Dir(_) => Ok(false),
            #[cfg(feature = "etcd")]
            KeyStore::Etcd(etcd) => match etcd.read().await.map_err(|e| e.to_string())? {
                Some(stored) => Ok(self.apply(stored.set, stored.revision)),
                None => Err("the key set disappeared from etcd".to_owned()),
            },
        }
    }

    /// Verifies a token. A token naming a key this node does not know makes a shared set
    /// be read again first (a key rotated in on another node), at most every
    /// [`MIN_REFRESH_GAP`]; a retired key's token is refused as such.
    pub async fn verify(&self, token: &str) -> Result<Arc<Claims>, ApiError> {
        let seen = Instant::now();
        match self.verifier.verify(token) {
            Ok(claims) => Ok(claims),
            Err(TokenError::UnknownKey(key_id)) => {
                if self.is_shared() {
                    self.refresh_after(seen).await;
                    match self.verifier.verify(token) {
                        Err(TokenError::UnknownKey(_)) => {}
                        other => return other.map_err(ApiError::from),
                    }
                }
                let retired = self
                    .key_set()
                    .get(&key_id)
                    .is_some_and(|k| k.state == KeyState::Retired);
                Err(if retired {
                    ApiError::invalid_token(format!("token signed by retired key {key_id:?}"))
                } else {
                    TokenError::UnknownKey(key_id).into()
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    fn is_shared(&self) -> bool {
        !matches!(self.store, KeyStore::Dir(_))
    }

    /// Reads the shared set unless a read that started after `seen` already finished.
    async fn refresh_after(&self, seen: Instant) {
        let mut last = self.refreshed.lock().await;
        if last.is_some_and(|started| started >= seen) {
            return;
        }
        if let Some(started) = *last {
            tokio::time::sleep_until((started + MIN_REFRESH_GAP).into()).await;
        }
        *last = Some(Instant::now());
        if let Err(e) = self.refresh().await {
            tracing::warn!(error = %e, "cannot read the key set");
        }
    }

    /// Reads a shared key set every [`KEY_SET_POLL`] while the registry lives.
    pub fn spawn_poll(self: &Arc<Self>) {
        if !self.is_shared() {
            return;
        }
        let registry: Weak<KeyRegistry> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                tokio::time::sleep(KEY_SET_POLL).await;
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                match registry.refresh().await {
                    Ok(_) if failing => {
                        tracing::info!("key set readable again");
                        failing = false;
                    }
                    Ok(_) => {}
                    Err(e) if !failing => {
                        tracing::warn!(error = %e, "cannot read the key set; keys in use stay");
                        failing = true;
                    }
                    Err(_) => {}
                }
            }
        });
    }
}

fn ring_of(set: &KeySet, trusted: &[VerifyingKey]) -> palisade_token::KeyRing {
    let mut ring = set.ring();
    for key in trusted {
        // A key the set retired stays retired, whatever the flags say.
        let retired = set
            .get(&palisade_token::key_id_of(key))
            .is_some_and(|k| k.state == KeyState::Retired);
        if !retired {
            ring.insert(*key);
        }
    }
    ring
}

fn base64_url(key: &VerifyingKey) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use base64::Engine;
    B64.encode(key.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rotation_and_retirement_apply_at_once_and_durably() {
        let dir = tempfile::tempdir().unwrap();
        let (set, _) = open_for_serving(dir.path(), None, true, 1).unwrap();
        let first = set.signer();
        let trusted = Signer::generate();
        let registry = KeyRegistry::new(
            set,
            0,
            vec![trusted.public_key()],
            KeyStore::Dir(dir.path().to_owned()),
            64,
        );
        let signer = registry.signer();
        let old_token = signer.issue("l", 1, "h");
        registry.verify(&old_token).await.unwrap();
        registry.verify(&trusted.issue("l", 1, "h")).await.unwrap();

        let rotated = registry.rotate(2).await.unwrap();
        assert_ne!(
            signer.key_id(),
            first.key_id(),
            "the issuer signs with the new key"
        );
        assert_eq!(signer.key_id(), rotated.active().key_id);
        let new_token = signer.issue("l", 2, "h");
        registry.verify(&new_token).await.unwrap();
        registry.verify(&old_token).await.unwrap();
        // Durable: the file holds the rotated set.
        let on_disk = read_set(&dir.path().join(KEY_SET_FILE)).unwrap().unwrap();
        assert_eq!(on_disk, *rotated);
        let listed: Vec<(String, String, String)> = registry
            .verifying_keys()
            .into_iter()
            .map(|k| (k.key_id, k.status, k.source))
            .collect();
        assert_eq!(
            listed,
            vec![
                (
                    first.key_id().to_owned(),
                    "verifying".into(),
                    "key_set".into()
                ),
                (signer.key_id(), "active".into(), "key_set".into()),
                (
                    trusted.key_id().to_owned(),
                    "verifying".into(),
                    "trust_file".into()
                ),
            ]
        );

        let active = signer.key_id();
        assert!(matches!(
            registry.retire(&active, 3).await,
            Err(KeyChangeError::Refused(KeySetError::ActiveKey(_)))
        ));
        let (_, changed) = registry.retire(first.key_id(), 3).await.unwrap();
        assert!(changed);
        let refused = registry.verify(&old_token).await.unwrap_err();
        assert_eq!(refused.code(), palisade_api::ErrorCode::InvalidToken);
        assert!(format!("{refused:?}").contains("retired"), "{refused:?}");
        registry.verify(&new_token).await.unwrap();
        let (_, changed) = registry.retire(first.key_id(), 4).await.unwrap();
        assert!(!changed);
        assert_eq!(registry.verifying_keys().len(), 2);
        assert_eq!(registry.all_keys().len(), 3);
    }
}
