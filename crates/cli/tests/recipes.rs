//! The recipes built on leases, end to end against the real binary, on every topology
//! (one embedded server; with the `etcd` feature, three nodes over an etcd cluster, where
//! consecutive steps go to different nodes):
//!
//! - lock values: given at acquisition, shown by lock status, replaced by their holder
//!   (`proclaim`), refused when malformed or over 4 KiB, and still there after a crash;
//! - per-lock lock-delay: chosen at acquisition within `--max-lock-delay-ms`, shown by
//!   lock status, applied after an expiry and not after a release;
//! - sessions: one keepalive for several locks, which expire together when it stops and
//!   are released together when it is closed;
//! - what a crash does to each (embedded: SIGKILL of the server; etcd: of every node and
//!   one etcd member).

mod common;

use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use common::topology::Topology;
use common::{code, Http};
use palisade_test_support::poll_async as until;
use serde_json::{json, Value};

/// Flags every topology of this file starts with.
const FLAGS: [&str; 2] = ["--max-lock-delay-ms", "20000"];

fn embedded() -> Topology {
    Topology::embedded(&FLAGS)
}

#[cfg(feature = "etcd")]
fn etcd() -> Topology {
    Topology::etcd(&FLAGS)
}

/// One client per node; step `i` talks to node `i`.
struct Nodes(Vec<Http>);

impl Nodes {
    fn of(topology: &Topology) -> Nodes {
        Nodes(topology.urls().iter().map(|u| Http::new(u)).collect())
    }

    fn at(&self, i: usize) -> &Http {
        &self.0[i % self.0.len()]
    }

    async fn post(&self, i: usize, path: &str, body: Value) -> (u16, Value) {
        let http = self.at(i);
        let url = format!("{}{path}", http.base);
        http.send(http.client.post(url).json(&body)).await
    }

    async fn get(&self, i: usize, path: &str) -> (u16, Value) {
        let http = self.at(i);
        http.send(http.client.get(format!("{}{path}", http.base)))
            .await
    }

    async fn acquire(&self, i: usize, lock: &str, body: Value) -> (u16, Value) {
        self.post(i, &format!("/v1/locks/{lock}/acquire"), body)
            .await
    }

    async fn status(&self, i: usize, lock: &str) -> Value {
        let (status, body) = self.get(i, &format!("/v1/locks/{lock}")).await;
        assert_eq!(status, 200, "{body}");
        body
    }
}

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

#[tokio::test]
async fn lock_values_embedded() {
    lock_values(embedded()).await;
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn lock_values_etcd() {
    lock_values(etcd()).await;
}

async fn lock_values(mut topology: Topology) {
    let nodes = Nodes::of(&topology);
    let leader = b"10.0.0.1:7700 term=1";
    let (status, lease) = nodes
        .acquire(
            0,
            "svc",
            json!({"holder": "a", "ttl_ms": 60_000, "value": b64(leader)}),
        )
        .await;
    assert_eq!(status, 200, "{lease}");
    assert_eq!(lease["value"], b64(leader));
    let lease_id = lease["lease_id"].as_str().unwrap().to_owned();
    // Every node shows it.
    for i in 1..=3 {
        let seen = nodes.status(i, "svc").await;
        assert_eq!(
            (seen["holder"].as_str(), seen["value"].as_str()),
            (Some("a"), Some(b64(leader).as_str()))
        );
    }

    // The holder replaces it; the epoch stays.
    let next = b"10.0.0.1:7700 term=1 ready";
    let proclaim = format!("/v1/leases/{lease_id}/proclaim");
    let (status, body) = nodes.post(1, &proclaim, json!({"value": b64(next)})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["epoch"].as_u64(), body["value"].as_str()),
        (Some(1), Some(b64(next).as_str()))
    );
    assert_eq!(nodes.status(2, "svc").await["value"], b64(next));

    // Bad values are refused with a clear code and change nothing.
    let (status, body) = nodes
        .post(2, &proclaim, json!({"value": "not base64!"}))
        .await;
    assert_eq!((status, code(&body)), (400, "bad_request"), "{body}");
    let big = vec![7u8; 4097];
    let (status, body) = nodes.post(0, &proclaim, json!({"value": b64(&big)})).await;
    assert_eq!((status, code(&body)), (413, "payload_too_large"), "{body}");
    assert_eq!(body["error"]["limit"], 4096);
    let (status, body) = nodes
        .acquire(
            1,
            "other",
            json!({"holder": "b", "ttl_ms": 1000, "value": b64(&big)}),
        )
        .await;
    assert_eq!((status, code(&body)), (413, "payload_too_large"), "{body}");
    let (status, body) = nodes.post(1, &proclaim, json!({"valu": "eA=="})).await;
    assert_eq!((status, code(&body)), (400, "bad_request"), "{body}");
    // Exactly 4 KiB is fine.
    let most = vec![1u8; 4096];
    let (status, body) = nodes.post(2, &proclaim, json!({"value": b64(&most)})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = nodes.post(0, &proclaim, json!({"value": b64(next)})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(nodes.status(1, "svc").await["value"], b64(next));

    // A crash: the lease comes back with the value its holder proclaimed (answered
    // after the record carrying it was on disk), and can still be renewed.
    topology.crash_and_restart(0);
    let nodes = Nodes::of(&topology);
    let seen = nodes.status(0, "svc").await;
    assert_eq!(
        (seen["holder"].as_str(), seen["lease_epoch"].as_u64()),
        (Some("a"), Some(1)),
        "{seen}"
    );
    assert_eq!(seen["value"], b64(next), "{seen}");
    let (status, body) = nodes
        .post(1, &format!("/v1/leases/{lease_id}/keepalive"), json!({}))
        .await;
    assert_eq!(status, 200, "{body}");

    // Null clears; a released lease can no longer proclaim.
    let (status, body) = nodes.post(2, &proclaim, json!({"value": null})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(nodes.status(0, "svc").await["value"], Value::Null);
    let (status, _) = nodes
        .post(0, &format!("/v1/leases/{lease_id}/release"), json!({}))
        .await;
    assert_eq!(status, 200);
    let (status, body) = nodes
        .post(1, &proclaim, json!({"value": b64(b"late")}))
        .await;
    assert_eq!((status, code(&body)), (404, "lease_expired"), "{body}");
    let seen = nodes.status(2, "svc").await;
    assert_eq!(
        (seen["holder"].clone(), seen["value"].clone()),
        (Value::Null, Value::Null)
    );
}

#[tokio::test]
async fn per_lock_lock_delay_embedded() {
    per_lock_lock_delay(embedded()).await;
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn per_lock_lock_delay_etcd() {
    per_lock_lock_delay(etcd()).await;
}

async fn per_lock_lock_delay(topology: Topology) {
    let nodes = Nodes::of(&topology);
    // Above the server's maximum: refused, nothing held.
    let (status, body) = nodes
        .acquire(
            0,
            "d",
            json!({"holder": "a", "ttl_ms": 300, "lock_delay_ms": 20_001}),
        )
        .await;
    assert_eq!((status, code(&body)), (429, "quota_exceeded"), "{body}");
    assert_eq!(
        (
            body["error"]["resource"].as_str(),
            body["error"]["limit"].as_u64()
        ),
        (Some("lock_delay_ms"), Some(20_000))
    );
    assert_eq!(nodes.status(1, "d").await["holder"], Value::Null);

    // A lease with a 3 s lock-delay, left to expire.
    let (status, lease) = nodes
        .acquire(
            1,
            "d",
            json!({"holder": "a", "ttl_ms": 300, "lock_delay_ms": 3000}),
        )
        .await;
    assert_eq!(status, 200, "{lease}");
    assert_eq!(lease["lock_delay_ms"], 3000);
    assert_eq!(nodes.status(2, "d").await["lock_delay_ms"], 3000);
    // The moment the lease is gone, the lock is in its lock-delay: refused with no holder.
    let refused = until(Duration::from_secs(15), "the lease expires", || async {
        let (status, body) = nodes
            .acquire(0, "d", json!({"holder": "b", "ttl_ms": 1000}))
            .await;
        assert_ne!(status, 200, "granted with no lock-delay: {body}");
        (body["error"]["holder"].is_null()).then_some(body)
    })
    .await;
    let seen_free_at = Instant::now();
    assert_eq!(code(&refused), "lock_held", "{refused}");
    assert!(
        refused["error"]["retry_after_ms"].as_u64().unwrap() > 0,
        "{refused}"
    );
    // ... and granted once it is over, with the next epoch.
    let next = until(Duration::from_secs(15), "the lock-delay ends", || async {
        let (status, body) = nodes
            .acquire(
                1,
                "d",
                json!({"holder": "b", "ttl_ms": 60_000, "lock_delay_ms": 0}),
            )
            .await;
        (status == 200).then_some(body)
    })
    .await;
    // Its lock-delay kept the lock ungrantable well past the expiry (the first refusal
    // came at most one poll after it, and etcd counts the delay in whole seconds, never
    // less).
    assert!(
        seen_free_at.elapsed() >= Duration::from_millis(2000),
        "{:?}",
        seen_free_at.elapsed()
    );
    assert_eq!(next["epoch"], 2);
    assert_eq!(next["lock_delay_ms"], 0);

    // A release has no lock-delay, whatever the lease chose.
    let (status, c) = nodes
        .acquire(
            2,
            "r",
            json!({"holder": "c", "ttl_ms": 60_000, "lock_delay_ms": 20_000}),
        )
        .await;
    assert_eq!(status, 200, "{c}");
    let id = c["lease_id"].as_str().unwrap();
    let (status, _) = nodes
        .post(0, &format!("/v1/leases/{id}/release"), json!({}))
        .await;
    assert_eq!(status, 200);
    let (status, body) = nodes
        .acquire(1, "r", json!({"holder": "d", "ttl_ms": 1000}))
        .await;
    assert_eq!(status, 200, "{body}");
}

/// A crash does not shorten a lock-delay above the server's default: after the restart
/// the lock waits its reservation's TTL *and* the delay (embedded; etcd keeps the delay
/// lease through any node crash by construction).
#[tokio::test]
async fn a_crash_keeps_a_lock_delay_above_the_default() {
    let mut topology = embedded();
    let nodes = Nodes::of(&topology);
    let (status, lease) = nodes
        .acquire(
            0,
            "k",
            json!({"holder": "a", "ttl_ms": 200, "lock_delay_ms": 6000}),
        )
        .await;
    assert_eq!(status, 200, "{lease}");
    topology.crash_and_restart(0);
    let restarted = Instant::now();
    let nodes = Nodes::of(&topology);
    // Past the TTL (200 ms) the lock is still refused: the 6 s delay counts too.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (status, body) = nodes
        .acquire(0, "k", json!({"holder": "b", "ttl_ms": 1000}))
        .await;
    assert!(
        restarted.elapsed() < Duration::from_millis(6000),
        "the check came too late to mean anything"
    );
    assert_eq!((status, code(&body)), (409, "lock_held"), "{body}");
    let granted = until(
        Duration::from_secs(20),
        "the lock is granted again",
        || async {
            let (status, body) = nodes
                .acquire(0, "k", json!({"holder": "b", "ttl_ms": 1000}))
                .await;
            (status == 200).then_some(body)
        },
    )
    .await;
    assert!(granted["epoch"].as_u64().unwrap() > 1, "{granted}");
}

#[tokio::test]
async fn sessions_embedded() {
    sessions(embedded()).await;
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn sessions_etcd() {
    sessions(etcd()).await;
}

/// A new session of holder `s` (through node 2) holding `locks` (each through the node of
/// its index) with a 10 s lock-delay; its id.
async fn session_holding(nodes: &Nodes, ttl_ms: u64, locks: &[&str]) -> String {
    let (status, session) = nodes
        .post(2, "/v1/sessions", json!({"holder": "s", "ttl_ms": ttl_ms}))
        .await;
    assert_eq!(status, 200, "{session}");
    let id = session["session_id"].as_str().unwrap().to_owned();
    for (i, lock) in locks.iter().enumerate() {
        let (status, body) = nodes
            .acquire(
                i,
                lock,
                json!({"holder": "s", "session": id, "lock_delay_ms": 10_000}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    id
}

/// Closes session `id` through node `i`, which released its two leases.
async fn close_session_of_two(nodes: &Nodes, i: usize, id: &str) {
    let (status, closed) = nodes
        .post(i, &format!("/v1/sessions/{id}/close"), json!({}))
        .await;
    assert_eq!(status, 200, "{closed}");
    assert_eq!(closed["leases"].as_array().unwrap().len(), 2, "{closed}");
}

async fn session_acquire(nodes: &Nodes, i: usize, lock: &str, session: &str) -> Value {
    let (status, body) = nodes
        .acquire(
            i,
            lock,
            json!({"holder": "s", "session": session, "lock_delay_ms": 0}),
        )
        .await;
    assert_eq!(status, 200, "acquire {lock} in {session}: {body}");
    body
}

async fn sessions(mut topology: Topology) {
    let nodes = Nodes::of(&topology);
    let (status, session) = nodes
        .post(0, "/v1/sessions", json!({"holder": "s", "ttl_ms": 2000}))
        .await;
    assert_eq!(status, 200, "{session}");
    let id = session["session_id"].as_str().unwrap().to_owned();
    let ttl = session["ttl_ms"].as_u64().unwrap();
    assert!(ttl >= 2000, "{session}");
    let a = session_acquire(&nodes, 1, "A", &id).await;
    let b = session_acquire(&nodes, 2, "B", &id).await;
    assert_eq!(
        (a["session"].as_str(), a["ttl_ms"].as_u64()),
        (Some(id.as_str()), Some(ttl))
    );
    // A TTL of its own and a session exclude each other.
    let (status, body) = nodes
        .acquire(
            0,
            "C",
            json!({"holder": "s", "session": id, "ttl_ms": 1000}),
        )
        .await;
    assert_eq!((status, code(&body)), (400, "bad_request"), "{body}");
    assert_eq!(nodes.status(0, "A").await["session"], id.as_str());

    // One keepalive renews both, for longer than either lease's own TTL.
    let keepalive = format!("/v1/sessions/{id}/keepalive");
    let until_at = Instant::now() + Duration::from_millis(ttl * 2);
    let mut i = 0;
    while Instant::now() < until_at {
        let (status, body) = nodes.post(i, &keepalive, json!({})).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["leases"].as_array().unwrap().len(), 2, "{body}");
        i += 1;
        tokio::time::sleep(Duration::from_millis(ttl / 4)).await;
    }
    for lock in ["A", "B"] {
        assert_eq!(nodes.status(i, lock).await["holder"], "s", "{lock}");
    }

    // One lock released alone; the other stays, and the session takes another.
    let b_id = b["lease_id"].as_str().unwrap();
    let (status, _) = nodes
        .post(0, &format!("/v1/leases/{b_id}/release"), json!({}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(nodes.status(1, "B").await["holder"], Value::Null);
    let b2 = session_acquire(&nodes, 2, "B", &id).await;
    assert_eq!(b2["epoch"], 2);
    let (status, body) = nodes.get(0, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{body}");
    let mut held: Vec<&str> = body["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["lock"].as_str().unwrap())
        .collect();
    held.sort();
    assert_eq!(held, ["A", "B"]);

    // No more renewals: both locks end together, with the session.
    until(Duration::from_secs(20), "the session expires", || async {
        let a = nodes.status(1, "A").await;
        a["holder"].is_null().then_some(())
    })
    .await;
    assert_eq!(
        nodes.status(2, "B").await["holder"],
        Value::Null,
        "B outlived its session"
    );
    let (status, body) = nodes.post(0, &keepalive, json!({})).await;
    assert_eq!((status, code(&body)), (404, "session_expired"), "{body}");
    let (status, body) = nodes
        .acquire(1, "C", json!({"holder": "s", "session": id}))
        .await;
    assert_eq!((status, code(&body)), (404, "session_expired"), "{body}");

    // A crash: a session comes back with its locks, and can be renewed (its TTL is long
    // enough for the etcd topology's nodes to come back).
    let id = session_holding(&nodes, 15_000, &["X", "Y"]).await;
    topology.crash_and_restart(1);
    let nodes = Nodes::of(&topology);
    let (status, body) = nodes
        .post(0, &format!("/v1/sessions/{id}/keepalive"), json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["leases"].as_array().unwrap().len(), 2, "{body}");
    for lock in ["X", "Y"] {
        assert_eq!(nodes.status(1, lock).await["holder"], "s", "{lock}");
    }
    close_session_of_two(&nodes, 1, &id).await;
    for lock in ["X", "Y"] {
        assert_eq!(nodes.status(2, lock).await["holder"], Value::Null, "{lock}");
    }

    // Closing a session releases its locks at once (no lock-delay), and only them.
    let id = session_holding(&nodes, 60_000, &["P", "Q"]).await;
    let (status, other) = nodes
        .acquire(2, "Z", json!({"holder": "o", "ttl_ms": 60_000}))
        .await;
    assert_eq!(status, 200, "{other}");
    close_session_of_two(&nodes, 0, &id).await;
    for lock in ["P", "Q"] {
        let (status, body) = nodes
            .acquire(1, lock, json!({"holder": "n", "ttl_ms": 1000}))
            .await;
        assert_eq!(status, 200, "{lock} after close: {body}");
    }
    assert_eq!(nodes.status(0, "Z").await["holder"], "o");
    let (status, body) = nodes
        .post(1, &format!("/v1/sessions/{id}/close"), json!({}))
        .await;
    assert_eq!((status, code(&body)), (404, "session_expired"), "{body}");
    // Bad ids are refused before anything is looked up.
    let (status, body) = nodes
        .post(
            0,
            &format!("/v1/sessions/{}/keepalive", "x".repeat(129)),
            json!({}),
        )
        .await;
    assert_eq!((status, code(&body)), (400, "bad_request"), "{body}");
}

/// With authentication on, a session and a lock value belong to the principal that made
/// them (S14): anyone else's proclaim, keepalive, read, close or acquisition in it is 403
/// `permission_denied` and changes nothing; a session is one lease of its principal's
/// quota and each lock in it one more.
#[tokio::test]
async fn sessions_and_values_belong_to_their_principal() {
    use common::principals::{auth_file, grant, key_of, Api};
    use reqwest::Method;

    const ALL: [&str; 4] = ["acquire", "read", "write", "check"];
    let dir = tempfile::tempdir().unwrap();
    let (file, people) = auth_file(
        dir.path(),
        &[
            ("alice", &format!("max_leases = 2\n{}", grant("*", &ALL))),
            ("bob", &grant("*", &ALL)),
            ("reader", &grant("*", &["read"])),
        ],
    );
    let (alice, bob) = (key_of(&people, "alice"), key_of(&people, "bob"));
    let reader = key_of(&people, "reader");
    let server = common::Server::start(&["--auth-file", file.to_str().unwrap()]);
    let api = Api::new(&server);
    let post = |key: &str, path: &str, body: Value| {
        api.send(api.req(Some(key), Method::POST, path).json(&body))
    };

    // Who may not acquire anything may not hold a session.
    let (status, body, _) = post(&reader, "/v1/sessions", json!({"ttl_ms": 5000})).await;
    assert_eq!((status, code(&body)), (403, "permission_denied"), "{body}");
    let (status, session, _) = post(
        &alice,
        "/v1/sessions",
        json!({"ttl_ms": 60_000, "holder": "job"}),
    )
    .await;
    assert_eq!(status, 200, "{session}");
    assert_eq!(session["holder"], "alice/job");
    let id = session["session_id"].as_str().unwrap().to_owned();
    let (status, a, _) = post(
        &alice,
        "/v1/locks/a/acquire",
        json!({"session": id, "value": b64(b"alice")}),
    )
    .await;
    assert_eq!(status, 200, "{a}");
    let lease_id = a["lease_id"].as_str().unwrap().to_owned();

    // Bob can see the value, not touch it, nor the session.
    let (_, seen, _) = api
        .send(api.req(Some(&bob), Method::GET, "/v1/locks/a"))
        .await;
    assert_eq!(
        (seen["value"].as_str(), seen["session"].clone()),
        (Some(b64(b"alice").as_str()), Value::Null),
        "{seen}"
    );
    let (status, body, _) = post(
        &bob,
        &format!("/v1/leases/{lease_id}/proclaim"),
        json!({"value": b64(b"bob")}),
    )
    .await;
    assert_eq!((status, code(&body)), (403, "permission_denied"), "{body}");
    for path in [
        format!("/v1/sessions/{id}/keepalive"),
        format!("/v1/sessions/{id}/close"),
    ] {
        let (status, body, _) = post(&bob, &path, json!({})).await;
        assert_eq!(
            (status, code(&body)),
            (403, "permission_denied"),
            "{path}: {body}"
        );
    }
    let (status, body, _) = api
        .send(api.req(Some(&bob), Method::GET, &format!("/v1/sessions/{id}")))
        .await;
    assert_eq!((status, code(&body)), (403, "permission_denied"), "{body}");
    let (status, body, _) = post(&bob, "/v1/locks/b/acquire", json!({"session": id})).await;
    assert_eq!((status, code(&body)), (403, "permission_denied"), "{body}");
    // Nothing changed.
    let (_, seen, _) = api
        .send(api.req(Some(&alice), Method::GET, "/v1/locks/a"))
        .await;
    assert_eq!(
        (seen["value"].as_str(), seen["session"].as_str()),
        (Some(b64(b"alice").as_str()), Some(id.as_str()))
    );
    let (status, body, _) = api
        .send(api.req(Some(&alice), Method::GET, &format!("/v1/sessions/{id}")))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["leases"].as_array().unwrap().len(), 1);

    // Alice's quota of two leases: the session and its lock.
    let (status, body, _) = post(&alice, "/v1/locks/c/acquire", json!({"ttl_ms": 1000})).await;
    assert_eq!((status, code(&body)), (429, "quota_exceeded"), "{body}");
    assert_eq!(body["error"]["resource"], "leases_per_principal");
    let (status, body, _) = post(&alice, "/v1/sessions", json!({"ttl_ms": 1000})).await;
    assert_eq!((status, code(&body)), (429, "quota_exceeded"), "{body}");
    // Her own close gives both back.
    let (status, body, _) = post(&alice, &format!("/v1/sessions/{id}/close"), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body, _) = post(&alice, "/v1/locks/c/acquire", json!({"ttl_ms": 1000})).await;
    assert_eq!(status, 200, "{body}");
}
