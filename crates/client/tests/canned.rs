//! The client's whole request path (URL, headers, body, status and header decoding)
//! against a canned HTTP responder on port 0. It checks what goes on the wire and how
//! answers are read; behaviour of the real server is tested in the server's own suite.

mod support;

use std::time::Duration;

use palisade_client::{AcquireOptions, Client, Error, WriteOptions};
use support::read_request;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Serves one request with `response` and hands back the raw request text.
async fn canned(response: String) -> (Client, oneshot::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let request = read_request(&mut sock).await.unwrap_or_default();
        sock.write_all(response.as_bytes()).await.unwrap();
        let _ = tx.send(request);
    });
    (Client::new(&format!("http://{addr}")).unwrap(), rx)
}

fn http(status: &str, headers: &[&str], body: &str) -> String {
    let mut r = format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for h in headers {
        r.push_str(h);
        r.push_str("\r\n");
    }
    r.push_str("\r\n");
    r.push_str(body);
    r
}

#[tokio::test]
async fn acquire_sends_holder_ttl_and_wait() {
    let body = r#"{"lock":"jobs","holder":"w1","epoch":3,"token":"pal1.x.y","lease_id":"L1","ttl_ms":2000}"#;
    let (client, req) = canned(http("200 OK", &["content-type: application/json"], body)).await;
    let opts = AcquireOptions {
        ttl: Duration::from_secs(2),
        wait: Some(Duration::from_millis(1500)),
        ..AcquireOptions::default()
    };
    let lease = client.acquire_raw("jobs", "w1", opts).await.unwrap();
    assert_eq!((lease.epoch, lease.token.as_str()), (3, "pal1.x.y"));
    let req = req.await.unwrap();
    assert!(
        req.starts_with("POST /v1/locks/jobs/acquire HTTP/1.1"),
        "{req}"
    );
    assert!(
        req.contains(r#""holder":"w1""#)
            && req.contains(r#""ttl_ms":2000"#)
            && req.contains(r#""wait_ms":1500"#),
        "{req}"
    );
}

#[tokio::test]
async fn put_sends_token_and_reads_replayed() {
    let (client, req) = canned(http(
        "200 OK",
        &["idempotent-replayed: true"],
        r#"{"revision":4,"epoch":2}"#,
    ))
    .await;
    let opts = WriteOptions {
        idempotency_key: Some("op-7".into()),
        ..WriteOptions::default()
    };
    let res = client
        .fenced_kv("jobs", "pal1.t.s")
        .put_with("a b/c", "hello", &opts)
        .await
        .unwrap();
    assert_eq!((res.revision, res.epoch, res.replayed), (4, 2, true));
    let req = req.await.unwrap();
    assert!(req.starts_with("PUT /v1/kv/jobs/a%20b/c HTTP/1.1"), "{req}");
    assert!(
        req.contains("fencing-token: pal1.t.s") && req.contains("idempotency-key: op-7"),
        "{req}"
    );
    assert!(req.ends_with("hello"), "{req}");
}

#[tokio::test]
async fn stale_write_is_a_typed_error() {
    let body =
        r#"{"error":{"code":"stale_token","message":"epoch 1 < 2","high_water":2,"epoch":1}}"#;
    let (client, _req) = canned(http("409 Conflict", &[], body)).await;
    let err = client
        .fenced_kv("jobs", "t")
        .put("k", "late")
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Stale {
                high_water: 2,
                epoch: 1
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn get_reads_value_revision_and_epoch() {
    let (client, req) = canned(http(
        "200 OK",
        &["etag: \"9\"", "fencing-epoch: 2"],
        "B: value",
    ))
    .await;
    let entry = client.kv("jobs").get("record").await.unwrap().unwrap();
    assert_eq!(
        (&entry.value[..], entry.revision, entry.epoch),
        (&b"B: value"[..], 9, 2)
    );
    assert!(req
        .await
        .unwrap()
        .starts_with("GET /v1/kv/jobs/record HTTP/1.1"));
}

#[tokio::test]
async fn get_of_absent_key_is_none_but_bare_404_is_an_error() {
    let body = r#"{"error":{"code":"not_found","message":"no such key"}}"#;
    let (client, _req) = canned(http("404 Not Found", &[], body)).await;
    assert!(client.kv("jobs").get("missing").await.unwrap().is_none());

    let (client, _req) = canned(http("404 Not Found", &[], "")).await;
    let err = client.kv("jobs").get("k").await.unwrap_err();
    assert_eq!(err.code(), "decode");
}

#[tokio::test]
async fn list_sends_prefix_and_limit() {
    let (client, req) = canned(http(
        "200 OK",
        &[],
        r#"{"lock":"jobs","keys":["a/1","a/2"]}"#,
    ))
    .await;
    let keys = client.kv("jobs").list("a/").await.unwrap();
    assert_eq!(keys, ["a/1", "a/2"]);
    let req = req.await.unwrap();
    assert!(
        req.starts_with("GET /v1/kv/jobs?limit=10000&prefix=a%2F HTTP/1.1"),
        "{req}"
    );
}

#[tokio::test]
async fn connection_refused_is_transport() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let client = Client::new(&format!("http://{addr}")).unwrap();
    let err = client.health().await.unwrap_err();
    assert_eq!(err.code(), "transport");
}
