//! A SQLite database protected by the Rust gate, for the tests that write through a gate
//! beside a real server: the fence table and a `kv` table, and one fenced write.

use std::path::{Path, PathBuf};

use palisade_adapters::{sqlite, AdmitError, Trust};

/// `app.db` in `dir`, with the gate's fence table and `kv (key, value)`.
pub fn database(dir: &Path) -> PathBuf {
    let db = dir.join("app.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    sqlite::migrate(&conn).unwrap();
    conn.execute_batch("CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        .unwrap();
    db
}

/// One fenced write of lock `L`'s data: admit `token` for `L`, then set `k` to `value`.
pub fn write<'t>(
    db: &Path,
    trust: impl Into<Trust<'t>>,
    token: &str,
    value: &str,
) -> Result<(), AdmitError> {
    let mut conn = rusqlite::Connection::open(db).unwrap();
    let tx = sqlite::begin(&mut conn)?;
    sqlite::admit(&tx, trust, token, "L")?;
    tx.execute(
        "INSERT INTO kv (key, value) VALUES ('k', ?1) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        [value],
    )
    .unwrap();
    tx.commit().unwrap();
    Ok(())
}
