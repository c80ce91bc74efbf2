//! The shared suite against a real PostgreSQL (a throwaway cluster started here on a free
//! loopback port; as root, the server runs as `nobody`), plus PostgreSQL's own cases.
#![cfg(feature = "postgres")]

mod support;

use std::sync::Arc;

use palisade_adapters::report::ResourceKind;
use palisade_adapters::{postgres, AdmitError, GateTally, Trust};
use palisade_token::Verifier;
use support::servers::{self, Server};
use support::{
    GateUnderTest, Issuer, RaisableGate, Shape, TransactionalGate, Write, LOCK, OTHER_LOCK,
};
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls};

const UPSERT: &str = "INSERT INTO kv (key, value) VALUES ($1, $2) \
     ON CONFLICT (key) DO UPDATE SET value = excluded.value";

/// How one fenced transaction ends.
struct PgGate {
    config: String,
    idle: Mutex<Vec<Client>>,
    verifier: Arc<Verifier>,
    tally: GateTally,
    _server: Server,
}

async fn connect(config: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(config, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

impl PgGate {
    async fn start(issuer: &Issuer) -> Self {
        let server = tokio::task::spawn_blocking(servers::postgres)
            .await
            .unwrap();
        let config = server.pg_config();
        let client = connect(&config).await;
        postgres::migrate(&client).await.unwrap();
        client
            .batch_execute("CREATE TABLE kv (key text PRIMARY KEY, value text NOT NULL)")
            .await
            .unwrap();
        PgGate {
            config,
            idle: Mutex::new(vec![client]),
            verifier: issuer.verifier(),
            tally: GateTally::new(),
            _server: server,
        }
    }

    /// Trusts the issuer's tokens and counts every admit in the gate's tally.
    fn trust(&self) -> Trust<'_> {
        Trust::new(&self.verifier).reporting_to(&self.tally)
    }

    /// A connection of its own for each concurrent operation, as separate processes have.
    async fn client(&self) -> Client {
        let idle = self.idle.lock().await.pop();
        match idle {
            Some(client) => client,
            None => connect(&self.config).await,
        }
    }
}

impl GateUnderTest for PgGate {
    const KIND: ResourceKind = ResourceKind::Postgres;

    fn tally(&self) -> &GateTally {
        &self.tally
    }

    async fn put(&self, write: Write<'_>) -> Result<(), AdmitError> {
        self.put_shaped(write, Shape::Plain).await
    }

    async fn read(&self, key: &str) -> Option<String> {
        let client = self.client().await;
        let row = client
            .query_opt("SELECT value FROM kv WHERE key = $1", &[&key])
            .await
            .unwrap();
        self.idle.lock().await.push(client);
        row.map(|r| r.get(0))
    }

    async fn high_water(&self, lock: &str, _key: &str) -> u64 {
        let client = self.client().await;
        let mark = postgres::high_water(&client, lock).await.unwrap();
        self.idle.lock().await.push(client);
        mark.epoch
    }
}

impl TransactionalGate for PgGate {
    async fn put_shaped(&self, write: Write<'_>, shape: Shape<'_>) -> Result<(), AdmitError> {
        let Write {
            token,
            lock,
            key,
            value,
        } = write;
        let mut client = self.client().await;
        let result = async {
            let tx = client.transaction().await.unwrap();
            if let Shape::AfterOwnWrite(own_key) = shape {
                tx.execute(UPSERT, &[&own_key, &"own"]).await.unwrap();
            }
            // On Err the transaction is dropped, which rolls it back.
            match shape {
                Shape::Sequenced(seq) => {
                    postgres::admit_sequenced(&tx, self.trust(), token, lock, seq).await?
                }
                _ => postgres::admit(&tx, self.trust(), token, lock).await?,
            };
            tx.execute(UPSERT, &[&key, &value]).await.unwrap();
            match shape {
                Shape::FailAfter => tx.rollback().await.unwrap(),
                _ => tx.commit().await.unwrap(),
            }
            Ok(())
        }
        .await;
        self.idle.lock().await.push(client);
        result
    }
}

support::suite_tests!(|issuer| PgGate::start(issuer).await, racers: 40, transactional);

impl RaisableGate for PgGate {
    async fn raise(&self, marks: &[(String, u64)]) -> usize {
        let mut client = self.client().await;
        postgres::raise_marks(&mut client, marks).await.unwrap()
    }
}

#[tokio::test]
async fn raise_marks() {
    let issuer = &Issuer::new();
    support::suite::raise_marks(&PgGate::start(issuer).await, issuer).await;
}

/// Even a caller that ignores the refusal and commits gets nothing committed: the refusal
/// aborted the transaction inside PostgreSQL.
#[tokio::test]
async fn commit_after_refusal_commits_nothing() {
    let issuer = Issuer::new();
    let gate = PgGate::start(&issuer).await;
    gate.write(&issuer.token(LOCK, 2), LOCK, "k", "v2")
        .await
        .unwrap();
    let mut client = gate.client().await;
    let tx = client.transaction().await.unwrap();
    tx.execute(UPSERT, &[&"careless", &"own write"])
        .await
        .unwrap();
    let refused = postgres::admit(&tx, &gate.verifier, &issuer.token(LOCK, 1), LOCK).await;
    assert!(matches!(
        refused,
        Err(AdmitError::Stale {
            high_water: 2,
            epoch: 1
        })
    ));
    assert!(tx.execute(UPSERT, &[&"k", &"stale write"]).await.is_err());
    let _ = tx.commit().await; // PostgreSQL turns this COMMIT into a rollback.
    gate.idle.lock().await.push(client);
    assert_eq!(gate.read("careless").await, None);
    assert_eq!(gate.read("k").await.as_deref(), Some("v2"));
}

/// Under REPEATABLE READ, a transaction whose snapshot predates a newer holder's commit
/// cannot act on it: the row lock fails with a serialisation error, mapped to Conflict.
#[tokio::test]
async fn repeatable_read_surfaces_conflict() {
    let issuer = Issuer::new();
    let gate = PgGate::start(&issuer).await;
    gate.write(&issuer.token(LOCK, 1), LOCK, "k", "v1")
        .await
        .unwrap();
    let mut client = gate.client().await;
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await
        .unwrap();
    tx.query_one("SELECT count(*) FROM kv", &[]).await.unwrap(); // takes the snapshot
    gate.write(&issuer.token(LOCK, 2), LOCK, "k", "v2")
        .await
        .unwrap();
    let result = postgres::admit(&tx, &gate.verifier, &issuer.token(LOCK, 3), LOCK).await;
    assert!(matches!(result, Err(AdmitError::Conflict)), "{result:?}");
}

/// The restore drill (S11) with PostgreSQL's own backup tools: a `pg_dump` taken while
/// epoch 1 held the mark, restored with `pg_restore` after epoch 2 had fenced it out,
/// admits epoch 1 again; `raise_marks` with the issuer's bound shuts it out, and epoch 2
/// still writes.
#[tokio::test]
async fn a_restored_dump_admits_a_fenced_out_token_until_its_marks_are_raised() {
    let issuer = &Issuer::new();
    let gate = PgGate::start(issuer).await;
    gate.write(&issuer.token(LOCK, 1), LOCK, "k", "one")
        .await
        .unwrap();
    let dump = tempfile::NamedTempFile::new().unwrap();
    let bin = servers::pg_bin_dir();
    let port = gate._server.port.to_string();
    let pg = |tool: &str, args: &[&str]| {
        let out = std::process::Command::new(bin.join(tool))
            .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{tool}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let path = dump.path().to_str().unwrap();
    pg("pg_dump", &["-Fc", "-f", path, "postgres"]);
    gate.write(&issuer.token(LOCK, 2), LOCK, "k", "two")
        .await
        .unwrap();
    let stale = gate.write(&issuer.token(LOCK, 1), LOCK, "k", "late").await;
    assert!(matches!(stale, Err(AdmitError::Stale { .. })), "{stale:?}");

    pg(
        "pg_restore",
        &["--clean", "--if-exists", "-d", "postgres", path],
    );
    assert_eq!(gate.read("k").await.as_deref(), Some("one"));
    support::suite::restored_until_raised(&gate, issuer).await;
}

/// The preflight refuses a PostgreSQL that acknowledges commits before they are durable,
/// naming the setting and its value; `migrate` refuses too, and creates nothing. Set here
/// per session (`synchronous_commit` is a session setting), so the rest of the server is
/// untouched.
#[tokio::test]
async fn the_preflight_refuses_synchronous_commit_off() {
    let issuer = &Issuer::new();
    let gate = PgGate::start(issuer).await;
    let client = gate.client().await;
    postgres::preflight(&client)
        .await
        .expect("the test server is safe");
    client
        .batch_execute("SET synchronous_commit = off")
        .await
        .unwrap();
    let refused = |r: Result<(), AdmitError>| match r {
        Err(AdmitError::UnsafeDatabase(e)) => e
            .settings
            .iter()
            .map(|s| (s.name, s.value.clone()))
            .collect::<Vec<_>>(),
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        refused(postgres::preflight(&client).await),
        [("synchronous_commit", "off".to_owned())]
    );
    client
        .batch_execute("DROP TABLE palisade_fence")
        .await
        .unwrap();
    refused(postgres::migrate(&client).await);
    let left = client
        .query_one("SELECT to_regclass('palisade_fence') IS NULL", &[])
        .await
        .unwrap();
    assert!(
        left.get::<_, bool>(0),
        "a refused migrate created the table"
    );
    client
        .batch_execute("SET synchronous_commit = on")
        .await
        .unwrap();
    postgres::migrate(&client).await.expect("safe again");
}

/// A protected table (`postgres::protect`): PostgreSQL itself refuses a write that no gate
/// admitted in the same transaction, naming the lock, whatever the statement (plain
/// UPDATE, INSERT, DELETE, TRUNCATE, as a psql session would send them); a gated write
/// goes through and a stale one is refused by the gate; an admit is not reused by a later
/// transaction, nor good for another lock's table; after `unprotect` plain writes pass.
#[tokio::test]
async fn a_protected_table_refuses_every_write_no_gate_admitted() {
    let issuer = &Issuer::new();
    let gate = PgGate::start(issuer).await;
    let client = gate.client().await;
    postgres::protect(&client, "kv", LOCK).await.unwrap();
    postgres::protect(&client, "kv", LOCK).await.unwrap(); // idempotent

    let refused = |r: Result<u64, tokio_postgres::Error>| {
        let e = r.expect_err("an ungated write was let through");
        let text = e
            .as_db_error()
            .map(|d| d.message().to_owned())
            .unwrap_or_default();
        assert!(text.contains(&format!("lock \"{LOCK}\"")), "{text}");
    };
    refused(client.execute(UPSERT, &[&"plain", &"psql"]).await);
    refused(client.execute("UPDATE kv SET value = 'x'", &[]).await);
    refused(client.execute("DELETE FROM kv", &[]).await);
    refused(client.execute("TRUNCATE kv", &[]).await);

    // Through the gate: admitted, written; a stale token refused by the gate itself.
    gate.write(&issuer.token(LOCK, 2), LOCK, "k", "v2")
        .await
        .unwrap();
    assert_eq!(gate.read("k").await.as_deref(), Some("v2"));
    let stale = gate.write(&issuer.token(LOCK, 1), LOCK, "k", "late").await;
    assert!(matches!(stale, Err(AdmitError::Stale { .. })), "{stale:?}");
    assert_eq!(gate.read("k").await.as_deref(), Some("v2"));

    // The admit of a committed transaction is not reused by the next one.
    refused(client.execute(UPSERT, &[&"after", &"commit"]).await);
    // An admit for another lock does not open this lock's table.
    let mut other = gate.client().await;
    let tx = other.transaction().await.unwrap();
    postgres::admit(
        &tx,
        &gate.verifier,
        &issuer.token(OTHER_LOCK, 1),
        OTHER_LOCK,
    )
    .await
    .unwrap();
    refused(tx.execute(UPSERT, &[&"other", &"lock"]).await);
    drop(tx);

    postgres::unprotect(&client, "kv").await.unwrap();
    client.execute(UPSERT, &[&"plain", &"again"]).await.unwrap();
    assert_eq!(gate.read("plain").await.as_deref(), Some("again"));
    assert!(postgres::protect(&client, "kv", "not a lock")
        .await
        .is_err());
}
