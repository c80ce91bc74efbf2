//! Token verification, with a cache of tokens already verified.

use std::sync::Arc;

use arc_swap::ArcSwap;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ed25519_dalek::Signature;

use crate::{Claims, KeyRing, TOKEN_PREFIX};

/// Why a token was refused. None of these says anything about staleness: a genuine token
/// is genuine forever; whether its epoch is still good is the resource's decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not of the form `pal1.<payload>.<signature>`, or a payload that does not decode.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// Signed by a key this ring does not hold.
    #[error("token signed by unknown key {0:?}")]
    UnknownKey(String),
    /// The signature does not match the payload.
    #[error("token signature does not verify")]
    BadSignature,
}

/// Longest token text accepted; anything longer is refused before any decoding. Every
/// token with legal claims fits: a 128-byte lock name and a 256-byte holder whose every
/// byte needs a six-byte JSON escape still encode to well under 2,500 bytes.
pub const MAX_TOKEN_LEN: usize = 4096;

/// Verifies tokens against a [`KeyRing`], remembering the ones that passed.
///
/// Why a cache: an Ed25519 verification costs tens of microseconds, and a holder sends
/// the same token with every write of its epoch. The cache maps the full token text to
/// its claims; only tokens that verified are ever inserted, and the key includes the
/// signature, so the cache cannot make a forged token pass.
///
/// The ring can be replaced while tokens are being verified ([`Verifier::set_keys`], for
/// key rotation). A cache hit is accepted only if the key that signed the token is still
/// in the ring, so a token of a key that was removed is refused from the moment
/// `set_keys` returns, cached or not. Why a check on every hit rather than clearing the
/// cache on replacement: a verification that read the old ring just before the
/// replacement could insert its token just after a clear, and the stale entry would pass
/// until evicted. The check costs one hash lookup in a ring of a few keys; entries of
/// removed keys are never served and age out of the cache like any other.
pub struct Verifier {
    keys: ArcSwap<KeyRing>,
    cache: quick_cache::sync::Cache<Box<str>, Arc<Claims>>,
}

impl Verifier {
    /// A verifier trusting `keys`, caching up to `capacity` verified tokens.
    pub fn new(keys: KeyRing, capacity: usize) -> Self {
        Verifier {
            keys: ArcSwap::from_pointee(keys),
            cache: quick_cache::sync::Cache::new(capacity.max(1)),
        }
    }

    /// The trusted keys, as of now.
    pub fn keys(&self) -> Arc<KeyRing> {
        self.keys.load_full()
    }

    /// Trusts exactly `keys` from now on: tokens of a key not in it are refused from the
    /// moment this returns, even those verified (and cached) before.
    pub fn set_keys(&self, keys: KeyRing) {
        self.keys.store(Arc::new(keys));
    }

    /// Verifies `token`, from the cache when it was verified before and its key is still
    /// trusted.
    pub fn verify(&self, token: &str) -> Result<Arc<Claims>, TokenError> {
        if let Some(claims) = self.cache.get(token) {
            if self.keys.load().contains(&claims.key_id) {
                return Ok(claims);
            }
            self.cache.remove(token);
            return Err(TokenError::UnknownKey(claims.key_id.clone()));
        }
        let claims = Arc::new(self.verify_uncached(token)?);
        self.cache.insert(token.into(), claims.clone());
        Ok(claims)
    }

    /// Verifies `token` without looking at or filling the cache.
    pub fn verify_uncached(&self, token: &str) -> Result<Claims, TokenError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::Malformed("token too long"));
        }
        let mut parts = token.split('.');
        let (Some(prefix), Some(payload_b64), Some(sig_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed("expected pal1.<payload>.<signature>"));
        };
        if prefix != TOKEN_PREFIX {
            return Err(TokenError::Malformed("unknown token version"));
        }
        let payload = B64
            .decode(payload_b64)
            .map_err(|_| TokenError::Malformed("payload is not base64url"))?;
        let claims: Claims = serde_json::from_slice(&payload)
            .map_err(|_| TokenError::Malformed("payload is not a claims object"))?;
        claims.check_shape().map_err(TokenError::Malformed)?;
        // Canonical form only: the same claims must always be the same text, so that a
        // re-encoded (but validly signed) variant cannot slip past per-token bookkeeping.
        if serde_json::to_vec(&claims).ok().as_deref() != Some(&payload[..]) {
            return Err(TokenError::Malformed("payload is not in canonical form"));
        }
        let keys = self.keys.load();
        let key = keys
            .get(&claims.key_id)
            .ok_or_else(|| TokenError::UnknownKey(claims.key_id.clone()))?;
        let sig_bytes: [u8; 64] = B64
            .decode(sig_b64)
            .map_err(|_| TokenError::Malformed("signature is not base64url"))?
            .try_into()
            .map_err(|_| TokenError::Malformed("signature has the wrong length"))?;
        let signed_len = prefix.len() + 1 + payload_b64.len();
        key.verify_strict(
            &token.as_bytes()[..signed_len],
            &Signature::from_bytes(&sig_bytes),
        )
        .map_err(|_| TokenError::BadSignature)?;
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Signer;

    fn setup() -> (Signer, Verifier) {
        let signer = Signer::generate();
        let mut ring = KeyRing::new();
        ring.insert(signer.public_key());
        (signer, Verifier::new(ring, 64))
    }

    #[test]
    fn genuine_token_verifies_with_its_claims() {
        let (signer, verifier) = setup();
        let token = signer.issue("orders", 7, "worker-a");
        let claims = verifier.verify(&token).unwrap();
        assert_eq!(claims.lock, "orders");
        assert_eq!(claims.epoch, 7);
        assert_eq!(claims.holder, "worker-a");
        assert_eq!(claims.key_id, signer.key_id());
        // Second time comes from the cache and says the same.
        assert_eq!(*verifier.verify(&token).unwrap(), *claims);
    }

    #[test]
    fn edited_epoch_is_rejected() {
        let (signer, verifier) = setup();
        let token = signer.issue("orders", 1, "a");
        verifier.verify(&token).unwrap(); // warm the cache with the genuine token
        let parts: Vec<&str> = token.split('.').collect();
        let mut claims: Claims = serde_json::from_slice(&B64.decode(parts[1]).unwrap()).unwrap();
        claims.epoch = 1_000_000;
        let forged = format!(
            "pal1.{}.{}",
            B64.encode(serde_json::to_vec(&claims).unwrap()),
            parts[2]
        );
        assert_eq!(
            verifier.verify(&forged).unwrap_err(),
            TokenError::BadSignature
        );
    }

    #[test]
    fn other_key_is_rejected() {
        let (_, verifier) = setup();
        let stranger = Signer::generate();
        let token = stranger.issue("orders", 1, "a");
        assert!(matches!(
            verifier.verify(&token),
            Err(TokenError::UnknownKey(_))
        ));
    }

    #[test]
    fn same_key_id_with_other_key_is_bad_signature() {
        let (signer, verifier) = setup();
        let stranger = Signer::generate();
        // Claim the trusted key's id but sign with another key.
        let claims = Claims {
            lock: "orders".into(),
            epoch: 9,
            holder: "m".into(),
            key_id: signer.key_id().into(),
        };
        let mut text = format!("pal1.{}", B64.encode(serde_json::to_vec(&claims).unwrap()));
        let sig = ed25519_dalek::Signer::sign(
            &ed25519_dalek::SigningKey::from_bytes(&stranger.secret()),
            text.as_bytes(),
        );
        text.push('.');
        text.push_str(&B64.encode(sig.to_bytes()));
        assert_eq!(
            verifier.verify(&text).unwrap_err(),
            TokenError::BadSignature
        );
    }

    #[test]
    fn longest_legal_claims_fit_the_limit() {
        let (signer, verifier) = setup();
        let token = signer.issue(&"l".repeat(128), u64::MAX, &"\u{1}".repeat(256));
        assert!(token.len() <= MAX_TOKEN_LEN, "{}", token.len());
        assert_eq!(verifier.verify(&token).unwrap().epoch, u64::MAX);
    }

    #[test]
    fn malformed_tokens() {
        let (signer, verifier) = setup();
        let good = signer.issue("a", 1, "h");
        for bad in [
            "",
            "2",
            "true",
            "pal1",
            "pal1..",
            "pal2.e30.AAAA",
            "pal1.!!!.AAAA",
            "pal1.e30.AAAA",
            &format!("{good}.x"),
            &"a".repeat(MAX_TOKEN_LEN + 1),
        ] {
            assert!(
                matches!(verifier.verify(bad), Err(TokenError::Malformed(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_removed_key_is_refused_even_from_the_cache() {
        let (old, verifier) = setup();
        let new = Signer::generate();
        let old_token = old.issue("orders", 1, "a");
        verifier.verify(&old_token).unwrap(); // cached
                                              // Rotation: both keys trusted; the old token still passes, the new one too.
        let mut both = KeyRing::new();
        both.insert(old.public_key());
        both.insert(new.public_key());
        verifier.set_keys(both);
        verifier.verify(&old_token).unwrap();
        let new_token = new.issue("orders", 2, "b");
        assert_eq!(verifier.verify(&new_token).unwrap().key_id, new.key_id());
        // Retirement: only the new key; the cached old token is refused.
        let mut only_new = KeyRing::new();
        only_new.insert(new.public_key());
        verifier.set_keys(only_new);
        assert_eq!(
            verifier.verify(&old_token).unwrap_err(),
            TokenError::UnknownKey(old.key_id().to_owned())
        );
        assert!(matches!(
            verifier.verify_uncached(&old_token),
            Err(TokenError::UnknownKey(_))
        ));
        verifier.verify(&new_token).unwrap();
    }

    /// Verifications racing with ring replacements: once a replacement without the old
    /// key has returned, no verification that starts afterwards passes an old token.
    #[test]
    fn no_old_token_passes_after_the_replacement_returns() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let (old, verifier) = setup();
        let verifier = Arc::new(verifier);
        let new = Signer::generate();
        let tokens: Vec<String> = (1..=64).map(|e| old.issue("l", e, "h")).collect();
        let retired = Arc::new(AtomicBool::new(false));
        let warmed = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (verifier, tokens, retired, warmed) = (
                    verifier.clone(),
                    tokens.clone(),
                    retired.clone(),
                    warmed.clone(),
                );
                std::thread::spawn(move || {
                    for round in 0..200 {
                        for t in &tokens {
                            let after = retired.load(Ordering::SeqCst);
                            let passed = verifier.verify(t).is_ok();
                            assert!(!(after && passed), "old token passed after retirement");
                        }
                        if round == 0 {
                            warmed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        // Every token is in the cache before the key goes.
        while warmed.load(Ordering::SeqCst) < 2 {
            std::thread::yield_now();
        }
        let mut ring = KeyRing::new();
        ring.insert(new.public_key());
        verifier.set_keys(ring);
        retired.store(true, Ordering::SeqCst);
        for reader in readers {
            reader.join().unwrap();
        }
        for t in &tokens {
            assert!(verifier.verify(t).is_err());
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics_and_never_verifies(text in ".{0,300}") {
            let (_, verifier) = setup();
            proptest::prop_assert!(verifier.verify(&text).is_err());
        }

        #[test]
        fn roundtrip(lock in "[A-Za-z0-9_-]{1,128}", epoch in 1u64.., holder in ".{0,64}") {
            let (signer, verifier) = setup();
            let claims = verifier.verify(&signer.issue(&lock, epoch, &holder)).unwrap();
            proptest::prop_assert_eq!((&claims.lock, claims.epoch, &claims.holder), (&lock, epoch, &holder));
        }
    }
}
