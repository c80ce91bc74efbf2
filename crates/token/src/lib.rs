//! # Tokens: the bottom layer of Palisade
//!
//! A fencing token is the issuer's signed statement "holder H acquired lock L and was
//! given epoch E". Resources read the epoch out of it and compare it with the newest epoch
//! they have seen (the *high-water mark*); that comparison lives in `palisade-core`.
//!
//! This crate owns:
//! - [`Claims`]: what a token says (lock, epoch, holder, issuer key id);
//! - the text encoding `pal1.<payload>.<signature>` (base64url, no padding), where the
//!   signature is Ed25519 over the ASCII bytes `pal1.<payload>`;
//! - [`Signer`] (the issuer's private key), [`ActiveSigner`] (the key signing now,
//!   replaceable while the issuer runs, signing with nonces made ahead: [`nonce`]) and [`KeyRing`] (the public keys a resource
//!   trusts, by key id, built from `GET /v1/keys` with [`KeyRing::from_listing`]);
//! - [`KeySet`]: every key an issuer has had, each `active`, `verifying` or `retired`
//!   (key rotation), with its stored form;
//! - [`Verifier`]: signature verification with a bounded cache of tokens already verified,
//!   so the common write path does one hash lookup instead of an Ed25519 verification;
//! - [`validate_lock_name`]: the one definition of a legal lock name.
//!
//! ## Invariants
//! - A token is accepted only if its signature verifies under a key in the ring, its
//!   payload decodes strictly (unknown fields, a zero epoch or an illegal lock name are
//!   rejected) and its text is canonical (re-encoding the claims gives the same payload).
//! - The cache is keyed by the *whole* token text, signature included, so an edited token
//!   can never hit an entry made for the genuine one; and a hit passes only while the
//!   token's key is still in the ring, so a retired key's token never passes.
//!
//! ## What this crate does not do
//! - It does not know whether an epoch is still current: a genuine token stays genuine
//!   forever. Staleness is decided by a resource's high-water mark, and liveness of the
//!   lease by the issuer (`POST /v1/tokens/check`).
//! - It does no I/O: key files are read and written by the server. (Its one thread,
//!   `palisade-nonces`, makes signing nonces ahead from the OS random number generator:
//!   [`nonce`].)
//! - It is not access control. A token proves ownership generation, not identity or
//!   permission (S14).

mod claims;
mod key_set;
mod keys;
pub mod nonce;
mod verify;

pub use claims::{
    holder_belongs_to, validate_lock_name, Claims, Epoch, InvalidLockName, MAX_HOLDER_LEN,
};
pub use key_set::{KeyRecord, KeySet, KeySetError, KeyState, MAX_RETIRED_KEPT, MAX_VERIFYING_KEYS};
pub use keys::{
    key_id_of, ActiveSigner, KeyId, KeyListing, KeyRing, ListedKey, ListingError, Signer,
};
pub use verify::{TokenError, Verifier, MAX_TOKEN_LEN};

/// An Ed25519 public key (what a [`KeyRing`] holds).
pub use ed25519_dalek::VerifyingKey;

/// The prefix of every token produced by this version of the format.
pub const TOKEN_PREFIX: &str = "pal1";
