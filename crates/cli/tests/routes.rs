//! Every mutating route refuses a request without a token (S12), and malformed requests
//! of every kind get a typed 4xx error, never a 500 or a dropped connection.

mod common;

use common::{code, Http, Server};
use reqwest::Method;

#[tokio::test]
async fn every_mutating_route_rejects_a_missing_token() {
    let server = Server::start(&[]);
    let http = Http::new(&server.url);
    let lease = http.acquire("ns", "w", 60_000).await;
    let (status, _) = http.put("ns", "k", lease["token"].as_str(), "v").await;
    assert_eq!(status, 200);

    let routes = [
        (Method::PUT, "/v1/kv/ns/k"),
        (Method::PUT, "/v1/kv/ns/new-key"),
        (Method::DELETE, "/v1/kv/ns/k"),
        (Method::POST, "/v1/fences/ns"),
    ];
    for (method, route) in routes {
        for header in [None, Some(""), Some("   ")] {
            let mut req = http
                .client
                .request(method.clone(), format!("{}{route}", server.url))
                .body("x");
            if let Some(h) = header {
                req = req.header("Fencing-Token", h);
            }
            let (status, body) = http.send(req).await;
            assert_eq!(
                (status, code(&body)),
                (400, "missing_token"),
                "{method} {route} {header:?}: {body}"
            );
        }
    }
    assert_eq!(http.get_value("ns", "k").await.as_deref(), Some("v"));
    assert_eq!(http.get_value("ns", "new-key").await, None);
    assert_eq!(http.high_water("ns").await, 1);
}

#[tokio::test]
async fn malformed_requests_get_typed_errors() {
    let server = Server::start(&["--max-value-bytes", "1000"]);
    let http = Http::new(&server.url);
    let lease = http.acquire("ns", "w", 60_000).await;
    let token = lease["token"].as_str().unwrap().to_owned();
    let url = |p: &str| format!("{}{p}", server.url);
    let c = &http.client;

    let acquire = |body: &'static str| c.post(url("/v1/locks/ns/acquire")).body(body);
    // A write of ns/k with the lease's token.
    let put = || c.put(url("/v1/kv/ns/k")).header("Fencing-Token", &token);
    let put_at = |path: &str| c.put(url(path)).header("Fencing-Token", &token);
    let bad = |req: reqwest::RequestBuilder| (req, 400, "bad_request");
    let invalid_token = |value: &[u8]| {
        let req = c
            .put(url("/v1/kv/ns/k"))
            .header("Fencing-Token", value.to_vec());
        (req, 400, "invalid_token")
    };

    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        bad(acquire("not json")),
        bad(acquire("{}")),
        bad(acquire(r#"{"holder":"a","ttl_ms":-1}"#)),
        bad(acquire(r#"{"holder":"a","ttl_ms":"1000"}"#)),
        bad(acquire(r#"{"holder":"","ttl_ms":1000}"#)),
        bad(acquire(r#"{"holder":"a","ttl_ms":1}"#)),
        bad(acquire(
            r#"{"holder":"a","ttl_ms":1000,"wait_ms":99999999}"#,
        )),
        bad(acquire(r#"{"holder":"a","ttl_ms":1000,"extra":1}"#)),
        bad(c
            .post(url("/v1/locks/bad%20name/acquire"))
            .body(r#"{"holder":"a","ttl_ms":1000}"#)),
        bad(c
            .post(url(&format!("/v1/locks/{}/acquire", "x".repeat(129))))
            .body(r#"{"holder":"a","ttl_ms":1000}"#)),
        (
            c.post(url("/v1/locks/ns/acquire")).body(vec![b'{'; 70_000]),
            413,
            "payload_too_large",
        ),
        (
            c.post(url("/v1/leases/nope/keepalive")),
            404,
            "lease_expired",
        ),
        (c.post(url("/v1/leases/nope/release")), 404, "lease_expired"),
        bad(c.get(url("/v1/locks/%FF"))),
        bad(c.get(url("/v1/locks?limit=abc"))),
        bad(c.get(url("/v1/kv/ns?limit=-3"))),
        (c.get(url("/v1/kv/ns/missing")), 404, "not_found"),
        (c.get(url("/v1/kv/..")), 404, "not_found"),
        (c.get(url("/v1/nothing-here")), 404, "not_found"),
        (c.delete(url("/v1/locks/ns")), 405, "method_not_allowed"),
        (
            c.patch(url("/v1/kv/ns/k")).header("Fencing-Token", &token),
            405,
            "method_not_allowed",
        ),
        (put().body(vec![0u8; 1001]), 413, "payload_too_large"),
        bad(put().header("If-Match", "abc")),
        bad(put().header("If-None-Match", "\"3\"")),
        (put().header("If-Match", "\"99\""), 412, "revision_mismatch"),
        bad(put().header("Fencing-Seq", "x")),
        bad(put().header("Idempotency-Key", "k".repeat(200))),
        bad(put().header("Idempotency-Key", "two words")),
        bad(put().header("Fencing-Token", &token)),
        bad(put_at(&format!("/v1/kv/ns/{}", "k".repeat(1025)))),
        bad(put_at("/v1/kv/ns/a%00b")),
        invalid_token(b"pal1.x.y"),
        invalid_token("x".repeat(5000).as_bytes()),
        invalid_token(b"\xff\xfe"),
        (
            c.delete(url("/v1/kv/ns/absent"))
                .header("Fencing-Token", &token),
            404,
            "not_found",
        ),
        bad(c.post(url("/v1/tokens/check")).body("[]")),
        // The key listing has no continuation: a paging parameter is refused, not ignored.
        bad(c.get(url("/v1/kv/ns?after=k"))),
        bad(c.get(url("/v1/kv/ns?prefx=k"))),
        // The barrier writes no key: preconditions are refused, not ignored.
        bad(c
            .post(url("/v1/fences/ns"))
            .header("Fencing-Token", &token)
            .header("If-Match", "\"1\"")),
        bad(c
            .post(url("/v1/fences/ns"))
            .header("Fencing-Token", &token)
            .header("If-None-Match", "*")),
    ];
    for (req, status, expected) in cases {
        let built = req.try_clone().unwrap().build().unwrap();
        let what = format!("{} {}", built.method(), built.url());
        let (got, body) = http.send(req).await;
        assert_eq!((got, code(&body)), (status, expected), "{what}: {body}");
        assert!(body["error"]["message"].is_string(), "{what}: {body}");
    }
    // Nothing above changed the namespace.
    assert_eq!(http.high_water("ns").await, 0);
    let (status, body) = http.send(c.get(url("/v1/kv/ns"))).await;
    assert_eq!(status, 200);
    assert_eq!(body["keys"], serde_json::json!([]));
    // And the server is still healthy.
    let (status, _) = http.send(c.get(url("/healthz"))).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn conditional_writes_idempotency_and_sequence_policy() {
    let server = Server::start(&["--policy", "seq.*=sequence"]);
    let http = Http::new(&server.url);
    let c = &http.client;
    let url = |p: &str| format!("{}{p}", server.url);
    let lease = http.acquire("ns", "w", 60_000).await;
    let token = lease["token"].as_str().unwrap();

    // If-None-Match: * creates once.
    let create = |body: &'static str| {
        let put = c.put(url("/v1/kv/ns/k")).header("Fencing-Token", token);
        http.send(put.header("If-None-Match", "*").body(body))
    };
    let (s, first) = create("a").await;
    assert_eq!(s, 200, "{first}");
    let (s, body) = create("b").await;
    assert_eq!((s, code(&body)), (412, "revision_mismatch"));
    assert_eq!(body["error"]["current_revision"], first["revision"]);
    // If-Match with the current revision succeeds; the ETag follows.
    let rev = first["revision"].as_u64().unwrap();
    let (s, second) = http
        .send(
            c.put(url("/v1/kv/ns/k"))
                .header("Fencing-Token", token)
                .header("If-Match", format!("\"{rev}\""))
                .body("c"),
        )
        .await;
    assert_eq!(s, 200);
    let resp = c.get(url("/v1/kv/ns/k")).send().await.unwrap();
    assert_eq!(
        resp.headers()["etag"],
        format!("\"{}\"", second["revision"]).as_str()
    );
    assert_eq!(resp.text().await.unwrap(), "c");

    // Idempotency-Key: a retry returns the first outcome and applies nothing.
    let send = |value: &'static str| {
        c.put(url("/v1/kv/ns/counter"))
            .header("Fencing-Token", token)
            .header("Idempotency-Key", "op-1")
            .body(value)
    };
    let r1 = send("1").send().await.unwrap();
    assert!(r1.headers().get("idempotent-replayed").is_none());
    let b1: serde_json::Value = r1.json().await.unwrap();
    let r2 = send("1").send().await.unwrap();
    assert_eq!(r2.headers()["idempotent-replayed"], "true");
    let b2: serde_json::Value = r2.json().await.unwrap();
    assert_eq!(b1, b2);
    let (s, body) = http.send(send("2")).await;
    assert_eq!((s, code(&body)), (422, "idempotency_conflict"));
    assert_eq!(http.get_value("ns", "counter").await.as_deref(), Some("1"));

    // A sequence namespace wants strictly increasing (epoch, seq).
    let seq_lease = http.acquire("seq.jobs", "w", 60_000).await;
    let st = seq_lease["token"].as_str().unwrap();
    let put_seq = |seq: Option<u64>| {
        let mut r = c
            .put(url("/v1/kv/seq.jobs/x"))
            .header("Fencing-Token", st)
            .body("v");
        if let Some(s) = seq {
            r = r.header("Fencing-Seq", s.to_string());
        }
        r
    };
    assert_eq!(http.send(put_seq(None)).await.0, 400);
    assert_eq!(http.send(put_seq(Some(1))).await.0, 200);
    let (s, body) = http.send(put_seq(Some(1))).await;
    assert_eq!((s, code(&body)), (409, "stale_sequence"), "{body}");
    assert_eq!(http.send(put_seq(Some(2))).await.0, 200);
    let (_, fence) = http.send(c.get(url("/v1/fences/seq.jobs"))).await;
    assert_eq!(
        (
            fence["high_water"].as_u64(),
            fence["seq"].as_u64(),
            fence["policy"].as_str()
        ),
        (Some(1), Some(2), Some("sequence"))
    );
}

#[tokio::test]
async fn barrier_fences_out_the_old_holder_before_any_write() {
    let server = Server::start(&[]);
    let http = Http::new(&server.url);
    let old = http.acquire("b", "old", 100).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let new = http.acquire("b", "new", 60_000).await;
    // Without the barrier the old token would still pass (S10). With it, it does not.
    let (s, body) = http
        .send(
            http.client
                .post(format!("{}/v1/fences/b", server.url))
                .header("Fencing-Token", new["token"].as_str().unwrap()),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["high_water"], 2);
    let (s, body) = http.put("b", "k", old["token"].as_str(), "late").await;
    assert_eq!((s, code(&body)), (409, "stale_token"));
    assert_eq!(http.get_value("b", "k").await, None);
}
