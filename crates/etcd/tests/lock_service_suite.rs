//! The behavioural suite every lock service runs (`palisade_test_support::lock_service`),
//! on the etcd issuer: a one-member etcd for each case, and two issuers on it under one
//! fresh prefix, as two Palisade nodes sharing the locks.

mod support;

use std::sync::Arc;

use palisade_etcd::EtcdIssuer;
use palisade_issuer::LockService;
use palisade_test_support::lock_service::Started;
use palisade_token::Signer;
use support::EtcdMember;

async fn start() -> Started {
    let etcd = EtcdMember::start();
    let prefix = format!("/locks{}/", support::rand_suffix());
    let mut nodes: Vec<Arc<dyn LockService>> = Vec::new();
    for _ in 0..2 {
        let client = etcd.connect_prefix(&prefix).await;
        nodes.push(Arc::new(EtcdIssuer::new(client, Signer::generate())));
    }
    Started {
        nodes,
        guard: Box::new(etcd),
    }
}

palisade_test_support::lock_service_suite!(start);
