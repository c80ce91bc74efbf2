//! Backup and staged restore on real files.

use std::collections::BTreeSet;
use std::path::Path;

use palisade_core::gate::{GateError, HighWater};
use palisade_core::lock_table::Reservation;

use super::{OfflineDb, OfflineError, RestorePlan, Restored, StagedRestore};
use crate::redb_backend::tests::{grant, lease, op, open, put, value};
use crate::{Action, ApplyError, FencedOp, FencedStore, Idempotency, IssuerLog};

fn with_idem(op: FencedOp) -> FencedOp {
    FencedOp {
        idempotency: Some(Idempotency {
            key: "req-1".to_string(),
            fingerprint: "fp".to_string(),
        }),
        ..op
    }
}

const RESERVED: Reservation = Reservation {
    ceiling: 10,
    max_ttl_ms: 5000,
    active: true,
};

/// A database with two locks, an active reservation, a live lease, data, a fence and an
/// idempotency record.
async fn populated(path: &Path) {
    let store = open(path);
    store.reserve("a", RESERVED, None).await.unwrap();
    grant(&store, lease("l1", "a", 1)).await.unwrap();
    store.remove_lease("l1").await.unwrap();
    grant(&store, lease("l2", "a", 2)).await.unwrap();
    grant(&store, lease("l5", "b", 5)).await.unwrap();
    store
        .apply(with_idem(op("a", 2, put("k", "from-backup"))))
        .await
        .unwrap();
    store.apply(op("b", 5, Action::Fence)).await.unwrap();
    store.close().await;
}

#[tokio::test]
async fn backup_then_restore_raises_counters_and_marks_and_drops_leases() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("palisade.redb");
    let out = dir.path().join("backup.redb");
    populated(&db).await;

    let live = open(&db);
    assert_eq!(
        OfflineDb::open(&db).unwrap_err(),
        OfflineError::Busy {
            path: db.display().to_string()
        }
    );
    live.close().await;

    let offline = OfflineDb::open(&db).unwrap();
    let summary = offline.summary().unwrap();
    assert_eq!(
        summary.locks.into_iter().collect::<Vec<_>>(),
        [("a".to_string(), 10), ("b".to_string(), 5)]
    );
    let info = offline.backup_to(&out, "id-1", 42).unwrap();
    assert_eq!((info.epoch_bound, info.keys, info.namespaces), (10, 1, 2));
    assert_eq!(info.backup_id, "id-1");
    assert!(matches!(
        offline.backup_to(&out, "id-2", 43),
        Err(OfflineError::Io { .. })
    ));
    drop(offline);

    let staging = dir.path().join("staging.redb");
    let staged = StagedRestore::stage(&out, &staging).unwrap();
    assert_eq!(staged.info(), &info);
    let plan = RestorePlan {
        floor: 1000,
        locks: BTreeSet::from(["c".to_string()]),
        restored_at_unix: 50,
        commit_seq: 0,
    };
    let restored = staged.apply(&plan).unwrap();
    assert_eq!(
        restored,
        Restored {
            floor: 1000,
            locks_floored: 3,
            namespaces_fenced: 3,
            leases_dropped: 2,
        }
    );

    let store = open(&staging);
    let issuer = store.load_issuer().await.unwrap();
    assert!(issuer.leases.is_empty(), "{:?}", issuer.leases);
    // Each grant's reservation raised the TTL to its lease's (10 s); all are idle now.
    let idle = Reservation {
        ceiling: 1000,
        max_ttl_ms: 10_000,
        active: false,
    };
    assert_eq!(
        issuer.reservations,
        [("a".to_string(), idle), ("b".to_string(), idle)]
    );
    assert_eq!(
        issuer.epochs,
        [
            ("a".to_string(), 1000),
            ("b".to_string(), 1000),
            ("c".to_string(), 1000)
        ]
    );
    for ns in ["a", "b", "c"] {
        assert_eq!(
            store.high_water(ns).await.unwrap(),
            HighWater {
                epoch: 1000,
                seq: 0
            }
        );
    }
    assert_eq!(
        value(&store, "a", "k").await.as_deref(),
        Some("from-backup")
    );
    // Every token of before the restore is refused; the next epoch is admitted.
    assert_eq!(
        store.apply(op("a", 2, put("k", "stale"))).await,
        Err(ApplyError::Gate(GateError::Stale {
            high_water: 1000,
            epoch: 2
        }))
    );
    store.apply(op("a", 1001, put("k", "new"))).await.unwrap();
    // A namespace and a lock the backup never saw (first used after it was taken) start
    // at the floor too.
    assert_eq!(issuer.epoch_floor, 1000);
    assert_eq!(store.high_water("unseen").await.unwrap().epoch, 1000);
    assert!(matches!(
        store.apply(op("unseen", 999, put("k", "stale"))).await,
        Err(ApplyError::Gate(GateError::Stale {
            high_water: 1000,
            epoch: 999
        }))
    ));
    // Idempotency records survive: a retry is answered with its first outcome.
    let replay = store
        .apply(with_idem(op("a", 2, put("k", "from-backup"))))
        .await
        .unwrap();
    assert!(replay.replayed);
    assert_eq!(value(&store, "a", "k").await.as_deref(), Some("new"));
    store.close().await;
    // The staged file is an ordinary database now: it has no backup record.
    assert!(matches!(
        StagedRestore::stage(&staging, &dir.path().join("again.redb")),
        Err(OfflineError::NotABackup { .. })
    ));
}

#[tokio::test]
async fn bad_backups_and_damaged_files_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging.redb");
    let name = |p: &Path| p.display().to_string();

    let missing = dir.path().join("missing.redb");
    assert_eq!(
        OfflineDb::open(&missing).unwrap_err(),
        OfflineError::Missing {
            path: name(&missing)
        }
    );
    assert!(matches!(
        StagedRestore::stage(&missing, &staging),
        Err(OfflineError::Missing { .. })
    ));

    let garbage = dir.path().join("garbage.redb");
    std::fs::write(&garbage, b"not a database at all".repeat(64)).unwrap();
    match OfflineDb::open(&garbage).unwrap_err() {
        OfflineError::Damaged { path, .. } => assert_eq!(path, name(&garbage)),
        other => panic!("{other:?}"),
    }
    match StagedRestore::stage(&garbage, &staging).map(|_| ()) {
        Err(OfflineError::Damaged { path, .. }) => assert_eq!(path, name(&garbage)),
        other => panic!("{other:?}"),
    }

    // A real backup cut short.
    let db = dir.path().join("palisade.redb");
    let store = open(&db);
    for i in 0..200 {
        let key = format!("key-{i}");
        store
            .apply(op("n", 1, put(&key, &"x".repeat(400))))
            .await
            .unwrap();
    }
    store.close().await;
    let out = dir.path().join("backup.redb");
    OfflineDb::open(&db)
        .unwrap()
        .backup_to(&out, "id", 1)
        .unwrap();
    let len = std::fs::metadata(&out).unwrap().len();
    let cut = dir.path().join("cut.redb");
    std::fs::copy(&out, &cut).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cut)
        .unwrap()
        .set_len(len / 3)
        .unwrap();
    assert!(matches!(
        StagedRestore::stage(&cut, &staging),
        Err(OfflineError::Damaged { .. })
    ));

    // A live database is not a backup.
    assert!(matches!(
        StagedRestore::stage(&db, &staging),
        Err(OfflineError::NotABackup { .. })
    ));
}

#[tokio::test]
async fn a_table_this_code_does_not_know_stops_backup() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("palisade.redb");
    open(&db).close().await;
    {
        let raw = redb::Database::open(&db).unwrap();
        let txn = raw.begin_write().unwrap();
        let later: redb::TableDefinition<&str, u64> =
            redb::TableDefinition::new("issuer_future_table");
        txn.open_table(later).unwrap().insert("a", 7).unwrap();
        txn.commit().unwrap();
    }
    let out = dir.path().join("backup.redb");
    match OfflineDb::open(&db).unwrap().backup_to(&out, "id", 1) {
        Err(OfflineError::Damaged { reason, .. }) => {
            assert!(reason.contains("issuer_future_table"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(!out.exists());
}

/// An online backup holds every write acknowledged before it, whether the write reached
/// the database file in a checkpoint or is still only in the log (and in memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_online_backup_holds_every_acknowledged_write() {
    for checkpoint_rows in [1_000_000, 8] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("palisade.redb");
        let options = crate::redb_backend::RedbOptions {
            checkpoint_rows,
            checkpoint_every: std::time::Duration::from_secs(3600),
            ..crate::redb_backend::tests::test_options()
        };
        let store = crate::redb_backend::RedbBackend::open(&db, options).unwrap();
        for i in 0..60 {
            store
                .apply(op("ns", 1, put(&format!("k{i:02}"), "v")))
                .await
                .unwrap();
        }
        let out = dir.path().join("online.backup");
        let info = store.backup_to(&out, "b1", 1).await.unwrap();
        // Writes after the backup are not in it.
        store.apply(op("ns", 1, put("later", "v"))).await.unwrap();
        assert_eq!(
            (info.keys, info.namespaces),
            (60, 1),
            "{checkpoint_rows}: {info:?}"
        );
        assert!(info.commit_seq >= 60, "{info:?}");
        assert_eq!(super::read_backup_info(&out).unwrap(), info);
        store.close().await;
    }
}
