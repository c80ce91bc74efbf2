//! Who writes and completes a batch (`seat.rs`, `sync.rs`): a lone write is appended, made
//! durable and answered on the caller's own thread, writes under load go through the
//! writer and the syncer while the writer goes on, and either way no reader ever sees a
//! key go back and nothing acknowledged is lost.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{never_back, op, put, test_options};
use crate::observe::{CommitHook, CommitObserver, CommitReport};
use crate::redb_backend::{RedbBackend, RedbOptions};
use crate::FencedStore;

/// The names of the threads that completed each group, in order.
#[derive(Default)]
struct Completers(Mutex<Vec<String>>);

impl CommitObserver for Completers {
    fn committed(&self, _report: CommitReport) {
        let name = std::thread::current().name().unwrap_or("?").to_owned();
        self.0.lock().unwrap().push(name);
    }
}

impl Completers {
    fn count(&self, thread: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|n| *n == thread)
            .count()
    }
}

fn observed(completers: &Arc<Completers>, options: RedbOptions) -> RedbOptions {
    RedbOptions {
        commit_hook: CommitHook::new(Arc::clone(completers) as Arc<dyn CommitObserver>),
        ..options
    }
}

/// Polls until a write submitted now would find the log idle (the writer thread may still
/// be leaving the seat after the previous answer).
async fn until_idle(store: &RedbBackend) {
    for _ in 0..10_000 {
        if store.log_idle() {
            return;
        }
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
    panic!("the log never became idle");
}

#[tokio::test]
async fn a_lone_write_is_completed_on_the_callers_own_thread() {
    let dir = tempfile::tempdir().unwrap();
    let completers = Arc::new(Completers::default());
    let path = dir.path().join("palisade.redb");
    let store = RedbBackend::open(&path, observed(&completers, test_options())).unwrap();
    let caller = std::thread::current().name().unwrap().to_owned();
    for i in 1..=20u64 {
        until_idle(&store).await;
        store
            .apply(op("ns", i, put("k", &i.to_string())))
            .await
            .unwrap();
    }
    assert_eq!(
        completers.count(&caller),
        20,
        "one write at a time: every group written and completed by its caller ({:?})",
        completers.0.lock().unwrap()
    );
    store.close().await;
    // Durable: the last acknowledged value is there after a reopen.
    let store = RedbBackend::open(&path, test_options()).unwrap();
    assert_eq!(
        store.get("ns", "k").await.unwrap().unwrap().value,
        &b"20"[..]
    );
    assert_eq!(store.high_water("ns").await.unwrap().epoch, 20);
    store.close().await;
}

const KEYS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_under_load_go_through_the_syncer_and_never_go_back() {
    let dir = tempfile::tempdir().unwrap();
    let completers = Arc::new(Completers::default());
    let path = dir.path().join("palisade.redb");
    // One request per batch, so that every write finds others waiting behind it; a
    // checkpoint every few rows, so that rows also leave memory all the time.
    let options = RedbOptions {
        max_batch: 1,
        checkpoint_rows: 5,
        checkpoint_every: Duration::from_millis(1),
        ..test_options()
    };
    let store = RedbBackend::open(&path, observed(&completers, options)).unwrap();
    // The newest acknowledged revision of each key.
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for r in 0..2 {
        let (store, acked, done) = (store.clone(), Arc::clone(&acked), Arc::clone(&done));
        readers.push(tokio::spawn(async move {
            let mut seen = [0u64; KEYS];
            let mut reads = 0u64;
            while !done.load(Ordering::Acquire) {
                let k = (reads as usize + r) % KEYS;
                let floor = acked[k].load(Ordering::Acquire);
                let got = store
                    .get("ns", &format!("k{k}"))
                    .await
                    .unwrap()
                    .map_or(0, |e| e.revision);
                never_back(k, got, floor, &mut seen[k]);
                reads += 1;
                // A read from memory never waits: let the writers' tasks run too.
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut writers = Vec::new();
    for w in 0..16usize {
        let (store, acked) = (store.clone(), Arc::clone(&acked));
        writers.push(tokio::spawn(async move {
            for i in 0..60usize {
                let k = (w + i) % KEYS;
                let applied = store
                    .apply(op("ns", 1, put(&format!("k{k}"), &format!("{w}-{i}"))))
                    .await
                    .unwrap();
                acked[k].fetch_max(applied.revision, Ordering::AcqRel);
            }
        }));
    }
    let all_written = async {
        for writer in writers {
            writer.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all_written)
        .await
        .expect("the writes stalled: an answer was never sent");
    done.store(true, Ordering::Release);
    for reader in readers {
        reader.await.unwrap();
    }
    assert!(
        completers.count("palisade-syncer") > 0,
        "16 concurrent writers, one request per batch: the syncer completed nothing ({:?})",
        completers.0.lock().unwrap()
    );
    // Every key holds its newest acknowledged revision, after a reopen too.
    let newest: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Acquire)).collect();
    store.close().await;
    let store = RedbBackend::open(&path, test_options()).unwrap();
    for (k, revision) in newest.iter().enumerate() {
        let entry = store.get("ns", &format!("k{k}")).await.unwrap().unwrap();
        assert_eq!(entry.revision, *revision, "key {k}");
    }
    store.close().await;
}
