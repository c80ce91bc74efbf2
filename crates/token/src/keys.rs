//! Issuer keys: the private [`Signer`], the swappable [`ActiveSigner`] and the public
//! [`KeyRing`].

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use curve25519_dalek::scalar::Scalar;
use ed25519_dalek::hazmat::ExpandedSecretKey;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256, Sha512};

use crate::nonce::{Nonce, NoncePool};
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
    /// The key's secret scalar, expanded once (RFC 8032 hashes the secret for it).
    expanded: Arc<ExpandedSecretKey>,
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
        let expanded = Arc::new(ExpandedSecretKey::from(key.as_bytes()));
        Signer {
            key,
            expanded,
            key_id,
        }
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

    /// Signs a token for `lock` at `epoch` held by `holder`, deterministically (RFC 8032:
    /// the same key and claims always give the same token).
    ///
    /// The caller (the issuer) is responsible for the epoch being durable and fresh; this
    /// function only encodes and signs.
    pub fn issue(&self, lock: &str, epoch: u64, holder: &str) -> String {
        self.encode(lock, epoch, holder, |message| self.key.sign(message))
    }

    /// Signs a token as [`Signer::issue`] does, with a nonce made ahead (see
    /// [`crate::nonce`]): a hash and a multiply-add instead of a scalar multiplication. The
    /// token verifies exactly as one from `issue` does; its signature bytes differ, as the
    /// nonce does.
    pub fn issue_with(&self, nonce: Nonce, lock: &str, epoch: u64, holder: &str) -> String {
        self.encode(lock, epoch, holder, |message| {
            self.sign_with(nonce, message)
        })
    }

    /// `pal1.<payload>.<signature>`, the signature made by `sign` over the text before it.
    fn encode(
        &self,
        lock: &str,
        epoch: u64,
        holder: &str,
        sign: impl FnOnce(&[u8]) -> Signature,
    ) -> String {
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
        let signature = sign(text.as_bytes());
        text.push('.');
        B64.encode_string(signature.to_bytes(), &mut text);
        text
    }

    /// Ed25519 with the nonce given: `(R, s)`, `s = r + SHA-512(R ‖ A ‖ M)·a` (RFC 8032
    /// section 5.1.6, steps 3 to 6, with `r` the nonce's instead of one derived from the
    /// message). The nonce is consumed, so it signs once.
    fn sign_with(&self, nonce: Nonce, message: &[u8]) -> Signature {
        let challenge = Scalar::from_hash(
            Sha512::new()
                .chain_update(nonce.commitment().as_bytes())
                .chain_update(self.key.verifying_key().as_bytes())
                .chain_update(message),
        );
        let s = challenge * self.expanded.scalar + nonce.secret();
        Signature::from_components(nonce.commitment().to_bytes(), s.to_bytes())
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
    /// Nonces made ahead, shared by every key this signer has (they do not depend on it).
    nonces: Arc<NoncePool>,
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
            nonces: Arc::new(NoncePool::new()),
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

    /// A nonce for one signature with [`Signer::issue_with`], made ahead when one is ready.
    pub fn nonce(&self) -> Nonce {
        self.nonces.take()
    }

    /// Signs a token with the key signing now and a nonce made ahead (see
    /// [`Signer::issue_with`]).
    pub fn issue(&self, lock: &str, epoch: u64, holder: &str) -> String {
        self.current
            .load()
            .issue_with(self.nonce(), lock, epoch, holder)
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
        let claims = crate::Verifier::new(ring_of(&b), 1)
            .verify(&clone.issue("l", 1, "h"))
            .unwrap();
        assert_eq!(claims.key_id, b.key_id());
    }

    fn ring_of(signer: &Signer) -> KeyRing {
        let mut ring = KeyRing::new();
        ring.insert(signer.public_key());
        ring
    }

    /// Given the nonce RFC 8032 derives (SHA-512 of the key's prefix and the message),
    /// signing with a nonce gives the library's own signature, byte for byte: the
    /// arithmetic of `sign_with` is Ed25519's.
    #[test]
    fn signing_with_the_rfc_nonce_is_the_library_signature() {
        use rand::RngCore as _;
        for len in 0..300 {
            let signer = Signer::generate();
            let mut message = vec![0u8; len];
            rand::thread_rng().fill_bytes(&mut message);
            let rfc_nonce = Scalar::from_hash(
                Sha512::new()
                    .chain_update(signer.expanded.hash_prefix)
                    .chain_update(&message),
            );
            assert_eq!(
                signer.sign_with(Nonce::from_scalar(rfc_nonce), &message),
                signer.key.sign(&message),
                "message of {len} bytes"
            );
        }
    }

    /// Tokens signed with nonces made ahead pass the library's `verify_strict` and the
    /// verifier, carry the claims asked for, and never share a nonce: the same claims
    /// signed twice are two different tokens, both good. An edited `s` is refused.
    #[test]
    fn tokens_signed_with_nonces_made_ahead_verify_strictly() {
        let signer = Signer::generate();
        let active = ActiveSigner::new(signer.clone());
        let verifier = crate::Verifier::new(ring_of(&signer), 1024);
        let mut nonces = std::collections::HashSet::new();
        for epoch in 1..=600 {
            let holder = format!("worker-{}", epoch % 7);
            let token = active.issue("orders", epoch, &holder);
            let (signed, signature) = token.rsplit_once('.').unwrap();
            let signature = Signature::from_slice(&B64.decode(signature).unwrap()).unwrap();
            signer
                .public_key()
                .verify_strict(signed.as_bytes(), &signature)
                .unwrap();
            let claims = verifier.verify(&token).unwrap();
            assert_eq!(
                (claims.lock.as_str(), claims.epoch, claims.holder.as_str()),
                ("orders", epoch, holder.as_str())
            );
            assert!(nonces.insert(*signature.r_bytes()), "a nonce signed twice");
        }
        let (a, b) = (active.issue("l", 1, "h"), active.issue("l", 1, "h"));
        assert_ne!(a, b);
        assert!(verifier.verify(&a).is_ok() && verifier.verify(&b).is_ok());

        let (signed, signature) = a.rsplit_once('.').unwrap();
        let mut bytes = B64.decode(signature).unwrap();
        bytes[40] ^= 1;
        let edited = format!("{signed}.{}", B64.encode(&bytes));
        assert!(verifier.verify(&edited).is_err());
    }
}
