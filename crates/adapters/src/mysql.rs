//! The gate inside a MySQL or MariaDB transaction (feature `mysql`, mysql_async), on
//! InnoDB.
//!
//! ```no_run
//! # async fn example(conn: &mut mysql_async::Conn, verifier: &palisade_token::Verifier, token: &str)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use mysql_async::prelude::Queryable;
//! use palisade_adapters::mysql;
//!
//! mysql::migrate(conn).await?; // at deploy time: checks the settings, creates the table
//! mysql::preflight(conn).await?; // at every start of the application
//!
//! let mut tx = conn.start_transaction(mysql_async::TxOpts::default()).await?;
//! if let Err(refused) = mysql::admit(&mut tx, verifier, token, "orders").await {
//!     tx.rollback().await?; // at once: see "A refusal must be rolled back"
//!     return Err(refused.into());
//! }
//! tx.exec_drop("UPDATE orders SET state = 'shipped' WHERE id = ?", (42,)).await?;
//! tx.commit().await?; // the mark and the update commit together (S6)
//! # Ok(()) }
//! ```
//!
//! ## How it serialises
//! [`admit`] locks the lock's row of `palisade_fence` with `SELECT ... FOR UPDATE` (a
//! locking read: it sees the newest committed mark whatever the isolation level), creating
//! the row first if the database has never seen the lock. A second transaction admitting
//! for the same lock waits on that row lock until the first commits or rolls back. Admits
//! for different locks do not wait on each other. A deadlock or a lock wait timeout is
//! [`AdmitError::Conflict`]: roll back and retry.
//!
//! ## A refusal must be rolled back
//! MySQL has no way for the gate to make a transaction uncommittable (PostgreSQL's gate
//! does). After an error from [`admit`], roll back with `tx.rollback().await`: writes made
//! before the admit commit if the caller commits anyway. Roll back explicitly rather than
//! drop the `Transaction`: mysql_async rolls a dropped one back only when its connection
//! is next used, and until then the lock's row stays locked (every other admit of that
//! lock waits for it).
//!
//! ## What it does not do
//! - In-database enforcement of ungated writes (PostgreSQL's `protect`): not offered here.
//! - Galera or group replication: the preflight checks one server's settings; a cluster's
//!   own durability and failover rules are the operator's.

use mysql_async::prelude::Queryable;
use palisade_core::gate::HighWater;

use crate::admission::{from_sql_mark, to_sql_int, Admitted, Ask, Trust};
use crate::error::AdmitError;
use crate::report::ResourceKind;

/// The SQL that creates the fence table; [`migrate`] runs it. Idempotent.
pub const MIGRATION: &str = include_str!("../migrations/mysql.sql");

const SELECT_MARK: &str = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = ?";
const LOCK_MARK: &str = "SELECT epoch, seq FROM palisade_fence WHERE lock_name = ? FOR UPDATE";
// Not INSERT IGNORE: that would also swallow a refused lock name (the CHECK).
const CREATE_MARK: &str = "INSERT INTO palisade_fence (lock_name, epoch, seq) VALUES (?, 0, 0) \
     ON DUPLICATE KEY UPDATE lock_name = lock_name";
const STORE_MARK: &str = "UPDATE palisade_fence SET epoch = ?, seq = ?, \
     updated_at = CURRENT_TIMESTAMP(6) WHERE lock_name = ?";
/// Raises a mark to at least the given epoch (creating the row if the database lost it);
/// never lowers.
const RAISE_MARK: &str = "INSERT INTO palisade_fence (lock_name, epoch, seq) VALUES (?, ?, 0) \
     ON DUPLICATE KEY UPDATE seq = IF(VALUES(epoch) > epoch, 0, seq), \
     epoch = GREATEST(epoch, VALUES(epoch))";
const SETTINGS: &str = "SELECT CAST(@@innodb_flush_log_at_trx_commit AS CHAR), \
     CAST(@@sync_binlog AS CHAR), CAST(@@log_bin AS CHAR)";

/// Checks that the server can keep a mark durable ([`crate::preflight::mysql`]:
/// `innodb_flush_log_at_trx_commit = 1`, and `sync_binlog = 1` when the binary log is on);
/// refuses with [`AdmitError::UnsafeDatabase`] naming every setting that breaks it. Run it
/// when the application starts; [`migrate`] runs it too.
pub async fn preflight(conn: &mut impl Queryable) -> Result<(), AdmitError> {
    let row: Option<(String, String, String)> =
        conn.query_first(SETTINGS).await.map_err(mysql_error)?;
    let (flush, sync_binlog, log_bin) =
        row.ok_or_else(|| AdmitError::backend("the server answered no row to the settings query"))?;
    crate::preflight::mysql(&flush, &sync_binlog, &log_bin)?;
    Ok(())
}

/// Checks the server's settings ([`preflight`]), then creates the fence table if it does
/// not exist. Run it once at deploy time.
pub async fn migrate(conn: &mut impl Queryable) -> Result<(), AdmitError> {
    preflight(conn).await?;
    migrate_unchecked(conn).await
}

/// [`migrate`] without the settings check: for a server whose durability is ensured some
/// other way, and for tests on a throwaway server.
pub async fn migrate_unchecked(conn: &mut impl Queryable) -> Result<(), AdmitError> {
    conn.query_drop(MIGRATION).await.map_err(mysql_error)
}

/// Admits `token` for `lock` inside `tx` under the epoch policy: equal or larger epochs
/// pass and raise the mark, smaller ones are refused with [`AdmitError::Stale`].
///
/// On `Ok`, the advanced mark is part of `tx` and commits or rolls back with the caller's
/// writes. On `Err`, roll `tx` back (see the module docs).
pub async fn admit<'t>(
    tx: &mut mysql_async::Transaction<'_>,
    trust: impl Into<Trust<'t>>,
    token: &str,
    lock: &str,
) -> Result<Admitted, AdmitError> {
    admit_with(tx, trust.into(), Ask::epoch(token, lock)).await
}

/// Like [`admit`], under the sequence policy: (epoch, `seq`) must strictly exceed the mark.
/// Use one policy per lock: an epoch-policy admit resets the stored sequence to 0.
pub async fn admit_sequenced<'t>(
    tx: &mut mysql_async::Transaction<'_>,
    trust: impl Into<Trust<'t>>,
    token: &str,
    lock: &str,
    seq: u64,
) -> Result<Admitted, AdmitError> {
    admit_with(tx, trust.into(), Ask::sequenced(token, lock, seq)).await
}

/// The lock's committed mark as this connection sees it, or `HighWater::default()` if the
/// server has never admitted the lock. For inspection only: deciding on it outside the
/// transaction that writes would re-open the check-then-write race (S6).
pub async fn high_water(conn: &mut impl Queryable, lock: &str) -> Result<HighWater, AdmitError> {
    let row: Option<(i64, i64)> = conn
        .exec_first(SELECT_MARK, (lock,))
        .await
        .map_err(mysql_error)?;
    row.map_or(Ok(HighWater::default()), |(epoch, seq)| {
        from_sql_mark(epoch, seq)
    })
}

/// After the database was restored from a backup: raises each `(lock, epoch)` mark to at
/// least `epoch`, creating the rows the backup did not have, in one transaction (all or
/// none). Never lowers a mark. Returns how many marks went up. It does not check the
/// settings first: raising the marks of a server restored with unsafe settings is still
/// better than leaving them low.
pub async fn raise_marks(
    conn: &mut mysql_async::Conn,
    marks: &[(String, u64)],
) -> Result<usize, AdmitError> {
    migrate_unchecked(conn).await?;
    let mut tx = conn
        .start_transaction(mysql_async::TxOpts::default())
        .await
        .map_err(mysql_error)?;
    let mut raised = 0;
    for (lock, epoch) in marks {
        let before = high_water_locked(&mut tx, lock).await?;
        let epoch_sql = to_sql_int(*epoch, "epoch")?;
        tx.exec_drop(RAISE_MARK, (lock, epoch_sql))
            .await
            .map_err(mysql_error)?;
        raised += usize::from(before.is_none_or(|b| b.epoch < *epoch));
    }
    tx.commit().await.map_err(mysql_error)?;
    Ok(raised)
}

async fn high_water_locked(
    tx: &mut mysql_async::Transaction<'_>,
    lock: &str,
) -> Result<Option<HighWater>, AdmitError> {
    let row: Option<(i64, i64)> = tx
        .exec_first(LOCK_MARK, (lock,))
        .await
        .map_err(mysql_error)?;
    row.map(|(epoch, seq)| from_sql_mark(epoch, seq))
        .transpose()
}

async fn admit_with(
    tx: &mut mysql_async::Transaction<'_>,
    trust: Trust<'_>,
    ask: Ask<'_>,
) -> Result<Admitted, AdmitError> {
    let result = async {
        let claims = trust.verify_for_lock(ask.token, ask.lock)?;
        let current = match high_water_locked(tx, ask.lock).await? {
            Some(mark) => mark,
            None => {
                tx.exec_drop(CREATE_MARK, (ask.lock,))
                    .await
                    .map_err(mysql_error)?;
                high_water_locked(tx, ask.lock)
                    .await?
                    .ok_or_else(|| AdmitError::backend("the fence row vanished after its insert"))?
            }
        };
        let (admitted, epoch, seq) = ask.decide(&claims, current)?;
        tx.exec_drop(STORE_MARK, (epoch, seq, ask.lock))
            .await
            .map_err(mysql_error)?;
        Ok(admitted)
    }
    .await;
    trust.record(ResourceKind::Mysql, ask.lock, &result);
    result
}

/// Lost races (a deadlock, a lock wait timeout) become [`AdmitError::Conflict`] (retry);
/// everything else is a backend error.
fn mysql_error(e: mysql_async::Error) -> AdmitError {
    // ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT.
    const RETRY: [u16; 2] = [1213, 1205];
    match &e {
        mysql_async::Error::Server(server) if RETRY.contains(&server.code) => AdmitError::Conflict,
        _ => AdmitError::backend(e),
    }
}
