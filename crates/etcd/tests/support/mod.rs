//! A real single-member etcd for the crate's tests (see `palisade_test_support::etcd`),
//! and clients of it under fresh prefixes. The operation builders are the fenced-store
//! suite's (`palisade_test_support::fenced_store`).

#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use palisade_etcd::{Etcd, EtcdConfig};
use palisade_test_support::etcd::{EtcdCluster, MemberTls as ClusterTls, Options};

/// One etcd process.
pub struct EtcdMember {
    cluster: EtcdCluster,
    pub endpoint: String,
}

/// TLS for a test member's client port: its certificate and key, and the CA whose
/// client certificates it requires.
pub struct MemberTls<'a> {
    pub cert_file: &'a Path,
    pub key_file: &'a Path,
    pub client_ca_file: &'a Path,
}

impl EtcdMember {
    /// Starts a one-member cluster and waits until it has a leader.
    pub fn start() -> EtcdMember {
        EtcdMember::start_with(None, &[])
    }

    /// Like [`EtcdMember::start`], with a TLS client port (client certificates required)
    /// and extra flags.
    pub fn start_with(tls: Option<MemberTls<'_>>, extra: &[&str]) -> EtcdMember {
        let options = Options {
            tls: tls.map(|t| ClusterTls {
                cert_file: t.cert_file.to_owned(),
                key_file: t.key_file.to_owned(),
                client_ca_file: t.client_ca_file.to_owned(),
            }),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        let cluster = EtcdCluster::start_with(1, options);
        let endpoint = cluster.endpoint(0);
        EtcdMember { cluster, endpoint }
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
        self.cluster.pid(0).expect("the member runs")
    }
}

pub fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::Instant::now().elapsed().as_nanos());
    h.finish()
}
