//! One epoch per lock, on every route: the holder's token, the acquire and keepalive
//! answers, `GET /v1/locks/{lock}`, the listing `GET /v1/locks?prefix=`, the token check,
//! and `palisade lock status` (the Rust client) all say the same epoch: the holder's, or
//! the last one granted for a free lock; never the reservation's ceiling reserved above
//! it. Before and after a crash.

mod common;

use std::process::Command;

use common::{Http, Server, BIN};
use serde_json::{json, Value};

/// What every route says of `lock`'s epoch: status, listing, and the CLI's status and
/// listing, each with the live lease's epoch (None when free).
async fn epochs_seen(http: &Http, server: &Server, lock: &str) -> Vec<(String, Value, Value)> {
    let mut seen = Vec::new();
    let (status, body) = http.get(&format!("/v1/locks/{lock}")).await;
    assert_eq!(status, 200, "{body}");
    seen.push((
        "status".into(),
        body["epoch"].clone(),
        body["lease_epoch"].clone(),
    ));
    let (status, body) = http.get(&format!("/v1/locks?prefix={lock}")).await;
    assert_eq!(status, 200, "{body}");
    let listed = body["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["lock"] == lock)
        .cloned()
        .unwrap_or_else(|| panic!("{lock} not listed: {body}"));
    seen.push((
        "listing".into(),
        listed["epoch"].clone(),
        listed["lease_epoch"].clone(),
    ));
    for args in [vec!["lock", "status", lock], vec!["lock", "status"]] {
        let out = Command::new(BIN)
            .args(&args)
            .args(["--server", &server.url])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let body: Value = serde_json::from_slice(&out.stdout).unwrap();
        let entry = match body["locks"].as_array() {
            Some(locks) => locks.iter().find(|l| l["lock"] == lock).cloned().unwrap(),
            None => body,
        };
        seen.push((
            args.join(" "),
            entry["epoch"].clone(),
            entry["lease_epoch"].clone(),
        ));
    }
    seen
}

async fn assert_one_epoch(http: &Http, server: &Server, lock: &str, epoch: u64, held: bool) {
    let lease = if held { json!(epoch) } else { Value::Null };
    for (route, seen, seen_lease) in epochs_seen(http, server, lock).await {
        assert_eq!(
            (seen, seen_lease),
            (json!(epoch), lease.clone()),
            "{route} of {lock}"
        );
    }
}

async fn check(http: &Http, token: &Value) -> Value {
    let (status, body) = http
        .post_json("/v1/tokens/check", &json!({ "token": token }))
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_shows_one_epoch_on_every_route_before_and_after_a_crash() {
    let mut server = Server::start(&["--idle-grace-ms", "0"]);
    let http = Http::new(&server.url);

    // Held: the grant reserved epochs up to 1024; every route says 1.
    let first = http.acquire("L", "a", 60_000).await;
    assert_eq!(first["epoch"], 1, "{first}");
    assert_one_epoch(&http, &server, "L", 1, true).await;
    let lease_id = first["lease_id"].as_str().unwrap();
    let (status, renewed) = http.post(&format!("/v1/leases/{lease_id}/keepalive")).await;
    assert_eq!((status, &renewed["epoch"]), (200, &json!(1)), "{renewed}");
    // A fenced write: durable, and the grant's record rides with it.
    let (status, body) = http.put("L", "k", first["token"].as_str(), "v").await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = http.post(&format!("/v1/leases/{lease_id}/release")).await;
    assert_eq!(status, 200);
    // Free: the last one granted.
    assert_one_epoch(&http, &server, "L", 1, false).await;
    let checked = check(&http, &first["token"]).await;
    assert_eq!(
        (&checked["current_epoch"], &checked["current"]),
        (&json!(1), &json!(true)),
        "{checked}"
    );

    // After a crash the records say epoch 1 was granted and the reservation reaches 1024.
    server.crash_and_restart();
    assert_one_epoch(&http, &server, "L", 1, false).await;
    // Grants above 1 may have gone unrecorded before the crash: the token is not called
    // the newest, although the lock's epoch is its own.
    let checked = check(&http, &first["token"]).await;
    assert_eq!(
        (&checked["current_epoch"], &checked["current"]),
        (&json!(1), &json!(false)),
        "{checked}"
    );
    // The next grant goes above the ceiling, and every route says so.
    let second = http.acquire("L", "b", 60_000).await;
    let epoch = second["epoch"].as_u64().unwrap();
    assert!(epoch > 1024, "{second}");
    assert_one_epoch(&http, &server, "L", epoch, true).await;
    let (status, body) = http.put("L", "k", second["token"].as_str(), "w").await;
    assert_eq!(status, 200, "{body}");
    server.crash_and_restart();
    // Its lease is honoured across the crash, with its own epoch.
    assert_one_epoch(&http, &server, "L", epoch, true).await;
    let checked = check(&http, &second["token"]).await;
    assert_eq!(checked["current"], json!(true), "{checked}");
}
