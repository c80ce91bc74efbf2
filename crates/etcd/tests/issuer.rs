//! The lock service against a real etcd: expiry, keepalive and release; acquisitions
//! racing from many tasks on two "nodes" (two clients); the waiting line.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_core::lock_table::AcquireRequest;
use palisade_etcd::EtcdIssuer;
use palisade_issuer::{AcquireError, LeaseError, LockService};
use palisade_token::Signer;
use support::EtcdMember;

fn request(lock: &str, holder: &str, ttl_ms: u64, wait_ms: u64) -> AcquireRequest {
    AcquireRequest {
        lock: lock.to_owned(),
        holder: holder.to_owned(),
        ttl_ms,
        wait_ms,
        lease_id: format!("{holder}-{}", support::rand_suffix()),
        ..AcquireRequest::default()
    }
}

#[tokio::test]
async fn a_lease_the_caller_may_not_act_on_is_refused_and_left_as_it_was() {
    let etcd = EtcdMember::start();
    let issuer = EtcdIssuer::new(etcd.connect().await, Signer::generate());
    let a = issuer.acquire(request("l", "a", 5000, 0)).await.unwrap();
    let id = &a.grant.lease_id;
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
    let status = issuer.status("l").await.unwrap();
    let lease = status.lease.expect("still held");
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

#[tokio::test]
async fn grant_refuse_keepalive_release_and_expiry() {
    let etcd = EtcdMember::start();
    let issuer = EtcdIssuer::new(etcd.connect().await, Signer::generate());
    let a = issuer.acquire(request("l", "a", 1, 0)).await.unwrap();
    assert_eq!(a.grant.epoch, 1);
    // 1 ms rounds up to a whole second (the test cluster's minimum TTL is 1 s).
    assert_eq!(a.grant.ttl_ms % 1000, 0);
    assert!(a.grant.ttl_ms >= 1000);
    match issuer.acquire(request("l", "b", 5000, 0)).await {
        Err(AcquireError::Held { holder, .. }) => assert_eq!(holder.as_deref(), Some("a")),
        other => panic!("expected held, got {other:?}"),
    }
    let status = issuer.status("l").await.unwrap();
    assert_eq!(
        (status.epoch, status.lease.map(|l| l.holder)),
        (1, Some("a".to_owned()))
    );
    let kept = issuer.keepalive(&a.grant.lease_id, None).await.unwrap();
    assert_eq!(kept.epoch, 1);

    // Without keepalives etcd expires the lease; then the lock is free at epoch 2.
    let deadline = Instant::now() + Duration::from_secs(10);
    let b = loop {
        match issuer.acquire(request("l", "b", 5000, 0)).await {
            Ok(b) => break b,
            Err(AcquireError::Held { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("lease never expired: {e:?}"),
        }
    };
    assert_eq!(b.grant.epoch, 2);
    assert_eq!(
        issuer.keepalive(&a.grant.lease_id, None).await.unwrap_err(),
        LeaseError::Expired
    );
    assert_eq!(
        issuer.release(&a.grant.lease_id, None).await.unwrap_err(),
        LeaseError::Expired
    );
    issuer.release(&b.grant.lease_id, None).await.unwrap();
    assert_eq!(
        issuer.release(&b.grant.lease_id, None).await.unwrap_err(),
        LeaseError::Expired
    );
    let c = issuer.acquire(request("l", "c", 5000, 0)).await.unwrap();
    assert_eq!(c.grant.epoch, 3);
    let listed = issuer.list("", None, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].lock.as_str(), listed[0].epoch), ("l", 3));
    assert_eq!(issuer.status("never").await.unwrap().epoch, 0);
}

/// 12 tasks on two clients, each acquiring the same lock 4 times (half without waiting,
/// half waiting in line). An in-process flag catches two holders at once; epochs must be
/// unique and, in grant order, increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_acquisitions_never_overlap_and_never_reuse_an_epoch() {
    let etcd = EtcdMember::start();
    let prefix = format!("/acq{}/", support::rand_suffix());
    let nodes = [
        Arc::new(EtcdIssuer::new(
            etcd.connect_prefix(&prefix).await,
            Signer::generate(),
        )),
        Arc::new(EtcdIssuer::new(
            etcd.connect_prefix(&prefix).await,
            Signer::generate(),
        )),
    ];
    let inside = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for task in 0..12usize {
        let issuer = nodes[task % 2].clone();
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
                granted.lock().unwrap().push(lease.grant.epoch);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                issuer.release(&lease.grant.lease_id, None).await.unwrap();
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
    assert_eq!(nodes[0].status("hot").await.unwrap().epoch, 48);
}

#[tokio::test]
async fn the_line_is_first_come_first_served_and_cleans_up_after_a_timeout() {
    let etcd = EtcdMember::start();
    let issuer = Arc::new(EtcdIssuer::new(etcd.connect().await, Signer::generate()));
    let holder = issuer
        .acquire(request("q", "holder", 10_000, 0))
        .await
        .unwrap();
    // A waiter that gives up leaves no key behind.
    let started = Instant::now();
    match issuer.acquire(request("q", "impatient", 10_000, 300)).await {
        Err(AcquireError::Held { holder, .. }) => assert_eq!(holder.as_deref(), Some("holder")),
        other => panic!("expected held, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    let mut waiters = usize::MAX;
    for _ in 0..50 {
        waiters = issuer.status("q").await.unwrap().waiters;
        if waiters == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(waiters, 0, "a timed-out waiter's key stayed");

    // Three waiters queue in order; each gets the lock in turn, in arrival order.
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (queued, name) in ["first", "second", "third"].into_iter().enumerate() {
        let (waiter, order) = (issuer.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lease = waiter
                .acquire(request("q", name, 10_000, 20_000))
                .await
                .unwrap();
            order.lock().unwrap().push((name, lease.grant.epoch));
            tokio::time::sleep(Duration::from_millis(20)).await;
            waiter.release(&lease.grant.lease_id, None).await.unwrap();
        }));
        // The next waiter starts only once this one is in line: arrival order is then
        // the order of the line, whatever the machine's load.
        palisade_test_support::poll_async(Duration::from_secs(20), name, || {
            let issuer = issuer.clone();
            async move {
                let waiters = issuer.status("q").await.ok()?.waiters;
                (waiters == queued + 1).then_some(())
            }
        })
        .await;
    }
    assert_eq!(issuer.status("q").await.unwrap().waiters, 3);
    // Someone arriving now without waiting may not jump the line.
    assert!(issuer
        .acquire(request("q", "jumper", 10_000, 0))
        .await
        .is_err());
    issuer.release(&holder.grant.lease_id, None).await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, [("first", 2), ("second", 3), ("third", 4)]);
}
