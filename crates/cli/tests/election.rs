//! Leader election and client failover through the Rust client, against the real binary
//! on every topology.
//!
//! - Election: a candidate campaigns and leads with its value; a second waits in line;
//!   an observer sees each leadership (holder, epoch, value) and each change; the leader
//!   proclaims a new value, resigns, and the next one leads with the next epoch; a new
//!   leader fences before it acts, after which the old leader's writes are refused (S10);
//!   a leader that stops renewing loses to the next candidate once its lease expires.
//! - Failover (etcd): a client given all three nodes keeps working while the node it talks
//!   to is SIGKILLed: reads, renewals and fenced writes move to the next node, and every
//!   write is applied exactly once.

mod common;

use std::time::Duration;

use common::topology::Topology;
use palisade_client::{Client, Election, Error, LeaderInfo, Observer};

/// A client of every node of the topology (failing over between them).
#[cfg(feature = "etcd")]
fn client_of(topology: &Topology) -> Client {
    let urls = topology.urls();
    let mut builder = Client::builder(&urls[0]);
    for url in &urls[1..] {
        builder = builder.endpoint(url);
    }
    builder.build().expect("client")
}

/// Calls `check` every 20 ms until it returns Some, for at most `within` (then None).
async fn poll<T, F, Fut>(within: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(found) = check().await {
            return Some(found);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client of node `i` only.
fn client_at(topology: &Topology, i: usize) -> Client {
    Client::new(&topology.url(i)).expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_embedded() {
    election(&Topology::embedded(&[])).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_etcd() {
    election(&Topology::etcd(&[])).await;
}

async fn election(topology: &Topology) {
    let ttl = Duration::from_secs(2);
    let on = |i: usize| {
        Election::new(client_at(topology, i), "primary")
            .ttl(ttl)
            .poll_interval(Duration::from_millis(50))
    };
    let mut observer = on(2).observe();
    assert_eq!(observer.changed().await.unwrap(), None, "nobody leads yet");

    // The first candidate leads with its value; the observer sees it.
    let first = on(0).campaign("node-a", b"10.0.0.1:7700").await.unwrap();
    let seen = observer.changed().await.unwrap();
    assert_eq!(
        seen,
        Some(LeaderInfo {
            holder: "node-a".into(),
            epoch: first.epoch(),
            value: Some(b"10.0.0.1:7700".to_vec()),
        })
    );
    // A new leader fences before it acts (S10).
    assert_eq!(first.fence().await.unwrap(), first.epoch());
    first.kv().put("config", "from-a").await.unwrap();

    // The second candidate waits in line.
    let second_election = on(1);
    let second = tokio::spawn(async move {
        second_election
            .campaign_within("node-b", b"10.0.0.2:7700", Duration::from_secs(60))
            .await
    });
    let waiting = client_at(topology, 0);
    poll(Duration::from_secs(20), || async {
        let status = waiting.lock_status("primary").await.ok()?;
        (status.waiters == 1).then_some(())
    })
    .await
    .expect("the second candidate waits in line");

    // The leader advertises something new: observers see it, the term is the same.
    first.proclaim(b"10.0.0.1:7700 draining").await.unwrap();
    let seen = observer.changed().await.unwrap().unwrap();
    assert_eq!(
        (seen.epoch, seen.value.as_deref()),
        (first.epoch(), Some(&b"10.0.0.1:7700 draining"[..]))
    );

    // It resigns: the next in line leads at once, with the next epoch.
    let old_token = first.token().to_owned();
    let old_epoch = first.epoch();
    first.resign().await.unwrap();
    let second = second.await.unwrap().unwrap();
    assert_eq!(second.epoch(), old_epoch + 1);
    let seen = observer.changed().await.unwrap().unwrap();
    assert_eq!(
        (seen.holder.as_str(), seen.epoch),
        ("node-b", second.epoch())
    );
    assert_eq!(seen.value.as_deref(), Some(&b"10.0.0.2:7700"[..]));
    // Before the new leader fences, a late write of the old one still passes (S10)...
    let late = client_at(topology, 2).fenced_kv("primary", &old_token);
    late.put("config", "late-from-a").await.unwrap();
    // ...after, it is refused, and what the new leader wrote stays.
    second.fence().await.unwrap();
    second.kv().put("config", "from-b").await.unwrap();
    match late.put("config", "later-from-a").await {
        Err(Error::Stale { high_water, epoch }) => {
            assert_eq!((high_water, epoch), (second.epoch(), old_epoch))
        }
        other => panic!("the old leader's write after the fence: {other:?}"),
    }
    let stored = client_at(topology, 1)
        .kv("primary")
        .get("config")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&stored.value[..], b"from-b");

    // A leader that stops renewing (its process froze) loses once its lease expires.
    let frozen_epoch = second.epoch();
    // Dropping the guard stops its renewals and releases nothing.
    drop(second);
    let third = on(2)
        .campaign_within("node-c", b"10.0.0.3:7700", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(third.epoch(), frozen_epoch + 1);
    let seen = observer.changed().await.unwrap().unwrap();
    assert_eq!(
        (seen.holder.as_str(), seen.epoch),
        ("node-c", third.epoch())
    );
    assert!(!third.is_lost());
    third.resign().await.unwrap();
    assert_eq!(
        observer.changed().await.unwrap(),
        None,
        "nobody leads after a resign"
    );
}

/// Kills the node a multi-endpoint client talks to, between and during its calls: every
/// call keeps succeeding through the other nodes, every fenced write is applied exactly
/// once (its idempotency key makes a resend answer the first outcome), and the lease is
/// never lost.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_fails_over_when_its_etcd_node_dies() {
    use palisade_client::AcquireOptions;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let mut topology = Topology::etcd(&[]);
    let client = client_of(&topology);
    assert_eq!(client.base_url(), topology.url(0));
    let lease = client
        .acquire(
            "orders",
            "worker",
            AcquireOptions {
                ttl: Duration::from_secs(4),
                ..AcquireOptions::default()
            },
        )
        .await
        .unwrap();
    lease.fence().await.unwrap();
    let kv = lease.kv();
    let stop = Arc::new(AtomicBool::new(false));
    // Writes keep flowing while node 0 is killed underneath them.
    let writer = {
        let kv = kv.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut written = Vec::new();
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) || i < 40 {
                let key = format!("k{i:03}");
                let result = kv.put(&key, format!("v{i}")).await;
                written.push((key, result.map(|w| w.revision)));
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            written
        })
    };
    poll(Duration::from_secs(10), || async {
        (kv.list("").await.ok()?.len() >= 10).then_some(())
    })
    .await
    .expect("writes flow");
    if let common::topology::Topology::Etcd(t) = &mut topology {
        t.nodes[0].kill();
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();
    for (key, result) in &written {
        assert!(result.is_ok(), "{key}: {result:?}");
    }
    // The client now starts from a live node, and every write is there exactly once:
    // one key each, and one revision each (a write applied twice would have two).
    assert_ne!(client.base_url(), topology.url(0));
    let keys = kv.list("").await.unwrap();
    assert_eq!(keys.len(), written.len());
    let mut revisions: Vec<u64> = written.iter().map(|(_, r)| *r.as_ref().unwrap()).collect();
    revisions.sort();
    revisions.dedup();
    assert_eq!(revisions.len(), written.len());
    for (key, result) in &written {
        let entry = kv.get(key).await.unwrap().unwrap();
        assert_eq!(Some(entry.revision), result.as_ref().ok().copied(), "{key}");
    }
    // Renewals went through the other nodes: the lease is alive.
    client.keepalive(lease.lease_id()).await.unwrap();
    assert!(!lease.is_lost());
    lease.release().await.unwrap();
}

/// How many lock status reads (`GET /v1/locks/{lock}`) the server has answered, from its
/// own metrics: a read counts once its answer is decided.
async fn status_reads(url: &str) -> u64 {
    let text = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| {
            line.strip_prefix(
                "palisade_request_duration_seconds_count{route=\"/v1/locks/{lock}\"} ",
            )
        })
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Runs `observer.changed()` on a task, and returns once the server has answered the
/// status read it makes before it waits: from then on, only something that tells it to
/// look again can make it answer.
async fn waiting_observer(
    url: &str,
    mut observer: Observer,
) -> tokio::task::JoinHandle<(Observer, Option<LeaderInfo>)> {
    let before = status_reads(url).await;
    let task = tokio::spawn(async move {
        let seen = observer.changed().await.unwrap();
        (observer, seen)
    });
    poll(Duration::from_secs(20), || async {
        (status_reads(url).await > before).then_some(())
    })
    .await
    .expect("the observer read the status");
    task
}

/// An observer learns of a change of holder from the lock's events stream: with its poll
/// interval an hour long, it is waiting (its status read answered, as the server's
/// metrics show) when a leader is elected, hands over and resigns, and it answers each
/// change; only a granted or released event can have made it look again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_learns_of_changes_from_the_events_stream() {
    let topology = Topology::embedded(&[]);
    let url = topology.url(0);
    let on = |i: usize| {
        Election::new(client_at(&topology, i), "streamed")
            .ttl(Duration::from_secs(5))
            .poll_interval(Duration::from_secs(3600))
    };
    // Bounds a hang (a failure), not a speed: a poll would come after an hour.
    let within = Duration::from_secs(60);
    let mut observer = on(0).observe();
    assert_eq!(observer.changed().await.unwrap(), None);
    assert!(
        observer.is_streaming(),
        "the stream opens at the first look"
    );

    let waiting = waiting_observer(&url, observer).await;
    let first = on(0).campaign("node-a", b"a").await.unwrap();
    let (observer, seen) = tokio::time::timeout(within, waiting)
        .await
        .expect("the grant reached the observer through the stream")
        .unwrap();
    assert_eq!(
        seen,
        Some(LeaderInfo {
            holder: "node-a".into(),
            epoch: first.epoch(),
            value: Some(b"a".to_vec()),
        })
    );

    // A second candidate waits in line; the leader resigns and it leads. A refused write
    // on the election's namespace comes first: a `rejected` event, which is no change of
    // leadership and does not end the wait.
    let second_election = on(0);
    let second = tokio::spawn(async move {
        second_election
            .campaign_within("node-b", b"b", Duration::from_secs(60))
            .await
    });
    let lock_reader = client_at(&topology, 0);
    poll(Duration::from_secs(20), || async {
        let status = lock_reader.lock_status("streamed").await.ok()?;
        (status.waiters == 1).then_some(())
    })
    .await
    .expect("the second candidate waits in line");
    let first_epoch = first.epoch();
    first.fence().await.unwrap();
    let waiting = waiting_observer(&url, observer).await;
    let stale = client_at(&topology, 0).fenced_kv("streamed", "pal1.not-a-token.x");
    assert!(stale.put("k", "late").await.is_err());
    first.resign().await.unwrap();
    let second = second.await.unwrap().unwrap();
    let (observer, seen) = tokio::time::timeout(within, waiting)
        .await
        .expect("the handover reached the observer through the stream")
        .unwrap();
    let seen = seen.expect("a leader");
    assert_eq!(
        (seen.holder.as_str(), seen.epoch),
        ("node-b", first_epoch + 1)
    );
    assert_eq!(second.epoch(), first_epoch + 1);

    let waiting = waiting_observer(&url, observer).await;
    second.resign().await.unwrap();
    let (observer, seen) = tokio::time::timeout(within, waiting)
        .await
        .expect("the release reached the observer through the stream")
        .unwrap();
    assert_eq!(seen, None);
    assert!(observer.is_streaming());
}

/// A server that refuses every events stream (429, too many streams) leaves observers
/// polling: they still see each change, one poll interval late at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_polls_when_the_events_stream_is_refused() {
    let topology = Topology::embedded(&["--max-event-subscribers", "0"]);
    let election = Election::new(client_at(&topology, 0), "polled")
        .ttl(Duration::from_secs(5))
        .poll_interval(Duration::from_millis(50));
    let mut observer = election.observe();
    assert_eq!(observer.changed().await.unwrap(), None);
    assert!(!observer.is_streaming());
    let leader = election.campaign("node-a", b"a").await.unwrap();
    let seen = observer.changed().await.unwrap().unwrap();
    assert_eq!(
        (seen.holder.as_str(), seen.epoch),
        ("node-a", leader.epoch())
    );
    leader.proclaim(b"a2").await.unwrap();
    let seen = observer.changed().await.unwrap().unwrap();
    assert_eq!(seen.value.as_deref(), Some(&b"a2"[..]));
    leader.resign().await.unwrap();
    assert_eq!(observer.changed().await.unwrap(), None);
    assert!(!observer.is_streaming());
}
