//! [`Client`]: one connection pool to one Palisade server, and the lock/lease/token calls.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::time::Instant;

use crate::failover::{Endpoints, Retry};
use crate::lease::LeaseGuard;
use crate::paths::segment;
use crate::types::FenceStatus;
use crate::{
    AcquireOptions, ClientBuilder, Deadlines, Error, FencedKv, KeepaliveInfo, Kv, Lease,
    LockStatus, PublicKey, TokenCheck,
};
use palisade_api::wire::{
    AcquireRequest, GateReport, GateReportAnswer, KeysAnswer, LockList, TokenCheckRequest,
};

/// Bound on every call that is not a queued acquire. A lock service that does not answer
/// within this is treated as unreachable rather than waited on forever.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Extra time granted to an acquire that waits in the server's queue, on top of its
/// `wait`, so the server's own 409 at the end of the wait arrives before our timeout.
pub const WAIT_MARGIN: Duration = Duration::from_secs(5);

/// Bound on establishing a TCP connection, well inside [`REQUEST_TIMEOUT`].
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A handle to one Palisade deployment: one server, or several nodes of one deployment
/// to fail over between ([`ClientBuilder::endpoint`], see `failover`).
///
/// Cheap to clone: clones share one pool of persistent (keep-alive) connections, which is
/// what keeps a hot write path at one round trip per operation.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) http: reqwest::Client,
    pub(crate) endpoints: Arc<Endpoints>,
    /// How leases and sessions derive their deadlines from the TTL.
    pub(crate) deadlines: Deadlines,
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

    /// The base URL calls start from (the one that answered last), without a trailing
    /// `/`.
    pub fn base_url(&self) -> &str {
        self.endpoints.preferred()
    }

    /// Every endpoint this client fails over between, in configuration order.
    pub fn endpoints(&self) -> &[String] {
        self.endpoints.bases()
    }

    /// Whether this client has more than one endpoint (and so puts an idempotency key on
    /// every fenced write, see `failover`).
    pub(crate) fn fails_over(&self) -> bool {
        self.endpoints.several()
    }

    /// A call without body that is safe to resend.
    pub(crate) async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        Self::json(self.call(Retry::Safe, Method::GET, path, |r| r).await?).await
    }

    /// A POST that is safe to resend, with an optional JSON body.
    pub(crate) async fn post_safe<B: Serialize>(
        &self,
        path: &str,
        body: Option<&B>,
    ) -> Result<Response, Error> {
        self.call(Retry::Safe, Method::POST, path, |r| match body {
            Some(b) => r.json(b),
            None => r,
        })
        .await
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
        let mut sent_at = Instant::now();
        let lease = self.acquire_raw(lock, holder, opts).await?;
        // After a wait in line the grant may have come long after the send, and a
        // deadline counted from the send may be (nearly) over already: renew once now, so
        // the guard's deadline counts from this renewal instead.
        let ttl = Duration::from_millis(lease.ttl_ms);
        if sent_at.elapsed() > ttl / 3 {
            let renewed_at = Instant::now();
            self.keepalive(&lease.lease_id).await?;
            sent_at = renewed_at;
        }
        Ok(LeaseGuard::start(self.clone(), lease, sent_at))
    }

    /// Acquires `lock` without background renewal: the caller must call
    /// [`Client::keepalive`] itself, or the lease expires after its TTL.
    ///
    /// With several endpoints, an acquire that reached no node (or got 503) is sent to the
    /// next one; an acquire whose answer was lost is not resent (a second acquire would be
    /// a second lease) and fails with [`Error::Transport`].
    pub async fn acquire_raw(
        &self,
        lock: &str,
        holder: &str,
        opts: AcquireOptions,
    ) -> Result<Lease, Error> {
        let path = format!("/v1/locks/{}/acquire", segment("lock name", lock)?);
        let body = AcquireRequest {
            holder: Some(holder.to_owned()),
            // A lease in a session has the session's TTL: the server refuses both.
            ttl_ms: opts.session.is_none().then(|| millis(opts.ttl)),
            wait_ms: opts.wait.map_or(0, millis),
            value: opts.value.as_deref().map(crate::types::encode_value),
            lock_delay_ms: opts.lock_delay.map(millis),
            session: opts.session.clone(),
        };
        let resp = self
            .call(Retry::UnlessUnknown, Method::POST, &path, |r| {
                let r = r.json(&body);
                match opts.wait {
                    Some(wait) => r.timeout(wait.saturating_add(WAIT_MARGIN)),
                    None => r,
                }
            })
            .await?;
        Self::json(resp).await
    }

    /// Renews a lease for a full TTL from now (a lease in a session: its whole session).
    /// [`Error::LeaseExpired`] once it is gone.
    pub async fn keepalive(&self, lease_id: &str) -> Result<KeepaliveInfo, Error> {
        let path = format!("/v1/leases/{}/keepalive", segment("lease id", lease_id)?);
        Self::json(self.post_safe::<()>(&path, None).await?).await
    }

    /// Releases a lease; the lock passes to the next waiter at once.
    pub async fn release(&self, lease_id: &str) -> Result<(), Error> {
        let path = format!("/v1/leases/{}/release", segment("lease id", lease_id)?);
        self.post_safe::<()>(&path, None).await.map(drop)
    }

    /// One lock's status. A lock never acquired answers epoch 0.
    pub async fn lock_status(&self, lock: &str) -> Result<LockStatus, Error> {
        self.get_json(&format!("/v1/locks/{}", segment("lock name", lock)?))
            .await
    }

    /// Every known lock, sorted by name.
    pub async fn locks(&self) -> Result<Vec<LockStatus>, Error> {
        let body: LockList = self.get_json("/v1/locks").await?;
        Ok(body.locks)
    }

    /// One page of the known locks whose names start with `prefix` and sort after
    /// `after`, at most `limit` (the server caps it), in name order, and the name to pass
    /// as `after` for the next page (`None` on the last).
    pub async fn locks_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<LockStatus>, Option<String>), Error> {
        let mut query = vec![("prefix", prefix.to_owned()), ("limit", limit.to_string())];
        if let Some(after) = after {
            query.push(("after", after.to_owned()));
        }
        let answer = self
            .call(Retry::Safe, Method::GET, "/v1/locks", |r| r.query(&query))
            .await?;
        let body: LockList = Self::json(answer).await?;
        Ok((body.locks, body.next))
    }

    /// The issuer's public keys, for verifying tokens offline.
    pub async fn keys(&self) -> Result<Vec<PublicKey>, Error> {
        let body: KeysAnswer = self.get_json("/v1/keys").await?;
        Ok(body.keys)
    }

    /// Asks the issuer whether `token` is genuine, current and its lease alive.
    pub async fn check_token(&self, token: &str) -> Result<TokenCheck, Error> {
        let body = TokenCheckRequest {
            token: token.to_owned(),
        };
        Self::json(self.post_safe("/v1/tokens/check", Some(&body)).await?).await
    }

    /// The fenced store's high-water mark for namespace `lock`.
    pub async fn high_water(&self, lock: &str) -> Result<FenceStatus, Error> {
        self.get_json(&format!("/v1/fences/{}", segment("lock name", lock)?))
            .await
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

    /// Sends a gate's report of what it admitted and refused (`POST /v1/gates/report`):
    /// the server counts it in `/metrics` and puts its refusals on the events stream. Not
    /// resent when the answer was lost on the way (a second copy would count twice).
    pub async fn report_gate(&self, report: &GateReport) -> Result<GateReportAnswer, Error> {
        let resp = self
            .call(
                Retry::UnlessUnknown,
                Method::POST,
                "/v1/gates/report",
                |r| r.json(report),
            )
            .await?;
        Self::json(resp).await
    }

    /// `Ok` if the server answers and its store has not latched a failure
    /// ([`Error::StorageFailed`] if it has).
    pub async fn health(&self) -> Result<(), Error> {
        self.call(Retry::Safe, Method::GET, "/healthz", |r| r)
            .await
            .map(drop)
    }
}
