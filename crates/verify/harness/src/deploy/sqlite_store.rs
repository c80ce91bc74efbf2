//! [`SqliteStore`]: the `sqlite-gate` target's store, one SQLite file written through the
//! Rust gate (`palisade_adapters::sqlite`) exactly as `docs/protecting-your-database.md`
//! tells users to; and [`run_app`], the process that holds the file.
//!
//! SQLite is a library, not a server: "the database crashed" means the process writing
//! the file died. So the application runs as a process of its own (the hidden `palisade
//! verify-sqlite-app`, started by [`super::app_process`]), serving the store routes
//! ([`GateStore`]) over its file, and the database faults reach it: `db-kill` SIGKILLs it in
//! the middle of whatever transaction it was in and starts it again on the same file,
//! `db-pause` SIGSTOPs it with the file's write lock held.
//!
//! Each write is one `BEGIN IMMEDIATE` transaction: `admit` (the token verified with the
//! issuer's keys, the lock's mark compared and raised in `palisade_fence`), then the
//! write to `verify_kv` with the next revision of `verify_revision`, then `COMMIT`. A
//! refused admit rolls everything back. The file is in WAL mode with `synchronous = FULL`:
//! a commit is acknowledged once its log frames are fsynced. (`--synchronous off`, the
//! negative control of `db-power-loss`, never fsyncs: a power loss takes every commit
//! since the file was made.) One connection serves the
//! process (SQLite has one writer per file anyway); its calls run on tokio's blocking
//! pool, one at a time.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use clap::Args;
use palisade_adapters::sqlite;
use palisade_api::wire::{FenceAnswer, WriteAnswer};
use palisade_client::{Client, IssuerKeys};
use palisade_token::Verifier;
use rusqlite::{params, Connection, OptionalExtension};

use super::gate_store::{
    failed_read, signed, unsigned, Entry, GateStore, GatedDb, Mutation, StoreError, DEADLINE,
};
use crate::VerifyError;

/// `PRAGMA synchronous` of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Synchronous {
    /// A commit is durable when acknowledged (its log frames fsynced).
    Full,
    /// Nothing is ever fsynced (the negative control of `db-power-loss`).
    Off,
}

impl Synchronous {
    /// The settings every start applies, as the report says them.
    pub fn settings(self) -> &'static str {
        match self {
            Synchronous::Full => "journal_mode=WAL, synchronous=FULL",
            Synchronous::Off => "journal_mode=WAL, synchronous=OFF",
        }
    }

    /// The value of `PRAGMA synchronous`.
    pub fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Off => "OFF",
        }
    }
}

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS verify_kv (
        lock TEXT NOT NULL,
        key TEXT NOT NULL,
        value BLOB NOT NULL,
        revision INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        PRIMARY KEY (lock, key)
    );
    CREATE TABLE IF NOT EXISTS verify_revision (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        last INTEGER NOT NULL
    );
    INSERT OR IGNORE INTO verify_revision (id, last) VALUES (1, 0);
";
const UPSERT: &str = "INSERT INTO verify_kv (lock, key, value, revision, epoch) \
     VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (lock, key) DO UPDATE \
     SET value = excluded.value, revision = excluded.revision, epoch = excluded.epoch";
const DELETE: &str = "DELETE FROM verify_kv WHERE lock = ?1 AND key = ?2";
const NEXT_REVISION: &str =
    "UPDATE verify_revision SET last = last + 1 WHERE id = 1 RETURNING last";
const READ: &str = "SELECT value, revision, epoch FROM verify_kv WHERE lock = ?1 AND key = ?2";
const LIST: &str = "SELECT key FROM verify_kv WHERE lock = ?1 AND substr(key, 1, length(?2)) = ?2 \
     ORDER BY key";

/// Tokens whose verification the application's verifier caches.
const VERIFIER_CACHE: usize = 1024;

/// Flags of the hidden `palisade verify-sqlite-app` (started by `palisade verify --target
/// sqlite-gate`).
#[derive(Debug, Clone, Args)]
pub struct SqliteAppArgs {
    /// The SQLite file (created, with its tables, if missing).
    #[arg(long)]
    pub file: PathBuf,
    /// Where to serve the store routes.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The Palisade server whose keys verify the tokens (`GET /v1/keys`).
    #[arg(long)]
    pub lock_url: String,
    /// `PRAGMA synchronous` of the file.
    #[arg(long, value_enum, default_value_t = Synchronous::Full)]
    pub synchronous: Synchronous,
}

/// The process holding the file: opens it, fetches the issuer's keys, serves the store
/// routes on `--listen` until it is killed.
pub async fn run_app(args: SqliteAppArgs) -> Result<(), VerifyError> {
    let client = Client::new(&args.lock_url)
        .map_err(|e| VerifyError::Deploy(format!("cannot make a client: {e}")))?;
    let keys = IssuerKeys::fetch(client, VERIFIER_CACHE)
        .await
        .map_err(|e| VerifyError::Deploy(format!("cannot fetch the issuer's keys: {e}")))?;
    let store = SqliteStore::open(&args.file, keys.verifier(), args.synchronous)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| VerifyError::io(format!("cannot listen on {}", args.listen), e))?;
    GateStore::serve(listener, Arc::new(store)).await;
    Ok(())
}

/// The gate's store in one SQLite file.
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    verifier: Arc<Verifier>,
}

impl SqliteStore {
    /// Opens `path` with [`Synchronous::settings`] and installs the gate's table and the
    /// store's.
    pub fn open(
        path: &Path,
        verifier: Arc<Verifier>,
        synchronous: Synchronous,
    ) -> Result<SqliteStore, VerifyError> {
        let deploy = |what: &str, e: rusqlite::Error| {
            VerifyError::Deploy(format!("{what} {}: {e}", path.display()))
        };
        let conn = Connection::open(path).map_err(|e| deploy("cannot open", e))?;
        conn.busy_timeout(DEADLINE)
            .and_then(|()| conn.pragma_update(None, "journal_mode", "WAL"))
            .and_then(|()| conn.pragma_update(None, "synchronous", synchronous.pragma()))
            .and_then(|()| conn.execute_batch(SCHEMA))
            .map_err(|e| deploy("cannot set up", e))?;
        sqlite::migrate(&conn)
            .map_err(|e| VerifyError::Deploy(format!("cannot install the gate's table: {e}")))?;
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            verifier,
        })
    }

    /// Runs `op` on the connection, on the blocking pool.
    async fn with_conn<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Connection, &Verifier) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (conn, verifier) = (self.conn.clone(), self.verifier.clone());
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
            op(&mut conn, &verifier)
        })
        .await
        .map_err(|e| StoreError::Failed(format!("the SQLite call did not finish: {e}")))?
    }
}

/// What a request writes after its admit.
enum Write {
    Put(String, Bytes),
    Delete(String),
    /// Nothing: the barrier, which only raises the mark.
    Barrier,
}

/// One transaction: `admit`, then `write`, then `COMMIT`. The admitted epoch, and the
/// revision of the write (none for the barrier). On any error the transaction is dropped
/// uncommitted, which rolls it back (SQLite needs that after a refused admit).
fn transact(
    conn: &mut Connection,
    verifier: &Verifier,
    lock: &str,
    token: &str,
    write: Write,
) -> Result<(u64, Option<u64>), StoreError> {
    let tx = sqlite::begin(conn)?;
    let epoch = sqlite::admit(&tx, verifier, token, lock)?.epoch();
    let revision = match write {
        Write::Barrier => None,
        Write::Put(key, value) => {
            let revision = next_revision(&tx)?;
            tx.execute(
                UPSERT,
                params![lock, key, &value[..], revision, signed(epoch)?],
            )
            .map_err(failed)?;
            Some(revision)
        }
        Write::Delete(key) => {
            let revision = next_revision(&tx)?;
            if tx.execute(DELETE, params![lock, key]).map_err(failed)? == 0 {
                // A missing key: nothing is committed, the mark included.
                return Err(StoreError::NotFound);
            }
            Some(revision)
        }
    };
    tx.commit().map_err(failed)?;
    Ok((epoch, revision.map(unsigned).transpose()?))
}

fn next_revision(tx: &rusqlite::Transaction<'_>) -> Result<i64, StoreError> {
    tx.query_row(NEXT_REVISION, [], |row| row.get(0))
        .map_err(failed)
}

#[async_trait]
impl GatedDb for SqliteStore {
    async fn mutate(&self, m: Mutation<'_>) -> Result<WriteAnswer, StoreError> {
        let write = match m.value {
            Some(value) => Write::Put(m.key.to_owned(), value),
            None => Write::Delete(m.key.to_owned()),
        };
        let (lock, token) = (m.lock.to_owned(), m.token.to_owned());
        let (epoch, revision) = self
            .with_conn(move |conn, verifier| transact(conn, verifier, &lock, &token, write))
            .await?;
        Ok(WriteAnswer {
            revision: revision.unwrap_or_default(),
            epoch,
        })
    }

    async fn fence(&self, lock: &str, token: &str) -> Result<FenceAnswer, StoreError> {
        let (owned_lock, token) = (lock.to_owned(), token.to_owned());
        let (epoch, _) = self
            .with_conn(move |conn, verifier| {
                transact(conn, verifier, &owned_lock, &token, Write::Barrier)
            })
            .await?;
        // Admitted: the mark is now this epoch.
        Ok(FenceAnswer {
            lock: lock.to_owned(),
            high_water: epoch,
            epoch,
        })
    }

    async fn read(&self, lock: &str, key: &str) -> Result<Option<Entry>, StoreError> {
        let (lock, key) = (lock.to_owned(), key.to_owned());
        let row = self
            .with_conn(move |conn, _| {
                conn.query_row(READ, params![lock, key], |row| {
                    Ok((row.get::<_, Vec<u8>>(0)?, row.get(1)?, row.get(2)?))
                })
                .optional()
                .map_err(failed)
            })
            .await?;
        row.map(|(value, revision, epoch)| {
            Ok(Entry {
                value: Bytes::from(value),
                revision: unsigned(revision)?,
                epoch: unsigned(epoch)?,
            })
        })
        .transpose()
    }

    async fn list(&self, lock: &str, prefix: &str) -> Result<Vec<String>, StoreError> {
        let (lock, prefix) = (lock.to_owned(), prefix.to_owned());
        self.with_conn(move |conn, _| {
            let mut statement = conn.prepare_cached(LIST).map_err(failed)?;
            let keys = statement
                .query_map(params![lock, prefix], |row| row.get(0))
                .and_then(|rows| rows.collect::<Result<Vec<String>, _>>())
                .map_err(failed)?;
            Ok(keys)
        })
        .await
    }

    async fn high_water(&self, lock: &str) -> Result<u64, StoreError> {
        let lock = lock.to_owned();
        self.with_conn(move |conn, _| {
            let mark = sqlite::high_water(conn, &lock).map_err(failed_read)?;
            Ok(mark.epoch)
        })
        .await
    }
}

fn failed(e: rusqlite::Error) -> StoreError {
    StoreError::Failed(format!("SQLite: {e}"))
}
