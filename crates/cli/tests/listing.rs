//! Listing locks is paged from an ordered index and does not hold up the lock service:
//! a holder renewing every TTL/4 keeps its lease while listers page through many locks.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{code, Http, Server};
use futures::StreamExt;
use serde_json::json;

const LOCKS: usize = 10_000;

/// Every page of `GET /v1/locks` from the start, following `next`.
async fn all_pages(http: &Http, limit: usize) -> Vec<String> {
    let mut names = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("{}/v1/locks?limit={limit}", http.base);
        if let Some(a) = &after {
            url.push_str(&format!("&after={a}"));
        }
        let (status, body) = http.send(http.client.get(url)).await;
        assert_eq!(status, 200, "{body}");
        for lock in body["locks"].as_array().unwrap() {
            names.push(lock["lock"].as_str().unwrap().to_owned());
        }
        match body["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return names,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewing_holder_keeps_its_lease_while_listers_page_through_every_lock() {
    let server = Server::start(&["--idle-grace-ms", "0"]);
    let http = Arc::new(Http::new(&server.url));
    // Many locks, each acquired once.
    futures::stream::iter(0..LOCKS)
        .for_each_concurrent(64, |i| {
            let http = http.clone();
            async move {
                http.acquire(&format!("lock-{i:06}"), "w", 600_000).await;
            }
        })
        .await;

    // Paging visits every lock exactly once, in order, whatever the page size.
    let names = all_pages(&http, 10_000).await;
    let expected: Vec<String> = (0..LOCKS).map(|i| format!("lock-{i:06}")).collect();
    assert_eq!(names, expected);
    assert_eq!(all_pages(&http, 777).await, expected);

    // A holder renews every TTL/4 while sixteen listers page through everything, again
    // and again. (The TTL leaves room for a debug build on a busy machine; what the test
    // would catch is a listing that holds the lock service up for whole seconds.)
    let ttl_ms = 2_000;
    let lease = http.acquire("held", "holder", ttl_ms).await;
    let lease_id = lease["lease_id"].as_str().unwrap().to_owned();
    let stop_at = Instant::now() + Duration::from_secs(8);
    let pages = Arc::new(AtomicUsize::new(0));
    let listers: Vec<_> = (0..16)
        .map(|_| {
            let http = http.clone();
            let pages = pages.clone();
            tokio::spawn(async move {
                while Instant::now() < stop_at {
                    let url = format!("{}/v1/locks?limit=10000", http.base);
                    let (status, _) = http.send(http.client.get(url)).await;
                    assert_eq!(status, 200);
                    pages.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut renewals = 0;
    while Instant::now() < stop_at {
        tokio::time::sleep(Duration::from_millis(ttl_ms / 4)).await;
        let url = format!("{}/v1/leases/{lease_id}/keepalive", http.base);
        let (status, body) = http.send(http.client.post(url)).await;
        assert_eq!(
            status,
            200,
            "renewal {renewals} failed: {} {body}",
            code(&body)
        );
        renewals += 1;
    }
    let (_, status) = http.get("/v1/locks/held").await;
    assert_eq!(status["lease_id"], json!(lease_id), "{status}");
    for lister in listers {
        lister.await.unwrap();
    }
    assert!(pages.load(Ordering::Relaxed) >= 16, "the listers did list");
}
