//! Recording against scripted servers: what a worker writes down when the servers answer
//! 503 (`storage_failed`, as every node does while etcd has no quorum).

use std::net::SocketAddr;

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use palisade_checker::{History, Op, OpKind, Outcome};
use serde_json::json;

use super::*;
use crate::record::merge;

fn unavailable() -> axum::response::Response {
    let body = json!({"error": {"code": "storage_failed", "message": "etcd has no quorum"}});
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

/// A node that grants leases and fences, reads nothing, and answers 503 to every
/// write, delete and release: the acknowledged-or-not question is all about those.
/// With `grant: false` it answers 503 to acquisitions too.
async fn scripted_node(grant: bool) -> SocketAddr {
    let acquire = move |Path(lock): Path<String>| async move {
        if !grant {
            return unavailable();
        }
        Json(json!({
            "lock": lock, "holder": "w1", "epoch": 3, "token": "pal1.e30.sig",
            "lease_id": "l1", "ttl_ms": 100
        }))
        .into_response()
    };
    let app = Router::new()
        .route("/v1/locks/{lock}/acquire", post(acquire))
        .route(
            "/v1/leases/{id}/keepalive",
            post(|| async {
                Json(json!({"lease_id": "l1", "lock": "x", "epoch": 3, "ttl_ms": 100}))
            }),
        )
        .route("/v1/leases/{id}/release", post(|| async { unavailable() }))
        .route(
            "/v1/fences/{lock}",
            post(|| async { Json(json!({"lock": "x", "high_water": 3, "epoch": 3})) }),
        )
        .route(
            "/v1/kv/{lock}/{*key}",
            get(|| async {
                let body = json!({"error": {"code": "not_found", "message": "no such key"}});
                (StatusCode::NOT_FOUND, Json(body))
            })
            .put(|| async { unavailable() })
            .delete(|| async { unavailable() }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn run_against(workload: Workload, nodes: &[SocketAddr], millis: u64) -> Vec<Op> {
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("w1.jsonl");
    let urls: Vec<String> = nodes.iter().map(|a| format!("http://{a}")).collect();
    let clock = RunClock::start();
    let args = WorkerArgs {
        id: 1,
        lock_urls: urls.clone(),
        store_urls: urls,
        lock_protocol: LockProtocol::Palisade,
        workload,
        ttl_ms: 100,
        seed: 1,
        history: history.clone(),
        clock_origin_ns: clock.origin_ns(),
        stop_at_us: millis * 1000,
    };
    run(args).await.unwrap();
    let (merged, _): (History, _) = merge(&[history], Vec::new()).unwrap();
    merged.ops().to_vec()
}

#[tokio::test]
async fn a_worker_past_its_stop_time_does_nothing() {
    let ops = run_against(Workload::Tokens, &[scripted_node(true).await], 0).await;
    assert!(ops.is_empty());
}

#[tokio::test]
async fn answers_503_are_never_acknowledged_in_any_workload() {
    for nodes in [1, 3] {
        let mut addrs = Vec::new();
        for _ in 0..nodes {
            addrs.push(scripted_node(true).await);
        }
        for workload in [Workload::LockSet, Workload::Register, Workload::Tokens] {
            let ops = run_against(workload, &addrs, 600).await;
            let of = |kind: OpKind| ops.iter().filter(move |op| op.kind == kind);
            assert!(of(OpKind::Acquire).any(|op| op.outcome == Outcome::Ok));
            let answered_503: Vec<&Op> = ops
                .iter()
                .filter(|op| {
                    matches!(
                        op.kind,
                        OpKind::Write | OpKind::Delete | OpKind::Add | OpKind::Release
                    )
                })
                .collect();
            assert!(
                !answered_503.is_empty(),
                "{workload:?}: nothing was written"
            );
            for op in answered_503 {
                // Never `ok`, and never a definite `fail` either: a 503 does not say
                // whether the commit landed.
                assert_eq!(op.outcome, Outcome::Info, "{workload:?} x{nodes}: {op}");
                assert!(op.error.as_deref().unwrap_or("").contains("storage_failed"));
            }
        }
    }
}

#[tokio::test]
async fn an_acquisition_answered_503_is_unknown() {
    let addrs = [scripted_node(false).await, scripted_node(false).await];
    // Long enough for a worker started on a loaded machine (its clients take a while to
    // build) to try at least once: the window counts from before it starts.
    let ops = run_against(Workload::Tokens, &addrs, 2_000).await;
    assert!(!ops.is_empty());
    for op in &ops {
        assert_eq!(
            (op.kind, op.outcome),
            (OpKind::Acquire, Outcome::Info),
            "{op}"
        );
        assert_eq!(op.epoch, None);
    }
}
