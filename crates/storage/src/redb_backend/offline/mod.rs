//! # Offline maintenance of the database file: summary, backup, staged restore
//!
//! These functions work on a database file that no server has open. redb takes an
//! exclusive lock on the file for as long as a [`redb::Database`] is alive, so a running
//! server makes every function here fail with [`OfflineError::Busy`] instead of reading
//! or replacing a file under it; holding an [`OfflineDb`] keeps a server from starting on
//! that file in the meantime.
//!
//! - [`OfflineDb::summary`]: the highest epoch each lock is known to have reached (its
//!   issuer counter, its reservation's ceiling, its lease records and its namespace's
//!   high-water mark).
//! - [`OfflineDb::backup_to`]: one read transaction (a consistent snapshot) copied table by
//!   table into a new file, plus a `backup_info` record ([`BackupInfo`]). The copy is
//!   written as `<out>.partial` and renamed into place once fsync'd, so a file at `out` is
//!   always a complete backup.
//! - [`StagedRestore`]: copies a backup to a staging file and rewrites it so that it can be
//!   served without ever reissuing an epoch or re-admitting a fenced-out token
//!   ([`StagedRestore::apply`]). Choosing the floor and swapping the files into place is
//!   the data directory's business (`palisade-server`'s recovery module), not this one.
//!
//! ## Invariants
//! - Every table of the file is known here. A table this code does not know (a later
//!   layout) makes backup and restore refuse, rather than silently drop state.
//! - A restored file has no lease records, every known lock's counter at least the floor,
//!   and every known namespace's high-water mark at least the floor.
//!
//! ## What this does not do
//! - It cannot know about epochs issued after the backup: that knowledge comes from the
//!   caller's floor (see `docs/operations.md`).
//! - It does not know lock names that appear nowhere in the backup or in the caller's plan;
//!   the issuer starts such a lock from 1.

mod backup;
mod restore;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use redb::{Database, ReadTransaction, TableHandle};
use serde::{Deserialize, Serialize};

use palisade_token::Epoch;

use super::layers::{Layers, View};
use super::overlay::{Key, Val};
use super::reads::each_row;
use super::schema::{
    Fault, EPOCHS, FENCES, IDEMPOTENCY, IDEM_EXPIRY, KV, LEASES, META, META_CHECKPOINT_SEQ,
    RESERVATIONS, USAGE,
};
use super::wal::FsLogDir;
use super::RedbBackend;
use crate::{LeaseRecord, StorageError};

pub use backup::{read_backup_info, BackupInfo};
pub use restore::{RestorePlan, Restored, StagedRestore};

/// Why an offline operation failed. Every variant names the file concerned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfflineError {
    /// Another process (a running server) has the file open.
    #[error("{path} is in use by another process (is the server still running? stop it first)")]
    Busy { path: String },
    #[error("{path} does not exist")]
    Missing { path: String },
    /// The file exists but cannot be read as a Palisade database.
    #[error("{path} cannot be read: {reason}")]
    Damaged { path: String, reason: String },
    /// The file is a Palisade database but not a backup made by `backup_to`.
    #[error("{path} is not a Palisade backup: {reason}")]
    NotABackup { path: String, reason: String },
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
}

impl OfflineError {
    fn io(path: &Path, e: impl std::fmt::Display) -> Self {
        OfflineError::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        }
    }

    fn damaged(path: &Path, fault: Fault) -> Self {
        OfflineError::Damaged {
            path: path.display().to_string(),
            reason: fault.0,
        }
    }
}

/// The highest epoch each lock is known to have reached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochSummary {
    pub locks: BTreeMap<String, Epoch>,
    /// The newest commit the database file holds (its commit sequence number). Offline,
    /// after the log was replayed into the file, that is every commit; from a live backend
    /// it is the last checkpoint's (see [`RedbBackend::commit_seq`] for the newest).
    #[serde(default)]
    pub commit_seq: u64,
}

impl EpochSummary {
    /// The highest epoch of any lock (0 if none).
    pub fn max(&self) -> Epoch {
        self.locks.values().copied().max().unwrap_or(0)
    }

    fn raise(&mut self, lock: &str, epoch: Epoch) {
        let slot = self.locks.entry(lock.to_owned()).or_default();
        *slot = (*slot).max(epoch);
    }
}

/// Reads the summary from one snapshot: issuer counters, lease records and marks.
pub(super) fn summarize(view: &View<'_>) -> Result<EpochSummary, Fault> {
    let mut summary = EpochSummary {
        commit_seq: match view.get(&Key::Meta(META_CHECKPOINT_SEQ.to_owned()))? {
            Some(Val::U64(seq)) => seq,
            _ => 0,
        },
        ..EpochSummary::default()
    };
    each_row(view, Key::Epoch(String::new()), &mut |key, val| {
        if let (Key::Epoch(lock), Val::U64(epoch)) = (key, val) {
            summary.raise(&lock, epoch);
        }
        Ok(())
    })?;
    each_row(view, Key::Reservation(String::new()), &mut |key, val| {
        // The ceiling: no epoch above it was issued, but any up to it may have been.
        if let (Key::Reservation(lock), Val::Triple(ceiling, ..)) = (key, val) {
            summary.raise(&lock, ceiling);
        }
        Ok(())
    })?;
    each_row(view, Key::Lease(String::new()), &mut |_, val| {
        if let Val::Text(text) = val {
            let lease: LeaseRecord = serde_json::from_str(&text)?;
            // A session's record names no lock.
            if !lease.is_session() {
                summary.raise(&lease.lock, lease.epoch);
            }
        }
        Ok(())
    })?;
    each_row(view, Key::Fence(String::new()), &mut |key, val| {
        if let (Key::Fence(namespace), Val::Pair(epoch, _)) = (key, val) {
            summary.raise(&namespace, epoch);
        }
        Ok(())
    })?;
    Ok(summary)
}

/// Refuses a file holding a table this code does not know (`extra` names the ones a
/// backup file adds).
fn check_tables(txn: &ReadTransaction, extra: &[&str]) -> Result<(), Fault> {
    let known = [
        EPOCHS.name(),
        RESERVATIONS.name(),
        LEASES.name(),
        FENCES.name(),
        KV.name(),
        META.name(),
        IDEMPOTENCY.name(),
        IDEM_EXPIRY.name(),
        USAGE.name(),
    ];
    for table in txn.list_tables()? {
        let name = table.name();
        if !known.contains(&name) && !extra.contains(&name) {
            return Err(Fault(format!(
                "holds table {name:?}, which this version's backup and restore do not know; \
                 refusing rather than dropping it"
            )));
        }
    }
    Ok(())
}

impl RedbBackend {
    /// The same summary as [`OfflineDb::summary`], from a live backend (one snapshot).
    pub async fn epoch_summary(&self) -> Result<EpochSummary, StorageError> {
        self.scan(summarize).await
    }
}

/// A database file opened for offline work. While it lives, no server can open the file.
pub struct OfflineDb {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for OfflineDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfflineDb")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl OfflineDb {
    /// Opens an existing Palisade database file, verifying every page checksum. A file
    /// another process holds is [`OfflineError::Busy`]; a missing one
    /// [`OfflineError::Missing`]; anything unreadable [`OfflineError::Damaged`].
    pub fn open(path: &Path) -> Result<OfflineDb, OfflineError> {
        if !path.exists() {
            return Err(OfflineError::Missing {
                path: path.display().to_string(),
            });
        }
        let db = open_existing(path)?;
        Ok(OfflineDb {
            db,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The highest epoch each lock has reached, from one snapshot.
    pub fn summary(&self) -> Result<EpochSummary, OfflineError> {
        let read = || -> Result<EpochSummary, Fault> {
            summarize(&View::over(&Layers::default(), self.db.begin_read()?))
        };
        read().map_err(|fault| OfflineError::damaged(&self.path, fault))
    }
}

/// Opens an existing file as a Palisade database: refuses a locked file, a damaged one
/// (checksums verified) and one of another layout.
fn open_existing(path: &Path) -> Result<Database, OfflineError> {
    let opened = std::panic::catch_unwind(|| redb::Builder::new().open(path)).map_err(|_| {
        OfflineError::damaged(path, Fault("damaged database file (redb panicked)".into()))
    })?;
    let mut db = match opened {
        Ok(db) => db,
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
            return Err(OfflineError::Busy {
                path: path.display().to_string(),
            })
        }
        Err(redb::DatabaseError::Storage(redb::StorageError::Io(io)))
            if io.kind() == ErrorKind::InvalidData =>
        {
            return Err(OfflineError::damaged(
                path,
                Fault("not a redb database file (or an empty or damaged one)".into()),
            ))
        }
        Err(other) => return Err(OfflineError::damaged(path, other.into())),
    };
    let verified = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| db.check_integrity()));
    let fault = match verified {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(Fault::from(e)),
        Err(_) => Some(Fault("damaged database file (redb panicked)".into())),
    };
    if let Some(fault) = fault {
        super::open::discard(db);
        return Err(OfflineError::damaged(path, fault));
    }
    // The log's commits first: offline work reads the file alone.
    let now_ms = crate::WallClock::system().now_ms();
    let prepared = super::open::guarded("prepare", || {
        super::open::prepare(&db, now_ms)?;
        super::open::recover(&db, &FsLogDir::for_db(path))
    });
    if let Some(fault) = match prepared {
        Ok(Ok(_)) => None,
        Ok(Err(fault)) | Err(fault) => Some(fault),
    } {
        super::open::discard(db);
        return Err(OfflineError::damaged(path, fault));
    }
    Ok(db)
}

/// fsyncs the directory holding `path`, so a rename or a new file in it is durable.
fn sync_dir_of(path: &Path) -> Result<(), OfflineError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    #[cfg(unix)]
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| OfflineError::io(dir, format!("cannot fsync directory: {e}")))?;
    Ok(())
}

/// Removes a leftover file, if any.
fn remove_leftover(path: &Path) -> Result<(), OfflineError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(OfflineError::io(path, e)),
        _ => Ok(()),
    }
}
