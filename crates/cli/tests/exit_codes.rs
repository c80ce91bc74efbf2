//! Every exit code of the client commands (docs/cli.md), each from a real failure, with
//! its one-line message on stderr.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};

use common::principals::{auth_file, grant};
use common::{Server, BIN};

/// Runs `palisade ARGS` against `server` with no key or token from the environment.
fn palisade(server: &str, args: &[&str]) -> Output {
    palisade_env(server, args, &[])
}

fn palisade_env(server: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("PALISADE_SERVER", server)
        .env_remove("PALISADE_KEY")
        .env_remove("PALISADE_KEY_FILE")
        .env_remove("PALISADE_TOKEN");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run palisade")
}

/// Asserts the exit code, and that stderr is one `error: ` line containing `says`.
fn fails(out: &Output, code: i32, says: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(lines[0].contains(says), "expected {says:?} in {stderr}");
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn each_failure_has_its_exit_code() {
    let server = Server::start(&["--max-ttl-ms", "60000"]);
    let url = server.url.as_str();

    // 0, and --format token for scripts.
    let token_a = stdout(&palisade(
        url,
        &["lock", "acquire", "orders", "--format", "token"],
    ));
    assert!(token_a.starts_with("pal1."), "{token_a}");

    // 2: usage, from clap and from the server's bad_request.
    let out = palisade(url, &["lock", "acquire"]);
    assert_eq!(out.status.code(), Some(2));
    fails(
        &palisade(url, &["lock", "acquire", "no/slashes"]),
        2,
        "bad_request",
    );

    // 3: lock held, with the hint to wait.
    fails(
        &palisade(url, &["lock", "acquire", "orders"]),
        3,
        "lock_held: lock held by",
    );

    // 5: not found.
    fails(
        &palisade(url, &["kv", "get", "orders", "missing"]),
        5,
        "not_found",
    );

    // 6: the lease is gone.
    let lease: serde_json::Value =
        serde_json::from_str(&stdout(&palisade(url, &["lock", "acquire", "jobs"]))).unwrap();
    let lease_id = lease["lease_id"].as_str().unwrap();
    stdout(&palisade(url, &["lock", "release", lease_id]));
    fails(
        &palisade(url, &["lock", "keepalive", lease_id]),
        6,
        "lease_expired",
    );

    // 7: a failed precondition.
    stdout(&palisade(
        url,
        &["kv", "put", "orders", "k", "v1", "--token", &token_a],
    ));
    fails(
        &palisade(
            url,
            &[
                "kv",
                "put",
                "orders",
                "k",
                "v2",
                "--if-absent",
                "--token",
                &token_a,
            ],
        ),
        7,
        "revision_mismatch",
    );

    // 4: a stale token (after a newer holder wrote), a forged one, and `token check`.
    let check_output = |token: &str| {
        let out = palisade_env(url, &["token", "check"], &[("PALISADE_TOKEN", token)]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let status: serde_json::Value =
        serde_json::from_str(&stdout(&palisade(url, &["lock", "status", "orders"]))).unwrap();
    stdout(&palisade(
        url,
        &["lock", "release", status["lease_id"].as_str().unwrap()],
    ));
    let token_b = stdout(&palisade(
        url,
        &["lock", "acquire", "orders", "--format", "token"],
    ));
    stdout(&palisade_env(
        url,
        &["kv", "put", "orders", "k", "v3"],
        &[("PALISADE_TOKEN", &token_b)],
    ));
    fails(
        &palisade(
            url,
            &["kv", "put", "orders", "k", "late", "--token", &token_a],
        ),
        4,
        "stale_token",
    );
    fails(
        &palisade(
            url,
            &["kv", "put", "orders", "k", "x", "--token", "pal1.forged"],
        ),
        4,
        "invalid_token",
    );
    let out = palisade_env(url, &["token", "check"], &[("PALISADE_TOKEN", &token_a)]);
    fails(&out, 4, "stale_token: the token's epoch");
    assert!(check_output(&token_a).contains("\"genuine\": true"));
    let out = palisade_env(url, &["token", "check"], &[("PALISADE_TOKEN", &token_b)]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    // 10: a quota.
    fails(
        &palisade(url, &["lock", "acquire", "long", "--ttl-ms", "120000"]),
        10,
        "quota_exceeded",
    );

    // 11: nobody listens there, with the hint to start a server.
    let nobody = format!("http://127.0.0.1:{}", common::free_port());
    fails(
        &palisade(&nobody, &["lock", "status"]),
        11,
        &format!("no server at {nobody}: start one with `palisade serve`"),
    );

    // 12: something answers, but not as a Palisade server would.
    fails(
        &palisade(&not_palisade(), &["keys"]),
        12,
        "is --server right?",
    );
}

/// A server that answers every request with a 500 and an HTML page.
fn not_palisade() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let body = "<html>oops</html>";
            let _ = write!(
                stream,
                "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

#[test]
fn authentication_and_permission_have_their_own_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (file, people) = auth_file(dir.path(), &[("reader", &grant("orders", &["read"]))]);
    let server = Server::start(&["--auth-file", file.to_str().unwrap()]);
    let url = server.url.as_str();
    fails(
        &palisade(url, &["lock", "acquire", "orders"]),
        8,
        "--key-file FILE or the PALISADE_KEY variable",
    );
    fails(
        &palisade_env(
            url,
            &["lock", "acquire", "orders"],
            &[("PALISADE_KEY", &people[0].key)],
        ),
        9,
        "permission_denied",
    );
    // The same key may read: the answer, not a refusal (the lock was never acquired: 5).
    let out = palisade_env(
        url,
        &["lock", "status", "orders"],
        &[("PALISADE_KEY", &people[0].key)],
    );
    fails(&out, 5, "never been acquired");
}

#[test]
fn a_failure_of_this_side_is_1_and_says_it_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    fails(&out, 1, "is not a Palisade data directory");
    // An OS error appears once, though the error and its source both carry it.
    let out = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            "/proc/no/such/dir",
        ])
        .output()
        .unwrap();
    fails(&out, 1, "cannot use data directory /proc/no/such/dir");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("(os error").count(), 1, "{stderr}");
}

#[test]
fn bench_names_the_feature_that_builds_a_peer_driver() {
    let out = Command::new(BIN)
        .args(["bench", "--target", "redis", "--duration", "1s", "--quiet"])
        .output()
        .unwrap();
    fails(&out, 2, "--features bench-peers");
    let manifest = include_str!("../Cargo.toml");
    assert!(manifest.contains("\nbench-peers = "), "the feature exists");
}

/// The sequence policy's refusals give the advice that fixes them: the flag to add, and
/// a higher `--seq` (not a new acquisition) when no newer holder exists.
#[test]
fn sequence_refusals_name_the_flag_and_the_right_fix() {
    let server = Server::start(&["--policy", "seq.*=sequence"]);
    let url = &server.url;
    let token = stdout(&palisade(
        url,
        &["lock", "acquire", "seq.a", "--format", "token"],
    ));
    let env = [("PALISADE_TOKEN", token.as_str())];
    let put = |args: &[&str]| {
        let mut all = vec!["kv", "put", "seq.a", "k", "v"];
        all.extend_from_slice(args);
        palisade_env(url, &all, &env)
    };
    fails(&put(&[]), 2, "--seq");
    stdout(&put(&["--seq", "1"]));
    let replay = put(&["--seq", "1"]);
    fails(&replay, 4, "stale_sequence");
    fails(&replay, 4, "send a higher --seq");
    let stderr = String::from_utf8_lossy(&replay.stderr);
    assert!(!stderr.contains("newer holder"), "{stderr}");
    stdout(&put(&["--seq", "2"]));
}

/// A write or a barrier without a token is `missing_token` (exit 4), as the table says,
/// and says where a token comes from; nothing is sent (no server listens here).
#[test]
fn a_write_without_a_token_says_where_tokens_come_from() {
    let nobody = "http://127.0.0.1:1";
    for args in [
        &["kv", "put", "orders", "k", "v"][..],
        &["kv", "del", "orders", "k"],
        &["fence", "orders"],
    ] {
        let out = palisade(nobody, args);
        fails(&out, 4, "missing_token");
        fails(&out, 4, "PALISADE_TOKEN");
    }
}

/// A `--server` that cannot be meant is refused before any request, with the fix: no
/// scheme, or a path ending in /v1 (exit 2); https:// against a plain server says so
/// (exit 11).
#[test]
fn a_wrong_server_url_says_what_is_wrong() {
    for (server, says) in [
        ("127.0.0.1:7700", "write http://127.0.0.1:7700"),
        ("localhost:7700", "write http://localhost:7700"),
        ("http://127.0.0.1:7700/v1", "ends in /v1"),
    ] {
        fails(&palisade(server, &["lock", "status", "x"]), 2, says);
    }
    let plain = Server::start(&[]);
    let https = plain.url.replacen("http://", "https://", 1);
    fails(
        &palisade(&https, &["lock", "status", "x"]),
        11,
        "does not speak TLS there: use http://",
    );
}

/// `lock status` of a lock never acquired is not_found (5), as the table says; of a lock
/// acquired once, 0 (its JSON printed either way).
#[test]
fn status_of_a_lock_never_acquired_is_not_found() {
    let server = Server::start(&[]);
    let url = &server.url;
    let out = palisade(url, &["lock", "status", "nosuchlock"]);
    fails(
        &out,
        5,
        "not_found: lock nosuchlock has never been acquired",
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"epoch\": 0"));
    stdout(&palisade(
        url,
        &["lock", "acquire", "once", "--holder", "h"],
    ));
    stdout(&palisade(url, &["lock", "status", "once"]));
}

/// A token whose lease ended: `token check` exits 6 and says that its writes still land
/// until a newer holder writes or fences, which a write then shows.
#[test]
fn token_check_after_the_lease_ended_says_writes_still_land() {
    let server = Server::start(&[]);
    let url = &server.url;
    let token = stdout(&palisade(
        url,
        &[
            "lock", "acquire", "short", "--ttl-ms", "100", "--format", "token",
        ],
    ));
    let env = [("PALISADE_TOKEN", token.as_str())];
    let ended = common::poll(std::time::Duration::from_secs(10), || {
        let out = palisade_env(url, &["token", "check"], &env);
        (out.status.code() == Some(6)).then_some(out)
    })
    .expect("the lease ends");
    fails(
        &ended,
        6,
        "still admitted until a newer holder writes or fences",
    );
    stdout(&palisade_env(
        url,
        &["kv", "put", "short", "k", "late"],
        &env,
    ));
}
