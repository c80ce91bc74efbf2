//! # API contract: the names every crate that speaks Palisade's HTTP API shares
//!
//! The server, the Rust client, the adapters, the load generator, the checker and the
//! simulation all speak the same wire contract (docs/api.md). The stable names of that
//! contract live here, once, so they cannot drift apart between crates:
//!
//! - [`ErrorCode`]: every machine code an error body can carry, with its HTTP status;
//! - [`ErrorDetail`]: an error's code with its typed fields (and [`QuotaResource`]), what
//!   the server sends and every client decodes;
//! - [`headers`]: the request and response header names of the fenced store;
//! - [`listening`]: the line `palisade serve` prints on stdout once it accepts
//!   connections, which scripts and tests read to learn the address;
//! - [`recipes`]: the limits of lock values and per-lock lock-delay;
//! - [`wire`]: the JSON bodies (error answers, acquire, leases, lock status and lists,
//!   the token check, the fenced store's answers, namespaces, keys and the admin key
//!   routes, health, the events), with their field names and skip rules.
//!
//! ## What this crate does not do
//! - No I/O and no HTTP types: it depends on nothing but serde (and base64 for lock
//!   values), so every layer can use it.
//! - It does not decide anything; it only names things.

mod code;
pub mod detail;
pub mod headers;
pub mod listening;
pub mod recipes;
pub mod wire;

pub use code::{ErrorCode, UnknownCode};
pub use detail::{ErrorDetail, QuotaResource};
