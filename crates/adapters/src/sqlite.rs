//! The gate inside a SQLite transaction (feature `sqlite`, rusqlite with bundled SQLite).
//!
//! ```
//! # fn example(verifier: &palisade_token::Verifier, token: &str) -> Result<(), Box<dyn std::error::Error>> {
//! use palisade_adapters::sqlite;
//!
//! let mut conn = rusqlite::Connection::open_in_memory()?;
//! sqlite::migrate(&conn)?;
//! conn.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT)")?;
//!
//! let tx = sqlite::begin(&mut conn)?; // BEGIN IMMEDIATE
//! // On Err, `tx` is dropped here, which rolls back: nothing of this request commits.
//! sqlite::admit(&tx, verifier, token, "orders")?;
//! tx.execute("INSERT INTO orders (id, state) VALUES (42, 'shipped')", [])?;
//! tx.commit()?; // the mark and the insert commit together (S6)
//! # Ok(()) }
//! # let signer = palisade_token::Signer::generate();
//! # let mut ring = palisade_token::KeyRing::new();
//! # ring.insert(signer.public_key());
//! # example(&palisade_token::Verifier::new(ring, 8), &signer.issue("orders", 1, "doc")).unwrap();
//! ```
//!
//! ## How it serialises
//! SQLite has one writer at a time per database file. [`begin`] opens the transaction
//! with `BEGIN IMMEDIATE`, which takes the write lock up front, so the mark [`admit`] reads
//! cannot change before the transaction ends. A transaction opened with the default
//! `BEGIN DEFERRED` is still safe: SQLite refuses to upgrade a reader whose snapshot went
//! stale, which surfaces as [`AdmitError::Conflict`] (roll back and retry). Set a busy
//! timeout on the connection so writers queue instead of failing at once.
//!
//! ## On a refusal, roll back
//! Unlike PostgreSQL, SQLite cannot mark a transaction as failed from inside it, so after
//! an `Err` the transaction is still open and writable. Roll it back (dropping it does);
//! committing it would commit the caller's own earlier writes without a valid admission.
//!
//! ## Durability
//! `COMMIT` is durable only under `PRAGMA synchronous = FULL` (the default in rollback-
//! journal mode; in WAL mode SQLite's default `NORMAL` can lose the last commits, mark
//! included, on power loss).

use palisade_core::gate::HighWater;
use rusqlite::{Connection, ErrorCode, OptionalExtension, Transaction, TransactionBehavior};

use crate::admission::{from_sql_mark, to_sql_int, Admitted, Ask, Trust};
use crate::error::AdmitError;
use crate::report::ResourceKind;

/// The SQL that creates the fence table; [`migrate`] runs it. Idempotent.
pub const MIGRATION: &str = include_str!("../migrations/sqlite.sql");

const SELECT_MARK: &str = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = ?1";
const STORE_MARK: &str = "INSERT INTO palisade_fence (lock_name, epoch, seq) VALUES (?1, ?2, ?3) \
     ON CONFLICT (lock_name) DO UPDATE SET epoch = excluded.epoch, seq = excluded.seq, \
     updated_at = CAST(strftime('%s', 'now') AS INTEGER)";

/// Raises a mark to at least `?2` (creating the row if the database lost it); never lowers.
const RAISE_MARK: &str = "INSERT INTO palisade_fence (lock_name, epoch, seq) VALUES (?1, ?2, 0) \
     ON CONFLICT (lock_name) DO UPDATE SET epoch = excluded.epoch, seq = 0, \
     updated_at = CAST(strftime('%s', 'now') AS INTEGER) WHERE palisade_fence.epoch < excluded.epoch";

/// Creates the fence table if it does not exist.
pub fn migrate(conn: &Connection) -> Result<(), AdmitError> {
    conn.execute_batch(MIGRATION).map_err(sqlite_error)
}

/// Opens a `BEGIN IMMEDIATE` transaction: the write lock is taken now, so two admits for
/// any lock of this database run one after the other.
pub fn begin(conn: &mut Connection) -> Result<Transaction<'_>, AdmitError> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite_error)
}

/// Admits `token` for `lock` inside `tx` under the epoch policy: equal or larger epochs
/// pass and raise the mark, smaller ones are refused with [`AdmitError::Stale`].
///
/// On `Ok`, the advanced mark is part of `tx` and commits or rolls back with the caller's
/// writes. On `Err`, roll `tx` back.
pub fn admit<'t>(
    tx: &Transaction<'_>,
    trust: impl Into<Trust<'t>>,
    token: &str,
    lock: &str,
) -> Result<Admitted, AdmitError> {
    admit_with(tx, trust.into(), Ask::epoch(token, lock))
}

/// Like [`admit`], under the sequence policy: (epoch, `seq`) must strictly exceed the
/// mark. Use one policy per lock: an epoch-policy admit resets the stored sequence to 0.
pub fn admit_sequenced<'t>(
    tx: &Transaction<'_>,
    trust: impl Into<Trust<'t>>,
    token: &str,
    lock: &str,
    seq: u64,
) -> Result<Admitted, AdmitError> {
    admit_with(tx, trust.into(), Ask::sequenced(token, lock, seq))
}

/// After the database file was restored from a copy (its marks are older than what it had
/// admitted): raises each `(lock, epoch)` mark to at least `epoch`, creating the rows the
/// copy did not have, in one `BEGIN IMMEDIATE` transaction (all or none). Never lowers a
/// mark. Returns how many marks went up. `palisade admin raise-marks` calls it with the
/// issuer's bound of every lock.
pub fn raise_marks(conn: &mut Connection, marks: &[(String, u64)]) -> Result<usize, AdmitError> {
    migrate(conn)?;
    let tx = begin(conn)?;
    let mut raised = 0;
    {
        let mut statement = tx.prepare_cached(RAISE_MARK).map_err(sqlite_error)?;
        for (lock, epoch) in marks {
            let epoch = to_sql_int(*epoch, "epoch")?;
            raised += statement
                .execute(rusqlite::params![lock, epoch])
                .map_err(sqlite_error)?;
        }
    }
    tx.commit().map_err(sqlite_error)?;
    Ok(raised)
}

/// The lock's committed mark, or `HighWater::default()` if never admitted. For inspection
/// only: a decision made on it outside the writing transaction re-opens the race (S6).
pub fn high_water(conn: &Connection, lock: &str) -> Result<HighWater, AdmitError> {
    read_mark(conn, lock)
}

fn admit_with(
    tx: &Transaction<'_>,
    trust: Trust<'_>,
    ask: Ask<'_>,
) -> Result<Admitted, AdmitError> {
    let result = admit_unrecorded(tx, trust, ask);
    trust.record(ResourceKind::Sqlite, ask.lock, &result);
    result
}

fn admit_unrecorded(
    tx: &Transaction<'_>,
    trust: Trust<'_>,
    ask: Ask<'_>,
) -> Result<Admitted, AdmitError> {
    let claims = trust.verify_for_lock(ask.token, ask.lock)?;
    let current = read_mark(tx, ask.lock)?;
    let (admitted, epoch, seq) = ask.decide(&claims, current)?;
    tx.prepare_cached(STORE_MARK)
        .and_then(|mut stmt| stmt.execute(rusqlite::params![ask.lock, epoch, seq]))
        .map_err(sqlite_error)?;
    Ok(admitted)
}

fn read_mark(conn: &Connection, lock: &str) -> Result<HighWater, AdmitError> {
    let row = conn
        .prepare_cached(SELECT_MARK)
        .and_then(|mut stmt| {
            stmt.query_row([lock], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .map_err(sqlite_error)?;
    match row {
        Some((epoch, seq)) => from_sql_mark(epoch, seq),
        None => Ok(HighWater::default()),
    }
}

/// A busy or locked database is a lost race ([`AdmitError::Conflict`]); anything else is
/// a backend error.
fn sqlite_error(e: rusqlite::Error) -> AdmitError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => AdmitError::Conflict,
        _ => AdmitError::backend(e),
    }
}
