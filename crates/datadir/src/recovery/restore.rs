//! The restore procedure of a data directory.
//!
//! The floor every lock's counter and every namespace's mark are raised to is
//!
//! ```text
//! floor = max(backup's highest epoch,
//!             highest epoch in the database being replaced, if it can be read,
//!             the ledger's floor,
//!             the witness's horizon, when the directory keeps a witness,
//!             --epoch-floor) + --epoch-gap
//! ```
//!
//! so the next acquisition of any known lock gets `floor + 1`. The witness's horizon
//! bounds every epoch the store ever wrote, wherever the directory was put back from
//! (`palisade_storage::redb_backend::witness`), and the restored database starts past
//! every commit the witness saw, so that it opens against it. Without a witness: when the
//! database being replaced can be read and was not itself put back from an older copy, the
//! first three terms cover every epoch issued by this directory and the gap is a margin;
//! when it cannot be read, epochs issued after the ledger's last update are unknown and
//! the gap is the assumption that there were fewer than that; the report carries a loud
//! warning saying so.
//!
//! Raising the marks fences out every token issued before the restore, also the ones the
//! store had fenced out after the backup was taken, and also the current holders' (the
//! backup cannot tell who they are). Lease records are dropped for the same reason: a
//! lease from the backup names a holder of the past, and honouring it would let that
//! holder renew an old epoch. After a restore every holder acquires again.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Serialize;

use palisade_storage::redb_backend::offline::{
    BackupInfo, OfflineDb, OfflineError, RestorePlan, Restored, StagedRestore,
};
use palisade_storage::redb_backend::witness;
use palisade_token::Epoch;

use super::ledger::{self, EpochLedger, LedgerRestore};
use super::{now_unix, RecoveryError};
use crate::DB_FILE;
use palisade_storage::atomic_file::sync_dir;

/// The default margin above the highest known epoch.
pub const DEFAULT_EPOCH_GAP: Epoch = 1_000_000;
/// Largest floor a restore sets, so counters keep room to grow.
const MAX_FLOOR: Epoch = 1 << 62;

/// How to restore.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// The backup file.
    pub from: PathBuf,
    /// A bound the operator knows: no epoch above it was ever issued.
    pub epoch_floor: Option<Epoch>,
    /// Margin added above the highest known epoch.
    pub epoch_gap: Epoch,
    /// The data directory's witness, if it keeps one: its horizon bounds every epoch the
    /// store ever wrote, and the restored database starts past every commit it saw.
    pub witness: Option<PathBuf>,
}

/// What was known about the database being replaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CurrentState {
    /// `epoch_bound`: no lock of it had an epoch above this (counting reservation
    /// ceilings).
    Readable {
        epoch_bound: Epoch,
        locks: usize,
    },
    Missing,
    Unreadable {
        reason: String,
    },
}

/// What a restore did, printed by the CLI as JSON.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    pub backup: BackupInfo,
    pub current: CurrentState,
    pub ledger_floor: Option<Epoch>,
    /// The witness's horizon, when the data directory keeps a witness.
    pub witness_horizon: Option<Epoch>,
    pub operator_floor: Option<Epoch>,
    pub epoch_gap: Epoch,
    /// Every known lock's counter and namespace's mark are at least this.
    pub floor: Epoch,
    /// The epoch the next acquisition of a known lock gets.
    pub next_epoch: Epoch,
    pub locks_floored: usize,
    pub namespaces_fenced: usize,
    pub leases_dropped: usize,
    /// Where the replaced database file was kept, if there was one.
    pub replaced_file: Option<PathBuf>,
    pub warnings: Vec<String>,
}

/// Restores `opts.from` into `data_dir` (server stopped). See the module docs.
pub fn restore(data_dir: &Path, opts: &RestoreOptions) -> Result<RestoreReport, RecoveryError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| RecoveryError::Io { path, source }
    };
    std::fs::create_dir_all(data_dir).map_err(io(data_dir))?;
    let db_path = data_dir.join(DB_FILE);
    let mut warnings = Vec::new();

    // Held until the new file is in place: no server can open the old one meanwhile.
    let (current_db, current, current_locks, current_seq) = match OfflineDb::open(&db_path) {
        Ok(db) => match db.summary() {
            Ok(summary) => {
                let state = CurrentState::Readable {
                    epoch_bound: summary.max(),
                    locks: summary.locks.len(),
                };
                let seq = summary.commit_seq;
                (Some(db), state, summary.locks.into_keys().collect(), seq)
            }
            Err(e) => (Some(db), unreadable(e), BTreeSet::new(), 0),
        },
        Err(e @ OfflineError::Busy { .. }) => return Err(e.into()),
        Err(OfflineError::Missing { .. }) => (None, CurrentState::Missing, BTreeSet::new(), 0),
        Err(e) => (None, unreadable(e), BTreeSet::new(), 0),
    };
    let witnessed = match opts.witness.as_deref().map(witness::load) {
        None | Some(witness::Found::Missing) => None,
        Some(witness::Found::Witness(w)) => Some(w),
        Some(witness::Found::Damaged(why)) => {
            return Err(RecoveryError::Refused(format!(
                "the witness {} cannot be used ({why}): put the right file back, or remove it \
                 (the restore then knows only the database and the ledger)",
                opts.witness.as_deref().unwrap_or(Path::new("")).display()
            )))
        }
    };
    let (ledger, ledger_known) = match EpochLedger::load(data_dir) {
        Ok(found) => (found.clone().unwrap_or_default(), found.is_some()),
        Err(e) => {
            warnings.push(format!(
                "{e}; its floor is unknown and it will be replaced (kept as .damaged)"
            ));
            let aside = data_dir.join(format!("{}.damaged", ledger::LEDGER_FILE));
            std::fs::rename(ledger::path(data_dir), &aside).map_err(io(&aside))?;
            (EpochLedger::default(), false)
        }
    };

    // Removed on every way out but the last rename (`Staging`).
    let staging = Staging::new(data_dir.join(format!("{DB_FILE}.restoring")));
    let staged = StagedRestore::stage(&opts.from, staging.path())?;
    let backup = staged.info().clone();

    let known = Known {
        backup: &backup,
        current: &current,
        current_locks,
        current_seq,
        ledger: ledger_known.then_some(&ledger),
        witness: witnessed.as_ref().map(|w| (w.horizon, w.commit_seq)),
    };
    let decided = decide(known, opts, &db_path, now_unix())?;
    warnings.extend(decided.warning.clone());
    let Decided {
        floor,
        locks,
        commit_seq,
        restored_at_unix,
        ..
    } = decided;
    let plan = RestorePlan {
        floor,
        locks: locks.clone(),
        restored_at_unix,
        commit_seq,
    };
    let Restored {
        locks_floored,
        namespaces_fenced,
        leases_dropped,
        ..
    } = staged.apply(&plan)?;

    // The ledger first: if we stop before the rename, the old file is behind the ledger
    // and the server refuses it until the restore is run again.
    let mut new_ledger = ledger.clone();
    for lock in &locks {
        new_ledger.raise(lock, floor);
    }
    new_ledger.floor = new_ledger.floor.max(floor);
    new_ledger.commit_seq = commit_seq;
    new_ledger.last_restore = Some(LedgerRestore {
        backup_id: backup.backup_id.clone(),
        floor,
        at_unix: restored_at_unix,
    });
    new_ledger
        .store(data_dir, restored_at_unix)
        .map_err(RecoveryError::Ledger)?;

    let replaced_file = match current {
        CurrentState::Missing => None,
        _ => {
            let aside = data_dir.join(format!("{DB_FILE}.replaced-{restored_at_unix}"));
            if std::fs::hard_link(&db_path, &aside).is_err() {
                std::fs::copy(&db_path, &aside).map_err(io(&aside))?;
            }
            Some(aside)
        }
    };
    // The log of the database being replaced (left only when that database could not be
    // read and replayed) is kept aside, under names the restored store does not read.
    let log_prefix = format!("{DB_FILE}.wal.");
    for entry in std::fs::read_dir(data_dir).map_err(io(data_dir))? {
        let name = entry.map_err(io(data_dir))?.file_name();
        let name = name.to_string_lossy();
        if let Some(rest) = name.strip_prefix(&log_prefix) {
            if rest == "spare" {
                continue;
            }
            let aside = data_dir.join(format!("{DB_FILE}.replaced-{restored_at_unix}.wal.{rest}"));
            std::fs::rename(data_dir.join(name.as_ref()), &aside).map_err(io(&aside))?;
        }
    }
    staging.put_in_place(&db_path).map_err(io(&db_path))?;
    sync_dir(data_dir).map_err(io(data_dir))?;
    drop(current_db);

    Ok(RestoreReport {
        backup,
        current,
        ledger_floor: ledger_known.then_some(ledger.floor),
        witness_horizon: witnessed.as_ref().map(|w| w.horizon),
        operator_floor: opts.epoch_floor,
        epoch_gap: opts.epoch_gap,
        floor,
        next_epoch: floor + 1,
        locks_floored,
        namespaces_fenced,
        leases_dropped,
        replaced_file,
        warnings,
    })
}

/// Every bound on the epochs issued that a restore knows of, gathered from the disk.
struct Known<'a> {
    backup: &'a BackupInfo,
    current: &'a CurrentState,
    /// The locks of the database being replaced (none when it cannot be read).
    current_locks: BTreeSet<String>,
    /// Its commit sequence number (0 when it cannot be read).
    current_seq: u64,
    /// The ledger, when there is a readable one.
    ledger: Option<&'a EpochLedger>,
    /// The witness's horizon and commit sequence number, when there is one.
    witness: Option<(Epoch, u64)>,
}

/// What a restore does, decided from [`Known`] and the options alone (no disk).
#[derive(Debug, PartialEq, Eq)]
struct Decided {
    /// Every known lock's counter and every namespace's mark are raised to it.
    floor: Epoch,
    /// The known locks: the backup's, the replaced database's and the ledger's.
    locks: BTreeSet<String>,
    /// The restored database starts at this commit sequence number: past every commit
    /// the ledger, the replaced database, the backup or the witness saw.
    commit_seq: u64,
    restored_at_unix: u64,
    /// Said loudly when the epochs issued are not all known (see the module docs).
    warning: Option<String>,
}

/// The floor, the locks and the commit sequence number of a restore (the module docs give
/// the rule), or the refusal: the epochs issued are unknown and nothing bounds them, or
/// the floor would leave the counters no room.
fn decide(
    known: Known<'_>,
    opts: &RestoreOptions,
    db_path: &Path,
    now_unix: u64,
) -> Result<Decided, RecoveryError> {
    let empty = EpochLedger::default();
    let ledger = known.ledger.unwrap_or(&empty);
    let known_max = [
        known.backup.epoch_bound,
        match known.current {
            CurrentState::Readable { epoch_bound, .. } => *epoch_bound,
            _ => 0,
        },
        ledger.floor,
        known.witness.map_or(0, |(horizon, _)| horizon),
        opts.epoch_floor.unwrap_or(0),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    // The witness bounds every epoch ever written: with it, nothing is unknown.
    let state_known =
        matches!(known.current, CurrentState::Readable { .. }) || known.witness.is_some();
    let mut warning = None;
    if !state_known && opts.epoch_floor.is_none() {
        if opts.epoch_gap == 0 {
            return Err(RecoveryError::Refused(format!(
                "the database being replaced ({}) cannot be read, so the epochs it issued are \
                 unknown: give --epoch-floor N (no epoch above N was ever issued) or a \
                 non-zero --epoch-gap",
                db_path.display()
            )));
        }
        warning = Some(unknown_state_warning(
            db_path,
            known.current,
            known.ledger,
            opts.epoch_gap,
        ));
    }
    let floor = known_max
        .checked_add(opts.epoch_gap)
        .filter(|f| *f <= MAX_FLOOR)
        .ok_or_else(|| {
            RecoveryError::Refused(format!(
                "epoch floor {known_max} + gap {} exceeds {MAX_FLOOR}",
                opts.epoch_gap
            ))
        })?;
    let mut locks: BTreeSet<String> = known.backup.epoch_bounds.keys().cloned().collect();
    locks.extend(known.current_locks);
    locks.extend(ledger.locks.keys().cloned());
    let commit_seq = [
        ledger.commit_seq,
        known.current_seq,
        known.backup.commit_seq,
        known.witness.map_or(0, |(_, seq)| seq),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    Ok(Decided {
        floor,
        locks,
        commit_seq,
        restored_at_unix: now_unix,
        warning,
    })
}

/// The staged database file: removed when dropped, unless it was put in place.
struct Staging {
    path: PathBuf,
    placed: bool,
}

impl Staging {
    fn new(path: PathBuf) -> Self {
        Staging {
            path,
            placed: false,
        }
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// Renames it over `db_path`; from then on it is the database, not a leftover.
    fn put_in_place(mut self, db_path: &Path) -> std::io::Result<()> {
        std::fs::rename(&self.path, db_path)?;
        self.placed = true;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.placed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn unreadable(e: OfflineError) -> CurrentState {
    CurrentState::Unreadable {
        reason: e.to_string(),
    }
}

fn unknown_state_warning(
    db: &Path,
    current: &CurrentState,
    ledger: Option<&EpochLedger>,
    gap: Epoch,
) -> String {
    let what = match current {
        CurrentState::Unreadable { reason } => reason.clone(),
        _ => format!("{} is missing", db.display()),
    };
    let since = match ledger {
        Some(l) => format!(
            "the epoch ledger was last updated at {} (unix time) with floor {}",
            l.updated_at_unix, l.floor
        ),
        None => "there is no epoch ledger either".to_string(),
    };
    format!(
        "UNSAFE UNLESS YOU CHECK: {what}, so the epochs issued since the backup are \
         unknown; {since}. This restore assumes fewer than {gap} \
         epochs were issued after that. If more may have been, run it again with \
         --epoch-floor N (N at least every epoch ever issued). Locks created after the \
         ledger's last update are not known to this restore."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(epoch_bound: Epoch, locks: &[&str], commit_seq: u64) -> BackupInfo {
        BackupInfo {
            backup_id: "b".into(),
            created_at_unix: 1,
            source: "palisade.redb".into(),
            format_version: 1,
            epoch_bound,
            epoch_bounds: locks.iter().map(|l| (l.to_string(), epoch_bound)).collect(),
            keys: 0,
            namespaces: 0,
            commit_seq,
        }
    }

    fn opts(epoch_floor: Option<Epoch>, epoch_gap: Epoch) -> RestoreOptions {
        RestoreOptions {
            from: PathBuf::from("backup"),
            epoch_floor,
            epoch_gap,
            witness: None,
        }
    }

    fn readable(epoch_bound: Epoch) -> CurrentState {
        CurrentState::Readable {
            epoch_bound,
            locks: 1,
        }
    }

    fn known<'a>(
        backup: &'a BackupInfo,
        current: &'a CurrentState,
        ledger: Option<&'a EpochLedger>,
        witness: Option<(Epoch, u64)>,
    ) -> Known<'a> {
        Known {
            backup,
            current,
            current_locks: ["current".to_string()].into(),
            current_seq: 7,
            ledger,
            witness,
        }
    }

    const DB: &str = "/data/palisade.redb";

    #[test]
    fn the_floor_is_the_highest_bound_plus_the_gap_over_every_known_lock() {
        let backup = backup(50, &["a", "b"], 3);
        let mut ledger = EpochLedger::default();
        ledger.raise("from-ledger", 90);
        ledger.commit_seq = 12;
        for (current, witness, floor, expect) in [
            (readable(70), None, None, 90),
            (readable(120), None, None, 120),
            (readable(70), Some((200, 1)), None, 200),
            (readable(70), None, Some(300), 300),
        ] {
            let decided = decide(
                known(&backup, &current, Some(&ledger), witness),
                &opts(floor, 1000),
                Path::new(DB),
                42,
            )
            .unwrap();
            assert_eq!(decided.floor, expect + 1000);
            assert_eq!(decided.warning, None);
            assert_eq!(decided.restored_at_unix, 42);
            let locks: Vec<&str> = decided.locks.iter().map(String::as_str).collect();
            assert_eq!(locks, ["a", "b", "current", "from-ledger"]);
            // Past every commit anything saw: the ledger's 12 beats the current 7.
            assert_eq!(decided.commit_seq, 12);
        }
    }

    #[test]
    fn the_restored_database_starts_past_the_witness_commits() {
        let backup = backup(5, &[], 3);
        let current = readable(5);
        let decided = decide(
            known(&backup, &current, None, Some((10, 99))),
            &opts(None, 0),
            Path::new(DB),
            1,
        )
        .unwrap();
        assert_eq!((decided.floor, decided.commit_seq), (10, 99));
    }

    #[test]
    fn unknown_epochs_are_refused_without_a_floor_or_a_gap_and_warned_with_a_gap() {
        let backup = backup(5, &[], 0);
        let current = CurrentState::Unreadable {
            reason: "damaged".into(),
        };
        let refused = decide(
            known(&backup, &current, None, None),
            &opts(None, 0),
            Path::new(DB),
            1,
        );
        let Err(RecoveryError::Refused(why)) = refused else {
            panic!("expected a refusal, got {refused:?}");
        };
        assert!(why.contains(DB) && why.contains("--epoch-floor"), "{why}");

        let warned = decide(
            known(&backup, &current, None, None),
            &opts(None, 1000),
            Path::new(DB),
            1,
        )
        .unwrap();
        assert_eq!(warned.floor, 1005);
        // It names why the epochs are unknown and the gap it assumes.
        assert!(warned
            .warning
            .is_some_and(|w| w.contains("damaged") && w.contains("fewer than 1000")));

        // An operator's bound, or a witness, makes them known: no warning.
        for (floor, witness) in [(Some(8), None), (None, Some((9, 0)))] {
            let decided = decide(
                known(&backup, &current, None, witness),
                &opts(floor, 0),
                Path::new(DB),
                1,
            )
            .unwrap();
            assert_eq!(decided.warning, None);
        }
    }

    #[test]
    fn a_floor_that_leaves_the_counters_no_room_is_refused() {
        let backup = backup(MAX_FLOOR, &[], 0);
        let current = readable(1);
        let refused = decide(
            known(&backup, &current, None, None),
            &opts(None, 1),
            Path::new(DB),
            1,
        );
        assert!(matches!(refused, Err(RecoveryError::Refused(why)) if why.contains("exceeds")));
    }

    #[test]
    fn a_staged_file_is_removed_unless_it_was_put_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let staged = dir.path().join("staged");
        std::fs::write(&staged, b"x").unwrap();
        drop(Staging::new(staged.clone()));
        assert!(!staged.exists(), "dropped: removed");

        std::fs::write(&staged, b"x").unwrap();
        let db = dir.path().join("db");
        Staging::new(staged.clone()).put_in_place(&db).unwrap();
        assert!(
            db.exists() && !staged.exists(),
            "put in place: kept, as the database"
        );
    }
}
