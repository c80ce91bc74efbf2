//! # Test support: the processes Palisade's end-to-end tests start
//!
//! One copy of what the tests of several crates need: a free loopback port, a
//! `palisade serve` process read up to its start-up line, etcd members and clusters, signals
//! by process id, polling for state instead of sleeping, and the behavioural suites every
//! [`palisade_storage::FencedStore`] ([`fenced_store`]) and every
//! [`palisade_issuer::LockService`] ([`lock_service`]) runs, and the check that a committed
//! vectors file is what the code generates ([`vectors`]).
//!
//! Everything here listens on loopback addresses only, lives in temp dirs, and is stopped
//! by process id when its handle is dropped.
//!
//! ## What it does not do
//! - It is not published and not for production code: helpers panic with a message when
//!   something they need is missing (a test that cannot set up should fail loudly).
//! - It does not know the `palisade` binary's path: the caller passes it (Cargo tells
//!   only the binary's own crate, through `CARGO_BIN_EXE_palisade`).

pub mod etcd;
pub mod fenced_store;

/// One test per case of a behavioural suite ([`fenced_store_suite!`],
/// [`lock_service_suite!`]): `async fn $case()` calling `$crate::$module::$case($make)`, on a
/// multi-thread runtime of two workers. The suites' macros list their cases; this writes
/// the tests once for both.
#[doc(hidden)]
#[macro_export]
macro_rules! suite_cases {
    ($module:ident, $make:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::$module::$case($make).await;
            }
        )*
    };
}
pub mod lock_service;
pub mod process;
pub mod server;
pub mod vectors;

use std::net::TcpListener;
use std::time::{Duration, Instant};

pub use process::{alive, signal, Signal};
pub use server::ServerProcess;

/// A loopback port nobody listens on right now. Another process may take it before the
/// caller binds it; prefer port 0 where the program can report the port it got.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Calls `check` until it returns Some or `within` has passed (then None). For state that
/// another process or task produces: poll for it instead of sleeping and hoping.
pub fn poll<T>(within: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check() {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`poll`] for async checks, sleeping on the tokio timer between tries. Panics with
/// `what` when `within` passes without success.
pub async fn poll_async<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not reached within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `METHOD PATH` over plain HTTP/1.0 to a loopback port with a JSON body; the response
/// body, or None when nobody answers. For health and status pages (etcd's gateway), with
/// no HTTP client library.
pub fn http(port: u16, request_line: &str, body: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let head = format!(
        "{request_line} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(body.as_bytes()).ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())
}
