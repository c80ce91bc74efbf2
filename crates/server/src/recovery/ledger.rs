//! The epoch ledger: what the data directory knows about issued epochs, kept outside the
//! database file.
//!
//! `epoch-ledger.json` records, per lock, the highest epoch the database was seen to have
//! reached, and overall the highest epoch known (`floor`). It is written atomically
//! (temporary file, fsync, rename, fsync of the directory) by every server start and
//! graceful stop, by `palisade admin backup` and by `palisade admin restore`, and it only
//! ever goes up.
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

use std::collections::BTreeMap;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use palisade_storage::redb_backend::offline::EpochSummary;
use palisade_token::Epoch;

/// Ledger file name inside the data directory.
pub const LEDGER_FILE: &str = "epoch-ledger.json";
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
}

pub fn path(dir: &Path) -> PathBuf {
    dir.join(LEDGER_FILE)
}

impl EpochLedger {
    /// Reads the ledger of `dir`: `Ok(None)` if there is none, an error naming the file if
    /// it cannot be read or parsed.
    pub fn load(dir: &Path) -> Result<Option<EpochLedger>, String> {
        let file = path(dir);
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read epoch ledger {}: {e}", file.display())),
        };
        let ledger: EpochLedger = serde_json::from_str(&text)
            .map_err(|e| format!("epoch ledger {} is damaged: {e}", file.display()))?;
        if ledger.version != VERSION {
            return Err(format!(
                "epoch ledger {} has version {}, this build reads {VERSION}",
                file.display(),
                ledger.version
            ));
        }
        Ok(Some(ledger))
    }

    /// Raises the ledger to what `summary` says; never lowers anything.
    pub fn merge(&mut self, summary: &EpochSummary) {
        for (lock, epoch) in &summary.locks {
            self.raise(lock, *epoch);
        }
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
        let file = path(dir);
        let tmp = dir.join(format!("{LEDGER_FILE}.tmp"));
        let err = |e: std::io::Error| format!("cannot write epoch ledger {}: {e}", file.display());
        let text = serde_json::to_vec_pretty(self)
            .map_err(|e| format!("cannot encode epoch ledger: {e}"))?;
        {
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut out = options.open(&tmp).map_err(err)?;
            out.write_all(&text).map_err(err)?;
            out.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, &file).map_err(err)?;
        sync_dir(dir).map_err(err)
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
    fn a_damaged_ledger_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path()), "{not json").unwrap();
        let err = EpochLedger::load(dir.path()).unwrap_err();
        assert!(err.contains(LEDGER_FILE), "{err}");
    }
}
