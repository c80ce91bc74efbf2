//! The fenced store against a real etcd, beyond the suite every fenced store runs
//! (`fenced_store_suite.rs`: the gate, preconditions, idempotency, listings, quotas, two
//! epochs racing over two clients): an unreachable member, and the namespace listing's
//! etcd-specific parts.

mod support;

use palisade_etcd::EtcdStore;
use palisade_storage::{Action, ApplyError, FencedStore, Page};
use palisade_test_support::fenced_store::{op, put};
use support::EtcdMember;

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

/// What the namespace listing does over etcd beyond the suite's case: a namespace only
/// fenced has no counter (`None`), a page reads the usage of more namespaces than one etcd
/// transaction carries, and every mark listed is at least a restore's floor, as
/// `high_water` reads it.
#[tokio::test]
async fn the_namespace_listing_over_etcd() {
    let etcd = EtcdMember::start();
    let client = etcd.connect().await;
    let store = EtcdStore::new(client.clone());
    store.apply(op("ns-a", 1, put("k1", "one"))).await.unwrap();
    store.apply(op("ns-c", 2, Action::Fence)).await.unwrap();
    let listed = store.namespaces(Page::first("ns-", 10)).await.unwrap();
    let usage: Vec<_> = listed
        .iter()
        .map(|n| (n.name.as_str(), n.usage.map(|u| (u.keys, u.bytes))))
        .collect();
    assert_eq!(usage, [("ns-a", Some((1, 5))), ("ns-c", None)]);
    for i in 0..130 {
        store
            .apply(op(&format!("many-{i:03}"), 1, put("k", "v")))
            .await
            .unwrap();
    }
    let many = store.namespaces(Page::first("many-", 1000)).await.unwrap();
    assert_eq!(many.len(), 130);
    assert!(many.iter().all(|n| n.usage.map(|u| u.keys) == Some(1)));
    palisade_etcd::ledger::raise_floor(&client, 9)
        .await
        .unwrap();
    let raised = store.namespaces(Page::first("ns-", 10)).await.unwrap();
    assert!(
        raised.iter().all(|n| n.high_water.epoch == 10),
        "{raised:?}"
    );
    assert_eq!(store.high_water("ns-a").await.unwrap().epoch, 10);
}
