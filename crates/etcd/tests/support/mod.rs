//! A real single-member etcd for the crate's tests: free loopback ports, a temp data
//! directory, stopped by process id. Fails loudly when `etcd` is not installed.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use palisade_etcd::{Etcd, EtcdConfig};

/// One etcd process.
pub struct EtcdMember {
    child: Child,
    pub endpoint: String,
    client_port: u16,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// `GET path` over plain HTTP/1.0; the body, or None when nobody answers.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    text.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
}

/// TLS for a test member's client port: its certificate and key, and the CA whose
/// client certificates it requires.
pub struct MemberTls<'a> {
    pub cert_file: &'a std::path::Path,
    pub key_file: &'a std::path::Path,
    pub client_ca_file: &'a std::path::Path,
}

impl EtcdMember {
    /// Starts a one-member cluster and waits until it has a leader.
    pub fn start() -> EtcdMember {
        EtcdMember::start_with(None, &[])
    }

    /// Like [`EtcdMember::start`], with a TLS client port (client certificates required)
    /// and extra flags. Health is then read from a plain metrics port.
    pub fn start_with(tls: Option<MemberTls<'_>>, extra: &[&str]) -> EtcdMember {
        let dir = tempfile::tempdir().expect("temp dir");
        let (client_port, peer_port) = (free_port(), free_port());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let binary = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".to_owned());
        let mut command = Command::new(&binary);
        let health_port = match &tls {
            Some(tls) => {
                let metrics_port = free_port();
                command
                    .arg("--cert-file")
                    .arg(tls.cert_file)
                    .arg("--key-file")
                    .arg(tls.key_file)
                    .arg("--trusted-ca-file")
                    .arg(tls.client_ca_file)
                    .arg("--client-cert-auth")
                    .arg("--listen-metrics-urls")
                    .arg(format!("http://127.0.0.1:{metrics_port}"));
                metrics_port
            }
            None => client_port,
        };
        let child = command
            .args(extra)
            .args(["--name", "solo", "--data-dir"])
            .arg(dir.path().join("solo"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("solo={peer}")])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {binary:?} ({e}): install etcd-server (scripts/test does)")
            });
        let member = EtcdMember {
            child,
            endpoint: client,
            client_port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if http_get(health_port, "/health").is_some_and(|b| b.contains("\"true\"")) {
                return member;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("etcd at {} did not become healthy", member.endpoint);
    }

    /// A client under a fresh prefix, so tests sharing a member never see each other.
    pub async fn connect(&self) -> Etcd {
        let prefix = format!("/t{}/", rand_suffix());
        self.connect_prefix(&prefix).await
    }

    pub async fn connect_prefix(&self, prefix: &str) -> Etcd {
        let mut config = EtcdConfig::new(vec![self.endpoint.clone()]);
        config.prefix = prefix.to_owned();
        config.request_timeout = Duration::from_secs(5);
        Etcd::connect(&config).await.expect("etcd client")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

pub fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish()
}

impl Drop for EtcdMember {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
