//! Opening the database file: create it fresh or open an existing one, never silently
//! adopt or initialise a file that holds something else.
//!
//! - A missing path is created (exclusively) and initialised, and its directory entry is
//!   fsync'd: without that, a power cut could lose the whole new file, and with it every
//!   epoch acknowledged since, so epochs would restart at 1.
//! - An existing path must be a redb file (an empty or truncated file, or garbage, is
//!   refused) holding either nothing yet or Palisade's tables at [`FORMAT_VERSION`].
//!   redb's own crash recovery runs here: it rolls back to the last committed transaction,
//!   which is the last one acknowledged. With [`RedbOptions::verify_on_open`] every page
//!   checksum is then verified too, so damage in the middle of the file is found now
//!   rather than served later.
//!
//! [`RedbOptions::verify_on_open`]: super::RedbOptions::verify_on_open

use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::path::Path;

use std::collections::BTreeMap;

use redb::{Builder, Database, Durability, ReadableTable, WriteTransaction};

use super::schema::{
    Fault, IdemRecord, EPOCHS, FENCES, FORMAT_VERSION, IDEMPOTENCY, IDEM_EXPIRY, KV, LEASES, META,
    META_FORMAT, RESERVATIONS, USAGE,
};
use crate::Usage;

/// Opens or creates the database file at `path`. Errors do not yet name the path; the
/// caller adds it.
pub(super) fn open_file(path: &Path, verify: bool, cache_bytes: usize) -> Result<Database, Fault> {
    let mut builder = Builder::new();
    builder.set_cache_size(cache_bytes);
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(file) => {
            let db = builder.create_file(file)?;
            sync_parent_dir(path)?;
            Ok(db)
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            let mut db = guarded("open", || builder.open(path))?.map_err(|e| match e {
                // redb reports a bad magic number or an empty file as bare InvalidData.
                redb::DatabaseError::Storage(redb::StorageError::Io(io))
                    if io.kind() == ErrorKind::InvalidData =>
                {
                    Fault("not a redb database file (or an empty or damaged one)".to_string())
                }
                other => Fault::from(other),
            })?;
            if verify {
                // Every commit uses two-phase commit, so a damaged tree cannot be "repaired"
                // by falling back to the previous commit: it is an error here. `Ok(false)`
                // only means redb rebuilt its page allocator state, which loses no data.
                if !guarded("verify", || db.check_integrity())?? {
                    tracing::warn!(path = %path.display(), "redb rebuilt its allocator state on open");
                }
            }
            Ok(db)
        }
        Err(e) => Err(Fault(format!("cannot create: {e}"))),
    }
}

/// redb asserts on some header fields it reads from the file (a truncated file trips
/// one), so a damaged file can panic inside `open`. Turn that into an error: nothing of the
/// half-opened database survives the unwind (its file handle and lock are dropped).
fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, Fault> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        let detail = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".to_string());
        Fault(format!(
            "damaged database file (redb failed to {what} it: {detail})"
        ))
    })
}

/// Creates Palisade's tables in an empty database, or checks the format of a populated one
/// and migrates an older layout (in the same durable transaction). `now_ms` (wall clock)
/// stamps idempotency records written before records had a time: their retention starts
/// at the migration.
pub(super) fn prepare(db: &Database, now_ms: u64) -> Result<(), Fault> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate);
    txn.set_two_phase_commit(true);
    let fresh = txn.list_tables()?.next().is_none();
    {
        let mut meta = txn.open_table(META)?;
        let stored = meta.get(META_FORMAT)?.map(|g| g.value());
        match stored {
            Some(FORMAT_VERSION) => {}
            None if fresh => {
                meta.insert(META_FORMAT, FORMAT_VERSION)?;
            }
            Some(1) => {
                drop(meta);
                migrate_from_v1(&txn, now_ms)?;
            }
            None => {
                return Err(Fault(
                    "a redb database, but not one written by Palisade (no format version)"
                        .to_string(),
                ))
            }
            Some(other) => {
                return Err(Fault(format!(
                "unsupported Palisade format version {other} (this build reads {FORMAT_VERSION})"
            )))
            }
        }
        txn.open_table(EPOCHS)?;
        txn.open_table(LEASES)?;
        txn.open_table(RESERVATIONS)?;
        txn.open_table(FENCES)?;
        txn.open_table(KV)?;
        txn.open_table(IDEMPOTENCY)?;
        txn.open_table(IDEM_EXPIRY)?;
        txn.open_table(USAGE)?;
    }
    txn.commit()?;
    Ok(())
}

/// Layout 1 to 2: counts every namespace's keys and bytes into [`USAGE`], and gives every
/// idempotency record a creation time (`now_ms`) and its entry in [`IDEM_EXPIRY`].
fn migrate_from_v1(txn: &WriteTransaction, now_ms: u64) -> Result<(), Fault> {
    let mut usage: BTreeMap<String, Usage> = BTreeMap::new();
    for item in txn.open_table(KV)?.iter()? {
        let (key, value) = item?;
        let (ns, key) = key.value();
        let (_, _, bytes) = value.value();
        let slot = usage.entry(ns.to_owned()).or_default();
        slot.keys += 1;
        slot.bytes += Usage::entry_bytes(key, bytes.len());
    }
    let mut counters = txn.open_table(USAGE)?;
    for (ns, u) in &usage {
        counters.insert(ns.as_str(), (u.keys, u.bytes))?;
    }
    let mut records = txn.open_table(IDEMPOTENCY)?;
    let mut expiry = txn.open_table(IDEM_EXPIRY)?;
    let mut stamped = Vec::new();
    for item in records.iter()? {
        let (key, value) = item?;
        let (ns, idem_key) = key.value();
        let mut record: IdemRecord = serde_json::from_str(value.value())?;
        record.created_at_ms = now_ms;
        stamped.push((
            ns.to_owned(),
            idem_key.to_owned(),
            serde_json::to_string(&record)?,
        ));
    }
    for (ns, idem_key, record) in &stamped {
        records.insert((ns.as_str(), idem_key.as_str()), record.as_str())?;
        expiry.insert((now_ms, ns.as_str(), idem_key.as_str()), ())?;
    }
    txn.open_table(META)?.insert(META_FORMAT, FORMAT_VERSION)?;
    tracing::info!(
        namespaces = usage.len(),
        idempotency_records = stamped.len(),
        "migrated the database from layout 1 to {FORMAT_VERSION}"
    );
    Ok(())
}

#[cfg(unix)]
fn sync_parent_dir(path: &Path) -> Result<(), Fault> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Fault(format!("cannot fsync directory {}: {e}", dir.display())))
}

#[cfg(not(unix))]
fn sync_parent_dir(_path: &Path) -> Result<(), Fault> {
    // Directories cannot be opened for fsync here; the file's own fsync is all there is.
    Ok(())
}
