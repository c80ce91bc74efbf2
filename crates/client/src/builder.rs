//! [`ClientBuilder`]: how a [`Client`] reaches its server: the base URL (`http` or
//! `https`) and any further endpoints of the same deployment to fail over to, which CA to
//! trust, a client certificate for mutual TLS, and the bearer key sent with every
//! request.
//!
//! Files are read when [`ClientBuilder::build`] runs; anything wrong with them is an
//! [`Error::Config`] that names the file, before any request is made.
//!
//! ## What it guarantees
//! - With [`ClientBuilder::ca_file`], the server's certificate must chain to a CA in that
//!   file and to nothing else (the system's roots are not consulted). Without it, an
//!   `https` server is checked against the system's roots.
//! - A CA file or client certificate with an `http://` URL is refused, so a TLS setting
//!   that would silently go unused cannot be mistaken for protection.
//! - A key file that group or others may read is refused, as the server refuses such a
//!   signing key: whoever reads it can act as its principal.
//! - The key is sent as `Authorization: Bearer <key>`, marked sensitive (not logged by
//!   the HTTP stack).
//!
//! ## What it does not do
//! - It does not keep a key from being sent over plain `http://`: on anything but
//!   loopback, use `https`.
//! - It does not reload files: build a new client to pick up a new key or certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};

use crate::client::{Client, CONNECT_TIMEOUT};
use crate::failover::Endpoints;
use crate::paths::normalise_base;
use crate::{Deadlines, Error, REQUEST_TIMEOUT};

/// How long an unused pooled connection is kept.
const POOL_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Where the bearer key comes from.
#[derive(Debug, Clone)]
enum Key {
    Value(String),
    File(PathBuf),
}

/// Settings for a [`Client`]; start with [`Client::builder`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base_url: String,
    /// More nodes of the same deployment, tried after `base_url` (see `failover`).
    more: Vec<String>,
    ca_file: Option<PathBuf>,
    identity: Option<(PathBuf, PathBuf)>,
    key: Option<Key>,
    deadlines: Deadlines,
}

impl ClientBuilder {
    pub(crate) fn new(base_url: &str) -> Self {
        ClientBuilder {
            base_url: base_url.to_owned(),
            more: Vec::new(),
            ca_file: None,
            identity: None,
            key: None,
            deadlines: Deadlines::default(),
        }
    }

    /// How this client's leases and sessions derive their safe deadline and renewal
    /// deadline from the TTL (default: [`Deadlines::default`], 2/3 of the TTL and 1 %
    /// clock drift).
    pub fn deadlines(mut self, deadlines: Deadlines) -> Self {
        self.deadlines = deadlines;
        self
    }

    /// Another node of the same deployment (the stateless nodes of an etcd topology): a
    /// call that cannot reach a node, or gets 503, is sent to the next one, as far as it
    /// is safe to resend (see the crate docs). Every endpoint must use the scheme of the
    /// first, and one CA, certificate and key serve them all.
    pub fn endpoint(mut self, base_url: &str) -> Self {
        self.more.push(base_url.to_owned());
        self
    }

    /// Trust only the CA certificates in this PEM file for the server's certificate.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Present this certificate chain (PEM, leaf first) and its private key (PEM) to a
    /// server that requires client certificates (mutual TLS).
    pub fn client_cert(
        mut self,
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> Self {
        self.identity = Some((cert_file.into(), key_file.into()));
        self
    }

    /// Send `Authorization: Bearer <key>` with every request.
    pub fn bearer_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(Key::Value(key.into()));
        self
    }

    /// Like [`ClientBuilder::bearer_key`], with the key read from a file (surrounding
    /// whitespace ignored) that group and others may not read.
    pub fn bearer_key_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.key = Some(Key::File(path.into()));
        self
    }

    /// Reads the files and builds the client. No request is made.
    pub fn build(self) -> Result<Client, Error> {
        let base = normalise_base(&self.base_url)?;
        let https = base.starts_with("https:");
        let mut bases = vec![base.clone()];
        for more in &self.more {
            let other = normalise_base(more)?;
            if other.starts_with("https:") != https {
                return Err(Error::Config(format!(
                    "endpoint {other} does not use the scheme of {base}: every endpoint of \
                     one client is http:// or every one https://"
                )));
            }
            if !bases.contains(&other) {
                bases.push(other);
            }
        }
        let mut http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            // Give idle connections up before the server does (its default idle timeout is
            // 60 s), so a request is not sent on a connection the server is just closing.
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            // Small requests on a latency-sensitive path: do not let Nagle batch them.
            .tcp_nodelay(true);
        if !https && (self.ca_file.is_some() || self.identity.is_some()) {
            return Err(Error::Config(format!(
                "a CA file or client certificate was given, but {base} is not an https:// URL"
            )));
        }
        if let Some(path) = &self.ca_file {
            let pem = read(path, "CA file")?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| config_err(path, "CA file", &e.to_string()))?;
            if certs.is_empty() {
                return Err(config_err(path, "CA file", "no PEM certificate in it"));
            }
            http = http.tls_built_in_root_certs(false);
            for cert in certs {
                http = http.add_root_certificate(cert);
            }
        }
        if let Some((cert_file, key_file)) = &self.identity {
            let mut pem = read(cert_file, "client certificate")?;
            pem.push(b'\n');
            pem.extend(read(key_file, "client key")?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| config_err(cert_file, "client certificate or key", &e.to_string()))?;
            http = http.identity(identity);
        }
        if let Some(key) = &self.key {
            let key = match key {
                Key::Value(k) => k.trim().to_owned(),
                Key::File(path) => read_key_file(path)?,
            };
            let mut value = HeaderValue::try_from(format!("Bearer {key}"))
                .ok()
                .filter(|_| !key.is_empty() && key.bytes().all(|b| b.is_ascii_graphic()))
                .ok_or_else(|| {
                    Error::Config("the bearer key must be non-empty visible ASCII".to_owned())
                })?;
            value.set_sensitive(true);
            let mut headers = HeaderMap::new();
            headers.insert(AUTHORIZATION, value);
            http = http.default_headers(headers);
        }
        let http = http
            .build()
            .map_err(|e| Error::Config(format!("cannot set up the HTTP client: {e}")))?;
        Ok(Client {
            http,
            endpoints: Arc::new(Endpoints::new(bases)),
            deadlines: self.deadlines,
        })
    }
}

fn config_err(path: &Path, what: &str, message: &str) -> Error {
    Error::Config(format!("{what} {}: {message}", path.display()))
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| config_err(path, what, &format!("cannot read it: {e}")))
}

/// Reads a key file, refusing one that group or others may read.
fn read_key_file(path: &Path) -> Result<String, Error> {
    let text = read(path, "key file")?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|e| config_err(path, "key file", &format!("cannot read it: {e}")))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(config_err(
                path,
                "key file",
                &format!(
                    "may be read by group or others (mode {:o}); run chmod 600 on it",
                    mode & 0o777
                ),
            ));
        }
    }
    String::from_utf8(text)
        .map(|k| k.trim().to_owned())
        .map_err(|_| config_err(path, "key file", "not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_need_an_https_url() {
        let err = Client::builder("http://127.0.0.1:1")
            .ca_file("/nonexistent")
            .build()
            .unwrap_err();
        assert_eq!(err.code(), "config");
        assert!(err.to_string().contains("https://"), "{err}");
    }

    #[test]
    fn a_key_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "k3y\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = Client::builder("http://127.0.0.1:1")
            .bearer_key_file(&path)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        Client::builder("http://127.0.0.1:1")
            .bearer_key_file(&path)
            .build()
            .unwrap();
    }

    #[test]
    fn a_key_that_cannot_be_a_header_is_refused() {
        for bad in ["", "two words", "line\nbreak"] {
            let err = Client::builder("http://127.0.0.1:1")
                .bearer_key(bad)
                .build()
                .unwrap_err();
            assert_eq!(err.code(), "config", "{bad:?}");
        }
    }
}
