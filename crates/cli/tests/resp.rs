//! The RESP listener (`--resp-listen`) against the real binary, through the Redis client
//! library where a client would use one and raw bytes where the bytes are the point: the
//! hot routes answer as over HTTP and share its state, a stale token is refused, the same
//! authentication applies (a reload included), and bytes that are not a command are
//! refused and close the connection without harming the server.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::principals::{auth_file, grant};
use common::{Http, Server};
use redis::Value;

fn resp_addr(server: &Server) -> String {
    let url = server
        .resp_url
        .as_deref()
        .expect("a RESP URL in the start-up line");
    url.trim_start_matches("redis://").to_owned()
}

async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connects")
}

/// Runs a command; its reply, or the error's code and message.
async fn call(
    con: &mut redis::aio::MultiplexedConnection,
    args: &[&[u8]],
) -> Result<Value, (String, String)> {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async::<Value>(con).await.map_err(|e| {
        (
            e.code().unwrap_or("").to_owned(),
            e.detail().unwrap_or("").to_owned(),
        )
    })
}

/// A map reply's field (a RESP3 map, or a RESP2 flat array of names and values).
fn field<'a>(reply: &'a Value, name: &str) -> &'a Value {
    let pairs: Vec<(&Value, &Value)> = match reply {
        Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
        Value::Array(items) => items.chunks(2).map(|c| (&c[0], &c[1])).collect(),
        other => panic!("not a map: {other:?}"),
    };
    pairs
        .into_iter()
        .find(|(k, _)| matches!(k, Value::BulkString(b) if b == name.as_bytes()))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no field {name} in {reply:?}"))
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("not an integer: {other:?}"),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        other => panic!("not a string: {other:?}"),
    }
}

#[tokio::test]
async fn the_hot_routes_over_resp_share_the_http_state_and_refuse_a_stale_token() {
    let server = Server::start(&["--resp-listen", "127.0.0.1:0"]);
    let url = format!("{}/?protocol=resp3", server.resp_url.clone().unwrap());
    let mut con = connect(&url).await;

    let first = call(
        &mut con,
        &[b"LOCK.ACQUIRE", b"inv", b"60000", b"HOLDER", b"w1"],
    )
    .await
    .unwrap();
    assert!(
        matches!(first, Value::Map(_)),
        "RESP3 answers a map: {first:?}"
    );
    assert_eq!(int(field(&first, "epoch")), 1);
    assert_eq!(text(field(&first, "holder")), "w1");
    let old_token = text(field(&first, "token"));
    let written = call(
        &mut con,
        &[b"KV.PUT", b"inv", b"k", b"from w1", old_token.as_bytes()],
    )
    .await
    .unwrap();
    assert_eq!(int(field(&written, "epoch")), 1);
    assert_eq!(field(&written, "replayed"), &Value::Boolean(false));

    // A second holder must wait: the lock is held.
    let held = call(
        &mut con,
        &[b"LOCK.ACQUIRE", b"inv", b"60000", b"HOLDER", b"w2"],
    )
    .await;
    assert_eq!(held.unwrap_err().0, "LOCK_HELD");

    // Released over RESP, granted again with the next epoch, written by the new holder.
    let lease_id = text(field(&first, "lease_id"));
    let released = call(&mut con, &[b"LOCK.RELEASE", lease_id.as_bytes()])
        .await
        .unwrap();
    assert_eq!(field(&released, "released"), &Value::Boolean(true));
    let second = call(
        &mut con,
        &[b"LOCK.ACQUIRE", b"inv", b"60000", b"HOLDER", b"w2"],
    )
    .await
    .unwrap();
    assert_eq!(int(field(&second, "epoch")), 2);
    let new_token = text(field(&second, "token"));
    call(
        &mut con,
        &[b"KV.PUT", b"inv", b"k", b"from w2", new_token.as_bytes()],
    )
    .await
    .unwrap();

    // The paused first holder's late write is refused, with the mark in the details.
    let (code, message) = call(
        &mut con,
        &[b"KV.PUT", b"inv", b"k", b"late", old_token.as_bytes()],
    )
    .await
    .unwrap_err();
    assert_eq!(code, "STALE_TOKEN", "{message}");
    assert!(message.contains("high_water=2"), "{message}");
    let value = call(&mut con, &[b"KV.GET", b"inv", b"k"]).await.unwrap();
    assert_eq!(value, Value::BulkString(b"from w2".to_vec()));

    // HTTP sees the same store and the same lock.
    let http = Http::new(&server.url);
    assert_eq!(http.get_value("inv", "k").await.as_deref(), Some("from w2"));
    let (_, status) = http.get("/v1/locks/inv").await;
    assert_eq!(status["holder"], "w2");
    let renewed = call(
        &mut con,
        &[
            b"LOCK.KEEPALIVE",
            text(field(&second, "lease_id")).as_bytes(),
        ],
    )
    .await
    .unwrap();
    assert_eq!(int(field(&renewed, "epoch")), 2);

    // A missing key is a null, a delete needs the token as a put does.
    assert_eq!(
        call(&mut con, &[b"KV.GET", b"inv", b"none"]).await.unwrap(),
        Value::Nil
    );
    let (code, _) = call(&mut con, &[b"KV.DEL", b"inv", b"k", old_token.as_bytes()])
        .await
        .unwrap_err();
    assert_eq!(code, "STALE_TOKEN");
    call(&mut con, &[b"KV.DEL", b"inv", b"k", new_token.as_bytes()])
        .await
        .unwrap();
    assert_eq!(
        call(&mut con, &[b"KV.GET", b"inv", b"k"]).await.unwrap(),
        Value::Nil
    );

    // Bad input: a typed error, and nothing changed.
    for (args, expected) in [
        (vec![&b"KV.GET"[..], b"bad name!", b"k"], "BAD_REQUEST"),
        (vec![&b"LOCK.ACQUIRE"[..], b"inv2", b"soon"], "BAD_REQUEST"),
        (vec![&b"LOCK.ACQUIRE"[..], b"inv2"], "BAD_REQUEST"),
        (
            vec![&b"KV.PUT"[..], b"inv", b"k", b"v", b""],
            "MISSING_TOKEN",
        ),
        (
            vec![&b"KV.PUT"[..], b"inv", b"k", b"v", b"not-a-token"],
            "INVALID_TOKEN",
        ),
        (vec![&b"NOSUCH"[..]], "BAD_REQUEST"),
    ] {
        let (code, message) = call(&mut con, &args).await.unwrap_err();
        assert_eq!(code, expected, "{args:?}: {message}");
    }
    assert_eq!(
        call(&mut con, &[b"KV.GET", b"inv", b"k"]).await.unwrap(),
        Value::Nil
    );
}

/// Sends `bytes` on a raw connection and reads until the server closes it or `want`
/// bytes arrived.
fn exchange(addr: &str, bytes: &[u8], want: usize) -> (Vec<u8>, bool) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream.write_all(bytes).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (got, true),
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.len() >= want {
                    // Closed right after, or still open?
                    stream
                        .set_read_timeout(Some(Duration::from_millis(300)))
                        .unwrap();
                    let closed = matches!(stream.read(&mut buf), Ok(0));
                    return (got, closed);
                }
            }
            Err(_) => return (got, false),
        }
    }
}

#[test]
fn pipelined_commands_answer_in_order_in_resp2_until_hello_3() {
    let server = Server::start(&["--resp-listen", "127.0.0.1:0"]);
    let addr = resp_addr(&server);
    let pipeline = b"*1\r\n$4\r\nPING\r\n*3\r\n$6\r\nKV.GET\r\n$1\r\na\r\n$1\r\nk\r\n\
*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n*3\r\n$6\r\nKV.GET\r\n$1\r\na\r\n$1\r\nk\r\n";
    let (got, closed) = exchange(&addr, pipeline, 1);
    let text = String::from_utf8_lossy(&got);
    // The HELLO reply's length varies with the version; find the parts around it.
    assert!(text.starts_with("+PONG\r\n$-1\r\n%7\r\n"), "{text:?}");
    assert!(
        text.ends_with("_\r\n"),
        "RESP3 null after HELLO 3: {text:?}"
    );
    assert!(!closed, "the connection stays open");
}

#[test]
fn bytes_that_are_not_a_command_are_refused_and_close_the_connection() {
    let server = Server::start(&["--resp-listen", "127.0.0.1:0", "--max-value-bytes", "1024"]);
    let addr = resp_addr(&server);
    for (bytes, code) in [
        (&b"PING\r\n"[..], "-BAD_REQUEST Protocol error"),
        (b"*1\r\n*1\r\n*1\r\n*1\r\n", "-BAD_REQUEST Protocol error"),
        (b"*1\r\n$-5\r\n", "-BAD_REQUEST Protocol error"),
        (b"*99\r\n", "-BAD_REQUEST Protocol error"),
        // More than the value limit plus the command's overhead, refused on its length.
        (
            b"*1\r\n$9999999999\r\n",
            "-PAYLOAD_TOO_LARGE Protocol error",
        ),
    ] {
        let (got, closed) = exchange(&addr, bytes, 1);
        let text = String::from_utf8_lossy(&got);
        assert!(text.starts_with(code), "{bytes:?}: {text:?}");
        assert!(
            closed,
            "{bytes:?}: the connection closes after a protocol error"
        );
    }
    // A value over the limit in a well-formed command is the route's refusal.
    let value = vec![b'x'; 2048];
    let mut put = b"*5\r\n$6\r\nKV.PUT\r\n$1\r\na\r\n$1\r\nk\r\n$2048\r\n".to_vec();
    put.extend_from_slice(&value);
    put.extend_from_slice(b"\r\n$1\r\nt\r\n");
    let (got, _) = exchange(&addr, &put, 1);
    assert!(
        String::from_utf8_lossy(&got).starts_with("-INVALID_TOKEN"),
        "the token is checked before the value: {:?}",
        String::from_utf8_lossy(&got)
    );
    // The server still serves.
    let (got, _) = exchange(&addr, b"*1\r\n$4\r\nPING\r\n", 7);
    assert_eq!(&got[..], b"+PONG\r\n");
}

#[test]
fn an_incomplete_command_is_closed_at_the_header_timeout() {
    let server = Server::start(&["--resp-listen", "127.0.0.1:0", "--header-timeout-ms", "300"]);
    let mut stream = TcpStream::connect(resp_addr(&server)).unwrap();
    stream.write_all(b"*2\r\n$4\r\nPING\r\n").unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 64];
    let started = std::time::Instant::now();
    assert!(
        matches!(stream.read(&mut buf), Ok(0)),
        "closed without an answer"
    );
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[tokio::test]
async fn resp_commands_need_a_key_and_a_reload_takes_it_away() {
    let dir = tempfile::tempdir().unwrap();
    let (file, people) = auth_file(
        dir.path(),
        &[
            ("alice", &grant("a*", &["acquire", "read", "write"])),
            ("bob", &grant("b*", &["acquire", "read", "write"])),
        ],
    );
    let file_arg = file.to_str().unwrap().to_owned();
    let server = Server::start(&["--resp-listen", "127.0.0.1:0", "--auth-file", &file_arg]);
    let base = server.resp_url.clone().unwrap();
    let alice = &people[0].key;
    let bob = &people[1].key;

    // No key: refused before anything runs.
    let mut anon = connect(&base).await;
    let (code, _) = call(&mut anon, &[b"LOCK.ACQUIRE", b"a1", b"60000"])
        .await
        .unwrap_err();
    assert_eq!(code, "UNAUTHENTICATED");
    let (code, _) = call(&mut anon, &[b"AUTH", b"not-a-key"]).await.unwrap_err();
    assert_eq!(code, "UNAUTHENTICATED");

    // The client library sends the key with HELLO 3 (RESP3) or AUTH (RESP2).
    let host = base.trim_start_matches("redis://");
    let mut a = connect(&format!("redis://default:{alice}@{host}/?protocol=resp3")).await;
    let lease = call(&mut a, &[b"LOCK.ACQUIRE", b"a1", b"60000"])
        .await
        .unwrap();
    assert_eq!(text(field(&lease, "holder")), "alice");
    let token = text(field(&lease, "token"));
    let mut b = connect(&format!("redis://:{bob}@{host}")).await;
    let (code, _) = call(&mut b, &[b"LOCK.ACQUIRE", b"a1", b"60000"])
        .await
        .unwrap_err();
    assert_eq!(code, "PERMISSION_DENIED");
    let (code, _) = call(&mut b, &[b"KV.PUT", b"a1", b"k", b"v", token.as_bytes()])
        .await
        .unwrap_err();
    assert_eq!(code, "PERMISSION_DENIED", "bob may not write alice's lock");
    let (code, _) = call(
        &mut b,
        &[b"LOCK.RELEASE", text(field(&lease, "lease_id")).as_bytes()],
    )
    .await
    .unwrap_err();
    assert_eq!(code, "PERMISSION_DENIED", "nor release her lease");
    call(&mut a, &[b"KV.PUT", b"a1", b"k", b"v", token.as_bytes()])
        .await
        .unwrap();

    // A reload without alice refuses her next command on the open connection.
    let text_now = std::fs::read_to_string(&file).unwrap();
    let without_alice: String = text_now
        .split("[[principal]]")
        .filter(|p| !p.trim().is_empty() && !p.contains("\"alice\""))
        .map(|p| format!("[[principal]]{p}"))
        .collect();
    std::fs::write(&file, without_alice).unwrap();
    server.signal(common::Signal::SIGHUP);
    let probe = a.clone();
    palisade_test_support::poll_async(
        Duration::from_secs(10),
        "alice's key stops working on her open connection",
        || {
            let mut probe = probe.clone();
            async move {
                match call(&mut probe, &[b"KV.GET", b"a1", b"k"]).await {
                    Err((code, _)) if code == "UNAUTHENTICATED" => Some(()),
                    _ => None,
                }
            }
        },
    )
    .await;
    assert_eq!(
        call(&mut b, &[b"KV.GET", b"b1", b"k"]).await.unwrap(),
        Value::Nil,
        "bob's still works"
    );
}

/// RESP over TLS with a client certificate: the certificate's principal, no `AUTH`.
/// (`openssl s_client` is the client: the Redis library's TLS is not built here.)
#[test]
fn resp_over_mutual_tls_runs_as_the_certificates_principal() {
    use common::pki::Ca;
    let dir = tempfile::tempdir().unwrap();
    let server_ca = Ca::new(dir.path(), "server");
    let client_ca = Ca::new(dir.path(), "clients");
    let billing = client_ca.client_cert("billing", "billing.internal");
    let auth = dir.path().join("auth.toml");
    std::fs::write(
        &auth,
        "[[principal]]\nname = \"billing\"\ncert_cn = \"billing.internal\"\n\
         [[principal.grant]]\nlocks = \"orders*\"\nallow = [\"acquire\"]\n",
    )
    .unwrap();
    let mut args = server_ca.server_cert("server").serve_args(Some(&client_ca));
    args.extend([
        "--resp-listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--auth-file".to_owned(),
        auth.display().to_string(),
    ]);
    let server = Server::start_with(&args);
    let url = server.resp_url.clone().unwrap();
    assert!(url.starts_with("rediss://127.0.0.1:"), "{url}");
    let addr = url.trim_start_matches("rediss://");
    let commands = b"*3\r\n$12\r\nLOCK.ACQUIRE\r\n$8\r\norders-1\r\n$5\r\n60000\r\n\
*3\r\n$12\r\nLOCK.ACQUIRE\r\n$7\r\nother-1\r\n$5\r\n60000\r\n*1\r\n$4\r\nQUIT\r\n";
    let session = |with_cert: bool| {
        let mut openssl = std::process::Command::new("openssl");
        openssl.args(["s_client", "-quiet", "-ign_eof", "-verify_return_error"]);
        openssl.args(["-connect", addr, "-CAfile", &server_ca.cert_arg()]);
        if with_cert {
            openssl.args(["-cert", &billing.cert_arg(), "-key", &billing.key_arg()]);
        }
        let mut child = openssl
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("openssl s_client (Debian: openssl)");
        child.stdin.take().unwrap().write_all(commands).unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let answers = session(true);
    // The first acquisition as billing (a RESP2 map: names and values in turn), the
    // second refused by billing's grant, then QUIT's OK.
    assert!(
        answers.contains("$6\r\nholder\r\n$7\r\nbilling\r\n"),
        "{answers:?}"
    );
    assert!(answers.contains("-PERMISSION_DENIED "), "{answers:?}");
    assert!(answers.ends_with("+OK\r\n"), "{answers:?}");
    // With --tls-client-ca a certificate is required: without one the handshake fails
    // and no command runs.
    let answers = session(false);
    assert!(!answers.contains("holder"), "{answers:?}");
    assert!(!answers.contains("+OK"), "{answers:?}");
    assert!(!answers.contains("holder"), "{answers:?}");
}
