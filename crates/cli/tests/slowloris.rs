//! Slowloris: a thousand connections that send part of a request head and never finish
//! it. They must not keep `/healthz` from answering, must be closed after the header
//! timeout, and must not grow the server's memory by more than a stated bound.
//!
//! The bound: each such connection may hold at most the header limit (16 KiB) of unread
//! head plus its task and socket state, so a thousand of them, each having sent 12 KiB,
//! must add less than 64 MiB of resident memory. (A head that passes the limit is
//! answered 431 and closed: malformed_requests.rs.)

mod common;

use std::time::{Duration, Instant};

use common::raw::{closed_within, exchange, raise_open_files, rss_kib, slow_client};
use common::Server;

const SLOW_CLIENTS: usize = 1000;
const PADDING: usize = 12 * 1024;
const RSS_BOUND_KIB: u64 = 64 * 1024;

#[test]
fn a_thousand_slow_heads_neither_block_health_nor_outlive_the_header_timeout() {
    raise_open_files();
    let server = Server::start(&["--header-timeout-ms", "3000"]);
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(exchange(server.port, healthz).status, 200);
    let before = rss_kib(server.pid());

    let opened = Instant::now();
    let mut slow: Vec<_> = (0..SLOW_CLIENTS)
        .map(|_| slow_client(server.port, PADDING))
        .collect();

    // A prompt client is answered while all of them hang.
    let answer = exchange(server.port, healthz);
    assert_eq!(answer.status, 200, "{answer:?}");

    // Memory while they are all open (sampled a few times; the largest counts).
    let mut peak = 0;
    for _ in 0..10 {
        peak = peak.max(rss_kib(server.pid()));
        std::thread::sleep(Duration::from_millis(50));
    }
    let grown = peak.saturating_sub(before);
    eprintln!("RSS {before} KiB before, {peak} KiB with {SLOW_CLIENTS} slow heads (+{grown} KiB)");
    assert!(
        grown < RSS_BOUND_KIB,
        "{SLOW_CLIENTS} slow heads grew RSS by {grown} KiB (bound {RSS_BOUND_KIB} KiB)"
    );

    // Every one of them is closed, about 3 s after it opened (generous bound: 30 s).
    for (i, stream) in slow.iter_mut().enumerate() {
        let left = Duration::from_secs(30).saturating_sub(opened.elapsed());
        assert!(closed_within(stream, left), "slow client {i} still open");
    }
    assert_eq!(exchange(server.port, healthz).status, 200);
}

#[test]
fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let server = Server::start(&["--idle-timeout-ms", "500"]);
    let mut conn = common::raw::RawConn::open(server.port);
    conn.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(conn.answer().status, 200);
    assert!(closed_within(&mut conn.stream, Duration::from_secs(20)));
}
