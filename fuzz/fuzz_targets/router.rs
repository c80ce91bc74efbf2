//! Fuzz the HTTP API in-process: arbitrary method, path, headers and body through the real
//! router, over a real redb file in a temp dir and the embedded issuer, once with
//! authentication off and once with an auth file (no key, a wrong one, a principal with
//! one grant, an admin).
//!
//! Checked for every request: no panic; no 5xx except 503 `storage_failed`; every error
//! answer is JSON with a string `error.code`; with authentication on, a request without a
//! known key never gets a 2xx from a route that is not public.

#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arbitrary::Arbitrary;
use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

use palisade_core::lock_table::TableConfig;
use palisade_issuer::Issuer;
use palisade_server::api::{router, Shared};
use palisade_server::auth::{key_digest, Auth};
use palisade_server::NamespacePolicies;
use palisade_storage::redb_backend::{RedbBackend, RedbOptions};
use palisade_storage::{FencedStore, IssuerLog};
use palisade_server::keys::{KeyRegistry, KeyStore};
use palisade_token::{KeySet, Signer};

const METHODS: [&str; 8] = [
    "GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS", "BREW",
];
const HEADERS: [&str; 9] = [
    "authorization",
    "fencing-token",
    "fencing-seq",
    "idempotency-key",
    "if-match",
    "if-none-match",
    "content-type",
    "content-length",
    "x-anything",
];

#[derive(Arbitrary, Debug)]
struct Input {
    /// Against the server with authentication on.
    auth: bool,
    method: u8,
    route: Route,
    query: Option<String>,
    headers: Vec<(u8, Value)>,
    body: Body_,
}

#[derive(Arbitrary, Debug)]
enum Route {
    Raw(String),
    Acquire(String),
    Lock(String),
    Locks,
    Keepalive(String),
    Release(String),
    Keys,
    Check,
    List(String),
    Key(String, String),
    Fence(String),
    Health,
    OpenApi,
}

#[derive(Arbitrary, Debug)]
enum Value {
    Token(u8),
    Raw(Vec<u8>),
    Number(u64),
    /// `Bearer <key>` of a known principal (or, past the list, of nobody).
    Key(u8),
}

/// Keys of the auth file's principals: `grant` (everything on locks `a*`), `admin`.
const KEYS: [&str; 2] = ["fuzz-key-grant", "fuzz-key-admin"];

#[derive(Arbitrary, Debug)]
enum Body_ {
    Raw(Vec<u8>),
    Acquire { holder: String, ttl_ms: u64 },
    Check(Value),
}

struct Ctx {
    runtime: tokio::runtime::Runtime,
    app: axum::Router,
    app_auth: axum::Router,
    tokens: Vec<String>,
    _dir: tempfile::TempDir,
}

fn ctx() -> &'static Ctx {
    static CTX: OnceLock<Ctx> = OnceLock::new();
    CTX.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("palisade.redb");
        let signer = Signer::from_secret([3; 32]);
        let tokens = ["a", "seq", "b"]
            .iter()
            .flat_map(|lock| [1, 5].map(|epoch| signer.issue(lock, epoch, "fuzz")))
            .collect();
        let app = runtime.block_on(async {
            let redb = RedbBackend::open(&path, RedbOptions::default()).expect("open");
            let backend: Arc<dyn FencedStore> = Arc::new(redb.clone());
            let issuer_log: Arc<dyn IssuerLog> = Arc::new(redb);
            let keys = KeyRegistry::new(
                KeySet::new(Signer::from_secret([3; 32]), 0),
                0,
                Vec::new(),
                KeyStore::Dir(dir.path().to_owned()),
                1024,
            );
            let config = TableConfig {
                lock_delay_ms: 0,
                ..Default::default()
            };
            let issuer = Issuer::start(issuer_log, keys.signer(), config)
                .await
                .expect("issuer");
            let policies = NamespacePolicies::parse(["seq=sequence"]).expect("policies");
            let mut state = Shared::new(Arc::new(issuer), backend, keys);
            state.policies = Arc::new(policies);
            state.max_value_bytes = 1024;
            let open = router(state.clone().into());
            let file = dir.path().join("auth.toml");
            let digest = |key: &str| {
                key_digest(key).iter().map(|b| format!("{b:02x}")).collect::<String>()
            };
            let text = format!(
                "[[principal]]\nname = \"grant\"\nkey_sha256 = \"{}\"\n\
                 [[principal.grant]]\nlocks = \"a*\"\nallow = [\"acquire\", \"read\", \"write\", \"check\"]\n\
                 [[principal]]\nname = \"admin\"\nkey_sha256 = \"{}\"\nadmin = true\n",
                digest(KEYS[0]),
                digest(KEYS[1])
            );
            std::fs::write(&file, text).expect("auth file");
            state.auth = Some(Arc::new(Auth::load(&file).expect("auth file loads")));
            (open, router(state.into()))
        });
        let (app, app_auth) = app;
        Ctx {
            runtime,
            app,
            app_auth,
            tokens,
            _dir: dir,
        }
    })
}

fn value_bytes(value: &Value, tokens: &[String]) -> Vec<u8> {
    match value {
        Value::Token(i) => tokens[usize::from(*i) % tokens.len()].clone().into_bytes(),
        Value::Raw(bytes) => bytes.clone(),
        Value::Number(n) => n.to_string().into_bytes(),
        Value::Key(i) => match KEYS.get(usize::from(*i)) {
            Some(key) => format!("Bearer {key}").into_bytes(),
            None => format!("Bearer nobody-{i}").into_bytes(),
        },
    }
}

fn path(route: &Route) -> String {
    match route {
        Route::Raw(p) => format!("/{p}"),
        Route::Acquire(l) => format!("/v1/locks/{l}/acquire"),
        Route::Lock(l) => format!("/v1/locks/{l}"),
        Route::Locks => "/v1/locks".into(),
        Route::Keepalive(id) => format!("/v1/leases/{id}/keepalive"),
        Route::Release(id) => format!("/v1/leases/{id}/release"),
        Route::Keys => "/v1/keys".into(),
        Route::Check => "/v1/tokens/check".into(),
        Route::List(l) => format!("/v1/kv/{l}"),
        Route::Key(l, k) => format!("/v1/kv/{l}/{k}"),
        Route::Fence(l) => format!("/v1/fences/{l}"),
        Route::Health => "/healthz".into(),
        Route::OpenApi => "/v1/openapi.json".into(),
    }
}

fn request(input: &Input, tokens: &[String]) -> Option<Request<Body>> {
    let method =
        Method::from_bytes(METHODS[usize::from(input.method) % METHODS.len()].as_bytes()).ok()?;
    let mut uri = path(&input.route);
    if let Some(q) = &input.query {
        uri.push('?');
        uri.push_str(q);
    }
    let mut builder = Request::builder().method(method).uri(uri.as_str());
    for (name, value) in &input.headers {
        let name = HeaderName::from_static(HEADERS[usize::from(*name) % HEADERS.len()]);
        let value = HeaderValue::from_bytes(&value_bytes(value, tokens)).ok()?;
        builder = builder.header(name, value);
    }
    let body = match &input.body {
        Body_::Raw(bytes) => bytes.clone(),
        // Never waits: a fuzz run must not sit in a lock's queue.
        Body_::Acquire { holder, ttl_ms } => {
            serde_json::json!({"holder": holder, "ttl_ms": ttl_ms % 5000, "wait_ms": 0})
                .to_string()
                .into_bytes()
        }
        Body_::Check(v) => serde_json::json!({
            "token": String::from_utf8_lossy(&value_bytes(v, tokens))
        })
        .to_string()
        .into_bytes(),
    };
    builder.body(Body::from(body)).ok()
}

fuzz_target!(|input: Input| {
    let ctx = ctx();
    let Some(req) = request(&input, &ctx.tokens) else {
        return; // not a representable HTTP request (bad URI or header bytes)
    };
    let is_head = req.method() == Method::HEAD;
    let described = format!("{} {}", req.method(), req.uri());
    // The API's public routes, and the dashboard's static files (public by design: they
    // hold no data, see `palisade_server::ui`).
    let public = ["/healthz", "/v1/keys", "/v1/openapi.json"].contains(&req.uri().path())
        || ["/ui", "/ui/", "/ui/app.js", "/ui/app.css"].contains(&req.uri().path());
    let known_key = req
        .headers()
        .get_all("authorization")
        .iter()
        .any(|v| KEYS.iter().any(|k| v.as_bytes().ends_with(k.as_bytes())));
    let app = if input.auth { &ctx.app_auth } else { &ctx.app };
    ctx.runtime.block_on(async {
        let call = app.clone().oneshot(req);
        // A request may legitimately wait (a body asking for `wait_ms`); that is not a bug.
        let Ok(answer) = tokio::time::timeout(Duration::from_secs(2), call).await else {
            return;
        };
        let response = match answer {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
        let code = json
            .as_ref()
            .and_then(|j| j["error"]["code"].as_str())
            .map(str::to_owned);
        if status.is_server_error() {
            assert!(
                status.as_u16() == 503 && code.as_deref() == Some("storage_failed"),
                "{described}: {status} {}",
                String::from_utf8_lossy(&body)
            );
        }
        if input.auth && !public && !known_key {
            assert!(
                !status.is_success(),
                "{described}: {status} without a known key: {}",
                String::from_utf8_lossy(&body)
            );
        }
        if status.is_client_error() && !is_head {
            assert!(
                code.is_some(),
                "{described}: {status} without a JSON error.code: {}",
                String::from_utf8_lossy(&body)
            );
        }
    });
});
