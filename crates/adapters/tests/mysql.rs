//! The shared suite against a real MariaDB (InnoDB), started per test on a free loopback
//! port, with a connection pool so that concurrent operations run as separate sessions;
//! the restore drill with `mariadb-dump`; and the preflight's refusals on servers started
//! with unsafe settings.
#![cfg(feature = "mysql")]

mod support;

use mysql_async::prelude::Queryable;
use mysql_async::{Pool, TxOpts};
use palisade_adapters::report::ResourceKind;
use palisade_adapters::{mysql, AdmitError, GateTally, Trust};
use palisade_token::Verifier;
use std::sync::Arc;
use support::servers::{self, Server};
use support::{
    GateUnderTest, Issuer, RaisableGate, Shape, TransactionalGate, Write, LOCK, OTHER_LOCK,
};

const UPSERT: &str = "INSERT INTO kv (k, v) VALUES (?, ?) ON DUPLICATE KEY UPDATE v = VALUES(v)";

struct MySqlGate {
    pool: Pool,
    verifier: Arc<Verifier>,
    tally: GateTally,
    server: Server,
}

impl MySqlGate {
    async fn start(issuer: &Issuer) -> Self {
        Self::on(servers::mariadb(&[]), issuer).await
    }

    async fn on(server: Server, issuer: &Issuer) -> Self {
        let pool = Pool::new(server.mysql_url().as_str());
        let mut conn = pool.get_conn().await.unwrap();
        mysql::migrate(&mut conn).await.unwrap();
        conn.query_drop(
            "CREATE TABLE kv (k VARCHAR(64) PRIMARY KEY, v TEXT NOT NULL) ENGINE = InnoDB",
        )
        .await
        .unwrap();
        MySqlGate {
            pool,
            verifier: issuer.verifier(),
            tally: GateTally::new(),
            server,
        }
    }

    /// Trusts the issuer's tokens and counts every admit in the gate's tally.
    fn trust(&self) -> Trust<'_> {
        Trust::new(&self.verifier).reporting_to(&self.tally)
    }
}

impl GateUnderTest for MySqlGate {
    const KIND: ResourceKind = ResourceKind::Mysql;

    fn tally(&self) -> &GateTally {
        &self.tally
    }

    async fn put(&self, write: Write<'_>) -> Result<(), AdmitError> {
        self.put_shaped(write, Shape::Plain).await
    }

    async fn read(&self, key: &str) -> Option<String> {
        let mut conn = self.pool.get_conn().await.unwrap();
        conn.exec_first("SELECT v FROM kv WHERE k = ?", (key,))
            .await
            .unwrap()
    }

    async fn high_water(&self, lock: &str, _key: &str) -> u64 {
        let mut conn = self.pool.get_conn().await.unwrap();
        mysql::high_water(&mut conn, lock).await.unwrap().epoch
    }
}

impl TransactionalGate for MySqlGate {
    /// One transaction on a session of its own, rolled back on a refusal.
    async fn put_shaped(&self, write: Write<'_>, shape: Shape<'_>) -> Result<(), AdmitError> {
        let mut conn = self.pool.get_conn().await.unwrap();
        let mut tx = conn.start_transaction(TxOpts::default()).await.unwrap();
        if let Shape::AfterOwnWrite(own_key) = shape {
            tx.exec_drop(UPSERT, (own_key, "own")).await.unwrap();
        }
        let admitted = match shape {
            Shape::Sequenced(seq) => {
                mysql::admit_sequenced(&mut tx, self.trust(), write.token, write.lock, seq).await
            }
            _ => mysql::admit(&mut tx, self.trust(), write.token, write.lock).await,
        };
        if let Err(refused) = admitted {
            // At once, as the module docs say: a dropped transaction keeps its row locks
            // until its connection is used again.
            tx.rollback().await.unwrap();
            return Err(refused);
        }
        tx.exec_drop(UPSERT, (write.key, write.value))
            .await
            .unwrap();
        match shape {
            Shape::FailAfter => tx.rollback().await.unwrap(),
            _ => tx.commit().await.unwrap(),
        }
        Ok(())
    }
}

impl RaisableGate for MySqlGate {
    async fn raise(&self, marks: &[(String, u64)]) -> usize {
        let mut conn = self.pool.get_conn().await.unwrap();
        mysql::raise_marks(&mut conn, marks).await.unwrap()
    }
}

support::suite_tests!(|issuer| MySqlGate::start(issuer).await, racers: 40, transactional);

#[tokio::test]
async fn raise_marks() {
    let issuer = &Issuer::new();
    support::suite::raise_marks(&MySqlGate::start(issuer).await, issuer).await;
}

/// Lock names compare byte for byte: a token for "Orders" is not one for "orders", and
/// their marks are two rows, whatever the server's default collation.
#[tokio::test]
async fn lock_names_are_case_sensitive() {
    let issuer = &Issuer::new();
    let gate = MySqlGate::start(issuer).await;
    gate.write(&issuer.token(LOCK, 5), LOCK, "k", "five")
        .await
        .unwrap();
    let upper = LOCK.to_uppercase();
    gate.write(&issuer.token(&upper, 1), &upper, "k2", "one")
        .await
        .unwrap();
    assert_eq!(gate.high_water(LOCK, "k").await, 5);
    assert_eq!(gate.high_water(&upper, "k2").await, 1);
    let wrong = gate
        .write(&issuer.token(OTHER_LOCK, 9), LOCK, "k", "x")
        .await;
    assert!(
        matches!(wrong, Err(AdmitError::WrongLock { .. })),
        "{wrong:?}"
    );
}

/// The restore drill (S11) with MariaDB's own dump: a `mariadb-dump` taken while epoch 1
/// held the mark, loaded back after epoch 2 had fenced it out, admits epoch 1 again;
/// `raise_marks` with the issuer's bound shuts it out, and epoch 2 still writes.
#[tokio::test]
async fn a_restored_dump_admits_a_fenced_out_token_until_its_marks_are_raised() {
    let issuer = &Issuer::new();
    let gate = MySqlGate::start(issuer).await;
    gate.write(&issuer.token(LOCK, 1), LOCK, "k", "one")
        .await
        .unwrap();
    let port = gate.server.port.to_string();
    let tool = |name: &str, args: &[&str], stdin: Option<&[u8]>| {
        use std::io::Write as _;
        let mut child = std::process::Command::new(name)
            .args([
                "--no-defaults",
                "-h",
                "127.0.0.1",
                "-P",
                &port,
                "-u",
                "root",
            ])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(input) = stdin {
            child.stdin.take().unwrap().write_all(input).unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let dump = tool("mariadb-dump", &["--single-transaction", "palisade"], None);
    gate.write(&issuer.token(LOCK, 2), LOCK, "k", "two")
        .await
        .unwrap();
    let stale = gate.write(&issuer.token(LOCK, 1), LOCK, "k", "late").await;
    assert!(matches!(stale, Err(AdmitError::Stale { .. })), "{stale:?}");

    tool("mariadb", &["palisade"], Some(&dump));
    assert_eq!(gate.read("k").await.as_deref(), Some("one"));
    support::suite::restored_until_raised(&gate, issuer).await;
}

/// The preflight refuses a server that acknowledges commits before they are durable,
/// naming the setting; `migrate` refuses too and creates nothing.
#[tokio::test]
async fn the_preflight_refuses_an_unsafe_server_by_name() {
    for (extra, named) in [
        (
            &["--innodb-flush-log-at-trx-commit=2"][..],
            "innodb_flush_log_at_trx_commit",
        ),
        (&["--log-bin=binlog", "--sync-binlog=0"][..], "sync_binlog"),
    ] {
        let server = servers::mariadb(extra);
        let pool = Pool::new(server.mysql_url().as_str());
        let mut conn = pool.get_conn().await.unwrap();
        for refused in [
            mysql::preflight(&mut conn).await,
            mysql::migrate(&mut conn).await,
        ] {
            match refused {
                Err(AdmitError::UnsafeDatabase(e)) => {
                    let names: Vec<&str> = e.settings.iter().map(|s| s.name).collect();
                    assert_eq!(names, [named], "{extra:?}");
                }
                other => panic!("{extra:?}: expected a refusal, got {other:?}"),
            }
        }
        let tables: Option<String> = conn
            .query_first("SHOW TABLES LIKE 'palisade_fence'")
            .await
            .unwrap();
        assert_eq!(
            tables, None,
            "migrate created the table despite the refusal"
        );
        drop(conn);
        pool.disconnect().await.unwrap();
    }
}
