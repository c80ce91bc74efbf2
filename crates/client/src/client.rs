//! [`Client`]: one connection pool to one Palisade server, and the lock/lease/token calls.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{RequestBuilder, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::decode::decode_error;
use crate::lease::LeaseGuard;
use crate::paths::segment;
use crate::types::{FenceStatus, KeysBody, LocksBody};
use crate::{
    AcquireOptions, ClientBuilder, Error, FencedKv, KeepaliveInfo, Kv, Lease, LockStatus,
    PublicKey, TokenCheck,
};

/// Bound on every call that is not a queued acquire. A lock service that does not answer
/// within this is treated as unreachable rather than waited on forever.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Extra time granted to an acquire that waits in the server's queue, on top of its
/// `wait`, so the server's own 409 at the end of the wait arrives before our timeout.
pub const WAIT_MARGIN: Duration = Duration::from_secs(5);

/// Bound on establishing a TCP connection, well inside [`REQUEST_TIMEOUT`].
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A handle to one Palisade server.
///
/// Cheap to clone: clones share one pool of persistent (keep-alive) connections, which is
/// what keeps a hot write path at one round trip per operation.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) http: reqwest::Client,
    pub(crate) base: Arc<str>,
}

#[derive(Serialize)]
struct AcquireBody<'a> {
    holder: &'a str,
    ttl_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    wait_ms: Option<u64>,
}

#[derive(Serialize)]
struct CheckBody<'a> {
    token: &'a str,
}

/// Saturating conversion: the server rejects out-of-range values with a clear message.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Client {
    /// A client for the server at `base_url`, e.g. `"http://127.0.0.1:7700"`, with
    /// default settings (an `https` server is checked against the system's roots; no
    /// key). No request is made; use [`Client::health`] to check reachability.
    pub fn new(base_url: &str) -> Result<Client, Error> {
        Client::builder(base_url).build()
    }

    /// Settings for a client of the server at `base_url` (`http://` or `https://`): CA
    /// file, client certificate, bearer key. See [`ClientBuilder`].
    pub fn builder(base_url: &str) -> ClientBuilder {
        ClientBuilder::new(base_url)
    }

    /// The server's base URL, without a trailing `/`.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Sends a request; any non-2xx answer becomes the matching [`Error`].
    pub(crate) async fn send(req: RequestBuilder) -> Result<Response, Error> {
        let resp = req.send().await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = resp.bytes().await?;
        Err(decode_error(status, &body))
    }

    pub(crate) async fn json<T: DeserializeOwned>(resp: Response) -> Result<T, Error> {
        let body = resp.bytes().await?;
        serde_json::from_slice(&body).map_err(|e| Error::Decode(e.to_string()))
    }

    /// Acquires `lock` and starts renewing the lease in the background every `ttl / 3`.
    ///
    /// Fails with [`Error::LockHeld`] if the lock is taken (after queueing up to
    /// `opts.wait`). See [`LeaseGuard`] for what the guard does and does not promise.
    pub async fn acquire(
        &self,
        lock: &str,
        holder: &str,
        opts: AcquireOptions,
    ) -> Result<LeaseGuard, Error> {
        // The local deadline counts from *before* the request: the server's lease started
        // somewhere between send and receipt, so this errs towards "lost" too early,
        // never too late.
        let sent_at = Instant::now();
        let lease = self.acquire_raw(lock, holder, opts).await?;
        Ok(LeaseGuard::start(self.clone(), lease, sent_at))
    }

    /// Acquires `lock` without background renewal: the caller must call
    /// [`Client::keepalive`] itself, or the lease expires after its TTL.
    pub async fn acquire_raw(
        &self,
        lock: &str,
        holder: &str,
        opts: AcquireOptions,
    ) -> Result<Lease, Error> {
        let url = self.url(&format!(
            "/v1/locks/{}/acquire",
            segment("lock name", lock)?
        ));
        let wait_ms = opts.wait.map(millis);
        let body = AcquireBody {
            holder,
            ttl_ms: millis(opts.ttl),
            wait_ms,
        };
        let mut req = self.http.post(url).json(&body);
        if let Some(wait) = opts.wait {
            req = req.timeout(wait.saturating_add(WAIT_MARGIN));
        }
        Self::json(Self::send(req).await?).await
    }

    /// Renews a lease for a full TTL from now. [`Error::LeaseExpired`] once it is gone.
    pub async fn keepalive(&self, lease_id: &str) -> Result<KeepaliveInfo, Error> {
        let url = self.url(&format!(
            "/v1/leases/{}/keepalive",
            segment("lease id", lease_id)?
        ));
        Self::json(Self::send(self.http.post(url)).await?).await
    }

    /// Releases a lease; the lock passes to the next waiter at once.
    pub async fn release(&self, lease_id: &str) -> Result<(), Error> {
        let url = self.url(&format!(
            "/v1/leases/{}/release",
            segment("lease id", lease_id)?
        ));
        Self::send(self.http.post(url)).await.map(drop)
    }

    /// One lock's status. A lock never acquired answers epoch 0.
    pub async fn lock_status(&self, lock: &str) -> Result<LockStatus, Error> {
        let url = self.url(&format!("/v1/locks/{}", segment("lock name", lock)?));
        Self::json(Self::send(self.http.get(url)).await?).await
    }

    /// Every known lock, sorted by name.
    pub async fn locks(&self) -> Result<Vec<LockStatus>, Error> {
        let body: LocksBody =
            Self::json(Self::send(self.http.get(self.url("/v1/locks"))).await?).await?;
        Ok(body.locks)
    }

    /// The issuer's public keys, for verifying tokens offline.
    pub async fn keys(&self) -> Result<Vec<PublicKey>, Error> {
        let body: KeysBody =
            Self::json(Self::send(self.http.get(self.url("/v1/keys"))).await?).await?;
        Ok(body.keys)
    }

    /// Asks the issuer whether `token` is genuine, current and its lease alive.
    pub async fn check_token(&self, token: &str) -> Result<TokenCheck, Error> {
        let req = self
            .http
            .post(self.url("/v1/tokens/check"))
            .json(&CheckBody { token });
        Self::json(Self::send(req).await?).await
    }

    /// The fenced store's high-water mark for namespace `lock`.
    pub async fn high_water(&self, lock: &str) -> Result<FenceStatus, Error> {
        let url = self.url(&format!("/v1/fences/{}", segment("lock name", lock)?));
        Self::json(Self::send(self.http.get(url)).await?).await
    }

    /// Read-only access to namespace `lock`: reads need no token.
    pub fn kv(&self, lock: &str) -> Kv {
        Kv::new(self.clone(), lock)
    }

    /// Fenced access to namespace `lock` with a token obtained elsewhere (e.g. passed to
    /// a CLI). Holders using [`Client::acquire`] should prefer [`LeaseGuard::kv`].
    pub fn fenced_kv(&self, lock: &str, token: &str) -> FencedKv {
        FencedKv::new(self.clone(), lock, token)
    }

    /// `Ok` if the server answers and its store has not latched a failure
    /// ([`Error::StorageFailed`] if it has).
    pub async fn health(&self) -> Result<(), Error> {
        Self::send(self.http.get(self.url("/healthz")))
            .await
            .map(drop)
    }
}
