//! Never roll back silently: a store whose files come back older or damaged after a crash
//! refuses to open, with a message naming the file, instead of serving a state older than
//! what it acknowledged (and admitting a stale epoch again).
//!
//! A crash here is the files as a SIGKILL leaves them: the handle is leaked (its threads
//! idle, nothing is checkpointed or cleaned up) and the data directory is copied.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{op, put, test_options};
use crate::redb_backend::{newest_commit, RedbBackend, RedbOptions};
use crate::{FencedStore, StorageError};

/// No background checkpoint: what is written stays in the log.
fn log_only() -> RedbOptions {
    RedbOptions {
        checkpoint_rows: 1 << 30,
        checkpoint_every: Duration::from_secs(3600),
        ..test_options()
    }
}

fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.path().join(entry.file_name())).unwrap();
    }
    to
}

/// Waits until the store is idle: its spare segment made, everything durable (and, with
/// `checkpointed`, in the database file).
async fn settle(store: &RedbBackend, dir: &Path, checkpointed: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let spare = dir.join("palisade.redb.wal.spare").exists();
        let done = !checkpointed || store.checkpoint_seq() == store.commit_seq();
        if spare && done {
            return;
        }
        assert!(Instant::now() < deadline, "the store never settled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Writes epoch 1 then epoch 2 in namespace "a", then "crashes": returns a copy of the
/// files as the crash left them.
async fn crashed_after_two_epochs(options: RedbOptions) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbBackend::open(&dir.path().join("palisade.redb"), options).unwrap();
    store.apply(op("a", 1, put("k", "one"))).await.unwrap();
    store.apply(op("a", 2, put("k", "two"))).await.unwrap();
    settle(&store, dir.path(), false).await;
    let copy = copy_dir(dir.path());
    std::mem::forget(store);
    copy
}

fn refusal(dir: &Path) -> String {
    match RedbBackend::open(&dir.join("palisade.redb"), log_only()) {
        Ok(store) => panic!("opened: {:?}", store.recovery()),
        Err(StorageError::Failed(message)) => message,
        Err(other) => panic!("unexpected {other:?}"),
    }
}

fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x55;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn a_crash_keeps_every_acknowledged_commit() {
    let copy = crashed_after_two_epochs(log_only()).await;
    let store = RedbBackend::open(&copy.path().join("palisade.redb"), log_only()).unwrap();
    assert_eq!(store.recovery().replayed, 2);
    assert_eq!(store.high_water("a").await.unwrap().epoch, 2);
    assert!(store.apply(op("a", 1, put("k", "stale"))).await.is_err());
    store.close().await;
}

#[tokio::test]
async fn flipped_bytes_in_the_newest_commit_are_refused() {
    for offset in [0u64, 5, 12, 21, 30, 60] {
        let copy = crashed_after_two_epochs(log_only()).await;
        let (segment, at, len): (PathBuf, u64, u64) =
            newest_commit(&copy.path().join("palisade.redb"))
                .unwrap()
                .expect("the crash left commits in the log");
        flip(&segment, at + offset.min(len - 1));
        let message = refusal(copy.path());
        assert!(
            message.contains("damaged") && message.contains(&segment.display().to_string()),
            "offset {offset}: {message}"
        );
    }
}

#[tokio::test]
async fn a_flipped_segment_header_is_refused() {
    for at in [0u64, 9, 26, 33] {
        let copy = crashed_after_two_epochs(log_only()).await;
        let (segment, ..) = newest_commit(&copy.path().join("palisade.redb"))
            .unwrap()
            .unwrap();
        flip(&segment, at);
        let message = refusal(copy.path());
        assert!(message.contains("header"), "byte {at}: {message}");
    }
}

#[tokio::test]
async fn an_older_database_file_beside_a_newer_log_is_refused() {
    // Tiny segments (one record of the values below each), so that the log rolls and
    // checkpoints delete old segments.
    let options = RedbOptions {
        checkpoint_rows: 1,
        segment_bytes: 12 * 1024,
        ..test_options()
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("palisade.redb");
    let store = RedbBackend::open(&db, options.clone()).unwrap();
    store.apply(op("a", 1, put("k", "one"))).await.unwrap();
    settle(&store, dir.path(), true).await;
    let old = dir.path().join("old.copy");
    std::fs::copy(&db, &old).unwrap();
    let big = "x".repeat(6000);
    for _ in 0..4 {
        store.apply(op("a", 2, put("k", &big))).await.unwrap();
        settle(&store, dir.path(), true).await;
    }
    let copy = copy_dir(dir.path());
    std::mem::forget(store);
    std::fs::copy(
        copy.path().join("old.copy"),
        copy.path().join("palisade.redb"),
    )
    .unwrap();
    let message = refusal(copy.path());
    assert!(message.contains("older than its log"), "{message}");
}

#[tokio::test]
async fn damage_to_the_newest_checkpoint_is_refused() {
    // After a clean close everything is in the database file, and redb's commit of the
    // last checkpoint is the newest commit. redb verifies every page checksum at open.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("palisade.redb");
    let store = RedbBackend::open(&db, log_only()).unwrap();
    store.apply(op("a", 1, put("k", "one"))).await.unwrap();
    store.apply(op("a", 2, put("k", "two"))).await.unwrap();
    store.close().await;
    let bytes = std::fs::read(&db).unwrap();
    let needle = b"two";
    let at = bytes
        .windows(needle.len())
        .rposition(|w| w == needle)
        .expect("the value is on disk");
    flip(&db, at as u64);
    let message = refusal(dir.path());
    assert!(message.contains("palisade.redb"), "{message}");
}

#[tokio::test]
async fn flipped_bytes_in_the_database_header_never_serve_an_older_state() {
    // The header holds redb's two commit slots. Checkpoints commit in two phases, so a
    // damaged slot is an error (or a byte that does not matter), never a quiet fall back
    // to the commit before: epoch 1 is never admitted again.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("palisade.redb");
    for epoch in [1, 2] {
        let store = RedbBackend::open(&db, log_only()).unwrap();
        store.apply(op("a", epoch, put("k", "v"))).await.unwrap();
        store.close().await;
    }
    let original = std::fs::read(&db).unwrap();
    let (mut refused, mut served) = (0, 0);
    for at in (0..512).step_by(3) {
        let mut bytes = original.clone();
        bytes[at] ^= 0x55;
        std::fs::write(&db, &bytes).unwrap();
        match RedbBackend::open(&db, log_only()) {
            Err(_) => refused += 1,
            Ok(store) => {
                served += 1;
                let mark = store.high_water("a").await.unwrap().epoch;
                store.close().await;
                assert_eq!(mark, 2, "byte {at}: an older state was served");
            }
        }
    }
    assert!(
        refused > 0 && served > 0,
        "refused {refused}, served {served}"
    );
}
