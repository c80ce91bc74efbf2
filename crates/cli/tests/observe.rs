//! Seeing it work, against the real binary: `/metrics` counters move by exactly what a
//! scripted sequence did, the events stream shows the same sequence in order, resumes
//! after a reconnect and resets for an id it no longer holds, streams and metrics follow
//! the auth file (one principal cannot take every stream; a reload that removes or
//! changes a principal ends its streams), and a backup taken over the API under write
//! load restores with the recovery rules intact.

mod common;
mod offline;

use std::time::Duration;

use palisade_client::LockEvent;
use serde_json::Value;

use common::events::{delta, describe, follow, next_event, samples, scrape, until_streams_open};
use common::principals::{auth_file, digest, grant, Api};
use common::{code, Http, Server, Signal};

/// acquire (a), write, expiry, acquire (b), write, stale write (a), release (b): each
/// counter moves by exactly its share, and the events come in that order. A reconnect
/// resumes where it left off; an id the server no longer holds gives `reset`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_and_events_follow_a_scripted_sequence() {
    // A ring of 4: the test's seven events overflow it.
    let server = Server::start(&["--events-buffer", "4"]);
    let http = Http::new(&server.url);
    let client = palisade_client::Client::new(&server.url).unwrap();
    let before = scrape(&http).await;
    let mut stream = follow(client.watch("L").unwrap());
    // The stream is open once the server counts it.
    until_streams_open(1.0, || scrape(&http)).await;

    let a = http.acquire("L", "a", 300).await;
    let token_a = a["token"].as_str().unwrap().to_owned();
    assert_eq!(http.put("L", "k", Some(&token_a), "1").await.0, 200);
    // Waits in line until a's lease expires, then gets the lock.
    let b = http.acquire_waiting("L", "b", 60_000, 10_000).await;
    let token_b = b["token"].as_str().unwrap().to_owned();
    assert_eq!(http.put("L", "k", Some(&token_b), "2").await.0, 200);
    let (status, body) = http.put("L", "k", Some(&token_a), "late").await;
    assert_eq!((status, code(&body)), (409, "stale_token"));
    http.release(&b).await;

    let mut seen = Vec::new();
    for _ in 0..7 {
        seen.push(next_event(&mut stream).await);
    }
    let described: Vec<String> = seen.iter().map(describe).collect();
    assert_eq!(
        described,
        [
            "granted 1 a",
            "fenced 1",
            "expired 1 a",
            "granted 2 b",
            "fenced 2",
            "rejected stale_token Some(1) Some(2)",
            "released 2 b release",
        ]
    );
    let ids: Vec<u64> = seen.iter().map(LockEvent::id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");

    let after = scrape(&http).await;
    for (name, expected) in [
        ("palisade_grants_total", 2.0),
        ("palisade_fenced_writes_total", 2.0),
        (
            "palisade_fenced_rejections_total{code=\"stale_token\"}",
            1.0,
        ),
        ("palisade_expiries_total", 1.0),
        ("palisade_releases_total", 1.0),
    ] {
        assert_eq!(delta(&before, &after, name), expected, "{name}");
    }
    assert_eq!(after.get("palisade_leases_live"), Some(&0.0));
    assert_eq!(after.get("palisade_waiters"), Some(&0.0));
    assert!(after["palisade_commit_batch_size_count"] > before["palisade_commit_batch_size_count"]);
    assert!(
        after["palisade_fsync_duration_seconds_count"]
            > before["palisade_fsync_duration_seconds_count"]
    );
    assert!(after.keys().any(|k| k
        .starts_with("palisade_request_duration_seconds_count{route=\"/v1/kv/{lock}/{*key}\"}")));
    assert!(after
        .get("process_resident_memory_bytes")
        .is_some_and(|v| *v > 0.0));
    assert!(after.get("process_open_fds").is_some_and(|v| *v > 0.0));
    assert!(after
        .keys()
        .any(|k| k.starts_with("palisade_build_info{version=")));
    assert!(
        !after.keys().any(|k| k.contains("\"L\"")),
        "no label carries a lock name"
    );
    drop(stream);

    // A reconnect after the third event gets the other four, exactly.
    let mut resumed = follow(client.watch_from("L", Some(ids[2])).unwrap());
    let mut rest = Vec::new();
    for _ in 0..4 {
        rest.push(next_event(&mut resumed).await);
    }
    assert_eq!(rest, seen[3..]);
    drop(resumed);

    // The first event is no longer held (the ring keeps 4): reset, then live events.
    let mut too_old = follow(client.watch_from("L", Some(ids[0])).unwrap());
    let reset = next_event(&mut too_old).await;
    assert!(
        matches!(&reset, LockEvent::Reset { reason, .. } if reason == "unknown_last_event_id"),
        "{reset:?}"
    );
    assert_eq!(reset.id(), ids[6], "a reset resumes after the newest event");
    let c = http.acquire("L", "c", 60_000).await;
    assert_eq!(describe(&next_event(&mut too_old).await), "granted 3 c");
    assert_eq!(c["epoch"], 3);
}

/// With an auth file: `/metrics` needs the `metrics` verb (any lock pattern) or admin;
/// a stream shows only the locks its principal may read or acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_streams_follow_the_auth_file() {
    let dir = tempfile::tempdir().unwrap();
    let (file, who) = auth_file(
        dir.path(),
        &[
            ("prom", &grant("nothing-here", &["metrics"])),
            ("worker", &grant("*", &["acquire", "read", "write"])),
            ("alice", &grant("a*", &["read"])),
            ("root", "admin = true"),
        ],
    );
    let server = Server::start(&["--auth-file", file.to_str().unwrap()]);
    let api = Api::new(&server);
    let (prom, worker, alice, root) = (&who[0].key, &who[1].key, &who[2].key, &who[3].key);
    let get = |key: Option<&str>| api.req(key, reqwest::Method::GET, "/metrics");
    assert_eq!(api.send(get(None)).await.0, 401);
    let (status, body, _) = api.send(get(Some(worker))).await;
    assert_eq!((status, code(&body)), (403, "permission_denied"));
    assert_eq!(api.send(get(Some(prom))).await.0, 200);
    assert_eq!(api.send(get(Some(root))).await.0, 200);
    // A principal who may see no lock at all gets no stream.
    let (status, _, _) = api
        .send(api.req(Some(prom), reqwest::Method::GET, "/v1/events"))
        .await;
    assert_eq!(status, 403);
    let (status, _, _) = api
        .send(api.req(Some(alice), reqwest::Method::GET, "/v1/locks/b1/events"))
        .await;
    assert_eq!(status, 403);

    // Alice's stream of every lock: she may read a*, so she sees a1 and not b1.
    let resp = api
        .req(Some(alice), reqwest::Method::GET, "/v1/events")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    until_streams_open(1.0, || async {
        samples(
            &api.text(api.req(Some(root), reqwest::Method::GET, "/metrics"))
                .await,
        )
    })
    .await;
    for lock in ["b1", "a1"] {
        let (status, body, _) = api
            .send(
                api.req(
                    Some(worker),
                    reqwest::Method::POST,
                    &format!("/v1/locks/{lock}/acquire"),
                )
                .json(&serde_json::json!({"ttl_ms": 60_000})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let first = first_sse_data(resp).await;
    assert_eq!(first["type"], "granted");
    assert_eq!(first["lock"], "a1", "b1's grant is not alice's to see");
    assert_eq!(first["holder"], "worker");
}

/// The `data` of the first event of an SSE response.
async fn first_sse_data(mut resp: reqwest::Response) -> Value {
    let mut text = String::new();
    let read = async {
        loop {
            let chunk = resp.chunk().await.unwrap().expect("stream open");
            text.push_str(&String::from_utf8_lossy(&chunk));
            if let Some(data) = text
                .split("\n\n")
                .filter(|block| text.contains(&format!("{block}\n\n")))
                .find_map(|block| block.lines().find_map(|l| l.strip_prefix("data: ")))
            {
                return serde_json::from_str::<Value>(data).unwrap();
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("an event within 20 s")
}

/// A backup taken over the API while a writer keeps writing: the server answers
/// throughout, the backup holds every write acknowledged before it began, and restoring
/// it (server stopped) keeps the recovery rules: no epoch issued again, no token from
/// before the restore admitted, acknowledged data intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_serving_restores_safely() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = dir.path().join("online.backup");
    let mut server = Server::start_in(&data, 0, &["--idle-grace-ms", "0"]).unwrap();
    let http = Http::new(&server.url);
    let lease = http.acquire("W", "writer", 60_000).await;
    let token = lease["token"].as_str().unwrap().to_owned();

    // The writer: keys w0, w1, ... until told to stop; returns how many were acknowledged.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (http, token, stop) = (Http::new(&server.url), token.clone(), stop.clone());
        tokio::spawn(async move {
            let mut acked = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (status, body) = http.put("W", &format!("w{acked}"), Some(&token), "v").await;
                assert_eq!(status, 200, "a write during the backup: {body}");
                acked += 1;
            }
            acked
        })
    };
    // Some writes before the backup starts.
    while http.get_value("W", "w20").await.is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let acked_before = {
        let mut n = 20;
        while http.get_value("W", &format!("w{}", n + 1)).await.is_some() {
            n += 1;
        }
        n + 1
    };
    let url = server.url.clone();
    let out_arg = out.display().to_string();
    let backup = tokio::task::spawn_blocking(move || {
        offline::palisade(
            &["admin", "backup", "--server", &url, "--out", &out_arg],
            Duration::from_secs(60),
        )
    })
    .await
    .unwrap();
    assert!(backup.success, "backup failed: {}", backup.stderr);
    let info = backup.json();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked = writer.await.unwrap();
    assert!(
        acked > acked_before,
        "the writer kept going during the backup"
    );
    assert!(info["keys"].as_u64().unwrap() >= acked_before);
    assert!(info["epoch_bound"].as_u64().unwrap() >= 1);

    // After the backup: a newer holder fences the old one out.
    let newer = {
        http.release(&lease).await;
        http.acquire("W", "newer", 60_000).await
    };
    let newer_epoch = newer["epoch"].as_u64().unwrap();
    let newer_token = newer["token"].as_str().unwrap().to_owned();
    assert_eq!(http.put("W", "after", Some(&newer_token), "x").await.0, 200);
    server.signal(Signal::SIGTERM);
    assert!(server.wait_exit(Duration::from_secs(30)).is_some());

    let restored = offline::restore(&data, &out, &[]);
    assert!(restored.success, "restore failed: {}", restored.stderr);
    let server = Server::start_in(&data, 0, &["--idle-grace-ms", "0"]).unwrap();
    let http = Http::new(&server.url);
    for i in 0..acked_before {
        assert_eq!(
            http.get_value("W", &format!("w{i}")).await.as_deref(),
            Some("v"),
            "w{i} was acknowledged before the backup began"
        );
    }
    // Neither the old holder's token nor the newer one's is admitted after the restore.
    for t in [&token, &newer_token] {
        let (status, body) = http.put("W", "late", Some(t), "x").await;
        assert_eq!((status, code(&body)), (409, "stale_token"), "{body}");
    }
    // Epochs continue above everything issued, also what was issued after the backup.
    let again = http.acquire("W", "again", 60_000).await;
    assert!(again["epoch"].as_u64().unwrap() > newer_epoch);
}

/// Writes an auth file naming these principals by (name, key, extra TOML lines).
fn write_auth(path: &std::path::Path, principals: &[(&str, &str, &str)]) {
    let mut text = String::new();
    for (name, key, body) in principals {
        text.push_str(&format!(
            "[[principal]]\nname = \"{name}\"\nkey_sha256 = \"{}\"\n{body}\n\n",
            digest(key)
        ));
    }
    std::fs::write(path, text).unwrap();
}

/// Opens an events stream of every lock for `key`: its status and, on 200, its body.
async fn open_stream(api: &Api, key: &str) -> (u16, Option<reqwest::Response>, Value) {
    let resp = api
        .req(Some(key), reqwest::Method::GET, "/v1/events")
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    if status == 200 {
        return (status, Some(resp), Value::Null);
    }
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, None, body)
}

/// The red team's hog: one principal with a `read` grant opened every one of the server's
/// streams and every other principal got 429. Each principal now has its own share
/// (`--max-event-subscribers-per-principal`, or its own `max_event_subscribers`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_principal_cannot_take_every_events_stream() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.toml");
    let read = grant("*", &["read"]);
    write_auth(
        &file,
        &[
            ("hog", "key-of-hog", &read),
            ("other", "key-of-other", &read),
            (
                "big",
                "key-of-big",
                &format!("max_event_subscribers = 3\n{read}"),
            ),
        ],
    );
    let server = Server::start(&[
        "--auth-file",
        file.to_str().unwrap(),
        "--max-event-subscribers",
        "7",
        "--max-event-subscribers-per-principal",
        "2",
    ]);
    let api = Api::new(&server);
    let mut open = Vec::new();
    for _ in 0..2 {
        let (status, stream, body) = open_stream(&api, "key-of-hog").await;
        assert_eq!(status, 200, "{body}");
        open.push(stream);
    }
    let (status, _, body) = open_stream(&api, "key-of-hog").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(code(&body), "quota_exceeded");
    assert_eq!(body["error"]["resource"], "event_subscribers_per_principal");
    assert_eq!(body["error"]["limit"], 2);
    // Another principal still gets one; one with its own limit gets that many.
    let (status, stream, body) = open_stream(&api, "key-of-other").await;
    assert_eq!(status, 200, "{body}");
    open.push(stream);
    for _ in 0..3 {
        let (status, stream, body) = open_stream(&api, "key-of-big").await;
        assert_eq!(status, 200, "{body}");
        open.push(stream);
    }
    let (status, _, body) = open_stream(&api, "key-of-big").await;
    assert_eq!(
        (status, &body["error"]["limit"]),
        (429, &Value::from(3)),
        "{body}"
    );
    // The server-wide cap still holds over all of them: the seventh stream is the last.
    let (status, stream, body) = open_stream(&api, "key-of-other").await;
    assert_eq!(status, 200, "{body}");
    open.push(stream);
    let (status, _, body) = open_stream(&api, "key-of-big").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["resource"], "event_subscribers");
    // A stream closed gives its principal's place back.
    open.remove(0);
    let mut reopened = false;
    for _ in 0..200 {
        let (status, stream, _) = open_stream(&api, "key-of-hog").await;
        if status == 200 {
            open.push(stream);
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reopened, "the closed stream's place never came back");
}

/// Revoked means revoked: a principal removed from the auth file (SIGHUP) gets 401 on new
/// requests, a stream it opened before ends instead of going on delivering events, and an
/// acquisition it has waiting in line ends (401) and leaves the line; the stream of a
/// principal whose grants the reload narrowed ends too. A principal the reload left as it
/// was keeps its stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_ends_the_streams_of_principals_it_removed_or_changed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.toml");
    let read = grant("*", &["read"]);
    let work = grant("*", &["acquire", "read", "write"]);
    write_auth(
        &file,
        &[
            ("gone", "key-of-gone", &read),
            ("narrowed", "key-of-narrowed", &read),
            ("kept", "key-of-kept", &read),
            ("worker", "key-of-worker", &work),
            ("waiter", "key-of-waiter", &work),
        ],
    );
    let server = Server::start(&["--auth-file", file.to_str().unwrap()]);
    let api = Api::new(&server);
    let mut streams = Vec::new();
    for key in ["key-of-gone", "key-of-narrowed", "key-of-kept"] {
        let (status, stream, body) = open_stream(&api, key).await;
        assert_eq!(status, 200, "{body}");
        streams.push(stream.unwrap());
    }
    // An acquisition of the principal about to be removed, waiting in line.
    let acquire = |key: &'static str, wait_ms: u64| {
        api.req(Some(key), reqwest::Method::POST, "/v1/locks/held/acquire")
            .json(&serde_json::json!({"ttl_ms": 60_000, "wait_ms": wait_ms}))
    };
    assert_eq!(api.send(acquire("key-of-worker", 0)).await.0, 200);
    let waiting = tokio::spawn(acquire("key-of-waiter", 60_000).send());
    let waiters = || async {
        api.send(api.req(
            Some("key-of-worker"),
            reqwest::Method::GET,
            "/v1/locks/held",
        ))
        .await
        .1["waiters"]
            .as_u64()
    };
    for _ in 0..500 {
        if waiters().await == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(waiters().await, Some(1));
    write_auth(
        &file,
        &[
            ("narrowed", "key-of-narrowed", &grant("a*", &["read"])),
            ("kept", "key-of-kept", &read),
            ("worker", "key-of-worker", &work),
        ],
    );
    server.signal(Signal::SIGHUP);
    let mut reloaded = false;
    for _ in 0..500 {
        let (status, _, _) = api
            .send(api.req(Some("key-of-gone"), reqwest::Method::GET, "/v1/locks/x"))
            .await;
        if status == 401 {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reloaded, "the reload never took effect");
    // The removed principal's waiting acquisition ends (401) and leaves the line.
    let answer = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting acquisition went on after the reload")
        .unwrap()
        .unwrap();
    assert_eq!(answer.status(), 401);
    assert_eq!(waiters().await, Some(0));
    // A grant after the reload: the kept stream sees it, the ended ones never do.
    let (status, body, _) = api
        .send(
            api.req(
                Some("key-of-worker"),
                reqwest::Method::POST,
                "/v1/locks/after/acquire",
            )
            .json(&serde_json::json!({"ttl_ms": 60_000})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let kept = streams.pop().unwrap();
    for (who, mut stream) in ["gone", "narrowed"].into_iter().zip(streams) {
        let mut seen = String::new();
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(chunk) = stream.chunk().await.transpose() {
                match chunk {
                    Ok(bytes) => seen.push_str(&String::from_utf8_lossy(&bytes)),
                    Err(_) => break,
                }
            }
        })
        .await;
        assert!(
            ended.is_ok(),
            "{who}: the stream went on after the reload: {seen}"
        );
        assert!(
            !seen.contains("\"after\""),
            "{who}: got an event after the reload: {seen}"
        );
    }
    let mut kept = kept;
    let mut seen = String::new();
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(bytes)) = kept.chunk().await {
            seen.push_str(&String::from_utf8_lossy(&bytes));
            if seen.contains("\"after\"") {
                return;
            }
        }
    })
    .await;
    assert!(got.is_ok(), "the kept stream did not see the grant: {seen}");
}

/// The event types of the first `n` events of a raw SSE response.
async fn first_types(mut response: reqwest::Response, n: usize) -> Vec<String> {
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let types: Vec<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("event: "))
            .map(str::to_owned)
            .collect();
        if types.len() >= n {
            return types[..n].to_vec();
        }
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .expect("the events came within 20 s")
            .unwrap()
            .expect("the stream stays open");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

/// `?backlog=N`: a new stream starts with the newest N events of its locks, oldest first,
/// then live ones; a backlog past the limit or an unknown parameter is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_opened_with_a_backlog_starts_with_the_newest_events() {
    let server = Server::start(&[]);
    let http = Http::new(&server.url);
    let a = http.acquire("B", "a", 60_000).await;
    let token = a["token"].as_str().unwrap().to_owned();
    assert_eq!(http.put("B", "k", Some(&token), "1").await.0, 200);
    // Another lock's event, which the lock's stream leaves out.
    http.acquire("other", "x", 60_000).await;
    http.release(&a).await;

    let open = |query: &str| {
        http.client
            .get(format!("{}/v1/locks/B/events{query}", http.base))
            .send()
    };
    // B's events: granted, fenced, released. The newest two, then a live one.
    let stream = open("?backlog=2").await.unwrap();
    assert_eq!(stream.status(), 200);
    let live = http.acquire("B", "c", 60_000);
    let (types, _) = tokio::join!(first_types(stream, 3), live);
    assert_eq!(types, ["fenced", "released", "granted"]);

    // Every lock, through /v1/events: the newest of all of them.
    let all = http
        .client
        .get(format!("{}/v1/events?backlog=3", http.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        first_types(all, 3).await,
        ["granted", "released", "granted"],
        "other's grant, B's release, c's grant"
    );

    for query in ["?backlog=1001", "?backlog=-1", "?backlog=x", "?since=1"] {
        let (status, body) = {
            let r = open(query).await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        };
        assert_eq!((status, code(&body)), (400, "bad_request"), "{query}");
    }
}

/// `POST /v1/gates/report`: a gate's counts go to `/metrics` by resource kind and code, its
/// refusals to the events stream as `gate_refused`, its marks to `GET /v1/gates/marks`
/// (beside the store's, only the locks the caller may read); a bad report (unknown code,
/// resource or field, a bad lock name, too many refusals or marks) is a 400 and changes
/// nothing; with authentication on, reporting needs `write` on every lock a report names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gates_report_shows_in_metrics_and_events_and_a_bad_one_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (file, who) = auth_file(
        dir.path(),
        &[
            ("gate", &grant("orders*", &["write", "read"])),
            ("reader", &grant("*", &["read"])),
            ("prom", &grant("x", &["metrics"])),
            ("payer", &grant("pay*", &["write", "read"])),
        ],
    );
    let server = Server::start(&["--auth-file", file.to_str().unwrap()]);
    let api = Api::new(&server);
    let (gate, reader, prom, payer) = (&who[0].key, &who[1].key, &who[2].key, &who[3].key);
    let report = |key: &str, body: Value| {
        api.req(Some(key), reqwest::Method::POST, "/v1/gates/report")
            .json(&body)
    };
    let scrape_as_prom = || async {
        samples(
            &api.text(api.req(Some(prom), reqwest::Method::GET, "/metrics"))
                .await,
        )
    };
    let metrics = || async {
        let now = scrape_as_prom().await;
        let sample = |name: &str| now.get(name).copied().unwrap_or(0.0);
        (
            sample("palisade_gate_admits_total{resource=\"postgres\"}"),
            sample("palisade_gate_refusals_total{code=\"stale_token\",resource=\"postgres\"}"),
        )
    };
    let client = palisade_client::Client::builder(&server.url)
        .bearer_key(gate.clone())
        .build()
        .unwrap();
    let mut stream = follow(client.watch("orders").unwrap());
    until_streams_open(1.0, scrape_as_prom).await;

    let good = serde_json::json!({
        "resource": "postgres",
        "admitted": 40,
        "refused": {"stale_token": 2},
        "recent": [
            {"lock": "orders", "code": "stale_token", "epoch": 7, "high_water": 8},
            {"lock": "orders", "code": "stale_token", "epoch": 6, "high_water": 8},
        ],
        "marks": [{"lock": "orders", "high_water": 8}, {"lock": "orders.eu", "high_water": 3}],
    });
    let (status, body, _) = api.send(report(gate, good.clone())).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, serde_json::json!({"published": 2, "dropped": 0}));
    assert_eq!(metrics().await, (40.0, 2.0));
    for epoch in [7, 6] {
        assert_eq!(
            describe(&next_event(&mut stream).await),
            format!("gate_refused postgres stale_token Some({epoch}) Some(8)")
        );
    }

    // The marks, beside the store's: the store has none for these locks.
    let marks = |key: &str| {
        let (api, req) = (
            &api,
            api.req(Some(key), reqwest::Method::GET, "/v1/gates/marks"),
        );
        async move {
            let (status, body, _) = api.send(req).await;
            assert_eq!(status, 200, "{body}");
            body["locks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    let resources = l["resources"].as_array().unwrap();
                    let marks: Vec<String> = resources
                        .iter()
                        .map(|r| format!("{}={}", r["resource"], r["high_water"]))
                        .collect();
                    format!("{} store={} {}", l["lock"], l["store"], marks.join(","))
                })
                .collect::<Vec<_>>()
        }
    };
    let seen = [
        r#""orders" store=null "postgres"=8"#,
        r#""orders.eu" store=null "postgres"=3"#,
    ];
    assert_eq!(marks(reader).await, seen);
    let payments = serde_json::json!({"resource": "redis",
        "marks": [{"lock": "payments", "high_water": 5}]});
    let (status, body, _) = api.send(report(payer, payments)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        marks(gate).await,
        seen,
        "only the locks the caller may read"
    );
    assert_eq!(marks(reader).await.len(), 3);

    let too_many: Vec<Value> = (0..101)
        .map(|_| serde_json::json!({"lock": "orders", "code": "stale_token"}))
        .collect();
    let too_many_marks: Vec<Value> = (0..101)
        .map(|i| serde_json::json!({"lock": format!("orders.{i}"), "high_water": 1}))
        .collect();
    for bad in [
        serde_json::json!({"resource": "postgres", "refused": {"stale_tokn": 1}}),
        serde_json::json!({"resource": "oracle", "admitted": 1}),
        serde_json::json!({"resource": "postgres", "admitted": 1, "extra": true}),
        serde_json::json!({"resource": "postgres", "admitted": -1}),
        serde_json::json!({"resource": "postgres", "recent": [{"lock": "bad name", "code": "stale_token"}]}),
        serde_json::json!({"resource": "postgres", "admitted": 1, "recent": [{"lock": "orders", "code": "nope"}]}),
        serde_json::json!({"resource": "postgres", "admitted": 1, "recent": too_many}),
        serde_json::json!({"resource": "postgres", "admitted": 1, "marks": too_many_marks}),
        serde_json::json!({"resource": "postgres", "marks": [{"lock": "orders.x", "high_water": -1}]}),
        serde_json::json!({"resource": "postgres", "admitted": 1, "marks": [{"lock": "bad name", "high_water": 1}]}),
    ] {
        let (status, body, _) = api.send(report(gate, bad.clone())).await;
        assert_eq!((status, code(&body)), (400, "bad_request"), "{bad}");
    }
    // Nobody may report refusals of a lock it may not write; a reader may not report.
    let elsewhere = serde_json::json!({"resource": "redis", "admitted": 5,
        "recent": [{"lock": "payments", "code": "stale_token"}]});
    let (status, body, _) = api.send(report(gate, elsewhere)).await;
    assert_eq!((status, code(&body)), (403, "permission_denied"));
    let elsewhere = serde_json::json!({"resource": "postgres", "admitted": 5,
        "marks": [{"lock": "orders.x", "high_water": 1}, {"lock": "payments", "high_water": 9}]});
    let (status, body, _) = api.send(report(gate, elsewhere)).await;
    assert_eq!((status, code(&body)), (403, "permission_denied"));
    let (status, body, _) = api.send(report(reader, good)).await;
    assert_eq!((status, code(&body)), (403, "permission_denied"));
    assert_eq!(
        metrics().await,
        (40.0, 2.0),
        "a refused report changes nothing"
    );
    assert_eq!(marks(gate).await, seen, "nor any mark");
    assert_eq!(marks(reader).await.len(), 3);
    let now = scrape_as_prom().await;
    assert_eq!(
        now.get("palisade_gate_admits_total{resource=\"redis\"}"),
        Some(&0.0),
        "the refused redis report counted nothing"
    );
}
