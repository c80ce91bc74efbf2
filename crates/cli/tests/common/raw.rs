//! Raw sockets for the transport tests: exact bytes out, the raw answer back, and clients
//! that never finish their request.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::Value;

/// An HTTP answer as read off the socket.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}\n{}", self.body, self.head))
    }
}

/// Connects to the server's port on loopback.
pub fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("read timeout");
    stream
}

/// A connection that keeps what it read past one answer for the next.
pub struct RawConn {
    pub stream: TcpStream,
    pending: Vec<u8>,
}

impl RawConn {
    pub fn open(port: u16) -> RawConn {
        RawConn {
            stream: connect(port),
            pending: Vec::new(),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// Reads one answer (head, then a body of `content-length` bytes).
    pub fn answer(&mut self) -> Answer {
        let mut chunk = [0u8; 8192];
        loop {
            if let Some(end) = find(&self.pending, b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.pending[..end]).to_string();
                let length = head
                    .lines()
                    .find_map(|l| {
                        let l = l.to_ascii_lowercase();
                        l.strip_prefix("content-length:")
                            .and_then(|v| v.trim().parse::<usize>().ok())
                    })
                    .unwrap_or(0);
                if self.pending.len() >= end + 4 + length {
                    let body = String::from_utf8_lossy(&self.pending[end + 4..end + 4 + length])
                        .to_string();
                    self.pending.drain(..end + 4 + length);
                    let status = head
                        .get(9..12)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or_else(|| panic!("no status line: {head:?}"));
                    return Answer { status, head, body };
                }
            }
            let n = self.stream.read(&mut chunk).expect("read answer");
            assert!(
                n > 0,
                "connection closed before a whole answer: {:?}",
                String::from_utf8_lossy(&self.pending)
            );
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Sends `bytes` on a new connection and reads one answer.
pub fn exchange(port: u16, bytes: &[u8]) -> Answer {
    let mut conn = RawConn::open(port);
    conn.send(bytes);
    conn.answer()
}

/// True once the server has closed `stream` (EOF or reset) within `limit`.
pub fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        stream.set_read_timeout(Some(left)).expect("read timeout");
        match stream.read(&mut chunk) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// True if the server has already closed `stream` (EOF or reset), without waiting.
pub fn is_closed(stream: &mut TcpStream) -> bool {
    stream.set_nonblocking(true).expect("nonblocking");
    let mut chunk = [0u8; 1024];
    let closed = loop {
        match stream.read(&mut chunk) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    stream.set_nonblocking(false).expect("blocking");
    closed
}

/// A client that starts a request head and never finishes it.
pub fn slow_client(port: u16, padding: usize) -> TcpStream {
    let mut stream = connect(port);
    let head = format!(
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: {}",
        "a".repeat(padding)
    );
    stream
        .write_all(head.as_bytes())
        .expect("send partial head");
    stream
}

/// The resident set size of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Raises this process's open-files limit to its hard limit (the slow-client tests hold
/// a thousand sockets; the server it starts inherits the limit).
pub fn raise_open_files() {
    palisade_test_support::process::raise_open_files();
}
