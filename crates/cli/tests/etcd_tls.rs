//! `palisade serve --backend etcd` over TLS with a client certificate and an etcd user,
//! against a real etcd member with TLS, client-certificate checks and authentication on.
//! Needs the `etcd` feature and an `etcd` binary (scripts/test installs etcd-server).

#![cfg(feature = "etcd")]

mod common;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::pki::{Ca, CertFiles};
use common::topology::{hex, write_private};
use common::{Http, Server};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// One etcd member with a TLS client port that requires client certificates.
struct TlsEtcd {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_etcd(ca: &Ca, server: &CertFiles) -> TlsEtcd {
    let dir = tempfile::tempdir().unwrap();
    let (client_port, peer_port) = (free_port(), free_port());
    let endpoint = format!("https://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let child = Command::new(std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".to_owned()))
        .args(["--name", "solo", "--data-dir"])
        .arg(dir.path().join("solo"))
        .args([
            "--listen-client-urls",
            &endpoint,
            "--advertise-client-urls",
            &endpoint,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("solo={peer}")])
        .args([
            "--cert-file",
            &server.cert_arg(),
            "--key-file",
            &server.key_arg(),
        ])
        .args(["--trusted-ca-file", &ca.cert_arg(), "--client-cert-auth"])
        .args(["--logger", "zap", "--log-level", "error"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd (install etcd-server)");
    TlsEtcd {
        child,
        endpoint,
        _dir: dir,
    }
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

    // Wait for the member, then create root and turn authentication on.
    let api = gateway(&ca, &client);
    let call = |path: &str, body: serde_json::Value| {
        api.post(format!("{}/v3/{path}", etcd.endpoint))
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
            &etcd.endpoint,
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
