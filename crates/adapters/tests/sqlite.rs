//! The shared suite against SQLite: a database file in a temp dir, a connection per
//! operation (as separate processes would have), `BEGIN IMMEDIATE` transactions.
#![cfg(feature = "sqlite")]

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use palisade_adapters::report::ResourceKind;
use palisade_adapters::{sqlite, AdmitError, GateTally, Trust};
use palisade_token::Verifier;
use rusqlite::{Connection, OptionalExtension};
use support::{GateUnderTest, Issuer, RaisableGate, Shape, TransactionalGate, Write};
use tempfile::TempDir;

const UPSERT: &str = "INSERT INTO kv (key, value) VALUES (?1, ?2) \
     ON CONFLICT (key) DO UPDATE SET value = excluded.value";

struct SqliteGate {
    path: PathBuf,
    verifier: Arc<Verifier>,
    tally: Arc<GateTally>,
    _dir: TempDir,
}

impl SqliteGate {
    fn new(issuer: &Issuer) -> Self {
        let dir = TempDir::new().unwrap();
        let gate = SqliteGate {
            path: dir.path().join("app.db"),
            verifier: issuer.verifier(),
            tally: Arc::new(GateTally::new()),
            _dir: dir,
        };
        let conn = gate.connect();
        sqlite::migrate(&conn).unwrap();
        conn.execute_batch("CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            .unwrap();
        gate
    }

    fn connect(&self) -> Connection {
        let conn = Connection::open(&self.path).unwrap();
        conn.busy_timeout(Duration::from_secs(30)).unwrap();
        conn
    }
}

impl GateUnderTest for SqliteGate {
    const KIND: ResourceKind = ResourceKind::Sqlite;

    fn tally(&self) -> &GateTally {
        &self.tally
    }

    async fn put(&self, write: Write<'_>) -> Result<(), AdmitError> {
        self.put_shaped(write, Shape::Plain).await
    }

    async fn read(&self, key: &str) -> Option<String> {
        self.connect()
            .query_row("SELECT value FROM kv WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .unwrap()
    }

    async fn high_water(&self, lock: &str, _key: &str) -> u64 {
        sqlite::high_water(&self.connect(), lock).unwrap().epoch
    }
}

impl TransactionalGate for SqliteGate {
    /// One transaction on a fresh connection, off the async runtime.
    async fn put_shaped(&self, write: Write<'_>, shape: Shape<'_>) -> Result<(), AdmitError> {
        let (path, verifier, tally) =
            (self.path.clone(), self.verifier.clone(), self.tally.clone());
        let own = match shape {
            Shape::AfterOwnWrite(own_key) => Some(own_key.to_owned()),
            _ => None,
        };
        let seq = match shape {
            Shape::Sequenced(seq) => Some(seq),
            _ => None,
        };
        let fail_after = matches!(shape, Shape::FailAfter);
        let [token, lock, key, value] =
            [write.token, write.lock, write.key, write.value].map(str::to_owned);
        tokio::task::spawn_blocking(move || {
            let mut conn = Connection::open(path).unwrap();
            conn.busy_timeout(Duration::from_secs(30)).unwrap();
            let tx = sqlite::begin(&mut conn)?;
            let trust = Trust::new(&verifier).reporting_to(&tally);
            if let Some(own_key) = own {
                tx.execute(UPSERT, [own_key.as_str(), "own"]).unwrap();
            }
            // On Err the transaction is dropped, which rolls it back.
            match seq {
                Some(seq) => sqlite::admit_sequenced(&tx, trust, &token, &lock, seq)?,
                None => sqlite::admit(&tx, trust, &token, &lock)?,
            };
            tx.execute(UPSERT, [key, value]).unwrap();
            if fail_after {
                tx.rollback().unwrap();
            } else {
                tx.commit().unwrap();
            }
            Ok(())
        })
        .await
        .unwrap()
    }
}

support::suite_tests!(|issuer| SqliteGate::new(issuer), racers: 40, transactional);

impl RaisableGate for SqliteGate {
    async fn raise(&self, marks: &[(String, u64)]) -> usize {
        let mut conn = self.connect();
        sqlite::raise_marks(&mut conn, marks).unwrap()
    }
}

#[tokio::test]
async fn raise_marks() {
    let issuer = &Issuer::new();
    support::suite::raise_marks(&SqliteGate::new(issuer), issuer).await;
}

/// A deferred transaction that read the mark before another writer committed cannot
/// commit a decision made on the stale read: SQLite refuses the upgrade.
#[tokio::test]
async fn deferred_transaction_is_still_safe() {
    let issuer = Issuer::new();
    let gate = SqliteGate::new(&issuer);
    gate.write(&issuer.token("orders", 1), "orders", "k", "v1")
        .await
        .unwrap();
    let mut stale = gate.connect();
    stale.execute_batch("PRAGMA journal_mode = WAL").unwrap();
    let tx = stale.transaction().unwrap(); // BEGIN DEFERRED
    assert_eq!(sqlite::high_water(&tx, "orders").unwrap().epoch, 1);
    gate.write(&issuer.token("orders", 2), "orders", "k", "v2")
        .await
        .unwrap();
    let result = sqlite::admit(
        &tx,
        &issuer.verifier(),
        &issuer.token("orders", 1),
        "orders",
    );
    assert!(matches!(result, Err(AdmitError::Conflict)), "{result:?}");
}

/// A database written by one service can require its principal: a genuine token of
/// another principal is refused before anything is written.
#[test]
fn a_token_of_another_principal_is_refused_when_the_holder_is_required() {
    use palisade_adapters::Trust;
    use palisade_token::{KeyRing, Signer};

    let signer = Signer::generate();
    let mut ring = KeyRing::new();
    ring.insert(signer.public_key());
    let verifier = Verifier::new(ring, 16);
    let dir = tempfile::tempdir().unwrap();
    let mut conn = Connection::open(dir.path().join("db.sqlite")).unwrap();
    sqlite::migrate(&conn).unwrap();
    conn.execute_batch("CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        .unwrap();
    let billing = Trust::new(&verifier).held_by("billing");

    let theirs = signer.issue("orders", 5, "reports/job-1");
    let tx = sqlite::begin(&mut conn).unwrap();
    let refused = sqlite::admit(&tx, billing, &theirs, "orders");
    assert!(
        matches!(refused, Err(AdmitError::NotHolder { .. })),
        "{refused:?}"
    );
    drop(tx);
    assert_eq!(sqlite::high_water(&conn, "orders").unwrap().epoch, 0);

    let ours = signer.issue("orders", 1, "billing/worker-1");
    let tx = sqlite::begin(&mut conn).unwrap();
    sqlite::admit(&tx, billing, &ours, "orders").unwrap();
    tx.execute("INSERT INTO kv VALUES ('k', 'v')", []).unwrap();
    tx.commit().unwrap();
    assert_eq!(sqlite::high_water(&conn, "orders").unwrap().epoch, 1);
}

/// The restore drill (S11) with a file copy: the database copied while epoch 1 held the
/// mark and put back after epoch 2 had fenced it out admits epoch 1 again; `raise_marks`
/// with the issuer's bound shuts it out, and epoch 2 still writes.
#[tokio::test]
async fn a_restored_file_admits_a_fenced_out_token_until_its_marks_are_raised() {
    let issuer = &Issuer::new();
    let gate = SqliteGate::new(issuer);
    gate.write(&issuer.token(support::LOCK, 1), support::LOCK, "k", "one")
        .await
        .unwrap();
    let copy = gate._dir.path().join("app.db.backup");
    std::fs::copy(&gate.path, &copy).unwrap();
    gate.write(&issuer.token(support::LOCK, 2), support::LOCK, "k", "two")
        .await
        .unwrap();
    std::fs::copy(&copy, &gate.path).unwrap();
    assert_eq!(gate.read("k").await.as_deref(), Some("one"));
    support::suite::restored_until_raised(&gate, issuer).await;
}
