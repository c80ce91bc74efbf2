//! # Server: Palisade's HTTP/JSON API
//!
//! A thin layer: parse the request, call the issuer (a [`palisade_issuer::LockService`])
//! or the fenced
//! store (token verification here, then one [`palisade_storage::FencedOp`] through the
//! storage backend), and map typed errors to stable error codes ([`api::error`]).
//!
//! The issuer and the gate are separate roles even inside this one process: the store
//! never consults the lock table to decide a write. It learns a newer epoch only by seeing
//! it in a write or a fence call (S10).
//!
//! ## Invariants
//! - Every mutation of the store passes the gate; there is no route, flag or admin path
//!   that writes without a token (S12).
//! - A 200 for an acquisition or a write means it is fsync'd.
//! - No request, however malformed, panics the server or gets a 500: malformed input is a
//!   4xx with a stable code, a storage failure is 503 `storage_failed`.
//!
//! ## What it does not do
//! - No authentication or authorisation yet: anyone who can reach the port can acquire
//!   locks and read values. Fencing is not access control (S14). Bind to loopback or a
//!   private network.
//! - TLS and mutual TLS are [`transport`]'s; it also bounds what a connection can hold
//!   (header and idle timeouts, header size, a connection cap).

pub mod api;
pub mod audit;
pub mod auth;
#[cfg(feature = "etcd")]
mod cluster;
pub mod config;
pub mod data_dir;
pub mod keys;
pub mod listen;
pub mod observe;
pub mod openapi;
pub mod recovery;
mod run;
pub mod transport;
pub mod ui;

pub use config::{
    BackendConfig, EtcdAccess, Limits, NamespacePolicies, ServerConfig,
    DEFAULT_AUDIT_LOG_MAX_BYTES, DEFAULT_IDLE_GRACE_MS,
};
pub use run::{serve, RunningServer, ServerError, DB_FILE};
pub use transport::{ClientCert, TlsConfig, TransportConfig};
