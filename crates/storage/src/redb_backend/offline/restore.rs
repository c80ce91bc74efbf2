//! Restore: a backup copied to a staging file and rewritten so that serving it keeps both
//! ends of the fencing protocol (S11).
//!
//! The backup is older than the state it replaces, so it does not know the epochs issued
//! after it. [`StagedRestore::apply`] therefore:
//! - raises every known lock's counter to the caller's floor, which the caller chose above
//!   every epoch that may have been issued: the next acquisition gets `floor + 1`;
//! - raises every known namespace's high-water mark to the floor, so every token issued
//!   before the restore, including ones fenced out after the backup was taken, is refused
//!   with `stale_token`;
//! - raises every reservation's ceiling to the floor and marks it inactive (no lease of
//!   the backup is live any more, see below), so the next grant records a new one;
//! - drops every lease record: the backup's holders are not the holders of the moment of
//!   the crash, and honouring them would let a lease with an old epoch be renewed as if it
//!   were current. Their tokens are refused by the raised marks anyway.
//! - raises the file's commit sequence number to the caller's (the highest the data
//!   directory saw), so the restored file is not taken for an older copy, and drops its
//!   store identity (a new one is made at open), so no log segment of the store being
//!   replaced is ever replayed into it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use redb::{Database, Durability, ReadableTable, TableHandle, WriteTransaction};

use palisade_token::Epoch;

use super::backup::{BackupInfo, BACKUP_INFO, INFO_KEY};
use super::{check_tables, open_existing, remove_leftover, OfflineError};
use crate::redb_backend::raise::{raise, After};
use crate::redb_backend::schema::{
    Fault, META, META_CHECKPOINT_SEQ, META_STORE_ID_HI, META_STORE_ID_LO,
};

/// META key: when the last restore happened (seconds since the Unix epoch).
pub(crate) const META_RESTORED_AT: &str = "restored_at_unix";

/// What the caller decided: the floor, and lock names known from elsewhere (the data
/// directory being replaced, the epoch ledger) that the backup may not contain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestorePlan {
    pub floor: Epoch,
    pub locks: BTreeSet<String>,
    pub restored_at_unix: u64,
    /// The restored file starts at this commit sequence number at least (the highest the
    /// data directory saw), so that the start-up check does not take it for an older copy.
    pub commit_seq: u64,
}

/// What [`StagedRestore::apply`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    pub floor: Epoch,
    pub locks_floored: usize,
    pub namespaces_fenced: usize,
    pub leases_dropped: usize,
}

/// A backup copied to a staging file, opened and checked, not yet rewritten.
pub struct StagedRestore {
    db: Database,
    path: PathBuf,
    info: BackupInfo,
}

impl StagedRestore {
    /// Copies `backup` to `staging` (replacing a leftover), fsyncs it, opens it with full
    /// checksum verification and reads its [`BackupInfo`].
    pub fn stage(backup: &Path, staging: &Path) -> Result<StagedRestore, OfflineError> {
        if !backup.exists() {
            return Err(OfflineError::Missing {
                path: backup.display().to_string(),
            });
        }
        remove_leftover(staging)?;
        std::fs::copy(backup, staging).map_err(|e| OfflineError::io(staging, e))?;
        std::fs::File::open(staging)
            .and_then(|f| f.sync_all())
            .map_err(|e| OfflineError::io(staging, e))?;
        let rename_to_backup = |e: OfflineError| match e {
            OfflineError::Damaged { reason, .. } => OfflineError::Damaged {
                path: backup.display().to_string(),
                reason,
            },
            other => other,
        };
        let db = open_existing(staging).map_err(rename_to_backup)?;
        let info = read_info(&db).map_err(|fault| OfflineError::NotABackup {
            path: backup.display().to_string(),
            reason: fault.0,
        })?;
        Ok(StagedRestore {
            db,
            path: staging.to_owned(),
            info,
        })
    }

    pub fn info(&self) -> &BackupInfo {
        &self.info
    }

    /// Rewrites the staged copy for `plan` in one durable transaction and closes it. The
    /// staging file is then ready to be renamed over the live database file.
    pub fn apply(self, plan: &RestorePlan) -> Result<Restored, OfflineError> {
        let rewrite = || -> Result<Restored, Fault> {
            let mut txn = self.db.begin_write()?;
            txn.set_durability(Durability::Immediate);
            txn.set_two_phase_commit(true);
            let restored = rewrite(&txn, plan)?;
            txn.delete_table(BACKUP_INFO)?;
            txn.commit()?;
            Ok(restored)
        };
        let restored = rewrite().map_err(|fault| OfflineError::Io {
            path: self.path.display().to_string(),
            reason: fault.0,
        })?;
        drop(self.db);
        Ok(restored)
    }
}

pub(super) fn read_info(db: &Database) -> Result<BackupInfo, Fault> {
    let txn = db.begin_read()?;
    check_tables(&txn, &[BACKUP_INFO.name()])?;
    let table = txn
        .open_table(BACKUP_INFO)
        .map_err(|_| Fault("it has no backup_info record".to_string()))?;
    let record = table
        .get(INFO_KEY)?
        .ok_or_else(|| Fault("its backup_info record is empty".to_string()))?;
    Ok(serde_json::from_str(record.value())?)
}

fn rewrite(txn: &WriteTransaction, plan: &RestorePlan) -> Result<Restored, Fault> {
    let floor = plan.floor;
    let raised = raise(txn, floor, &plan.locks, After::Restore)?;
    let mut meta = txn.open_table(META)?;
    meta.insert(META_RESTORED_AT, plan.restored_at_unix)?;
    let seq = meta.get(META_CHECKPOINT_SEQ)?.map_or(0, |g| g.value());
    meta.insert(META_CHECKPOINT_SEQ, seq.max(plan.commit_seq))?;
    // A new identity: log segments of the store being replaced are never replayed into
    // the restored one (opening names and refuses them).
    meta.remove(META_STORE_ID_HI)?;
    meta.remove(META_STORE_ID_LO)?;
    Ok(Restored {
        floor,
        locks_floored: raised.locks,
        namespaces_fenced: raised.namespaces,
        leases_dropped: raised.leases_dropped,
    })
}
