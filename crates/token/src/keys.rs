//! Issuer keys: the private [`Signer`] and the public [`KeyRing`].

use std::collections::HashMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use crate::{Claims, TOKEN_PREFIX};

/// A key id: the first 8 bytes of SHA-256 of the public key, in hex.
pub type KeyId = String;

fn key_id_of(key: &VerifyingKey) -> KeyId {
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
