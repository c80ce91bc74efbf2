//! HTTPS and mutual TLS against the real binary, with the CLI and the Rust client.
//! Certificates are generated at test time (common/pki.rs).

mod common;
mod offline;

use std::time::Duration;

use common::pki::Ca;
use common::Server;
use offline::palisade;
use palisade_client::{AcquireOptions, Client, Error};

fn tls_server(ca: &Ca, client_ca: Option<&Ca>) -> Server {
    Server::start_with(&ca.server_cert("server").serve_args(client_ca))
}

/// The message of a client error, with its cause chain.
fn transport_error(result: Result<(), Error>) -> String {
    match result {
        Err(e @ Error::Transport(_)) => e.to_string(),
        other => panic!("expected a transport error, got {other:?}"),
    }
}

#[tokio::test]
async fn https_with_a_ca_file_and_refused_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "server");
    let other = Ca::new(dir.path(), "other");
    let server = tls_server(&ca, None);
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );

    // The Rust client, trusting the CA.
    let client = Client::builder(&server.url)
        .ca_file(&ca.cert_file)
        .build()
        .unwrap();
    client.health().await.unwrap();
    let lease = client
        .acquire_raw("tls-lock", "worker", AcquireOptions::default())
        .await
        .unwrap();
    assert_eq!(lease.epoch, 1);

    // Not trusting it: the system's roots, or another CA only. Clear errors, no answer.
    for client in [
        Client::new(&server.url).unwrap(),
        Client::builder(&server.url)
            .ca_file(&other.cert_file)
            .build()
            .unwrap(),
    ] {
        let message = transport_error(client.health().await);
        assert!(message.contains("certificate"), "{message}");
    }

    // The CLI, with and without the CA file.
    let acquired = palisade(
        &[
            "lock",
            "acquire",
            "tls-cli",
            "--server",
            &server.url,
            "--ca-file",
            &ca.cert_arg(),
        ],
        Duration::from_secs(30),
    );
    assert!(acquired.success, "{}", acquired.stderr);
    assert_eq!(acquired.json()["epoch"], 1);
    let refused = palisade(
        &["lock", "status", "tls-cli", "--server", &server.url],
        Duration::from_secs(30),
    );
    // Server unreachable (exit code 11), saying why and what to give.
    assert_eq!(refused.code, Some(11), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("cannot reach the server")
            && refused.stderr.contains("certificate")
            && refused.stderr.contains("--ca-file"),
        "{}",
        refused.stderr
    );

    // Plain HTTP to the TLS port gets no HTTP answer, and the server carries on.
    let plain = Client::new(&server.url.replace("https://", "http://")).unwrap();
    assert!(plain.health().await.is_err());
    client.health().await.unwrap();
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_certificate_from_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = Ca::new(dir.path(), "server");
    let client_ca = Ca::new(dir.path(), "clients");
    let rogue_ca = Ca::new(dir.path(), "rogue");
    let server = tls_server(&server_ca, Some(&client_ca));
    let good = client_ca.client_cert("billing", "billing");
    let rogue = rogue_ca.client_cert("rogue", "billing");

    let builder = || Client::builder(&server.url).ca_file(&server_ca.cert_file);
    // No certificate, and a certificate with the right name from another CA: both fail
    // in the handshake, before any HTTP.
    let message = transport_error(builder().build().unwrap().health().await);
    assert!(message.contains("request failed"), "{message}");
    let with_rogue = builder()
        .client_cert(&rogue.cert, &rogue.key)
        .build()
        .unwrap();
    transport_error(with_rogue.health().await);

    // A certificate from the client CA passes.
    let with_good = builder()
        .client_cert(&good.cert, &good.key)
        .build()
        .unwrap();
    with_good.health().await.unwrap();
    let lease = with_good
        .acquire_raw("mtls-lock", "billing", AcquireOptions::default())
        .await
        .unwrap();
    assert_eq!(lease.epoch, 1);

    // The CLI's flags do the same.
    let cli = |cert: &common::pki::CertFiles| {
        palisade(
            &[
                "lock",
                "status",
                "mtls-lock",
                "--server",
                &server.url,
                "--ca-file",
                &server_ca.cert_arg(),
                "--client-cert",
                &cert.cert_arg(),
                "--client-key",
                &cert.key_arg(),
            ],
            Duration::from_secs(30),
        )
    };
    let status = cli(&good);
    assert!(status.success, "{}", status.stderr);
    assert_eq!(status.json()["epoch"], 1);
    let refused = cli(&rogue);
    assert_eq!(refused.code, Some(11), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("cannot reach the server")
            && refused.stderr.contains("--client-cert"),
        "{}",
        refused.stderr
    );
}

#[test]
fn a_tls_key_that_does_not_load_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "server");
    let cert = ca.server_cert("server");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a key").unwrap();
    let data = dir.path().join("data");
    let started = Server::start_in(
        &data,
        0,
        &[
            "--tls-cert",
            &cert.cert_arg(),
            "--tls-key",
            &garbage.display().to_string(),
        ],
    );
    let Err(message) = started else {
        panic!("a server started with an unusable key");
    };
    assert!(message.contains("key file"), "{message}");
}

#[tokio::test]
async fn a_client_certificate_names_its_principal_and_a_key_works_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = Ca::new(dir.path(), "server");
    let client_ca = Ca::new(dir.path(), "clients");
    let billing = client_ca.client_cert("billing", "billing.internal");
    let stranger = client_ca.client_cert("stranger", "stranger.internal");
    let key = "a-bearer-key-for-reports-0123456789";
    let digest = hex::encode(palisade_server::auth::key_digest(key));
    let auth = dir.path().join("auth.toml");
    std::fs::write(
        &auth,
        format!(
            "[[principal]]\nname = \"billing\"\ncert_cn = \"billing.internal\"\n\
             [[principal.grant]]\nlocks = \"orders*\"\nallow = [\"acquire\"]\n\n\
             [[principal]]\nname = \"reports\"\nkey_sha256 = \"{digest}\"\n\
             [[principal.grant]]\nlocks = \"orders*\"\nallow = [\"read\"]\n"
        ),
    )
    .unwrap();
    let mut args = server_ca.server_cert("server").serve_args(Some(&client_ca));
    args.extend(["--auth-file".to_owned(), auth.display().to_string()]);
    let server = Server::start_with(&args);
    let with_cert = |files: &common::pki::CertFiles| {
        Client::builder(&server.url)
            .ca_file(&server_ca.cert_file)
            .client_cert(&files.cert, &files.key)
            .build()
            .unwrap()
    };

    // The certificate's CN is the principal: the token's holder is "billing".
    let lease = with_cert(&billing)
        .acquire_raw("orders-1", "job", AcquireOptions::default())
        .await
        .unwrap();
    assert_eq!(lease.epoch, 1);
    assert!(lease.holder.starts_with("billing"), "{}", lease.holder);

    // A certificate from the right CA whose CN names no principal: 401.
    match with_cert(&stranger)
        .acquire_raw("orders-2", "job", AcquireOptions::default())
        .await
    {
        Err(e) => assert_eq!(e.code(), "unauthenticated", "{e}"),
        Ok(lease) => panic!("a stranger acquired {lease:?}"),
    }

    // A bearer key over the same mutual-TLS connection setup, from the CLI.
    let key_file = dir.path().join("reports.key");
    std::fs::write(&key_file, key).unwrap();
    let private = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600);
    std::fs::set_permissions(&key_file, private).unwrap();
    let status = palisade(
        &[
            "lock",
            "status",
            "orders-1",
            "--server",
            &server.url,
            "--ca-file",
            &server_ca.cert_arg(),
            "--client-cert",
            &stranger.cert_arg(),
            "--client-key",
            &stranger.key_arg(),
            "--key-file",
            &key_file.display().to_string(),
        ],
        Duration::from_secs(30),
    );
    assert!(status.success, "{}", status.stderr);
    assert_eq!(status.json()["epoch"], 1);
}
