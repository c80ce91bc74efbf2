//! The transport with a tiny router: the client certificate's Common Name reaches the
//! request's extensions over mutual TLS.

use std::sync::Arc;

use axum::extract::Request;
use axum::routing::get;
use axum::Router;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::{ClientCert, Listener, TlsConfig, TransportConfig};

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A leaf certificate and its key, signed by `ca`.
fn leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    sans: &[&str],
    cn: Option<&str>,
    usage: ExtendedKeyUsagePurpose,
) -> (rcgen::Certificate, KeyPair) {
    let mut params =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    if let Some(cn) = cn {
        params.distinguished_name.push(DnType::CommonName, cn);
    }
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    (params.signed_by(&key, ca).unwrap(), key)
}

/// Answers with the `ClientCert` the transport put in the request, if any.
fn whoami() -> Router {
    Router::new().route(
        "/whoami",
        get(|req: Request| async move { format!("{:?}", req.extensions().get::<ClientCert>()) }),
    )
}

async fn ask(connector: &TlsConnector, addr: std::net::SocketAddr) -> String {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.unwrap();
    answer
}

#[tokio::test]
async fn the_client_certificate_common_name_reaches_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = ca("server CA");
    let client_ca = ca("client CA");
    let (server_cert, server_key) = leaf(
        &server_ca,
        &["127.0.0.1"],
        Some("server"),
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let files = TlsConfig {
        cert_file: dir.path().join("server.pem"),
        key_file: dir.path().join("server.key"),
        client_ca_file: Some(dir.path().join("clients.pem")),
    };
    std::fs::write(&files.cert_file, server_cert.pem()).unwrap();
    std::fs::write(&files.key_file, server_key.serialize_pem()).unwrap();
    std::fs::write(files.client_ca_file.as_ref().unwrap(), client_ca.pem()).unwrap();
    let config = TransportConfig {
        tls: Some(files),
        ..TransportConfig::default()
    };
    let listener = Listener::bind("127.0.0.1:0".parse().unwrap(), config)
        .await
        .unwrap();
    let addr = listener.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(listener.serve(
        whoami(),
        async {
            let _ = stopped.await;
        },
        async {},
    ));

    let connector = |cn: Option<&str>| {
        let (cert, key) = leaf(&client_ca, &[], cn, ExtendedKeyUsagePurpose::ClientAuth);
        let mut roots = rustls::RootCertStore::empty();
        roots.add(server_ca.der().clone()).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![CertificateDer::from(cert.der().to_vec())], key)
        .unwrap();
        TlsConnector::from(Arc::new(config))
    };
    let named = ask(&connector(Some("billing")), addr).await;
    assert!(
        named.ends_with(r#"Some(ClientCert { common_name: Some("billing") })"#),
        "{named}"
    );
    let unnamed = ask(&connector(None), addr).await;
    assert!(
        unnamed.ends_with("Some(ClientCert { common_name: None })"),
        "{unnamed}"
    );
    stop.send(()).unwrap();
    serving.await.unwrap();
}
