//! The connection cap: when it is full of slow clients, a prompt client still gets its
//! answer (the slow ones are evicted, longest-idle first), and a connection with a
//! request in progress (a queued acquisition) is never evicted.

mod common;

use std::time::Duration;

use common::raw::{exchange, is_closed, raise_open_files, slow_client};
use common::{Http, Server};

const CAP: usize = 50;

#[tokio::test]
async fn a_full_cap_of_slow_clients_does_not_keep_a_prompt_client_out() {
    raise_open_files();
    // A long header timeout: only eviction can make room here.
    let server = Server::start(&[
        "--max-connections",
        &CAP.to_string(),
        "--header-timeout-ms",
        "120000",
    ]);
    let http = Http::new(&server.url);

    // A queued acquisition holds one connection with a request in progress.
    let holder = http.acquire("capped", "holder", 60_000).await;
    let waiter = {
        let http = Http::new(&server.url);
        tokio::spawn(async move {
            http.acquire_waiting("capped", "waiter", 60_000, 60_000)
                .await
        })
    };
    http.wait_for_waiters("capped", 1).await;

    // Twice the cap of slow clients.
    let mut slow: Vec<_> = tokio::task::spawn_blocking(move || {
        (0..2 * CAP)
            .map(|_| slow_client(server.port, 100))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap()
    .into_iter()
    .collect();
    let port = server.port;

    // A prompt client on a new connection is answered.
    let answer = tokio::task::spawn_blocking(move || {
        exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    })
    .await
    .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");

    // Evictions made the room: at least as many slow clients get closed as went over
    // the cap.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let closed = slow.iter_mut().map(is_closed).filter(|c| *c).count();
        if closed >= CAP {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {closed} slow clients were evicted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The queued acquisition was never evicted: it gets the lock on release.
    let lease = holder["lease_id"].as_str().unwrap();
    let (status, body) = http
        .send(
            http.client
                .post(format!("{}/v1/leases/{lease}/release", server.url)),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let granted = waiter.await.unwrap();
    assert_eq!(granted["epoch"], 2, "{granted}");
}
