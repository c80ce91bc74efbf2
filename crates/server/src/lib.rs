//! # Server: Palisade's HTTP/JSON API, and its hot routes over RESP
//!
//! A thin layer: parse the request, call the issuer (a [`palisade_issuer::LockService`])
//! or the fenced
//! store (token verification here, then one [`palisade_storage::FencedOp`] through the
//! storage backend), and map typed errors to stable error codes ([`error`]). The
//! RESP listener ([`resp`]) parses its commands and runs the same functions as the
//! HTTP routes.
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
//! - Without an auth file ([`auth`]) anyone who can reach a port can acquire locks and
//!   read values; the server then refuses to listen beyond loopback unless told
//!   `--insecure-no-auth`. Fencing is not access control (S14).
//! - TLS and mutual TLS are [`transport`]'s; it also bounds what a connection can hold
//!   (header and idle timeouts, header size, a connection cap).

pub mod api;
pub mod audit;
pub mod auth;
#[cfg(feature = "etcd")]
mod cluster;
pub mod config;
mod embedded;
pub mod error;
pub use palisade_datadir::data_dir;
pub mod keys;
pub mod limits;
pub mod listen;
pub mod observe;
pub mod openapi;
pub mod policies;
pub use palisade_datadir::recovery;
pub mod resp;
mod run;
mod start;
pub mod transport;
pub mod ui;

pub use config::{
    BackendConfig, EtcdAccess, Limits, NamespacePolicies, ServerConfig,
    DEFAULT_AUDIT_LOG_MAX_BYTES, DEFAULT_ETCD_PREFIX, DEFAULT_ETCD_TIMEOUT_MS,
    DEFAULT_IDLE_GRACE_MS, DEFAULT_LOCK_DELAY_MS, DEFAULT_MAX_VALUE_BYTES, DEFAULT_TOKEN_CACHE,
};
pub use run::{RunningServer, ServerError, DB_FILE};
pub use start::serve;
pub use transport::{ClientCert, TlsConfig, TransportConfig};
