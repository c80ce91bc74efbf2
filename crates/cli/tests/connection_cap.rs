//! The connection cap: when it is full of slow clients, a prompt client still gets its
//! answer (the slow ones are evicted, longest-idle first), a connection with a request in
//! progress (a queued acquisition) is never evicted, and a burst of queued acquisitions
//! never takes the server past the cap.

mod common;

use std::time::Duration;

use common::raw::{connect, exchange, is_closed, raise_open_files, rss_kib, slow_client};
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
    let (status, body) = http.post(&format!("/v1/leases/{lease}/release")).await;
    assert_eq!(status, 200, "{body}");
    let granted = waiter.await.unwrap();
    assert_eq!(granted["epoch"], 2, "{granted}");
}

/// Sockets the process `pid` has open (its listener included).
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// The red team's burst: connections that each send a queued acquisition at once. Every
/// connection admitted over the cap evicts one that has no request in progress yet, and
/// an evicted connection whose request arrived meanwhile used to serve it anyway, no
/// longer counted: 150 connections held against a cap of 100. Now an evicted connection
/// answers such a request 503 `unavailable` and closes, and it counts until it has closed,
/// so the server holds at most the cap; the rest wait in the listen backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_queued_acquisitions_never_takes_the_server_past_the_cap() {
    raise_open_files();
    const BURST_CAP: usize = 20;
    let server = Server::start(&["--max-connections", &BURST_CAP.to_string()]);
    // Sockets that are not connections: the listener, the signal pipe's pair.
    let own = sockets(server.pid());
    let http = Http::new(&server.url);
    let holder = http.acquire("busy", "holder", 60_000).await;
    drop(http); // its connection goes idle, then is evicted
    let port = server.port;
    let pid = server.pid();
    let before = rss_kib(pid);
    let request = b"POST /v1/locks/busy/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 45\r\n\r\n{\"holder\":\"w\",\"ttl_ms\":60000,\"wait_ms\":60000}";
    let clients = tokio::task::spawn_blocking(move || {
        let threads: Vec<_> = (0..5 * BURST_CAP)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut stream = connect(port);
                    std::io::Write::write_all(&mut stream, request).unwrap();
                    stream
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    // While the burst is admitted, connections evicted to make room are still closing;
    // then what stays open is the cap (every place a queued acquisition) and at most one
    // accepted connection waiting, unserved, for a place. Watched for a second and a half.
    let connections = || sockets(pid).saturating_sub(own);
    let mut settled = false;
    for _ in 0..250 {
        if connections() <= BURST_CAP + 1 {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        settled,
        "{} connections open against a cap of {BURST_CAP}",
        connections()
    );
    let mut most = 0;
    for _ in 0..75 {
        most = most.max(connections());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        most <= BURST_CAP + 1,
        "{most} connections open against a cap of {BURST_CAP}"
    );
    let held = rss_kib(pid).saturating_sub(before);
    eprintln!("{most} connections; resident set +{held} KiB with the cap full of waiters");
    drop(clients);
    let _ = holder;
}
