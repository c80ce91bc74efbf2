//! The issuer's key set: every signing key it has had, and what each may still do.
//!
//! | state | signs new tokens | its tokens verify | secret kept |
//! |---|---|---|---|
//! | `active` | yes (exactly one key) | yes | yes |
//! | `verifying` | no | yes | no |
//! | `retired` | no | no (`invalid_token`) | no |
//!
//! A key only moves down this table: [`KeySet::rotate`] makes a new key active and the
//! previous one verifying; [`KeySet::retire`] retires a verifying key. The active key
//! cannot be retired (rotate first), and a retired key never comes back. Only the active
//! key's secret is kept: a key that will never sign again needs none, and a secret that is
//! not stored cannot leak.
//!
//! This module is pure: it decides and encodes, with the time passed in. Where the set is
//! stored (a file in the data directory, a key in etcd) and how a running server applies
//! it belong to the server and the etcd crate.
//!
//! ## What it does not do
//! - It does not know which tokens are outstanding. Retiring a key refuses every token it
//!   signed, including those of leases still being renewed: their holders must acquire
//!   again. Retire a key once the leases granted before its rotation have ended.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};

use crate::keys::key_id_of;
use crate::{KeyId, KeyRing, Signer};

/// Verifying keys a set may hold at once; a rotation beyond it is refused until an old
/// key is retired. Every one is tried by nobody (lookup is by id), but each is listed at
/// `GET /v1/keys` and kept by every resource, so the list stays short.
pub const MAX_VERIFYING_KEYS: usize = 16;

/// Retired keys remembered (for `keys list` and for naming a retired key in an error);
/// older ones are forgotten.
pub const MAX_RETIRED_KEPT: usize = 32;

/// The encoding's version number.
const FORMAT: u32 = 1;

/// Largest encoded set accepted by [`KeySet::decode`].
pub const MAX_ENCODED_LEN: usize = 256 * 1024;

/// What a key may still do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyState {
    /// Signs new tokens; exactly one key of a set.
    Active,
    /// An earlier key: its tokens still verify.
    Verifying,
    /// Its tokens are refused.
    Retired,
}

impl KeyState {
    /// The state as written in files and answers.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Active => "active",
            KeyState::Verifying => "verifying",
            KeyState::Retired => "retired",
        }
    }
}

impl std::fmt::Display for KeyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One key of a set. Times are seconds since the Unix epoch.
#[derive(Clone)]
pub struct KeyRecord {
    pub key_id: KeyId,
    pub state: KeyState,
    pub public_key: VerifyingKey,
    /// Only the active key's.
    secret: Option<Signer>,
    /// When the key was made.
    pub created_at: u64,
    /// When it stopped signing (a rotation made another key active).
    pub replaced_at: Option<u64>,
    /// When it was retired.
    pub retired_at: Option<u64>,
}

impl std::fmt::Debug for KeyRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("KeyRecord")
            .field("key_id", &self.key_id)
            .field("state", &self.state)
            .field("created_at", &self.created_at)
            .field("replaced_at", &self.replaced_at)
            .field("retired_at", &self.retired_at)
            .finish_non_exhaustive()
    }
}

impl PartialEq for KeyRecord {
    fn eq(&self, other: &Self) -> bool {
        self.key_id == other.key_id
            && self.state == other.state
            && self.public_key == other.public_key
            && self.secret.as_ref().map(Signer::secret) == other.secret.as_ref().map(Signer::secret)
            && self.created_at == other.created_at
            && self.replaced_at == other.replaced_at
            && self.retired_at == other.retired_at
    }
}

impl Eq for KeyRecord {}

impl KeyRecord {
    /// The public key in base64url, as `GET /v1/keys` shows it.
    pub fn public_key_b64(&self) -> String {
        B64.encode(self.public_key.as_bytes())
    }
}

/// Why a key set operation was refused, or an encoded set could not be read. Nothing
/// changes when one of these is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeySetError {
    /// No key with this id in the set.
    #[error("no key {0:?} in the key set")]
    UnknownKey(String),
    /// The active key cannot be retired: tokens are being signed with it.
    #[error(
        "key {0:?} is the active signing key and cannot be retired; rotate first, then retire it"
    )]
    ActiveKey(String),
    /// A rotation would keep more than [`MAX_VERIFYING_KEYS`] verifying keys.
    #[error("the key set already holds {0} verifying keys; retire one before rotating")]
    TooManyKeys(usize),
    /// The new key is already in the set.
    #[error("key {0:?} is already in the key set")]
    DuplicateKey(String),
    /// The encoded set is not a valid key set.
    #[error("not a valid key set: {0}")]
    Damaged(String),
}

/// An issuer's keys. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySet {
    /// In the order they were made.
    keys: Vec<KeyRecord>,
}

impl KeySet {
    /// A set whose only key is `first`, active.
    pub fn new(first: Signer, now: u64) -> KeySet {
        KeySet {
            keys: vec![active_record(first, now)],
        }
    }

    /// Every key, oldest first.
    pub fn keys(&self) -> &[KeyRecord] {
        &self.keys
    }

    /// The key with this id.
    pub fn get(&self, key_id: &str) -> Option<&KeyRecord> {
        self.keys.iter().find(|k| k.key_id == key_id)
    }

    /// The active key's record.
    pub fn active(&self) -> &KeyRecord {
        self.keys
            .iter()
            .find(|k| k.state == KeyState::Active)
            .expect("a key set always has an active key (checked at every change and decode)")
    }

    /// The signer of the active key.
    pub fn signer(&self) -> Signer {
        self.active()
            .secret
            .clone()
            .expect("the active key always has its secret (checked at every change and decode)")
    }

    /// The public keys whose tokens verify: the active key and the verifying ones.
    pub fn ring(&self) -> KeyRing {
        let mut ring = KeyRing::new();
        for key in self.keys.iter().filter(|k| k.state != KeyState::Retired) {
            ring.insert(key.public_key);
        }
        ring
    }

    /// A set in which `next` is active and the key active until now is verifying.
    pub fn rotate(&self, next: Signer, now: u64) -> Result<KeySet, KeySetError> {
        if self.get(next.key_id()).is_some() {
            return Err(KeySetError::DuplicateKey(next.key_id().to_owned()));
        }
        let verifying = self
            .keys
            .iter()
            .filter(|k| k.state == KeyState::Verifying)
            .count();
        if verifying + 1 > MAX_VERIFYING_KEYS {
            return Err(KeySetError::TooManyKeys(verifying));
        }
        let mut keys = self.keys.clone();
        for key in &mut keys {
            if key.state == KeyState::Active {
                key.state = KeyState::Verifying;
                key.replaced_at = Some(now);
                key.secret = None;
            }
        }
        keys.push(active_record(next, now));
        Ok(KeySet { keys })
    }

    /// A set in which `key_id` is retired; `None` if it already is (nothing to change).
    pub fn retire(&self, key_id: &str, now: u64) -> Result<Option<KeySet>, KeySetError> {
        let key = self
            .get(key_id)
            .ok_or_else(|| KeySetError::UnknownKey(key_id.to_owned()))?;
        match key.state {
            KeyState::Retired => return Ok(None),
            KeyState::Active => return Err(KeySetError::ActiveKey(key_id.to_owned())),
            KeyState::Verifying => {}
        }
        let mut keys = self.keys.clone();
        for key in keys.iter_mut().filter(|k| k.key_id == key_id) {
            key.state = KeyState::Retired;
            key.retired_at = Some(now);
            key.secret = None;
        }
        // Forget the oldest retired keys beyond the limit.
        let retired = keys.iter().filter(|k| k.state == KeyState::Retired).count();
        let mut excess = retired.saturating_sub(MAX_RETIRED_KEPT);
        keys.retain(|k| {
            if excess > 0 && k.state == KeyState::Retired {
                excess -= 1;
                return false;
            }
            true
        });
        Ok(Some(KeySet { keys }))
    }

    /// The stored form: JSON, with the active key's secret in hex. Whoever reads it can
    /// sign tokens: store it like a private key.
    pub fn encode(&self) -> Vec<u8> {
        let stored = Stored {
            format: FORMAT,
            keys: self
                .keys
                .iter()
                .map(|k| StoredKey {
                    key_id: k.key_id.clone(),
                    state: k.state,
                    alg: "Ed25519".to_owned(),
                    public_key: k.public_key_b64(),
                    secret: k.secret.as_ref().map(|s| hex::encode(s.secret())),
                    created_at: k.created_at,
                    replaced_at: k.replaced_at,
                    retired_at: k.retired_at,
                })
                .collect(),
        };
        let mut text = serde_json::to_vec_pretty(&stored).expect("a key set always serialises");
        text.push(b'\n');
        text
    }

    /// Reads a stored set, checking everything [`KeySet::encode`] promises: one active
    /// key with its secret, every id the id of its public key, no id twice.
    pub fn decode(bytes: &[u8]) -> Result<KeySet, KeySetError> {
        let damaged = |why: String| KeySetError::Damaged(why);
        if bytes.len() > MAX_ENCODED_LEN {
            return Err(damaged(format!("larger than {MAX_ENCODED_LEN} bytes")));
        }
        let stored: Stored = serde_json::from_slice(bytes).map_err(|e| damaged(e.to_string()))?;
        if stored.format != FORMAT {
            return Err(damaged(format!(
                "format {} is not one this version reads ({FORMAT})",
                stored.format
            )));
        }
        let mut keys = Vec::with_capacity(stored.keys.len());
        for k in stored.keys {
            if k.alg != "Ed25519" {
                return Err(damaged(format!("key {:?}: unknown algorithm", k.key_id)));
            }
            let public: [u8; 32] = B64
                .decode(&k.public_key)
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| damaged(format!("key {:?}: bad public key", k.key_id)))?;
            let public_key = VerifyingKey::from_bytes(&public)
                .map_err(|_| damaged(format!("key {:?}: bad public key", k.key_id)))?;
            if key_id_of(&public_key) != k.key_id {
                return Err(damaged(format!(
                    "key {:?}: id does not match its key",
                    k.key_id
                )));
            }
            let secret = match (k.state, k.secret) {
                (KeyState::Active, Some(hex_secret)) => {
                    let secret: [u8; 32] = hex::decode(hex_secret.trim())
                        .ok()
                        .and_then(|b| b.try_into().ok())
                        .ok_or_else(|| damaged(format!("key {:?}: bad secret", k.key_id)))?;
                    let signer = Signer::from_secret(secret);
                    if signer.public_key() != public_key {
                        return Err(damaged(format!(
                            "key {:?}: secret does not match its public key",
                            k.key_id
                        )));
                    }
                    Some(signer)
                }
                (KeyState::Active, None) => {
                    return Err(damaged(format!("active key {:?} has no secret", k.key_id)))
                }
                // Never needed again: not kept.
                (_, _) => None,
            };
            if keys.iter().any(|r: &KeyRecord| r.key_id == k.key_id) {
                return Err(damaged(format!("key {:?} listed twice", k.key_id)));
            }
            keys.push(KeyRecord {
                key_id: k.key_id,
                state: k.state,
                public_key,
                secret,
                created_at: k.created_at,
                replaced_at: k.replaced_at,
                retired_at: k.retired_at,
            });
        }
        let active = keys.iter().filter(|k| k.state == KeyState::Active).count();
        if active != 1 {
            return Err(damaged(format!(
                "{active} active keys (exactly one expected)"
            )));
        }
        Ok(KeySet { keys })
    }
}

fn active_record(signer: Signer, now: u64) -> KeyRecord {
    KeyRecord {
        key_id: signer.key_id().to_owned(),
        state: KeyState::Active,
        public_key: signer.public_key(),
        secret: Some(signer),
        created_at: now,
        replaced_at: None,
        retired_at: None,
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    format: u32,
    keys: Vec<StoredKey>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredKey {
    key_id: String,
    state: KeyState,
    alg: String,
    public_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
    created_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    replaced_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retired_at: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Verifier;

    #[test]
    fn rotate_then_retire() {
        let first = Signer::generate();
        let set = KeySet::new(first.clone(), 100);
        assert_eq!(set.signer().key_id(), first.key_id());
        let second = Signer::generate();
        let rotated = set.rotate(second.clone(), 200).unwrap();
        assert_eq!(rotated.signer().key_id(), second.key_id());
        let old = rotated.get(first.key_id()).unwrap();
        assert_eq!(
            (old.state, old.replaced_at, old.secret.is_none()),
            (KeyState::Verifying, Some(200), true)
        );
        let verifier = Verifier::new(rotated.ring(), 8);
        let old_token = first.issue("l", 1, "h");
        verifier.verify(&old_token).unwrap();
        verifier.verify(&second.issue("l", 2, "h")).unwrap();

        assert_eq!(
            rotated.retire(second.key_id(), 300).unwrap_err(),
            KeySetError::ActiveKey(second.key_id().to_owned())
        );
        assert!(matches!(
            rotated.retire("nope", 300),
            Err(KeySetError::UnknownKey(_))
        ));
        let retired = rotated.retire(first.key_id(), 300).unwrap().unwrap();
        assert_eq!(
            retired.get(first.key_id()).unwrap().state,
            KeyState::Retired
        );
        assert_eq!(retired.retire(first.key_id(), 400).unwrap(), None);
        verifier.set_keys(retired.ring());
        assert!(verifier.verify(&old_token).is_err());
        // Round trip through the stored form.
        assert_eq!(KeySet::decode(&retired.encode()).unwrap(), retired);
    }

    #[test]
    fn bounded_sizes() {
        let mut set = KeySet::new(Signer::generate(), 0);
        for t in 1..=MAX_VERIFYING_KEYS as u64 {
            set = set.rotate(Signer::generate(), t).unwrap();
        }
        assert_eq!(
            set.rotate(Signer::generate(), 99).unwrap_err(),
            KeySetError::TooManyKeys(MAX_VERIFYING_KEYS)
        );
        let again = set.signer();
        assert!(matches!(
            set.rotate(again, 99),
            Err(KeySetError::DuplicateKey(_))
        ));
        // Retiring and rotating forever keeps the set bounded.
        for t in 100..200 {
            let oldest = set
                .keys()
                .iter()
                .find(|k| k.state == KeyState::Verifying)
                .unwrap()
                .key_id
                .clone();
            set = set.retire(&oldest, t).unwrap().unwrap();
            set = set.rotate(Signer::generate(), t).unwrap();
        }
        assert!(set.keys().len() <= MAX_VERIFYING_KEYS + MAX_RETIRED_KEPT + 1);
        assert!(set.encode().len() < MAX_ENCODED_LEN);
    }

    #[test]
    fn damaged_sets_are_refused() {
        let set = KeySet::new(Signer::generate(), 1)
            .rotate(Signer::generate(), 2)
            .unwrap();
        let text = String::from_utf8(set.encode()).unwrap();
        let active = set.active().key_id.clone();
        let verifying = set.keys()[0].key_id.clone();
        let secret = hex::encode(set.signer().secret());
        let other_secret = hex::encode(Signer::generate().secret());
        for bad in [
            String::new(),
            "{}".to_owned(),
            text.replace("\"format\": 1", "\"format\": 2"),
            text.replace(&secret, &other_secret),
            text.replace(&secret, "zz"),
            text.replace("\"verifying\"", "\"active\""),
            text.replace("\"active\"", "\"verifying\""),
            text.replace(&verifying, &active),
            text.replace("Ed25519", "RSA"),
            text.replace("\"format\"", "\"extra\": 1, \"format\""),
        ] {
            assert!(
                matches!(KeySet::decode(bad.as_bytes()), Err(KeySetError::Damaged(_))),
                "{bad}"
            );
        }
        assert!(KeySet::decode(&vec![b' '; MAX_ENCODED_LEN + 1]).is_err());
    }
}
