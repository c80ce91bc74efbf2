//! Failover of the etcd topology under load: while workers acquire through one node and
//! write through the others, the etcd leader is SIGKILLed together with a Palisade node;
//! both restart a few seconds later. Afterwards, from the final state:
//!
//! - epochs are unique per lock, and a grant answered before another was requested has
//!   the smaller epoch;
//! - no stale write was admitted: every key is written once, so the final state holds
//!   every write that committed (acknowledged or not); per namespace, in revision order,
//!   their epochs never go down, i.e. each admitted write's epoch was at least the
//!   namespace's mark when it committed;
//! - no acknowledged write was lost, and no write refused as stale is present.
//!
//! Workers also replay their previous token after releasing it (a paused holder's late
//! write), so the gate has stale writes to refuse.

#![cfg(feature = "etcd")]

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::topology::Topology;
use serde_json::{json, Value};

const WORKERS: usize = 8;
const LOCKS: usize = 3;

#[derive(Default)]
struct Record {
    /// (lock, epoch, requested, answered)
    grants: Vec<(String, u64, Instant, Instant)>,
    /// Every write attempted: (lock, key) -> (value, epoch).
    attempted: HashMap<(String, String), (String, u64)>,
    /// Writes answered 200: (lock, key) -> revision.
    acked: HashMap<(String, String), u64>,
    /// Writes answered 409 stale_token.
    refused: HashSet<(String, String)>,
}

async fn write(
    client: &reqwest::Client,
    base: &str,
    lock: &str,
    key: String,
    token: &str,
    epoch: u64,
    record: &Mutex<Record>,
) {
    let value = format!("{key}@{epoch}");
    record
        .lock()
        .unwrap()
        .attempted
        .insert((lock.to_owned(), key.clone()), (value.clone(), epoch));
    let sent = client
        .put(format!("{base}/v1/kv/{lock}/{key}"))
        .header("Fencing-Token", token)
        .body(value)
        .send()
        .await;
    let Ok(resp) = sent else { return };
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or_default();
    let mut record = record.lock().unwrap();
    match status {
        200 => {
            let revision = body["revision"].as_u64().expect("revision");
            record.acked.insert((lock.to_owned(), key), revision);
        }
        409 => {
            assert_eq!(body["error"]["code"], "stale_token", "{body}");
            record.refused.insert((lock.to_owned(), key));
        }
        _ => {} // 503 during the failover: outcome unknown, checked from the final state
    }
}

async fn worker(id: usize, urls: Vec<String>, stop: Arc<AtomicBool>, record: Arc<Mutex<Record>>) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(8))
        .build()
        .expect("http client");
    let mut previous: Option<(String, String, u64)> = None;
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let node = |k: usize| urls[(id + n + k) % urls.len()].clone();
        let lock = format!("fo-{}", (id + n) % LOCKS);
        let requested = Instant::now();
        let body = json!({"holder": format!("w{id}"), "ttl_ms": 1000, "wait_ms": 1500});
        let sent = client
            .post(format!("{}/v1/locks/{lock}/acquire", node(0)))
            .json(&body)
            .send()
            .await;
        let lease = match sent {
            Ok(resp) if resp.status() == 200 => resp.json::<Value>().await.unwrap_or_default(),
            _ => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (Some(epoch), Some(token)) = (lease["epoch"].as_u64(), lease["token"].as_str()) else {
            continue;
        };
        record
            .lock()
            .unwrap()
            .grants
            .push((lock.clone(), epoch, requested, Instant::now()));
        for w in 0..3 {
            let key = format!("w{id}-{n}-{w}");
            write(&client, &node(w + 1), &lock, key, token, epoch, &record).await;
        }
        let release = format!(
            "{}/v1/leases/{}/release",
            node(2),
            lease["lease_id"].as_str().unwrap_or("")
        );
        let _ = client.post(release).send().await;
        // The paused holder of our previous lease wakes up and writes late.
        if let Some((old_lock, old_token, old_epoch)) = previous.take() {
            let key = format!("w{id}-{n}-late");
            write(
                &client,
                &node(1),
                &old_lock,
                key,
                &old_token,
                old_epoch,
                &record,
            )
            .await;
        }
        previous = Some((lock, token.to_owned(), epoch));
    }
}

/// Reads a key: Some((value, revision, epoch)) or None when absent. Retries while the
/// cluster answers 503.
async fn read(
    client: &reqwest::Client,
    base: &str,
    lock: &str,
    key: &str,
) -> Option<(String, u64, u64)> {
    for _ in 0..50 {
        let Ok(resp) = client
            .get(format!("{base}/v1/kv/{lock}/{key}"))
            .send()
            .await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        match resp.status().as_u16() {
            404 => return None,
            200 => {
                let header = |name: &str| {
                    let text = resp
                        .headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    text.trim_matches('"')
                        .parse::<u64>()
                        .expect("numeric header")
                };
                let (revision, epoch) = (header("etag"), header("fencing-epoch"));
                return Some((resp.text().await.expect("body"), revision, epoch));
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("{lock}/{key} could not be read after the failover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_and_node_failover_keeps_every_guarantee() {
    let mut topology = Topology::etcd(&[]);
    let urls = topology.urls();
    let stop = Arc::new(AtomicBool::new(false));
    let record = Arc::new(Mutex::new(Record::default()));
    let tasks: Vec<_> = (0..WORKERS)
        .map(|i| tokio::spawn(worker(i, urls.clone(), stop.clone(), record.clone())))
        .collect();

    tokio::time::sleep(Duration::from_secs(2)).await;
    let Topology::Etcd(cluster) = &mut topology else {
        unreachable!("etcd topology")
    };
    let leader = cluster.etcd.leader().expect("the cluster has a leader");
    let grants_before = record.lock().unwrap().grants.len();
    tokio::task::block_in_place(|| {
        cluster.etcd.kill(leader);
        cluster.nodes[1].kill();
    });
    // Long enough for an election, and for the leases of holders and waiters whose
    // node died (1 s, extended by etcd on the leader change) to run out.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let new_leader = cluster.etcd.leader().expect("a new leader was elected");
    assert_ne!(new_leader, leader);
    let grants_during = record.lock().unwrap().grants.len() - grants_before;
    tokio::task::block_in_place(|| {
        cluster.etcd.restart(leader);
        cluster.nodes[1].crash_and_restart();
    });
    let restarted = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.expect("worker");
    }
    let record = std::mem::take(&mut *record.lock().unwrap());
    let after = record.grants.iter().filter(|g| g.2 > restarted).count();
    eprintln!(
        "grants: {grants_before} before, {grants_during} during, {after} after the restart; \
         writes: {} attempted, {} acknowledged, {} refused as stale",
        record.attempted.len(),
        record.acked.len(),
        record.refused.len()
    );
    assert!(
        grants_before >= 10,
        "too little work before the failover: {grants_before}"
    );
    assert!(
        grants_during >= 1,
        "the survivors served too little during it: {grants_during}"
    );
    assert!(after >= 5, "too little work after the restart: {after}");
    assert!(
        !record.refused.is_empty(),
        "no late write was refused: the test proves little"
    );

    // Epochs: unique per lock; a grant answered before another was asked for is smaller.
    let mut per_lock: BTreeMap<&str, Vec<(u64, Instant, Instant)>> = BTreeMap::new();
    for (lock, epoch, requested, answered) in &record.grants {
        per_lock
            .entry(lock)
            .or_default()
            .push((*epoch, *requested, *answered));
    }
    for (lock, grants) in &per_lock {
        let unique: HashSet<u64> = grants.iter().map(|g| g.0).collect();
        assert_eq!(
            unique.len(),
            grants.len(),
            "{lock}: an epoch was issued twice"
        );
        for a in grants {
            for b in grants.iter().filter(|b| a.2 < b.1) {
                assert!(
                    a.0 < b.0,
                    "{lock}: epoch {} granted after {} had been answered",
                    b.0,
                    a.0
                );
            }
        }
    }

    // The final state, read through a node that was never killed.
    let client = reqwest::Client::new();
    let mut committed: BTreeMap<String, Vec<(u64, u64, String)>> = BTreeMap::new();
    for ((lock, key), (value, epoch)) in &record.attempted {
        let found = read(&client, &urls[0], lock, key).await;
        let id = (lock.clone(), key.clone());
        if let Some(revision) = record.acked.get(&id) {
            let (stored, stored_revision, stored_epoch) = found
                .clone()
                .unwrap_or_else(|| panic!("acknowledged write {lock}/{key} lost"));
            assert_eq!(
                (&stored, stored_revision, stored_epoch),
                (value, *revision, *epoch)
            );
        }
        if record.refused.contains(&id) {
            assert!(
                found.is_none(),
                "{lock}/{key} was refused as stale but is present"
            );
        }
        if let Some((_, revision, stored_epoch)) = found {
            committed
                .entry(lock.clone())
                .or_default()
                .push((revision, stored_epoch, key.clone()));
        }
    }
    for (lock, mut writes) in committed {
        writes.sort();
        for pair in writes.windows(2) {
            let ((r1, e1, k1), (r2, e2, k2)) = (&pair[0], &pair[1]);
            assert!(e1 <= e2, "{lock}: {k2} (epoch {e2}, revision {r2}) admitted after {k1} (epoch {e1}, revision {r1})");
        }
    }
    // The issuer never fell below what it handed out, on any node.
    for (i, (lock, grants)) in per_lock.iter().enumerate() {
        let max = grants.iter().map(|g| g.0).max().unwrap_or(0);
        let status: Value = client
            .get(format!("{}/v1/locks/{lock}", topology.url(i)))
            .send()
            .await
            .expect("status")
            .json()
            .await
            .expect("status body");
        assert!(
            status["epoch"].as_u64().unwrap_or(0) >= max,
            "{lock}: {status}"
        );
    }
}
