//! A gate that reports to the server (issue: refusals at the resource visible where
//! operators look): the SQLite gate counts into a `GateTally` through
//! `Trust::reporting_to`, and a `Reporter` sends it to a real `palisade serve`. The stale
//! writer the database refused shows in `/metrics` by resource kind and code and as a
//! `gate_refused` event naming the lock and both epochs; with the server away the counts
//! are put back, not lost, and go with the next report once it is back.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::events::{describe, follow, next_event, scrape, until_streams_open};
use common::{sqlite_gate, Http, Server};
use palisade_adapters::report::Reporter;
use palisade_adapters::{AdmitError, GateTally, Trust};
use palisade_client::{Client, IssuerKeys};
use serde_json::Value;

const ADMITS: &str = "palisade_gate_admits_total{resource=\"sqlite\"}";
const STALE: &str = "palisade_gate_refusals_total{code=\"stale_token\",resource=\"sqlite\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gates_refusal_reaches_metrics_and_events_and_waits_out_the_server_being_away() {
    let mut server = Server::start(&[]);
    let http = Http::new(&server.url);
    let client = Client::new(&server.url).unwrap();
    let keys = IssuerKeys::fetch(client.clone(), 16).await.unwrap();
    let verifier = keys.verifier();
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_gate::database(dir.path());
    let tally = Arc::new(GateTally::new());
    let trust = Trust::new(&verifier).reporting_to(&tally);
    // A report a minute: this test sends its reports itself, with flush.
    let reporter = Reporter::spawn(client.clone(), tally.clone(), Duration::from_secs(60));
    let mut events = follow(client.watch("L").unwrap());
    until_streams_open(1.0, || scrape(&http)).await;

    let first = http.acquire("L", "a", 60_000).await;
    let old = first["token"].as_str().unwrap().to_owned();
    sqlite_gate::write(&db, trust, &old, "one").unwrap();
    http.release(&first).await;
    let second = http.acquire("L", "b", 60_000).await;
    let new = second["token"].as_str().unwrap().to_owned();
    sqlite_gate::write(&db, trust, &new, "two").unwrap();
    assert!(matches!(
        sqlite_gate::write(&db, trust, &old, "late"),
        Err(AdmitError::Stale {
            high_water: 2,
            epoch: 1
        })
    ));
    // A token of another lock is refused too, and counted by its own code.
    let other = http.acquire("M", "c", 60_000).await;
    let wrong = sqlite_gate::write(&db, trust, other["token"].as_str().unwrap(), "x");
    assert!(matches!(wrong, Err(AdmitError::WrongLock { .. })));

    reporter.flush().await.unwrap();
    let now = scrape(&http).await;
    assert_eq!(now.get(ADMITS), Some(&2.0), "{now:?}");
    assert_eq!(now.get(STALE), Some(&1.0), "{now:?}");
    let wrong_lock = "palisade_gate_refusals_total{code=\"wrong_lock\",resource=\"sqlite\"}";
    assert_eq!(now.get(wrong_lock), Some(&1.0));
    // The lock's own events first (granted, released, granted), then the gate's.
    let mut seen = Vec::new();
    while !seen.iter().any(|e: &String| e.starts_with("gate_refused")) {
        seen.push(describe(&next_event(&mut events).await));
    }
    assert_eq!(
        seen.last().unwrap(),
        "gate_refused sqlite stale_token Some(1) Some(2)",
        "{seen:?}"
    );
    drop(events);

    // The server away: the report is put back into the tally, not lost.
    server.kill();
    sqlite_gate::write(&db, trust, &old, "later").unwrap_err();
    sqlite_gate::write(&db, trust, &new, "three").unwrap();
    assert!(reporter.flush().await.is_err());
    assert_eq!(reporter.put_back_reports(), 1);
    server.crash_and_restart();
    // The reporter's client (a clone shares its connection pool) reaches the new process.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while client.health().await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Back (with counters from zero: a restarted server's counters start again), the
    // next report carries what was counted while it was away.
    sqlite_gate::write(&db, trust, &old, "even later").unwrap_err();
    reporter.flush().await.unwrap();
    let now = scrape(&Http::new(&server.url)).await;
    assert_eq!(now.get(ADMITS), Some(&1.0), "{now:?}");
    assert_eq!(now.get(STALE), Some(&2.0), "{now:?}");
    assert_eq!(reporter.refused_reports(), 0);
    assert!(tally.take().is_empty(), "everything was sent");
    // The database's mark for L, beside the store's (nothing written there): a restarted
    // server knows it again from the report that waited.
    let (status, marks) = Http::new(&server.url).get("/v1/gates/marks").await;
    assert_eq!(status, 200, "{marks}");
    let (lock, sqlite) = (&marks["locks"][0], &marks["locks"][0]["resources"][0]);
    assert_eq!(marks["locks"].as_array().map(Vec::len), Some(1), "{marks}");
    assert_eq!((&lock["lock"], &lock["store"]), (&"L".into(), &Value::Null));
    assert_eq!(
        (&sqlite["resource"], &sqlite["high_water"]),
        (&"sqlite".into(), &2.into())
    );
    assert!(sqlite["reported_at_ms"].as_u64() > Some(0), "{marks}");
}
