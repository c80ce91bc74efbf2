//! The client commands' connection flags: the bearer key (from `--key-file` or
//! `PALISADE_KEY`) goes out as `Authorization: Bearer <key>`, and a key file that others
//! may read is refused before anything is sent.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Duration;

/// A one-request server that answers a lock status and hands back the request head.
fn capture_one_request() -> (String, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        // A lock acquired once and free now (`lock status` of one never acquired exits 5).
        let body = r#"{"lock":"x","epoch":1,"holder":null,"lease_id":null,"remaining_ms":null,"waiters":0}"#;
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = tx.send(String::from_utf8_lossy(&head).to_string());
    });
    (url, rx)
}

fn status(url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_palisade"));
    command
        .args(["lock", "status", "x", "--server", url])
        .args(args)
        .env_remove("PALISADE_KEY")
        .env_remove("PALISADE_KEY_FILE");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run palisade")
}

/// Flags, environment, and the Authorization header expected.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], Option<&'a str>);

fn authorization(head: &str) -> Option<String> {
    head.lines()
        .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
        .map(|l| l["authorization:".len()..].trim().to_owned())
}

#[test]
fn the_key_is_sent_as_a_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "from-the-file\n").unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let key_arg = key_file.display().to_string();

    let cases: [Case; 4] = [
        (&["--key-file", &key_arg], &[], Some("Bearer from-the-file")),
        (
            &[],
            &[("PALISADE_KEY", "from-the-env")],
            Some("Bearer from-the-env"),
        ),
        (
            &["--key-file", &key_arg],
            &[("PALISADE_KEY", "from-the-env")],
            Some("Bearer from-the-file"),
        ),
        (&[], &[], None),
    ];
    for (args, env, expected) in cases {
        let (url, head) = capture_one_request();
        let out = status(&url, args, env);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let head = head.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(
            authorization(&head).as_deref(),
            expected,
            "{args:?} {env:?}"
        );
    }
}

#[test]
fn a_key_file_others_may_read_is_refused_before_sending() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "secret\n").unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (url, head) = capture_one_request();
    let out = status(&url, &["--key-file", &key_file.display().to_string()], &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("chmod 600"), "{stderr}");
    assert!(
        head.recv_timeout(Duration::from_millis(500)).is_err(),
        "a request was sent"
    );
}
