//! Requests hyper refuses before the router (malformed request line or headers, a head
//! over the limit) and targets over the URI limit get the JSON error body of every other
//! error, with a stable code.

mod common;

use common::raw::{exchange, RawConn};
use common::Server;

fn assert_json_error(answer: &common::raw::Answer, status: u16, code: &str) {
    assert_eq!(answer.status, status, "{answer:?}");
    assert!(
        answer
            .head
            .to_ascii_lowercase()
            .contains("content-type: application/json"),
        "{answer:?}"
    );
    let body = answer.json();
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[test]
fn malformed_requests_get_json_errors() {
    let server = Server::start(&[]);
    let port = server.port;
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "garbage request line",
            b"GARBAGE\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "unknown version",
            b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "space in a header name",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "bad content-length",
            b"PUT /v1/kv/a/b HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n".to_vec(),
            400,
            "bad_request",
        ),
        (
            "target over the URI limit (8 KiB)",
            format!(
                "GET /v1/locks/{} HTTP/1.1\r\nHost: x\r\n\r\n",
                "a".repeat(9000)
            )
            .into_bytes(),
            414,
            "uri_too_long",
        ),
        (
            "head over the header limit (16 KiB)",
            format!(
                "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
                "a".repeat(20_000)
            )
            .into_bytes(),
            431,
            "headers_too_large",
        ),
        (
            "more header fields than allowed",
            format!(
                "GET /healthz HTTP/1.1\r\nHost: x\r\n{}\r\n",
                (0..120)
                    .map(|i| format!("X-{i}: v\r\n"))
                    .collect::<String>()
            )
            .into_bytes(),
            431,
            "headers_too_large",
        ),
    ];
    for (what, bytes, status, code) in cases {
        let answer = exchange(port, &bytes);
        assert_eq!(answer.status, status, "{what}: {answer:?}");
        assert_json_error(&answer, status, code);
    }
}

#[test]
fn a_malformed_request_after_good_ones_on_a_keep_alive_connection_gets_json() {
    let server = Server::start(&[]);
    let mut conn = RawConn::open(server.port);
    for _ in 0..3 {
        conn.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(conn.answer().status, 200);
    }
    conn.send(b"NOT HTTP AT ALL\r\n\r\n");
    assert_json_error(&conn.answer(), 400, "bad_request");

    // A good request and a malformed one sent together.
    let mut conn = RawConn::open(server.port);
    conn.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHo st: x\r\n\r\n");
    assert_eq!(conn.answer().status, 200);
    assert_json_error(&conn.answer(), 400, "bad_request");

    // The server is unharmed.
    assert_eq!(
        exchange(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").status,
        200
    );
}

/// A request refused before its body is read says `Connection: close` (the unread body
/// leaves the connection unusable); one whose body was read keeps the connection open.
#[test]
fn refusals_that_leave_a_body_unread_close_the_connection_and_say_so() {
    let server = Server::start(&[]);
    let mut conn = RawConn::open(server.port);
    conn.send(b"PUT /v1/kv/ns/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    let refused = conn.answer();
    assert_json_error(&refused, 400, "missing_token");
    assert!(
        refused
            .head
            .to_ascii_lowercase()
            .contains("connection: close"),
        "{refused:?}"
    );

    // The body is read before the answer: keep-alive stays, and the next request on the
    // same connection is answered.
    let mut conn = RawConn::open(server.port);
    conn.send(b"POST /v1/locks/ns/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
    let bad = conn.answer();
    assert_json_error(&bad, 400, "bad_request");
    assert!(
        !bad.head.to_ascii_lowercase().contains("connection: close"),
        "{bad:?}"
    );
    conn.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(conn.answer().status, 200);
}
