//! `palisade serve --backend etcd` over TLS with a client certificate and an etcd user,
//! against a real etcd member with TLS, client-certificate checks and authentication on.
//! Needs the `etcd` feature and an `etcd` binary (scripts/test installs etcd-server).

#![cfg(feature = "etcd")]

mod common;

use std::time::{Duration, Instant};

use common::pki::{Ca, CertFiles};
use common::topology::{hex, write_private};
use common::{Http, Server};
use palisade_test_support::etcd::{EtcdCluster, MemberTls, Options};

/// One etcd member with a TLS client port that requires client certificates.
fn start_etcd(ca: &Ca, server: &CertFiles) -> EtcdCluster {
    let tls = MemberTls {
        cert_file: server.cert.clone(),
        key_file: server.key.clone(),
        client_ca_file: ca.cert_file.clone(),
    };
    EtcdCluster::start_with(
        1,
        Options {
            tls: Some(tls),
            extra: Vec::new(),
        },
    )
}

/// etcd's JSON gateway over TLS with a client certificate.
fn gateway(ca: &Ca, client: &CertFiles) -> reqwest::Client {
    let mut identity = std::fs::read(&client.cert).unwrap();
    identity.extend(std::fs::read(&client.key).unwrap());
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&ca.cert_file).unwrap()).unwrap(),
        )
        .identity(reqwest::Identity::from_pem(&identity).unwrap())
        .build()
        .unwrap()
}

#[tokio::test]
async fn etcd_nodes_connect_over_tls_as_an_etcd_user() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "etcd");
    let etcd_server = ca.etcd_member_cert("etcd-server");
    let client = ca.client_cert("etcd-client", "palisade-node");
    let etcd = start_etcd(&ca, &etcd_server);
    let endpoint = etcd.endpoint(0);

    // Wait for the member, then create root and turn authentication on.
    let api = gateway(&ca, &client);
    let call = |path: &str, body: serde_json::Value| {
        api.post(format!("{}/v3/{path}", endpoint))
            .json(&body)
            .send()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while call("maintenance/status", serde_json::json!({}))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "etcd did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (path, body) in [
        ("auth/role/add", serde_json::json!({"name": "root"})),
        (
            "auth/user/add",
            serde_json::json!({"name": "root", "password": "s3cret"}),
        ),
        (
            "auth/user/grant",
            serde_json::json!({"user": "root", "role": "root"}),
        ),
        ("auth/enable", serde_json::json!({})),
    ] {
        let response = call(path, body).await.unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {:?}",
            response.text().await
        );
    }

    let signing_key = dir.path().join("signing.key");
    write_private(
        &signing_key,
        &hex(&palisade_token::Signer::generate().secret()),
    );
    let password = dir.path().join("etcd.password");
    write_private(&password, "s3cret\n");
    let args = |password: &std::path::Path| -> Vec<String> {
        [
            "--backend",
            "etcd",
            "--etcd-endpoints",
            &endpoint,
            "--etcd-ca-file",
            &ca.cert_arg(),
            "--etcd-cert",
            &client.cert_arg(),
            "--etcd-key",
            &client.key_arg(),
            "--etcd-user",
            "root",
            "--etcd-password-file",
            &password.display().to_string(),
            "--signing-key-file",
            &signing_key.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let node_args = args(&password);
    let node_args: Vec<&str> = node_args.iter().map(String::as_str).collect();
    let node = Server::start_in(&dir.path().join("node"), 0, &node_args).expect("node starts");
    let http = Http::new(&node.url);
    let lease = http.acquire("etcd-tls", "worker", 5000).await;
    assert_eq!(lease["epoch"], 1, "{lease}");

    // A password file others may read is refused at start-up.
    let loose = dir.path().join("loose.password");
    std::fs::write(&loose, "s3cret\n").unwrap();
    let loose_args = args(&loose);
    let loose_args: Vec<&str> = loose_args.iter().map(String::as_str).collect();
    let refused = Server::start_in(&dir.path().join("node2"), 0, &loose_args);
    let Err(message) = refused else {
        panic!("started with a password file others may read");
    };
    assert!(message.contains("chmod 600"), "{message}");
}
