//! The source article's `fencing.py` scenario, step by step, over HTTP against the real
//! server binary. Unlike the sequential model, every accepted write here went through
//! the gate inside a durable storage transaction, and every rejection is checked to have
//! changed nothing.
//!
//! The same body runs against every topology: one embedded server, and (with the `etcd`
//! feature) three nodes over an etcd cluster, where consecutive steps go to different
//! nodes, so a write admitted by one node is enforced by the next (S7).

mod common;

use common::topology::Topology;
use common::{code, Http};

#[tokio::test]
async fn fencing_py_scenario_embedded() {
    scenario(&Topology::embedded(&[])).await;
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn fencing_py_scenario_etcd() {
    scenario(&Topology::etcd(&[])).await;
}

async fn scenario(topology: &Topology) {
    // Step n talks to node n (modulo the number of nodes).
    let nodes: Vec<Http> = topology.urls().iter().map(|u| Http::new(u)).collect();
    let node = |i: usize| &nodes[i % nodes.len()];
    let lock = "resource";

    // 1. Two acquisitions give the old leader epoch 1 and the new leader epoch 2.
    let old = node(0).acquire(lock, "old-leader", 200).await;
    assert_eq!(old["epoch"], 1, "{}", topology.name());
    // Let the old leader's lease lapse, as a paused holder's would. (etcd counts TTLs in
    // whole seconds: the answer says what was granted, and the new leader waits in line
    // for the rest.)
    let granted_ms = old["ttl_ms"].as_u64().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(granted_ms + 100)).await;
    let new = node(1)
        .acquire_waiting(lock, "new-leader", 60_000, 10_000)
        .await;
    assert_eq!(new["epoch"], 2);
    let old_token = old["token"].as_str().unwrap();
    let new_token = new["token"].as_str().unwrap();

    // 2. The old leader writes first and is accepted: the store has not seen epoch 2 (S10).
    let (status, body) = node(2)
        .put(lock, "data", Some(old_token), "arrived-before-new-epoch")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["epoch"], 1);
    assert_eq!(node(3).high_water(lock).await, 1);

    // 3. The new leader writes with epoch 2: accepted.
    let (status, body) = node(4)
        .put(lock, "data", Some(new_token), "from-new-leader")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(node(5).high_water(lock).await, 2);

    // 4. The old leader writes again: rejected; value and high-water unchanged.
    let (status, body) = node(6)
        .put(lock, "data", Some(old_token), "must-not-land")
        .await;
    assert_eq!((status, code(&body)), (409, "stale_token"), "{body}");
    assert_eq!(body["error"]["high_water"], 2);
    assert_eq!(body["error"]["epoch"], 1);
    assert_eq!(
        node(7).get_value(lock, "data").await.as_deref(),
        Some("from-new-leader")
    );
    assert_eq!(node(8).high_water(lock).await, 2);

    // 5. The new leader writes again with epoch 2: accepted (equal epochs, S8).
    let (status, _) = node(9)
        .put(lock, "data", Some(new_token), "second-write-in-same-epoch")
        .await;
    assert_eq!(status, 200);
    assert_eq!(node(10).high_water(lock).await, 2);

    // 6. Missing token, the string "2" and the boolean true are all rejected (S12).
    for (token, expected) in [
        (None, "missing_token"),
        (Some("2"), "invalid_token"),
        (Some("true"), "invalid_token"),
    ] {
        let (status, body) = node(11).put(lock, "data", token, "must-not-land").await;
        assert_eq!(
            (status, code(&body)),
            (400, expected),
            "token {token:?}: {body}"
        );
        assert_eq!(
            node(12).get_value(lock, "data").await.as_deref(),
            Some("second-write-in-same-epoch"),
            "state changed after rejecting {token:?}"
        );
        assert_eq!(node(13).high_water(lock).await, 2);
    }

    // 7. A third acquisition gives epoch 3; its write is accepted; epoch 2 is now rejected.
    node(14).release(&new).await;
    let third = node(17).acquire(lock, "third-leader", 60_000).await;
    assert_eq!(third["epoch"], 3);
    let (status, _) = node(18)
        .put(lock, "data", third["token"].as_str(), "newest")
        .await;
    assert_eq!(status, 200);
    let (status, body) = node(19)
        .put(lock, "data", Some(new_token), "must-not-land")
        .await;
    assert_eq!((status, code(&body)), (409, "stale_token"));
    assert_eq!(body["error"]["high_water"], 3);

    // 8. Final state: high-water 3, value "newest".
    assert_eq!(node(20).high_water(lock).await, 3);
    assert_eq!(
        node(21).get_value(lock, "data").await.as_deref(),
        Some("newest")
    );
}
