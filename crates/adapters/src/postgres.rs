//! The gate inside a PostgreSQL transaction (feature `postgres`, tokio-postgres).
//!
//! ```no_run
//! # async fn example(client: &mut tokio_postgres::Client, verifier: &palisade_token::Verifier, token: &str)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use palisade_adapters::postgres;
//!
//! postgres::migrate(&*client).await?; // at deploy time: checks the settings, creates the table
//! postgres::preflight(&*client).await?; // at every start of the application
//!
//! let tx = client.transaction().await?;
//! // On Err, `tx` is dropped here, which rolls back: nothing of this request commits.
//! postgres::admit(&tx, verifier, token, "orders").await?;
//! tx.execute("UPDATE orders SET state = 'shipped' WHERE id = $1", &[&42_i64]).await?;
//! tx.commit().await?; // the mark and the update commit together (S6)
//! # Ok(()) }
//! ```
//!
//! ## How it serialises
//! [`admit`] locks the lock's row of `palisade_fence` with `SELECT ... FOR UPDATE`
//! (creating it first with `INSERT ... ON CONFLICT DO NOTHING` if the database has never
//! seen the lock). A second transaction admitting for the same lock waits on that row lock
//! until the first commits or rolls back, and then reads the mark the first left behind.
//! Admits for different locks do not wait on each other.
//!
//! Under `READ COMMITTED` (PostgreSQL's default) that wait is all that happens. Under
//! `REPEATABLE READ` or `SERIALIZABLE`, PostgreSQL refuses to lock a row changed after the
//! snapshot was taken; that surfaces as [`AdmitError::Conflict`]: roll back and retry.
//!
//! ## A refusal poisons the transaction
//! When [`admit`] returns an error it has also raised an error inside the transaction, so
//! PostgreSQL marks it aborted: every later statement fails and `COMMIT` turns into a
//! rollback. Writes the caller made *before* calling `admit` can therefore never commit
//! alongside a refused token, even if the caller ignores the error. Roll back (or drop the
//! transaction) and start again. If the caller needs to record the refusal in the same
//! database, it does so in a new transaction.

use palisade_core::gate::HighWater;
use tokio_postgres::error::SqlState;
use tokio_postgres::{GenericClient, Transaction};

use crate::admission::{from_sql_mark, to_sql_int, Admitted, Ask, Trust};
use crate::error::AdmitError;
use crate::report::ResourceKind;

/// The SQL that creates the fence table; [`migrate`] runs it. Idempotent.
pub const MIGRATION: &str = include_str!("../migrations/postgres.sql");

/// The SQL of in-database enforcement (functions and the fence table's trigger);
/// [`protect`] runs it. Idempotent.
pub const PROTECTION: &str = include_str!("../migrations/postgres-protect.sql");

const SELECT_MARK: &str = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = $1";
const LOCK_MARK: &str = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = $1 FOR UPDATE";
const CREATE_MARK: &str = "INSERT INTO palisade_fence (lock_name, epoch, seq) VALUES ($1, 0, 0) \
     ON CONFLICT (lock_name) DO NOTHING";
const STORE_MARK: &str =
    "UPDATE palisade_fence SET epoch = $2, seq = $3, updated_at = now() WHERE lock_name = $1";
/// Raises a mark to at least `$2` (creating the row if the database lost it); never lowers.
const RAISE_MARK: &str = "INSERT INTO palisade_fence (lock_name, epoch, seq) VALUES ($1, $2, 0) \
     ON CONFLICT (lock_name) DO UPDATE SET epoch = EXCLUDED.epoch, seq = 0, updated_at = now() \
     WHERE palisade_fence.epoch < EXCLUDED.epoch";
/// Raising an error is how a refusal is made final: PostgreSQL will not commit a
/// transaction that saw one.
const POISON: &str =
    "DO $$ BEGIN RAISE EXCEPTION 'palisade: fenced operation refused; roll back'; END $$";

/// Checks that the database can keep a mark durable ([`crate::preflight::postgres`]:
/// `fsync`, `synchronous_commit`, `full_page_writes`, and synchronous standbys when
/// streaming replicas are connected): [`AdmitError::UnsafeDatabase`] names every setting
/// that breaks it. Run it when the application starts; [`migrate`] runs it too.
pub async fn preflight(client: &impl GenericClient) -> Result<(), AdmitError> {
    let row = client
        .query_one(crate::preflight::POSTGRES_SETTINGS, &[])
        .await
        .map_err(pg_error)?;
    let text = |i: usize| row.try_get::<_, String>(i).map_err(AdmitError::backend);
    let settings = crate::preflight::PostgresSettings {
        fsync: text(0)?,
        synchronous_commit: text(1)?,
        full_page_writes: text(2)?,
        synchronous_standby_names: text(3)?,
        replicas: row.try_get(4).map_err(AdmitError::backend)?,
    };
    Ok(crate::preflight::postgres(&settings)?)
}

/// Checks the database's settings ([`preflight`]), then creates the fence table if it
/// does not exist. Run it once when deploying, not concurrently from many processes
/// (concurrent `CREATE TABLE IF NOT EXISTS` can fail).
pub async fn migrate(client: &impl GenericClient) -> Result<(), AdmitError> {
    preflight(client).await?;
    migrate_unchecked(client).await
}

/// [`migrate`] without the settings check: for a database whose durability is ensured
/// some other way, and for tests on a throwaway database.
pub async fn migrate_unchecked(client: &impl GenericClient) -> Result<(), AdmitError> {
    client.batch_execute(MIGRATION).await.map_err(pg_error)
}

/// Admits `token` for `lock` inside `tx` under the epoch policy: equal or larger epochs
/// pass and raise the mark, smaller ones are refused with [`AdmitError::Stale`].
///
/// On `Ok`, the advanced mark is part of `tx` and commits or rolls back with the caller's
/// writes. On `Err`, `tx` is aborted (see the module doc) and must be rolled back.
pub async fn admit<'t>(
    tx: &Transaction<'_>,
    trust: impl Into<Trust<'t>>,
    token: &str,
    lock: &str,
) -> Result<Admitted, AdmitError> {
    admit_with(tx, trust.into(), Ask::epoch(token, lock)).await
}

/// Like [`admit`], under the sequence policy: (epoch, `seq`) must strictly exceed the
/// mark, so a delayed or replayed operation of the current holder is refused too. Use one
/// policy per lock: an epoch-policy admit resets the stored sequence to 0.
pub async fn admit_sequenced<'t>(
    tx: &Transaction<'_>,
    trust: impl Into<Trust<'t>>,
    token: &str,
    lock: &str,
    seq: u64,
) -> Result<Admitted, AdmitError> {
    admit_with(tx, trust.into(), Ask::sequenced(token, lock, seq)).await
}

/// Protects `table` with `lock`: from now on PostgreSQL itself refuses every INSERT,
/// UPDATE, DELETE and TRUNCATE on it unless a gate (of any language) admitted a token for
/// `lock` earlier in the same transaction, naming the lock in its error; an admit is never
/// reused by a later transaction. Installs the fence table (with the settings check of
/// [`migrate`]) and [`PROTECTION`] first. Not access control: a role allowed to UPDATE
/// `palisade_fence` can note a lock without a token (`docs/protecting-your-database.md`).
pub async fn protect(
    client: &impl GenericClient,
    table: &str,
    lock: &str,
) -> Result<(), AdmitError> {
    palisade_token::validate_lock_name(lock)
        .map_err(|e| AdmitError::backend(format!("cannot protect {table}: {e}")))?;
    migrate(client).await?;
    client.batch_execute(PROTECTION).await.map_err(pg_error)?;
    client
        .execute(
            "SELECT palisade_protect($1::text::regclass, $2)",
            &[&table, &lock],
        )
        .await
        .map_err(pg_error)?;
    Ok(())
}

/// Removes `table`'s protection ([`protect`]): its writes are no longer checked.
pub async fn unprotect(client: &impl GenericClient, table: &str) -> Result<(), AdmitError> {
    client.batch_execute(PROTECTION).await.map_err(pg_error)?;
    client
        .execute("SELECT palisade_unprotect($1::text::regclass)", &[&table])
        .await
        .map_err(pg_error)?;
    Ok(())
}

/// After the database was restored from a backup (its marks are older than what it had
/// admitted): raises each `(lock, epoch)` mark to at least `epoch`, creating the rows the
/// backup did not have, in one transaction (all or none). Never lowers a mark. Returns how
/// many marks went up. `palisade admin raise-marks` calls it with the issuer's bound of
/// every lock (see `docs/protecting-your-database.md`). It does not check the settings
/// first: raising the marks of a database restored with unsafe settings is still better
/// than leaving them low.
pub async fn raise_marks(
    client: &mut tokio_postgres::Client,
    marks: &[(String, u64)],
) -> Result<usize, AdmitError> {
    migrate_unchecked(&*client).await?;
    let tx = client.transaction().await.map_err(pg_error)?;
    let statement = tx.prepare(RAISE_MARK).await.map_err(pg_error)?;
    let mut raised = 0;
    for (lock, epoch) in marks {
        let epoch = to_sql_int(*epoch, "epoch")?;
        raised += tx
            .execute(&statement, &[lock, &epoch])
            .await
            .map_err(pg_error)?;
    }
    tx.commit().await.map_err(pg_error)?;
    Ok(usize::try_from(raised).unwrap_or(usize::MAX))
}

/// The lock's committed mark as this client sees it, or `HighWater::default()` if the
/// database has never admitted the lock. For inspection only: deciding on it outside the
/// transaction that writes would re-open the check-then-write race (S6).
pub async fn high_water(client: &impl GenericClient, lock: &str) -> Result<HighWater, AdmitError> {
    match client
        .query_opt(SELECT_MARK, &[&lock])
        .await
        .map_err(pg_error)?
    {
        Some(row) => mark_of(&row),
        None => Ok(HighWater::default()),
    }
}

async fn admit_with(
    tx: &Transaction<'_>,
    trust: Trust<'_>,
    ask: Ask<'_>,
) -> Result<Admitted, AdmitError> {
    let result = admit_unpoisoned(tx, trust, ask).await;
    trust.record(ResourceKind::Postgres, ask.lock, &result);
    if result.is_err() {
        // The POISON statement is expected to fail; that failure is the point. If the
        // connection itself is gone, the transaction cannot commit anyway.
        let _aborted = tx.batch_execute(POISON).await;
    }
    result
}

async fn admit_unpoisoned(
    tx: &Transaction<'_>,
    trust: Trust<'_>,
    ask: Ask<'_>,
) -> Result<Admitted, AdmitError> {
    let claims = trust.verify_for_lock(ask.token, ask.lock)?;
    let current = lock_mark(tx, ask.lock).await?;
    let (admitted, epoch, seq) = ask.decide(&claims, current)?;
    tx.execute(STORE_MARK, &[&ask.lock, &epoch, &seq])
        .await
        .map_err(pg_error)?;
    Ok(admitted)
}

/// Reads the lock's mark holding its row lock until `tx` ends, creating the row first if
/// needed. The common case (row exists) is one statement.
async fn lock_mark(tx: &Transaction<'_>, lock: &str) -> Result<HighWater, AdmitError> {
    if let Some(row) = tx.query_opt(LOCK_MARK, &[&lock]).await.map_err(pg_error)? {
        return mark_of(&row);
    }
    tx.execute(CREATE_MARK, &[&lock]).await.map_err(pg_error)?;
    let row = tx.query_one(LOCK_MARK, &[&lock]).await.map_err(pg_error)?;
    mark_of(&row)
}

/// `try_get`, not `get`: a fence table altered by hand is an error, not a panic.
fn mark_of(row: &tokio_postgres::Row) -> Result<HighWater, AdmitError> {
    let epoch = row.try_get(0).map_err(AdmitError::backend)?;
    let seq = row.try_get(1).map_err(AdmitError::backend)?;
    from_sql_mark(epoch, seq)
}

/// Lost races become [`AdmitError::Conflict`] (retry); everything else is a backend error.
fn pg_error(e: tokio_postgres::Error) -> AdmitError {
    let retry = [
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::LOCK_NOT_AVAILABLE,
    ];
    match e.code() {
        Some(code) if retry.contains(code) => AdmitError::Conflict,
        _ => AdmitError::backend(e),
    }
}
