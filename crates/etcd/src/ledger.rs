//! The epoch ledger of an etcd node, kept **outside** etcd: `--etcd-epoch-ledger FILE`,
//! by default `etcd-epoch-ledger.json` in the node's `--data-dir`. One node per ledger: a
//! node holds `FILE.lock` while it serves, and a second node given the same file refuses
//! to start (its ceilings would overwrite each other's).
//!
//! An etcd snapshot restore brings every epoch counter and high-water mark back to the
//! snapshot's values: the epochs issued after the snapshot would be issued again, and
//! tokens the marks had already fenced out would be admitted again (S11). etcd itself
//! cannot know what it forgot, so each node keeps a small file of its own:
//!
//! ```json
//! {"version": 1, "prefix": "/palisade/", "ceiling": 2000, "revision": 812, "updated_at_unix": 1764600000}
//! ```
//!
//! - `ceiling`: **no epoch above it was ever handed out by this node.** It is raised
//!   *before* a token with a higher epoch leaves the node: a grant whose epoch is above
//!   the ceiling first rewrites the file with `ceiling = epoch + `[`CEILING_BLOCK`]
//!   (temporary file, fsync, rename, fsync of the directory), so the file is written
//!   once per [`CEILING_BLOCK`] epochs, not per grant. If the write fails, the grant is
//!   withdrawn (its etcd lease revoked) and the acquisition fails with `storage_failed`.
//! - `revision`: the etcd store revision of the grant that last raised the ceiling. A
//!   node that starts and finds etcd's revision below it knows etcd came back older (see
//!   [`EpochLedger::check_against`]).
//! - `prefix`: the deployment's key prefix, so that a ledger is not applied to another.
//!
//! Every token any node hands out carries an epoch at most its ledger's ceiling, and a
//! high-water mark only ever takes the epoch of a token it admitted: so the largest
//! ceiling of all the nodes' ledgers bounds every epoch and every mark the deployment
//! ever had. `palisade admin etcd-raise` ([`raise_floor`]) reads the ledgers after a
//! restore and writes etcd's **epoch floor** (`P meta/epoch-floor`) above that bound:
//! every lock's next epoch is then above the floor, and every namespace's mark is at
//! least the floor, whether or not the snapshot knew the lock or the namespace.
//!
//! ## What it does not guarantee
//! - A node whose ledger is not given to the raise is not covered: the raise cannot know
//!   what it issued. Give it every node's ledger, or a bound with `--at-least`.
//! - A lost ledger file loses its node's bound; with every ledger lost, only
//!   `--at-least` can tell the raise how high to go.
//! - Tokens signed outside the nodes with a copy of the signing key are not in any
//!   ledger.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use etcd_client::{Compare, CompareOp, TxnOp};
use palisade_storage::atomic_file::{read_versioned, HeldLock, LockError};
use palisade_storage::StorageError;
use palisade_token::Epoch;
use serde::{Deserialize, Serialize};

use crate::{keys, Etcd};

/// How far above an epoch the ceiling is raised when that epoch passes it: the file is
/// rewritten once per this many epochs of the busiest lock.
pub const CEILING_BLOCK: Epoch = 1000;

const VERSION: u32 = 1;

/// The ledger file's content. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerFile {
    pub version: u32,
    pub prefix: String,
    pub ceiling: Epoch,
    pub revision: i64,
    pub updated_at_unix: u64,
}

impl LedgerFile {
    /// Reads a ledger file; `Ok(None)` if there is none
    /// ([`palisade_storage::atomic_file::read_versioned`]).
    pub fn read(path: &Path) -> Result<Option<LedgerFile>, StorageError> {
        read_versioned(path, "epoch ledger", VERSION, |f: &LedgerFile| f.version)
            .map_err(StorageError::Failed)
    }

    /// Replaces the file at `path` so that a crash leaves the old one or the new one
    /// ([`palisade_storage::atomic_file`]).
    fn write(&self, path: &Path) -> Result<(), StorageError> {
        let bytes = serde_json::to_vec_pretty(self)
            .map_err(|e| StorageError::Failed(format!("cannot encode the epoch ledger: {e}")))?;
        palisade_storage::atomic_file::replace(path, &bytes)
            .map_err(|e| failed(path, "cannot write", e))
    }
}

/// Takes `path.lock` for this process, or says which ledger another node holds.
fn lock(path: &Path) -> Result<HeldLock, StorageError> {
    palisade_storage::atomic_file::lock_beside(path).map_err(|e| match e {
        LockError::Held { path: lock_path } => StorageError::Failed(format!(
            "epoch ledger {} is in use by another node ({} is held): give every node its \
             own ledger (--etcd-epoch-ledger, or its own --data-dir)",
            path.display(),
            lock_path.display()
        )),
        LockError::Io { source, .. } => failed(path, "cannot open the lock file of the", source),
    })
}

fn failed(path: &Path, what: &str, e: std::io::Error) -> StorageError {
    StorageError::Failed(format!("{what} epoch ledger {}: {e}", path.display()))
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A node's ledger while it serves. Cheap to clone.
#[derive(Clone)]
pub struct EpochLedger {
    path: Arc<PathBuf>,
    state: Arc<Mutex<LedgerFile>>,
    /// `FILE.lock`, held while the node serves (see the module docs).
    _lock: Arc<HeldLock>,
}

impl std::fmt::Debug for EpochLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochLedger")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl EpochLedger {
    /// Opens (or creates, with ceiling 0) the ledger at `path` for the deployment under
    /// `prefix`. A ledger of another prefix is an error.
    pub fn open(path: &Path, prefix: &str) -> Result<EpochLedger, StorageError> {
        let lock = lock(path)?;
        let file = match LedgerFile::read(path)? {
            Some(file) if file.prefix != prefix => {
                return Err(StorageError::Failed(format!(
                    "epoch ledger {} belongs to etcd prefix {:?}, not {prefix:?}",
                    path.display(),
                    file.prefix
                )))
            }
            Some(file) => file,
            None => {
                let file = LedgerFile {
                    version: VERSION,
                    prefix: prefix.to_owned(),
                    ceiling: 0,
                    revision: 0,
                    updated_at_unix: now_unix(),
                };
                file.write(path)?;
                file
            }
        };
        Ok(EpochLedger {
            path: Arc::new(path.to_path_buf()),
            state: Arc::new(Mutex::new(file)),
            _lock: Arc::new(lock),
        })
    }

    /// The ledger's current content.
    pub fn file(&self) -> LedgerFile {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Makes sure the ceiling is at least `epoch`, raising it (durably) by
    /// [`CEILING_BLOCK`] above `epoch` if not. `revision` is the etcd revision of the
    /// grant. Runs the file write on a blocking thread.
    pub async fn cover(&self, epoch: Epoch, revision: i64) -> Result<(), StorageError> {
        if self.file().ceiling >= epoch {
            return Ok(());
        }
        let ledger = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut state = ledger.state.lock().unwrap_or_else(PoisonError::into_inner);
            if state.ceiling >= epoch {
                return Ok(());
            }
            let mut next = state.clone();
            next.ceiling = epoch.saturating_add(CEILING_BLOCK);
            next.revision = next.revision.max(revision);
            next.updated_at_unix = now_unix();
            next.write(&ledger.path)?;
            *state = next;
            Ok(())
        })
        .await
        .map_err(|e| StorageError::Failed(format!("epoch ledger write did not finish: {e}")))?
    }

    /// At start: `Ok(Err(why))` for an etcd that came back older than this ledger saw
    /// (its store revision is below the ledger's) unless its epoch floor already covers
    /// the ledger's ceiling (`palisade admin etcd-raise` was run). `Err` when etcd could
    /// not be asked.
    pub async fn check_against(&self, etcd: &Etcd) -> Result<Result<(), String>, StorageError> {
        let file = self.file();
        if file.ceiling == 0 {
            return Ok(Ok(()));
        }
        let (floor, _, revision) = read_floor(etcd).await?;
        if revision < file.revision && floor <= file.ceiling {
            return Ok(Err(format!(
                "etcd is at store revision {revision}, below revision {} recorded in the \
                 epoch ledger {}: etcd came back older (a snapshot restore?) and would issue \
                 epochs a second time. Run `palisade admin etcd-raise` with every node's \
                 ledger before starting the nodes (docs/operations.md)",
                file.revision,
                self.path.display()
            )));
        }
        Ok(Ok(()))
    }
}

/// The epoch floor in etcd, its mod revision (0 if unset) and the store revision.
pub(crate) async fn read_floor(etcd: &Etcd) -> Result<(Epoch, i64, i64), StorageError> {
    let key = etcd.keys.epoch_floor();
    let snap = etcd
        .read("read epoch floor", vec![TxnOp::get(key, None)])
        .await?;
    match snap.first(0) {
        Some(kv) => Ok((
            keys::decode_epoch(kv.key(), kv.value())?,
            kv.mod_revision(),
            snap.revision,
        )),
        None => Ok((0, 0, snap.revision)),
    }
}

/// What [`raise_floor`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Raised {
    /// The floor before.
    pub previous: Epoch,
    /// The floor now: every lock's next epoch is above it, every namespace's mark at
    /// least it.
    pub floor: Epoch,
}

/// Raises etcd's epoch floor to at least `bound + 1` (never lowers it). `bound` is the
/// largest ceiling of every node's ledger (and any bound the operator knows).
pub async fn raise_floor(etcd: &Etcd, bound: Epoch) -> Result<Raised, StorageError> {
    let wanted = bound.saturating_add(1);
    for attempt in 0..crate::txn::MAX_ATTEMPTS {
        let (previous, rev, _) = read_floor(etcd).await?;
        if previous >= wanted {
            return Ok(Raised {
                previous,
                floor: previous,
            });
        }
        let key = etcd.keys.epoch_floor();
        let committed = etcd
            .commit(
                "raise epoch floor",
                vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)],
                vec![TxnOp::put(key, keys::encode_epoch(wanted), None)],
            )
            .await?;
        if committed.is_some() {
            return Ok(Raised {
                previous,
                floor: wanted,
            });
        }
        crate::txn::backoff(attempt).await;
    }
    Err(crate::txn::contended("raise epoch floor"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_ceiling_goes_up_in_blocks_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.json");
        let ledger = EpochLedger::open(&path, "/p/").unwrap();
        assert_eq!(ledger.file().ceiling, 0);
        ledger.cover(1, 10).await.unwrap();
        assert_eq!(ledger.file().ceiling, 1 + CEILING_BLOCK);
        // Within the block: no rewrite, the recorded revision stays.
        ledger.cover(CEILING_BLOCK, 20).await.unwrap();
        assert_eq!(LedgerFile::read(&path).unwrap().unwrap().revision, 10);
        ledger.cover(CEILING_BLOCK + 2, 30).await.unwrap();
        // One holder at a time: a second open while it serves is refused.
        let shared = EpochLedger::open(&path, "/p/").unwrap_err().to_string();
        assert!(shared.contains("in use by another node"), "{shared}");
        drop(ledger);
        let again = EpochLedger::open(&path, "/p/").unwrap().file();
        assert_eq!(again.ceiling, 2 + 2 * CEILING_BLOCK);
        assert_eq!(again.revision, 30);
        assert!(EpochLedger::open(&path, "/other/").is_err());
    }

    #[test]
    fn a_damaged_ledger_is_an_error_not_a_fresh_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.json");
        std::fs::write(&path, "{not json").unwrap();
        let err = EpochLedger::open(&path, "/p/").unwrap_err().to_string();
        assert!(err.contains("damaged"), "{err}");
    }
}
