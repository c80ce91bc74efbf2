//! # Core: the deterministic heart of Palisade
//!
//! Two pure state machines, with time passed in as milliseconds of a monotonic clock:
//!
//! - [`gate`]: the resource-side rule. Given a namespace's high-water mark and an incoming
//!   (epoch, seq), admit or reject, and compute the new mark. Storage backends call it
//!   *inside* their write transaction, so the comparison and the mutation commit together.
//! - [`lock_table`]: the issuer's table of locks, leases, lock-delays and FIFO waiters. It
//!   hands out epochs `last + 1`; the caller must make a grant durable before telling
//!   anyone about it.
//!
//! ## Invariants
//! - The gate never admits an epoch smaller than the stored mark, and the mark never
//!   decreases (property-tested).
//! - The lock table never grants a lock that has a live lease, and epochs per lock strictly
//!   increase across grants (property-tested).
//!
//! ## What this crate does not do
//! - No I/O and no clock reading: durability and time are the caller's job.
//! - The gate orders *generations*, not the operations inside one: two writes carrying the
//!   same epoch are both admitted under the default policy, and neither is recognised as a
//!   retry of the other (S8, S9). Deduplication is the idempotency-key layer's job.
//! - Issuing a new epoch does not tell any resource. A write carrying an old epoch that
//!   arrives before the resource has seen the new one is admitted (S10); a barrier
//!   (fence) call is how a new holder establishes its epoch first.

pub mod gate;
pub mod lock_table;
pub mod page;

/// Milliseconds on a monotonic clock chosen by the caller.
pub type Millis = u64;
