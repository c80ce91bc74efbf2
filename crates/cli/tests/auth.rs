//! Identity, permission and ownership (S14) against the real binary: every route under
//! every kind of caller, lease theft attempts, the loopback rule and `palisade auth`.

mod common;

use std::process::{Command, Stdio};

use common::principals::{auth_file, digest, grant, Api};
use common::{code, Server};
use reqwest::Method;
use serde_json::{json, Value};

/// Who calls, in the route table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum As {
    NoKey,
    UnknownKey,
    /// A principal with every verb on the lock but the route's.
    WithoutVerb,
    /// A principal with every verb, on other locks only.
    OtherLock,
    /// The principal whose lease and token the request uses.
    Owner,
    Admin,
}

/// Every verb a grant can give on locks.
const ALL: [&str; 4] = ["acquire", "read", "write", "check"];

/// The key of principal `name` of an auth file.
fn key_of(people: &[common::principals::Who], name: &str) -> String {
    people.iter().find(|w| w.name == name).unwrap().key.clone()
}

/// An auth file (in `dir`) of two principals with every verb on their locks, and the
/// admin `ops`; with the principals' keys by name.
fn two_and_ops(
    dir: &std::path::Path,
    (a, a_locks): (&'static str, &str),
    (b, b_locks): (&'static str, &str),
) -> (std::path::PathBuf, impl Fn(&str) -> String) {
    let (file, people) = auth_file(
        dir,
        &[
            (a, &grant(a_locks, &ALL)),
            (b, &grant(b_locks, &ALL)),
            ("ops", "admin = true"),
        ],
    );
    (file, move |name: &str| key_of(&people, name))
}

const CALLERS: [As; 6] = [
    As::NoKey,
    As::UnknownKey,
    As::WithoutVerb,
    As::OtherLock,
    As::Owner,
    As::Admin,
];

#[tokio::test]
async fn every_route_under_every_caller() {
    let dir = tempfile::tempdir().unwrap();
    let all = ALL;
    let but = |verb: &str| -> Vec<&str> { all.iter().copied().filter(|v| *v != verb).collect() };
    let (file, people) = auth_file(
        dir.path(),
        &[
            ("owner", &grant("r*", &all)),
            ("no-acquire", &grant("r*", &but("acquire"))),
            ("no-read", &grant("r*", &but("read"))),
            ("no-write", &grant("r*", &but("write"))),
            ("no-check", &grant("r*", &but("check"))),
            // Status and listing need acquire or read: this one has neither.
            ("no-look", &grant("r*", &["write", "check"])),
            ("other", &grant("other*", &all)),
            ("admin", "admin = true"),
        ],
    );
    let key = |name: &str| key_of(&people, name);
    let admin = key("admin");
    let server = Server::start(&["--auth-file", file.to_str().unwrap()]);
    let api = Api::new(&server);

    // route: (method, path template, the principal that lacks the route's verb, body,
    // does the request mutate, expected success status)
    struct Route {
        name: &'static str,
        method: Method,
        without: &'static str,
        mutates: bool,
    }
    let routes = [
        Route {
            name: "status",
            method: Method::GET,
            without: "no-look",
            mutates: false,
        },
        Route {
            name: "acquire",
            method: Method::POST,
            without: "no-acquire",
            mutates: true,
        },
        // A keepalive moves only remaining_ms, which the state comparison leaves out.
        Route {
            name: "keepalive",
            method: Method::POST,
            without: "no-acquire",
            mutates: false,
        },
        Route {
            name: "release",
            method: Method::POST,
            without: "no-acquire",
            mutates: true,
        },
        Route {
            name: "kv-list",
            method: Method::GET,
            without: "no-read",
            mutates: false,
        },
        Route {
            name: "kv-get",
            method: Method::GET,
            without: "no-read",
            mutates: false,
        },
        Route {
            name: "kv-put",
            method: Method::PUT,
            without: "no-write",
            mutates: true,
        },
        Route {
            name: "kv-delete",
            method: Method::DELETE,
            without: "no-write",
            mutates: true,
        },
        Route {
            name: "fence-get",
            method: Method::GET,
            without: "no-read",
            mutates: false,
        },
        Route {
            name: "fence-post",
            method: Method::POST,
            without: "no-write",
            mutates: true,
        },
        Route {
            name: "token-check",
            method: Method::POST,
            without: "no-check",
            mutates: false,
        },
    ];

    for (n, route) in routes.iter().enumerate() {
        for caller in CALLERS {
            // A lock of its own for every row: the owner holds it (except for acquire,
            // where it is free) and has written k = v.
            let lock = format!("r{n}-{caller:?}").to_lowercase();
            let mut lease = api.acquire(&key("owner"), &lock, Some("w1")).await;
            let mut token = lease["token"].as_str().unwrap().to_owned();
            let (s, b) = api.put(&key("owner"), &lock, "k", &token, "v").await;
            assert_eq!(s, 200, "{b}");
            if route.name == "fence-post" || route.name == "acquire" {
                let id = lease["lease_id"].as_str().unwrap();
                let (s, b, _) = api
                    .send(api.req(
                        Some(&key("owner")),
                        Method::POST,
                        &format!("/v1/leases/{id}/release"),
                    ))
                    .await;
                assert_eq!(s, 200, "{b}");
                lease = Value::Null;
            }
            if route.name == "fence-post" {
                // A newer epoch than the mark, so that an admitted barrier shows.
                lease = api.acquire(&key("owner"), &lock, Some("w1")).await;
                token = lease["token"].as_str().unwrap().to_owned();
            }
            let lease_id = lease["lease_id"].as_str().unwrap_or("none").to_owned();
            let path = match route.name {
                "status" => format!("/v1/locks/{lock}"),
                "acquire" => format!("/v1/locks/{lock}/acquire"),
                "keepalive" => format!("/v1/leases/{lease_id}/keepalive"),
                "release" => format!("/v1/leases/{lease_id}/release"),
                "kv-list" => format!("/v1/kv/{lock}"),
                "kv-get" | "kv-put" | "kv-delete" => format!("/v1/kv/{lock}/k"),
                "fence-get" | "fence-post" => format!("/v1/fences/{lock}"),
                "token-check" => "/v1/tokens/check".to_owned(),
                other => unreachable!("{other}"),
            };
            let auth = match caller {
                As::NoKey => None,
                As::UnknownKey => Some("not-a-key-anyone-has".to_owned()),
                As::WithoutVerb => Some(key(route.without)),
                As::OtherLock => Some(key("other")),
                As::Owner => Some(key("owner")),
                As::Admin => Some(admin.clone()),
            };
            let mut req = api.req(auth.as_deref(), route.method.clone(), &path);
            req = match route.name {
                "acquire" => req.json(&json!({"ttl_ms": 60_000})),
                "kv-put" => req.header("Fencing-Token", &token).body("new"),
                "kv-delete" | "fence-post" => req.header("Fencing-Token", &token),
                "token-check" => req.json(&json!({"token": token})),
                _ => req,
            };
            let before = api.state(&admin, &lock).await;
            let (status, body, headers) = api.send(req).await;
            let row = format!("{} as {caller:?}: {status} {body}", route.name);
            match caller {
                As::NoKey | As::UnknownKey => {
                    assert_eq!((status, code(&body)), (401, "unauthenticated"), "{row}");
                    let challenge = headers.get("www-authenticate").map(|v| v.to_str().unwrap());
                    assert_eq!(challenge, Some("Bearer realm=\"palisade\""), "{row}");
                }
                As::WithoutVerb | As::OtherLock => {
                    assert_eq!((status, code(&body)), (403, "permission_denied"), "{row}");
                }
                As::Owner | As::Admin => assert_eq!(status, 200, "{row}"),
            }
            let after = api.state(&admin, &lock).await;
            if !matches!(caller, As::Owner | As::Admin) || !route.mutates {
                assert_eq!(before, after, "{row}: a refused request changed something");
            } else {
                assert_ne!(before, after, "{row}: an admitted mutation changed nothing");
            }
        }
    }

    // Public routes need no key; a wrong one does not matter there either.
    for path in ["/healthz", "/v1/keys", "/v1/openapi.json"] {
        for auth in [None, Some("not-a-key")] {
            let (status, body, _) = api.send(api.req(auth, Method::GET, path)).await;
            assert_eq!(status, 200, "{path} {auth:?}: {body}");
        }
    }
    // Every other route, unknown ones included, needs a key first.
    for (method, path) in [(Method::GET, "/v1/locks"), (Method::GET, "/v1/nope")] {
        let (status, body, _) = api.send(api.req(None, method, path)).await;
        assert_eq!((status, code(&body)), (401, "unauthenticated"), "{path}");
    }
}

#[tokio::test]
async fn lease_theft_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (file, key) = two_and_ops(dir.path(), ("victim", "jobs*"), ("thief", "jobs*"));
    let (victim, thief, ops) = (key("victim"), key("thief"), key("ops"));
    let server = Server::start(&["--auth-file", file.to_str().unwrap()]);
    let api = Api::new(&server);

    let lease = api.acquire(&victim, "jobs", Some("worker-1")).await;
    assert_eq!(lease["holder"], "victim/worker-1");
    let lease_id = lease["lease_id"].as_str().unwrap().to_owned();
    let token = lease["token"].as_str().unwrap().to_owned();

    // The lease id is shown to its owner and admins only.
    for (who, shown) in [(&victim, true), (&ops, true), (&thief, false)] {
        let (_, status, _) = api
            .send(api.req(Some(who), Method::GET, "/v1/locks/jobs"))
            .await;
        assert_eq!(status["holder"], "victim/worker-1");
        assert_eq!(status["lease_id"].is_string(), shown, "{status}");
        let (_, list, _) = api.send(api.req(Some(who), Method::GET, "/v1/locks")).await;
        let entry = &list["locks"][0];
        assert_eq!(entry["lock"], "jobs");
        assert_eq!(entry["lease_id"].is_string(), shown, "{list}");
    }

    // Keepalive and release of someone else's lease.
    for action in ["keepalive", "release"] {
        let (status, body, _) = api
            .send(api.req(
                Some(&thief),
                Method::POST,
                &format!("/v1/leases/{lease_id}/{action}"),
            ))
            .await;
        assert_eq!(
            (status, code(&body)),
            (403, "permission_denied"),
            "{action}: {body}"
        );
    }
    // Acquiring in the victim's name: the name is only ever a label under one's own.
    let (status, body, _) = api
        .send(
            api.req(Some(&thief), Method::POST, "/v1/locks/jobs2/acquire")
                .json(&json!({"holder": "victim", "ttl_ms": 60_000})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["holder"], "thief/victim");
    let claims = token_holder(body["token"].as_str().unwrap());
    assert_eq!(claims, "thief/victim");
    // Writing with the victim's genuine token.
    let (status, body) = api.put(&thief, "jobs", "k", &token, "stolen").await;
    assert_eq!((status, code(&body)), (403, "permission_denied"), "{body}");
    // The victim's own write still goes through, and the lease is still its own.
    let (status, body) = api.put(&victim, "jobs", "k", &token, "mine").await;
    assert_eq!(status, 200, "{body}");
    let (status, body, _) = api
        .send(api.req(
            Some(&victim),
            Method::POST,
            &format!("/v1/leases/{lease_id}/keepalive"),
        ))
        .await;
    assert_eq!(status, 200, "{body}");
    // An admin may release it (and that is what the audit log is for).
    let (status, body, _) = api
        .send(api.req(
            Some(&ops),
            Method::POST,
            &format!("/v1/leases/{lease_id}/release"),
        ))
        .await;
    assert_eq!(status, 200, "{body}");
}

/// The holder claim of a token (its payload, not verified: the server did that).
fn token_holder(token: &str) -> String {
    use base64::Engine;
    let payload = token.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    let claims: Value = serde_json::from_slice(&bytes).unwrap();
    claims["h"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn the_audit_log_names_who_did_what() {
    let dir = tempfile::tempdir().unwrap();
    let (file, key) = two_and_ops(dir.path(), ("a", "x*"), ("b", "y*"));
    let audit = dir.path().join("audit.log");
    let server = Server::start(&[
        "--auth-file",
        file.to_str().unwrap(),
        "--audit-log",
        audit.to_str().unwrap(),
    ]);
    let api = Api::new(&server);
    let old = api.acquire(&key("a"), "x", None).await;
    let old_token = old["token"].as_str().unwrap().to_owned();
    // A wrong key, a permission denial, a lease released by an admin, a stale write.
    api.send(api.req(Some("wrong"), Method::GET, "/v1/locks"))
        .await;
    api.send(api.req(Some(&key("b")), Method::GET, "/v1/kv/x"))
        .await;
    let id = old["lease_id"].as_str().unwrap();
    let (s, _, _) = api
        .send(api.req(
            Some(&key("ops")),
            Method::POST,
            &format!("/v1/leases/{id}/release"),
        ))
        .await;
    assert_eq!(s, 200);
    let new = api.acquire(&key("a"), "x", None).await;
    let (s, _) = api
        .put(&key("a"), "x", "k", new["token"].as_str().unwrap(), "v")
        .await;
    assert_eq!(s, 200);
    let (s, body) = api.put(&key("a"), "x", "k", &old_token, "late").await;
    assert_eq!((s, code(&body)), (409, "stale_token"));

    let wanted = [
        "auth_failed",
        "permission_denied",
        "lease_released_by_other",
        "stale_token",
    ];
    let lines = common::poll(std::time::Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let all_there = wanted
            .iter()
            .all(|w| lines.iter().any(|l| l["event"] == *w));
        all_there.then_some(lines)
    })
    .expect("every event in the audit log");
    let find = |event: &str| lines.iter().find(|l| l["event"] == event).unwrap();
    assert_eq!(find("auth_failed")["route"], "/v1/locks");
    assert_eq!(find("permission_denied")["principal"], "b");
    assert_eq!(find("permission_denied")["lock"], "x");
    assert_eq!(find("lease_released_by_other")["principal"], "ops");
    assert_eq!(find("lease_released_by_other")["lock"], "x");
    let stale = find("stale_token");
    assert_eq!(
        (
            &stale["principal"],
            &stale["lock"],
            &stale["epoch"],
            &stale["high_water"]
        ),
        (&json!("a"), &json!("x"), &json!(1), &json!(2))
    );
    assert!(lines
        .iter()
        .all(|l| l["ts"].as_str().is_some_and(|t| t.ends_with('Z'))));
}

#[test]
fn without_auth_only_loopback_unless_told_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--auth-file") && err.contains("--insecure-no-auth"),
        "{err}"
    );
    assert!(!data.exists(), "a refused start wrote its data dir");

    // Told otherwise: it starts, and says loudly what it is doing.
    let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--insecure-no-auth",
            "--data-dir",
        ])
        .arg(&data)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(palisade_api::listening::parse(&line).is_some(), "{line:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("WITHOUT authentication"), "{err}");
}

#[test]
fn new_keys_are_random_and_their_digests_match() {
    let run = |args: &[&str], stdin: Option<&str>| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(text) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let parse = |text: &str| {
        let key = text
            .lines()
            .find_map(|l| l.strip_prefix("key: "))
            .unwrap()
            .to_owned();
        let digest = text
            .lines()
            .find_map(|l| l.strip_prefix("key_sha256 = \""))
            .unwrap()
            .trim_end_matches('"')
            .to_owned();
        (key, digest)
    };
    let (k1, d1) = parse(&run(&["auth", "new-key"], None));
    let (k2, _) = parse(&run(&["auth", "new-key"], None));
    assert_ne!(k1, k2);
    assert_eq!(d1, digest(&k1));
    use base64::Engine;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(k1.strip_prefix("pal_").unwrap())
        .unwrap();
    assert_eq!(raw.len(), 32, "256 bits");
    let hashed = run(&["auth", "hash-key"], Some(&format!("{k1}\n")));
    assert_eq!(hashed.trim(), format!("key_sha256 = \"{d1}\""));
}

#[test]
fn a_bad_auth_file_refuses_to_start_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.toml");
    std::fs::write(&file, "[[principal]]\nname = \"a\"\nkey_sha256 = \"12\"\n").unwrap();
    let data = dir.path().join("data");
    let out = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["serve", "--listen", "127.0.0.1:0", "--auth-file"])
        .arg(&file)
        .arg("--data-dir")
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("auth.toml") && err.contains("64 hex"), "{err}");
    assert!(!data.exists());
}
