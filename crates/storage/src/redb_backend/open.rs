//! Opening the database file: create it fresh or open an existing one, never silently
//! adopt or initialise a file that holds something else.
//!
//! - A missing path is created (exclusively) and initialised, and its directory entry is
//!   fsync'd: without that, a power cut could lose the whole new file, and with it every
//!   epoch acknowledged since, so epochs would restart at 1.
//! - An existing path must be a redb file (an empty or truncated file, or garbage, is
//!   refused) holding either nothing yet or Palisade's tables at [`FORMAT_VERSION`] (or an
//!   older layout, migrated here). redb's own crash recovery runs here: it rolls back a
//!   checkpoint whose commit never completed (its rows are still in the log). With
//!   [`RedbOptions::verify_on_open`] every page checksum is then verified too, so damage in
//!   the middle of the file is found now rather than served later.
//! - Then [`recover`] replays the log into the file, or refuses it (see there).
//!
//! [`RedbOptions::verify_on_open`]: super::RedbOptions::verify_on_open

use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::path::Path;

use std::collections::{BTreeMap, BTreeSet};

use redb::{Builder, Database, Durability, ReadableTable, WriteTransaction};

use palisade_token::Epoch;

use super::overlay::{self, Rows};
use super::schema::{
    Fault, IdemRecord, EPOCHS, FENCES, FORMAT_VERSION, IDEMPOTENCY, IDEM_EXPIRY, KV, LEASES, META,
    META_CHECKPOINT_SEQ, META_FORMAT, META_STORE_ID_HI, META_STORE_ID_LO, RESERVATIONS, USAGE,
};
use super::wal::{self, LogDir};
use super::{horizon, raise};
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
                match guarded("verify", || db.check_integrity()) {
                    Ok(Ok(true)) => {}
                    Ok(Ok(false)) => {
                        tracing::warn!(path = %path.display(), "redb rebuilt its allocator state on open");
                    }
                    Ok(Err(e)) => {
                        discard(db);
                        return Err(e.into());
                    }
                    Err(fault) => {
                        discard(db);
                        return Err(fault);
                    }
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
pub(super) fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, Fault> {
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

/// Drops a database that failed its checks. After redb panicked on a damaged file its
/// locks are poisoned and its own drop can panic too: that one is contained here.
pub(super) fn discard(db: Database) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(db)));
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

/// What [`recover`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recovered {
    /// The newest commit the database holds now (its commit sequence number).
    pub seq: u64,
    pub store_id: u128,
    /// Records replayed from the log into the file.
    pub replayed: u64,
    /// Whether the log ended with a torn record (cut by a crash; never acknowledged).
    pub torn: bool,
    /// The log's tail was ambiguous (see [`recover`]) and every epoch and mark was raised
    /// to this floor.
    pub raised_to: Option<Epoch>,
    /// The epoch horizon the writer starts with (see `horizon.rs`).
    pub horizon: Epoch,
}

/// The store's id, creating one in a file that has none yet.
fn store_id(db: &Database) -> Result<u128, Fault> {
    let read = |txn: &redb::ReadTransaction| -> Result<Option<u128>, Fault> {
        let meta = txn.open_table(META)?;
        let hi = meta.get(META_STORE_ID_HI)?.map(|g| g.value());
        let lo = meta.get(META_STORE_ID_LO)?.map(|g| g.value());
        Ok(hi
            .zip(lo)
            .map(|(hi, lo)| (u128::from(hi) << 64) | u128::from(lo)))
    };
    if let Some(id) = read(&db.begin_read()?)? {
        return Ok(id);
    }
    let id: u128 = rand::random::<u128>() | 1;
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate);
    txn.set_two_phase_commit(true);
    {
        let mut meta = txn.open_table(META)?;
        meta.insert(META_STORE_ID_HI, (id >> 64) as u64)?;
        meta.insert(META_STORE_ID_LO, id as u64)?;
    }
    txn.commit()?;
    Ok(id)
}

/// Brings the database file up to date with its log before anything else reads it: replays
/// every record after the file's checkpoint, writes them into the file as one durable
/// checkpoint, and removes the log's segments (a spare segment stays). Refuses, with the
/// reason, a log that does not fit the file:
/// - a record that is damaged rather than torn (see [`wal`]): an acknowledged commit may
///   be lost;
/// - a gap between the file's checkpoint and the log's first record, or between segments:
///   the file is older than its log (an older copy was put in place), or a segment is gone;
/// - a segment of another store, or with a damaged header.
///
/// A torn record ends the log: it and everything after it were never acknowledged, if a
/// crash tore it. But a record a bad sector or a lost write zeroed after it was
/// acknowledged looks the same, and so does the end of a log whose newest record such
/// damage took away whole (possible only where the log ends on a sector boundary). Such a
/// tail is **ambiguous**: recovery cannot know what it held, so it raises every epoch and
/// mark to the epoch horizon (`horizon.rs`), above anything the lost records could have
/// held, in the same durable step as the replay and before the log is removed; every token
/// issued before is refused from then on, and the holders release and acquire again (the
/// leases the database knows are kept, so their locks go to nobody new while they live).
/// Without a readable horizon an ambiguous tail is refused.
pub(super) fn recover(db: &Database, log: &dyn LogDir) -> Result<Recovered, Fault> {
    let store_id = store_id(db)?;
    let checkpoint = db
        .begin_read()?
        .open_table(META)?
        .get(META_CHECKPOINT_SEQ)?
        .map_or(0, |g| g.value());
    let io = |name: &str, e: std::io::Error| Fault(format!("{}: {e}", log.describe(name)));
    let segment_prefix = format!("{}.wal.", log.stem());
    let mut segments = Vec::new();
    for name in log.list().map_err(|e| io("log directory", e))? {
        if !name.starts_with(&segment_prefix) {
            continue; // the horizon, beside the log
        }
        if name.ends_with(".tmp") {
            log.remove(&name).map_err(|e| io(&name, e))?;
            continue;
        }
        let file = log.open(&name).map_err(|e| io(&name, e))?;
        match wal::read_header(file.as_ref()) {
            Ok(None) => {} // a spare, never used
            Ok(Some((id, base))) if id == store_id => segments.push((base, name, file)),
            Ok(Some(_)) => {
                return Err(Fault(format!(
                    "log segment {} belongs to another database; move it away",
                    log.describe(&name)
                )))
            }
            Err(why) => return Err(Fault(format!("log segment {}: {why}", log.describe(&name)))),
        }
    }
    segments.sort_by_key(|(base, ..)| *base);
    let mut rows = Rows::new();
    let (mut expected, mut replayed, mut torn) = (checkpoint + 1, 0u64, false);
    let mut ambiguous = None;
    // Bytes of log past the point where an ambiguous tail begins: records lost there
    // could have been acknowledged, each at least RECORD_OVERHEAD bytes long.
    let mut unread = 0u64;
    for (i, (base, name, file)) in segments.iter().enumerate() {
        if torn {
            // After a torn record nothing was acknowledged, if a crash tore it.
            unread += file.len().map_err(|e| io(name, e))?;
            continue;
        }
        let scanned = wal::scan(file.as_ref(), *base)
            .map_err(|why| Fault(format!("log segment {}: {why}", log.describe(name))))?;
        match scanned.tail {
            wal::Tail::Torn { at } => {
                tracing::warn!(
                    segment = %log.describe(name),
                    offset = at,
                    "the log ends with a torn record (a write cut by a crash before it was \
                     acknowledged, or an acknowledged one damaged since); dropping it"
                );
                torn = true;
                unread += file.len().map_err(|e| io(name, e))?.saturating_sub(at);
                ambiguous = Some(format!(
                    "a torn or zeroed record at byte {at} of {}",
                    log.describe(name)
                ));
            }
            wal::Tail::Clean { end } if i + 1 == segments.len() && end % wal::SECTOR == 0 => {
                unread += file.len().map_err(|e| io(name, e))?.saturating_sub(end);
                ambiguous = Some(format!(
                    "the log ends on a sector boundary (byte {end} of {}), where a newest \
                     record zeroed whole would leave no trace",
                    log.describe(name)
                ));
            }
            wal::Tail::Clean { .. } => {}
        }
        let newest = scanned
            .records
            .last()
            .map_or(base.saturating_sub(1), |r| r.0);
        if newest < expected {
            continue; // everything in it is in the file already
        }
        if *base > expected {
            return Err(Fault(format!(
                "the log continues at commit {base} ({}), but the database file holds commits \
                 only up to {}: the commits in between are missing (the database file is older \
                 than its log, or a log segment was removed)",
                log.describe(name),
                expected - 1
            )));
        }
        for (seq, _, _, payload) in &scanned.records {
            if *seq < expected {
                continue;
            }
            for (key, val) in overlay::decode(payload).map_err(|why| {
                Fault(format!(
                    "log segment {}, commit {seq}: {why}",
                    log.describe(name)
                ))
            })? {
                rows.insert(key, val);
            }
            replayed += 1;
            expected = seq + 1;
        }
    }
    let mut seq = expected - 1;
    if !rows.is_empty() {
        super::writer::write_checkpoint(db, seq, &rows)?;
        tracing::info!(replayed, seq, "replayed the log into the database file");
    }
    let lost = ambiguous.map(|why| Lost {
        why,
        // Commit numbers go on past every record the unread bytes could have held, so
        // that none is numbered twice (the server's ledger may have seen one durable).
        next_seq: seq + unread / wal::RECORD_OVERHEAD + 1,
    });
    if let Some(lost) = &lost {
        seq = lost.next_seq;
    }
    let (raised_to, horizon) = settle_horizon(db, log, lost)?;
    for (_, name, _) in &segments {
        log.remove(name).map_err(|e| io(name, e))?;
    }
    log.sync().map_err(|e| io("log directory", e))?;
    Ok(Recovered {
        seq,
        store_id,
        replayed,
        torn,
        raised_to,
        horizon,
    })
}

/// An ambiguous tail: why, and the commit number the database goes on from.
struct Lost {
    why: String,
    next_seq: u64,
}

/// After the replay, before the log goes: with an ambiguous tail, raises every epoch and
/// mark to the horizon (or to the database's own highest epoch, if that is above it) and
/// the commit number to `next_seq`; then makes sure a readable horizon is on disk for the
/// writer. Returns the floor raised to, if any, and the horizon the writer starts with.
fn settle_horizon(
    db: &Database,
    log: &dyn LogDir,
    lost: Option<Lost>,
) -> Result<(Option<Epoch>, Epoch), Fault> {
    let loaded = horizon::load(log);
    let Some(Lost { why, next_seq }) = lost else {
        return match loaded {
            horizon::Loaded::Horizon(h) => Ok((None, h)),
            other => {
                // Nothing is unknown: the database itself bounds what the log held.
                if let horizon::Loaded::Damaged(reason) = other {
                    tracing::warn!(
                        file = %log.describe(&horizon::name(log.stem())),
                        %reason,
                        "the epoch horizon is damaged; the log's tail is clean, so it is made \
                         again from the database"
                    );
                }
                let txn = db.begin_write()?;
                let top = raise::highest(&txn)?;
                txn.abort()?;
                let h = top.saturating_add(horizon::HORIZON_STEP);
                horizon::store(log, h)?;
                Ok((None, h))
            }
        };
    };
    let h = match loaded {
        horizon::Loaded::Horizon(h) => h,
        horizon::Loaded::Missing => {
            return Err(Fault(format!(
                "the log's tail is ambiguous ({why}), and the epoch horizon {} that bounds what \
                 it held is missing: recovery cannot know which epochs to skip. Restore from a \
                 backup with a floor above every epoch issued (docs/operations.md)",
                log.describe(&horizon::name(log.stem()))
            )))
        }
        horizon::Loaded::Damaged(reason) => {
            return Err(Fault(format!(
                "the log's tail is ambiguous ({why}), and the epoch horizon {} that bounds what \
                 it held is damaged ({reason}): recovery cannot know which epochs to skip. \
                 Restore from a backup with a floor above every epoch issued \
                 (docs/operations.md)",
                log.describe(&horizon::name(log.stem()))
            )))
        }
    };
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate);
    txn.set_two_phase_commit(true);
    let floor = raise::highest(&txn)?.max(h);
    let raised = raise::raise(&txn, floor, &BTreeSet::new(), raise::After::Recovery)?;
    txn.open_table(META)?
        .insert(META_CHECKPOINT_SEQ, next_seq)?;
    txn.commit()?;
    tracing::error!(
        %why,
        floor,
        locks = raised.locks,
        namespaces = raised.namespaces,
        "the log's tail was ambiguous: a record there may have been acknowledged, and what it \
         held is unknown. Every lock's epoch and every namespace's mark was raised to {floor}: \
         every token issued before is refused from now on, and every holder must release and \
         acquire again"
    );
    let next = floor.saturating_add(horizon::HORIZON_STEP);
    horizon::store(log, next)?;
    Ok((Some(floor), next))
}
