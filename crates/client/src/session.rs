//! Sessions: one keepalive for many locks ([`SessionGuard`]), and the calls on lock values
//! and sessions ([`Client::proclaim`], [`Client::create_session`], ...).
//!
//! A session has a TTL; every lock acquired in it ([`SessionGuard::acquire`]) lives as
//! long as the session, which one background task renews every `ttl / 3`. When the
//! session expires (the process paused, the network failed) or is closed, every lock in
//! it is released at that same moment, on the server: the holder learns it from
//! [`SessionGuard::lost`] and, for any write in flight, from the resource's
//! [`Error::Stale`] once a newer holder has written.

use std::time::Duration;

use reqwest::Method;
use tokio::time::Instant;

use crate::client::millis;
use crate::failover::Retry;
use crate::lease::{renewal_methods, Renewing};
use crate::paths::segment;
use crate::types::encode_value;
use crate::{AcquireOptions, Client, Error, Lease, Proclaimed, SessionInfo};
use palisade_api::wire::{ProclaimRequest, SessionRequest};

impl Client {
    /// Replaces the value lease `lease_id` advertises (`None` clears it). Only its owner
    /// may ([`Error::PermissionDenied`] otherwise).
    pub async fn proclaim(
        &self,
        lease_id: &str,
        value: Option<&[u8]>,
    ) -> Result<Proclaimed, Error> {
        let path = format!("/v1/leases/{}/proclaim", segment("lease id", lease_id)?);
        let body = ProclaimRequest {
            value: value.map(encode_value),
        };
        // Setting a value twice leaves what setting it once does: safe to resend.
        Self::json(self.post_safe(&path, Some(&body)).await?).await
    }

    /// Creates a session and starts renewing it in the background every `ttl / 3`.
    pub async fn session(&self, holder: &str, ttl: Duration) -> Result<SessionGuard, Error> {
        let sent_at = Instant::now();
        let info = self.create_session(holder, ttl).await?;
        Ok(SessionGuard::start(self.clone(), info, sent_at))
    }

    /// Creates a session without background renewal. Like an acquire, a creation whose
    /// answer was lost is not resent to another endpoint (it would make a second
    /// session).
    pub async fn create_session(&self, holder: &str, ttl: Duration) -> Result<SessionInfo, Error> {
        let body = SessionRequest {
            holder: Some(holder.to_owned()),
            ttl_ms: millis(ttl),
        };
        let call = self.call(Retry::UnlessUnknown, Method::POST, "/v1/sessions", |r| {
            r.json(&body)
        });
        Self::json(call.await?).await
    }

    /// Renews a session and every lock in it for a full TTL from now.
    pub async fn keepalive_session(&self, session_id: &str) -> Result<SessionInfo, Error> {
        let path = format!(
            "/v1/sessions/{}/keepalive",
            segment("session id", session_id)?
        );
        Self::json(self.post_safe::<()>(&path, None).await?).await
    }

    /// A live session and its locks.
    pub async fn session_info(&self, session_id: &str) -> Result<SessionInfo, Error> {
        self.get_json(&format!(
            "/v1/sessions/{}",
            segment("session id", session_id)?
        ))
        .await
    }

    /// Ends a session: every lock in it is released at once. Answers the released ones.
    pub async fn close_session(&self, session_id: &str) -> Result<SessionInfo, Error> {
        let path = format!("/v1/sessions/{}/close", segment("session id", session_id)?);
        Self::json(self.post_safe::<()>(&path, None).await?).await
    }
}

/// A session held by this process, renewed in the background every `ttl / 3`.
///
/// Dropping the guard stops the renewals but does not close the session: it then runs
/// out after its TTL, and every lock in it with it. Use [`SessionGuard::close`] to
/// release them all at once.
#[derive(Debug)]
pub struct SessionGuard {
    client: Client,
    info: SessionInfo,
    renewing: Renewing,
}

impl SessionGuard {
    fn start(client: Client, info: SessionInfo, sent_at: Instant) -> SessionGuard {
        let ttl = Duration::from_millis(info.ttl_ms);
        let renewer = client.clone();
        let id = info.session_id.clone();
        let keepalive = move || {
            let (renewer, id) = (renewer.clone(), id.clone());
            async move { renewer.keepalive_session(&id).await }
        };
        let renewing = Renewing::start(keepalive, ttl, client.deadlines, sent_at);
        SessionGuard {
            client,
            info,
            renewing,
        }
    }

    pub fn session_id(&self) -> &str {
        &self.info.session_id
    }

    /// The session's TTL, as the server granted it (etcd rounds up to whole seconds).
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.info.ttl_ms)
    }

    // A session's deadlines are its locks' deadlines: every lock in it ends with it.
    renewal_methods!();

    /// Acquires `lock` in this session (`opts.ttl` is ignored: the session's applies).
    /// The lock needs no renewal of its own.
    pub async fn acquire(
        &self,
        lock: &str,
        holder: &str,
        opts: AcquireOptions,
    ) -> Result<SessionLock, Error> {
        let opts = AcquireOptions {
            session: Some(self.info.session_id.clone()),
            ..opts
        };
        let lease = self.client.acquire_raw(lock, holder, opts).await?;
        Ok(SessionLock {
            client: self.client.clone(),
            lease,
        })
    }

    /// The session's live locks, as the server sees them now.
    pub async fn info(&self) -> Result<SessionInfo, Error> {
        self.client.session_info(&self.info.session_id).await
    }

    /// Stops the renewals and closes the session: every lock in it is released at once
    /// (no lock-delay). Answers what was released.
    pub async fn close(self) -> Result<SessionInfo, Error> {
        self.renewing.stop();
        self.client.close_session(&self.info.session_id).await
    }
}

/// A lock held in a session: renewed by its session, ended with it.
#[derive(Debug, Clone)]
pub struct SessionLock {
    client: Client,
    lease: Lease,
}

impl SessionLock {
    crate::lease::lease_methods!();

    /// Releases this one lock; the session and its other locks live on.
    pub async fn release(self) -> Result<(), Error> {
        self.client.release(&self.lease.lease_id).await
    }
}
