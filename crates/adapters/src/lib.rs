//! # Adapters: the gate inside resources users already run
//!
//! Most users protect their own database, not Palisade's store. This crate runs the same
//! two steps the store runs, inside the user's resource:
//!
//! 1. verify the token (Ed25519, through a cached [`palisade_token::Verifier`]) and check it
//!    names the lock that guards the resource (and, if the resource asks with
//!    [`Trust::held_by`], that its holder is one principal);
//! 2. in the resource's own atomic unit, read the lock's high-water mark, apply
//!    [`palisade_core::gate::admit`], and store the new mark with the guarded writes.
//!
//! | adapter | feature | atomic unit | serialised by |
//! |---|---|---|---|
//! | `postgres` | `postgres` | the caller's transaction | row lock on `palisade_fence` |
//! | `mysql` | `mysql` | the caller's InnoDB transaction | row lock on `palisade_fence` |
//! | `sqlite` | `sqlite` (default) | the caller's transaction | `BEGIN IMMEDIATE` |
//! | `redis` | `redis` | one Lua script | Redis runs scripts one at a time |
//! | `objects` | `object-store` (default) | one object | conditional put (ETag) |
//!
//! Every adapter returns [`AdmitError`], whose [`AdmitError::code`] matches the server's
//! error codes. See `docs/protecting-your-database.md` for complete examples.
//!
//! ## Invariants
//! - No write happens before the token verified and named the right lock (S12): a
//!   missing, malformed, forged or other-lock token is refused before the resource is
//!   touched.
//! - The comparison, the advance of the mark and the guarded writes commit together or not
//!   at all (S6). A refused operation commits nothing: the SQL adapters require the caller
//!   to roll back (PostgreSQL enforces it by aborting the transaction), Redis and the
//!   object store write nothing.
//! - The mark never decreases, and no epoch below it is admitted (S5), however admits for
//!   one lock race: they serialise on the resource, not in this process.
//!
//! ## What this crate does not guarantee
//! - **It does not deduplicate retries** (S9). Two operations with the same epoch are both
//!   admitted; use idempotent writes, operation ids, or the sequence policy
//!   (`admit_sequenced`, SQL adapters) to order operations inside one epoch.
//! - **It does not cancel in-flight work** (S10). A resource learns of epoch 2 only when
//!   something carrying epoch 2 reaches it; until then epoch 1 is admitted. A new holder
//!   that needs the old one cut off first makes a barrier write (an admit with no data).
//! - **It protects only what checks.** Writes to the same data that do not go through an
//!   adapter are not fenced (S2); the object-store adapter protects one object's bytes and
//!   no side effect outside it (S13).
//! - **It is as durable as the resource.** The mark lives in the resource: a Redis without
//!   `appendfsync always`, or a database restored from a backup without its fence table,
//!   can forget it and admit old holders again (S11).
//! - **It is not access control** (S14): a token proves an ownership generation, not who
//!   may write.

// With no adapter feature enabled, only the shared types are left to use.
#![cfg_attr(
    not(any(
        feature = "mysql",
        feature = "postgres",
        feature = "redis",
        feature = "sqlite",
        feature = "object-store"
    )),
    allow(dead_code)
)]

mod admission;
mod error;
pub mod preflight;
pub mod report;

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "object-store")]
pub mod objects;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use admission::{Admitted, Trust};
pub use error::{AdmitError, BoxError, CorruptFence, ErrorCode, ErrorDetail};
pub use preflight::{UnsafeDatabase, UnsafeSetting};
pub use report::GateTally;
