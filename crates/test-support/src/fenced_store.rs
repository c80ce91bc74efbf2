//! One behavioural suite for every [`FencedStore`]: the rules a caller may count on,
//! whichever backend holds the data.
//!
//! Each backend runs the whole suite from one line, [`crate::fenced_store_suite!`], with a
//! function that opens a fresh, empty store (the embedded store in
//! `crates/storage/tests/fenced_store_suite.rs`, the etcd store in
//! `crates/etcd/tests/fenced_store_suite.rs`). Every case is a test of its own there, named
//! as the function here. The operation builders ([`op`], [`put`], ...) are defined once,
//! here, for these cases and for each backend's own tests.
//!
//! What a case asserts is the trait's contract, not one backend's arithmetic: revisions
//! grow and name the write, but how far a revision moves (one per write on disk, etcd's
//! own revision over etcd) is left to each backend's own tests, as are what only one
//! backend has (durability across reopen, the purge of expired records, damaged files,
//! unreachable members).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use palisade_api::QuotaResource;
use palisade_core::gate::{GateError, HighWater, Policy};
use palisade_core::page::Page;
use palisade_storage::{
    Action, ApplyError, FencedOp, FencedStore, Idempotency, NamespaceSummary, Precondition,
    StoreLimits, WallClock,
};

/// A store a case works on, with what keeps it alive.
pub struct Opened {
    /// Handles on the same data: one for a store in one process, or several where the
    /// backend has several (etcd: one client per node). Cases spread concurrent writers
    /// over them; none may be empty.
    pub nodes: Vec<Arc<dyn FencedStore>>,
    /// Dropped at the end of the case (a temp dir, an etcd member).
    pub guard: Box<dyn std::any::Any + Send>,
}

impl Opened {
    fn store(&self) -> &dyn FencedStore {
        self.nodes[0].as_ref()
    }

    fn node(&self, i: usize) -> Arc<dyn FencedStore> {
        Arc::clone(&self.nodes[i % self.nodes.len()])
    }
}

/// What a backend gives the suite: an `async fn(StoreLimits, WallClock) -> Opened` that
/// opens a fresh, empty store with those limits and that clock.
pub trait Open: Fn(StoreLimits, WallClock) -> Self::Opening {
    type Opening: Future<Output = Opened>;
}

impl<F, Fut> Open for F
where
    F: Fn(StoreLimits, WallClock) -> Fut,
    Fut: Future<Output = Opened>,
{
    type Opening = Fut;
}

/// A wall clock a case sets by hand, for idempotency retention.
#[derive(Clone)]
pub struct TestClock(Arc<AtomicU64>);

impl TestClock {
    pub fn at(ms: u64) -> TestClock {
        TestClock(Arc::new(AtomicU64::new(ms)))
    }

    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    pub fn wall(&self) -> WallClock {
        let now = Arc::clone(&self.0);
        WallClock::from_fn(move || now.load(Ordering::SeqCst))
    }
}

/// An epoch-policy operation on namespace `ns`, with no sequence and no idempotency key.
pub fn op(ns: &str, epoch: u64, action: Action) -> FencedOp {
    FencedOp {
        namespace: ns.to_owned(),
        epoch,
        seq: None,
        policy: Policy::Epoch,
        idempotency: None,
        action,
    }
}

/// `op` under the sequence policy, with `(epoch, seq)`.
pub fn seq_op(ns: &str, epoch: u64, seq: Option<u64>, action: Action) -> FencedOp {
    FencedOp {
        seq,
        policy: Policy::Sequence,
        ..op(ns, epoch, action)
    }
}

/// `op` carrying idempotency key `key` with the request's `fingerprint`.
pub fn keyed(ns: &str, epoch: u64, key: &str, fingerprint: &str, action: Action) -> FencedOp {
    FencedOp {
        idempotency: Some(Idempotency {
            key: key.to_owned(),
            fingerprint: fingerprint.to_owned(),
        }),
        ..op(ns, epoch, action)
    }
}

/// An unconditional put.
pub fn put(key: &str, value: &str) -> Action {
    put_if(key, value, Precondition::None)
}

/// A put under `precondition`.
pub fn put_if(key: &str, value: &str, precondition: Precondition) -> Action {
    Action::Put {
        key: key.to_owned(),
        value: Bytes::from(value.to_owned()),
        precondition,
    }
}

/// An unconditional delete.
pub fn delete(key: &str) -> Action {
    delete_if(key, Precondition::None)
}

/// A delete under `precondition`.
pub fn delete_if(key: &str, precondition: Precondition) -> Action {
    Action::Delete {
        key: key.to_owned(),
        precondition,
    }
}

/// The value of `key`, as text.
pub async fn value(store: &dyn FencedStore, ns: &str, key: &str) -> Option<String> {
    let entry = store.get(ns, key).await.expect("get");
    entry.map(|e| String::from_utf8(e.value.to_vec()).expect("a utf-8 value"))
}

/// Limits far above what a case writes, a retention of an hour.
fn roomy() -> StoreLimits {
    StoreLimits {
        max_keys_per_namespace: 1_000_000,
        max_bytes_per_namespace: 1 << 30,
        idempotency_retention: Duration::from_secs(3600),
    }
}

async fn open_roomy(open: impl Open) -> Opened {
    open(roomy(), WallClock::system()).await
}

/// The seed's scenario on the store (S8, S10): the old holder's write lands while the
/// store has not seen the new epoch; once it has, the old epoch is refused with the mark
/// and the epoch named, nothing of it lands, and the mark does not move; the holder of the
/// newest epoch writes again at an equal epoch.
pub async fn the_gate_admits_newer_and_equal_epochs_and_refuses_older(open: impl Open) {
    let opened = open_roomy(open).await;
    let store = opened.store();
    let ns = "orders";
    let first = store.apply(op(ns, 1, put("k", "one"))).await.unwrap();
    assert!(first.advanced, "the first write raised the mark");
    let two = store.apply(op(ns, 2, put("k", "two"))).await.unwrap();
    assert!(two.advanced && two.revision > first.revision);
    assert_eq!(
        store.apply(op(ns, 1, put("k", "stale"))).await,
        Err(ApplyError::Gate(GateError::Stale {
            high_water: 2,
            epoch: 1
        }))
    );
    assert_eq!(value(store, ns, "k").await.as_deref(), Some("two"));
    assert_eq!(store.high_water(ns).await.unwrap().epoch, 2);
    let again = store.apply(op(ns, 2, put("k", "two again"))).await.unwrap();
    assert!(!again.advanced && again.revision > two.revision);
    let newest = store.apply(op(ns, 3, put("k", "newest"))).await.unwrap();
    assert_eq!(
        store.apply(op(ns, 2, put("k", "stale again"))).await,
        Err(ApplyError::Gate(GateError::Stale {
            high_water: 3,
            epoch: 2
        }))
    );
    assert_eq!(
        store.high_water(ns).await.unwrap(),
        HighWater { epoch: 3, seq: 0 }
    );
    let entry = store.get(ns, "k").await.unwrap().unwrap();
    assert_eq!(entry.value, Bytes::from("newest"));
    assert_eq!((entry.revision, entry.epoch), (newest.revision, 3));
    // Another namespace has its own mark.
    store.apply(op("other", 1, put("k", "v"))).await.unwrap();
    assert_eq!(
        store.high_water("never").await.unwrap(),
        HighWater::default()
    );
}

/// Preconditions compare the key's revision (absent, or exactly this one); a refused
/// precondition or a delete of a missing key changes nothing, not even the mark.
pub async fn preconditions_compare_the_revision_and_refusals_change_nothing(open: impl Open) {
    let opened = open_roomy(open).await;
    let store = opened.store();
    let ns = "cfg";
    let created = store
        .apply(op(ns, 1, put_if("a", "1", Precondition::Absent)))
        .await
        .unwrap();
    for precondition in [
        Precondition::Absent,
        Precondition::Revision(created.revision + 1000),
    ] {
        assert_eq!(
            store.apply(op(ns, 1, put_if("a", "x", precondition))).await,
            Err(ApplyError::RevisionMismatch {
                current: Some(created.revision)
            })
        );
    }
    assert_eq!(
        store
            .apply(op(ns, 1, put_if("b", "x", Precondition::Revision(1))))
            .await,
        Err(ApplyError::RevisionMismatch { current: None })
    );
    let updated = store
        .apply(op(
            ns,
            1,
            put_if("a", "2", Precondition::Revision(created.revision)),
        ))
        .await
        .unwrap();
    assert!(updated.revision > created.revision);
    assert_eq!(value(store, ns, "a").await.as_deref(), Some("2"));
    assert_eq!(value(store, ns, "b").await, None);

    assert_eq!(
        store.apply(op(ns, 5, delete("nope"))).await,
        Err(ApplyError::NotFound)
    );
    assert_eq!(
        store
            .apply(op(
                ns,
                6,
                delete_if("a", Precondition::Revision(created.revision))
            ))
            .await,
        Err(ApplyError::RevisionMismatch {
            current: Some(updated.revision)
        })
    );
    assert_eq!(
        store.high_water(ns).await.unwrap().epoch,
        1,
        "a refusal moved the mark"
    );
    let deleted = store
        .apply(op(
            ns,
            2,
            delete_if("a", Precondition::Revision(updated.revision)),
        ))
        .await
        .unwrap();
    assert!(deleted.revision > updated.revision);
    assert_eq!(store.get(ns, "a").await.unwrap(), None);
    assert_eq!(store.high_water(ns).await.unwrap().epoch, 2);
}

/// A fence (the barrier) raises the mark and writes no data: the next older write is
/// refused, and a later write's revision is above the fence's.
pub async fn a_fence_raises_the_mark_and_writes_nothing(open: impl Open) {
    let opened = open_roomy(open).await;
    let store = opened.store();
    let ns = "barrier";
    let written = store.apply(op(ns, 1, put("k", "v"))).await.unwrap();
    let fenced = store.apply(op(ns, 5, Action::Fence)).await.unwrap();
    assert!(fenced.advanced && fenced.revision >= written.revision);
    assert_eq!(fenced.high_water, HighWater { epoch: 5, seq: 0 });
    assert_eq!(store.list(ns, Page::first("", 10)).await.unwrap(), ["k"]);
    assert!(matches!(
        store.apply(op(ns, 4, put("late", "x"))).await,
        Err(ApplyError::Gate(GateError::Stale {
            high_water: 5,
            epoch: 4
        }))
    ));
    assert_eq!(value(store, ns, "late").await, None);
    let after = store.apply(op(ns, 5, put("k", "w"))).await.unwrap();
    assert!(after.revision > fenced.revision);
    // A fence of a namespace never written creates its mark.
    store
        .apply(op("only-fenced", 3, Action::Fence))
        .await
        .unwrap();
    assert_eq!(store.high_water("only-fenced").await.unwrap().epoch, 3);
}

/// The first outcome of an idempotency key replays (nothing applied again, even once its
/// epoch is stale); another request under the key is a conflict; keys are per namespace.
pub async fn idempotency_replays_the_first_outcome_and_refuses_another_request(open: impl Open) {
    let opened = open_roomy(open).await;
    let store = opened.store();
    let ns = "pay";
    let first = store
        .apply(keyed(ns, 1, "req-1", "fp-a", put("n", "1")))
        .await
        .unwrap();
    assert!(!first.replayed);
    let again = store
        .apply(keyed(ns, 1, "req-1", "fp-a", put("n", "1")))
        .await
        .unwrap();
    assert!(again.replayed && !again.advanced);
    assert_eq!(
        (again.revision, again.epoch, again.high_water),
        (first.revision, first.epoch, first.high_water)
    );
    let other = store.apply(op(ns, 1, put("m", "x"))).await.unwrap();
    assert!(other.revision > first.revision);
    store.apply(op(ns, 3, Action::Fence)).await.unwrap();
    let late = store
        .apply(keyed(ns, 1, "req-1", "fp-a", put("n", "1")))
        .await
        .unwrap();
    assert!(late.replayed);
    assert_eq!(late.revision, first.revision);
    assert_eq!(
        store
            .apply(keyed(ns, 3, "req-1", "fp-b", put("n", "2")))
            .await,
        Err(ApplyError::IdempotencyConflict)
    );
    assert_eq!(value(store, ns, "n").await.as_deref(), Some("1"));
    let elsewhere = store
        .apply(keyed("other", 1, "req-1", "fp-b", put("n", "z")))
        .await
        .unwrap();
    assert!(!elsewhere.replayed);
}

/// Past its retention (wall-clock time), an idempotency key is forgotten: the next request
/// under it is neither replayed nor refused but applied afresh, and recorded again.
pub async fn an_idempotency_key_is_forgotten_after_its_retention(open: impl Open) {
    let clock = TestClock::at(1_000_000);
    let limits = StoreLimits {
        idempotency_retention: Duration::from_secs(60),
        ..roomy()
    };
    let opened = open(limits, clock.wall()).await;
    let store = opened.store();
    let first = store
        .apply(keyed("a", 1, "req", "fp-1", put("k", "1")))
        .await
        .unwrap();
    clock.set(1_059_999);
    let replay = store
        .apply(keyed("a", 1, "req", "fp-1", put("k", "1")))
        .await
        .unwrap();
    assert_eq!((replay.replayed, replay.revision), (true, first.revision));
    assert_eq!(
        store
            .apply(keyed("a", 1, "req", "fp-2", put("k", "2")))
            .await,
        Err(ApplyError::IdempotencyConflict)
    );
    clock.set(1_060_000);
    let fresh = store
        .apply(keyed("a", 1, "req", "fp-2", put("k", "2")))
        .await
        .unwrap();
    assert!(!fresh.replayed && fresh.revision > first.revision);
    assert_eq!(value(store, "a", "k").await.as_deref(), Some("2"));
    let replay = store
        .apply(keyed("a", 1, "req", "fp-2", put("k", "2")))
        .await
        .unwrap();
    assert_eq!((replay.replayed, replay.revision), (true, fresh.revision));
}

/// The sequence policy: `(epoch, seq)` must strictly increase, and a write without a
/// sequence is refused.
pub async fn the_sequence_policy_needs_a_strictly_greater_pair(open: impl Open) {
    let opened = open_roomy(open).await;
    let store = opened.store();
    store
        .apply(seq_op("q", 1, Some(1), put("k", "v")))
        .await
        .unwrap();
    assert!(matches!(
        store.apply(seq_op("q", 1, Some(1), put("k", "v"))).await,
        Err(ApplyError::Gate(GateError::StaleSequence { .. }))
    ));
    assert_eq!(
        store.apply(seq_op("q", 1, None, put("k", "v"))).await,
        Err(ApplyError::Gate(GateError::MissingSequence))
    );
    store
        .apply(seq_op("q", 1, Some(2), put("k", "v")))
        .await
        .unwrap();
    store
        .apply(seq_op("q", 2, Some(1), put("k", "v")))
        .await
        .unwrap();
    assert_eq!(
        store.high_water("q").await.unwrap(),
        HighWater { epoch: 2, seq: 1 }
    );
}

/// A listing is one namespace's keys in order, by prefix, at most `limit`.
pub async fn a_listing_is_one_namespace_in_key_order(open: impl Open) {
    let opened = open_roomy(open).await;
    let store = opened.store();
    for (ns, key) in [
        ("a", "user/2"),
        ("a", "user/1"),
        ("a", "user/3"),
        ("a", "users"),
        ("a", "v"),
        ("a", "t"),
        ("b", "user/0"),
    ] {
        store.apply(op(ns, 1, put(key, "x"))).await.unwrap();
    }
    assert_eq!(
        store.list("a", Page::first("user/", 10)).await.unwrap(),
        ["user/1", "user/2", "user/3"]
    );
    assert_eq!(
        store.list("a", Page::first("user", 2)).await.unwrap(),
        ["user/1", "user/2"]
    );
    assert_eq!(
        store.list("a", Page::first("", 100)).await.unwrap().len(),
        6
    );
    assert_eq!(
        store.list("b", Page::first("", 100)).await.unwrap(),
        ["user/0"]
    );
    assert!(store
        .list("a", Page::first("user/", 0))
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .list("c", Page::first("", 10))
        .await
        .unwrap()
        .is_empty());
    // The next page starts above the last key of the one before, and stays in the prefix.
    assert_eq!(
        store
            .list("a", Page::new("user", Some("user/2"), 10))
            .await
            .unwrap(),
        ["user/3", "users"]
    );
    assert_eq!(
        store.list("a", Page::new("", Some("t"), 2)).await.unwrap(),
        ["user/1", "user/2"]
    );
    assert!(store
        .list("a", Page::new("user", Some("users"), 10))
        .await
        .unwrap()
        .is_empty());
    store.apply(op("a", 1, delete("v"))).await.unwrap();
    assert_eq!(
        store.list("a", Page::first("", 100)).await.unwrap().len(),
        5
    );
}

/// Many writers with epoch 1 and epoch 2 at once, spread over the store's handles, to
/// distinct keys and one shared key. Whatever the interleaving: in revision order the
/// admitted epochs never go down, no two writes share a revision, every refusal is epoch 1
/// after 2 was admitted, the final mark is 2, and every admitted write is there.
pub async fn two_epochs_racing_on_one_namespace(open: impl Open) {
    let opened = open_roomy(open).await;
    let ns = "race";
    let mut tasks = Vec::new();
    for task in 0..24usize {
        let store = opened.node(task);
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for i in 0..6usize {
                let epoch = 1 + ((task + i) % 2) as u64;
                let key = if i % 3 == 0 {
                    "shared".to_owned()
                } else {
                    format!("t{task}-{i}")
                };
                let result = store
                    .apply(op(ns, epoch, put(&key, &epoch.to_string())))
                    .await;
                outcomes.push((key, epoch, result));
            }
            outcomes
        }));
    }
    let mut admitted = Vec::new();
    let mut refused = 0;
    for task in tasks {
        for (key, epoch, result) in task.await.unwrap() {
            match result {
                Ok(applied) => admitted.push((applied.revision, epoch, key)),
                Err(ApplyError::Gate(GateError::Stale {
                    high_water: 2,
                    epoch: 1,
                })) => refused += 1,
                Err(other) => panic!("unexpected outcome for epoch {epoch}: {other:?}"),
            }
        }
    }
    admitted.sort();
    let epochs: Vec<u64> = admitted.iter().map(|(_, e, _)| *e).collect();
    assert!(
        epochs.windows(2).all(|w| w[0] <= w[1]),
        "epochs went back in revision order: {epochs:?}"
    );
    assert!(
        admitted.windows(2).all(|w| w[0].0 < w[1].0),
        "two writes share a revision"
    );
    assert_eq!(admitted.len() + refused, 24 * 6);
    assert!(refused > 0 && epochs.contains(&2));
    let last_node = opened.node(opened.nodes.len() - 1);
    assert_eq!(opened.store().high_water(ns).await.unwrap().epoch, 2);
    for (revision, epoch, key) in admitted.iter().filter(|(_, _, k)| k != "shared") {
        let entry = last_node
            .get(ns, key)
            .await
            .unwrap()
            .expect("an admitted write is there");
        assert_eq!((entry.revision, entry.epoch), (*revision, *epoch), "{key}");
    }
    let last = admitted
        .iter()
        .rev()
        .find(|(_, _, k)| k == "shared")
        .expect("a shared write");
    let shared = opened.store().get(ns, "shared").await.unwrap().unwrap();
    assert_eq!((shared.revision, shared.epoch), (last.0, last.1));
}

/// Quotas: a write beyond a namespace's keys or bytes is refused with the resource and
/// the limit, and nothing of it lands (not its value, not the newer mark, not its
/// idempotency record); overwrites and deletes move the counters; each namespace has its
/// own; writers racing to fill a namespace land exactly the limit.
pub async fn quotas_refuse_without_writing_and_count_exactly(open: impl Open) {
    let limits = StoreLimits {
        max_keys_per_namespace: 3,
        max_bytes_per_namespace: 20,
        ..roomy()
    };
    let opened = open(limits, WallClock::system()).await;
    let store = opened.store();
    // "k1" + "12345" = 7 bytes each.
    store.apply(op("q", 1, put("k1", "12345"))).await.unwrap();
    store.apply(op("q", 1, put("k2", "12345"))).await.unwrap();
    // 14 + 7 = 21 > 20.
    assert_eq!(
        store
            .apply(keyed("q", 2, "req", "fp", put("k3", "12345")))
            .await,
        Err(ApplyError::QuotaExceeded {
            resource: QuotaResource::BytesPerNamespace,
            limit: 20
        })
    );
    assert_eq!(store.get("q", "k3").await.unwrap(), None);
    assert_eq!(store.high_water("q").await.unwrap().epoch, 1);
    // The same key with another request fits: the refused one was not recorded.
    let fits = store
        .apply(keyed("q", 2, "req", "other", put("k3", "1234")))
        .await
        .unwrap();
    assert!(!fits.replayed);
    // 3 keys, 20 bytes: a fourth key is over the key limit even when empty.
    assert_eq!(
        store.apply(op("q", 2, put("k", ""))).await,
        Err(ApplyError::QuotaExceeded {
            resource: QuotaResource::KeysPerNamespace,
            limit: 3
        })
    );
    store.apply(op("r", 1, put("k1", "12345"))).await.unwrap();
    // Overwrites and deletes move the counters; after a delete there is room again.
    store.apply(op("q", 2, put("k1", "1"))).await.unwrap();
    store.apply(op("q", 2, delete("k2"))).await.unwrap();
    store
        .apply(op("q", 2, put("k4", "123456789")))
        .await
        .unwrap();
    assert!(matches!(
        store.apply(op("q", 2, put("k5", ""))).await,
        Err(ApplyError::QuotaExceeded { .. })
    ));
    let counted: Vec<_> = store
        .namespaces(Page::first("", 10))
        .await
        .unwrap()
        .into_iter()
        .map(|n| (n.name, n.usage.map(|u| (u.keys, u.bytes))))
        .collect();
    // k1 "1" (3) + k3 "1234" (6) + k4 "123456789" (11) = 20 bytes, 3 keys.
    assert_eq!(
        counted,
        [("q".into(), Some((3, 20))), ("r".into(), Some((1, 7)))]
    );

    // Writers racing to fill a fresh namespace, over every handle: exactly the limit lands.
    let mut tasks = Vec::new();
    for i in 0..12 {
        let store = opened.node(i);
        tasks.push(tokio::spawn(async move {
            store
                .apply(op("race", 1, put(&format!("k{i:02}"), "")))
                .await
        }));
    }
    let mut landed = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => landed += 1,
            Err(ApplyError::QuotaExceeded {
                resource: QuotaResource::KeysPerNamespace,
                ..
            }) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(landed, 3);
    assert_eq!(
        store
            .list("race", Page::first("", 100))
            .await
            .unwrap()
            .len(),
        3
    );
}

/// The namespaces listing: pages in name order after `after`, each with its mark and its
/// usage (`None` allowed only where nothing was ever counted: a namespace only fenced).
pub async fn namespaces_page_by_name_with_marks_and_usage(open: impl Open) {
    let opened = open_roomy(open).await;
    let store = opened.store();
    // "k1" + "one" = 5 bytes.
    store.apply(op("ns-a", 1, put("k1", "one"))).await.unwrap();
    store.apply(op("ns-b", 1, put("k1", "one"))).await.unwrap();
    store.apply(op("ns-b", 3, put("k2", "two"))).await.unwrap();
    store.apply(op("ns-c", 2, Action::Fence)).await.unwrap();
    store.apply(op("ns-d", 1, put("k1", "one"))).await.unwrap();
    store.apply(op("ns-d", 1, delete("k1"))).await.unwrap();
    store.apply(op("other", 5, put("k", "v"))).await.unwrap();
    type Row = (String, u64, (u64, u64));
    let shown = |page: Vec<NamespaceSummary>| -> Vec<Row> {
        page.into_iter()
            .map(|n| {
                let usage = n.usage.map_or((0, 0), |u| (u.keys, u.bytes));
                (n.name, n.high_water.epoch, usage)
            })
            .collect()
    };
    let first = store.namespaces(Page::first("ns-", 2)).await.unwrap();
    assert!(first.iter().all(|n| n.usage.is_some()), "{first:?}");
    assert_eq!(
        shown(first),
        [("ns-a".into(), 1, (1, 5)), ("ns-b".into(), 3, (2, 10))]
    );
    let rest = store
        .namespaces(Page::new("ns-", Some("ns-b"), 10))
        .await
        .unwrap();
    assert!(rest[1].usage.is_some(), "a namespace written was counted");
    assert_eq!(
        shown(rest),
        [("ns-c".into(), 2, (0, 0)), ("ns-d".into(), 1, (0, 0))]
    );
    // `after` before the prefix starts at the prefix; no namespace is not an error.
    for (page, count) in [
        (Page::new("ns-", Some("a"), 10), 4),
        (Page::first("", 10), 5),
        (Page::first("zz", 10), 0),
        (Page::first("", 0), 0),
    ] {
        let found = store.namespaces(page.clone()).await.unwrap();
        assert_eq!(found.len(), count, "{page:?}: {found:?}");
    }
}

/// Runs every case of the suite as a test of its own, each on a store opened by `$open`
/// (an `async fn(StoreLimits, WallClock) -> Opened`).
#[macro_export]
macro_rules! fenced_store_suite {
    ($open:path) => {
        $crate::suite_cases!(fenced_store, $open;
            the_gate_admits_newer_and_equal_epochs_and_refuses_older,
            preconditions_compare_the_revision_and_refusals_change_nothing,
            a_fence_raises_the_mark_and_writes_nothing,
            idempotency_replays_the_first_outcome_and_refuses_another_request,
            an_idempotency_key_is_forgotten_after_its_retention,
            the_sequence_policy_needs_a_strictly_greater_pair,
            a_listing_is_one_namespace_in_key_order,
            two_epochs_racing_on_one_namespace,
            quotas_refuse_without_writing_and_count_exactly,
            namespaces_page_by_name_with_marks_and_usage,
        );
    };
}
