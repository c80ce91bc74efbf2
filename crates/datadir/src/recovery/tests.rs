//! The start-up check against the ledger: an older database file put in place after a
//! clean stop (so its log holds nothing to notice it by) is refused, because the ledger
//! saw more commits durable than the file holds.

use bytes::Bytes;

use palisade_core::gate::Policy;
use palisade_storage::redb_backend::{RedbBackend, RedbOptions};
use palisade_storage::{Action, FencedOp, FencedStore, Precondition};

use super::{check_and_refresh, refresh};
use crate::DB_FILE;

fn put(epoch: u64, value: &'static str) -> FencedOp {
    FencedOp {
        namespace: "a".into(),
        epoch,
        seq: None,
        policy: Policy::Epoch,
        idempotency: None,
        action: Action::Put {
            key: "k".into(),
            value: Bytes::from_static(value.as_bytes()),
            precondition: Precondition::None,
        },
    }
}

/// What the server does around a run: open, check, serve (`run`), refresh, close.
async fn session<F, Fut>(dir: &std::path::Path, run: F) -> Result<(), String>
where
    F: FnOnce(RedbBackend) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let store =
        RedbBackend::open(&dir.join(DB_FILE), RedbOptions::default()).map_err(|e| e.to_string())?;
    let checked = check_and_refresh(dir, &store).await;
    if checked.is_ok() {
        run(store.clone()).await;
        refresh(dir, &store).await;
    }
    store.close().await;
    checked
}

#[tokio::test]
async fn an_older_database_file_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    session(data, |s| async move {
        s.apply(put(1, "one")).await.unwrap();
    })
    .await
    .unwrap();
    let old = data.join("old.redb");
    std::fs::copy(data.join(DB_FILE), &old).unwrap();
    session(data, |s| async move {
        s.apply(put(2, "two")).await.unwrap();
    })
    .await
    .unwrap();

    // The copy, served as it is, would admit epoch 1 again.
    let stale = tempfile::tempdir().unwrap();
    std::fs::copy(&old, stale.path().join(DB_FILE)).unwrap();
    let served = RedbBackend::open(&stale.path().join(DB_FILE), RedbOptions::default()).unwrap();
    assert!(served.apply(put(1, "stale")).await.is_ok());
    served.close().await;

    // Put in place of the newer file, the server refuses it.
    std::fs::copy(&old, data.join(DB_FILE)).unwrap();
    let refused = session(data, |_| async {}).await.unwrap_err();
    assert!(
        refused.contains("behind the epoch ledger") && refused.contains("commit"),
        "{refused}"
    );
}

/// The ledger file's identity: `store` writes a new file and renames it into place.
fn ledger_inode(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(super::ledger::path(dir)).unwrap().ino()
}

#[tokio::test]
async fn a_start_and_stop_that_change_nothing_leave_the_ledger_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    session(data, |s| async move {
        s.apply(put(3, "three")).await.unwrap();
    })
    .await
    .unwrap();
    let written = ledger_inode(data);
    // At a million locks, rewriting an unchanged ledger costs seconds and tens of MB.
    session(data, |_| async {}).await.unwrap();
    assert_eq!(
        ledger_inode(data),
        written,
        "nothing moved, nothing rewritten"
    );

    session(data, |s| async move {
        s.apply(put(4, "four")).await.unwrap();
    })
    .await
    .unwrap();
    assert_ne!(
        ledger_inode(data),
        written,
        "a new epoch is written at the stop"
    );
    let ledger = super::EpochLedger::load(data).unwrap().unwrap();
    assert_eq!((ledger.locks["a"], ledger.floor), (4, 4));
}
