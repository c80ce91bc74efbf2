//! Fuzz the token decoder and verifier.
//!
//! - Arbitrary text: `verify` never panics, and the cached and uncached paths agree.
//! - Round trip: a token the issuer signs for input the API accepts (a legal lock name,
//!   an epoch of at least 1, a holder of 1 to 256 bytes) verifies to exactly those claims,
//!   and again from the cache.
//! - Tamper: any change to a genuine token's text (flipped bytes, a cut, an extension) is
//!   refused: the text is canonical, so no second spelling of a genuine token exists.

#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

use palisade_token::{validate_lock_name, KeyRing, Signer, Verifier, MAX_HOLDER_LEN};

#[derive(Arbitrary, Debug)]
enum Input {
    Text(String),
    Bytes(Vec<u8>),
    Signed {
        lock: String,
        epoch: u64,
        holder: String,
        edits: Vec<Edit>,
    },
}

#[derive(Arbitrary, Debug)]
enum Edit {
    Flip { at: u16, xor: u8 },
    Cut { at: u16 },
    Append(String),
}

/// The verifier's limit on token text (`palisade_token::verify::MAX_TOKEN_LEN`).

struct Keys {
    signer: Signer,
    other: Signer,
    verifier: Verifier,
}

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| {
        let signer = Signer::from_secret([7; 32]);
        let other = Signer::from_secret([9; 32]);
        let mut ring = KeyRing::new();
        ring.insert(signer.public_key());
        Keys {
            signer,
            other,
            verifier: Verifier::new(ring, 1024),
        }
    })
}

fn agree(text: &str) {
    let k = keys();
    let uncached = k.verifier.verify_uncached(text);
    let cached = k.verifier.verify(text);
    assert_eq!(
        uncached.as_ref().ok(),
        cached.as_ref().ok().map(|c| &**c),
        "cached and uncached verification disagree on {text:?}"
    );
}

fn round_trip(lock: &str, epoch: u64, holder: &str, edits: &[Edit]) {
    let k = keys();
    let token = k.signer.issue(lock, epoch, holder);
    let claims = k
        .verifier
        .verify(&token)
        .unwrap_or_else(|e| panic!("a token the issuer signed does not verify: {e}: {token}"));
    assert_eq!(
        (claims.lock.as_str(), claims.epoch, claims.holder.as_str()),
        (lock, epoch, holder)
    );
    assert_eq!(claims.key_id, k.signer.key_id());
    assert!(k.verifier.verify(&token).is_ok(), "cache hit refused");
    // Another key's token for the same claims is refused.
    assert!(k
        .verifier
        .verify(&k.other.issue(lock, epoch, holder))
        .is_err());

    let mut bytes = token.clone().into_bytes();
    for edit in edits {
        match edit {
            Edit::Flip { at, xor } => {
                if !bytes.is_empty() {
                    let at = usize::from(*at) % bytes.len();
                    bytes[at] ^= xor;
                }
            }
            Edit::Cut { at } => bytes.truncate(usize::from(*at) % (bytes.len() + 1)),
            Edit::Append(tail) => bytes.extend_from_slice(tail.as_bytes()),
        }
    }
    if let Ok(edited) = String::from_utf8(bytes) {
        if edited != token {
            assert!(
                k.verifier.verify(&edited).is_err(),
                "an edited token verifies:\n{token}\n{edited}"
            );
        }
        agree(&edited);
    }
}

fuzz_target!(|input: Input| {
    match input {
        Input::Text(text) => agree(&text),
        Input::Bytes(bytes) => agree(&String::from_utf8_lossy(&bytes)),
        Input::Signed {
            lock,
            epoch,
            holder,
            edits,
        } => {
            let api_accepts = validate_lock_name(&lock).is_ok()
                && epoch >= 1
                && !holder.is_empty()
                && holder.len() <= MAX_HOLDER_LEN;
            if api_accepts {
                round_trip(&lock, epoch, &holder, &edits);
            }
        }
    }
});
