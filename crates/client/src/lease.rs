//! [`LeaseGuard`]: a held lease plus the background task that keeps it alive.
//!
//! One task owns the renewal schedule and is the only writer of the lease's local state
//! (its deadline and whether it is lost); the guard and its callers only read that state
//! through a `watch` channel, so nothing is locked across an `.await`.
//!
//! The local deadline is `time the successful request was sent + ttl`. Counting from the
//! send, not the answer, means the client believes in its lease for *less* time than the
//! server grants it, never more (clock rates aside). It is still only an estimate: a
//! process can pause right after checking [`LeaseGuard::is_lost`], which is why writes
//! carry the token and the resource, not this flag, decides.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout_at, Instant};

use crate::{Client, Error, KeepaliveInfo, Lease};

/// What the renewal task publishes about the lease (or session).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseState {
    /// No successful renewal means the lease may be gone from this instant on.
    pub(crate) deadline: Instant,
    /// The server said `lease_expired`, or the deadline passed without a renewal.
    pub(crate) lost: bool,
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

/// Whether `state` says lost (by the server's word or the local deadline).
pub(crate) fn is_lost(state: &watch::Receiver<LeaseState>) -> bool {
    let state = *state.borrow();
    state.lost || Instant::now() >= state.deadline
}

/// Resolves once `state` says lost: see [`LeaseGuard::lost`].
pub(crate) async fn lost(state: &watch::Receiver<LeaseState>) {
    let mut state = state.clone();
    loop {
        let current = *state.borrow_and_update();
        if current.lost || Instant::now() >= current.deadline {
            return;
        }
        tokio::select! {
            // The deadline is checked here too, so a stalled renewal task cannot
            // delay the verdict.
            () = sleep_until(current.deadline) => {}
            changed = state.changed() => {
                if changed.is_err() {
                    // The renewal task is gone without publishing: nothing renews.
                    return;
                }
            }
        }
    }
}

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
    state: watch::Receiver<LeaseState>,
    task: JoinHandle<()>,
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
        let (tx, state) = watch::channel(LeaseState {
            deadline: sent_at + ttl,
            lost: false,
        });
        let task = tokio::spawn(renew(keepalive, ttl, sent_at, tx));
        LeaseGuard {
            client,
            lease,
            state,
            task,
        }
    }

    lease_methods!();

    /// True once the lease is known or presumed lost. `false` is not a promise: the
    /// lease can be lost the moment after this returns.
    pub fn is_lost(&self) -> bool {
        is_lost(&self.state)
    }

    /// Resolves when the lease is lost: the server answered `lease_expired`, or no
    /// renewal succeeded before the local deadline (last success + ttl).
    ///
    /// Use it to stop work promptly (e.g. in `tokio::select!`); it is cancel-safe.
    pub async fn lost(&self) {
        lost(&self.state).await
    }

    /// Stops the renewals and releases the lease so the next waiter gets the lock.
    /// [`Error::LeaseExpired`] if it had already run out.
    pub async fn release(self) -> Result<(), Error> {
        self.task.abort();
        self.client.release(&self.lease.lease_id).await
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        // Stop renewing; the lease expires on its own after its TTL.
        self.task.abort();
    }
}

/// The renewal schedule. Renews every `ttl / 3` after the last success, retries failed
/// renewals quickly until the deadline, and gives up for good on `lease_expired` or when
/// the deadline passes. It never re-acquires: a new lease would be a new epoch, and
/// silently switching epochs under a holder is exactly what fencing exists to expose.
pub(crate) async fn renew<F, Fut, R>(
    mut keepalive: F,
    ttl: Duration,
    sent_at: Instant,
    tx: watch::Sender<LeaseState>,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<R, Error>>,
    R: Renewed,
{
    let period = ttl / 3;
    let retry = (ttl / 10).max(Duration::from_millis(10));
    let mut deadline = sent_at + ttl;
    let mut next = sent_at + period;
    loop {
        sleep_until(next.min(deadline)).await;
        let sent = Instant::now();
        if sent >= deadline {
            break;
        }
        match timeout_at(deadline, keepalive()).await {
            Ok(Ok(info)) => {
                deadline = sent + Duration::from_millis(info.ttl_ms()).min(ttl);
                next = sent + period;
                tx.send_modify(|s| s.deadline = deadline);
            }
            Ok(Err(Error::LeaseExpired | Error::SessionExpired)) | Err(_) => break,
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

    #[tokio::test(start_paused = true)]
    async fn lease_expired_is_lost_at_once() {
        let g = guard(|| async { Err(Error::LeaseExpired) });
        let start = Instant::now();
        g.lost().await;
        assert!(g.is_lost());
        assert_eq!(start.elapsed(), Duration::from_millis(TTL_MS / 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_renewal_is_lost_at_the_deadline() {
        let g = guard(std::future::pending);
        let start = Instant::now();
        g.lost().await;
        assert_eq!(start.elapsed(), Duration::from_millis(TTL_MS));
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
    async fn persistent_failures_lose_the_lease_at_the_deadline() {
        let g = guard(|| async { Err(Error::StorageFailed) });
        let start = Instant::now();
        g.lost().await;
        assert_eq!(start.elapsed(), Duration::from_millis(TTL_MS));
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
