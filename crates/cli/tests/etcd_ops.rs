//! Operating the etcd topology, against real etcd members and real nodes:
//!
//! - every node serves the same metrics and lease events: counters move by exactly what a
//!   scripted sequence through node A did, and node B's events stream shows the leases
//!   granted and ended through node A;
//! - the etcd restore drill: after `etcdctl snapshot restore`, the restored etcd would
//!   issue epochs a second time and admit a token the store had already fenced out;
//!   `palisade admin etcd-raise` with the node's epoch ledger puts every lock and every
//!   namespace above anything issued, including locks the snapshot never knew.

#![cfg(feature = "etcd")]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use palisade_client::LockEvent;
use serde_json::Value;

use common::etcd_cluster::EtcdCluster;
use common::events::{delta, describe, follow, next_event, scrape, Following};
use common::topology::{hex, write_private, Topology};
use common::{code, Http, Server, BIN};

fn is_lease_event(e: &LockEvent) -> bool {
    matches!(
        e,
        LockEvent::Granted { .. } | LockEvent::Released { .. } | LockEvent::Expired { .. }
    )
}

async fn next_events(following: &mut Following, n: usize) -> Vec<LockEvent> {
    let mut seen = Vec::new();
    while seen.len() < n {
        seen.push(next_event(following).await);
    }
    seen
}

/// Waits until the node counts `n` open event streams.
async fn wait_subscribers(http: &Http, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while scrape(http)
        .await
        .get("palisade_event_subscribers")
        .copied()
        != Some(n)
    {
        assert!(Instant::now() < deadline, "stream never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Through node A only: acquire (a), write, expiry, acquire (b, waiting), write, stale
/// write (a), release (b). Node A counts each by exactly its share; node B, which served
/// nothing, counts the same grants and sees the same lease events, in the same order,
/// from etcd's watch. A node tells a release from an expiry only for its own releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_nodes_share_lease_metrics_and_events() {
    let topology = Topology::etcd(&[]);
    let Topology::Etcd(nodes) = &topology else {
        unreachable!()
    };
    let (url_a, url_b) = (&nodes.nodes[0].url, &nodes.nodes[1].url);
    let (a_http, b_http) = (Http::new(url_a), Http::new(url_b));
    let before_a = scrape(&a_http).await;
    let before_b = scrape(&b_http).await;
    let mut on_a = follow(
        palisade_client::Client::new(url_a)
            .unwrap()
            .watch("L")
            .unwrap(),
    );
    let mut on_b = follow(
        palisade_client::Client::new(url_b)
            .unwrap()
            .watch("L")
            .unwrap(),
    );
    wait_subscribers(&a_http, 1.0).await;
    wait_subscribers(&b_http, 1.0).await;

    let a = a_http.acquire("L", "a", 1000).await;
    let token_a = a["token"].as_str().unwrap().to_owned();
    assert_eq!(a_http.put("L", "k", Some(&token_a), "1").await.0, 200);
    // Waits in line until a's lease expires in etcd, then gets the lock.
    let b = a_http.acquire_waiting("L", "b", 60_000, 15_000).await;
    let token_b = b["token"].as_str().unwrap().to_owned();
    assert_eq!(b["epoch"], 2);
    assert_eq!(a_http.put("L", "k", Some(&token_b), "2").await.0, 200);
    let (status, body) = a_http.put("L", "k", Some(&token_a), "late").await;
    assert_eq!((status, code(&body)), (409, "stale_token"));
    // b holds the lock: both nodes count one live lease, read from etcd.
    for http in [&a_http, &b_http] {
        assert_eq!(scrape(http).await.get("palisade_leases_live"), Some(&1.0));
    }
    let release = a_http
        .client
        .post(format!(
            "{url_a}/v1/leases/{}/release",
            b["lease_id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(release.status(), 200);

    let seen_b: Vec<String> = next_events(&mut on_b, 4)
        .await
        .iter()
        .map(describe)
        .collect();
    assert_eq!(
        seen_b,
        [
            "granted 1 a",
            "released 1 a unknown",
            "granted 2 b",
            "released 2 b unknown",
        ],
        "node B sees node A's leases; it cannot tell an expiry from A's release"
    );
    let seen_a = next_events(&mut on_a, 7).await;
    let (leases, writes): (Vec<_>, Vec<_>) = seen_a.iter().partition(|e| is_lease_event(e));
    let leases: Vec<String> = leases.into_iter().map(describe).collect();
    let writes: Vec<String> = writes.into_iter().map(describe).collect();
    assert_eq!(
        leases,
        [
            "granted 1 a",
            "released 1 a unknown",
            "granted 2 b",
            "released 2 b release",
        ],
        "node A knows its own release"
    );
    assert_eq!(
        writes,
        [
            "fenced 1",
            "fenced 2",
            "rejected stale_token Some(1) Some(2)"
        ]
    );
    let ids: Vec<u64> = seen_a.iter().map(LockEvent::id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");

    // Every event was counted before it was published: the counters are final.
    let after_a = scrape(&a_http).await;
    let after_b = scrape(&b_http).await;
    for (name, on_a, on_b) in [
        ("palisade_grants_total", 2.0, 2.0),
        ("palisade_releases_total", 1.0, 0.0),
        ("palisade_lease_ends_total", 1.0, 2.0),
        ("palisade_expiries_total", 0.0, 0.0),
        ("palisade_fenced_writes_total", 2.0, 0.0),
        (
            "palisade_fenced_rejections_total{code=\"stale_token\"}",
            1.0,
            0.0,
        ),
    ] {
        assert_eq!(delta(&before_a, &after_a, name), on_a, "node A: {name}");
        assert_eq!(delta(&before_b, &after_b, name), on_b, "node B: {name}");
    }
    for after in [&after_a, &after_b] {
        assert_eq!(after.get("palisade_leases_live"), Some(&0.0));
        assert_eq!(after.get("palisade_waiters"), Some(&0.0));
    }
    // etcd's analogue of the fsync: each write transaction, timed until etcd answered.
    let commits = "palisade_fsync_duration_seconds_count";
    assert!(delta(&before_a, &after_a, commits) >= 4.0, "{after_a:?}");
}

fn ledger_ceiling(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).expect("ledger exists");
    let ledger: Value = serde_json::from_str(&text).expect("ledger is JSON");
    ledger["ceiling"].as_u64().expect("ceiling")
}

/// `palisade admin etcd-raise`: (exit code, stdout JSON, stderr).
fn etcd_raise(endpoints: &str, ledgers: &[&Path]) -> (i32, Value, String) {
    let mut command = std::process::Command::new(BIN);
    command.args(["admin", "etcd-raise", "--etcd-endpoints", endpoints]);
    for ledger in ledgers {
        command.arg("--ledger").arg(ledger);
    }
    let out = command.output().expect("palisade runs");
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The drill of docs/operations.md ("Restoring etcd from a snapshot"), with a real
/// `etcdctl snapshot save` and `etcdctl snapshot restore`, and the node's epoch ledger
/// where it is by default (no `--etcd-epoch-ledger`): `etcd-epoch-ledger.json` in its data
/// directory, which a second node cannot share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restore_drill_raises_epochs_above_the_ledger() {
    let mut etcd = EtcdCluster::start(1);
    let endpoints = etcd.endpoints();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("signing.key");
    write_private(
        &key_file,
        &hex(&palisade_token::Signer::generate().secret()),
    );
    let node_dir = dir.path().join("node");
    let ledger = node_dir.join("etcd-epoch-ledger.json");
    let snapshot = dir.path().join("etcd.snapshot");
    let args = [
        "--backend",
        "etcd",
        "--etcd-endpoints",
        &endpoints,
        "--signing-key-file",
        key_file.to_str().unwrap(),
        "--etcd-timeout-ms",
        "2000",
    ];
    let mut node = Server::start_in(&node_dir, 0, &args).unwrap();
    let http = Http::new(&node.url);
    assert!(ledger.exists(), "the ledger is on by default");
    let sharing = Server::start_in(&node_dir, 0, &args)
        .err()
        .expect("a second node on the same ledger refuses to start");
    assert!(sharing.contains("in use by another node"), "{sharing}");
    // A snapshot from before the node's first grant, for the last part.
    let early = dir.path().join("early.snapshot");
    etcd.save_snapshot(0, &early);

    // Before the snapshot: epoch 1 of D, written.
    let g1 = http.acquire("D", "h1", 60_000).await;
    let token1 = g1["token"].as_str().unwrap().to_owned();
    assert_eq!(http.put("D", "k", Some(&token1), "one").await.0, 200);
    http.release(&g1).await;
    etcd.save_snapshot(0, &snapshot);

    // After it, acknowledged and then lost by the restore: epoch 2 of D, and lock N.
    let g2 = http.acquire("D", "h2", 60_000).await;
    let token2 = g2["token"].as_str().unwrap().to_owned();
    assert_eq!(g2["epoch"], 2);
    assert_eq!(http.put("D", "k", Some(&token2), "two").await.0, 200);
    http.release(&g2).await;
    let n1 = http.acquire("N", "h1", 60_000).await;
    let token_n1 = n1["token"].as_str().unwrap().to_owned();
    assert_eq!(http.put("N", "k", Some(&token_n1), "n").await.0, 200);
    http.release(&n1).await;
    let ceiling = ledger_ceiling(&ledger);
    assert!(ceiling >= 2, "the ledger covers every epoch handed out");

    node.kill();
    etcd.restore_snapshot(&snapshot);

    // Without the raise: etcd forgot epoch 2 of D and all of N. The same epochs are
    // handed out again, and a token the store had fenced out (token1, below mark 2) is
    // admitted again.
    let mut node = Server::start_in(&node_dir, 0, &args).unwrap();
    let http = Http::new(&node.url);
    assert_eq!(
        http.high_water("D").await,
        1,
        "the restored mark is the snapshot's"
    );
    assert_eq!(http.put("D", "old", Some(&token1), "again").await.0, 200);
    let again = http.acquire("D", "h3", 60_000).await;
    assert_eq!(again["epoch"], 2, "epoch 2 of D is issued a second time");
    http.release(&again).await;
    let n_again = http.acquire("N", "h3", 60_000).await;
    assert_eq!(n_again["epoch"], 1, "epoch 1 of N is issued a second time");
    http.release(&n_again).await;
    node.kill();

    // The raise refuses to guess when a node's ledger is missing, and changes nothing.
    let missing = dir.path().join("no-such-ledger.json");
    let (status, _, stderr) = etcd_raise(&endpoints, &[&ledger, &missing]);
    assert_ne!(status, 0);
    assert!(stderr.contains("does not exist"), "{stderr}");

    let (status, report, stderr) = etcd_raise(&endpoints, &[&ledger]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(
        report["previous_floor"], 0,
        "the failed run changed nothing"
    );
    assert_eq!(report["bound"], ceiling);
    assert_eq!(report["floor"], ceiling + 1);
    // Twice is harmless.
    let (status, report, _) = etcd_raise(&endpoints, &[&ledger]);
    assert_eq!((status, report["floor"].clone()), (0, (ceiling + 1).into()));

    let node = Server::start_in(&node_dir, 0, &args).unwrap();
    let http = Http::new(&node.url);
    // Every token from before the raise is stale, in a namespace the snapshot knew (D)
    // and in one it never heard of (N).
    for (lock, token) in [("D", &token1), ("D", &token2), ("N", &token_n1)] {
        let (status, body) = http.put(lock, "late", Some(token), "late").await;
        assert_eq!(
            (status, code(&body)),
            (409, "stale_token"),
            "{lock}: {body}"
        );
    }
    // And every lock continues above anything ever issued.
    for lock in ["D", "N", "never-seen"] {
        let g = http.acquire(lock, "h4", 60_000).await;
        let epoch = g["epoch"].as_u64().unwrap();
        assert_eq!(epoch, ceiling + 2, "{lock}");
        let token = g["token"].as_str().unwrap();
        assert_eq!(http.put(lock, "k", Some(token), "new").await.0, 200);
        http.release(&g).await;
    }
    let raised = ledger_ceiling(&ledger);
    assert!(raised >= ceiling + 2, "the ledger covers the new epochs");

    // A snapshot older than the ledger's last update is caught at start: the node
    // refuses to serve it until the raise has run.
    let mut node = node;
    node.kill();
    etcd.restore_snapshot(&early);
    let refused = Server::start_in(&node_dir, 0, &args)
        .err()
        .expect("the node refuses an etcd older than its ledger");
    assert!(refused.contains("palisade admin etcd-raise"), "{refused}");
    let (status, report, stderr) = etcd_raise(&endpoints, &[&ledger]);
    assert_eq!(status, 0, "{stderr}");
    assert_eq!(report["floor"], raised + 1);
    let node = Server::start_in(&node_dir, 0, &args).unwrap();
    let http = Http::new(&node.url);
    let g = http.acquire("D", "h5", 60_000).await;
    assert_eq!(g["epoch"], raised + 2);
}
