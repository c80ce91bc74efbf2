//! Fail-stop on I/O errors (a disk that breaks on demand) and recovery after a crash (a
//! child process that aborts with writes in flight).

use std::path::Path;

use super::disk::Disk;
use super::{grant, lease, op, open, put, start_on, test_options, value};
use crate::{Action, ApplyError, FencedStore, IssuerLog, StorageError};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn io_failure_fails_the_batch_and_latches() {
    let disk = Disk::default();
    let store = start_on(&disk, test_options()).unwrap();
    store.apply(op("n", 1, put("k", "before"))).await.unwrap();
    assert!(!store.is_failed());

    disk.set_broken(true);
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .apply(op("n", 1, put(&format!("k{i}"), "after")))
                    .await
            })
        })
        .collect();
    for task in tasks {
        match task.await.unwrap() {
            Err(ApplyError::Storage(StorageError::Failed(message))) => {
                assert!(message.contains("disk"), "{message}");
            }
            other => panic!("a write on a broken disk was answered {other:?}"),
        }
    }
    assert!(store.is_failed());

    // Latched: refused even after the disk "recovers", without touching the writer.
    disk.set_broken(false);
    let refused = grant(&store, lease("l", "n", 9)).await;
    assert!(matches!(refused, Err(StorageError::Failed(ref m)) if m.contains("earlier failure")));
    assert!(matches!(
        store.apply(op("n", 2, Action::Fence)).await,
        Err(ApplyError::Storage(StorageError::Failed(_)))
    ));
    store.close().await;
}

const CRASH_DB: &str = "PALISADE_TEST_CRASH_DB";

/// The child half of `recovers_after_a_crash` (the same test binary, run again with
/// [`CRASH_DB`] set): acknowledges writes, then dies abruptly with more in flight.
fn crash_child(path: &std::ffi::OsStr) -> ! {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = open(Path::new(path));
        for epoch in 1..=20 {
            grant(&store, lease(&format!("l{epoch}"), "jobs", epoch))
                .await
                .unwrap();
            store
                .apply(op("jobs", epoch, put(&format!("k{epoch}"), "acked")))
                .await
                .unwrap();
        }
        for i in 0..100 {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .apply(op("jobs", 21, put(&format!("late{i}"), "x")))
                    .await
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    });
    std::process::abort();
}

#[test]
fn recovers_after_a_crash() {
    if let Some(path) = std::env::var_os(CRASH_DB) {
        crash_child(&path);
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(recovers_after_a_crash_parent());
}

async fn recovers_after_a_crash_parent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.redb");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "redb_backend::tests::failures::recovers_after_a_crash",
            "--test-threads=1",
        ])
        .env(CRASH_DB, &path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child was meant to abort");

    // Reopened with full verification: every acknowledged write is there.
    let store = open(&path);
    for epoch in 1..=20 {
        assert_eq!(
            value(&store, "jobs", &format!("k{epoch}")).await.as_deref(),
            Some("acked")
        );
    }
    assert!(store.high_water("jobs").await.unwrap().epoch >= 20);
    let issuer = store.load_issuer().await.unwrap();
    assert_eq!(issuer.epochs, [("jobs".to_string(), 20)]);
    assert_eq!(issuer.leases.len(), 20);
    store
        .apply(op("jobs", 22, put("after", "restart")))
        .await
        .unwrap();
    store.close().await;
}
