//! # Client: the holder's side of Palisade
//!
//! An async client for the Palisade HTTP API (docs/api.md). It acquires leases, keeps
//! them alive in the background, attaches the fencing token to every mutation of the
//! fenced store, and reports "you are fenced" as a typed error ([`Error::Stale`]) rather
//! than a string.
//!
//! ```no_run
//! use palisade_client::{AcquireOptions, Client, Error};
//!
//! # async fn demo() -> Result<(), Error> {
//! let client = Client::new("http://127.0.0.1:7700")?;
//! let guard = client.acquire("orders", "worker-1", AcquireOptions::default()).await?;
//! match guard.kv().put("order/42", "paid").await {
//!     Ok(write) => println!("written at revision {} by epoch {}", write.revision, write.epoch),
//!     Err(Error::Stale { high_water, epoch }) => {
//!         // A newer holder (epoch `high_water`) owns the lock now: stop, do not retry.
//!         eprintln!("fenced: my epoch {epoch} < {high_water}");
//!     }
//!     Err(e) => return Err(e),
//! }
//! guard.release().await
//! # }
//! ```
//!
//! Runnable examples, against a server started with `palisade serve`:
//! `cargo run -p palisade-client --example lease_guard` (work while the lease is held,
//! stop when it is lost), `--example fenced_write` (barrier, fenced and idempotent
//! writes), `--example lost_lease` (a paused holder's late write is refused).
//!
//! ## Pieces
//! - [`Client`]: one pooled HTTP/1.1 connection set to one server, or to the nodes of one
//!   deployment to fail over between; lock, lease, key and token calls.
//!   [`ClientBuilder`] sets how it connects: further endpoints, `https`, the CA to trust,
//!   a client certificate for mutual TLS, and the bearer key sent with every request.
//! - Recipes: lock values ([`AcquireOptions::value`], [`LeaseGuard::proclaim`]), a
//!   lock-delay per lock ([`AcquireOptions::lock_delay`]), sessions ([`SessionGuard`]: one
//!   keepalive for many locks) and leader election ([`Election`], docs/election.md).
//!
//! ## Failover
//! Given several endpoints, a call that cannot reach a node, or gets 503, is sent to the
//! next one, but never in a way that could apply it twice: reads, renewals, releases and
//! proclaims are safe to resend; every fenced write carries an idempotency key (a fresh
//! one unless given), so its resend is answered with the first outcome (S9); an acquire
//! or session creation whose answer was lost is not resent (it would be a second lease)
//! and fails with [`Error::Transport`].
//! - [`LeaseGuard`]: a held lease renewed every `ttl / 3` by a background task, with
//!   [`LeaseGuard::lost`] to learn when it is gone.
//! - [`Kv`] (reads, no token) and [`FencedKv`] (reads and token-carrying writes). There is
//!   no way to send a mutation without a token.
//! - [`IssuerKeys`]: for resources that verify tokens themselves (the adapters), a
//!   [`palisade_token::Verifier`] kept in step with the issuer's keys as they rotate.
//!
//! ## Invariants
//! - Every mutation (`PUT`, `DELETE`, fence) carries `Fencing-Token`; a token that cannot
//!   be sent as a header fails locally with [`Error::InvalidToken`].
//! - Names and keys are percent-encoded per path segment; a key that cannot survive URL
//!   normalisation (a `.` or `..` segment) is refused locally, never sent altered.
//! - Every request has a timeout ([`REQUEST_TIMEOUT`], or `wait` + [`WAIT_MARGIN`] for a
//!   queued acquire), so no call hangs forever.
//! - A lease is reported lost no later than its renewal deadline (send time of the last
//!   successful renewal + 2/3 of the TTL by default), even if a renewal request is stuck,
//!   and [`LeaseGuard::safe_until`] never lies beyond that send time + the TTL less the
//!   clock-drift margin ([`Deadlines`]; tested in `lease::tests`).
//! - The guard never re-acquires behind the caller's back: a new lease is a new epoch,
//!   and the caller must see that.
//!
//! ## What this client does not guarantee
//! - **Fencing does not deduplicate retries (S9).** A write that timed out
//!   ([`Error::Transport`]) may have been applied; retrying it with the same token is
//!   admitted again. Use [`WriteOptions::idempotency_key`] or a conditional write
//!   ([`WriteOptions::if_match`]) when a retry must not apply twice.
//! - **It does not cancel in-flight requests (S10).** Losing the lease stops renewals,
//!   not writes already on the wire; a write sent before a newer holder reached the
//!   resource is still admitted. A new holder that needs older writes refused *before* it
//!   starts calls [`LeaseGuard::fence`] first.
//! - **A resource that never checks the token is not protected (S2, S13).** The token
//!   only means something where a gate compares it: the built-in store does; an external
//!   database, file or API you write to yourself does not, unless it runs the gate or
//!   another concurrency control such as conditional writes.
//! - [`LeaseGuard::is_lost`] returning `false` is not permission to write: the process can
//!   pause right after asking. Only the resource's answer is authoritative.
//! - It is not access control (S14): a token proves ownership generation, not identity.

mod backup;
mod builder;
mod client;
mod deadlines;
mod decode;
pub mod election;
mod error;
mod failover;
mod fenced;
mod keys;
mod kv;
mod lease;
mod paths;
mod session;
mod types;
pub mod watch;

pub use backup::{BackupFile, BACKUP_TIMEOUT};
pub use builder::ClientBuilder;
pub use client::{Client, REQUEST_TIMEOUT, WAIT_MARGIN};
pub use deadlines::Deadlines;
pub use election::{Election, Leader, LeaderInfo, Observer};
pub use error::Error;
pub use fenced::FencedKv;
pub use keys::{IssuerKeys, MIN_REFRESH_GAP};
pub use kv::{Kv, LIST_LIMIT};
pub use lease::LeaseGuard;
/// What a gate reports to the server ([`Client::report_gate`]).
pub use palisade_api::wire::{GateRefusal, GateReport, GateReportAnswer, ResourceKind};
pub use session::{SessionGuard, SessionLock};
pub use types::{
    AcquireOptions, Entry, FenceStatus, KeepaliveInfo, Lease, LockStatus, Proclaimed, PublicKey,
    SessionInfo, SessionLease, TokenCheck, WriteOptions, WriteResult,
};
pub use watch::LockEvent;
