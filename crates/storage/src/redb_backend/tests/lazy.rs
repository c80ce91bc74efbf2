//! Lazy issuer records (`intake.rs`): they ride with the next commit somebody waits for,
//! in the order they were queued; alone, they get a commit of their own once their linger
//! is over.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{grant, lease, test_options};
use crate::redb_backend::{RedbBackend, RedbOptions};
use crate::{FencedStore, IssuerLog, LazyRecord};

fn lingering(linger: Duration) -> RedbOptions {
    RedbOptions {
        lazy_linger: linger,
        ..test_options()
    }
}

/// A store at `path` with lazy records lingering `linger`.
fn opened(path: &Path, linger: Duration) -> RedbBackend {
    RedbBackend::open(path, lingering(linger)).unwrap()
}

/// The lease records a fresh start finds in the store at `path`, by id.
async fn leases_on_disk(path: &Path) -> Vec<String> {
    let store = RedbBackend::open(path, test_options()).unwrap();
    let state = store.load_issuer().await.unwrap();
    store.close().await;
    let mut ids: Vec<String> = state.leases.into_iter().map(|l| l.lease_id).collect();
    ids.sort_unstable();
    ids
}

#[tokio::test]
async fn lazy_records_ride_with_the_next_waited_commit_in_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palisade.redb");
    // A linger far longer than the test: a lazy record reaches the disk only with a
    // waited commit.
    let store = opened(&path, Duration::from_secs(3600));
    store.record_lazily(LazyRecord::Lease(lease("l1", "a", 1)));
    store.record_lazily(LazyRecord::Lease(lease("l2", "b", 1)));
    store.record_lazily(LazyRecord::Lease(lease("l3", "c", 1)));
    // Nothing wakes the writer for them: a while later, still no commit. (A wait that
    // can only make this pass wrongly, never fail wrongly: a writer woken for each lazy
    // record commits within microseconds.)
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        store.commit_stats().commits,
        0,
        "a lazy record woke the writer"
    );
    // Queued before the removal of l3: applied before it, so l3 ends removed.
    store.remove_lease("l3").await.unwrap();
    assert_eq!(
        store.commit_stats().commits,
        1,
        "three lazy records and a removal: one commit"
    );
    store.close().await;
    assert_eq!(leases_on_disk(&path).await, ["l1", "l2"]);
}

#[tokio::test]
async fn a_lazy_record_alone_gets_a_commit_of_its_own_after_its_linger() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palisade.redb");
    let store = opened(&path, Duration::from_millis(20));
    grant(&store, lease("l1", "a", 1)).await.unwrap();
    let before = store.commit_stats().commits;
    store.record_lazily(LazyRecord::RemoveLease("l1".into()));
    store.record_lazily(LazyRecord::Lease(lease("l2", "b", 1)));
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.commit_stats().commits == before {
        assert!(
            Instant::now() < deadline,
            "the lazy records were never committed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        store.commit_stats().commits,
        before + 1,
        "both in one commit"
    );
    store.close().await;
    assert_eq!(leases_on_disk(&path).await, ["l2"]);
}

#[tokio::test]
async fn closing_commits_the_lazy_records_still_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("palisade.redb");
    let store = opened(&path, Duration::from_secs(3600));
    store.record_lazily(LazyRecord::Lease(lease("l1", "a", 1)));
    store.close().await;
    assert_eq!(leases_on_disk(&path).await, ["l1"]);
}
