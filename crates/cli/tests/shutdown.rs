//! SIGTERM does not wait for slow or idle clients, answers queued acquisitions with 503
//! `unavailable`,
//! gives a request in progress a bounded grace, and the process exits within seconds.

mod common;

use std::io::Write;
use std::time::Duration;

use common::raw::{slow_client, RawConn};
use common::{code, Http, Server, Signal};

/// Generous bound on "exits within a few seconds".
const EXIT_BOUND: Duration = Duration::from_secs(15);

#[tokio::test]
async fn sigterm_answers_a_queued_waiter_503_and_exits() {
    let mut server = Server::start(&[]);
    let http = Http::new(&server.url);
    let _held = http.acquire("shutdown", "holder", 60_000).await;
    let waiter = {
        let client = http.client.clone();
        let url = format!("{}/v1/locks/shutdown/acquire", server.url);
        tokio::spawn(async move {
            let body =
                serde_json::json!({"holder": "waiter", "ttl_ms": 10_000, "wait_ms": 120_000});
            let resp = client.post(url).json(&body).send().await.expect("answered");
            let status = resp.status().as_u16();
            let body: serde_json::Value = resp.json().await.expect("JSON");
            (status, body)
        })
    };
    http.wait_for_waiters("shutdown", 1).await;
    // An idle keep-alive connection and a slow head do not hold the exit up either.
    let mut idle = RawConn::open(server.port);
    idle.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(idle.answer().status, 200);
    let _slow = slow_client(server.port, 100);

    server.signal(Signal::SIGTERM);
    let (status, body) = waiter.await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(code(&body), "unavailable", "{body}");
    let exit = server
        .wait_exit(EXIT_BOUND)
        .expect("the server exits after SIGTERM");
    assert!(exit.success(), "{exit:?}");
}

#[test]
fn sigterm_cuts_a_slow_request_off_after_the_grace() {
    let mut server = Server::start(&["--shutdown-grace-ms", "500"]);
    // A request in progress whose body never finishes arriving.
    let mut conn = RawConn::open(server.port);
    conn.send(b"POST /v1/locks/slow/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n");
    conn.stream.write_all(b"{\"holder\": \"slow").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    server.signal(Signal::SIGTERM);
    let exit = server
        .wait_exit(EXIT_BOUND)
        .expect("the server exits after SIGTERM");
    assert!(exit.success(), "{exit:?}");
}
