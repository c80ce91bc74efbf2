//! The Rust client against a real server: the lease guard renews itself, reports loss,
//! and rejections come back as typed errors.

mod common;

use std::time::Duration;

use common::{Server, Signal};
use palisade_client::{AcquireOptions, Client, Error, WriteOptions};

/// A server, a client of it, and the options of a 300 ms lease that does not wait.
fn short_leases() -> (Server, Client, AcquireOptions) {
    let server = Server::start(&[]);
    let client = Client::new(&server.url).unwrap();
    let opts = AcquireOptions {
        ttl: Duration::from_millis(300),
        wait: None,
        ..AcquireOptions::default()
    };
    (server, client, opts)
}

#[tokio::test]
async fn guard_renews_in_background_and_errors_are_typed() {
    let (_server, client, opts) = short_leases();
    let a = client.acquire("jobs", "a", opts.clone()).await.unwrap();
    assert_eq!(a.epoch(), 1);
    // Several TTLs later the background keepalive has kept the lease.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!a.is_lost());
    match client.acquire("jobs", "b", opts.clone()).await {
        Err(Error::LockHeld { holder, .. }) => assert_eq!(holder.as_deref(), Some("a")),
        other => panic!("expected LockHeld, got {:?}", other.map(|g| g.epoch())),
    }
    let wrote = a.kv().put("k", "from a").await.unwrap();
    assert_eq!(wrote.epoch, 1);
    assert_eq!(a.fence().await.unwrap(), 1);

    // A blocking acquire waits in line and gets the lock when `a` releases.
    let waiter = {
        let client = client.clone();
        let opts = AcquireOptions {
            ttl: Duration::from_secs(10),
            wait: Some(Duration::from_secs(5)),
            ..AcquireOptions::default()
        };
        tokio::spawn(async move { client.acquire("jobs", "b", opts).await })
    };
    // Release only once `b` is in line, or it would find the lock free (epoch 2 either
    // way, but the wait path would go untested).
    palisade_test_support::poll_async(Duration::from_secs(20), "b queued", || async {
        let status = client.lock_status("jobs").await.ok()?;
        (status.waiters == 1).then_some(())
    })
    .await;
    let stale_kv = a.kv();
    a.release().await.unwrap();
    let b = waiter.await.unwrap().unwrap();
    assert_eq!(b.epoch(), 2);
    b.kv().put("k", "from b").await.unwrap();

    // The old holder's handle is now fenced out, with a typed error.
    match stale_kv.put("k", "late").await {
        Err(Error::Stale { high_water, epoch }) => assert_eq!((high_water, epoch), (2, 1)),
        other => panic!("expected Stale, got {other:?}"),
    }
    let entry = client.kv("jobs").get("k").await.unwrap().unwrap();
    assert_eq!(&entry.value[..], b"from b");
    assert_eq!(entry.epoch, 2);

    // Conditional write with the wrong revision.
    let opts = WriteOptions {
        if_match: Some(entry.revision + 100),
        ..Default::default()
    };
    assert!(matches!(
        b.kv().put_with("k", "x", &opts).await,
        Err(Error::RevisionMismatch { current_revision: Some(r) }) if r == entry.revision
    ));
    b.release().await.unwrap();
}

#[tokio::test]
async fn lost_resolves_when_the_server_expires_the_lease() {
    let (server, client, opts) = short_leases();
    let guard = client.acquire("pause", "a", opts).await.unwrap();
    // Freeze the server: no renewal can succeed, so the guard must notice by its deadline.
    server.signal(Signal::SIGSTOP);
    let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost()).await;
    server.signal(Signal::SIGCONT);
    assert!(lost.is_ok(), "guard did not report the lost lease");
    assert!(guard.is_lost());
}
