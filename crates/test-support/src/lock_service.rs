//! One behavioural suite for every [`LockService`]: what a caller of the issuer may count
//! on, whichever backend decides.
//!
//! Each issuer runs the whole suite from one line, [`crate::lock_service_suite!`], with a
//! function that starts a fresh issuer over empty state (the embedded issuer in
//! `crates/issuer/tests/lock_service_suite.rs`, the etcd issuer in
//! `crates/etcd/tests/lock_service_suite.rs`). Every case is a test of its own there,
//! named as the function here.
//!
//! What a case asserts is the trait's contract: epochs start at 1 and grow by one per
//! grant, never reused; one holder at a time; a lease ends by release or expiry and is
//! then `Expired` to its holder; the waiting line is first come, first served; a lease
//! the caller may not act on is refused and left as it was. How a TTL is rounded (etcd:
//! whole seconds) and what survives a restart are each backend's own tests.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_issuer::{Acquire, AcquireError, Granted, LeaseError, LockService};
use palisade_storage::Page;

/// An issuer a case works on, with what keeps it alive.
pub struct Started {
    /// Issuers deciding over the same state: one for the embedded issuer, or several
    /// where the backend has several (etcd: one per node). Cases spread concurrent callers
    /// over them; none may be empty.
    pub nodes: Vec<Arc<dyn LockService>>,
    /// Dropped at the end of the case (a temp dir, an etcd member).
    pub guard: Box<dyn std::any::Any + Send>,
}

impl Started {
    fn issuer(&self) -> Arc<dyn LockService> {
        Arc::clone(&self.nodes[0])
    }

    fn node(&self, i: usize) -> Arc<dyn LockService> {
        Arc::clone(&self.nodes[i % self.nodes.len()])
    }
}

/// What a backend gives the suite: an `async fn() -> Started` that starts a fresh issuer.
pub trait Start: Fn() -> Self::Starting {
    type Starting: Future<Output = Started>;
}

impl<F, Fut> Start for F
where
    F: Fn() -> Fut,
    Fut: Future<Output = Started>,
{
    type Starting = Fut;
}

/// An acquisition of `lock` by `holder`, with a lease id of its own.
pub fn request(lock: &str, holder: &str, ttl_ms: u64, wait_ms: u64) -> Acquire {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    Acquire {
        lock: lock.to_owned(),
        holder: holder.to_owned(),
        ttl_ms,
        wait_ms,
        lease_id: format!("{holder}-{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        ..Acquire::default()
    }
}

/// Acquires without waiting, retrying while the lock is held, for up to `within`.
async fn acquire_when_free(
    issuer: &dyn LockService,
    req: impl Fn() -> Acquire,
    within: Duration,
) -> Granted {
    let deadline = Instant::now() + within;
    loop {
        match issuer.acquire(req()).await {
            Ok(granted) => return granted,
            Err(AcquireError::Held { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the lock never became free: {e:?}"),
        }
    }
}

/// A grant, a refusal naming the holder, a keepalive, then expiry without keepalives:
/// the lock is free at the next epoch and the old lease is `Expired` to its holder; a
/// release ends a lease once (again: `Expired`); status and the listing show the newest
/// epoch; a lock never taken is at epoch 0.
pub async fn grant_refuse_keepalive_release_and_expiry(start: impl Start) {
    let started = start().await;
    let issuer = started.issuer();
    let a = issuer.acquire(request("l", "a", 1000, 0)).await.unwrap();
    assert_eq!(a.lease.epoch, 1);
    assert!(!a.token.is_empty());
    match issuer.acquire(request("l", "b", 5000, 0)).await {
        Err(AcquireError::Held { holder, .. }) => assert_eq!(holder.as_deref(), Some("a")),
        other => panic!("expected held, got {other:?}"),
    }
    let status = issuer.status("l").await.unwrap();
    assert_eq!(
        (status.epoch, status.lease.map(|l| l.holder)),
        (1, Some("a".to_owned()))
    );
    let kept = issuer.keepalive(&a.lease.lease_id, None).await.unwrap();
    assert_eq!(kept.epoch, 1);

    let b = acquire_when_free(
        issuer.as_ref(),
        || request("l", "b", 5000, 0),
        Duration::from_secs(15),
    )
    .await;
    assert_eq!(b.lease.epoch, 2);
    assert_eq!(
        issuer.keepalive(&a.lease.lease_id, None).await.unwrap_err(),
        LeaseError::Expired
    );
    assert_eq!(
        issuer.release(&a.lease.lease_id, None).await.unwrap_err(),
        LeaseError::Expired
    );
    issuer.release(&b.lease.lease_id, None).await.unwrap();
    assert_eq!(
        issuer.release(&b.lease.lease_id, None).await.unwrap_err(),
        LeaseError::Expired
    );
    let c = issuer.acquire(request("l", "c", 5000, 0)).await.unwrap();
    assert_eq!(c.lease.epoch, 3);
    let listed = issuer.list(Page::first("", 10)).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].lock.as_str(), listed[0].epoch), ("l", 3));
    assert_eq!(issuer.status("never").await.unwrap().epoch, 0);
}

/// A keepalive, release or value change by a caller who may not act on the lease is
/// refused as `NotYours` (naming the lease's lock and holder) and changes nothing; the
/// owner's go through.
pub async fn a_lease_the_caller_may_not_act_on_is_refused_and_left_as_it_was(start: impl Start) {
    let started = start().await;
    let issuer = started.issuer();
    let a = issuer.acquire(request("l", "a", 5000, 0)).await.unwrap();
    let id = &a.lease.lease_id;
    let others = |_: &str, holder: &str| holder != "a";
    let owner = |lock: &str, holder: &str| lock == "l" && holder == "a";
    let not_yours =
        |e: LeaseError| matches!(e, LeaseError::NotYours(l) if l.holder == "a" && l.lock == "l");

    assert!(not_yours(
        issuer.keepalive(id, Some(&others)).await.unwrap_err()
    ));
    assert!(not_yours(
        issuer.release(id, Some(&others)).await.unwrap_err()
    ));
    let value = Some(b"v".to_vec());
    assert!(not_yours(
        issuer
            .proclaim(id, value.clone(), Some(&others))
            .await
            .unwrap_err()
    ));
    let lease = issuer.status("l").await.unwrap().lease.expect("still held");
    assert_eq!((lease.holder.as_str(), lease.value), ("a", None));

    issuer
        .proclaim(id, value.clone(), Some(&owner))
        .await
        .unwrap();
    issuer.keepalive(id, Some(&owner)).await.unwrap();
    assert_eq!(
        issuer.status("l").await.unwrap().lease.unwrap().value,
        value
    );
    issuer.release(id, Some(&owner)).await.unwrap();
    assert!(issuer.status("l").await.unwrap().lease.is_none());
}

/// 12 tasks over the issuer's nodes, each taking the same lock 4 times (half without
/// waiting, half waiting in line). A flag catches two holders at once; epochs are unique
/// and, in grant order, increasing, and the last is the number of grants.
pub async fn racing_acquisitions_never_overlap_and_never_reuse_an_epoch(start: impl Start) {
    let started = start().await;
    let inside = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for task in 0..12usize {
        let issuer = started.node(task);
        let (inside, granted) = (inside.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            let mut got = 0;
            let give_up = Instant::now() + Duration::from_secs(60);
            while got < 4 && Instant::now() < give_up {
                let wait_ms = if task % 2 == 0 { 0 } else { 20_000 };
                let lease = match issuer
                    .acquire(request("hot", &format!("t{task}"), 10_000, wait_ms))
                    .await
                {
                    Ok(lease) => lease,
                    Err(AcquireError::Held { .. }) => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    Err(e) => panic!("acquire failed: {e:?}"),
                };
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                granted.lock().unwrap().push(lease.lease.epoch);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                issuer.release(&lease.lease.lease_id, None).await.unwrap();
                got += 1;
            }
            got
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), 4, "a task starved");
    }
    let epochs = granted.lock().unwrap().clone();
    assert_eq!(epochs.len(), 48);
    assert!(
        epochs.windows(2).all(|w| w[0] < w[1]),
        "epochs not increasing in grant order: {epochs:?}"
    );
    assert_eq!(started.issuer().status("hot").await.unwrap().epoch, 48);
}

/// A waiter that gives up is refused (`Held`, naming the holder) and leaves nothing in
/// line; waiters are granted in arrival order, and a caller arriving without waiting may
/// not jump the line.
pub async fn the_line_is_first_come_first_served_and_cleans_up_after_a_timeout(start: impl Start) {
    let started = start().await;
    let issuer = started.issuer();
    let holder = issuer
        .acquire(request("q", "holder", 10_000, 0))
        .await
        .unwrap();
    let began = Instant::now();
    match issuer.acquire(request("q", "impatient", 10_000, 300)).await {
        Err(AcquireError::Held { holder, .. }) => assert_eq!(holder.as_deref(), Some("holder")),
        other => panic!("expected held, got {other:?}"),
    }
    // The refusal came after the wait, not at once. The issuer keeps time in whole
    // milliseconds, so its 300 ms can end up to 1 ms short by this clock; no upper bound:
    // how long a loaded machine takes to answer is not what this checks.
    assert!(
        began.elapsed() >= Duration::from_millis(299),
        "refused after {:?}, before its wait_ms of 300",
        began.elapsed()
    );
    crate::poll_async(Duration::from_secs(5), "the timed-out waiter left", || {
        let issuer = issuer.clone();
        async move { (issuer.status("q").await.ok()?.waiters == 0).then_some(()) }
    })
    .await;

    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (queued, name) in ["first", "second", "third"].into_iter().enumerate() {
        let (waiter, order) = (issuer.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lease = waiter
                .acquire(request("q", name, 10_000, 20_000))
                .await
                .unwrap();
            order.lock().unwrap().push((name, lease.lease.epoch));
            tokio::time::sleep(Duration::from_millis(20)).await;
            waiter.release(&lease.lease.lease_id, None).await.unwrap();
        }));
        // The next waiter starts only once this one is in line: arrival order is then
        // the order of the line, whatever the machine's load.
        crate::poll_async(Duration::from_secs(20), name, || {
            let issuer = issuer.clone();
            async move {
                let waiters = issuer.status("q").await.ok()?.waiters;
                (waiters == queued + 1).then_some(())
            }
        })
        .await;
    }
    assert!(matches!(
        issuer.acquire(request("q", "jumper", 10_000, 0)).await,
        Err(AcquireError::Held { .. })
    ));
    issuer.release(&holder.lease.lease_id, None).await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, [("first", 2), ("second", 3), ("third", 4)]);
}

/// An issuer either counts leases against their owner's quota or refuses an acquisition
/// that names an owner: never takes the owner and ignores it. Counting: with room for one
/// lease, a second on another lock is refused with `QuotaExceeded` and takes nothing, and
/// once the first is released there is room again.
pub async fn an_owner_is_counted_or_refused_never_ignored(start: impl Start) {
    let started = start().await;
    let issuer = started.issuer();
    let owned = |lock: &str| Acquire {
        owner: Some(palisade_issuer::Owner {
            name: "alice".into(),
            max_leases: 1,
            max_waiters: 1,
        }),
        ..request(lock, "alice", 10_000, 0)
    };
    if !issuer.counts_owners() {
        assert!(matches!(
            issuer.acquire(owned("a")).await,
            Err(AcquireError::Unsupported { .. })
        ));
        assert_eq!(issuer.status("a").await.unwrap().epoch, 0, "nothing taken");
        return;
    }
    let first = issuer.acquire(owned("a")).await.unwrap();
    assert!(matches!(
        issuer.acquire(owned("b")).await,
        Err(AcquireError::QuotaExceeded { limit: 1, .. })
    ));
    assert_eq!(issuer.status("b").await.unwrap().epoch, 0, "nothing taken");
    issuer.release(&first.lease.lease_id, None).await.unwrap();
    issuer.acquire(owned("b")).await.unwrap();
}

/// Runs every case of the suite as a test of its own, each on an issuer started by
/// `$start` (an `async fn() -> Started`).
#[macro_export]
macro_rules! lock_service_suite {
    ($start:path) => {
        $crate::suite_cases!(lock_service, $start;
            grant_refuse_keepalive_release_and_expiry,
            a_lease_the_caller_may_not_act_on_is_refused_and_left_as_it_was,
            racing_acquisitions_never_overlap_and_never_reuse_an_epoch,
            the_line_is_first_come_first_served_and_cleans_up_after_a_timeout,
            an_owner_is_counted_or_refused_never_ignored,
        );
    };
}
