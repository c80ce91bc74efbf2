//! Namespace quotas and idempotency retention against a real etcd, and the paged lock
//! listing: the same rule as the embedded store (`palisade_storage::decide`), with the
//! counters compared in the write's own transaction and expired records deleted by etcd.

mod support;

use palisade_api::QuotaResource;
use std::time::{Duration, Instant};

use bytes::Bytes;
use etcd_client::{Client, GetOptions};
use palisade_etcd::{EtcdIssuer, EtcdStore};
use palisade_issuer::LockService;
use palisade_storage::{ApplyError, FencedStore, Page, StoreLimits, WallClock};
use palisade_test_support::fenced_store::{delete, keyed, op, put};
use palisade_token::Signer;
use support::EtcdMember;

fn limits(keys: u64, bytes: u64, retention: Duration) -> StoreLimits {
    StoreLimits {
        max_keys_per_namespace: keys,
        max_bytes_per_namespace: bytes,
        idempotency_retention: retention,
    }
}

#[tokio::test]
async fn quotas_count_a_namespace_written_before_counters_existed() {
    let etcd = EtcdMember::start();
    let prefix = format!("/q{}/", support::rand_suffix());
    let raw = Client::connect([etcd.endpoint.as_str()], None)
        .await
        .unwrap();
    // A namespace written before counters existed: two values, no usage key.
    let mut kv = raw.kv_client();
    for (key, value) in [("a", &b"xyz"[..]), ("bb", b"")] {
        let mut stored = vec![1u8];
        stored.extend_from_slice(&1u64.to_be_bytes());
        stored.extend_from_slice(value);
        kv.put(format!("{prefix}kv/old/{key}"), stored, None)
            .await
            .unwrap();
    }
    let l = limits(3, 12, Duration::from_secs(3600));
    let nodes = [
        EtcdStore::with_limits(etcd.connect_prefix(&prefix).await, l, WallClock::system()),
        EtcdStore::with_limits(etcd.connect_prefix(&prefix).await, l, WallClock::system()),
    ];
    // "a"+"xyz" (4) + "bb" (2) counted: a third key fits, a fourth does not.
    nodes[0].apply(op("old", 1, put("c", "1"))).await.unwrap();
    assert_eq!(
        nodes[1].apply(op("old", 1, put("d", ""))).await,
        Err(ApplyError::QuotaExceeded {
            resource: QuotaResource::KeysPerNamespace,
            limit: 3
        })
    );
    // 8 bytes now; 8 - 4 + 9 = 13 > 12.
    assert_eq!(
        nodes[1].apply(op("old", 2, put("a", "12345678"))).await,
        Err(ApplyError::QuotaExceeded {
            resource: QuotaResource::BytesPerNamespace,
            limit: 12
        })
    );
    // Nothing of the refusal landed: the value and the mark are as before.
    assert_eq!(
        nodes[0].get("old", "a").await.unwrap().unwrap().value,
        Bytes::from_static(b"xyz")
    );
    assert_eq!(nodes[0].high_water("old").await.unwrap().epoch, 1);

    // A delete on the other node frees room, counted from the old value's size.
    nodes[1].apply(op("old", 1, delete("a"))).await.unwrap();
    nodes[0].apply(op("old", 1, put("d", ""))).await.unwrap();
}

#[tokio::test]
async fn etcd_deletes_expired_idempotency_records() {
    let etcd = EtcdMember::start();
    let prefix = format!("/i{}/", support::rand_suffix());
    let store = EtcdStore::with_limits(
        etcd.connect_prefix(&prefix).await,
        limits(100, 1 << 20, Duration::from_secs(1)),
        WallClock::system(),
    );
    // The retention's rule (replayed within it, applied afresh after it) is the suite's
    // `an_idempotency_key_is_forgotten_after_its_retention`; here, the records' end.
    let first = store
        .apply(keyed("a", 1, "req", "fp-1", put("k", "1")))
        .await
        .unwrap();
    assert!(!first.replayed);

    // etcd deletes the records when their lease ends (retention + one bucket, raised to
    // etcd's minimum TTL): poll until the idempotency keys are gone.
    let raw = Client::connect([etcd.endpoint.as_str()], None)
        .await
        .unwrap();
    let mut kv = raw.kv_client();
    let records = format!("{prefix}idem/");
    let count_only = || Some(GetOptions::new().with_prefix().with_count_only());
    let written = kv.get(records.as_str(), count_only()).await.unwrap();
    assert_eq!(written.count(), 1, "the write left its record");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = kv
            .get(records.as_str(), count_only())
            .await
            .unwrap()
            .count();
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} expired records still in etcd"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The lease the idempotency records hang on, revoked behind the store's back (by hand,
/// or ended early by a clock jump): the next keyed write is refused by etcd as
/// `LeaseGone`, and the store takes a new lease and writes, rather than answering
/// `storage_failed`.
#[tokio::test]
async fn a_revoked_record_lease_is_replaced_and_the_write_goes_through() {
    let etcd = EtcdMember::start();
    let prefix = format!("/r{}/", support::rand_suffix());
    let store = EtcdStore::with_limits(
        etcd.connect_prefix(&prefix).await,
        limits(100, 1 << 20, Duration::from_secs(60)),
        WallClock::system(),
    );
    store
        .apply(keyed("a", 1, "req", "fp-1", put("k", "1")))
        .await
        .unwrap();
    let raw = Client::connect([etcd.endpoint.as_str()], None)
        .await
        .unwrap();
    let mut leases = raw.lease_client();
    let listed = leases.leases().await.unwrap();
    assert!(!listed.leases().is_empty(), "the record has a lease");
    for lease in listed.leases() {
        leases.revoke(lease.id()).await.unwrap();
    }
    let written = store
        .apply(keyed("b", 1, "req", "fp-2", put("k", "2")))
        .await
        .unwrap();
    let replay = store
        .apply(keyed("b", 1, "req", "fp-2", put("k", "2")))
        .await
        .unwrap();
    assert_eq!((replay.replayed, replay.revision), (true, written.revision));
}

#[tokio::test]
async fn locks_are_listed_page_by_page_in_name_order() {
    let etcd = EtcdMember::start();
    let issuer = EtcdIssuer::new(etcd.connect().await, Signer::generate());
    for lock in ["b", "a.2", "a.1", "a.10", "c"] {
        let granted = issuer
            .acquire(palisade_issuer::Acquire {
                lock: lock.into(),
                holder: "h".into(),
                ttl_ms: 5_000,
                wait_ms: 0,
                lease_id: format!("{lock}-lease"),
                ..palisade_issuer::Acquire::default()
            })
            .await
            .unwrap();
        issuer.release(&granted.lease.lease_id, None).await.unwrap();
    }
    let names = |page: Vec<(String, u64)>| page.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    // Pages of two by cursor; with a prefix, a cursor inside it and past it.
    for (page, expected) in [
        (Page::first("", 2), &["a.1", "a.10"][..]),
        (Page::new("", Some("a.10"), 2), &["a.2", "b"]),
        (Page::new("", Some("b"), 5), &["c"]),
        (Page::new("a.", Some("a.1"), 5), &["a.10", "a.2"]),
        (Page::new("a.", Some("a.3"), 5), &[]),
    ] {
        let found = issuer.lock_names(page.clone()).await.unwrap();
        assert_eq!(names(found), expected, "{page:?}");
    }
    let page = issuer
        .list_page(Page::new("", Some("a.2"), 10))
        .await
        .unwrap();
    let views: Vec<_> = page.iter().map(|v| (v.lock.as_str(), v.epoch)).collect();
    assert_eq!(views, [("b", 1), ("c", 1)]);
    assert_eq!(issuer.list(Page::first("a.", 10)).await.unwrap().len(), 3);
}
