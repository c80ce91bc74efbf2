//! [`LeaseGuard`]: a held lease plus the background task that keeps it alive.
//!
//! One task owns the renewal schedule and is the only writer of the lease's local state
//! (its deadlines and whether it is lost); the guard and its callers only read that state
//! through a `watch` channel, so nothing is locked across an `.await`. The same schedule
//! ([`Renewing`]) keeps a [`crate::SessionGuard`] alive.
//!
//! The deadlines count from the *send* of the last renewal the server confirmed, not its
//! answer, so the client believes in its lease for less time than the server grants it,
//! never more (within the clock drift [`Deadlines`] allows for). They are still only
//! estimates: a process can pause right after checking [`LeaseGuard::safe_for`], which is
//! why writes carry the token and the resource, not this flag, decides.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout_at, Instant};

use crate::{Client, Deadlines, Error, KeepaliveInfo, Lease};

/// What the renewal task publishes about the lease (or session).
#[derive(Debug, Clone, Copy)]
struct LeaseState {
    /// The renewal deadline: no successful renewal by then, and the client gives up.
    renew_by: Instant,
    /// Until when the holder may act (see [`Deadlines`]).
    safe_until: Instant,
    /// The server said `lease_expired`, or the renewal deadline passed.
    lost: bool,
}

impl LeaseState {
    /// The state after a request sent at `sent` was confirmed with `ttl`.
    fn confirmed(sent: Instant, ttl: Duration, deadlines: Deadlines) -> LeaseState {
        LeaseState {
            renew_by: sent + deadlines.renew_span(ttl),
            safe_until: sent + deadlines.safe_span(ttl),
            lost: false,
        }
    }

    /// Lost by the server's word, or given up: the renewal deadline has passed.
    fn is_lost(&self) -> bool {
        self.lost || Instant::now() >= self.renew_by
    }
}

/// A successful renewal's answer: how long from its handling the lease now runs.
pub(crate) trait Renewed {
    fn ttl_ms(&self) -> u64;
}

impl Renewed for KeepaliveInfo {
    fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }
}

impl Renewed for crate::SessionInfo {
    fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }
}

/// A lease's (or session's) renewal task and what it publishes: the one owner of its
/// deadlines. Dropping it stops the renewals.
#[derive(Debug)]
pub(crate) struct Renewing {
    state: watch::Receiver<LeaseState>,
    task: JoinHandle<()>,
}

impl Renewing {
    /// Starts renewing, with `keepalive`, something granted `ttl` by a request sent at
    /// `sent_at`.
    pub(crate) fn start<F, Fut, R>(
        keepalive: F,
        ttl: Duration,
        deadlines: Deadlines,
        sent_at: Instant,
    ) -> Renewing
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<R, Error>> + Send + 'static,
        R: Renewed + 'static,
    {
        let (tx, state) = watch::channel(LeaseState::confirmed(sent_at, ttl, deadlines));
        let task = tokio::spawn(renew(keepalive, ttl, sent_at, deadlines, tx));
        Renewing { state, task }
    }

    /// Stops the renewals.
    pub(crate) fn stop(&self) {
        self.task.abort();
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.state.borrow().is_lost()
    }

    pub(crate) async fn lost(&self) {
        let mut state = self.state.clone();
        loop {
            let current = *state.borrow_and_update();
            if current.is_lost() {
                return;
            }
            tokio::select! {
                // The deadline is checked here too, so a stalled renewal task cannot
                // delay the verdict.
                () = sleep_until(current.renew_by) => {}
                changed = state.changed() => {
                    if changed.is_err() {
                        // The renewal task is gone without publishing: nothing renews.
                        return;
                    }
                }
            }
        }
    }

    pub(crate) fn safe_until(&self) -> Instant {
        self.state.borrow().safe_until
    }

    pub(crate) fn renew_deadline(&self) -> Instant {
        self.state.borrow().renew_by
    }
}

impl Drop for Renewing {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The methods about a renewed holder's time (a [`LeaseGuard`], a
/// [`crate::SessionGuard`]), written once: expanded inside the `impl` of a type with the
/// field `renewing: Renewing`.
macro_rules! renewal_methods {
    () => {
        /// True once it is known or presumed lost: the server said it expired, or no
        /// renewal succeeded before the renewal deadline and the client gave it up. `false`
        /// is not a promise: it can be lost the moment after this returns.
        pub fn is_lost(&self) -> bool {
            self.renewing.is_lost()
        }

        /// Resolves when it is lost (see `is_lost`). Use it to stop work promptly (e.g. in
        /// `tokio::select!`); it is cancel-safe.
        pub async fn lost(&self) {
            self.renewing.lost().await
        }

        /// Until when the holder may act: the send time of the last renewal the server
        /// confirmed plus the TTL less the clock-drift margin ([`crate::Deadlines`]). In the
        /// past once the server said it expired. After the client gave up at the renewal
        /// deadline it still says how long what is already running may go on.
        pub fn safe_until(&self) -> tokio::time::Instant {
            self.renewing.safe_until()
        }

        /// How long from now the holder may still act: zero once `safe_until` has passed.
        pub fn safe_for(&self) -> std::time::Duration {
            self.renewing
                .safe_until()
                .saturating_duration_since(tokio::time::Instant::now())
        }

        /// When the client gives up unless a renewal succeeds first: the last confirmed
        /// renewal's send plus the renewal-deadline fraction of the TTL
        /// ([`crate::Deadlines`]).
        pub fn renew_deadline(&self) -> tokio::time::Instant {
            self.renewing.renew_deadline()
        }
    };
}
pub(crate) use renewal_methods;

/// A lease held by this process, renewed in the background every `ttl / 3`.
///
/// Dropping the guard stops the renewals but does **not** release the lock: the lease
/// then runs out after its TTL and the lock becomes free (possibly after the server's
/// lock-delay). Use [`LeaseGuard::release`] to hand the lock on at once.
///
/// The guard notices loss; it cannot prevent it. After a pause longer than the TTL the
/// lock may already belong to someone else and writes with [`LeaseGuard::kv`] will be
/// refused with [`Error::Stale`], which is the point of fencing.
#[derive(Debug)]
pub struct LeaseGuard {
    client: Client,
    lease: Lease,
    renewing: Renewing,
}

/// The methods of every holder of one lease (a [`LeaseGuard`], a [`crate::SessionLock`]),
/// written once: expanded inside the `impl` of a type with the fields `client: Client` and
/// `lease: Lease`.
macro_rules! lease_methods {
    () => {
        /// The lease as granted.
        pub fn lease(&self) -> &$crate::Lease {
            &self.lease
        }

        /// This holder's ownership generation.
        pub fn epoch(&self) -> u64 {
            self.lease.epoch
        }

        /// The fencing token to attach to mutations of this lock's resources.
        pub fn token(&self) -> &str {
            &self.lease.token
        }

        pub fn lease_id(&self) -> &str {
            &self.lease.lease_id
        }

        pub fn lock(&self) -> &str {
            &self.lease.lock
        }

        /// Replaces the value this lease advertises (`None` clears it); lock status shows
        /// it from now on. Nothing else about the lease changes.
        pub async fn proclaim(
            &self,
            value: Option<&[u8]>,
        ) -> Result<$crate::Proclaimed, $crate::Error> {
            self.client.proclaim(&self.lease.lease_id, value).await
        }

        /// A fenced handle on the namespace guarded by this lock, carrying this token.
        pub fn kv(&self) -> $crate::FencedKv {
            self.client.fenced_kv(&self.lease.lock, &self.lease.token)
        }

        /// Barrier: makes this lock's namespace admit this epoch now, fencing off every
        /// older holder before any data is written (S10). Returns the high-water mark.
        pub async fn fence(&self) -> Result<u64, $crate::Error> {
            self.kv().fence().await
        }
    };
}
pub(crate) use lease_methods;

impl LeaseGuard {
    pub(crate) fn start(client: Client, lease: Lease, sent_at: Instant) -> LeaseGuard {
        let renewer = client.clone();
        let lease_id = lease.lease_id.clone();
        let keepalive = move || {
            let renewer = renewer.clone();
            let lease_id = lease_id.clone();
            async move { renewer.keepalive(&lease_id).await }
        };
        Self::start_with(client, lease, sent_at, keepalive)
    }

    /// Starts the guard with any keepalive call, so the schedule is testable without a
    /// server.
    fn start_with<F, Fut>(
        client: Client,
        lease: Lease,
        sent_at: Instant,
        keepalive: F,
    ) -> LeaseGuard
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<KeepaliveInfo, Error>> + Send + 'static,
    {
        let ttl = Duration::from_millis(lease.ttl_ms);
        let renewing = Renewing::start(keepalive, ttl, client.deadlines, sent_at);
        LeaseGuard {
            client,
            lease,
            renewing,
        }
    }

    lease_methods!();
    renewal_methods!();

    /// Stops the renewals and releases the lease so the next waiter gets the lock.
    /// [`Error::LeaseExpired`] if it had already run out.
    pub async fn release(self) -> Result<(), Error> {
        self.renewing.stop();
        self.client.release(&self.lease.lease_id).await
    }
}

/// The renewal schedule. Renews every `ttl / 3` after the last success, retries failed
/// renewals quickly until the renewal deadline, and gives up for good on `lease_expired`
/// or when that deadline passes. It never re-acquires: a new lease would be a new epoch,
/// and silently switching epochs under a holder is exactly what fencing exists to expose.
async fn renew<F, Fut, R>(
    mut keepalive: F,
    ttl: Duration,
    sent_at: Instant,
    deadlines: Deadlines,
    tx: watch::Sender<LeaseState>,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<R, Error>>,
    R: Renewed,
{
    let period = ttl / 3;
    let retry = (ttl / 10).max(Duration::from_millis(10));
    let mut renew_by = tx.borrow().renew_by;
    let mut next = sent_at + period;
    loop {
        sleep_until(next.min(renew_by)).await;
        let sent = Instant::now();
        if sent >= renew_by {
            break;
        }
        match timeout_at(renew_by, keepalive()).await {
            Ok(Ok(info)) => {
                let granted = Duration::from_millis(info.ttl_ms()).min(ttl);
                let state = LeaseState::confirmed(sent, granted, deadlines);
                renew_by = state.renew_by;
                next = sent + period;
                tx.send_replace(state);
            }
            Ok(Err(Error::LeaseExpired | Error::SessionExpired)) => {
                // The lease is over at the server, since some time before this answer.
                tx.send_modify(|s| {
                    s.lost = true;
                    s.safe_until = s.safe_until.min(sent);
                });
                return;
            }
            Err(_) => break,
            // Transport trouble or a server hiccup: the lease may still be alive.
            Ok(Err(_)) => next = Instant::now() + retry,
        }
    }
    tx.send_modify(|s| s.lost = true);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;

    const TTL_MS: u64 = 900;

    fn lease() -> Lease {
        Lease {
            lock: "l".into(),
            holder: "h".into(),
            epoch: 1,
            token: "t".into(),
            lease_id: "id".into(),
            ttl_ms: TTL_MS,
            value: None,
            lock_delay_ms: 0,
            session: None,
        }
    }

    fn info() -> KeepaliveInfo {
        KeepaliveInfo {
            lease_id: "id".into(),
            lock: "l".into(),
            epoch: 1,
            ttl_ms: TTL_MS,
        }
    }

    fn guard<F, Fut>(keepalive: F) -> LeaseGuard
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<KeepaliveInfo, Error>> + Send + 'static,
    {
        let client = Client::new("http://127.0.0.1:1").unwrap();
        LeaseGuard::start_with(client, lease(), Instant::now(), keepalive)
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_keep_the_lease_alive() {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let g = guard(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Ok(info()) }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!g.is_lost());
        // About one renewal per ttl/3.
        let n = calls.load(Ordering::SeqCst);
        assert!((190..=201).contains(&n), "{n} renewals");
    }

    /// `d` is `ms` milliseconds, give or take the float rounding of [`Deadlines`].
    fn about(d: Duration, ms: u64) {
        let want = Duration::from_millis(ms);
        let gap = d.max(want) - d.min(want);
        assert!(gap <= Duration::from_micros(1), "{d:?}, not {want:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn lease_expired_is_lost_at_once_and_safe_no_longer() {
        let g = guard(|| async { Err(Error::LeaseExpired) });
        let start = Instant::now();
        about(g.safe_for(), TTL_MS * 99 / 100);
        g.lost().await;
        assert!(g.is_lost());
        assert_eq!(start.elapsed(), Duration::from_millis(TTL_MS / 3));
        // The lease ended at the server some time before that answer.
        assert_eq!(g.safe_for(), Duration::ZERO);
        assert!(g.safe_until() <= start + Duration::from_millis(TTL_MS / 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_renewal_is_given_up_at_the_renewal_deadline() {
        let g = guard(std::future::pending);
        let start = Instant::now();
        about(g.renew_deadline() - start, TTL_MS * 2 / 3);
        g.lost().await;
        about(start.elapsed(), TTL_MS * 2 / 3);
        assert!(g.is_lost());
        // What still runs has until the safe deadline: the TTL less 1 % for drift.
        about(g.safe_until() - start, TTL_MS * 99 / 100);
        about(g.safe_for(), TTL_MS * 99 / 100 - TTL_MS * 2 / 3);
    }

    #[tokio::test(start_paused = true)]
    async fn each_confirmed_renewal_moves_both_deadlines_from_its_send() {
        let g = guard(|| async {
            // The answer comes 50 ms after the send: the deadlines count from the send.
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(info())
        });
        let start = Instant::now();
        tokio::time::sleep(Duration::from_millis(TTL_MS / 3 + 60)).await;
        let sent = start + Duration::from_millis(TTL_MS / 3);
        about(g.renew_deadline() - sent, TTL_MS * 2 / 3);
        about(g.safe_until() - sent, TTL_MS * 99 / 100);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadlines_follow_the_clients_settings() {
        let client = Client::builder("http://127.0.0.1:1")
            .deadlines(Deadlines::new(0.5, 0.1).unwrap())
            .build()
            .unwrap();
        let g = LeaseGuard::start_with(client, lease(), Instant::now(), std::future::pending);
        let start = Instant::now();
        about(g.safe_until() - start, TTL_MS * 9 / 10);
        g.lost().await;
        about(start.elapsed(), TTL_MS / 2);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_before_the_deadline() {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let g = guard(move || {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 3 {
                    Err(Error::StorageFailed)
                } else {
                    Ok(info())
                }
            }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!g.is_lost());
    }

    #[tokio::test(start_paused = true)]
    async fn persistent_failures_give_the_lease_up_at_the_renewal_deadline() {
        let g = guard(|| async { Err(Error::StorageFailed) });
        let start = Instant::now();
        g.lost().await;
        about(start.elapsed(), TTL_MS * 2 / 3);
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_guard_stops_renewals() {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let g = guard(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Ok(info()) }
        });
        drop(g);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }
}
