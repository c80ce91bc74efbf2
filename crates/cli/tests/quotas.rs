//! Every quota against the real binary: a request over one answers 429 `quota_exceeded`
//! naming the resource and its limit, and changes nothing; room made is room given.

mod common;

use std::time::Duration;

use common::principals::{auth_file, grant, key_of, Api};
use common::{code, Http, Server};
use reqwest::Method;
use serde_json::{json, Value};

const ALL: [&str; 4] = ["acquire", "read", "write", "check"];

fn quota(body: &Value) -> (&str, u64) {
    assert_eq!(code(body), "quota_exceeded", "{body}");
    (
        body["error"]["resource"].as_str().unwrap_or("?"),
        body["error"]["limit"].as_u64().unwrap_or(0),
    )
}

/// The grant `acquire` gets once the full table (`--max-locks max`) has made room, tried
/// every 50 ms at most `tries` times; until then every refusal must be the table's.
async fn granted_once_room_is_made<F, Fut>(tries: usize, max: u64, mut acquire: F) -> Value
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (u16, Value)>,
{
    for _ in 0..tries {
        let (s, b) = acquire().await;
        if s == 200 {
            return b;
        }
        assert_eq!(quota(&b), ("locks", max));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the full table made no room for a new lock in {tries} tries");
}

async fn try_acquire(api: &Api, key: &str, lock: &str, ttl_ms: u64, wait_ms: u64) -> (u16, Value) {
    let (status, body, _) = api
        .send(
            api.req(
                Some(key),
                Method::POST,
                &format!("/v1/locks/{lock}/acquire"),
            )
            .json(&json!({"ttl_ms": ttl_ms, "wait_ms": wait_ms})),
        )
        .await;
    (status, body)
}

/// Acquires with a short TTL, which must be granted.
async fn granted(api: &Api, key: &str, lock: &str) -> Value {
    let (status, body) = try_acquire(api, key, lock, 1000, 0).await;
    assert_eq!(status, 200, "acquire {lock}: {body}");
    body
}

async fn release(api: &Api, key: &str, lease: &Value) {
    let id = lease["lease_id"].as_str().unwrap();
    let (status, body, _) = api
        .send(api.req(Some(key), Method::POST, &format!("/v1/leases/{id}/release")))
        .await;
    assert_eq!(status, 200, "{body}");
}

/// Waits until `lock` has `n` waiters (as seen by `key`).
async fn waiters(api: &Api, key: &str, lock: &str, n: u64) {
    for _ in 0..500 {
        let (_, body, _) = api
            .send(api.req(Some(key), Method::GET, &format!("/v1/locks/{lock}")))
            .await;
        if body["waiters"].as_u64() == Some(n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{lock} never had {n} waiters");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_principal_quotas() {
    let dir = tempfile::tempdir().unwrap();
    let (file, people) = auth_file(
        dir.path(),
        &[
            ("wide", &grant("*", &ALL)),
            (
                "narrow",
                &format!("max_ttl_ms = 1000\nmax_leases = 1\n{}", grant("*", &ALL)),
            ),
            ("patient", &grant("*", &ALL)),
        ],
    );
    let (wide, narrow) = (key_of(&people, "wide"), key_of(&people, "narrow"));
    let patient = key_of(&people, "patient");
    let server = Server::start(&[
        "--auth-file",
        file.to_str().unwrap(),
        "--max-ttl-ms",
        "5000",
        "--max-leases-per-principal",
        "2",
        "--max-waiters-per-principal",
        "1",
    ]);
    let api = Api::new(&server);

    // TTL: the server's ceiling, and a principal's own lower one.
    let (s, b) = try_acquire(&api, &wide, "t", 5001, 0).await;
    assert_eq!((s, quota(&b)), (429, ("ttl_ms", 5000)));
    let (s, b) = try_acquire(&api, &narrow, "t", 1001, 0).await;
    assert_eq!((s, quota(&b)), (429, ("ttl_ms", 1000)));
    let (s, b, _) = api
        .send(api.req(Some(&wide), Method::GET, "/v1/locks/t"))
        .await;
    assert_eq!(
        (s, b["epoch"].as_u64()),
        (200, Some(0)),
        "a refused acquire changed the lock"
    );

    // Live leases: two for everyone, one for `narrow`; a release makes room.
    let a = granted(&api, &wide, "a").await;
    granted(&api, &wide, "b").await;
    let (s, b) = try_acquire(&api, &wide, "c", 1000, 0).await;
    assert_eq!((s, quota(&b)), (429, ("leases_per_principal", 2)));
    granted(&api, &narrow, "n1").await;
    let (s, b) = try_acquire(&api, &narrow, "n2", 1000, 0).await;
    assert_eq!((s, quota(&b)), (429, ("leases_per_principal", 1)));
    let (_, c, _) = api
        .send(api.req(Some(&wide), Method::GET, "/v1/locks/c"))
        .await;
    assert_eq!(c["epoch"], 0, "a refused acquire changed the lock: {c}");
    release(&api, &wide, &a).await;
    let (s, c) = try_acquire(&api, &wide, "c", 1000, 0).await;
    assert_eq!(s, 200, "{c}");

    // Waiting acquisitions: one at a time per principal. `wide` holds `busy`; `patient`
    // waits for it.
    release(&api, &wide, &c).await;
    let (s, b) = try_acquire(&api, &wide, "busy", 5000, 0).await;
    assert_eq!(s, 200, "{b}");
    let first = {
        let (base, key) = (api.base.clone(), patient.clone());
        tokio::spawn(async move {
            let api = Api {
                base,
                http: reqwest::Client::new(),
            };
            try_acquire(&api, &key, "busy", 1000, 3000).await
        })
    };
    waiters(&api, &wide, "busy", 1).await;
    let (s, b) = try_acquire(&api, &patient, "busy", 1000, 3000).await;
    assert_eq!((s, quota(&b)), (429, ("waiters_per_principal", 1)));
    // A principal at its lease limit may not wait either.
    let (s, b) = try_acquire(&api, &narrow, "busy", 1000, 3000).await;
    assert_eq!((s, quota(&b)), (429, ("leases_per_principal", 1)));
    // The first one runs out of patience: a plain 409, and the place is free again.
    let (s, b) = first.await.unwrap();
    assert_eq!((s, code(&b)), (409, "lock_held"), "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_lock_and_per_server_quotas() {
    let server = Server::start(&[
        "--max-waiters-per-lock",
        "2",
        "--max-locks",
        "3",
        "--idle-grace-ms",
        "0",
    ]);
    let http = Http::new(&server.url);
    let acquire = |lock: &str, wait_ms: u64| {
        let req = http
            .client
            .post(format!("{}/v1/locks/{lock}/acquire", server.url))
            .json(&json!({"holder": "h", "ttl_ms": 60_000, "wait_ms": wait_ms}));
        http.send(req)
    };

    // A lock's line holds two.
    let held = http.acquire("line", "h", 60_000).await;
    let mut queued = Vec::new();
    for _ in 0..2 {
        let req = http
            .client
            .post(format!("{}/v1/locks/line/acquire", server.url))
            .json(&json!({"holder": "w", "ttl_ms": 60_000, "wait_ms": 30_000}));
        queued.push(tokio::spawn(req.send()));
    }
    for _ in 0..500 {
        if http.get("/v1/locks/line").await.1["waiters"] == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (s, b) = acquire("line", 30_000).await;
    assert_eq!((s, quota(&b)), (429, ("waiters_per_lock", 2)));

    // Three locks at most in memory: `line` plus two more, all held.
    let two = http.acquire("two", "h", 60_000).await;
    http.acquire("three", "h", 60_000).await;
    let (s, b) = acquire("four", 0).await;
    assert_eq!((s, quota(&b)), (429, ("locks", 3)));
    // Once one lock is released (and idle on disk), a new lock finds room: its first
    // sweep may wait up to a second after a sweep that found nothing.
    let id = two["lease_id"].as_str().unwrap();
    let (s, _) = http.post(&format!("/v1/leases/{id}/release")).await;
    assert_eq!(s, 200);
    let four = granted_once_room_is_made(100, 3, || acquire("four", 0)).await;
    assert!(four["epoch"].as_u64().unwrap() >= 1);
    // The forgotten lock, met again, continues above every epoch it had.
    let (s, b) = acquire("two", 0).await;
    assert_eq!(
        (s, quota(&b)),
        (429, ("locks", 3)),
        "the table is full again"
    );
    let _ = (held, queued);
}

/// The red team's fill: short leases that are never released, only left to expire, fill
/// `--max-locks`. Once they have run out their locks leave the table like released ones,
/// and a new lock name is granted again (it used to be refused for good, 429).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_whose_leases_expired_make_room_in_a_full_table() {
    let server = Server::start(&["--max-locks", "20"]);
    let http = Http::new(&server.url);
    let acquire = |lock: String| {
        let req = http
            .client
            .post(format!("{}/v1/locks/{lock}/acquire", server.url))
            .json(&json!({"holder": "filler", "ttl_ms": 300}));
        http.send(req)
    };
    let mut filled = Vec::new();
    for i in 0..20 {
        let (s, b) = acquire(format!("a{i}")).await;
        assert_eq!(s, 200, "{b}");
        filled.push(b);
    }
    let (s, b) = acquire("newcomer".into()).await;
    assert_eq!((s, quota(&b)), (429, ("locks", 20)));
    // Nobody releases; the leases expire, the locks fall idle (after the idle grace) and
    // a sweep of the full table forgets them.
    let newcomer = granted_once_room_is_made(200, 20, || acquire("newcomer".into())).await;
    assert!(newcomer["epoch"].as_u64().unwrap() >= 1);
    // A forgotten lock, met again, continues above every epoch it had.
    let (s, again) = acquire("a0".into()).await;
    assert_eq!(s, 200, "{again}");
    assert!(
        again["epoch"].as_u64() > filled[0]["epoch"].as_u64(),
        "{again}"
    );
}

#[tokio::test]
async fn namespace_quotas_and_idempotency_retention() {
    let server = Server::start(&[
        "--max-keys-per-namespace",
        "2",
        "--max-bytes-per-namespace",
        "100",
        "--idempotency-retention-s",
        "1",
    ]);
    let http = Http::new(&server.url);
    let lease = http.acquire("ns", "w", 60_000).await;
    let token = lease["token"].as_str().unwrap();
    for k in ["a", "b"] {
        let (s, b) = http.put("ns", k, Some(token), "v").await;
        assert_eq!(s, 200, "{b}");
    }
    let (s, b) = http.put("ns", "c", Some(token), "v").await;
    assert_eq!((s, quota(&b)), (429, ("keys_per_namespace", 2)));
    assert_eq!(http.get_value("ns", "c").await, None);
    // Overwriting a key takes no new key.
    let (s, b) = http.put("ns", "a", Some(token), "w").await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = http.put("ns", "b", Some(token), &"x".repeat(200)).await;
    assert_eq!((s, quota(&b)), (429, ("bytes_per_namespace", 100)));
    assert_eq!(http.get_value("ns", "b").await.as_deref(), Some("v"));

    // An idempotency key is remembered for the retention, then forgotten.
    let put = |value: &str| {
        http.client
            .put(format!("{}/v1/kv/ns/a", server.url))
            .header("Fencing-Token", token)
            .header("Idempotency-Key", "op-1")
            .body(value.to_owned())
    };
    let first = put("one").send().await.unwrap();
    assert_eq!(first.status(), 200);
    let again = put("one").send().await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let (s, b) = http.send(put("two")).await;
    assert_eq!((s, code(&b)), (422, "idempotency_conflict"));
    let mut applied = false;
    for _ in 0..200 {
        if put("two").send().await.unwrap().status() == 200 {
            applied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(applied, "the key was never forgotten");
    assert_eq!(http.get_value("ns", "a").await.as_deref(), Some("two"));
}
