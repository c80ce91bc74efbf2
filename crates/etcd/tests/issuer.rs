//! The etcd issuer beyond the suite every lock service runs (`lock_service_suite.rs`:
//! grants, refusals, keepalive, release and expiry, ownership, racing acquisitions over two
//! nodes, the waiting line): how a TTL maps onto etcd's leases.

mod support;

use palisade_etcd::EtcdIssuer;
use palisade_issuer::LockService;
use palisade_test_support::lock_service::request;
use palisade_token::Signer;
use support::EtcdMember;

/// etcd leases count whole seconds: a TTL is rounded up to one, never down (the test
/// cluster's minimum TTL is 1 s), and the grant says the TTL it really got.
#[tokio::test]
async fn a_ttl_is_rounded_up_to_whole_seconds() {
    let etcd = EtcdMember::start();
    let issuer = EtcdIssuer::new(etcd.connect().await, Signer::generate());
    let a = issuer.acquire(request("l", "a", 1, 0)).await.unwrap();
    assert_eq!(a.lease.ttl_ms, 1000);
    let b = issuer.acquire(request("m", "b", 1500, 0)).await.unwrap();
    assert_eq!(b.lease.ttl_ms, 2000);
}
