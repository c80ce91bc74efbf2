//! `palisade admin keys list|rotate|retire` on the data directory of a stopped server.
//!
//! Each command holds the database file's lock while it works (the way `admin backup` and
//! `admin restore` do), so it refuses while a server has the directory open, and no
//! server can start on it meanwhile. A running server's keys change through its API
//! instead (`POST /v1/admin/keys/rotate`, `POST /v1/admin/keys/{key_id}/retire`).
//!
//! `rotate` is also the way out when the key set is lost or damaged next to an existing
//! database: it starts a new set (a damaged file is kept beside it, renamed), and every
//! token signed before stops verifying.

use std::path::Path;

use palisade_storage::redb_backend::offline::{OfflineDb, OfflineError};
use palisade_token::{KeySet, KeySetError, Signer};

use super::file::{self, ReadError, KEY_SET_FILE};
use crate::DB_FILE;

/// Why an offline key command did nothing.
#[derive(Debug, thiserror::Error)]
pub enum OfflineKeyError {
    /// A server has the directory open.
    #[error(
        "a server is running on {dir} (its database is locked): change its keys through the \
         API instead (POST /v1/admin/keys/rotate, POST /v1/admin/keys/KEY_ID/retire), or stop \
         it first"
    )]
    Running { dir: String },
    #[error(transparent)]
    Refused(#[from] KeySetError),
    #[error("{0}")]
    Other(String),
}

/// What a rotation did.
#[derive(Debug)]
pub struct Rotated {
    pub set: KeySet,
    /// The key that was active before, if the set could be read.
    pub previous: Option<String>,
    /// The set was lost or damaged and a new one was started: every earlier token stops
    /// verifying. The damaged file, if any, was kept under this name.
    pub started_over: Option<Option<String>>,
}

/// Holds the database file's lock (no server can run meanwhile).
fn lock(dir: &Path) -> Result<OfflineDb, OfflineKeyError> {
    match OfflineDb::open(&dir.join(DB_FILE)) {
        Ok(db) => Ok(db),
        Err(OfflineError::Busy { .. }) => Err(OfflineKeyError::Running {
            dir: dir.display().to_string(),
        }),
        Err(OfflineError::Missing { path }) => Err(OfflineKeyError::Other(format!(
            "{path} does not exist: {} is not the data directory of a server (a server \
             starting on a new directory makes its own key set)",
            dir.display()
        ))),
        Err(e) => Err(OfflineKeyError::Other(e.to_string())),
    }
}

/// The set as a server would start with it, without writing anything: the key set file,
/// or `issuer.key` seen as a one-key set.
pub fn list(dir: &Path) -> Result<KeySet, OfflineKeyError> {
    let _locked = lock(dir)?;
    match current(dir).map_err(|e| OfflineKeyError::Other(e.to_string()))? {
        Some((set, _)) => Ok(set),
        None => Err(OfflineKeyError::Other(format!(
            "{} holds no key set. {}",
            dir.display(),
            file::way_out(dir)
        ))),
    }
}

/// The stored set (`true` when it is `issuer.key`'s, not yet migrated), if any.
fn current(dir: &Path) -> Result<Option<(KeySet, bool)>, ReadError> {
    if let Some(set) = file::read_set(&dir.join(KEY_SET_FILE))? {
        return Ok(Some((set, false)));
    }
    let legacy = file::read_legacy(dir)?;
    Ok(legacy.map(|signer| (KeySet::new(signer, crate::now_unix()), true)))
}

/// Makes a new random key active; the active one becomes verifying. When the set is
/// missing or cannot be read, starts a new set instead (see the module docs).
pub fn rotate(dir: &Path, now: u64) -> Result<Rotated, OfflineKeyError> {
    let _locked = lock(dir)?;
    let next = Signer::generate();
    let (set, previous, started_over) = match current(dir) {
        Ok(Some((set, _))) => {
            let previous = set.active().key_id.clone();
            (set.rotate(next, now)?, Some(previous), None)
        }
        Ok(None) => (KeySet::new(next, now), None, Some(None)),
        // The keys are fine, only the file's mode is not: never start over for that.
        Err(e @ ReadError::Exposed(_)) => return Err(OfflineKeyError::Other(e.to_string())),
        Err(ReadError::Unusable(_)) => {
            let kept = set_aside_damaged(dir, now)?;
            (KeySet::new(next, now), None, Some(kept))
        }
    };
    file::store(dir, &set).map_err(OfflineKeyError::Other)?;
    // The old single key, if any, is in the new set (or is being replaced on purpose).
    file::remove_legacy(dir).map_err(OfflineKeyError::Other)?;
    Ok(Rotated {
        set,
        previous,
        started_over,
    })
}

/// Retires a verifying key. `Ok((set, false))` when it already was retired.
pub fn retire(dir: &Path, key_id: &str, now: u64) -> Result<(KeySet, bool), OfflineKeyError> {
    let _locked = lock(dir)?;
    let current = current(dir).map_err(|e| OfflineKeyError::Other(e.to_string()))?;
    let Some((set, legacy)) = current else {
        return Err(OfflineKeyError::Other(format!(
            "{} holds no key set. {}",
            dir.display(),
            file::way_out(dir)
        )));
    };
    let Some(next) = set.retire(key_id, now)? else {
        return Ok((set, false));
    };
    file::store(dir, &next).map_err(OfflineKeyError::Other)?;
    if legacy {
        file::remove_legacy(dir).map_err(OfflineKeyError::Other)?;
    }
    Ok((next, true))
}

/// Renames the unreadable key files out of the way; the new name of the key set file, if
/// there was one.
fn set_aside_damaged(dir: &Path, now: u64) -> Result<Option<String>, OfflineKeyError> {
    let mut kept = None;
    for name in [KEY_SET_FILE, file::LEGACY_KEY_FILE] {
        let path = dir.join(name);
        if !path.exists() {
            continue;
        }
        let aside = dir.join(format!("{name}.damaged-{now}"));
        std::fs::rename(&path, &aside).map_err(|e| {
            OfflineKeyError::Other(format!("cannot rename {}: {e}", path.display()))
        })?;
        if kept.is_none() {
            kept = Some(aside.display().to_string());
        }
    }
    Ok(kept)
}
