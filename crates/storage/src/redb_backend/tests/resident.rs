//! Answers from memory: point reads (`resident.rs`) never answer older than an
//! acknowledged write, however checkpoints move rows out of memory and the cache fills, a
//! row in memory is read without the blocking pool, and a write that the durable rows in
//! memory already refuse (or replay) is answered without the writer.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade_core::gate::GateError;

use super::{never_back, op, put, put_if, temp_store, test_options, value};
use crate::redb_backend::overlay::{Key, Val};
use crate::redb_backend::resident::RowCache;
use crate::redb_backend::{RedbBackend, RedbOptions};
use crate::{ApplyError, FencedOp, FencedStore, Idempotency, Precondition};

const KEYS: usize = 4;

/// A checkpoint every few rows, so that rows leave memory all the time.
fn checkpoint_often() -> RedbOptions {
    RedbOptions {
        checkpoint_rows: 3,
        checkpoint_every: Duration::from_millis(1),
        ..test_options()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_from_memory_never_go_back_across_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbBackend::open(&dir.path().join("palisade.redb"), checkpoint_often()).unwrap();
    // The revision of the newest acknowledged write of each key, and the mark.
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..=KEYS).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for r in 0..3 {
        let (store, acked, done) = (store.clone(), Arc::clone(&acked), Arc::clone(&done));
        readers.push(tokio::spawn(async move {
            let mut reads = 0u64;
            let mut seen = [0u64; KEYS + 1];
            while !done.load(Ordering::Acquire) {
                let k = (reads as usize + r) % (KEYS + 1);
                let floor = acked[k].load(Ordering::Acquire);
                let got = if k == KEYS {
                    store.high_water("ns").await.unwrap().epoch
                } else {
                    store
                        .get("ns", &format!("k{k}"))
                        .await
                        .unwrap()
                        .map_or(0, |e| e.revision)
                };
                never_back(k, got, floor, &mut seen[k]);
                reads += 1;
            }
            reads
        }));
    }
    let checkpoints_before = store.checkpoint_seq();
    for i in 0..1500u64 {
        let k = (i as usize * 7) % KEYS;
        let epoch = 1 + i / 10;
        let applied = store
            .apply(op("ns", epoch, put(&format!("k{k}"), &i.to_string())))
            .await
            .unwrap();
        acked[k].store(applied.revision, Ordering::Release);
        acked[KEYS].store(epoch, Ordering::Release);
    }
    done.store(true, Ordering::Release);
    let mut reads = 0;
    for reader in readers {
        reads += reader.await.unwrap();
    }
    assert!(
        reads > 1500,
        "the readers read too little to mean anything: {reads}"
    );
    assert!(
        store.checkpoint_seq() > checkpoints_before + 100,
        "too few checkpoints ran: {} -> {}",
        checkpoints_before,
        store.checkpoint_seq()
    );
    assert!(
        store.inner.resident.len() > 0,
        "no read was ever cached from the file"
    );
    store.close().await;
}

#[test]
fn a_filler_older_than_a_checkpoint_puts_nothing_in() {
    let cache = RowCache::new(1 << 20);
    let key = Key::Kv("ns".into(), "k".into());
    let old = Some(Val::U64(1));
    // A filler began (its snapshot older than the checkpoint), the checkpoint wrote the key
    // and forgot it, then the filler tries to put its old row in.
    let generation = cache.generation();
    cache.checkpointed(std::iter::once(&key));
    cache.fill(generation, &key, &old);
    assert_eq!(cache.len(), 0);
    // A filler that began after the checkpoint puts its row in.
    cache.fill(cache.generation(), &key, &old);
    assert_eq!(cache.len(), 1);
    // The next checkpoint that writes the key forgets it.
    cache.checkpointed(std::iter::once(&key));
    assert_eq!(cache.len(), 0);
}

/// The runtime's only blocking thread is kept busy: a read of a row in memory still
/// answers, and a read that must go to the file waits for the pool.
#[test]
fn a_row_in_memory_is_read_without_the_blocking_pool() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = RedbBackend::open(
            &dir.path().join("palisade.redb"),
            RedbOptions {
                checkpoint_rows: 1 << 30,
                checkpoint_every: Duration::from_secs(3600),
                resident_bytes: 0,
                ..test_options()
            },
        )
        .unwrap();
        store.apply(op("ns", 1, put("k", "v"))).await.unwrap();
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let busy = tokio::task::spawn_blocking(move || blocked.recv());
        // Published since the last checkpoint: answered from memory.
        let read = tokio::time::timeout(Duration::from_secs(5), value(&store, "ns", "k"));
        assert_eq!(
            read.await.expect("a resident read waited").as_deref(),
            Some("v")
        );
        let mark = tokio::time::timeout(Duration::from_secs(5), store.high_water("ns"));
        assert_eq!(
            mark.await.expect("a resident read waited").unwrap().epoch,
            1
        );
        // Never written: the file must say so, and that takes the pool.
        let cold = tokio::time::timeout(Duration::from_millis(300), store.get("ns", "other"));
        assert!(
            cold.await.is_err(),
            "a read of the file did not need the pool"
        );
        release.send(()).unwrap();
        busy.await.unwrap().unwrap();
        assert_eq!(value(&store, "ns", "other").await, None);
        store.close().await;
    });
}

/// The requests the writer has taken so far (it counts every one, refused or not).
fn taken(store: &RedbBackend) -> u64 {
    store.commit_stats().ops
}

#[tokio::test]
async fn a_write_the_durable_rows_refuse_is_answered_without_the_writer() {
    let (_dir, store) = temp_store();
    store.apply(op("ns", 2, put("k", "two"))).await.unwrap();
    let before = taken(&store);
    // A stale epoch, a failed precondition: the same answers as the writer's.
    assert_eq!(
        store.apply(op("ns", 1, put("k", "stale"))).await,
        Err(ApplyError::Gate(GateError::Stale {
            high_water: 2,
            epoch: 1
        }))
    );
    assert_eq!(
        store
            .apply(op("ns", 2, put_if("k", "x", Precondition::Absent)))
            .await,
        Err(ApplyError::RevisionMismatch { current: Some(1) })
    );
    assert_eq!(taken(&store), before, "a refusal went through the writer");
    assert_eq!(value(&store, "ns", "k").await.as_deref(), Some("two"));
    // A write that commits still goes to the writer.
    store.apply(op("ns", 2, put("k", "again"))).await.unwrap();
    assert_eq!(taken(&store), before + 1);
    store.close().await;
}

#[tokio::test]
async fn a_retry_of_a_durable_write_is_replayed_without_the_writer() {
    let (_dir, store) = temp_store();
    let with_key = |fingerprint: &str| FencedOp {
        idempotency: Some(Idempotency {
            key: "req-1".to_string(),
            fingerprint: fingerprint.to_string(),
        }),
        ..op("ns", 1, put("n", "1"))
    };
    let first = store.apply(with_key("fp-a")).await.unwrap();
    let before = taken(&store);
    let again = store.apply(with_key("fp-a")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.revision, first.revision);
    assert!(matches!(
        store.apply(with_key("fp-b")).await,
        Err(ApplyError::IdempotencyConflict)
    ));
    assert_eq!(taken(&store), before, "a replay went through the writer");
    store.close().await;
}

#[tokio::test]
async fn a_failed_or_closed_store_still_says_so() {
    let (_dir, store) = temp_store();
    store.apply(op("ns", 2, put("k", "two"))).await.unwrap();
    store.close().await;
    assert!(matches!(
        store.apply(op("ns", 1, put("k", "stale"))).await,
        Err(ApplyError::Storage(crate::StorageError::Closed))
    ));
}
