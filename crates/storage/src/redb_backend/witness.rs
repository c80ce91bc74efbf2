//! The witness: what a database reached, kept **outside** its data directory, so that a
//! directory put back from an older copy is recognised before it serves (S11).
//!
//! A copy of the whole data directory (a volume snapshot, a `cp -a` taken aside and put
//! back, an old disk attached again) carries its own log, horizon and epoch ledger, all
//! consistent with each other and all older than what the store acknowledged since. Only
//! something the copy does not contain can tell. The witness is a small file elsewhere
//! (by default beside the data directory, see the server's `--witness`):
//!
//! ```json
//! {"version": 1, "horizon": 2097152, "commit_seq": 8812, "database": "/var/lib/palisade/palisade.redb", "updated_at_unix": 1764600000}
//! ```
//!
//! - `horizon`: **no epoch above it was ever written by the store.** The writer raises it
//!   here *before* it raises the epoch horizon in the data directory (`horizon.rs`), which
//!   comes before any record that needs it: once per million epochs of the busiest lock.
//! - `commit_seq`: a commit the store had made durable. Written at open, about every
//!   second while commits happen ([`super::RedbBackend::refresh_witness`], called by the
//!   server), and at close.
//!
//! At open, after the log is replayed: a database holding fewer commits than the witness
//! saw came back older than what it acknowledged, and [`Verdict::Behind`] refuses it; a
//! restore (`palisade admin restore`) reads the witness too, and puts the restored
//! database above both of its numbers. One store per witness: `FILE.lock` is held while
//! the store is open, and a second store given the same file refuses to open.
//!
//! ## What it does not guarantee
//! - A copy no more than one refresh older than a crash goes unnoticed (its commits are
//!   all the witness saw); after a graceful stop, none does.
//! - A rollback that takes the witness back with the directory (a snapshot of the whole
//!   machine, or of one volume holding both) cannot be seen: keep the witness on another
//!   volume than the data directory.
//! - A witness that is lost is written anew from the directory at the next open; a lost
//!   witness together with a rolled-back directory goes unnoticed.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use palisade_token::Epoch;

use super::schema::Fault;
use crate::atomic_file::{self, HeldLock, LockError};

const VERSION: u32 = 1;

/// The witness file's content (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WitnessFile {
    pub version: u32,
    /// No epoch above it was ever written by the store.
    pub horizon: Epoch,
    /// A commit the store had made durable.
    pub commit_seq: u64,
    /// The database it was written for, for the operator (not compared: a directory may
    /// move).
    pub database: String,
    pub updated_at_unix: u64,
}

/// What a witness path holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Missing,
    Witness(WitnessFile),
    /// Unreadable or not a witness, with why.
    Damaged(String),
}

/// Reads the witness at `path`.
pub fn load(path: &Path) -> Found {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Found::Missing,
        Err(e) => return Found::Damaged(format!("cannot read it: {e}")),
    };
    match serde_json::from_slice::<WitnessFile>(&bytes) {
        Ok(file) if file.version == VERSION => Found::Witness(file),
        Ok(file) => Found::Damaged(format!("unknown version {}", file.version)),
        Err(e) => Found::Damaged(format!("not a witness: {e}")),
    }
}

/// What opening a database whose log replayed to commit `seq` makes of its witness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No witness yet: it is written from the database.
    First,
    /// The database holds every commit the witness saw.
    Current {
        horizon: Epoch,
    },
    /// The database came back older than the witness.
    Behind {
        witness_seq: u64,
        horizon: Epoch,
    },
    Damaged(String),
}

/// The one rule (pure): a database is behind its witness when it holds fewer commits than
/// the witness saw durable.
pub fn verdict(found: &Found, seq: u64) -> Verdict {
    match found {
        Found::Missing => Verdict::First,
        Found::Damaged(why) => Verdict::Damaged(why.clone()),
        Found::Witness(w) if seq < w.commit_seq => Verdict::Behind {
            witness_seq: w.commit_seq,
            horizon: w.horizon,
        },
        Found::Witness(w) => Verdict::Current { horizon: w.horizon },
    }
}

/// An open store's witness: the file, its lock, and what was last written to it.
#[derive(Debug)]
pub(super) struct Witness {
    path: PathBuf,
    database: String,
    /// (horizon, commit_seq) as last written; both only go up.
    written: Mutex<(Epoch, u64)>,
    _lock: HeldLock,
}

impl Witness {
    /// Takes the witness at `path` for the database `database` that recovery left at
    /// commit `seq` with epoch horizon `horizon`: refuses it when it is behind (see
    /// [`verdict`]), else records both numbers, durably, before anything is served.
    pub(super) fn open(
        path: &Path,
        database: &str,
        seq: u64,
        horizon: Epoch,
    ) -> Result<Witness, Fault> {
        let lock = atomic_file::lock_beside(path).map_err(|e| match e {
            LockError::Held { path: lock_path } => Fault(format!(
                "the witness {} is in use by another store ({} is held): give every data \
                 directory its own witness (--witness)",
                path.display(),
                lock_path.display()
            )),
            LockError::Io {
                path: lock_path,
                source,
            } => Fault(format!(
                "cannot take the witness {} ({}: {source}): give --witness a path on a \
                 volume this server can write, outside the data directory",
                path.display(),
                lock_path.display()
            )),
        })?;
        let witness_horizon = match verdict(&load(path), seq) {
            Verdict::First => {
                tracing::info!(witness = %path.display(), "no witness yet: writing it");
                0
            }
            Verdict::Current { horizon } => horizon,
            Verdict::Damaged(why) => {
                return Err(Fault(format!(
                    "the witness {} cannot be used ({why}): put the right file back, or \
                     remove it to open without the comparison this once (it is written anew)",
                    path.display()
                )))
            }
            Verdict::Behind {
                witness_seq,
                horizon,
            } if seq == 0 => {
                return Err(Fault(format!(
                    "the data directory is older than its witness {}: it holds no commits, \
                     but the witness saw commit {witness_seq} durable (and epochs below \
                     {horizon}). The directory that issued them was removed, emptied or \
                     replaced, and starting afresh would issue those epochs a second time. \
                     Restore a backup into it (`palisade admin restore`, which raises every \
                     epoch above the witness); or, for a new deployment that no client of the \
                     old one will ever talk to, remove the witness",
                    path.display()
                )))
            }
            Verdict::Behind {
                witness_seq,
                horizon,
            } => {
                return Err(Fault(format!(
                    "the data directory is older than its witness {}: the witness saw commit \
                     {witness_seq} durable (and epochs below {horizon}), but the database \
                     holds commits only up to {seq}. It was put back from an older copy (a \
                     snapshot, a copy of the directory, another disk), and serving it would \
                     issue epochs a second time and admit tokens it had fenced out. If the \
                     newer directory still exists, put it back; to serve this copy, back it \
                     up and restore that backup (`palisade admin backup`, then `palisade \
                     admin restore`), which raises every epoch and mark above the witness",
                    path.display()
                )))
            }
        };
        let witness = Witness {
            path: path.to_owned(),
            database: database.to_owned(),
            written: Mutex::new((0, 0)),
            _lock: lock,
        };
        witness.record(horizon.max(witness_horizon), seq)?;
        Ok(witness)
    }

    /// Raises the witness to `horizon` and `seq` (each kept if already higher), durably;
    /// writes nothing when neither moves.
    pub(super) fn record(&self, horizon: Epoch, seq: u64) -> Result<(), Fault> {
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        let next = (written.0.max(horizon), written.1.max(seq));
        if next == *written && next != (0, 0) {
            return Ok(());
        }
        let file = WitnessFile {
            version: VERSION,
            horizon: next.0,
            commit_seq: next.1,
            database: self.database.clone(),
            updated_at_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        let fail = |e: std::io::Error| {
            Fault(format!(
                "cannot write the witness {}: {e}",
                self.path.display()
            ))
        };
        let bytes = serde_json::to_vec(&file).map_err(|e| fail(std::io::Error::other(e)))?;
        atomic_file::replace(&self.path, &bytes).map_err(fail)?;
        *written = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn witness(horizon: Epoch, commit_seq: u64) -> Found {
        Found::Witness(WitnessFile {
            version: VERSION,
            horizon,
            commit_seq,
            database: "db".into(),
            updated_at_unix: 0,
        })
    }

    #[test]
    fn a_database_with_fewer_commits_than_its_witness_is_behind() {
        assert_eq!(verdict(&Found::Missing, 5), Verdict::First);
        assert_eq!(
            verdict(&witness(1 << 20, 5), 5),
            Verdict::Current { horizon: 1 << 20 }
        );
        assert_eq!(
            verdict(&witness(1 << 20, 5), 9),
            Verdict::Current { horizon: 1 << 20 }
        );
        assert_eq!(
            verdict(&witness(1 << 20, 5), 4),
            Verdict::Behind {
                witness_seq: 5,
                horizon: 1 << 20
            }
        );
        assert!(matches!(
            verdict(&Found::Damaged("x".into()), 4),
            Verdict::Damaged(_)
        ));
    }

    #[test]
    fn opening_records_refuses_when_behind_and_one_store_holds_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.witness");
        let w = Witness::open(&path, "db", 7, 1 << 20).unwrap();
        assert_eq!(numbers(&path), (1 << 20, 7));
        let second = Witness::open(&path, "db", 7, 1 << 20).unwrap_err();
        assert!(second.0.contains("in use by another store"), "{}", second.0);
        w.record(5, 9).unwrap(); // the horizon never goes down
        assert_eq!(numbers(&path), (1 << 20, 9));
        w.record(3 << 20, 9).unwrap();
        assert_eq!(numbers(&path), (3 << 20, 9));
        drop(w);
        let behind = Witness::open(&path, "db", 8, 1 << 20).unwrap_err();
        assert!(behind.0.contains("older than its witness"), "{}", behind.0);
        assert!(behind.0.contains("commit 9"), "{}", behind.0);
        // Nothing was written by the refusal.
        assert_eq!(numbers(&path), (3 << 20, 9));
        let wiped = Witness::open(&path, "db", 0, 1 << 20).unwrap_err();
        assert!(wiped.0.contains("holds no commits"), "{}", wiped.0);
        // A database at or past it opens, keeping the higher horizon.
        let w = Witness::open(&path, "db", 9, 1 << 20).unwrap();
        assert_eq!(numbers(&path), (3 << 20, 9));
        drop(w);
        std::fs::write(&path, b"{").unwrap();
        let damaged = Witness::open(&path, "db", 9, 1 << 20).unwrap_err();
        assert!(damaged.0.contains("cannot be used"), "{}", damaged.0);
    }

    /// The horizon and commit number the file at `path` holds.
    fn numbers(path: &Path) -> (Epoch, u64) {
        match load(path) {
            Found::Witness(w) => (w.horizon, w.commit_seq),
            other => panic!("{other:?}"),
        }
    }
}
