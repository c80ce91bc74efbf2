//! Signing nonces made ahead of time, so that a grant's signature costs a hash and a
//! multiply-add instead of a scalar multiplication.
//!
//! An Ed25519 signature of message `M` under secret scalar `a` (public key `A`) is
//! `(R, s)` with `R = r·B` and `s = r + H(R ‖ A ‖ M)·a`. Nearly all of its cost is `R`: a
//! fixed-base scalar multiplication and the field inversion that compresses it, about 13 µs
//! of the 14 µs a signature takes on the project's machines, which is a quarter of the
//! server's CPU under acquire + release. RFC 8032 derives `r` from the key and the message,
//! which pins `R` to the moment of signing. Any `r` drawn uniformly at random and used once
//! gives a signature that every verifier accepts and that is as hard to forge (it is
//! Schnorr's original, randomized form; the RFC's derivation guards against a bad random
//! number generator, and here `r` comes from the operating system's). So [`NoncePool`]
//! makes `(r, R)` pairs on a background thread while the issuer is idle, and the signing
//! path takes one.
//!
//! Rules kept here, one place each:
//! - a nonce is drawn from the OS random number generator (64 bytes reduced mod ℓ, so
//!   uniform), used for exactly one signature (taking it moves it out of the pool; signing
//!   consumes it) and zeroized when dropped;
//! - when the pool is empty (the machine is busy, or its thread could not start) a nonce is
//!   made on the spot, so signing never waits for the pool.
//!
//! Why by hand: ed25519-dalek signs only with the RFC's nonce (its `hazmat::raw_sign`
//! derives `r` itself), so the last step, a hash and a multiply-add over curve25519-dalek's
//! own types, is [`crate::Signer`]'s (`sign_with`); its test checks it byte for byte
//! against the library's signer given the library's nonce, and every signature it makes is
//! checked with the library's `verify_strict`.

use std::sync::{Arc, Condvar, Mutex};

use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use rand::RngCore as _;
use zeroize::Zeroize as _;

/// How many nonces the pool keeps ready: a burst of this many grants signs with no scalar
/// multiplication at all (16 KiB of memory).
pub const POOL_CAPACITY: usize = 256;

/// The pool asks its thread for more when it holds this many or fewer.
const REFILL_BELOW: usize = POOL_CAPACITY / 2;

/// A one-time signing nonce `r` with its commitment `R = r·B`, compressed.
///
/// Not `Clone`: a nonce signs once. Its secret half is zeroized when it is dropped.
pub struct Nonce {
    r: Scalar,
    commitment: CompressedEdwardsY,
}

impl Nonce {
    /// A fresh nonce from the operating system's random number generator.
    pub fn generate() -> Nonce {
        let mut wide = [0u8; 64];
        rand::rngs::OsRng.fill_bytes(&mut wide);
        let r = Scalar::from_bytes_mod_order_wide(&wide);
        wide.zeroize();
        Nonce::from_scalar(r)
    }

    /// The nonce `r`, with its commitment computed here.
    pub(crate) fn from_scalar(r: Scalar) -> Nonce {
        Nonce {
            commitment: EdwardsPoint::mul_base(&r).compress(),
            r,
        }
    }

    /// `r`, the secret half.
    pub(crate) fn secret(&self) -> &Scalar {
        &self.r
    }

    /// `R = r·B`, the half that goes into the signature.
    pub(crate) fn commitment(&self) -> &CompressedEdwardsY {
        &self.commitment
    }
}

impl Drop for Nonce {
    fn drop(&mut self) {
        self.r.zeroize();
    }
}

impl std::fmt::Debug for Nonce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret half.
        f.debug_struct("Nonce").finish_non_exhaustive()
    }
}

/// Nonces made ahead by a background thread (`palisade-nonces`), started on the first
/// [`NoncePool::take`] and stopped when the pool is dropped.
///
/// The thread tops the pool up to [`POOL_CAPACITY`] whenever a take leaves half or less,
/// one wake-up per half a pool of grants. Nonces do not depend on the key, so one pool
/// serves every key of an [`crate::ActiveSigner`], across rotations.
pub struct NoncePool {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when the pool wants more or is being dropped.
    wanted: Condvar,
}

#[derive(Default)]
struct State {
    ready: Vec<Nonce>,
    /// The thread was started (or failed to start: then the pool stays empty).
    started: bool,
    /// The thread has been asked to top the pool up and has not finished.
    refilling: bool,
    stopped: bool,
}

impl Default for NoncePool {
    fn default() -> Self {
        Self::new()
    }
}

impl NoncePool {
    /// An empty pool; its thread starts with the first take.
    pub fn new() -> Self {
        NoncePool {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    ready: Vec::with_capacity(POOL_CAPACITY),
                    ..State::default()
                }),
                wanted: Condvar::new(),
            }),
        }
    }

    /// A nonce never handed out before: one made ahead, or, when none is ready, one made
    /// now.
    pub fn take(&self) -> Nonce {
        let made_ahead = {
            let mut state = self.shared.lock();
            let nonce = state.ready.pop();
            if state.ready.len() <= REFILL_BELOW && !state.refilling && !state.stopped {
                state.refilling = true;
                if !state.started {
                    state.started = true;
                    self.start();
                } else {
                    self.shared.wanted.notify_one();
                }
            }
            nonce
        };
        made_ahead.unwrap_or_else(Nonce::generate)
    }

    /// How many nonces are ready now.
    pub fn ready(&self) -> usize {
        self.shared.lock().ready.len()
    }

    fn start(&self) {
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name("palisade-nonces".into())
            .spawn(move || shared.fill());
        // Without its thread the pool stays empty and every signature makes its own
        // nonce: slower, never wrong.
        drop(spawned);
    }
}

impl Drop for NoncePool {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.wanted.notify_one();
    }
}

impl Shared {
    /// The nonces' state. A panic cannot leave it half-changed (each step is one push or
    /// pop), so a poisoned lock is taken over rather than passed on.
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The thread: waits until the pool is asked for more, then tops it up one nonce at a
    /// time, making each outside the lock.
    fn fill(&self) {
        loop {
            {
                let mut state = self.lock();
                while !state.refilling && !state.stopped {
                    state = self
                        .wanted
                        .wait(state)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                if state.stopped {
                    return;
                }
            }
            loop {
                let nonce = Nonce::generate();
                let mut state = self.lock();
                if state.stopped {
                    return;
                }
                state.ready.push(nonce);
                if state.ready.len() >= POOL_CAPACITY {
                    state.refilling = false;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    /// Each nonce's commitment is its own `r·B`, and no two nonces of a pool are the same,
    /// whether made ahead or on the spot, taken from several threads at once.
    #[test]
    fn every_nonce_is_fresh_and_commits_to_its_own_secret() {
        let pool = Arc::new(NoncePool::new());
        let takers: Vec<_> = (0..4)
            .map(|_| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    (0..600)
                        .map(|_| {
                            let nonce = pool.take();
                            assert_eq!(
                                nonce.commitment(),
                                &EdwardsPoint::mul_base(nonce.secret()).compress()
                            );
                            nonce.commitment().to_bytes()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for taker in takers {
            for commitment in taker.join().unwrap() {
                assert!(seen.insert(commitment), "a nonce was handed out twice");
            }
        }
        assert_eq!(seen.len(), 2400);
    }

    /// The background thread tops the pool up after a take, and stops with the pool.
    #[test]
    fn the_pool_refills_itself_after_a_take() {
        let pool = NoncePool::new();
        assert_eq!(pool.ready(), 0, "nothing is made before the first take");
        let deadline = Instant::now() + Duration::from_secs(30);
        let filled = |what: &str| {
            while pool.ready() < POOL_CAPACITY {
                assert!(
                    Instant::now() < deadline,
                    "the pool never {what}: {}",
                    pool.ready()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        drop(pool.take());
        filled("filled");
        for _ in 0..POOL_CAPACITY - REFILL_BELOW {
            drop(pool.take());
        }
        filled("refilled");
        let shared = Arc::downgrade(&pool.shared);
        drop(pool);
        while shared.strong_count() > 0 {
            assert!(Instant::now() < deadline, "the thread outlived its pool");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
