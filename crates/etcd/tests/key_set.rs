//! The shared key set against a real etcd: nodes starting together agree on one set
//! (compare-and-create), and racing changes never lose one another (compare-and-swap).

mod support;

use palisade_etcd::EtcdKeySet;
use palisade_token::{KeySetError, KeyState, Signer};
use support::EtcdMember;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_starting_together_agree_on_one_set() {
    let etcd = EtcdMember::start();
    let prefix = format!("/ks{}/", support::rand_suffix());
    let mut starts = Vec::new();
    for _ in 0..8 {
        let client = etcd.connect_prefix(&prefix).await;
        starts.push(tokio::spawn(async move {
            EtcdKeySet::new(client)
                .load_or_create(Some(Signer::generate()), 1)
                .await
        }));
    }
    let mut active = std::collections::HashSet::new();
    for start in starts {
        let stored = start.await.unwrap().unwrap().expect("a set");
        active.insert(stored.set.active().key_id.clone());
    }
    assert_eq!(active.len(), 1, "every node uses the same key: {active:?}");

    // Without a seed, a node only reads.
    let other = EtcdKeySet::new(etcd.connect().await);
    assert_eq!(other.load_or_create(None, 1).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_rotations_are_all_kept_and_refusals_write_nothing() {
    let etcd = EtcdMember::start();
    let prefix = format!("/ks{}/", support::rand_suffix());
    let first = Signer::generate();
    let store = EtcdKeySet::new(etcd.connect_prefix(&prefix).await);
    store
        .load_or_create(Some(first.clone()), 1)
        .await
        .unwrap()
        .unwrap();
    let mut rotations = Vec::new();
    for i in 0..6u64 {
        let node = EtcdKeySet::new(etcd.connect_prefix(&prefix).await);
        rotations.push(tokio::spawn(async move {
            let next = Signer::generate();
            let id = next.key_id().to_owned();
            node.update(|set| set.rotate(next.clone(), 10 + i).map(Some))
                .await
                .map(|r| (id, r))
        }));
    }
    let mut ids = Vec::new();
    for rotation in rotations {
        let (id, outcome) = rotation.await.unwrap().unwrap();
        assert!(outcome.unwrap().is_some());
        ids.push(id);
    }
    let stored = store.read().await.unwrap().unwrap();
    assert_eq!(stored.set.keys().len(), 7, "no rotation lost");
    for id in &ids {
        assert!(stored.set.get(id).is_some());
    }
    assert_eq!(
        stored.set.get(first.key_id()).unwrap().state,
        KeyState::Verifying
    );

    // Refused: the active key; nothing is written.
    let active = stored.set.active().key_id.clone();
    let refused = store.update(|set| set.retire(&active, 99)).await.unwrap();
    assert_eq!(refused, Err(KeySetError::ActiveKey(active.clone())));
    let after = store.read().await.unwrap().unwrap();
    assert_eq!(after.revision, stored.revision);

    // Retiring, then retiring again (nothing to change).
    let retired = store
        .update(|set| set.retire(first.key_id(), 100))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        retired.set.get(first.key_id()).unwrap().state,
        KeyState::Retired
    );
    assert!(retired.revision > stored.revision);
    let again = store.update(|set| set.retire(first.key_id(), 101)).await;
    assert_eq!(again.unwrap(), Ok(None));
}
