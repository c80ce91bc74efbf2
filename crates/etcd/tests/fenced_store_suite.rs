//! The behavioural suite every fenced store runs (`palisade_test_support::fenced_store`),
//! on the etcd store: a one-member etcd for each case, and two clients on it under one
//! fresh prefix, as two Palisade nodes sharing the data.

mod support;

use std::sync::Arc;

use palisade_etcd::EtcdStore;
use palisade_storage::{FencedStore, StoreLimits, WallClock};
use palisade_test_support::fenced_store::Opened;
use support::EtcdMember;

async fn open(limits: StoreLimits, clock: WallClock) -> Opened {
    let etcd = EtcdMember::start();
    let prefix = format!("/suite{}/", support::rand_suffix());
    let mut nodes: Vec<Arc<dyn FencedStore>> = Vec::new();
    for _ in 0..2 {
        let client = etcd.connect_prefix(&prefix).await;
        nodes.push(Arc::new(EtcdStore::with_limits(
            client,
            limits,
            clock.clone(),
        )));
    }
    Opened {
        nodes,
        guard: Box::new(etcd),
    }
}

palisade_test_support::fenced_store_suite!(open);
