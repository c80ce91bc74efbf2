//! Backup: one read transaction copied table by table into a new file.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use redb::{
    Database, Durability, Key, ReadTransaction, ReadableTableMetadata, TableDefinition, Value,
    WriteTransaction,
};
use serde::{Deserialize, Serialize};

use palisade_token::Epoch;

use super::{check_tables, remove_leftover, summarize, sync_dir_of, OfflineDb, OfflineError};
use crate::redb_backend::layers::{Layers, View};
use crate::redb_backend::schema::{
    Fault, EPOCHS, FENCES, FORMAT_VERSION, IDEMPOTENCY, IDEM_EXPIRY, KV, LEASES, META,
    RESERVATIONS, USAGE,
};

/// The record a backup file carries beside the copied tables.
pub(super) const BACKUP_INFO: TableDefinition<&str, &str> = TableDefinition::new("backup_info");
pub(super) const INFO_KEY: &str = "info";

/// What a backup holds, stored inside the backup file and printed by the CLI.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupInfo {
    /// Random id given by the caller, to tell backups apart in logs and ledgers.
    pub backup_id: String,
    /// When the snapshot was taken (seconds since the Unix epoch).
    pub created_at_unix: u64,
    /// The database file the snapshot was taken from.
    pub source: String,
    /// Layout version of the copied tables.
    pub format_version: u64,
    /// The highest epoch any lock may have reached in the snapshot: an upper bound, since
    /// the issuer's counters include reservation ceilings (epochs reserved, maybe not
    /// issued yet).
    pub max_epoch: Epoch,
    /// The same bound per lock (counter, reservation ceiling, leases and mark).
    pub epochs: BTreeMap<String, Epoch>,
    /// Number of keys in the fenced store.
    pub keys: u64,
    /// Number of namespaces with a high-water mark.
    pub namespaces: u64,
    /// The newest commit the copy holds (its commit sequence number).
    #[serde(default)]
    pub commit_seq: u64,
}

impl OfflineDb {
    /// Writes a consistent copy of this database to `out` (which must not exist yet),
    /// with a [`BackupInfo`] record. The copy goes to `<out>.partial` first and is renamed
    /// into place after fsync, so `out` never names half a backup.
    pub fn backup_to(
        &self,
        out: &Path,
        backup_id: &str,
        created_at_unix: u64,
    ) -> Result<BackupInfo, OfflineError> {
        if out.exists() {
            return Err(OfflineError::io(
                out,
                "already exists; refusing to overwrite",
            ));
        }
        let partial = partial_path(out);
        remove_leftover(&partial)?;
        let snapshot = self
            .db
            .begin_read()
            .map_err(|e| OfflineError::damaged(&self.path, e.into()))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&partial)
            .map_err(|e| OfflineError::io(&partial, e))?;
        let target = redb::Builder::new()
            .create_file(file)
            .map_err(|e| OfflineError::io(&partial, e))?;
        let layers = Layers::default();
        let view = View::over(&layers, snapshot);
        let written = write_copy(&view, &target, &self.path, backup_id, created_at_unix);
        drop(target);
        let info = match written {
            Ok(info) => info,
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                return Err(e);
            }
        };
        std::fs::rename(&partial, out).map_err(|e| OfflineError::io(out, e))?;
        sync_dir_of(out)?;
        Ok(info)
    }
}

fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Copies every table of `snapshot` into `target` in one durable transaction.
fn write_copy(
    view: &View<'_>,
    target: &Database,
    source: &Path,
    backup_id: &str,
    created_at_unix: u64,
) -> Result<BackupInfo, OfflineError> {
    let snapshot = view.txn();
    let read_fault = |fault: Fault| OfflineError::damaged(source, fault);
    check_tables(snapshot, &[]).map_err(read_fault)?;
    let summary = summarize(view).map_err(read_fault)?;
    let count = || -> Result<(u64, u64), Fault> {
        Ok((
            snapshot.open_table(KV)?.len()?,
            snapshot.open_table(FENCES)?.len()?,
        ))
    };
    let (keys, namespaces) = count().map_err(read_fault)?;
    let info = BackupInfo {
        backup_id: backup_id.to_owned(),
        created_at_unix,
        source: source.display().to_string(),
        format_version: FORMAT_VERSION,
        max_epoch: summary.max(),
        epochs: summary.locks,
        keys,
        namespaces,
        commit_seq: summary.commit_seq,
    };
    let copy = || -> Result<(), Fault> {
        let mut txn = target.begin_write()?;
        txn.set_durability(Durability::Immediate);
        txn.set_two_phase_commit(true);
        copy_table(snapshot, &txn, EPOCHS)?;
        copy_table(snapshot, &txn, RESERVATIONS)?;
        copy_table(snapshot, &txn, LEASES)?;
        copy_table(snapshot, &txn, FENCES)?;
        copy_table(snapshot, &txn, KV)?;
        copy_table(snapshot, &txn, META)?;
        copy_table(snapshot, &txn, IDEMPOTENCY)?;
        copy_table(snapshot, &txn, IDEM_EXPIRY)?;
        copy_table(snapshot, &txn, USAGE)?;
        let record = serde_json::to_string(&info)?;
        txn.open_table(BACKUP_INFO)?
            .insert(INFO_KEY, record.as_str())?;
        txn.commit()?;
        Ok(())
    };
    // A failure here is the target's (disk full, ...): the source was read already.
    copy().map_err(|fault| OfflineError::Io {
        path: partial_path_display(source, backup_id),
        reason: fault.0,
    })?;
    Ok(info)
}

fn partial_path_display(source: &Path, backup_id: &str) -> String {
    format!("backup {backup_id} of {}", source.display())
}

fn copy_table<K: Key + 'static, V: Value + 'static>(
    from: &ReadTransaction,
    to: &WriteTransaction,
    table: TableDefinition<K, V>,
) -> Result<(), Fault> {
    let source = from.open_table(table)?;
    let mut target = to.open_table(table)?;
    for item in redb::ReadableTable::iter(&source)? {
        let (key, value) = item?;
        target.insert(key.value(), value.value())?;
    }
    Ok(())
}
