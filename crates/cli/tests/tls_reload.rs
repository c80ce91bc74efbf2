//! SIGHUP reloads the TLS certificate: new handshakes get the new one, an open
//! keep-alive connection is not dropped, and a certificate that does not load is refused
//! with the old one kept.

mod common;

use std::time::{Duration, Instant};

use common::pki::Ca;
use common::{Server, Signal};

/// The DER of the certificate the server presented on the connection of `response`.
fn presented(response: &reqwest::Response) -> Vec<u8> {
    response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .expect("TLS info")
        .to_vec()
}

fn client(ca: &Ca) -> reqwest::Client {
    let pem = std::fs::read(&ca.cert_file).unwrap();
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .tls_info(true)
        .pool_max_idle_per_host(1)
        .build()
        .unwrap()
}

#[tokio::test]
async fn sighup_reloads_the_certificate_without_dropping_connections() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "server");
    let first = ca.server_cert("first");
    let live_cert = dir.path().join("live.pem");
    let live_key = dir.path().join("live.key");
    std::fs::copy(&first.cert, &live_cert).unwrap();
    std::fs::copy(&first.key, &live_key).unwrap();
    let mut server = Server::start(&[
        "--tls-cert",
        &live_cert.display().to_string(),
        "--tls-key",
        &live_key.display().to_string(),
    ]);
    let log = server.capture_stderr();
    let health = format!("{}/healthz", server.url);

    // One keep-alive connection, opened with the first certificate.
    let kept = client(&ca);
    let response = kept.get(&health).send().await.unwrap();
    assert_eq!(presented(&response), first.der);
    response.bytes().await.unwrap();

    // Swap in a second certificate and signal.
    let second = ca.server_cert("second");
    std::fs::copy(&second.cert, &live_cert).unwrap();
    std::fs::copy(&second.key, &live_key).unwrap();
    server.signal(Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let response = client(&ca).get(&health).send().await.unwrap();
        if presented(&response) == second.der {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "new handshakes never got the new certificate"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The old connection is still open: the same client answers over it, and it still
    // shows the first certificate (a new connection would show the second).
    let response = kept.get(&health).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(presented(&response), first.der);

    // A broken certificate: refused, logged, and the second one stays in use.
    std::fs::write(&live_cert, "-----BEGIN CERTIFICATE-----\nbroken\n").unwrap();
    server.signal(Signal::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !log.lock().unwrap().contains("TLS reload failed") {
        assert!(
            Instant::now() < deadline,
            "no log line for the failed reload"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let response = client(&ca).get(&health).send().await.unwrap();
    assert_eq!(presented(&response), second.der);
    assert_eq!(response.status(), 200);
}
