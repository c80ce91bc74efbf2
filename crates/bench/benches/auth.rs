//! What authentication costs a request: the identity check alone (the key's SHA-256
//! compared with every principal's digest in constant time), and a whole request through
//! the router with and without an auth file. The route is a held lock's status (no disk),
//! so the difference is as large a share of the request as it can be; a fenced write
//! costs the same absolute amount on top of far more work.

use std::hint::black_box;
use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use criterion::{criterion_group, criterion_main, Criterion};
use tower::ServiceExt;

use palisade_core::lock_table::TableConfig;
use palisade_issuer::Issuer;
use palisade_server::api::{router, Shared};
use palisade_server::auth::{key_digest, parse, Auth};
use palisade_server::keys::{KeyRegistry, KeyStore};
use palisade_storage::redb_backend::{RedbBackend, RedbOptions};
use palisade_storage::{FencedStore, IssuerLog};
use palisade_token::{KeySet, Signer};

/// An auth file with `n` principals; the key of the last one is `key-{n-1}`.
fn auth_text(n: usize) -> String {
    let mut text = String::new();
    for i in 0..n {
        let digest: String = key_digest(&format!("key-{i}"))
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        text.push_str(&format!(
            "[[principal]]\nname = \"p{i}\"\nkey_sha256 = \"{digest}\"\n\
             [[principal.grant]]\nlocks = \"*\"\nallow = [\"acquire\", \"read\"]\n"
        ));
    }
    text
}

fn identity(c: &mut Criterion) {
    for n in [1, 100] {
        let policy = parse(&auth_text(n)).expect("auth file");
        let key = format!("key-{}", n - 1);
        c.bench_function(&format!("auth/by_key_{n}_principals"), |b| {
            b.iter(|| policy.by_key(black_box(&key)))
        });
    }
}

fn requests(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let (open, with_auth) = runtime.block_on(async {
        let redb = RedbBackend::open(&dir.path().join("palisade.redb"), RedbOptions::default())
            .expect("database");
        let store: Arc<dyn FencedStore> = Arc::new(redb.clone());
        let log: Arc<dyn IssuerLog> = Arc::new(redb);
        let keys = KeyRegistry::new(
            KeySet::new(Signer::generate(), 0),
            0,
            Vec::new(),
            KeyStore::Dir(dir.path().to_owned()),
            1024,
        );
        let issuer = Issuer::start(log, keys.signer(), TableConfig::default())
            .await
            .expect("issuer");
        let state = Shared::new(Arc::new(issuer), store, keys);
        let file = dir.path().join("auth.toml");
        std::fs::write(&file, auth_text(100)).expect("auth file");
        let mut authed = state.clone();
        authed.auth = Some(Arc::new(Auth::load(&file).expect("auth file loads")));
        let (open, authed) = (router(state.into()), router(authed.into()));
        // The lock is held, so its status is answered from the lock table: a lock the
        // table does not know is looked up on disk, which is not what is measured here.
        let acquire = Request::post("/v1/locks/bench/acquire")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"holder":"bench","ttl_ms":3600000}"#))
            .expect("request");
        let answer = open.clone().oneshot(acquire).await.expect("answer");
        assert_eq!(answer.status(), 200);
        (open, authed)
    });
    for (name, app, key) in [
        ("router/status_no_auth", open, None),
        (
            "router/status_auth_100_principals",
            with_auth,
            Some("Bearer key-99"),
        ),
    ] {
        c.bench_function(name, |b| {
            b.iter(|| {
                let mut req = Request::get("/v1/locks/bench");
                if let Some(key) = key {
                    req = req.header("authorization", key);
                }
                let req = req.body(Body::empty()).expect("request");
                let answer = runtime.block_on(app.clone().oneshot(req)).expect("answer");
                assert_eq!(answer.status(), 200);
            })
        });
    }
}

criterion_group!(benches, identity, requests);
criterion_main!(benches);
