//! Palisade's etcd connection over TLS with a client certificate and an etcd user, against
//! a real etcd started with TLS, client-certificate checks and authentication enabled.
//! Certificates are generated at test time (rcgen).

mod support;

use std::path::Path;
use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity, Permission, TlsOptions};
use palisade_etcd::{Etcd, EtcdConfig, EtcdIssuer, EtcdTls, EtcdUser};
use palisade_issuer::LockService;
use palisade_token::Signer;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use support::{EtcdMember, MemberTls};

struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files.
fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "etcd test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    write("ca.pem", ca.pem());
    let issue = |name: &str, sans: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| {
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = usages;
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca).unwrap();
        write(&format!("{name}.pem"), cert.pem());
        write(&format!("{name}.key"), key.serialize_pem());
    };
    issue(
        "server",
        vec!["127.0.0.1".into(), "localhost".into()],
        // etcd also dials its own client port with this certificate.
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    issue("client", vec![], vec![ExtendedKeyUsagePurpose::ClientAuth]);
    Pki { dir }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// Creates root and a user `palisade` allowed under `/tls/`, then enables authentication.
async fn enable_auth(endpoint: &str, pki: &Pki) {
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(read(&pki.path("ca.pem"))))
        .identity(Identity::from_pem(
            read(&pki.path("client.pem")),
            read(&pki.path("client.key")),
        ));
    let client =
        etcd_client::Client::connect([endpoint], Some(ConnectOptions::new().with_tls(tls)))
            .await
            .unwrap();
    let mut auth = client.auth_client();
    auth.role_add("root").await.unwrap();
    auth.user_add("root", "root-password", None).await.unwrap();
    auth.user_grant_role("root", "root").await.unwrap();
    auth.role_add("palisade").await.unwrap();
    auth.role_grant_permission("palisade", Permission::read_write("/tls/").with_prefix())
        .await
        .unwrap();
    auth.user_add("palisade", "s3cret", None).await.unwrap();
    auth.user_grant_role("palisade", "palisade").await.unwrap();
    auth.auth_enable().await.unwrap();
}

fn config(endpoint: &str, pki: &Pki, user: Option<(&str, &str)>) -> EtcdConfig {
    let mut config = EtcdConfig::new(vec![endpoint.to_owned()]);
    config.prefix = "/tls/".to_owned();
    config.request_timeout = Duration::from_secs(5);
    config.tls = Some(EtcdTls {
        ca_file: pki.path("ca.pem"),
        cert_file: Some(pki.path("client.pem")),
        key_file: Some(pki.path("client.key")),
    });
    config.user = user.map(|(name, password)| EtcdUser {
        name: name.to_owned(),
        password: password.to_owned(),
    });
    config
}

#[tokio::test]
async fn palisade_works_over_tls_with_a_client_certificate_and_a_user() {
    let pki = pki();
    let etcd = EtcdMember::start_with(
        Some(MemberTls {
            cert_file: &pki.path("server.pem"),
            key_file: &pki.path("server.key"),
            client_ca_file: &pki.path("ca.pem"),
        }),
        // Short-lived auth tokens, so that the test sees one expire and get renewed.
        &["--auth-token-ttl", "1"],
    );
    assert!(etcd.endpoint.starts_with("https://"));
    enable_auth(&etcd.endpoint, &pki).await;

    let connected = Etcd::connect(&config(&etcd.endpoint, &pki, Some(("palisade", "s3cret"))))
        .await
        .unwrap();
    connected.probe().await.unwrap();
    let issuer = EtcdIssuer::new(connected, Signer::generate());
    let request = |holder: &str| palisade_issuer::Acquire {
        lock: "tls-lock".to_owned(),
        holder: holder.to_owned(),
        ttl_ms: 5000,
        wait_ms: 0,
        lease_id: format!("{holder}-lease"),
        ..palisade_issuer::Acquire::default()
    };
    let first = issuer.acquire(request("a")).await.unwrap();
    assert_eq!(first.lease.epoch, 1);
    issuer.release(&first.lease.lease_id, None).await.unwrap();
    // Idle past the token's lifetime; the next call gets a fresh token by itself.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let second = issuer.acquire(request("b")).await.unwrap();
    assert_eq!(second.lease.epoch, 2);

    // A wrong password is refused when connecting.
    let refused = Etcd::connect(&config(&etcd.endpoint, &pki, Some(("palisade", "wrong")))).await;
    let message = refused
        .err()
        .expect("a wrong password is refused")
        .to_string();
    assert!(message.contains("connect"), "{message}");

    // Without a user, authenticated etcd refuses every call.
    let anonymous = Etcd::connect(&config(&etcd.endpoint, &pki, None))
        .await
        .unwrap();
    assert!(anonymous.probe().await.is_err());

    // Without a client certificate the handshake fails.
    let mut no_cert = config(&etcd.endpoint, &pki, Some(("palisade", "s3cret")));
    no_cert.tls = Some(EtcdTls {
        ca_file: pki.path("ca.pem"),
        cert_file: None,
        key_file: None,
    });
    assert!(Etcd::connect(&no_cert).await.is_err());

    // Plain endpoints with TLS settings, and https endpoints without, are refused.
    let mut mixed = config(&etcd.endpoint, &pki, None);
    mixed.endpoints = vec![etcd.endpoint.replace("https://", "http://")];
    let message = Etcd::connect(&mixed).await.err().unwrap().to_string();
    assert!(message.contains("not https://"), "{message}");
    let mut untrusted = config(&etcd.endpoint, &pki, None);
    untrusted.tls = None;
    let message = Etcd::connect(&untrusted).await.err().unwrap().to_string();
    assert!(message.contains("CA file"), "{message}");
}
