//! The epoch ledger: what the data directory knows about issued epochs, kept outside the
//! database file.
//!
//! `epoch-ledger.json` records, per lock, the highest epoch the database was seen to have
//! reached, and overall the highest epoch known (`floor`). It is written atomically
//! (temporary file, fsync, rename, fsync of the directory) by every server start and
//! graceful stop, by `palisade admin backup` and by `palisade admin restore`, and it only
//! ever goes up.
//!
//! It also records the database's **commit sequence number** (every commit of the storage
//! engine has the next one): a database that opens holding fewer commits than the ledger
//! saw came back older than what it acknowledged, and the server refuses it.
//!
//! It exists for two reasons:
//! - a restore over a database that cannot be read still knows a lower bound for the
//!   epochs issued, and the names of the locks that had them;
//! - a server refuses to start on a database that is behind the ledger (a file replaced
//!   by an older copy without `admin restore`, or a missing file), since serving it would
//!   issue some epochs a second time.
//!
//! It is a lower bound, not a record of every grant: epochs issued after its last update
//! are not in it. That is what the restore's gap is for (see `docs/operations.md`).
//!
//! While a server runs, the per-lock map is not rewritten: at a million locks that would
//! mean a full scan of the database and a file of tens of megabytes every few seconds.
//! Instead the server keeps a small side file, `epoch-ledger.floor.json`, with the highest
//! epoch its commits have written (the writer tracks it, so no scan is needed), and
//! [`EpochLedger::load`] raises the ledger's `floor` to it. The per-lock map is brought up
//! to date at every start and graceful stop, by backups and by restores.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use palisade_storage::redb_backend::offline::EpochSummary;
use palisade_token::Epoch;

/// Ledger file name inside the data directory.
pub const LEDGER_FILE: &str = "epoch-ledger.json";
/// The running server's floor file (see the module docs).
pub const FLOOR_FILE: &str = "epoch-ledger.floor.json";
const VERSION: u32 = 1;

/// The last restore, as the ledger remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerRestore {
    pub backup_id: String,
    pub floor: Epoch,
    pub at_unix: u64,
}

/// See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochLedger {
    pub version: u32,
    /// The highest epoch known to have been issued (or set by a restore), any lock.
    pub floor: Epoch,
    /// The highest epoch known per lock.
    pub locks: BTreeMap<String, Epoch>,
    pub updated_at_unix: u64,
    #[serde(default)]
    pub last_restore: Option<LedgerRestore>,
    /// The newest commit (commit sequence number) the database was seen to hold durably.
    /// A database that opens with fewer commits came back older than what it acknowledged.
    #[serde(default)]
    pub commit_seq: u64,
}

pub fn path(dir: &Path) -> PathBuf {
    dir.join(LEDGER_FILE)
}

/// The floor side file: the highest epoch a running server's commits reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct FloorFile {
    version: u32,
    floor: Epoch,
    updated_at_unix: u64,
    #[serde(default)]
    commit_seq: u64,
}

/// Writes `floor` and `commit_seq` into the side file of `dir`, atomically (the ledger's
/// own `load` raises its floor and commit sequence number to them). Only ever called with
/// values the database has durably reached.
pub fn store_floor(dir: &Path, floor: Epoch, commit_seq: u64, now_unix: u64) -> Result<(), String> {
    let text = serde_json::to_vec(&FloorFile {
        version: VERSION,
        floor,
        updated_at_unix: now_unix,
        commit_seq,
    })
    .map_err(|e| format!("cannot encode the epoch floor: {e}"))?;
    write_atomically(dir, FLOOR_FILE, &text)
}

/// Reads the side file: `Ok(None)` when there is none.
fn load_floor(dir: &Path) -> Result<Option<FloorFile>, String> {
    read_versioned(&dir.join(FLOOR_FILE), "epoch floor", |f: &FloorFile| {
        f.version
    })
}

/// Reads a JSON file of this module: `Ok(None)` if it does not exist, an error naming it
/// (as `what`) if it cannot be read, does not parse or has another version.
fn read_versioned<T: serde::de::DeserializeOwned>(
    file: &Path,
    what: &str,
    version: impl Fn(&T) -> u32,
) -> Result<Option<T>, String> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {what} {}: {e}", file.display())),
    };
    let value: T = serde_json::from_str(&text)
        .map_err(|e| format!("{what} {} is damaged: {e}", file.display()))?;
    let found = version(&value);
    if found != VERSION {
        return Err(format!(
            "{what} {} has version {found}, this build reads {VERSION}",
            file.display()
        ));
    }
    Ok(Some(value))
}

/// Temporary file, fsync, rename over `name`, fsync of the directory.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    let file = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let err = |e: std::io::Error| format!("cannot write {}: {e}", file.display());
    {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut out = options.open(&tmp).map_err(err)?;
        out.write_all(bytes).map_err(err)?;
        out.sync_all().map_err(err)?;
    }
    std::fs::rename(&tmp, &file).map_err(err)?;
    sync_dir(dir).map_err(err)
}

impl EpochLedger {
    /// Reads the ledger of `dir`: `Ok(None)` if there is none, an error naming the file if
    /// it cannot be read or parsed. The floor side file, if any, raises `floor`.
    pub fn load(dir: &Path) -> Result<Option<EpochLedger>, String> {
        let side = load_floor(dir)?;
        let Some(mut ledger) = Self::load_main(dir)? else {
            return Ok(side.map(|side| EpochLedger {
                version: VERSION,
                floor: side.floor,
                updated_at_unix: side.updated_at_unix,
                commit_seq: side.commit_seq,
                ..EpochLedger::default()
            }));
        };
        if let Some(side) = side {
            if side.floor > ledger.floor {
                ledger.floor = side.floor;
                ledger.updated_at_unix = ledger.updated_at_unix.max(side.updated_at_unix);
            }
            ledger.commit_seq = ledger.commit_seq.max(side.commit_seq);
        }
        Ok(Some(ledger))
    }

    fn load_main(dir: &Path) -> Result<Option<EpochLedger>, String> {
        read_versioned(&path(dir), "epoch ledger", |l: &EpochLedger| l.version)
    }

    /// Raises the ledger to what `summary` says; never lowers anything.
    pub fn merge(&mut self, summary: &EpochSummary) {
        for (lock, epoch) in &summary.locks {
            self.raise(lock, *epoch);
        }
        self.commit_seq = self.commit_seq.max(summary.commit_seq);
    }

    /// Raises one lock (and the overall floor) to at least `epoch`.
    pub fn raise(&mut self, lock: &str, epoch: Epoch) {
        let slot = self.locks.entry(lock.to_owned()).or_default();
        *slot = (*slot).max(epoch);
        self.floor = self.floor.max(epoch);
    }

    /// The first lock whose database epoch is below the ledger's: (lock, database, ledger).
    pub fn first_behind(&self, summary: &EpochSummary) -> Option<(String, Epoch, Epoch)> {
        self.locks.iter().find_map(|(lock, &known)| {
            let db = summary.locks.get(lock).copied().unwrap_or(0);
            (db < known).then(|| (lock.clone(), db, known))
        })
    }

    /// Writes the ledger atomically into `dir`.
    pub fn store(&mut self, dir: &Path, now_unix: u64) -> Result<(), String> {
        self.version = VERSION;
        self.updated_at_unix = now_unix;
        let text = serde_json::to_vec_pretty(self)
            .map_err(|e| format!("cannot encode epoch ledger: {e}"))?;
        write_atomically(dir, LEDGER_FILE, &text)
    }
}

pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(locks: &[(&str, Epoch)]) -> EpochSummary {
        EpochSummary {
            locks: locks.iter().map(|(l, e)| (l.to_string(), *e)).collect(),
            commit_seq: 0,
        }
    }

    #[test]
    fn merges_upward_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(EpochLedger::load(dir.path()).unwrap(), None);
        let mut ledger = EpochLedger::default();
        ledger.merge(&summary(&[("a", 5), ("b", 2)]));
        ledger.merge(&summary(&[("a", 3), ("c", 9)]));
        assert_eq!(ledger.floor, 9);
        assert_eq!(ledger.locks["a"], 5);
        ledger.store(dir.path(), 7).unwrap();
        let back = EpochLedger::load(dir.path()).unwrap().unwrap();
        assert_eq!(back, ledger);
        assert_eq!(
            back.first_behind(&summary(&[("a", 5), ("b", 1), ("c", 9)])),
            Some(("b".to_string(), 1, 2))
        );
        assert_eq!(
            back.first_behind(&summary(&[("a", 6), ("b", 2), ("c", 9)])),
            None
        );
    }

    #[test]
    fn the_floor_file_raises_the_floor_and_never_lowers_it() {
        let dir = tempfile::tempdir().unwrap();
        store_floor(dir.path(), 40, 5, 1).unwrap();
        // A floor file alone is a ledger with a floor and no locks.
        let alone = EpochLedger::load(dir.path()).unwrap().unwrap();
        assert_eq!((alone.floor, alone.locks.len()), (40, 0));

        let mut ledger = EpochLedger::default();
        ledger.merge(&summary(&[("a", 7)]));
        ledger.store(dir.path(), 2).unwrap();
        let raised = EpochLedger::load(dir.path()).unwrap().unwrap();
        assert_eq!(
            (raised.floor, raised.locks["a"], raised.commit_seq),
            (40, 7, 5)
        );

        store_floor(dir.path(), 3, 2, 3).unwrap();
        ledger.merge(&summary(&[("a", 90)]));
        ledger.store(dir.path(), 4).unwrap();
        let kept = EpochLedger::load(dir.path()).unwrap().unwrap();
        assert_eq!(
            kept.floor, 90,
            "a lower floor file does not lower the ledger"
        );

        std::fs::write(dir.path().join(FLOOR_FILE), "{").unwrap();
        let err = EpochLedger::load(dir.path()).unwrap_err();
        assert!(err.contains(FLOOR_FILE), "{err}");
    }

    #[test]
    fn a_damaged_ledger_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path()), "{not json").unwrap();
        let err = EpochLedger::load(dir.path()).unwrap_err();
        assert!(err.contains(LEDGER_FILE), "{err}");
    }
}
