//! Issuer keys: the private [`Signer`], the swappable [`ActiveSigner`] and the public
//! [`KeyRing`].

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::{Claims, TOKEN_PREFIX};

/// A key id: the first 8 bytes of SHA-256 of the public key, in hex.
pub type KeyId = String;

/// The id of a public key (what tokens signed by it carry).
pub fn key_id_of(key: &VerifyingKey) -> KeyId {
    let digest = Sha256::digest(key.as_bytes());
    hex::encode(&digest[..8])
}

/// The issuer's signing key. Only the issuer holds one; resources hold a [`KeyRing`].
#[derive(Clone)]
pub struct Signer {
    key: SigningKey,
    key_id: KeyId,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("Signer")
            .field("key_id", &self.key_id)
            .finish()
    }
}

impl Signer {
    /// Creates a new random key.
    pub fn generate() -> Self {
        Self::from_secret(SigningKey::generate(&mut rand::rngs::OsRng).to_bytes())
    }

    /// Rebuilds a signer from its 32-byte secret.
    pub fn from_secret(secret: [u8; 32]) -> Self {
        let key = SigningKey::from_bytes(&secret);
        let key_id = key_id_of(&key.verifying_key());
        Signer { key, key_id }
    }

    /// The 32-byte secret, for storing in the key file.
    pub fn secret(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// This key's id, carried in every token it signs.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The public half.
    pub fn public_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// Signs a token for `lock` at `epoch` held by `holder`.
    ///
    /// The caller (the issuer) is responsible for the epoch being durable and fresh; this
    /// function only encodes and signs.
    pub fn issue(&self, lock: &str, epoch: u64, holder: &str) -> String {
        let claims = Claims {
            lock: lock.to_owned(),
            epoch,
            holder: holder.to_owned(),
            key_id: self.key_id.clone(),
        };
        let payload = serde_json::to_vec(&claims).expect("claims always serialise");
        let mut text = String::with_capacity(TOKEN_PREFIX.len() + 2 + payload.len() * 2 + 90);
        text.push_str(TOKEN_PREFIX);
        text.push('.');
        B64.encode_string(&payload, &mut text);
        let signature = self.key.sign(text.as_bytes());
        text.push('.');
        B64.encode_string(signature.to_bytes(), &mut text);
        text
    }
}

/// The issuer's current signing key, replaceable while tokens are being issued.
///
/// Why a separate type: a rotation must reach every place that signs at once, without
/// restarting the issuer and without a lock on the signing path. Clones share one slot;
/// [`ActiveSigner::replace`] is seen by every clone's next signature. A signature already
/// under way finishes with the key it started with, so a token signed in the instant of a
/// rotation may carry the previous key, which still verifies until it is retired.
#[derive(Clone)]
pub struct ActiveSigner {
    current: Arc<ArcSwap<Signer>>,
}

impl std::fmt::Debug for ActiveSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveSigner")
            .field("key_id", &self.key_id())
            .finish()
    }
}

impl ActiveSigner {
    /// Starts with `signer`.
    pub fn new(signer: Signer) -> Self {
        ActiveSigner {
            current: Arc::new(ArcSwap::from_pointee(signer)),
        }
    }

    /// The key signing now.
    pub fn current(&self) -> Arc<Signer> {
        self.current.load_full()
    }

    /// The id of the key signing now.
    pub fn key_id(&self) -> KeyId {
        self.current.load().key_id().to_owned()
    }

    /// Makes `signer` the key of every later signature; returns the one it replaced.
    pub fn replace(&self, signer: Signer) -> Arc<Signer> {
        self.current.swap(Arc::new(signer))
    }

    /// Signs a token with the key signing now (see [`Signer::issue`]).
    pub fn issue(&self, lock: &str, epoch: u64, holder: &str) -> String {
        self.current.load().issue(lock, epoch, holder)
    }
}

impl From<Signer> for ActiveSigner {
    fn from(signer: Signer) -> Self {
        ActiveSigner::new(signer)
    }
}

/// The public keys a resource trusts, by key id.
#[derive(Debug, Clone, Default)]
pub struct KeyRing {
    keys: HashMap<KeyId, VerifyingKey>,
}

impl KeyRing {
    /// An empty ring: it trusts nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a public key and returns its id.
    pub fn insert(&mut self, key: VerifyingKey) -> KeyId {
        let id = key_id_of(&key);
        self.keys.insert(id.clone(), key);
        id
    }

    /// Adds a public key given as 32 raw bytes.
    pub fn insert_bytes(
        &mut self,
        bytes: &[u8; 32],
    ) -> Result<KeyId, ed25519_dalek::SignatureError> {
        Ok(self.insert(VerifyingKey::from_bytes(bytes)?))
    }

    /// Looks a key up by id.
    pub fn get(&self, key_id: &str) -> Option<&VerifyingKey> {
        self.keys.get(key_id)
    }

    /// Whether a key with this id is trusted.
    pub fn contains(&self, key_id: &str) -> bool {
        self.keys.contains_key(key_id)
    }

    /// Stops trusting a key; true if it was trusted.
    pub fn remove(&mut self, key_id: &str) -> bool {
        self.keys.remove(key_id).is_some()
    }

    /// How many keys are trusted.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when nothing is trusted.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The ring `GET /v1/keys` describes: every listed Ed25519 key whose `status` is
    /// `active` or `verifying` (or absent, as servers before key rotation list keys), and
    /// nothing else. A key listed as `retired`, or with a status or algorithm this version
    /// does not know, is left out: an unknown status fails closed.
    ///
    /// Replacing a verifier's ring with this one on every refresh
    /// ([`crate::Verifier::set_keys`]) also drops the keys that left the list.
    pub fn from_listing(listing: &KeyListing) -> Result<KeyRing, ListingError> {
        let mut ring = KeyRing::new();
        for key in &listing.keys {
            let trusted = matches!(key.status.as_deref(), None | Some("active" | "verifying"));
            if !trusted || key.alg != "Ed25519" {
                continue;
            }
            let bytes: [u8; 32] = B64
                .decode(&key.public_key)
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| {
                    ListingError(format!("key {:?}: not 32 bytes of base64url", key.key_id))
                })?;
            let public = VerifyingKey::from_bytes(&bytes)
                .map_err(|e| ListingError(format!("key {:?}: {e}", key.key_id)))?;
            let id = key_id_of(&public);
            if id != key.key_id {
                return Err(ListingError(format!(
                    "key {:?} is listed under the wrong id (its id is {id:?})",
                    key.key_id
                )));
            }
            ring.insert(public);
        }
        Ok(ring)
    }

    /// All keys, as (id, base64url public key), sorted by id.
    pub fn public_keys(&self) -> Vec<(KeyId, String)> {
        let mut keys: Vec<_> = self
            .keys
            .iter()
            .map(|(id, key)| (id.clone(), B64.encode(key.as_bytes())))
            .collect();
        keys.sort();
        keys
    }
}

/// The body of `GET /v1/keys`, as resources read it to build their [`KeyRing`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyListing {
    pub keys: Vec<ListedKey>,
}

/// One key of [`KeyListing`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListedKey {
    pub key_id: String,
    pub alg: String,
    /// base64url of the 32-byte public key.
    pub public_key: String,
    /// `active` (signs new tokens), `verifying` (its tokens still verify), or `retired`
    /// (its tokens do not verify). Absent from servers before key rotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// A key listing that names a key wrongly (bad bytes, or an id that is not the key's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad key listing: {0}")]
pub struct ListingError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(signer: &Signer, status: Option<&str>) -> ListedKey {
        ListedKey {
            key_id: signer.key_id().to_owned(),
            alg: "Ed25519".to_owned(),
            public_key: B64.encode(signer.public_key().as_bytes()),
            status: status.map(str::to_owned),
        }
    }

    #[test]
    fn a_listing_is_trusted_by_status() {
        let [active, verifying, unlabelled, retired, odd] = [(); 5].map(|_| Signer::generate());
        let listing = KeyListing {
            keys: vec![
                listed(&active, Some("active")),
                listed(&verifying, Some("verifying")),
                listed(&unlabelled, None),
                listed(&retired, Some("retired")),
                listed(&odd, Some("suspended")),
            ],
        };
        let ring = KeyRing::from_listing(&listing).unwrap();
        for trusted in [&active, &verifying, &unlabelled] {
            assert!(ring.contains(trusted.key_id()));
        }
        for refused in [&retired, &odd] {
            assert!(!ring.contains(refused.key_id()));
        }
        assert_eq!(ring.len(), 3);

        let mut wrong_id = listed(&active, Some("active"));
        wrong_id.key_id = verifying.key_id().to_owned();
        assert!(KeyRing::from_listing(&KeyListing {
            keys: vec![wrong_id]
        })
        .is_err());
        let mut bad_bytes = listed(&active, None);
        bad_bytes.public_key = "AAAA".to_owned();
        assert!(KeyRing::from_listing(&KeyListing {
            keys: vec![bad_bytes]
        })
        .is_err());
    }

    #[test]
    fn a_replaced_signer_signs_every_clones_next_token() {
        let (a, b) = (Signer::generate(), Signer::generate());
        let active = ActiveSigner::new(a.clone());
        let clone = active.clone();
        assert_eq!(clone.key_id(), a.key_id());
        assert_eq!(active.replace(b.clone()).key_id(), a.key_id());
        assert_eq!(clone.key_id(), b.key_id());
        assert_eq!(clone.issue("l", 1, "h"), b.issue("l", 1, "h"));
    }
}
