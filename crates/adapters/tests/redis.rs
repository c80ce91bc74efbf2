//! The shared suite against a real `redis-server` (started here on a free loopback port,
//! with `appendonly yes` and `appendfsync always`), plus the script's own atomicity.
#![cfg(feature = "redis")]

mod support;

use std::sync::Arc;

use palisade_adapters::redis::RedisFence;
use palisade_adapters::report::ResourceKind;
use palisade_adapters::{AdmitError, GateTally, Trust};
use palisade_token::Verifier;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use support::servers::{self, Server};
use support::{GateUnderTest, Issuer, RaisableGate, Write, LOCK};

struct RedisGate {
    con: MultiplexedConnection,
    fence: RedisFence,
    verifier: Arc<Verifier>,
    tally: GateTally,
    _server: Server,
}

impl RedisGate {
    /// Trusts the issuer's tokens and counts every admit in the gate's tally.
    fn trust(&self) -> Trust<'_> {
        Trust::new(&self.verifier).reporting_to(&self.tally)
    }

    async fn start(issuer: &Issuer) -> Self {
        let server = tokio::task::spawn_blocking(servers::redis).await.unwrap();
        Self::on(server, issuer).await
    }

    async fn on(server: Server, issuer: &Issuer) -> Self {
        let client = redis::Client::open(server.redis_url()).unwrap();
        let mut con = client.get_multiplexed_async_connection().await.unwrap();
        let fence = RedisFence::connect(&mut con)
            .await
            .expect("the test server runs with appendonly yes, appendfsync always");
        RedisGate {
            con,
            fence,
            verifier: issuer.verifier(),
            tally: GateTally::new(),
            _server: server,
        }
    }

    async fn set_many(&self, token: &str, pairs: &[(&str, &str)]) -> Result<(), AdmitError> {
        let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        let mut con = self.con.clone();
        let verifier = &self.verifier;
        self.fence
            .fenced_set(&mut con, verifier, token, LOCK, &pairs)
            .await
            .map(drop)
    }
}

impl GateUnderTest for RedisGate {
    const KIND: ResourceKind = ResourceKind::Redis;

    fn tally(&self) -> &GateTally {
        &self.tally
    }

    async fn put(&self, write: Write<'_>) -> Result<(), AdmitError> {
        let mut con = self.con.clone();
        let pairs = [(write.key, write.value.as_bytes())];
        self.fence
            .fenced_set(&mut con, self.trust(), write.token, write.lock, &pairs)
            .await
            .map(drop)
    }

    async fn read(&self, key: &str) -> Option<String> {
        self.con.clone().get(key).await.unwrap()
    }

    async fn high_water(&self, lock: &str, _key: &str) -> u64 {
        let mut con = self.con.clone();
        self.fence.high_water(&mut con, lock).await.unwrap().epoch
    }
}

support::suite_tests!(|issuer| RedisGate::start(issuer).await, racers: 40);

impl RaisableGate for RedisGate {
    async fn raise(&self, marks: &[(String, u64)]) -> usize {
        let mut con = self.con.clone();
        self.fence.raise_marks(&mut con, marks).await.unwrap()
    }
}

#[tokio::test]
async fn raise_marks() {
    let issuer = &Issuer::new();
    support::suite::raise_marks(&RedisGate::start(issuer).await, issuer).await;
}

/// The script is the transaction: a refused call writes none of its keys, an admitted
/// one writes all of them.
#[tokio::test]
async fn a_refused_script_writes_none_of_its_keys() {
    let issuer = Issuer::new();
    let gate = RedisGate::start(&issuer).await;
    let (t1, t2) = (issuer.token(LOCK, 1), issuer.token(LOCK, 2));
    gate.set_many(&t2, &[("{orders}:a", "a2"), ("{orders}:b", "b2")])
        .await
        .unwrap();
    let stale = gate
        .set_many(&t1, &[("{orders}:a", "a1"), ("{orders}:audit", "stale")])
        .await;
    assert!(matches!(
        stale,
        Err(AdmitError::Stale {
            high_water: 2,
            epoch: 1
        })
    ));
    assert_eq!(gate.read("{orders}:a").await.as_deref(), Some("a2"));
    assert_eq!(gate.read("{orders}:audit").await, None);
    assert_eq!(gate.high_water(LOCK, "").await, 2);
}

/// Deletes, barriers, and the guard that keeps data out of the fence namespace.
#[tokio::test]
async fn delete_barrier_and_reserved_keys() {
    let issuer = Issuer::new();
    let gate = RedisGate::start(&issuer).await;
    let (verifier, mut con) = (issuer.verifier(), gate.con.clone());
    gate.write(&issuer.token(LOCK, 1), LOCK, "k", "v1")
        .await
        .unwrap();
    // The new holder's barrier, before it writes anything: epoch 1 is refused from now on.
    let t2 = issuer.token(LOCK, 2);
    gate.fence
        .fence(&mut con, &verifier, &t2, LOCK)
        .await
        .unwrap();
    assert_eq!(gate.read("k").await.as_deref(), Some("v1"));
    let t1 = issuer.token(LOCK, 1);
    let late = gate
        .fence
        .fenced_del(&mut con, &verifier, &t1, LOCK, &["k"])
        .await;
    assert!(matches!(late, Err(AdmitError::Stale { .. })), "{late:?}");
    gate.fence
        .fenced_del(&mut con, &verifier, &t2, LOCK, &["k"])
        .await
        .unwrap();
    assert_eq!(gate.read("k").await, None);
    assert_eq!(gate.high_water(LOCK, "k").await, 2);

    let clobber = gate
        .write(&t2, LOCK, &RedisFence::fence_key("x"), "0")
        .await;
    assert!(
        matches!(clobber, Err(AdmitError::Backend(_))),
        "{clobber:?}"
    );
    assert_eq!(gate.high_water(LOCK, "k").await, 2);
}

/// Epochs past 2^53 (where Lua's doubles lose precision) still compare exactly.
#[tokio::test]
async fn huge_epochs_compare_exactly() {
    let issuer = Issuer::new();
    let gate = RedisGate::start(&issuer).await;
    let big = u64::MAX - 1;
    gate.write(&issuer.token(LOCK, big), LOCK, "k", "big")
        .await
        .unwrap();
    let below = gate
        .write(&issuer.token(LOCK, big - 1), LOCK, "k", "below")
        .await;
    assert!(matches!(below, Err(AdmitError::Stale { .. })), "{below:?}");
    gate.write(&issuer.token(LOCK, u64::MAX), LOCK, "k", "max")
        .await
        .unwrap();
    assert_eq!(gate.high_water(LOCK, "k").await, u64::MAX);
}

/// The failover drill (S7, S11): a replica promoted (`REPLICAOF NO ONE`) before it saw
/// the newest mark admits the fenced-out epoch 1 again; `raise_marks` on it with the
/// issuer's bound shuts it out, and epoch 2 still writes.
/// Makes `replica` follow `primary`, and waits until the link is up.
async fn follow(replica: &RedisGate, primary: &RedisGate) {
    let mut con = replica.con.clone();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary._server.port)
        .query_async(&mut con)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut con)
            .await
            .unwrap();
        if info.contains("master_link_status:up") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never synced: {info}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Promotes `replica` (`REPLICAOF NO ONE`).
async fn promote(replica: &RedisGate) {
    let mut con = replica.con.clone();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut con)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_promoted_replica_admits_a_fenced_out_token_until_its_marks_are_raised() {
    let issuer = &Issuer::new();
    let primary = RedisGate::start(issuer).await;
    let replica = RedisGate::start(issuer).await;
    follow(&replica, &primary).await;
    primary
        .write(&issuer.token(LOCK, 1), LOCK, "k", "one")
        .await
        .unwrap();
    // Until the replica has the mark of epoch 1.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while replica.high_water(LOCK, "k").await != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never synced"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Promoted before it saw epoch 2.
    promote(&replica).await;
    primary
        .write(&issuer.token(LOCK, 2), LOCK, "k", "two")
        .await
        .unwrap();
    assert!(matches!(
        primary
            .write(&issuer.token(LOCK, 1), LOCK, "k", "late")
            .await,
        Err(AdmitError::Stale { .. })
    ));
    support::suite::restored_until_raised(&replica, issuer).await;
}

/// With `wait_for_replicas`, every admitted call is on the replica before it returns: the
/// replica promoted right after epoch 2 fenced epoch 1 out already refuses epoch 1, with
/// no raise. A primary left without its replica reports the shortfall.
#[tokio::test]
async fn waiting_for_replicas_keeps_the_newest_mark_on_a_promoted_replica() {
    let issuer = &Issuer::new();
    let primary = RedisGate::start(issuer).await;
    let replica = RedisGate::start(issuer).await;
    follow(&replica, &primary).await;
    let fence = RedisFence::unchecked().wait_for_replicas(1, std::time::Duration::from_secs(10));
    let verifier = issuer.verifier();
    let mut con = primary.con.clone();
    for epoch in [1, 2] {
        let token = issuer.token(LOCK, epoch);
        fence
            .fenced_set(&mut con, &verifier, &token, LOCK, &[("k", b"v".as_slice())])
            .await
            .expect("admitted and acknowledged by the replica");
    }
    promote(&replica).await;
    let stale = replica
        .write(&issuer.token(LOCK, 1), LOCK, "k", "late")
        .await;
    assert!(matches!(stale, Err(AdmitError::Stale { .. })), "{stale:?}");

    // The primary has no replica now: the call is applied, and the shortfall reported.
    let fence = RedisFence::unchecked().wait_for_replicas(1, std::time::Duration::from_millis(200));
    let token = issuer.token(LOCK, 3);
    let err = fence
        .fenced_set(
            &mut con,
            &verifier,
            &token,
            LOCK,
            &[("k", b"three".as_slice())],
        )
        .await
        .expect_err("no replica acknowledged it");
    assert!(
        err.to_string().contains("0 of 1 replicas acknowledged"),
        "{err}"
    );
    assert_eq!(primary.read("k").await.as_deref(), Some("three"));
}

/// The restore drill (S11) with Redis's own snapshot: an RDB file saved while epoch 1 held
/// the mark, loaded back after epoch 2 had fenced it out (`DEBUG RELOAD NOSAVE`, what a
/// restart on the old file does), admits epoch 1 again; `raise_marks` with the issuer's
/// bound shuts it out, and epoch 2 still writes.
#[tokio::test]
async fn a_restored_rdb_admits_a_fenced_out_token_until_its_marks_are_raised() {
    let issuer = &Issuer::new();
    let server =
        tokio::task::spawn_blocking(|| servers::redis_with(&["--enable-debug-command", "local"]))
            .await
            .unwrap();
    let gate = RedisGate::on(server, issuer).await;
    let mut con = gate.con.clone();
    gate.write(&issuer.token(LOCK, 1), LOCK, "k", "one")
        .await
        .unwrap();
    let _: () = redis::cmd("SAVE").query_async(&mut con).await.unwrap();
    let (_, dir): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("dir")
        .query_async(&mut con)
        .await
        .unwrap();
    let rdb = std::path::Path::new(&dir).join("dump.rdb");
    let backup = std::path::Path::new(&dir).join("dump.rdb.backup");
    std::fs::copy(&rdb, &backup).unwrap();
    gate.write(&issuer.token(LOCK, 2), LOCK, "k", "two")
        .await
        .unwrap();

    std::fs::copy(&backup, &rdb).unwrap();
    let _: () = redis::cmd("DEBUG")
        .arg("RELOAD")
        .arg("NOSAVE")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(gate.read("k").await.as_deref(), Some("one"));
    support::suite::restored_until_raised(&gate, issuer).await;
}

/// The preflight refuses a Redis that cannot keep a mark durable, naming the setting and
/// its value, and passes once the setting is safe again (set live with `CONFIG SET`).
#[tokio::test]
async fn the_preflight_refuses_a_redis_without_appendfsync_always() {
    let issuer = &Issuer::new();
    let gate = RedisGate::start(issuer).await;
    let mut con = gate.con.clone();
    let set = |value: &'static str| {
        let mut con = gate.con.clone();
        async move {
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("appendfsync")
                .arg(value)
                .query_async(&mut con)
                .await
                .unwrap();
        }
    };
    set("everysec").await;
    match RedisFence::connect(&mut con).await {
        Err(AdmitError::UnsafeDatabase(e)) => {
            let names: Vec<_> = e
                .settings
                .iter()
                .map(|s| (s.name, s.value.as_str()))
                .collect();
            assert_eq!(names, [("appendfsync", "everysec")]);
            assert_eq!(
                AdmitError::UnsafeDatabase(e).code().as_str(),
                "storage_failed"
            );
        }
        other => panic!("expected a refusal, got {:?}", other.map(drop)),
    }
    set("always").await;
    RedisFence::connect(&mut con).await.expect("safe again");
}
