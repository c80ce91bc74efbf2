//! HTTPS: the rustls configuration, built from PEM files, and its reload.
//!
//! The certificate chain, its key and (for mutual TLS) the client CA are read into one
//! rustls `ServerConfig`. [`TlsFiles::reload`] (SIGHUP) reads the files again and swaps
//! the configuration: handshakes from then on use the new one, connections already
//! established keep theirs and are not dropped. A configuration that does not load
//! (unreadable file, no certificate, a key that does not match) is refused and the old
//! one stays in use.
//!
//! With a client CA, every client must present a certificate that chains to it (rustls'
//! WebPKI verifier: signature, validity period, client-auth usage); a connection without
//! one, or with one from another CA, fails in the handshake and never reaches HTTP. The
//! subject Common Name of the verified certificate is handed to the router as
//! [`ClientCert`](super::ClientCert).
//!
//! The only protocol offered (ALPN) is HTTP/1.1; TLS 1.2 and 1.3 with rustls' safe
//! defaults; crypto from *ring*.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use super::ClientCert;

/// Where the server's TLS material lives (all PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// The certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// The private key of the leaf certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// Require client certificates signed by one of these CA certificates (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
}

/// Why a TLS configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {message}")]
    Read {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{what} {path} holds no PEM certificate")]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("TLS configuration refused: {0}")]
    Rustls(String),
}

/// The configuration in use, replaceable while serving.
pub(crate) struct TlsFiles {
    config: TlsConfig,
    current: RwLock<TlsAcceptor>,
}

impl TlsFiles {
    pub(crate) fn load(config: TlsConfig) -> Result<Self, TlsError> {
        let acceptor = TlsAcceptor::from(build(&config)?);
        Ok(TlsFiles {
            config,
            current: RwLock::new(acceptor),
        })
    }

    /// The configuration for a new handshake.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the files again; on success new handshakes use them, on failure nothing
    /// changes.
    pub(crate) fn reload(&self) -> Result<(), TlsError> {
        let acceptor = TlsAcceptor::from(build(&self.config)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = acceptor;
        Ok(())
    }
}

fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read_err = |message: String| TlsError::Read {
        what,
        path: path.to_owned(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| read_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn build(config: &TlsConfig) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = read_certs("certificate file", &config.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&config.key_file).map_err(|e| TlsError::Read {
        what: "key file",
        path: config.key_file.clone(),
        message: e.to_string(),
    })?;
    let rustls_err = |e: rustls::Error| TlsError::Rustls(e.to_string());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(rustls_err)?;
    let builder = match &config.client_ca_file {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for ca in read_certs("client CA file", path)? {
                roots.add(ca).map_err(rustls_err)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Rustls(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut server = builder.with_single_cert(certs, key).map_err(rustls_err)?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(server))
}

/// The verified client certificate of a connection, if it presented one.
pub(crate) fn client_cert(conn: &rustls::ServerConnection) -> Option<ClientCert> {
    let leaf = conn.peer_certificates()?.first()?;
    let common_name = x509_parser::parse_x509_certificate(leaf)
        .ok()
        .and_then(|(_, cert)| {
            cert.subject()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .map(str::to_owned)
        });
    Some(ClientCert { common_name })
}
