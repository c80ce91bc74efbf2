//! Behaviour of the redb backend beyond the suite every fenced store runs
//! (`crates/storage/tests/fenced_store_suite.rs`): what a revision counts here, and group
//! commit under concurrency. Beside it: durability across reopen and refusal of damaged
//! files ([`durability`]), I/O failures and crashes ([`failures`]), power loss at every
//! fsync ([`power_loss`]) and a property test against a model ([`model`]).

pub(crate) mod disk;
mod durability;
mod failures;
mod handoff;
mod lazy;
mod limits;
mod model;
mod power_loss;
mod resident;
mod rollback;
mod spare;

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;

use palisade_core::gate::{GateError, Policy};
use palisade_core::lock_table::Reservation;

use super::{RedbBackend, RedbOptions};
use crate::{
    Action, Applied, ApplyError, FencedOp, FencedStore, Idempotency, IssuerLog, LeaseRecord,
    Precondition, StorageError,
};

/// A concurrent reader's check of one read of `key`: the revision `got` is not older than
/// the newest acknowledged before the read began (`floor`), nor than what this reader read
/// before (`seen`, which it then becomes).
pub(super) fn never_back(key: usize, got: u64, floor: u64, seen: &mut u64) {
    assert!(
        got >= floor,
        "key {key}: read {got} after {floor} was acknowledged"
    );
    assert!(got >= *seen, "key {key}: read {got} after reading {seen}");
    *seen = got;
}

pub(super) fn op(namespace: &str, epoch: u64, action: Action) -> FencedOp {
    FencedOp {
        namespace: namespace.to_string(),
        epoch,
        seq: None,
        policy: Policy::Epoch,
        idempotency: None,
        action,
    }
}

pub(super) fn put(key: &str, value: &str) -> Action {
    Action::Put {
        key: key.to_string(),
        value: Bytes::from(value.to_string()),
        precondition: Precondition::None,
    }
}

pub(super) fn put_if(key: &str, value: &str, precondition: Precondition) -> Action {
    Action::Put {
        key: key.to_string(),
        value: Bytes::from(value.to_string()),
        precondition,
    }
}

pub(super) fn delete(key: &str) -> Action {
    Action::Delete {
        key: key.to_string(),
        precondition: Precondition::None,
    }
}

pub(super) fn lease(id: &str, lock: &str, epoch: u64) -> LeaseRecord {
    LeaseRecord {
        lease_id: id.to_string(),
        lock: lock.to_string(),
        holder: "worker-1".to_string(),
        epoch,
        ttl_ms: 10_000,
        ..Default::default()
    }
}

/// A grant as the issuer records one that needs the disk: a reservation up to the lease's
/// epoch, with its lease record, answered once durable.
pub(super) async fn grant(store: &RedbBackend, lease: LeaseRecord) -> Result<(), StorageError> {
    let reservation = Reservation {
        ceiling: lease.epoch,
        max_ttl_ms: lease.ttl_ms,
        active: true,
    };
    let lock = lease.lock.clone();
    store.reserve(&lock, reservation, Some(lease)).await
}

/// Options for tests: small log segments (each is zero-filled when made).
pub(super) fn test_options() -> RedbOptions {
    RedbOptions {
        segment_bytes: 256 * 1024,
        ..RedbOptions::default()
    }
}

pub(super) fn open(path: &Path) -> RedbBackend {
    RedbBackend::open(path, test_options()).expect("open a fresh database")
}

/// A store on a simulated disk (see [`disk`]).
pub(super) fn start_on(
    disk: &disk::Disk,
    options: RedbOptions,
) -> Result<RedbBackend, crate::StorageError> {
    let db = redb::Builder::new()
        .create_with_backend(disk.db_file())
        .map_err(|e| crate::StorageError::Failed(e.to_string()))?;
    RedbBackend::start(db, disk.log_dir(), "disk".to_string(), options)
}

pub(super) fn temp_store() -> (tempfile::TempDir, RedbBackend) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(&dir.path().join("palisade.redb"));
    (dir, store)
}

pub(super) async fn value(store: &RedbBackend, ns: &str, key: &str) -> Option<String> {
    let entry = store.get(ns, key).await.expect("get");
    entry.map(|e| String::from_utf8(e.value.to_vec()).expect("utf-8 value"))
}

// The gate, preconditions, idempotency, the sequence policy and listing are the
// behavioural suite's (`palisade_test_support::fenced_store`, run on this store by
// `crates/storage/tests/fenced_store_suite.rs`). Here: what only this store promises.

/// On this store a revision is a count of admitted writes: each write moves it by one,
/// and a refusal, a replay or a fence does not move it; a replay answers exactly the first
/// outcome.
#[tokio::test]
async fn a_revision_counts_admitted_writes_only() {
    let (_dir, store) = temp_store();
    let ns = "orders";
    store.apply(op(ns, 1, put("k", "one"))).await.unwrap();
    store.apply(op(ns, 2, put("k", "two"))).await.unwrap();
    assert!(store.apply(op(ns, 1, put("k", "stale"))).await.is_err());
    store.apply(op(ns, 2, put("k", "two again"))).await.unwrap();
    let applied = store.apply(op(ns, 3, put("k", "newest"))).await.unwrap();
    assert!(store
        .apply(op(ns, 2, put("k", "stale again")))
        .await
        .is_err());
    assert_eq!(applied.revision, 4, "four admitted puts");

    let created = store
        .apply(op("cfg", 1, put_if("a", "1", Precondition::Absent)))
        .await
        .unwrap();
    assert_eq!(created.revision, 5);
    assert!(store
        .apply(op("cfg", 1, put_if("a", "x", Precondition::Revision(99))))
        .await
        .is_err());
    let updated = store
        .apply(op(
            "cfg",
            1,
            put_if("a", "2", Precondition::Revision(created.revision)),
        ))
        .await
        .unwrap();
    assert_eq!(updated.revision, created.revision + 1);
    assert_eq!(
        store.apply(op("cfg", 5, delete("nope"))).await,
        Err(ApplyError::NotFound)
    );
    let deleted = store.apply(op("cfg", 2, delete("a"))).await.unwrap();
    assert_eq!(deleted.revision, updated.revision + 1);
    let fenced = store.apply(op("cfg", 7, Action::Fence)).await.unwrap();
    assert_eq!(fenced.revision, deleted.revision, "a fence writes no data");

    let with_key = |epoch, action, fingerprint: &str| FencedOp {
        idempotency: Some(Idempotency {
            key: "req-1".to_string(),
            fingerprint: fingerprint.to_string(),
        }),
        ..op("pay", epoch, action)
    };
    let first = store
        .apply(with_key(1, put("n", "1"), "fp-a"))
        .await
        .unwrap();
    let again = store
        .apply(with_key(1, put("n", "1"), "fp-a"))
        .await
        .unwrap();
    assert_eq!(
        again,
        Applied {
            replayed: true,
            advanced: false,
            ..first
        }
    );
    let other = store.apply(op("pay", 1, put("m", "x"))).await.unwrap();
    assert_eq!(
        other.revision,
        first.revision + 1,
        "the replay applied nothing"
    );
}

/// A tiny deterministic generator, so the test needs no RNG crate.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_applies_are_group_committed_and_ordered() {
    let (_dir, store) = temp_store();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let ns = format!("ns{}", xorshift(&mut rng) % 5);
        let epoch = 1 + xorshift(&mut rng) % 10;
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let result = store
                .apply(op(&ns, epoch, put(&format!("k{}", i % 7), "v")))
                .await;
            (ns, epoch, result)
        }));
    }
    let mut admitted: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    let mut revisions = Vec::new();
    for task in tasks {
        let (ns, epoch, result) = task.await.expect("task");
        match result {
            Ok(applied) => {
                assert_eq!(applied.epoch, epoch);
                revisions.push(applied.revision);
                admitted
                    .entry(ns)
                    .or_default()
                    .push((applied.revision, epoch));
            }
            Err(ApplyError::Gate(GateError::Stale {
                high_water,
                epoch: e,
            })) => {
                assert!(e < high_water);
            }
            Err(other) => panic!("unexpected answer {other:?}"),
        }
    }
    // Every admitted put got its own revision, 1..=n with no gaps.
    revisions.sort_unstable();
    assert_eq!(revisions, (1..=revisions.len() as u64).collect::<Vec<_>>());
    for (ns, mut writes) in admitted {
        writes.sort_unstable();
        assert!(
            writes.windows(2).all(|w| w[0].1 <= w[1].1),
            "{ns}: admitted epochs went down in revision order: {writes:?}"
        );
        let last = writes.last().expect("non-empty").1;
        assert_eq!(store.high_water(&ns).await.unwrap().epoch, last);
    }
    // Every admitted put went through the writer; a refusal may have been decided before
    // it (on the durable rows in memory) or in its batch, whichever saw the mark first.
    let stats = store.commit_stats();
    let admitted = revisions.len() as u64;
    assert!(
        stats.ops >= admitted && stats.ops <= 200,
        "{} ops through the writer for {admitted} admitted of 200",
        stats.ops
    );
    assert!(stats.commits >= 1 && stats.commits <= stats.ops);
    store.close().await;
}

/// The commit hook hears of every commit with the requests it carried, and the marks
/// that moved say so (`Applied::advanced`).
#[tokio::test]
async fn commits_are_reported_and_advances_flagged() {
    use crate::observe::{CommitHook, CommitObserver, CommitReport};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[derive(Default)]
    struct Seen {
        commits: AtomicUsize,
        requests: AtomicUsize,
    }
    impl CommitObserver for Seen {
        fn committed(&self, report: CommitReport) {
            self.commits.fetch_add(1, Ordering::Relaxed);
            self.requests.fetch_add(report.requests, Ordering::Relaxed);
        }
    }
    let seen = Arc::new(Seen::default());
    let dir = tempfile::tempdir().unwrap();
    let options = RedbOptions {
        commit_hook: CommitHook::new(seen.clone()),
        ..RedbOptions::default()
    };
    let store = RedbBackend::open(&dir.path().join("db.redb"), options).unwrap();
    let first = store.apply(op("ns", 2, put("a", "1"))).await.unwrap();
    let same = store.apply(op("ns", 2, put("b", "1"))).await.unwrap();
    let newer = store.apply(op("ns", 3, Action::Fence)).await.unwrap();
    assert!(store.apply(op("ns", 2, put("c", "1"))).await.is_err());
    assert_eq!(
        (first.advanced, same.advanced, newer.advanced),
        (true, false, true)
    );
    // One request per commit here (each awaited before the next): four commits, the
    // refusal's included.
    assert_eq!(seen.commits.load(Ordering::Relaxed), 4);
    assert_eq!(seen.requests.load(Ordering::Relaxed), 4);
    store.close().await;
}
