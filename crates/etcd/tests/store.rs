//! The fenced store against a real etcd: the gate rule, preconditions, idempotency, and
//! two epochs racing on one namespace from many tasks on two "nodes" (two clients).

mod support;

use std::sync::Arc;

use palisade_core::gate::{GateError, HighWater, Policy};
use palisade_etcd::EtcdStore;
use palisade_storage::{Action, ApplyError, FencedOp, FencedStore, Idempotency, Precondition};
use support::{op, put, put_if, EtcdMember};

async fn value(store: &EtcdStore, ns: &str, key: &str) -> Option<String> {
    let entry = store.get(ns, key).await.expect("get");
    entry.map(|e| String::from_utf8(e.value.to_vec()).expect("utf-8"))
}

#[tokio::test]
async fn gate_preconditions_idempotency_and_listing() {
    let etcd = EtcdMember::start();
    let store = EtcdStore::new(etcd.connect().await);
    let ns = "orders";
    // fencing.py on the store: old epoch first (S10), newer, stale refused, equal again.
    store.apply(op(ns, 1, put("k", "one"))).await.unwrap();
    let two = store.apply(op(ns, 2, put("k", "two"))).await.unwrap();
    assert_eq!(
        store.apply(op(ns, 1, put("k", "stale"))).await,
        Err(ApplyError::Gate(GateError::Stale {
            high_water: 2,
            epoch: 1
        }))
    );
    assert_eq!(value(&store, ns, "k").await.as_deref(), Some("two"));
    let again = store.apply(op(ns, 2, put("k", "two again"))).await.unwrap();
    assert!(again.revision > two.revision);
    let entry = store.get(ns, "k").await.unwrap().unwrap();
    assert_eq!((entry.revision, entry.epoch), (again.revision, 2));

    // Preconditions against etcd's mod revision.
    assert_eq!(
        store
            .apply(op(ns, 2, put_if("k", "x", Precondition::Absent)))
            .await,
        Err(ApplyError::RevisionMismatch {
            current: Some(again.revision)
        })
    );
    let wrong = Precondition::Revision(again.revision + 1000);
    assert!(store
        .apply(op(ns, 2, put_if("k", "x", wrong)))
        .await
        .is_err());
    let right = Precondition::Revision(again.revision);
    store
        .apply(op(ns, 2, put_if("k", "cas", right)))
        .await
        .unwrap();
    let missing = Action::Delete {
        key: "nope".into(),
        precondition: Precondition::None,
    };
    assert_eq!(
        store.apply(op(ns, 9, missing)).await,
        Err(ApplyError::NotFound)
    );
    assert_eq!(
        store.high_water(ns).await.unwrap().epoch,
        2,
        "a refusal moved the mark"
    );

    // Idempotency: the first outcome replays; another request under the key conflicts.
    let keyed = |action, fingerprint: &str| FencedOp {
        idempotency: Some(Idempotency {
            key: "req-1".into(),
            fingerprint: fingerprint.into(),
        }),
        ..op(ns, 2, action)
    };
    let first = store.apply(keyed(put("paid", "yes"), "fp1")).await.unwrap();
    let replay = store.apply(keyed(put("paid", "yes"), "fp1")).await.unwrap();
    assert!(replay.replayed && !first.replayed);
    assert_eq!(replay.revision, first.revision);
    assert_eq!(
        store.apply(keyed(put("paid", "no"), "fp2")).await,
        Err(ApplyError::IdempotencyConflict)
    );

    // Fence (barrier), then listing in key order with a prefix and a limit.
    let fenced = store.apply(op(ns, 5, Action::Fence)).await.unwrap();
    assert_eq!(fenced.high_water, HighWater { epoch: 5, seq: 0 });
    assert!(store.apply(op(ns, 4, put("late", "x"))).await.is_err());
    for key in ["a/2", "a/1", "b"] {
        store.apply(op(ns, 5, put(key, "v"))).await.unwrap();
    }
    assert_eq!(store.list(ns, "a/", 10).await.unwrap(), ["a/1", "a/2"]);
    assert_eq!(store.list(ns, "", 2).await.unwrap(), ["a/1", "a/2"]);
    assert_eq!(
        store.list("other", "", 10).await.unwrap(),
        Vec::<String>::new()
    );
    let delete = Action::Delete {
        key: "b".into(),
        precondition: Precondition::None,
    };
    store.apply(op(ns, 5, delete)).await.unwrap();
    assert_eq!(value(&store, ns, "b").await, None);

    // Sequence policy: (epoch, seq) must strictly increase.
    let seq = |epoch, seq: Option<u64>| FencedOp {
        seq,
        policy: Policy::Sequence,
        ..op("audit", epoch, put("x", "y"))
    };
    store.apply(seq(1, Some(1))).await.unwrap();
    assert!(matches!(
        store.apply(seq(1, Some(1))).await,
        Err(ApplyError::Gate(GateError::StaleSequence { .. }))
    ));
    assert!(matches!(
        store.apply(seq(1, None)).await,
        Err(ApplyError::Gate(GateError::MissingSequence))
    ));
    store.apply(seq(2, Some(1))).await.unwrap();
}

/// Many tasks on two clients write with epoch 1 and epoch 2 at once, to distinct keys and
/// to one shared key. Whatever the interleaving: ordered by revision, admitted epochs
/// never go down; every refusal is a stale epoch 1 after 2 was admitted; the final mark
/// is 2; and every admitted write to a distinct key is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_epochs_racing_on_one_namespace() {
    let etcd = EtcdMember::start();
    let prefix = format!("/race{}/", support::rand_suffix());
    let nodes = [
        Arc::new(EtcdStore::new(etcd.connect_prefix(&prefix).await)),
        Arc::new(EtcdStore::new(etcd.connect_prefix(&prefix).await)),
    ];
    let ns = "race";
    let mut tasks = Vec::new();
    for task in 0..24usize {
        let store = nodes[task % 2].clone();
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
                    .apply(op(ns, epoch, put(&key, &format!("{epoch}"))))
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
                    high_water,
                    epoch: 1,
                })) => {
                    assert_eq!((high_water, epoch), (2, 1));
                    refused += 1;
                }
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
    let revisions: Vec<u64> = admitted.iter().map(|(r, _, _)| *r).collect();
    assert!(
        revisions.windows(2).all(|w| w[0] < w[1]),
        "two writes share a revision"
    );
    assert_eq!(admitted.len() + refused, 24 * 6);
    assert!(refused > 0 && epochs.contains(&2));
    assert_eq!(nodes[0].high_water(ns).await.unwrap().epoch, 2);
    for (revision, epoch, key) in admitted.iter().filter(|(_, _, k)| k != "shared") {
        let entry = nodes[1]
            .get(ns, key)
            .await
            .unwrap()
            .expect("admitted write present");
        assert_eq!((entry.revision, entry.epoch), (*revision, *epoch), "{key}");
    }
    let last = admitted
        .iter()
        .rev()
        .find(|(_, _, k)| k == "shared")
        .expect("a shared write");
    let shared = nodes[0].get(ns, "shared").await.unwrap().unwrap();
    assert_eq!((shared.revision, shared.epoch), (last.0, last.1));
}

#[tokio::test]
async fn unreachable_etcd_is_a_storage_error_not_a_guess() {
    let etcd = EtcdMember::start();
    let store = EtcdStore::new(etcd.connect().await);
    store.apply(op("n", 1, put("k", "v"))).await.unwrap();
    drop(etcd); // SIGKILL the only member
    let started = std::time::Instant::now();
    match store.apply(op("n", 2, put("k", "w"))).await {
        Err(ApplyError::Storage(_)) => {}
        other => panic!("expected a storage error, got {other:?}"),
    }
    assert!(store.get("n", "k").await.is_err());
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
}

#[tokio::test]
async fn namespaces_page_by_name_with_marks_and_usage() {
    let etcd = EtcdMember::start();
    let client = etcd.connect().await;
    let store = EtcdStore::new(client.clone());
    // "k1" + "one" = 5 bytes.
    store.apply(op("ns-a", 1, put("k1", "one"))).await.unwrap();
    store.apply(op("ns-b", 1, put("k1", "one"))).await.unwrap();
    store.apply(op("ns-b", 3, put("k2", "two"))).await.unwrap();
    store.apply(op("ns-c", 2, Action::Fence)).await.unwrap();
    store.apply(op("ns-d", 1, put("k1", "one"))).await.unwrap();
    store
        .apply(op(
            "ns-d",
            1,
            Action::Delete {
                key: "k1".into(),
                precondition: Precondition::None,
            },
        ))
        .await
        .unwrap();
    store.apply(op("other", 5, put("k", "v"))).await.unwrap();
    // A namespace only ever fenced has no counter here (nothing was counted): null.
    type Row = (String, u64, Option<(u64, u64)>);
    let shown = |page: Vec<palisade_storage::NamespaceSummary>| -> Vec<Row> {
        page.into_iter()
            .map(|n| {
                (
                    n.name,
                    n.high_water.epoch,
                    n.usage.map(|u| (u.keys, u.bytes)),
                )
            })
            .collect()
    };
    let first = shown(store.namespaces("ns-", None, 2).await.unwrap());
    assert_eq!(
        first,
        [
            ("ns-a".into(), 1, Some((1, 5))),
            ("ns-b".into(), 3, Some((2, 10)))
        ]
    );
    let rest = shown(store.namespaces("ns-", Some("ns-b"), 10).await.unwrap());
    assert_eq!(
        rest,
        [("ns-c".into(), 2, None), ("ns-d".into(), 1, Some((0, 0)))]
    );
    assert_eq!(
        store.namespaces("ns-", Some("a"), 10).await.unwrap().len(),
        4
    );
    assert_eq!(store.namespaces("", None, 10).await.unwrap().len(), 5);
    assert!(store.namespaces("zz", None, 10).await.unwrap().is_empty());
    assert!(store.namespaces("", None, 0).await.unwrap().is_empty());
    // More than one etcd transaction's worth of usage reads in one page.
    for i in 0..130 {
        store
            .apply(op(&format!("many-{i:03}"), 1, put("k", "v")))
            .await
            .unwrap();
    }
    let many = store.namespaces("many-", None, 1000).await.unwrap();
    assert_eq!(many.len(), 130);
    assert!(many.iter().all(|n| n.usage.map(|u| u.keys) == Some(1)));
    // After a restore's floor, every mark listed is at least the floor, as `high_water`
    // reads it.
    palisade_etcd::ledger::raise_floor(&client, 9)
        .await
        .unwrap();
    let raised = store.namespaces("ns-", None, 10).await.unwrap();
    assert!(
        raised.iter().all(|n| n.high_water.epoch == 10),
        "{raised:?}"
    );
    assert_eq!(store.high_water("ns-a").await.unwrap().epoch, 10);
}
