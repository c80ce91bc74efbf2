//! Namespace quotas, idempotency retention and purge, the lock index (paged listing and
//! one lock's record), and the migration of a layout-1 file, on real files.

use palisade_api::QuotaResource;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade_core::gate::HighWater;
use palisade_core::lock_table::Reservation;
use palisade_core::page::Page;

use super::{delete, op, put, value};
use crate::redb_backend::schema::{IDEMPOTENCY, IDEM_EXPIRY, USAGE};
use crate::redb_backend::{RedbBackend, RedbOptions};
use crate::{
    Action, ApplyError, FencedOp, FencedStore, Idempotency, IssuerLog, StoreLimits, WallClock,
};

/// A wall clock the test moves by hand.
#[derive(Clone)]
struct Clock(Arc<AtomicU64>);

impl Clock {
    fn at(ms: u64) -> Self {
        Clock(Arc::new(AtomicU64::new(ms)))
    }
    fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
    fn wall(&self) -> WallClock {
        let now = Arc::clone(&self.0);
        WallClock::from_fn(move || now.load(Ordering::SeqCst))
    }
}

fn with_key(ns: &str, epoch: u64, action: Action, fingerprint: &str) -> FencedOp {
    FencedOp {
        idempotency: Some(Idempotency {
            key: "req".to_string(),
            fingerprint: fingerprint.to_string(),
        }),
        ..op(ns, epoch, action)
    }
}

/// Counts the rows of the idempotency table and of its expiry index, straight from the
/// file (the backend closed).
fn idempotency_rows(path: &std::path::Path) -> (u64, u64) {
    use redb::ReadableTableMetadata;
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let records = txn.open_table(IDEMPOTENCY).unwrap().len().unwrap();
    let index = txn.open_table(IDEM_EXPIRY).unwrap().len().unwrap();
    (records, index)
}

#[tokio::test]
async fn idempotency_records_expire_and_are_purged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palisade.redb");
    let clock = Clock::at(1_000_000);
    let options = RedbOptions {
        limits: StoreLimits {
            idempotency_retention: Duration::from_secs(60),
            ..StoreLimits::default()
        },
        clock: clock.wall(),
        purge_every: Duration::from_millis(5),
        ..super::test_options()
    };
    let store = RedbBackend::open(&path, options.clone()).unwrap();
    let first = store
        .apply(with_key("a", 1, put("k", "1"), "fp-1"))
        .await
        .unwrap();
    // Within the retention: replayed, and another request under the key conflicts.
    clock.set(1_059_999);
    let again = store
        .apply(with_key("a", 1, put("k", "1"), "fp-1"))
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.revision, first.revision);
    assert_eq!(
        store.apply(with_key("a", 1, put("k", "2"), "fp-2")).await,
        Err(ApplyError::IdempotencyConflict)
    );
    // A restart does not reset the retention: it is wall-clock time.
    store.close().await;
    let store = RedbBackend::open(&path, options.clone()).unwrap();
    assert!(
        store
            .apply(with_key("a", 1, put("k", "1"), "fp-1"))
            .await
            .unwrap()
            .replayed
    );
    // Expired: neither replayed nor a conflict; the new request is applied and recorded.
    clock.set(1_060_000);
    let fresh = store
        .apply(with_key("a", 1, put("k", "2"), "fp-2"))
        .await
        .unwrap();
    assert!(!fresh.replayed);
    assert!(fresh.revision > first.revision);
    assert_eq!(value(&store, "a", "k").await.as_deref(), Some("2"));
    let replay = store
        .apply(with_key("a", 1, put("k", "2"), "fp-2"))
        .await
        .unwrap();
    assert_eq!((replay.replayed, replay.revision), (true, fresh.revision));

    // Records in another namespace; then everything expires and the purge empties the
    // table and its index.
    for ns in ["b", "c", "d"] {
        store
            .apply(with_key(ns, 1, put("k", "v"), "fp"))
            .await
            .unwrap();
    }
    store.close().await;
    assert_eq!(idempotency_rows(&path), (4, 4));
    clock.set(10_000_000);
    // The writer purges when idle, `purge_every` after it starts: poll the file until it
    // has, reopening between looks (the file is read with the backend closed).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let store = RedbBackend::open(&path, options.clone()).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        store.close().await;
        if idempotency_rows(&path) == (0, 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "expired records were never purged"
        );
    }
}

fn limits(keys: u64, bytes: u64) -> RedbOptions {
    RedbOptions {
        limits: StoreLimits {
            max_keys_per_namespace: keys,
            max_bytes_per_namespace: bytes,
            ..StoreLimits::default()
        },
        ..super::test_options()
    }
}

/// The quota counters on disk (the refusals themselves are the suite's
/// `quotas_refuse_without_writing_and_count_exactly`): exact after overwrites and deletes,
/// kept across a reopen, and gone once a namespace is empty.
#[tokio::test]
async fn quota_counters_are_exact_on_disk_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palisade.redb");
    let store = RedbBackend::open(&path, limits(3, 20)).unwrap();
    // "k1" + "12345" = 7 bytes each.
    store.apply(op("q", 1, put("k1", "12345"))).await.unwrap();
    store.apply(op("q", 1, put("k2", "12345"))).await.unwrap();
    store
        .apply(with_key("q", 2, put("k3", "1234"), "other"))
        .await
        .unwrap();
    store.apply(op("r", 1, put("k1", "12345"))).await.unwrap();
    store.apply(op("q", 2, put("k1", "1"))).await.unwrap();
    store.apply(op("q", 2, delete("k2"))).await.unwrap();
    store
        .apply(op("q", 2, put("k4", "123456789")))
        .await
        .unwrap();
    store.close().await;

    // Counted from the data, the counters are exact; and they survive a reopen.
    let db = redb::Database::open(&path).unwrap();
    {
        let txn = db.begin_read().unwrap();
        let usage = txn.open_table(USAGE).unwrap();
        // k1 "1" (3) + k3 "1234" (6) + k4 "123456789" (11) = 20 bytes, 3 keys.
        assert_eq!(usage.get("q").unwrap().unwrap().value(), (3, 20));
        assert_eq!(usage.get("r").unwrap().unwrap().value(), (1, 7));
    }
    drop(db);
    let store = RedbBackend::open(&path, limits(3, 20)).unwrap();
    assert!(matches!(
        store.apply(op("q", 2, put("k5", ""))).await,
        Err(ApplyError::QuotaExceeded { .. })
    ));
    // Emptied, a namespace has no counter left.
    for key in ["k1", "k3", "k4"] {
        store.apply(op("q", 2, delete(key))).await.unwrap();
    }
    store.close().await;
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    assert!(txn.open_table(USAGE).unwrap().get("q").unwrap().is_none());
}

#[tokio::test]
async fn the_lock_index_pages_by_name_and_reads_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palisade.redb");
    super::open(&path).close().await;
    {
        // A lock granted by an older version: an epoch, no reservation.
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(crate::redb_backend::schema::EPOCHS)
            .unwrap()
            .insert("legacy", 4)
            .unwrap();
        txn.commit().unwrap();
    }
    let store = super::open(&path);
    let reserved = |ceiling, active| Reservation {
        ceiling,
        max_ttl_ms: 5_000,
        active,
    };
    for (lock, ceiling) in [("b", 1024), ("a/2", 7), ("a/1", 3), ("a/10", 9), ("c", 2)] {
        store
            .reserve(lock, reserved(ceiling, true), None)
            .await
            .unwrap();
    }
    // A grant's lease record says which epoch was granted: the lock's epoch, never the
    // ceiling reserved above it.
    let lease = crate::LeaseRecord {
        lease_id: "l1".into(),
        lock: "b".into(),
        holder: "h".into(),
        epoch: 2,
        ttl_ms: 5_000,
        value: None,
        lock_delay_ms: None,
        session: None,
    };
    store
        .reserve("b", reserved(1024, true), Some(lease.clone()))
        .await
        .unwrap();
    store
        .reserve(
            "b",
            reserved(1024, true),
            Some(crate::LeaseRecord { epoch: 1, ..lease }),
        )
        .await
        .unwrap();
    let names = |page: Vec<(String, u64)>| page.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(
        store.list_locks(Page::first("", 10)).await.unwrap(),
        [
            ("a/1".to_string(), 0),
            ("a/10".to_string(), 0),
            ("a/2".to_string(), 0),
            ("b".to_string(), 2),
            ("c".to_string(), 0),
            ("legacy".to_string(), 4),
        ]
    );
    // Pages of two by cursor; with a prefix, a cursor before it, inside it, and past it.
    for (page, expected) in [
        (Page::first("", 2), &["a/1", "a/10"][..]),
        (Page::new("", Some("a/10"), 2), &["a/2", "b"]),
        (Page::new("", Some("b"), 2), &["c", "legacy"]),
        (Page::new("", Some("legacy"), 2), &[]),
        (Page::new("a/", Some("0"), 10), &["a/1", "a/10", "a/2"]),
        (Page::new("a/", Some("a/10"), 10), &["a/2"]),
        (Page::new("a/", Some("b"), 10), &[]),
        (Page::first("", 0), &[]),
    ] {
        let found = store.list_locks(page.clone()).await.unwrap();
        assert_eq!(names(found), expected, "{page:?}");
    }

    // One lock's record; idle markers and lower ceilings merge as the writer keeps them.
    store.reserve("b", reserved(10, false), None).await.unwrap();
    assert_eq!(
        store.lock_record("b").await.unwrap(),
        Some((2, reserved(1024, false)))
    );
    assert_eq!(
        store.lock_record("legacy").await.unwrap(),
        Some((
            4,
            Reservation {
                ceiling: 4,
                max_ttl_ms: 0,
                active: false
            }
        ))
    );
    assert_eq!(store.lock_record("never").await.unwrap(), None);
    store.close().await;
}

/// A file as layout 1 left it: data and idempotency records, no counters, no index.
fn write_layout_1(path: &std::path::Path) {
    use crate::redb_backend::schema::{EPOCHS, FENCES, KV, LEASES, META, RESERVATIONS};
    let db = redb::Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        txn.open_table(META)
            .unwrap()
            .insert("format_version", 1)
            .unwrap();
        txn.open_table(EPOCHS).unwrap().insert("ns", 3).unwrap();
        txn.open_table(LEASES).unwrap();
        txn.open_table(RESERVATIONS).unwrap();
        txn.open_table(FENCES)
            .unwrap()
            .insert("ns", (3, 0))
            .unwrap();
        let mut kv = txn.open_table(KV).unwrap();
        kv.insert(("ns", "a"), (1, 3, &b"xyz"[..])).unwrap();
        kv.insert(("ns", "bb"), (2, 3, &b""[..])).unwrap();
        let record = r#"{"fingerprint":"fp","applied":{"revision":2,"epoch":3,"high_water":{"epoch":3,"seq":0}}}"#;
        txn.open_table(IDEMPOTENCY)
            .unwrap()
            .insert(("ns", "req"), record)
            .unwrap();
    }
    txn.commit().unwrap();
}

#[tokio::test]
async fn a_layout_1_file_is_migrated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palisade.redb");
    write_layout_1(&path);
    let clock = Clock::at(5_000_000);
    let options = RedbOptions {
        limits: StoreLimits {
            max_keys_per_namespace: 3,
            idempotency_retention: Duration::from_secs(1),
            ..StoreLimits::default()
        },
        clock: clock.wall(),
        ..super::test_options()
    };
    let store = RedbBackend::open(&path, options.clone()).unwrap();
    // Two keys counted: one more fits, a fourth does not.
    store.apply(op("ns", 3, put("c", "1"))).await.unwrap();
    assert!(matches!(
        store.apply(op("ns", 3, put("d", "1"))).await,
        Err(ApplyError::QuotaExceeded {
            resource: QuotaResource::KeysPerNamespace,
            ..
        })
    ));
    // The old record replays, and its retention started at the migration.
    let replay = store
        .apply(with_key("ns", 3, put("a", "xyz"), "fp"))
        .await
        .unwrap();
    assert_eq!((replay.replayed, replay.revision), (true, 2));
    clock.set(5_001_000);
    assert!(
        !store
            .apply(with_key("ns", 3, Action::Fence, "new"))
            .await
            .unwrap()
            .replayed
    );
    assert_eq!(
        store.high_water("ns").await.unwrap(),
        HighWater { epoch: 3, seq: 0 }
    );
    store.close().await;
    let db = redb::Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    // a "xyz" (4) + bb "" (2) + c "1" (2)
    assert_eq!(
        txn.open_table(USAGE)
            .unwrap()
            .get("ns")
            .unwrap()
            .unwrap()
            .value(),
        (3, 8)
    );
}
