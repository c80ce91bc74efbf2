//! Signing-key rotation against the real binary: through the admin API with the server
//! running (old tokens valid until retired, then `invalid_token`; admin-only), offline
//! with `palisade admin keys`, the migration of an older data directory's `issuer.key`,
//! the refusal to start without the key set, and (feature `etcd`) one key set shared by
//! three nodes.

mod common;
mod offline;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{code, poll, Http, Server};
use offline::{admin, serve_refused};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const KEY_SET: &str = "signing-keys.json";

/// The key id a token names (its payload's `k`).
fn key_id_of(token: &str) -> String {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use base64::Engine;
    let payload = token.split('.').nth(1).expect("a token has a payload");
    let claims: Value =
        serde_json::from_slice(&B64.decode(payload).expect("base64url")).expect("claims are JSON");
    claims["k"].as_str().expect("key id").to_owned()
}

/// A server on a new data directory: the temp dir that holds it (keep it), the data
/// directory, and the server.
fn on_new_data_dir() -> (tempfile::TempDir, PathBuf, Server) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_in(&data, 0, &[]).expect("server starts");
    (dir, data, server)
}

/// An auth file with an admin and a worker that may acquire and write `orders*`.
fn auth_file(dir: &Path) -> (PathBuf, String, String) {
    let admin_key = "test-admin-key-0123456789abcdef0123456789abcdef".to_owned();
    let worker_key = "test-worker-key-0123456789abcdef0123456789abcdef".to_owned();
    let digest = |k: &str| hex::encode(Sha256::digest(k.as_bytes()));
    let text = format!(
        "[[principal]]\nname = \"root\"\nkey_sha256 = \"{}\"\nadmin = true\n\n\
         [[principal]]\nname = \"worker\"\nkey_sha256 = \"{}\"\n\
         [[principal.grant]]\nlocks = \"orders*\"\nallow = [\"acquire\", \"write\", \"read\"]\n",
        digest(&admin_key),
        digest(&worker_key)
    );
    let path = dir.join("auth.toml");
    std::fs::write(&path, text).unwrap();
    (path, admin_key, worker_key)
}

struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    fn new(base: &str) -> Api {
        Api {
            base: base.to_owned(),
            http: reqwest::Client::new(),
        }
    }

    /// `POST /v1/admin/keys/{key_id}/retire` as `key`.
    async fn retire(&self, key: Option<&str>, key_id: &str) -> (u16, Value) {
        let path = format!("/v1/admin/keys/{key_id}/retire");
        self.call(key, Method::POST, &path).await
    }

    async fn call(&self, key: Option<&str>, method: Method, path: &str) -> (u16, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await.expect("request sent");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn acquire(&self, key: Option<&str>, lock: &str) -> String {
        let mut req = self
            .http
            .post(format!("{}/v1/locks/{lock}/acquire", self.base))
            .json(&json!({"holder": "w", "ttl_ms": 60_000}));
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await.expect("acquire sent");
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 200, "acquire {lock}: {body}");
        body["token"].as_str().expect("token").to_owned()
    }

    async fn put(&self, key: Option<&str>, lock: &str, token: &str) -> (u16, Value) {
        let mut req = self
            .http
            .put(format!("{}/v1/kv/{lock}/k", self.base))
            .header("Fencing-Token", token)
            .body("v");
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await.expect("put sent");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// `GET /v1/keys` as (key_id, status) pairs.
    async fn public_keys(&self) -> Vec<(String, String)> {
        let (status, body) = self.call(None, Method::GET, "/v1/keys").await;
        assert_eq!(status, 200, "{body}");
        body["keys"]
            .as_array()
            .expect("keys")
            .iter()
            .map(|k| {
                (
                    k["key_id"].as_str().unwrap().to_owned(),
                    k["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_with_the_server_running() {
    let dir = tempfile::tempdir().unwrap();
    let (auth, root, worker) = auth_file(dir.path());
    let audit = dir.path().join("audit.log");
    let data = dir.path().join("data");
    let auth_arg = auth.display().to_string();
    let audit_arg = audit.display().to_string();
    let flags = ["--auth-file", &auth_arg, "--audit-log", &audit_arg];
    let mut server = Server::start_in(&data, 0, &flags).expect("server starts");
    let api = Api::new(&server.url);
    let (root, worker) = (Some(root.as_str()), Some(worker.as_str()));

    let old_token = api.acquire(worker, "orders-a").await;
    let old_key = key_id_of(&old_token);
    assert_eq!(
        api.public_keys().await,
        vec![(old_key.clone(), "active".into())]
    );
    assert_eq!(api.put(worker, "orders-a", &old_token).await.0, 200);

    // Admin only: a principal without admin gets 403 and changes nothing; no key, 401.
    for (method, path) in [
        (Method::GET, "/v1/admin/keys".to_owned()),
        (Method::POST, "/v1/admin/keys/rotate".to_owned()),
        (Method::POST, format!("/v1/admin/keys/{old_key}/retire")),
    ] {
        let (status, body) = api.call(worker, method.clone(), &path).await;
        assert_eq!(
            (status, code(&body)),
            (403, "permission_denied"),
            "{path}: {body}"
        );
        let (status, body) = api.call(None, method, &path).await;
        assert_eq!(
            (status, code(&body)),
            (401, "unauthenticated"),
            "{path}: {body}"
        );
    }
    assert_eq!(api.public_keys().await.len(), 1, "nothing changed");

    // Rotate: the new key signs at once; the old one keeps verifying.
    let (status, rotated) = api.call(root, Method::POST, "/v1/admin/keys/rotate").await;
    assert_eq!(status, 200, "{rotated}");
    let new_key = rotated["active"].as_str().unwrap().to_owned();
    assert_eq!(rotated["previous"], old_key.as_str());
    assert_ne!(new_key, old_key);
    assert_eq!(
        api.public_keys().await,
        vec![
            (old_key.clone(), "verifying".into()),
            (new_key.clone(), "active".into())
        ]
    );
    let new_token = api.acquire(worker, "orders-b").await;
    assert_eq!(key_id_of(&new_token), new_key);
    assert_eq!(api.put(worker, "orders-a", &old_token).await.0, 200);
    assert_eq!(api.put(worker, "orders-b", &new_token).await.0, 200);

    // The active key cannot be retired: a clear 409 with a stable code.
    let (status, body) = api.retire(root, &new_key).await;
    assert_eq!((status, code(&body)), (409, "key_active"), "{body}");
    let (status, body) = api
        .call(root, Method::POST, "/v1/admin/keys/0123456789abcdef/retire")
        .await;
    assert_eq!((status, code(&body)), (404, "not_found"), "{body}");
    let (status, body) = api
        .call(root, Method::POST, "/v1/admin/keys/not-hex!/retire")
        .await;
    assert_eq!((status, code(&body)), (400, "bad_request"), "{body}");

    // Retire the old key: its token answers invalid_token (it was cached as verified).
    let (status, body) = api.retire(root, &old_key).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["changed"], true);
    let (status, body) = api.put(worker, "orders-a", &old_token).await;
    assert_eq!((status, code(&body)), (400, "invalid_token"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("retired"),
        "{body}"
    );
    assert_eq!(api.put(worker, "orders-b", &new_token).await.0, 200);
    assert_eq!(
        api.public_keys().await,
        vec![(new_key.clone(), "active".into())]
    );
    let (_, listed) = api.call(root, Method::GET, "/v1/admin/keys").await;
    let states: Vec<(&str, &str)> = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["key_id"].as_str().unwrap(), k["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        vec![(old_key.as_str(), "retired"), (new_key.as_str(), "active")]
    );

    // Every change is in the audit log.
    let admin_lines = || {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["event"] == "admin_action")
            .collect();
        (lines.len() >= 2).then_some(lines)
    };
    let lines = poll(Duration::from_secs(10), admin_lines).expect("two admin_action lines");
    assert!(lines.iter().all(|l| l["principal"] == "root"), "{lines:?}");
    assert!(lines[0]["detail"].as_str().unwrap().contains("rotate"));
    assert!(lines[1]["detail"].as_str().unwrap().contains(&old_key));

    // Durable: after a crash the retired key stays retired and the new one signs.
    server.crash_and_restart();
    let api = Api::new(&server.url);
    let (status, body) = api.put(worker, "orders-a", &old_token).await;
    assert_eq!((status, code(&body)), (400, "invalid_token"), "{body}");
    assert_eq!(key_id_of(&api.acquire(worker, "orders-c").await), new_key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_rotation_and_retirement() {
    let (_dir, data, mut server) = on_new_data_dir();
    let data_arg = data.display().to_string();
    let api = Api::new(&server.url);
    let old_token = api.acquire(None, "a").await;
    let old_key = key_id_of(&old_token);

    // While the server runs the command refuses and points at the API.
    let refused = admin(&["keys", "rotate", "--data-dir", &data_arg]);
    assert!(!refused.success);
    assert!(
        refused.stderr.contains("/v1/admin/keys/rotate"),
        "{}",
        refused.stderr
    );
    server.kill();

    let listed = admin(&["keys", "list", "--data-dir", &data_arg]);
    assert!(listed.success, "{}", listed.stderr);
    assert_eq!(listed.json()["active"], old_key.as_str());
    let rotated = admin(&["keys", "rotate", "--data-dir", &data_arg]);
    assert!(rotated.success, "{}", rotated.stderr);
    let new_key = rotated.json()["active"].as_str().unwrap().to_owned();
    assert_ne!(new_key, old_key);

    let server = Server::start_in(&data, 0, &[]).expect("server starts");
    let api = Api::new(&server.url);
    assert_eq!(
        api.put(None, "a", &old_token).await.0,
        200,
        "old key verifies"
    );
    let new_token = api.acquire(None, "b").await;
    assert_eq!(key_id_of(&new_token), new_key);
    drop(server);

    let active = admin(&["keys", "retire", &new_key, "--data-dir", &data_arg]);
    assert!(!active.success);
    assert!(
        active.stderr.contains("active signing key"),
        "{}",
        active.stderr
    );
    let retired = admin(&["keys", "retire", &old_key, "--data-dir", &data_arg]);
    assert!(retired.success, "{}", retired.stderr);

    let server = Server::start_in(&data, 0, &[]).expect("server starts");
    let api = Api::new(&server.url);
    let (status, body) = api.put(None, "a", &old_token).await;
    assert_eq!((status, code(&body)), (400, "invalid_token"), "{body}");
    assert_eq!(api.put(None, "b", &new_token).await.0, 200);
}

/// Turns a current data directory into one of a version before key rotation: the
/// active key in `issuer.key`, no key set.
fn make_old_style(data: &Path) -> String {
    let set: Value = serde_json::from_slice(&std::fs::read(data.join(KEY_SET)).unwrap()).unwrap();
    let active = set["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["state"] == "active")
        .unwrap();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    use std::io::Write;
    options
        .open(data.join("issuer.key"))
        .unwrap()
        .write_all(active["secret"].as_str().unwrap().as_bytes())
        .unwrap();
    std::fs::remove_file(data.join(KEY_SET)).unwrap();
    active["key_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_issuer_key_is_migrated_to_a_key_set() {
    let (_dir, data, mut server) = on_new_data_dir();
    let token = Api::new(&server.url).acquire(None, "a").await;
    server.kill();
    let key = make_old_style(&data);
    assert_eq!(key_id_of(&token), key);

    let server = Server::start_in(&data, 0, &[]).expect("an old data directory starts");
    assert!(data.join(KEY_SET).exists());
    assert!(!data.join("issuer.key").exists(), "removed once migrated");
    let api = Api::new(&server.url);
    assert_eq!(
        api.public_keys().await,
        vec![(key.clone(), "active".into())]
    );
    assert_eq!(
        api.put(None, "a", &token).await.0,
        200,
        "its tokens still verify"
    );
    assert_eq!(key_id_of(&api.acquire(None, "b").await), key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_key_set_refuses_to_start_until_restored_or_replaced() {
    let (_dir, data, mut server) = on_new_data_dir();
    let data_arg = data.display().to_string();
    let token = Api::new(&server.url).acquire(None, "a").await;
    server.kill();
    let saved = std::fs::read(data.join(KEY_SET)).unwrap();

    std::fs::remove_file(data.join(KEY_SET)).unwrap();
    let stderr = serve_refused(&data);
    for needed in [
        KEY_SET,
        "is missing",
        "backup",
        "palisade admin keys rotate",
    ] {
        assert!(stderr.contains(needed), "{needed:?} not in: {stderr}");
    }
    assert!(!data.join(KEY_SET).exists(), "no new key was made");

    // Unreadable (damaged) is refused the same way.
    std::fs::write(data.join(KEY_SET), b"{\"format\": 1, \"keys\": [").unwrap();
    std::fs::set_permissions(
        data.join(KEY_SET),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let stderr = serve_refused(&data);
    assert!(
        stderr.contains(KEY_SET) && stderr.contains("palisade admin keys rotate"),
        "{stderr}"
    );

    // The way out, accepting that outstanding tokens stop verifying.
    let rotated = admin(&["keys", "rotate", "--data-dir", &data_arg]);
    assert!(rotated.success, "{}", rotated.stderr);
    assert!(rotated.stderr.contains("WARNING"), "{}", rotated.stderr);
    let kept = std::fs::read_dir(&data)
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("signing-keys.json.damaged-")
        });
    assert!(kept, "the damaged file is kept aside");
    let server = Server::start_in(&data, 0, &[]).expect("starts with the new set");
    let api = Api::new(&server.url);
    let (status, body) = api.put(None, "a", &token).await;
    assert_eq!((status, code(&body)), (400, "invalid_token"), "{body}");
    drop(server);

    // Restoring the saved file instead brings the old tokens back.
    std::fs::write(data.join(KEY_SET), saved).unwrap();
    let server = Server::start_in(&data, 0, &[]).expect("starts with the restored set");
    assert_eq!(Api::new(&server.url).put(None, "a", &token).await.0, 200);
}

/// With authentication off the admin routes are open, as every route is.
#[tokio::test]
async fn admin_routes_without_auth_are_open() {
    let server = Server::start(&[]);
    let http = Http::new(&server.url);
    let (status, body) = http.post("/v1/admin/keys/rotate").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http
        .send(
            http.client
                .post(format!("{}/v1/admin/keys/rotate", server.url))
                .body("{\"retire\": true}"),
        )
        .await;
    assert_eq!((status, code(&body)), (400, "bad_request"), "{body}");
}

/// Three nodes over etcd share one key set: rotate on node 1, the new key's tokens
/// verify on node 2 at once; retire on node 2, node 1 refuses the old key's token.
#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_etcd_share_the_key_set() {
    use common::topology::Topology;
    let topology = Topology::etcd(&[]);
    let nodes: Vec<Api> = topology.urls().iter().map(|u| Api::new(u)).collect();

    let old_token = nodes[0].acquire(None, "a").await;
    let old_key = key_id_of(&old_token);
    for node in &nodes {
        assert_eq!(
            node.public_keys().await,
            vec![(old_key.clone(), "active".into())]
        );
    }

    let (status, rotated) = nodes[0]
        .call(None, Method::POST, "/v1/admin/keys/rotate")
        .await;
    assert_eq!(status, 200, "{rotated}");
    let new_key = rotated["active"].as_str().unwrap().to_owned();
    let new_token = nodes[0].acquire(None, "b").await;
    assert_eq!(key_id_of(&new_token), new_key);
    // Node 2 has not polled yet, perhaps: an unknown key makes it read the set at once.
    assert_eq!(nodes[1].put(None, "b", &new_token).await.0, 200);
    assert_eq!(nodes[2].put(None, "a", &old_token).await.0, 200);
    // Every node picks up the rotation and signs with the new key.
    for node in &nodes {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !node
            .public_keys()
            .await
            .contains(&(new_key.clone(), "active".into()))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "{} never saw the rotation",
                node.base
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(key_id_of(&nodes[2].acquire(None, "c").await), new_key);

    let (status, body) = nodes[1].retire(None, &old_key).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = nodes[1].retire(None, &new_key).await;
    assert_eq!((status, code(&body)), (409, "key_active"), "{body}");
    // Node 1 learns of the retirement within its poll interval.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let (status, body) = nodes[0].put(None, "a", &old_token).await;
        if status != 200 {
            break (status, body);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node 1 still admits the retired key's token"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        (refused.0, code(&refused.1)),
        (400, "invalid_token"),
        "{:?}",
        refused.1
    );
    assert_eq!(nodes[0].put(None, "b", &new_token).await.0, 200);
}

/// A resource's verifier (the adapters') follows a rotation through
/// `palisade_client::IssuerKeys`: a new key's token is learned when first seen, a retired
/// key is dropped at the next refresh, even from the verifier's cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_verifier_follows_rotation() {
    use palisade_client::{Client, IssuerKeys};
    let server = Server::start(&[]);
    let api = Api::new(&server.url);
    let keys = IssuerKeys::fetch(Client::new(&server.url).unwrap(), 64)
        .await
        .unwrap();
    let verifier = keys.verifier();
    let old_token = api.acquire(None, "a").await;
    verifier
        .verify(&old_token)
        .expect("the issuer's key is trusted");

    let (status, rotated) = api.call(None, Method::POST, "/v1/admin/keys/rotate").await;
    assert_eq!(status, 200, "{rotated}");
    let new_token = api.acquire(None, "b").await;
    assert!(
        verifier.verify(&new_token).is_err(),
        "not known before it is learned"
    );
    keys.learn(&new_token).await.unwrap();
    verifier
        .verify(&new_token)
        .expect("learned from GET /v1/keys");
    verifier.verify(&old_token).expect("still verifying");

    let old_key = key_id_of(&old_token);
    let (status, body) = api.retire(None, &old_key).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(keys.refresh().await.unwrap(), 1);
    assert!(
        verifier.verify(&old_token).is_err(),
        "dropped with the retired key"
    );
    verifier.verify(&new_token).unwrap();
}
