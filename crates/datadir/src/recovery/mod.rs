//! # Recovery: backup, restore and the start-up checks that keep epochs monotonic (S11)
//!
//! A backup is older than the state it will one day replace: it does not know the epochs
//! issued after it. Restoring it as it is would let the issuer hand out those epochs a
//! second time, and let the store admit tokens it had already fenced out. Recovery has to
//! keep both ends of the protocol, so this module:
//!
//! - [`backup`]: copies the database of a stopped server into a backup file (one
//!   consistent snapshot, with its metadata), and refreshes the [epoch ledger](ledger);
//! - [`restore`]: puts a backup in place with every lock's counter and every namespace's
//!   high-water mark raised to one floor, chosen above every epoch that may have been
//!   issued, and with the backup's lease records dropped (see [`restore`] for the rule);
//! - [`check_before_open`] and [`check_and_refresh`]: a server refuses to start on a data
//!   directory whose database is missing or behind its ledger; while it serves, it raises
//!   the ledger every few seconds ([`spawn_ledger_refresh`]) and at a graceful stop.
//!
//! ## Invariants
//! - Both commands are offline: they hold redb's lock on the database file, so they
//!   refuse to run while a server has it open, and no server can start meanwhile.
//! - The ledger only goes up, and is durable before the restored file is put in place.
//! - The restored file replaces the old one by an atomic rename; the old file is kept
//!   beside it (`palisade.redb.replaced-<time>`).
//!
//! ## What this does not guarantee
//! - When the database being replaced cannot be read, the epochs issued after the
//!   ledger's last update are unknown. The restore then assumes there were fewer than the
//!   gap (default 1,000,000); `--epoch-floor` states a known bound instead. A lock created
//!   after the ledger's last update is unknown to the restore and starts again from the
//!   floor only if the issuer applies one to new locks; see `docs/operations.md`.
//! - Losing the whole data directory loses the ledger too. Keep each backup's printed
//!   metadata, and a copy of the ledger, somewhere else.

pub mod ledger;
pub mod online;
mod restore;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use crate::now_unix;
use std::time::Duration;

use tokio::task::JoinHandle;

use palisade_storage::redb_backend::offline::{BackupInfo, OfflineDb, OfflineError};
use palisade_storage::redb_backend::RedbBackend;

pub use self::ledger::EpochLedger;
pub use self::restore::{restore, CurrentState, RestoreOptions, RestoreReport, DEFAULT_EPOCH_GAP};
use crate::DB_FILE;

/// Why a backup or restore did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error(transparent)]
    Offline(#[from] OfflineError),
    #[error("{0}")]
    Ledger(String),
    /// The restore would not be safe as asked.
    #[error("{0}")]
    Refused(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// Backs up the database of the stopped server in `data_dir` to `out` (which must not
/// exist), and raises the data directory's ledger to what the database holds.
pub fn backup(data_dir: &Path, out: &Path) -> Result<BackupInfo, RecoveryError> {
    let db = OfflineDb::open(&data_dir.join(DB_FILE))?;
    let (mut ledger, _) =
        EpochLedger::load_onto(data_dir, db.summary()?).map_err(RecoveryError::Ledger)?;
    ledger
        .store(data_dir, now_unix())
        .map_err(RecoveryError::Ledger)?;
    let id = hex::encode(rand::random::<[u8; 8]>());
    Ok(db.backup_to(out, &id, now_unix())?)
}

/// Before the database is opened: a data directory whose ledger records issued epochs
/// but whose database file is gone must not start afresh at epoch 1.
pub fn check_before_open(data_dir: &Path) -> Result<(), String> {
    let Some(ledger) = EpochLedger::load(data_dir)? else {
        return Ok(());
    };
    let db = data_dir.join(DB_FILE);
    if ledger.floor > 0 && !db.exists() {
        return Err(format!(
            "{} is missing, but the epoch ledger {} records epochs up to {}: starting with an \
             empty database would issue them again. Restore a backup with `palisade admin \
             restore --data-dir {} --from <backup>`",
            db.display(),
            ledger::path(data_dir).display(),
            ledger.floor,
            data_dir.display()
        ));
    }
    Ok(())
}

/// After the database is opened, before serving: refuses a database that is behind the
/// ledger (fewer commits than the ledger saw durable, or a lock's epoch below the ledger's),
/// then raises the ledger to the database.
pub async fn check_and_refresh(data_dir: &Path, backend: &RedbBackend) -> Result<(), String> {
    let (ledger, compared, db_commit_seq) = onto_database(data_dir, backend).await?;
    let behind = |what: String| {
        format!(
            "{} is behind the epoch ledger {}: {what}. The file was replaced by an older copy \
             or lost commits, and serving it would issue epochs a second time and admit \
             tokens it had fenced out. Restore with `palisade admin restore --data-dir {} \
             --from <file>`, which raises every epoch above the ledger",
            data_dir.join(DB_FILE).display(),
            ledger::path(data_dir).display(),
            data_dir.display()
        )
    };
    if db_commit_seq < compared.commit_seq {
        return Err(behind(format!(
            "the ledger saw commit {} durable, but the database holds commits only up to {}",
            compared.commit_seq, db_commit_seq
        )));
    }
    if let Some((lock, db, known)) = compared.first_behind {
        return Err(behind(format!(
            "lock {lock:?} reached epoch {known}, but the database says {db}"
        )));
    }
    store_if_changed(data_dir, ledger, &compared)
}

/// The data directory's ledger read onto what the live database holds (see
/// [`EpochLedger::load_onto`]), how they compared, and the database's commit sequence
/// number.
async fn onto_database(
    data_dir: &Path,
    backend: &RedbBackend,
) -> Result<(EpochLedger, ledger::Compared, u64), String> {
    let mut summary = backend.epoch_summary().await.map_err(|e| e.to_string())?;
    summary.commit_seq = backend.commit_seq();
    let db_commit_seq = summary.commit_seq;
    let (ledger, compared) = EpochLedger::load_onto(data_dir, summary)?;
    Ok((ledger, compared, db_commit_seq))
}

/// Writes the merged ledger when it says more than the file. A clean stop already wrote
/// what the database holds: at a million locks, rewriting an unchanged file would cost
/// seconds and tens of megabytes at every start.
fn store_if_changed(
    data_dir: &Path,
    mut ledger: EpochLedger,
    compared: &ledger::Compared,
) -> Result<(), String> {
    if compared.changed {
        ledger.store(data_dir, now_unix())?;
    }
    Ok(())
}

/// How often a running server raises the ledger to its database.
pub const LEDGER_REFRESH: Duration = Duration::from_secs(10);
/// How often a running server records its newest durable commit in the witness (see
/// `palisade_storage::redb_backend::witness`): a copy of the data directory older than
/// this before a crash is recognised.
pub const WITNESS_REFRESH: Duration = Duration::from_secs(1);

/// While serving: records the newest durable commit in the witness every
/// [`WITNESS_REFRESH`], and raises the ledger's floor and commit sequence number every
/// [`LEDGER_REFRESH`] to what the database has durably reached, so that a restore over a
/// database lost later knows the epochs issued up to a few seconds before the loss, and a
/// database that comes back older is recognised. Costs a few atomic loads per period, and
/// a small file write when something moved: no scan of the database (see [`ledger`]).
/// Stops when the returned handle is aborted.
pub fn spawn_ledger_refresh(data_dir: PathBuf, backend: RedbBackend) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut written = (0, 0);
        let mut witnessed = backend.commit_seq();
        let ledger_every = (LEDGER_REFRESH.as_millis() / WITNESS_REFRESH.as_millis()).max(1);
        for tick in 1u128.. {
            tokio::time::sleep(WITNESS_REFRESH).await;
            let seq = backend.commit_seq();
            if seq != witnessed {
                let store = backend.clone();
                match tokio::task::spawn_blocking(move || store.refresh_witness()).await {
                    Ok(Ok(())) => witnessed = seq,
                    Ok(Err(e)) => tracing::warn!(error = %e, "could not update the witness"),
                    Err(e) => tracing::warn!(error = %e, "could not update the witness"),
                }
            }
            if tick % ledger_every != 0 {
                continue;
            }
            let now = (backend.committed_epoch_max(), backend.commit_seq());
            if now == written {
                continue;
            }
            let dir = data_dir.clone();
            let stored = tokio::task::spawn_blocking(move || {
                ledger::store_floor(&dir, now.0, now.1, now_unix())
            })
            .await;
            match stored {
                Ok(Ok(())) => written = now,
                Ok(Err(e)) => tracing::warn!(error = %e, "could not update the epoch floor"),
                Err(e) => tracing::warn!(error = %e, "could not update the epoch floor"),
            }
        }
    })
}

/// Raises the ledger to the database, best effort (a failure is logged).
pub async fn refresh(data_dir: &Path, backend: &RedbBackend) {
    let refreshed = async {
        let (ledger, compared, _) = onto_database(data_dir, backend).await?;
        store_if_changed(data_dir, ledger, &compared)
    };
    if let Err(e) = refreshed.await {
        tracing::warn!(error = %e, "could not update the epoch ledger");
    }
}
