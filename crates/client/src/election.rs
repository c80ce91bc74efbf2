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
//! - Observers ([`Observer`]) read the lock's status again whenever its events stream
//!   (`GET /v1/locks/{lock}/events`) reports a grant, a release, an expiry or a `reset`,
//!   and at least every [`DEFAULT_POLL_INTERVAL`] (unless told) in any case. A new value
//!   from [`Leader::proclaim`] is no event, and a server whose stream is unavailable (too
//!   many streams, an older server, an etcd node, which reports no lease events) sends
//!   none: those changes are seen by polling, at most one interval late. Either way an
//!   observer may miss a leader that came and went between two reads (its epoch shows
//!   the gap: epochs count every term).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::watch::{worth_retrying, Watch};
use crate::{
    AcquireOptions, Client, Error, FencedKv, LeaseGuard, LockEvent, LockStatus, Proclaimed,
};

/// How often an [`Observer`] looks at the election's lock by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// How long an observer whose events stream was refused for now (429, 503, the network)
/// polls before it tries the stream again.
const STREAM_RETRY: Duration = Duration::from_secs(2);

/// How long after its events stream ended an observer reopens it.
const STREAM_REOPEN: Duration = Duration::from_millis(100);

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
    events: bool,
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
            events: true,
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

    /// How often [`Election::observe`]'s observers look at the lock's status when its
    /// events stream reports nothing (and all the time without it).
    pub fn poll_interval(mut self, every: Duration) -> Election {
        self.poll = every.max(Duration::from_millis(10));
        self
    }

    /// Whether observers use the lock's events stream (`true` by default); `false`: they
    /// poll only.
    pub fn use_events(mut self, on: bool) -> Election {
        self.events = on;
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

    /// An observer of this election's leadership changes. It opens the lock's events
    /// stream at its first [`Observer::changed`] (unless [`Election::use_events`] said
    /// not to).
    pub fn observe(&self) -> Observer {
        Observer {
            client: self.client.clone(),
            lock: self.name.clone(),
            poll: self.poll,
            stream: if self.events {
                Stream::Wanted
            } else {
                Stream::Off
            },
            watch: None,
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

/// The state of an observer's events stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// In use: (re)opened before a look whenever it is not open.
    Wanted,
    /// Refused for now (too many streams, a node unavailable, the network), or just
    /// ended: poll, and open it again from this instant.
    RetryAt(Instant),
    /// Not to be used: turned off, or refused for good (a server without events, a
    /// principal not allowed to watch). Poll only.
    Off,
}

/// Watches an election's leadership: who leads, their epoch and value.
///
/// It reads the lock's status at its first [`Observer::changed`], and again whenever
/// the lock's events stream reports a grant, a release, an expiry or a `reset`, and at
/// least once per poll interval whatever the stream says. The stream is opened before
/// the status is read, and when it drops it is reopened shortly after and the status
/// read again, so a change after a read is always either reported by the stream or
/// seen by a later read.
pub struct Observer {
    client: Client,
    lock: String,
    poll: Duration,
    stream: Stream,
    /// The stream's connection and its last event's id (kept across reconnects).
    watch: Option<Watch>,
    /// What `changed` returned last (`None`: nothing yet).
    seen: Option<Option<LeaderInfo>>,
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("lock", &self.lock)
            .field("poll", &self.poll)
            .field("streaming", &self.is_streaming())
            .field("seen", &self.seen)
            .finish()
    }
}

impl Observer {
    /// The leadership now, at the first call; after that, waits until it differs from
    /// what was returned last (another leader, a new epoch, a new value, or nobody) and
    /// returns it. Transport and server errors of the status reads are returned, not
    /// retried: the observer can be called again. The events stream's failures are not
    /// errors: the observer polls until the stream is back.
    ///
    /// Cancel-safe: dropping the future loses no change (the next call still returns
    /// the first leadership different from the last one returned).
    pub async fn changed(&mut self) -> Result<Option<LeaderInfo>, Error> {
        loop {
            self.open_stream().await?;
            let status = self.client.lock_status(&self.lock).await?;
            let now = LeaderInfo::from_status(status);
            if self.seen.as_ref() != Some(&now) {
                self.seen = Some(now.clone());
                return Ok(now);
            }
            self.wait().await;
        }
    }

    /// Whether the events stream is open now (changes of holder then come without
    /// waiting for a poll); `false` while the observer only polls.
    pub fn is_streaming(&self) -> bool {
        self.watch.as_ref().is_some_and(Watch::is_connected)
    }

    /// Opens the events stream if it is due, before the status is read.
    async fn open_stream(&mut self) -> Result<(), Error> {
        match self.stream {
            Stream::Off => return Ok(()),
            Stream::RetryAt(at) if Instant::now() < at => return Ok(()),
            Stream::Wanted | Stream::RetryAt(_) => {}
        }
        if self.is_streaming() {
            return Ok(());
        }
        let watch = match self.watch.as_mut() {
            Some(watch) => watch,
            None => self
                .watch
                .insert(Watch::new(&self.client, &self.lock, None)?),
        };
        self.stream = match watch.connect().await {
            Ok(()) => Stream::Wanted,
            Err(e) if worth_retrying(&e) => Stream::RetryAt(Instant::now() + STREAM_RETRY),
            Err(_) => {
                self.watch = None;
                Stream::Off
            }
        };
        Ok(())
    }

    /// Waits for a reason to look again: a lease event or a `reset` on the stream, one
    /// poll interval, or the time to reopen the stream (after it ended or was refused).
    async fn wait(&mut self) {
        let mut until = Instant::now() + self.poll;
        if let Stream::RetryAt(at) = self.stream {
            until = until.min(at);
        }
        let watch = match self.watch.as_mut() {
            Some(watch) if watch.is_connected() => watch,
            _ => return tokio::time::sleep_until(until).await,
        };
        let ended = tokio::select! {
            () = tokio::time::sleep_until(until) => false,
            ended = lease_change(watch) => ended,
        };
        if ended {
            // Reopened after a short pause (a server that accepts and closes at once is
            // not asked again and again); the look after the reopening covers the gap.
            self.stream = Stream::RetryAt(Instant::now() + STREAM_REOPEN);
        }
    }
}

/// Returns at the stream's next grant, release, expiry or `reset` (`false`), or when the
/// connection ends (`true`). Cancel-safe, as [`Watch::next_on_connection`] is.
async fn lease_change(watch: &mut Watch) -> bool {
    loop {
        match watch.next_on_connection().await {
            // The namespace's marks and refusals say nothing about who leads.
            Some(Ok(
                LockEvent::Fenced { .. }
                | LockEvent::Rejected { .. }
                | LockEvent::GateRefused { .. },
            )) => continue,
            Some(Ok(_)) => return false,
            Some(Err(_)) | None => return true,
        }
    }
}
