//! # etcd: Palisade over a replicated store
//!
//! When one node is not enough, several **stateless** `palisade serve --backend etcd`
//! nodes share one etcd cluster. This crate gives them both roles that need durable state:
//!
//! - [`EtcdStore`] implements [`palisade_storage::FencedStore`]: the fenced store. Values,
//!   per-namespace high-water marks, usage counters and idempotency records live in etcd,
//!   and every write is decided by the same rule as the embedded store's
//!   ([`palisade_storage::decide()`]).
//! - [`EtcdIssuer`] implements [`palisade_issuer::LockService`]: epochs, leases and the
//!   waiting line live in etcd; a Palisade lease is an etcd lease.
//! - [`EtcdKeySet`]: the issuer key set every node signs and verifies with (rotation).
//! - [`EpochLedger`] ([`ledger`]): a node's record, outside etcd, of the highest epoch it
//!   may have handed out, and [`ledger::raise_floor`], which puts etcd's epochs and marks
//!   above every ledger after a snapshot restore (S11).
//!
//! An [`EtcdIssuer`] given a lease observer follows the holder keys with an etcd watch,
//! so every node reports every grant and every end of a lease, whichever node made it
//! (see `watch`; a node tells a release from an expiry only for its own releases).
//!
//! Palisade does not implement consensus: etcd's Raft log is the one enforcement point
//! that every node shares (S7). Every decision is **one etcd transaction**:
//!
//! - a fenced write reads the namespace's mark, its usage counter, the key and the
//!   idempotency record (with their mod revisions), runs [`palisade_storage::decide()`]
//!   (idempotency, the gate, preconditions, quotas) locally, then commits `if all of them
//!   are unchanged then put mark, put/delete key, put counter, put idempotency record`;
//!   if another node got there first the compare fails and the write starts again from
//!   the read (a bounded number of times, then `storage_failed`);
//! - an acquisition commits `if the lock has no holder and its epoch key is unchanged then
//!   put epoch + 1, put the holder key (attached to the new etcd lease)`.
//!
//! The connection to etcd can be TLS ([`EtcdTls`]: the members' CA, and a client
//! certificate for members that require one) and authenticated as an etcd user
//! ([`EtcdUser`]); expired auth tokens are renewed by the client, and the refused call is
//! sent again (etcd refused it before applying it).
//!
//! ## Invariants
//! - Nothing is answered Ok unless its etcd transaction succeeded (etcd commits through its
//!   Raft quorum, each member fsyncs its log). A refusal (stale token, failed
//!   precondition, lock held) is decided on a linearizable read and writes nothing.
//! - The epoch of a lock only grows, whichever node issues it: every grant compares the
//!   epoch key's mod revision it read, so two nodes can never both issue `n + 1`.
//! - A lock has at most one holder key, and the key lives exactly as long as its etcd
//!   lease: a lock is never granted twice for overlapping leases.
//! - Waiters are served first come, first served across nodes, ordered by the create
//!   revision of their waiter keys (etcd's own lock recipe).
//!
//! ## What this crate does not guarantee
//! - **Availability without quorum.** When etcd has no leader or cannot be reached, every
//!   operation fails with [`StorageError::Failed`] (HTTP 503 `storage_failed`) after the
//!   request timeout. Palisade refuses; it does not guess.
//! - **Outcome of a timed-out write.** A transaction whose answer was lost may still have
//!   committed, as with any database. Use an `Idempotency-Key` to retry safely (S9).
//! - **Millisecond TTLs.** etcd leases count whole seconds: a TTL is rounded up to whole
//!   seconds and etcd raises it to its own minimum (1.5 × the election timeout, rounded up:
//!   2 s with etcd's defaults). The granted TTL is what acquisitions report.
//! - **Lock-delay at millisecond precision.** etcd deletes an expired lease's keys without
//!   saying whether it expired or was revoked, so the delay is kept by a second etcd lease
//!   that outlives the holder's (see `recipes`): at least the delay, counted in whole
//!   seconds, and at most one second more.
//! - **Per-principal quotas** on leases and sessions: not counted in etcd.
//! - **A snapshot restore on its own.** etcd restored from a snapshot has forgotten the
//!   epochs issued since; only the nodes' ledgers and `palisade admin etcd-raise` make it
//!   safe again (see [`ledger`]).
//! - Fencing itself is unchanged: issuing an epoch does not notify resources (S10), equal
//!   epochs are not deduplicated (S8, S9), and tokens are not access control (S14).

mod error;
mod grantable;
mod issuer;
mod key_set;
mod keys;
pub mod ledger;
mod recipes;
mod store;
mod txn;
mod waiting;
mod watch;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use palisade_storage::observe::CommitHook;
use palisade_storage::StorageError;

pub use issuer::EtcdIssuer;
pub use key_set::{EtcdKeySet, StoredKeySet, Updated};
pub use ledger::{EpochLedger, LedgerFile, Raised};
pub use store::EtcdStore;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "/palisade/";

/// How to reach etcd and where Palisade's keys live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs of the etcd members, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Every key Palisade writes starts with this (default [`DEFAULT_PREFIX`]). Several
    /// independent Palisade deployments can share one etcd cluster under different prefixes.
    pub prefix: String,
    /// Longest wait for one etcd call before the operation fails with `storage_failed`.
    pub request_timeout: Duration,
    /// Talk to etcd over TLS (every endpoint must be `https://`).
    pub tls: Option<EtcdTls>,
    /// Authenticate as this etcd user (etcd's `auth enable`).
    pub user: Option<EtcdUser>,
}

/// TLS to etcd: the CA that signed the members' certificates, and optionally a client
/// certificate for members started with `--client-cert-auth`. PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca_file: PathBuf,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// An etcd user and its password.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUser {
    pub name: String,
    pub password: String,
}

impl std::fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl EtcdConfig {
    /// A config with the default prefix and timeout, plain HTTP and no user.
    pub fn new(endpoints: Vec<String>) -> Self {
        EtcdConfig {
            endpoints,
            prefix: DEFAULT_PREFIX.to_owned(),
            request_timeout: Duration::from_secs(5),
            tls: None,
            user: None,
        }
    }
}

fn read_pem(what: &str, path: &Path) -> Result<Vec<u8>, StorageError> {
    std::fs::read(path).map_err(|e| {
        StorageError::Failed(format!(
            "cannot read the etcd {what} {}: {e}",
            path.display()
        ))
    })
}

/// The TLS options for `tls`, after checking that every endpoint is `https://` (and
/// that no endpoint is `https://` without TLS settings).
fn tls_options(config: &EtcdConfig) -> Result<Option<TlsOptions>, StorageError> {
    let plain = config.endpoints.iter().find(|e| !e.starts_with("https://"));
    let secure = config.endpoints.iter().find(|e| e.starts_with("https://"));
    let Some(tls) = &config.tls else {
        if let Some(endpoint) = secure {
            return Err(StorageError::Failed(format!(
                "etcd endpoint {endpoint} is https:// but no etcd CA file is configured"
            )));
        }
        return Ok(None);
    };
    if let Some(endpoint) = plain {
        return Err(StorageError::Failed(format!(
            "etcd TLS is configured but endpoint {endpoint} is not https://"
        )));
    }
    let mut options =
        TlsOptions::new().ca_certificate(Certificate::from_pem(read_pem("CA file", &tls.ca_file)?));
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            options = options.identity(Identity::from_pem(
                read_pem("client certificate", cert)?,
                read_pem("client key", key)?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(StorageError::Failed(
                "an etcd client certificate needs both its certificate and its key file".to_owned(),
            ))
        }
    }
    Ok(Some(options))
}

/// Which failed etcd calls may be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Only calls etcd certainly never received or acted on (the connection to a dead
    /// member was refused; the member had no leader and refused the call). For writes:
    /// a write whose answer was lost may have been applied, and must not be sent twice.
    IfNeverReceived,
    /// Any call etcd answered "unavailable" (leader changed, no leader, connection
    /// lost). For reads and other calls that are harmless to repeat.
    IfUnavailable,
}

impl Resend {
    fn allows(self, e: &etcd_client::Error) -> bool {
        match self {
            Resend::IfNeverReceived => error::never_reached_etcd(e),
            Resend::IfUnavailable => error::never_reached_etcd(e) || error::unavailable(e),
        }
    }
}

/// A connection to etcd plus the key layout: what [`EtcdStore`] and [`EtcdIssuer`] share.
/// Cheap to clone (the underlying gRPC channel is shared).
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    keys: keys::Keys,
    timeout: Duration,
    /// Told the duration of every write transaction (`palisade_fsync_duration_seconds`).
    hook: CommitHook,
}

impl Etcd {
    /// Builds the client. The connection itself is lazy: an unreachable cluster is not an
    /// error here (nodes are stateless and may start before etcd), but it is logged, and
    /// every operation fails with `storage_failed` until etcd answers. With a user, etcd
    /// must answer now: the password is checked here, and a wrong one is an error.
    pub async fn connect(config: &EtcdConfig) -> Result<Etcd, StorageError> {
        if config.endpoints.is_empty() {
            return Err(StorageError::Failed("no etcd endpoints given".to_owned()));
        }
        let prefix = keys::Keys::new(&config.prefix)?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.request_timeout)
            .with_timeout(config.request_timeout)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            // Without a leader, etcd refuses rather than serving a partitioned member's view.
            .with_require_leader(true);
        if let Some(tls) = tls_options(config)? {
            options = options.with_tls(tls);
        }
        if let Some(user) = &config.user {
            options = options
                .with_user(user.name.clone(), user.password.clone())
                // etcd's auth tokens expire; a long-running node must get new ones. A call
                // refused for an expired token was not applied, so sending it again is safe.
                .with_auto_token_refresh(true);
        }
        let client = Client::connect(&config.endpoints, Some(options))
            .await
            .map_err(|e| error::storage("connect", e))?;
        let etcd = Etcd {
            client,
            keys: prefix,
            timeout: config.request_timeout,
            hook: CommitHook::default(),
        };
        if let Err(e) = etcd.probe().await {
            tracing::warn!(error = %e, "etcd does not answer yet; operations fail until it does");
        }
        Ok(etcd)
    }

    /// Reports the duration of every write transaction to `hook` (the etcd analogue of
    /// the embedded store's fsync: etcd answers once its quorum has the write in its
    /// fsynced log). Set before cloning the connection into the store and the issuer.
    pub fn with_commit_hook(mut self, hook: CommitHook) -> Self {
        self.hook = hook;
        self
    }

    /// One linearizable read: does the cluster answer with a leader?
    pub async fn probe(&self) -> Result<(), StorageError> {
        let key = self.keys.meta_probe();
        self.call("probe", Resend::IfUnavailable, || {
            let (mut kv, key) = (self.client.kv_client(), key.clone());
            async move { kv.get(key, None).await }
        })
        .await
        .map(drop)
    }

    /// Runs one etcd call within the request timeout, mapping every failure to a
    /// [`StorageError`] (`error::storage`). See [`Self::call_raw`] for the retries.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        what: &str,
        resend: Resend,
        call: F,
    ) -> Result<T, StorageError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_raw(what, resend, call)
            .await?
            .map_err(|e| error::storage(what, e))
    }

    /// Runs one etcd call within the request timeout: `Err` when time ran out, otherwise
    /// etcd's own answer. Calls failing as `resend` allows are sent again (through the
    /// client's other endpoints) until the timeout: that is what lets a node ride out the
    /// loss of one etcd member or a leader election. Other failures are returned as they
    /// are.
    pub(crate) async fn call_raw<T, F, Fut>(
        &self,
        what: &str,
        resend: Resend,
        call: F,
    ) -> Result<Result<T, etcd_client::Error>, StorageError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, call()).await {
                Ok(Err(e)) if resend.allows(&e) && Instant::now() + pause < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Ok(answer) => return Ok(answer),
                Err(_) => {
                    return Err(StorageError::Unavailable(format!(
                        "etcd {what}: no answer within {:?}",
                        self.timeout
                    )))
                }
            }
        }
    }
}
