//! Server settings. The CLI fills these from flags and environment variables.

use std::net::SocketAddr;
use std::path::PathBuf;

pub use crate::limits::{Limits, DEFAULT_MAX_VALUE_BYTES};
pub use crate::policies::NamespacePolicies;

/// Default of [`ServerConfig::idle_grace_ms`].
pub const DEFAULT_IDLE_GRACE_MS: u64 = 1_000;

/// Default size at which the audit log rotates.
pub const DEFAULT_AUDIT_LOG_MAX_BYTES: u64 = 100 * 1024 * 1024;

/// Default of [`ServerConfig::lock_delay_ms`]: none.
pub const DEFAULT_LOCK_DELAY_MS: u64 = 0;

/// Default of [`ServerConfig::token_cache`].
pub const DEFAULT_TOKEN_CACHE: usize = 65_536;

/// Default key prefix of the etcd backend: the etcd crate's own default (a build with
/// the `etcd` feature checks that they are the same).
pub const DEFAULT_ETCD_PREFIX: &str = "/palisade/";

#[cfg(feature = "etcd")]
const _: () = assert!(
    same_text(DEFAULT_ETCD_PREFIX, palisade_etcd::DEFAULT_PREFIX),
    "the server's default etcd prefix differs from palisade_etcd::DEFAULT_PREFIX"
);

/// `a == b`, usable in a constant.
#[cfg(feature = "etcd")]
const fn same_text(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Default longest wait for one etcd call, in milliseconds.
pub const DEFAULT_ETCD_TIMEOUT_MS: u64 = 5_000;

/// Everything `palisade serve` can be told.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Every address the `--listen` host name resolved to (see [`crate::listen`]), each
    /// checked like `listen` before the server may run without authentication. Empty
    /// when `listen` was given as an address.
    pub listen_resolved: Vec<SocketAddr>,
    /// Where to serve the hot routes over RESP as well ([`crate::resp`]); none by default.
    pub resp_listen: Option<SocketAddr>,
    /// Directory for the database file and the key set (see [`crate::data_dir`] for what
    /// is accepted).
    pub data_dir: PathBuf,
    /// Where the embedded store keeps its witness, outside the data directory (see
    /// [`crate::data_dir::Witness`]).
    pub witness: crate::data_dir::Witness,
    /// Lock-delay after a lease expires without release.
    pub lock_delay_ms: u64,
    /// How long a released lock stays covered by its durable reservation, so that taking
    /// it again soon needs no disk write (see `palisade_core::lock_table::TableConfig`).
    pub idle_grace_ms: u64,
    /// Largest value accepted by `PUT /v1/kv`, in bytes.
    pub max_value_bytes: usize,
    /// Per-namespace gate policies.
    pub policies: NamespacePolicies,
    /// How many verified tokens to remember.
    pub token_cache: usize,
    /// Bytes of the embedded database's page cache.
    pub db_cache_bytes: usize,
    /// Where the issuer's records and the fenced store live.
    pub backend: BackendConfig,
    /// Sign tokens with this key (64 hex characters, mode 0600) instead of the data
    /// directory's `issuer.key`. Required with the etcd backend: every node signs with
    /// the same configured key.
    pub signing_key_file: Option<PathBuf>,
    /// More keys to trust when verifying tokens: public keys (base64url, as `GET /v1/keys`
    /// shows them) or secret key files whose public halves are trusted.
    pub trust_key_files: Vec<PathBuf>,
    /// Principals and their grants (TOML, see `crate::auth`); `None` turns authentication
    /// off.
    pub auth_file: Option<PathBuf>,
    /// Allow listening on a non-loopback address without an auth file.
    pub insecure_no_auth: bool,
    /// Where to append the audit log, if anywhere.
    pub audit_log: Option<PathBuf>,
    /// Size at which the audit log rotates to `<file>.1`.
    pub audit_log_max_bytes: u64,
    /// Quotas on locks, leases and waiters.
    pub limits: Limits,
    /// Quotas on each namespace of the fenced store, and idempotency retention.
    pub store_limits: palisade_storage::StoreLimits,
    /// Connection limits, timeouts and TLS (see [`crate::transport`]).
    pub transport: crate::transport::TransportConfig,
    /// Events kept for clients resuming an events stream with `Last-Event-ID` (see
    /// [`crate::observe::events`]).
    pub events_buffer: usize,
    /// Events streams open at once; more are refused with 429 `quota_exceeded`.
    pub max_event_subscribers: usize,
}

/// Where a server keeps its state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum BackendConfig {
    /// One redb file in the data directory: one node.
    #[default]
    Embedded,
    /// An etcd cluster shared by several stateless nodes (needs the `etcd` feature).
    Etcd {
        /// Client URLs of the etcd members.
        endpoints: Vec<String>,
        /// Prefix of every key Palisade writes.
        prefix: String,
        /// Longest wait for one etcd call before the request fails with `storage_failed`.
        request_timeout: std::time::Duration,
        /// This node's epoch ledger outside etcd (`palisade_etcd::ledger`), if any.
        epoch_ledger: Option<PathBuf>,
        /// TLS and user for etcd (boxed: it is the largest part).
        access: Box<EtcdAccess>,
    },
}

/// How a node proves itself to etcd and checks etcd's identity (all optional).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdAccess {
    /// Talk TLS to etcd, trusting this CA (PEM); endpoints must then be `https://`.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for etcd members that require one; needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// Private key (PEM) of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Authenticate as this etcd user; needs `password_file`.
    pub user: Option<String>,
    /// File holding the user's password (mode 0600; surrounding whitespace ignored).
    pub password_file: Option<PathBuf>,
}

impl ServerConfig {
    /// Defaults for everything but the address and directory.
    pub fn new(listen: SocketAddr, data_dir: PathBuf) -> Self {
        ServerConfig {
            listen,
            listen_resolved: Vec::new(),
            resp_listen: None,
            data_dir,
            witness: crate::data_dir::Witness::Beside,
            lock_delay_ms: DEFAULT_LOCK_DELAY_MS,
            idle_grace_ms: DEFAULT_IDLE_GRACE_MS,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            policies: NamespacePolicies::default(),
            token_cache: DEFAULT_TOKEN_CACHE,
            db_cache_bytes: palisade_storage::redb_backend::DEFAULT_CACHE_BYTES,
            backend: BackendConfig::Embedded,
            signing_key_file: None,
            trust_key_files: Vec::new(),
            auth_file: None,
            insecure_no_auth: false,
            audit_log: None,
            audit_log_max_bytes: DEFAULT_AUDIT_LOG_MAX_BYTES,
            limits: Limits::default(),
            store_limits: palisade_storage::StoreLimits::default(),
            transport: crate::transport::TransportConfig::default(),
            events_buffer: crate::observe::DEFAULT_EVENTS_BUFFER,
            max_event_subscribers: crate::observe::DEFAULT_MAX_SUBSCRIBERS,
        }
    }
}
