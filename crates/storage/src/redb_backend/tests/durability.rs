//! Durability across close and reopen, and refusal of files that must not be served.

use std::path::Path;

use super::{grant, lease, op, open, put, temp_store, value};
use crate::redb_backend::RedbBackend;
use crate::{Action, ApplyError, FencedStore, IssuerLog, StorageError};

#[tokio::test]
async fn durable_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palisade.redb");
    let store = open(&path);
    grant(&store, lease("l1", "jobs", 1)).await.unwrap();
    grant(&store, lease("l2", "jobs", 2)).await.unwrap();
    grant(&store, lease("l3", "mail", 7)).await.unwrap();
    store.remove_lease("l1").await.unwrap();
    store.remove_lease("never-existed").await.unwrap();
    store.apply(op("jobs", 2, put("a", "alpha"))).await.unwrap();
    let last = store.apply(op("jobs", 2, put("b", "beta"))).await.unwrap();
    store.close().await;
    assert_eq!(store.get("jobs", "a").await, Err(StorageError::Closed));
    assert_eq!(
        store.apply(op("jobs", 2, Action::Fence)).await,
        Err(StorageError::Closed.into())
    );
    drop(store);

    let store = open(&path);
    assert_eq!(value(&store, "jobs", "a").await.as_deref(), Some("alpha"));
    assert_eq!(
        store.get("jobs", "b").await.unwrap().unwrap().revision,
        last.revision
    );
    assert_eq!(store.high_water("jobs").await.unwrap().epoch, 2);
    let issuer = store.load_issuer().await.unwrap();
    assert_eq!(
        issuer.epochs,
        [("jobs".to_string(), 2), ("mail".to_string(), 7)]
    );
    let mut ids: Vec<_> = issuer.leases.iter().map(|l| l.lease_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["l2", "l3"]);
    assert_eq!(
        issuer.leases.iter().find(|l| l.lease_id == "l3"),
        Some(&lease("l3", "mail", 7))
    );

    // A grant never lowers the recorded epoch, and the revision counter carries on.
    grant(&store, lease("l4", "mail", 3)).await.unwrap();
    let issuer = store.load_issuer().await.unwrap();
    assert!(issuer.epochs.contains(&("mail".to_string(), 7)));
    let next = store.apply(op("jobs", 2, put("c", "gamma"))).await.unwrap();
    assert_eq!(next.revision, last.revision + 1);
    store.close().await;
}

#[tokio::test]
async fn close_answers_queued_requests() {
    let (_dir, store) = temp_store();
    let pending: Vec<_> = (0..50)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.apply(op("n", 1, put(&format!("k{i}"), "v"))).await })
        })
        .collect();
    tokio::task::yield_now().await;
    store.close().await;
    for task in pending {
        // Each was either queued before close (and committed) or refused as closed.
        match task.await.unwrap() {
            Ok(_) | Err(ApplyError::Storage(StorageError::Closed)) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    store.close().await; // idempotent
}

fn refused_message(path: &Path) -> String {
    match RedbBackend::open(path, super::test_options()) {
        Ok(_) => panic!("{} should have been refused", path.display()),
        Err(StorageError::Failed(message)) => message,
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

#[tokio::test]
async fn damaged_files_are_refused_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();

    let garbage = dir.path().join("garbage.redb");
    std::fs::write(
        &garbage,
        b"this is not a database, just some bytes".repeat(100),
    )
    .unwrap();
    let message = refused_message(&garbage);
    assert!(
        message.contains(&garbage.display().to_string()),
        "{message}"
    );

    let empty = dir.path().join("empty.redb");
    std::fs::write(&empty, b"").unwrap();
    let message = refused_message(&empty);
    assert!(message.contains(&empty.display().to_string()), "{message}");

    // A real database, cut short.
    let truncated = dir.path().join("truncated.redb");
    let store = open(&truncated);
    for i in 0..200 {
        store
            .apply(op("n", 1, put(&format!("key-{i}"), &"x".repeat(500))))
            .await
            .unwrap();
    }
    store.close().await;
    drop(store);
    let len = std::fs::metadata(&truncated).unwrap().len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .unwrap();
    file.set_len(len / 3).unwrap();
    drop(file);
    let message = refused_message(&truncated);
    assert!(
        message.contains(&truncated.display().to_string()),
        "{message}"
    );

    // A real database with a few bytes overwritten in the middle (bit rot).
    let rotten = dir.path().join("rotten.redb");
    let store = open(&rotten);
    for i in 0..200 {
        store
            .apply(op("n", 1, put(&format!("key-{i}"), &"y".repeat(500))))
            .await
            .unwrap();
    }
    store.close().await;
    drop(store);
    let mut bytes = std::fs::read(&rotten).unwrap();
    let needle = b"key-100";
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("key on disk");
    bytes[at..at + needle.len()].copy_from_slice(b"KEY-999");
    std::fs::write(&rotten, &bytes).unwrap();
    let message = refused_message(&rotten);
    assert!(message.contains(&rotten.display().to_string()), "{message}");

    // A valid redb file that Palisade did not write.
    let foreign = dir.path().join("foreign.redb");
    {
        let db = redb::Database::create(&foreign).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let table: redb::TableDefinition<&str, &str> = redb::TableDefinition::new("x");
            txn.open_table(table).unwrap().insert("a", "b").unwrap();
        }
        txn.commit().unwrap();
    }
    let message = refused_message(&foreign);
    assert!(message.contains("not one written by Palisade"), "{message}");
}

#[tokio::test]
async fn a_file_already_open_is_refused() {
    let (dir, store) = temp_store();
    let message = refused_message(&dir.path().join("palisade.redb"));
    assert!(message.contains("palisade.redb"), "{message}");
    store.close().await;
    // Closed: the file is free again.
    open(&dir.path().join("palisade.redb")).close().await;
}
