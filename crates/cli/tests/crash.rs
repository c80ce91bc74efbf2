//! Crash test: many clients acquire and write while the server is killed with SIGKILL
//! several times and restarted on the same data directory. Afterwards:
//! - every epoch ever returned is unique per lock;
//! - epochs issued after each restart exceed every epoch issued before it;
//! - every acknowledged write is present with its value.
//!
//! The same body runs against every topology. With etcd (feature `etcd`), each crash
//! SIGKILLs all three Palisade nodes and one etcd member (a different one each round),
//! and workers spread their requests across the nodes.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::topology::Topology;
use common::Http;
use serde_json::{json, Value};

const WORKERS: usize = 12;
const LOCKS: usize = 4;
const KILLS: usize = 4;

#[derive(Default)]
struct Record {
    /// (lock, epoch, generation when sent, generation when answered)
    epochs: Vec<(String, u64, u64, u64)>,
    /// (lock, key) -> value, for every write answered 200.
    acked: HashMap<(String, String), String>,
}

async fn worker(
    id: usize,
    urls: Vec<String>,
    generation: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    record: Arc<Mutex<Record>>,
) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let lock = format!("crash-{}", (id + n) % LOCKS);
        let turn = id + n;
        let node = |k: usize| &urls[(turn + k) % urls.len()];
        let base = node(0);
        n += 1;
        let sent = generation.load(Ordering::SeqCst);
        let resp = client
            .post(format!("{base}/v1/locks/{lock}/acquire"))
            .json(&json!({"holder": format!("w{id}"), "ttl_ms": 500, "wait_ms": 400}))
            .send()
            .await;
        let Ok(resp) = resp else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        if resp.status() != 200 {
            continue;
        }
        let Ok(lease) = resp.json::<Value>().await else {
            continue;
        };
        let answered = generation.load(Ordering::SeqCst);
        let epoch = lease["epoch"].as_u64().unwrap();
        record
            .lock()
            .unwrap()
            .epochs
            .push((lock.clone(), epoch, sent, answered));
        let token = lease["token"].as_str().unwrap().to_owned();
        for w in 0..3 {
            let key = format!("w{id}-{n}-{w}");
            let value = format!("epoch {epoch} by w{id}");
            let resp = client
                .put(format!("{}/v1/kv/{lock}/{key}", node(w + 1)))
                .header("Fencing-Token", &token)
                .body(value.clone())
                .send()
                .await;
            if let Ok(resp) = resp {
                if resp.status() == 200 {
                    record
                        .lock()
                        .unwrap()
                        .acked
                        .insert((lock.clone(), key), value);
                }
            }
        }
        let _ = client
            .post(format!(
                "{}/v1/leases/{}/release",
                node(2),
                lease["lease_id"].as_str().unwrap()
            ))
            .send()
            .await;
    }
}

/// Acquisitions sent and answered within one stable generation, and acknowledged writes,
/// that each generation must see before the next crash: enough for the checks below to
/// compare generations, however loaded the machine (the wait is for work, not for time).
const WORK_PER_GENERATION: usize = 6;

/// Waits until generation `g` has seen [`WORK_PER_GENERATION`] acquisitions sent and
/// answered in it, and as many more acknowledged writes; fails after a minute without.
async fn work_in_generation(record: &Mutex<Record>, g: u64) {
    let acked_before = record.lock().unwrap().acked.len();
    palisade_test_support::poll_async(
        Duration::from_secs(60),
        &format!("work in generation {g}"),
        || async {
            let record = record.lock().unwrap();
            let epochs = record
                .epochs
                .iter()
                .filter(|(_, _, sent, answered)| *sent == g && *answered == g)
                .count();
            let acked = record.acked.len() - acked_before;
            (epochs >= WORK_PER_GENERATION && acked >= WORK_PER_GENERATION).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_restarts_lose_no_epoch_and_no_acknowledged_write_embedded() {
    crash_suite(Topology::embedded(&[])).await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_restarts_lose_no_epoch_and_no_acknowledged_write_etcd() {
    crash_suite(Topology::etcd(&[])).await;
}

async fn crash_suite(mut topology: Topology) {
    let urls = topology.urls();
    let generation = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let record = Arc::new(Mutex::new(Record::default()));
    let tasks: Vec<_> = (0..WORKERS)
        .map(|i| {
            tokio::spawn(worker(
                i,
                urls.clone(),
                generation.clone(),
                stop.clone(),
                record.clone(),
            ))
        })
        .collect();

    for round in 0..KILLS {
        work_in_generation(&record, generation.load(Ordering::SeqCst)).await;
        // Odd generations are transitions: answers sent or received then are counted for
        // uniqueness but not for the before/after comparison.
        generation.fetch_add(1, Ordering::SeqCst);
        tokio::task::block_in_place(|| topology.crash_and_restart(round));
        generation.fetch_add(1, Ordering::SeqCst);
    }
    work_in_generation(&record, generation.load(Ordering::SeqCst)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }

    let record = std::mem::take(&mut *record.lock().unwrap());
    assert!(
        record.epochs.len() > 20,
        "too little work happened: {}",
        record.epochs.len()
    );
    assert!(
        record.acked.len() > 20,
        "too few writes acknowledged: {}",
        record.acked.len()
    );

    // Unique per lock.
    let mut seen: HashSet<(String, u64)> = HashSet::new();
    for (lock, epoch, _, _) in &record.epochs {
        assert!(
            seen.insert((lock.clone(), *epoch)),
            "epoch {epoch} of {lock} issued twice"
        );
    }

    // Increasing across restarts: per lock, every epoch of a later stable generation
    // exceeds every epoch of an earlier one.
    let mut by_gen: BTreeMap<(String, u64), (u64, u64)> = BTreeMap::new();
    for (lock, epoch, sent, answered) in &record.epochs {
        if sent == answered && sent % 2 == 0 {
            let e = by_gen.entry((lock.clone(), *sent)).or_insert((u64::MAX, 0));
            e.0 = e.0.min(*epoch);
            e.1 = e.1.max(*epoch);
        }
    }
    let mut generations_seen = HashSet::new();
    for lock in (0..LOCKS).map(|i| format!("crash-{i}")) {
        let mut max_before = 0;
        for ((l, g), (min, max)) in by_gen.iter().filter(|((l, _), _)| *l == lock) {
            generations_seen.insert(*g);
            assert!(
                *min > max_before,
                "{l}: generation {g} issued {min} after {max_before} had been issued"
            );
            max_before = *max;
        }
    }
    assert_eq!(
        generations_seen.len(),
        KILLS + 1,
        "every stable generation did work: {generations_seen:?}"
    );

    // Every acknowledged write survived the crashes.
    for (i, ((lock, key), value)) in record.acked.iter().enumerate() {
        let found = Http::new(&topology.url(i)).get_value(lock, key).await;
        assert_eq!(
            found.as_ref(),
            Some(value),
            "acknowledged write {lock}/{key} lost"
        );
    }
    // The issuer's counters never fell below what it handed out.
    for (i, lock) in (0..LOCKS).map(|i| format!("crash-{i}")).enumerate() {
        let http = Http::new(&topology.url(i));
        let max = record
            .epochs
            .iter()
            .filter(|(l, ..)| *l == lock)
            .map(|(_, e, ..)| *e)
            .max()
            .unwrap_or(0);
        let (_, status) = http.get(&format!("/v1/locks/{lock}")).await;
        assert!(status["epoch"].as_u64().unwrap() >= max, "{lock}: {status}");
    }
}
