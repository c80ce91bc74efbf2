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
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use palisade_storage::atomic_file::read_versioned;
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

/// See the module docs. Read by [`EpochLedger::load_onto`] (one streamed pass, no
/// derived `Deserialize`), written by [`EpochLedger::store`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
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
    read_versioned(
        &dir.join(FLOOR_FILE),
        "epoch floor",
        VERSION,
        |f: &FloorFile| f.version,
    )
}

/// Writes `name` in `dir` so that a crash leaves the old file or the new one
/// ([`palisade_storage::atomic_file`]).
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    palisade_storage::atomic_file::write_atomic(dir, name, bytes)
        .map_err(|e| format!("cannot write {}: {e}", dir.join(name).display()))
}

impl EpochLedger {
    /// Reads the ledger of `dir`: `Ok(None)` if there is none, an error naming the file if
    /// it cannot be read or parsed. The floor side file, if any, raises `floor`.
    pub fn load(dir: &Path) -> Result<Option<EpochLedger>, String> {
        let (ledger, compared) = Self::load_onto(dir, EpochSummary::default())?;
        Ok(compared.found.then_some(ledger))
    }

    /// Reads the ledger of `dir` onto the database's `summary`, in one ordered pass over the
    /// file: the result is the ledger with every lock, the floor and the commit sequence
    /// number raised to the summary's (never lowered), built on the summary's own per-lock
    /// map, so that a million locks are
    /// held once and the file's text never is. Also says how the file compared with the
    /// summary ([`Compared`]); with neither a ledger nor a floor file, the ledger is the
    /// summary's alone.
    pub fn load_onto(dir: &Path, summary: EpochSummary) -> Result<(EpochLedger, Compared), String> {
        let side = load_floor(dir)?;
        let mut compared = Compared::default();
        let EpochSummary {
            mut locks,
            commit_seq,
        } = summary;
        let main = Self::load_main(dir, &mut locks, &mut compared)?;
        compared.found = main.is_some() || side.is_some();
        let mut ledger = main.unwrap_or(EpochLedger {
            version: VERSION,
            ..EpochLedger::default()
        });
        let file = (ledger.floor, ledger.commit_seq);
        if let Some(side) = side {
            if side.floor > ledger.floor {
                ledger.floor = side.floor;
                ledger.updated_at_unix = ledger.updated_at_unix.max(side.updated_at_unix);
            }
            ledger.commit_seq = ledger.commit_seq.max(side.commit_seq);
        }
        compared.commit_seq = ledger.commit_seq;
        ledger.commit_seq = ledger.commit_seq.max(commit_seq);
        ledger.floor = locks.values().copied().fold(ledger.floor, Epoch::max);
        compared.changed = compared.differs
            || locks.len() > compared.file_locks
            || (ledger.floor, ledger.commit_seq) != file
            || !compared.found;
        ledger.locks = locks;
        Ok((ledger, compared))
    }

    /// The ledger file itself, its locks raised onto `locks` as they are read.
    fn load_main(
        dir: &Path,
        locks: &mut BTreeMap<String, Epoch>,
        compared: &mut Compared,
    ) -> Result<Option<EpochLedger>, String> {
        let file = path(dir);
        let what = |e: String| format!("epoch ledger {}: {e}", file.display());
        let reader = match std::fs::File::open(&file) {
            Ok(f) => std::io::BufReader::new(f),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(what(format!("cannot be read: {e}"))),
        };
        let mut de = serde_json::Deserializer::from_reader(reader);
        let ledger = serde::de::DeserializeSeed::deserialize(Onto { locks, compared }, &mut de)
            .and_then(|ledger| de.end().map(|()| ledger))
            .map_err(|e| what(format!("is damaged: {e}")))?;
        if ledger.version != VERSION {
            return Err(what(format!(
                "has version {}, this build reads {VERSION}",
                ledger.version
            )));
        }
        Ok(Some(ledger))
    }

    /// Raises one lock (and the overall floor) to at least `epoch`.
    pub fn raise(&mut self, lock: &str, epoch: Epoch) {
        let slot = self.locks.entry(lock.to_owned()).or_default();
        *slot = (*slot).max(epoch);
        self.floor = self.floor.max(epoch);
    }

    /// Writes the ledger atomically into `dir`.
    pub fn store(&mut self, dir: &Path, now_unix: u64) -> Result<(), String> {
        self.version = VERSION;
        self.updated_at_unix = now_unix;
        let text = serde_json::to_vec_pretty(self)
            .map_err(|e| format!("cannot encode the epoch ledger: {e}"))?;
        write_atomically(dir, LEDGER_FILE, &text)
    }
}

/// How the ledger files compared with the database summary they were read onto.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compared {
    /// The first lock (in name order) whose database epoch is below the ledger's:
    /// (lock, database, ledger).
    pub first_behind: Option<(String, Epoch, Epoch)>,
    /// The newest commit the files record as durable (before the summary's is merged).
    pub commit_seq: u64,
    /// The merged ledger differs from the ledger file (or there is none): it is worth
    /// writing.
    pub changed: bool,
    /// There was a ledger or a floor file.
    pub found: bool,
    /// Some lock's epoch differs between the file and the summary.
    differs: bool,
    /// How many locks the file names.
    file_locks: usize,
}

/// Reads an [`EpochLedger`] whose `locks` are merged onto a map as they stream in.
struct Onto<'a> {
    locks: &'a mut BTreeMap<String, Epoch>,
    compared: &'a mut Compared,
}

impl<'de> serde::de::DeserializeSeed<'de> for Onto<'_> {
    type Value = EpochLedger;

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<EpochLedger, D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Onto<'_> {
    type Value = EpochLedger;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an epoch ledger object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<EpochLedger, A::Error> {
        use serde::de::Error;
        let mut ledger = EpochLedger::default();
        let (mut version, mut floor, mut locks) = (None, None, false);
        while let Some(field) = map.next_key::<String>()? {
            match field.as_str() {
                "version" => version = Some(map.next_value()?),
                "floor" => floor = Some(map.next_value()?),
                "updated_at_unix" => ledger.updated_at_unix = map.next_value()?,
                "last_restore" => ledger.last_restore = map.next_value()?,
                "commit_seq" => ledger.commit_seq = map.next_value()?,
                "locks" => {
                    map.next_value_seed(LocksOnto {
                        locks: &mut *self.locks,
                        compared: &mut *self.compared,
                    })?;
                    locks = true;
                }
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        ledger.version = version.ok_or_else(|| A::Error::missing_field("version"))?;
        ledger.floor = floor.ok_or_else(|| A::Error::missing_field("floor"))?;
        if !locks {
            return Err(A::Error::missing_field("locks"));
        }
        Ok(ledger)
    }
}

/// The ledger's `locks` object, each entry compared with and raised onto the map.
struct LocksOnto<'a> {
    locks: &'a mut BTreeMap<String, Epoch>,
    compared: &'a mut Compared,
}

impl<'de> serde::de::DeserializeSeed<'de> for LocksOnto<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for LocksOnto<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a map of lock names to epochs")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some((lock, known)) = map.next_entry::<String, Epoch>()? {
            self.compared.file_locks += 1;
            let db = self.locks.get(&lock).copied();
            let have = db.unwrap_or(0);
            if have != known || db.is_none() {
                self.compared.differs |= have != known;
                if have < known && self.compared.first_behind.is_none() {
                    self.compared.first_behind = Some((lock.clone(), have, known));
                }
                let slot = self.locks.entry(lock).or_default();
                *slot = (*slot).max(known);
            }
        }
        Ok(())
    }
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
    fn reads_onto_the_summary_upward_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(EpochLedger::load(dir.path()).unwrap(), None);
        let (mut ledger, compared) =
            EpochLedger::load_onto(dir.path(), summary(&[("a", 5), ("b", 2)])).unwrap();
        assert!(compared.changed && !compared.found, "{compared:?}");
        assert_eq!(ledger.floor, 5);
        ledger.store(dir.path(), 7).unwrap();
        let back = EpochLedger::load(dir.path()).unwrap().unwrap();
        assert_eq!(back, ledger);

        // The database behind on "b", ahead on "a", and with a lock the file lacks.
        let (raised, compared) =
            EpochLedger::load_onto(dir.path(), summary(&[("a", 6), ("b", 1), ("c", 9)])).unwrap();
        assert_eq!(compared.first_behind, Some(("b".to_string(), 1, 2)));
        assert!(compared.changed);
        let locks: Vec<_> = raised.locks.iter().map(|(l, e)| (l.as_str(), *e)).collect();
        assert_eq!(
            locks,
            [("a", 6), ("b", 2), ("c", 9)],
            "each lock at its maximum"
        );
        assert_eq!(raised.floor, 9);

        // Exactly what the file says: nothing behind, nothing to write.
        let (_, same) = EpochLedger::load_onto(dir.path(), summary(&[("a", 5), ("b", 2)])).unwrap();
        assert_eq!((same.first_behind, same.changed), (None, false));
        // A lock the file names but the database does not is behind unless it is at 0.
        let (_, fewer) = EpochLedger::load_onto(dir.path(), summary(&[("a", 5)])).unwrap();
        assert_eq!(fewer.first_behind, Some(("b".to_string(), 0, 2)));
    }

    #[test]
    fn the_floor_file_raises_the_floor_and_never_lowers_it() {
        let dir = tempfile::tempdir().unwrap();
        store_floor(dir.path(), 40, 5, 1).unwrap();
        // A floor file alone is a ledger with a floor and no locks.
        let alone = EpochLedger::load(dir.path()).unwrap().unwrap();
        assert_eq!((alone.floor, alone.locks.len()), (40, 0));

        let (mut ledger, _) = EpochLedger::load_onto(dir.path(), summary(&[("a", 7)])).unwrap();
        ledger.store(dir.path(), 2).unwrap();
        let raised = EpochLedger::load(dir.path()).unwrap().unwrap();
        assert_eq!(
            (raised.floor, raised.locks["a"], raised.commit_seq),
            (40, 7, 5)
        );

        store_floor(dir.path(), 3, 2, 3).unwrap();
        let (mut ledger, _) = EpochLedger::load_onto(dir.path(), summary(&[("a", 90)])).unwrap();
        ledger.store(dir.path(), 4).unwrap();
        let kept = EpochLedger::load(dir.path()).unwrap().unwrap();
        assert_eq!(
            kept.floor, 90,
            "a lower floor file does not lower the ledger"
        );
        assert_eq!(kept.commit_seq, 5, "nor its commit sequence number");

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
