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
use std::sync::Arc;

use crate::redb_backend::layers::{apply_rows, Layers, View};
use crate::redb_backend::overlay::{Key as OverlayKey, Val};
use crate::redb_backend::schema::{
    Fault, EPOCHS, FENCES, FORMAT_VERSION, IDEMPOTENCY, IDEM_EXPIRY, KV, LEASES, META,
    META_CHECKPOINT_SEQ, RESERVATIONS, USAGE,
};
use crate::redb_backend::RedbBackend;

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
    /// No lock had an epoch above this in the snapshot: an upper bound, not an epoch
    /// anyone was granted, since it counts the issuer's reservation ceilings (epochs
    /// reserved, maybe never granted). Written as `max_epoch` by earlier versions.
    #[serde(alias = "max_epoch")]
    pub epoch_bound: Epoch,
    /// The same bound per lock (last grant, reservation ceiling, leases and mark).
    /// Written as `epochs` by earlier versions.
    #[serde(alias = "epochs")]
    pub epoch_bounds: BTreeMap<String, Epoch>,
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
        let snapshot = self
            .db
            .begin_read()
            .map_err(|e| OfflineError::damaged(&self.path, e.into()))?;
        let (partial, target) = create_partial(out)?;
        let layers = Layers::default();
        let view = View::over(&layers, snapshot);
        let written = write_copy(&view, &target, &self.path, backup_id, created_at_unix);
        finish_partial(target, written, &partial, out)
    }
}

/// Closes the copy, and renames it into place if it was written (removes it if not).
fn finish_partial(
    target: Database,
    written: Result<BackupInfo, OfflineError>,
    partial: &Path,
    out: &Path,
) -> Result<BackupInfo, OfflineError> {
    drop(target);
    let info = match written {
        Ok(info) => info,
        Err(e) => {
            let _ = std::fs::remove_file(partial);
            return Err(e);
        }
    };
    std::fs::rename(partial, out).map_err(|e| OfflineError::io(out, e))?;
    sync_dir_of(out)?;
    Ok(info)
}

/// Creates `<out>.partial` as a new redb file (`out` must not exist).
fn create_partial(out: &Path) -> Result<(PathBuf, Database), OfflineError> {
    if out.exists() {
        return Err(OfflineError::io(
            out,
            "already exists; refusing to overwrite",
        ));
    }
    let partial = partial_path(out);
    remove_leftover(&partial)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&partial)
        .map_err(|e| OfflineError::io(&partial, e))?;
    let target = redb::Builder::new()
        .create_file(file)
        .map_err(|e| OfflineError::io(&partial, e))?;
    Ok((partial, target))
}

impl RedbBackend {
    /// [`OfflineDb::backup_to`] while serving: a consistent copy of every acknowledged
    /// write, in the format `palisade admin restore` reads, taken without stopping the
    /// writer.
    ///
    /// The durable state is the database file (the last checkpoint) plus the log's rows
    /// not checkpointed yet, held in memory (`published`, and `frozen` while a checkpoint
    /// writes it). Holding `published`'s read lock stops the syncer from publishing and
    /// the checkpointer from freezing, so for that moment the three are one point in time:
    /// clone the in-memory rows, begin a read transaction of the file, let go. A
    /// checkpoint finishing meanwhile only adds to the file rows the frozen copy also
    /// holds; applying them twice gives the same rows. The copy (the file's tables, then
    /// the frozen rows, then the published ones) is made on tokio's blocking pool while
    /// the writer goes on. Every write acknowledged before this call is in it
    /// (`an_online_backup_holds_every_acknowledged_write` in this module's tests).
    pub async fn backup_to(
        &self,
        out: &Path,
        backup_id: &str,
        created_at_unix: u64,
    ) -> Result<BackupInfo, OfflineError> {
        let source = PathBuf::from(&self.inner.state.path);
        let db = self
            .inner
            .db
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or_else(|| OfflineError::io(&source, "the database is closed"))?;
        let layers = Arc::clone(&self.inner.layers);
        let state = Arc::clone(&self.inner.state);
        let (out, id) = (out.to_owned(), backup_id.to_owned());
        let copy = move || -> Result<BackupInfo, OfflineError> {
            let rows = Layers::default();
            let (txn, durable_seq) = {
                let published = layers
                    .published
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *rows
                    .published
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = published.clone();
                *rows
                    .frozen
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = layers.frozen();
                let txn = db
                    .begin_read()
                    .map_err(|e| OfflineError::damaged(&source, e.into()))?;
                (txn, state.durable_seq())
            };
            let view = View::over(&rows, txn);
            let (partial, target) = create_partial(&out)?;
            let written = write_copy_with(
                &view,
                &rows,
                durable_seq,
                &target,
                &source,
                &id,
                created_at_unix,
            );
            finish_partial(target, written, &partial, &out)
        };
        tokio::task::spawn_blocking(copy)
            .await
            .map_err(|e| OfflineError::Io {
                path: "backup task".into(),
                reason: e.to_string(),
            })?
    }
}

/// Reads the [`BackupInfo`] of a backup file (checksums verified), without changing it.
pub fn read_backup_info(path: &Path) -> Result<BackupInfo, OfflineError> {
    if !path.exists() {
        return Err(OfflineError::Missing {
            path: path.display().to_string(),
        });
    }
    let db = super::open_existing(path)?;
    super::restore::read_info(&db).map_err(|fault| OfflineError::NotABackup {
        path: path.display().to_string(),
        reason: fault.0,
    })
}

fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Copies every table of `view`'s file snapshot into `target` in one durable transaction.
fn write_copy(
    view: &View<'_>,
    target: &Database,
    source: &Path,
    backup_id: &str,
    created_at_unix: u64,
) -> Result<BackupInfo, OfflineError> {
    write_copy_with(
        view,
        &Layers::default(),
        0,
        target,
        source,
        backup_id,
        created_at_unix,
    )
}

/// [`write_copy`], with the in-memory rows of `rows` (frozen, then published: the order
/// in which they became durable) written over the file's tables, and the copy's commit
/// sequence number raised to `durable_seq`.
fn write_copy_with(
    view: &View<'_>,
    rows: &Layers,
    durable_seq: u64,
    target: &Database,
    source: &Path,
    backup_id: &str,
    created_at_unix: u64,
) -> Result<BackupInfo, OfflineError> {
    let snapshot = view.txn();
    let read_fault = |fault: Fault| OfflineError::damaged(source, fault);
    check_tables(snapshot, &[]).map_err(read_fault)?;
    let summary = summarize(view).map_err(read_fault)?;
    let commit_seq = summary.commit_seq.max(durable_seq);
    let copy = || -> Result<BackupInfo, Fault> {
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
        if let Some(frozen) = rows.frozen() {
            apply_rows(&txn, frozen.iter())?;
        }
        let published = rows
            .published
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let seq = (
            OverlayKey::Meta(META_CHECKPOINT_SEQ.to_owned()),
            Some(Val::U64(commit_seq)),
        );
        apply_rows(
            &txn,
            published.iter().chain(std::iter::once((&seq.0, &seq.1))),
        )?;
        // Counted on the copy itself, in-memory rows included.
        let info = BackupInfo {
            backup_id: backup_id.to_owned(),
            created_at_unix,
            source: source.display().to_string(),
            format_version: FORMAT_VERSION,
            epoch_bound: summary.max(),
            epoch_bounds: summary.locks.clone(),
            keys: txn.open_table(KV)?.len()?,
            namespaces: txn.open_table(FENCES)?.len()?,
            commit_seq,
        };
        let record = serde_json::to_string(&info)?;
        txn.open_table(BACKUP_INFO)?
            .insert(INFO_KEY, record.as_str())?;
        txn.commit()?;
        Ok(info)
    };
    // A failure here is the target's (disk full, ...): the source was read already.
    copy().map_err(|fault| OfflineError::Io {
        path: partial_path_display(source, backup_id),
        reason: fault.0,
    })
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
