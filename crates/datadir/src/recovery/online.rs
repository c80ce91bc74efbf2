//! Backups while serving (`POST /v1/admin/backup`, `palisade admin backup --server`).
//!
//! One read transaction of the live database is copied into a file in the data
//! directory, the file is opened and unlinked at once (its data lives as long as the
//! open handle, so nothing is left behind, whatever happens to the request), and its
//! bytes are sent to the client. The snapshot holds every write committed before it
//! began and nothing after: requests keep being served while it is copied.
//!
//! The epoch ledger is raised to the database first, as the offline backup does, so that
//! a restore of this backup (or of any older one) knows the epochs issued up to now.
//!
//! ## What this does not do
//! - It does not copy the key set (`signing-keys.json`): see docs/operations.md.
//! - One backup at a time: a second request while one is being taken is refused with 429
//!   `quota_exceeded` (`resource: "concurrent_backups"`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use palisade_storage::redb_backend::offline::BackupInfo;
use palisade_storage::redb_backend::RedbBackend;

/// Takes backups of one running embedded server. See the module docs.
pub struct OnlineBackup {
    data_dir: PathBuf,
    backend: RedbBackend,
    busy: AtomicBool,
}

/// Why an online backup was not taken.
#[derive(Debug, thiserror::Error)]
pub enum OnlineBackupError {
    /// Another backup is being taken.
    #[error("another backup is being taken")]
    Busy,
    #[error("{0}")]
    Failed(String),
}

/// Clears the busy flag when a backup ends, however it ends.
struct Taking<'a>(&'a AtomicBool);

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl OnlineBackup {
    pub fn new(data_dir: PathBuf, backend: RedbBackend) -> OnlineBackup {
        OnlineBackup {
            data_dir,
            backend,
            busy: AtomicBool::new(false),
        }
    }

    /// Takes a snapshot; returns its metadata and the open (already unlinked) file.
    pub async fn take(&self) -> Result<(BackupInfo, std::fs::File), OnlineBackupError> {
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(OnlineBackupError::Busy);
        }
        let _taking = Taking(&self.busy);
        super::refresh(&self.data_dir, &self.backend).await;
        let id = hex::encode(rand::random::<[u8; 8]>());
        let out = self.data_dir.join(format!(".online-backup-{id}"));
        let info = self
            .backend
            .backup_to(&out, &id, super::now_unix())
            .await
            .map_err(|e| OnlineBackupError::Failed(e.to_string()))?;
        let file = std::fs::File::open(&out);
        // Unlinked whether or not it opened: the open handle keeps the data.
        let removed = std::fs::remove_file(&out);
        let file =
            file.map_err(|e| OnlineBackupError::Failed(format!("{}: {e}", out.display())))?;
        if let Err(e) = removed {
            tracing::warn!(file = %out.display(), error = %e, "could not remove a backup's temporary file");
        }
        tracing::info!(
            backup_id = %info.backup_id,
            epoch_bound = info.epoch_bound,
            keys = info.keys,
            "online backup taken"
        );
        Ok((info, file))
    }
}
