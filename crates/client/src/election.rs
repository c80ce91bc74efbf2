//! Leader election on one lock: [`Election`] (campaign, observe), [`Leader`] (proclaim,
//! resign). docs/election.md is the guide.
//!
//! The election *is* the lock named after it: a candidate campaigns by acquiring it with
//! its value (what it advertises, e.g. its address), waiting in the server's
//! first-come first-served line; the holder is the leader, its lease's epoch is its term
//! and its fencing token, and lock status shows who leads, with which value and epoch.
//! Resigning releases the lock, and the next candidate in line leads at once.
//!
//! ## What a leader must do, and what this does not do
//! - **Fence before acting (S10).** Winning an election notifies no resource. A former
//!   leader that paused may still have writes in flight, and they pass until a resource
//!   has seen the new epoch. A new leader calls [`Leader::fence`] (or writes with its
//!   token) on every resource it guards before it acts, and every write carries the
//!   token; the resource, not this module, refuses the old leader.
//! - [`Leader::is_lost`] returning `false` is not permission to act: the process can
//!   pause right after asking. Leadership ends at the server when the lease expires,
//!   whatever the leader believes.
//! - Observers poll ([`Observer`], every [`DEFAULT_POLL_INTERVAL`] unless told): they see
//!   a change at most one interval late, and may miss a leader that came and went within
//!   one interval (its epoch shows the gap: epochs count every term).

use std::time::Duration;

use tokio::time::Instant;

use crate::{AcquireOptions, Client, Error, FencedKv, LeaseGuard, LockStatus, Proclaimed};

/// How often an [`Observer`] looks at the election's lock by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The longest one wait in line may be (the server's bound); a campaign waits in
/// rounds of at most this.
const MAX_WAIT: Duration = Duration::from_secs(300);

/// An election: candidates campaign for the lock `name`; observers watch who leads.
#[derive(Debug, Clone)]
pub struct Election {
    client: Client,
    name: String,
    ttl: Duration,
    lock_delay: Option<Duration>,
    poll: Duration,
}

/// Who leads, as an observer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderInfo {
    pub holder: String,
    /// The leader's term: its lease's epoch, which is also its fencing token's.
    pub epoch: u64,
    /// What the leader advertises.
    pub value: Option<Vec<u8>>,
}

impl LeaderInfo {
    fn from_status(status: LockStatus) -> Option<LeaderInfo> {
        Some(LeaderInfo {
            holder: status.holder?,
            epoch: status.lease_epoch.unwrap_or(status.epoch),
            value: status.value,
        })
    }
}

impl Election {
    /// The election held on lock `name` (any valid lock name), with a 10 s leader TTL.
    pub fn new(client: Client, name: &str) -> Election {
        Election {
            client,
            name: name.to_owned(),
            ttl: Duration::from_secs(10),
            lock_delay: None,
            poll: DEFAULT_POLL_INTERVAL,
        }
    }

    /// The leader's lease TTL: how long a leader that stops renewing (a crash, a pause)
    /// keeps the others waiting. Renewed every `ttl / 3`.
    pub fn ttl(mut self, ttl: Duration) -> Election {
        self.ttl = ttl;
        self
    }

    /// The lock-delay of a leader's lease: after a leader's lease *expires*, nobody leads
    /// for this long (for resources that cannot check tokens).
    pub fn lock_delay(mut self, delay: Duration) -> Election {
        self.lock_delay = Some(delay);
        self
    }

    /// How often [`Election::observe`]'s observers look.
    pub fn poll_interval(mut self, every: Duration) -> Election {
        self.poll = every.max(Duration::from_millis(10));
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits in line until `candidate` leads, advertising `value`. Returns an error other
    /// than `lock_held` as it comes (an acquire whose answer was lost is not resent: see
    /// [`Client::acquire_raw`]).
    pub async fn campaign(&self, candidate: &str, value: &[u8]) -> Result<Leader, Error> {
        loop {
            match self.try_campaign(candidate, value, MAX_WAIT).await {
                Err(Error::LockHeld { .. }) => continue,
                other => return other,
            }
        }
    }

    /// Like [`Election::campaign`], giving up with [`Error::LockHeld`] after `within`.
    pub async fn campaign_within(
        &self,
        candidate: &str,
        value: &[u8],
        within: Duration,
    ) -> Result<Leader, Error> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .try_campaign(candidate, value, left.min(MAX_WAIT))
                .await
            {
                Err(Error::LockHeld { .. })
                    if Instant::now() + Duration::from_millis(1) < deadline =>
                {
                    continue
                }
                other => return other,
            }
        }
    }

    async fn try_campaign(
        &self,
        candidate: &str,
        value: &[u8],
        wait: Duration,
    ) -> Result<Leader, Error> {
        let opts = AcquireOptions {
            ttl: self.ttl,
            wait: (!wait.is_zero()).then_some(wait),
            value: Some(value.to_vec()),
            lock_delay: self.lock_delay,
            session: None,
        };
        let guard = self.client.acquire(&self.name, candidate, opts).await?;
        Ok(Leader { guard })
    }

    /// Who leads now, if anyone.
    pub async fn leader(&self) -> Result<Option<LeaderInfo>, Error> {
        let status = self.client.lock_status(&self.name).await?;
        Ok(LeaderInfo::from_status(status))
    }

    /// An observer of this election's leadership changes.
    pub fn observe(&self) -> Observer {
        Observer {
            client: self.client.clone(),
            lock: self.name.clone(),
            source: Source::Poll { every: self.poll },
            seen: None,
        }
    }
}

/// This candidate leads: a held lease on the election's lock, renewed in the background.
#[derive(Debug)]
pub struct Leader {
    guard: LeaseGuard,
}

impl Leader {
    /// The term, which is also the fencing token's epoch.
    pub fn epoch(&self) -> u64 {
        self.guard.epoch()
    }

    /// The fencing token to attach to every write this leader makes.
    pub fn token(&self) -> &str {
        self.guard.token()
    }

    /// The lease underneath.
    pub fn lease(&self) -> &LeaseGuard {
        &self.guard
    }

    /// Replaces what this leader advertises.
    pub async fn proclaim(&self, value: &[u8]) -> Result<Proclaimed, Error> {
        self.guard.proclaim(Some(value)).await
    }

    /// A fenced handle on the namespace named after the election, carrying this term's
    /// token.
    pub fn kv(&self) -> FencedKv {
        self.guard.kv()
    }

    /// Barrier on the namespace named after the election: from now on it refuses every
    /// earlier leader's writes (S10). Call it, on every resource the leader guards,
    /// before acting.
    pub async fn fence(&self) -> Result<u64, Error> {
        self.guard.fence().await
    }

    /// True once leadership is known or presumed lost; `false` is no promise.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Resolves when leadership is lost (cancel-safe): stop acting then.
    pub async fn lost(&self) {
        self.guard.lost().await
    }

    /// Steps down: the lock goes to the next candidate in line at once.
    pub async fn resign(self) -> Result<(), Error> {
        self.guard.release().await
    }
}

/// Where an observer learns of changes.
///
/// Today one source: polling the lock's status. The server's events stream
/// (`GET /v1/locks/{lock}/events`, server-sent events of grants, releases and expiries)
/// is the second one to add here: a `Source::Events` that reads the stream and falls back
/// to polling when the stream is unavailable. [`Observer::changed`] keeps its contract
/// (the next leadership different from the last one returned) whichever source serves.
#[derive(Debug, Clone)]
enum Source {
    Poll { every: Duration },
}

/// Watches an election's leadership: who leads, their epoch and value.
#[derive(Debug)]
pub struct Observer {
    client: Client,
    lock: String,
    source: Source,
    /// What `changed` returned last (`None`: nothing yet).
    seen: Option<Option<LeaderInfo>>,
}

impl Observer {
    /// The leadership now, at the first call; after that, waits until it differs from
    /// what was returned last (another leader, a new epoch, a new value, or nobody) and
    /// returns it. Transport and server errors are returned, not retried: the observer can
    /// be called again.
    pub async fn changed(&mut self) -> Result<Option<LeaderInfo>, Error> {
        match self.source.clone() {
            Source::Poll { every } => loop {
                let status = self.client.lock_status(&self.lock).await?;
                let now = LeaderInfo::from_status(status);
                if self.seen.as_ref() != Some(&now) {
                    self.seen = Some(now.clone());
                    return Ok(now);
                }
                tokio::time::sleep(every).await;
            },
        }
    }
}
