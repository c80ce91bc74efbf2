//! Key files on disk: the data directory's key set, the `issuer.key` it replaces, and the
//! secret and public key files given by flags.
//!
//! The embedded backend keeps its [`KeySet`] in `signing-keys.json` in the data
//! directory: JSON, mode 0600 (it holds the active key's secret), replaced atomically
//! (a temporary file, fsync, rename, fsync of the directory), so a crash leaves either the
//! old set or the new one, never a mix.
//!
//! Which set a server starts with ([`open_for_serving`]):
//! 1. `signing-keys.json`, if it is there. If it cannot be read, the server refuses to
//!    start: it does not invent keys for a directory whose tokens were signed by others.
//! 2. Otherwise `issuer.key` (the single key of earlier versions) becomes a set with that
//!    key active; the old file is removed only after the new one is durable.
//! 3. Otherwise the `--signing-key-file` key, if given, becomes the active key of a new
//!    set (the file is only read to create the set: afterwards the set decides).
//! 4. Otherwise, only a fresh directory (no database, no epoch ledger) gets a new random
//!    key. Next to an existing database the server refuses, naming the way out: restore
//!    the key file from a backup, or start a new set with `palisade admin keys rotate`,
//!    accepting that every token issued before stops verifying.
//!
//! Several nodes sharing one etcd cluster keep their set in etcd instead (see
//! `palisade_etcd::EtcdKeySet`); `--signing-key-file` seeds it. Each `--trust-key-file`
//! adds a key to verify with: a public key in base64url (as `GET /v1/keys` shows it) or a
//! secret key file.

use std::fs;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use palisade_storage::atomic_file::{sync_dir, write_atomic};
use palisade_token::{KeySet, Signer, VerifyingKey};

use crate::recovery::ledger;
use crate::DB_FILE;

/// The key set's file name inside the data directory.
pub const KEY_SET_FILE: &str = "signing-keys.json";

/// The single key file of versions before key rotation; migrated at first start.
pub const LEGACY_KEY_FILE: &str = "issuer.key";

/// Where the key set came from at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `signing-keys.json` was there.
    Loaded,
    /// Made from `issuer.key`, which was then removed.
    Migrated,
    /// Made from `--signing-key-file`.
    Seeded,
    /// A fresh directory: a new random key.
    Created,
}

/// Whether `dir` holds state whose tokens some key signed: a database or an epoch ledger.
pub fn has_database(dir: &Path) -> bool {
    existing_state(dir).is_some()
}

/// Refuses a directory whose signing keys outlived its epochs: a key set (or an older
/// version's key file) with neither the database nor the epoch ledger beside it. The
/// tokens those keys signed carry epochs nothing here records any more, and a new
/// database would issue them again from 1 under the same key. Called before the database
/// is opened, which would create it.
pub fn refuse_keys_without_epochs(dir: &Path) -> Result<(), String> {
    if has_database(dir) {
        return Ok(());
    }
    let Some(keys) = [dir.join(KEY_SET_FILE), dir.join(LEGACY_KEY_FILE)]
        .into_iter()
        .find(|p| p.exists())
    else {
        return Ok(());
    };
    Err(format!(
        "{keys} exists, but neither the database ({db}) nor the epoch ledger does: the \
         tokens these keys signed carry epochs this directory no longer records, and a new \
         database would issue them again from 1. Refusing to start. Restore the database \
         with `palisade admin restore --data-dir {dir} --from BACKUP`, which raises every \
         epoch above what may have been issued (add --epoch-floor N, a bound above every \
         epoch ever issued, if the backup is older than the last epochs). To start over as \
         a new issuer instead, move {keys} out of the directory: every earlier token then \
         stops verifying, and resources holding marks from before refuse the new epochs \
         until they pass those marks",
        keys = keys.display(),
        db = dir.join(DB_FILE).display(),
        dir = dir.display(),
    ))
}

/// The database file, or else the epoch ledger, of `dir`, if either exists.
fn existing_state(dir: &Path) -> Option<PathBuf> {
    [dir.join(DB_FILE), ledger::path(dir)]
        .into_iter()
        .find(|p| p.exists())
}

/// The key set a server on `dir` starts with; see the module docs for the order. `fresh`
/// says whether the directory held no state ([`has_database`]) before the server
/// touched it: only then is a new random key made.
pub fn open_for_serving(
    dir: &Path,
    seed_file: Option<&Path>,
    fresh: bool,
    now: u64,
) -> Result<(KeySet, Origin), String> {
    let path = dir.join(KEY_SET_FILE);
    match read_set(&path) {
        Ok(Some(set)) => return Ok((set, Origin::Loaded)),
        Ok(None) => {}
        Err(e @ ReadError::Exposed(_)) => return Err(e.into()),
        Err(e) => return Err(format!("{e}. {}", way_out(dir))),
    }
    if let Some(signer) = read_legacy(dir)? {
        let created = legacy_created_at(dir).unwrap_or(now);
        let set = KeySet::new(signer, created);
        store(dir, &set)?;
        remove_legacy(dir)?;
        return Ok((set, Origin::Migrated));
    }
    if let Some(seed) = seed_file {
        let set = KeySet::new(load_secret(seed)?, now);
        store(dir, &set)?;
        return Ok((set, Origin::Seeded));
    }
    if !fresh {
        let state = existing_state(dir).unwrap_or_else(|| dir.join(DB_FILE));
        return Err(format!(
            "{} is missing, but {} exists: the tokens issued for this data were signed by \
             the keys that file held. Refusing to start with a new key, which would make \
             every outstanding token fail to verify. {}",
            path.display(),
            state.display(),
            way_out(dir)
        ));
    }
    let set = KeySet::new(Signer::generate(), now);
    store(dir, &set)?;
    Ok((set, Origin::Created))
}

/// What an operator can do about a missing or unreadable key set.
pub fn way_out(dir: &Path) -> String {
    format!(
        "Restore {KEY_SET_FILE} (or the {LEGACY_KEY_FILE} of an older version) from a backup \
         into {dir}, or start a new key set with `palisade admin keys rotate --data-dir {dir}`, \
         accepting that every token issued before stops verifying (holders must acquire \
         again)",
        dir = dir.display()
    )
}

/// Why a key file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// It could not be read, or does not hold a valid key (set).
    #[error("{0}")]
    Unusable(String),
    /// It is readable by group or others: fix its mode, the keys themselves are fine.
    #[error("{0}")]
    Exposed(String),
}

impl From<ReadError> for String {
    fn from(e: ReadError) -> String {
        e.to_string()
    }
}

/// Reads a key set file: `Ok(None)` if it does not exist. Refuses a file group or others
/// may read, as [`load_secret`] does.
pub fn read_set(path: &Path) -> Result<Option<KeySet>, ReadError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ReadError::Unusable(format!(
                "cannot read key set {}: {e}",
                path.display()
            )))
        }
    };
    check_private(path).map_err(ReadError::Exposed)?;
    KeySet::decode(&bytes)
        .map(Some)
        .map_err(|e| ReadError::Unusable(format!("key set {} cannot be used: {e}", path.display())))
}

/// The key of `issuer.key` in `dir`, if there is one.
pub fn read_legacy(dir: &Path) -> Result<Option<Signer>, ReadError> {
    let path = dir.join(LEGACY_KEY_FILE);
    let unusable = |why: String| ReadError::Unusable(format!("{why}. {}", way_out(dir)));
    match fs::read_to_string(&path) {
        Ok(text) => parse(&path, &text).map(Some).map_err(unusable),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(unusable(format!(
            "cannot read key file {}: {e}",
            path.display()
        ))),
    }
}

fn legacy_created_at(dir: &Path) -> Option<u64> {
    let modified = fs::metadata(dir.join(LEGACY_KEY_FILE))
        .ok()?
        .modified()
        .ok()?;
    modified
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

/// Removes `issuer.key` (once its key is durable in the key set) and makes that durable.
pub fn remove_legacy(dir: &Path) -> Result<(), String> {
    let path = dir.join(LEGACY_KEY_FILE);
    match fs::remove_file(&path) {
        Ok(()) => sync_dir(dir).map_err(|e| format!("cannot fsync {}: {e}", dir.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", path.display())),
    }
}

/// Replaces the key set of `dir` with `set`: a temporary file (mode 0600) written and
/// fsync'd, renamed over the old one, and the directory fsync'd. When this returns Ok the
/// new set is durable; on an error the old one is still in place.
pub fn store(dir: &Path, set: &KeySet) -> Result<(), String> {
    write_atomic(dir, KEY_SET_FILE, &set.encode()).map_err(|e| {
        format!(
            "cannot write key set {}: {e}",
            dir.join(KEY_SET_FILE).display()
        )
    })
}

/// Refuses a file that group or others may read: whoever reads it can mint tokens for
/// every lock.
fn check_private(path: &Path) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(path)
            .map_err(|e| format!("cannot read key file {}: {e}", path.display()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "key file {} may be read by group or others (mode {:o}); run chmod 600 on it",
                path.display(),
                mode & 0o777
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Loads a secret key file (64 hex characters), refusing one that group or others may
/// read.
pub fn load_secret(path: &Path) -> Result<Signer, String> {
    let text = fs::read_to_string(path)
        .map_err(|e| format!("cannot read key file {}: {e}", path.display()))?;
    check_private(path)?;
    parse(path, &text)
}

/// The public keys of the `--trust-key-file` files.
pub fn trusted_keys(trust_files: &[PathBuf]) -> Result<Vec<VerifyingKey>, String> {
    let mut keys = Vec::new();
    for path in trust_files {
        let text = fs::read_to_string(path)
            .map_err(|e| format!("cannot read trust key file {}: {e}", path.display()))?;
        let text = text.trim();
        if text.len() == 64 {
            keys.push(load_secret(path)?.public_key());
            continue;
        }
        let public: [u8; 32] = B64
            .decode(text)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| {
                format!(
                    "trust key file {} holds neither a base64url public key nor a 64-hex secret key",
                    path.display()
                )
            })?;
        keys.push(
            VerifyingKey::from_bytes(&public)
                .map_err(|e| format!("trust key file {}: {e}", path.display()))?,
        );
    }
    Ok(keys)
}

fn parse(path: &Path, text: &str) -> Result<Signer, String> {
    let bytes =
        hex::decode(text.trim()).map_err(|_| format!("key file {} is not hex", path.display()))?;
    let secret: [u8; 32] = bytes
        .try_into()
        .map_err(|_| format!("key file {} does not hold a 32-byte key", path.display()))?;
    Ok(Signer::from_secret(secret))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write_private(path: &Path, text: &str) {
        let mut options = fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        options
            .open(path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }

    #[test]
    fn a_fresh_directory_gets_a_set_that_is_then_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let (a, origin) = open_for_serving(dir.path(), None, !has_database(dir.path()), 5).unwrap();
        assert_eq!(origin, Origin::Created);
        let (b, origin) = open_for_serving(dir.path(), None, false, 6).unwrap();
        assert_eq!((origin, a), (Origin::Loaded, b));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join(KEY_SET_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(!dir.path().join(format!("{KEY_SET_FILE}.tmp")).exists());
    }

    #[test]
    fn issuer_key_is_migrated_then_removed() {
        let dir = tempfile::tempdir().unwrap();
        let old = Signer::generate();
        write_private(
            &dir.path().join(LEGACY_KEY_FILE),
            &hex::encode(old.secret()),
        );
        let (set, origin) =
            open_for_serving(dir.path(), None, !has_database(dir.path()), 5).unwrap();
        assert_eq!(origin, Origin::Migrated);
        assert_eq!(set.signer().key_id(), old.key_id());
        assert!(!dir.path().join(LEGACY_KEY_FILE).exists());
        let (again, origin) = open_for_serving(dir.path(), None, false, 6).unwrap();
        assert_eq!((origin, again), (Origin::Loaded, set));
    }

    #[test]
    fn a_missing_or_damaged_set_next_to_a_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(DB_FILE), b"db").unwrap();
        let err = open_for_serving(dir.path(), None, !has_database(dir.path()), 5).unwrap_err();
        assert!(
            err.contains(KEY_SET_FILE) && err.contains("admin keys rotate"),
            "{err}"
        );
        assert!(!dir.path().join(KEY_SET_FILE).exists(), "nothing created");
        write_private(&dir.path().join(KEY_SET_FILE), "{not json");
        let err = open_for_serving(dir.path(), None, !has_database(dir.path()), 5).unwrap_err();
        assert!(
            err.contains(KEY_SET_FILE) && err.contains("Restore"),
            "{err}"
        );
        write_private(&dir.path().join(LEGACY_KEY_FILE), "zz");
        fs::remove_file(dir.path().join(KEY_SET_FILE)).unwrap();
        let err = open_for_serving(dir.path(), None, !has_database(dir.path()), 5).unwrap_err();
        assert!(err.contains(LEGACY_KEY_FILE), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn seed_files_trust_files_and_modes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let seed = Signer::generate();
        let seed_file = dir.path().join("seed.key");
        write_private(&seed_file, &hex::encode(seed.secret()));
        fs::set_permissions(&seed_file, fs::Permissions::from_mode(0o640)).unwrap();
        let data = dir.path().join("data");
        fs::create_dir(&data).unwrap();
        let err = open_for_serving(&data, Some(&seed_file), true, 1).unwrap_err();
        assert!(err.contains("chmod 600"), "{err}");
        fs::set_permissions(&seed_file, fs::Permissions::from_mode(0o600)).unwrap();
        let (set, origin) = open_for_serving(&data, Some(&seed_file), true, 1).unwrap();
        assert_eq!(origin, Origin::Seeded);
        assert_eq!(set.signer().key_id(), seed.key_id());
        // The set file, too, must stay private.
        fs::set_permissions(data.join(KEY_SET_FILE), fs::Permissions::from_mode(0o644)).unwrap();
        assert!(open_for_serving(&data, None, false, 2)
            .unwrap_err()
            .contains("chmod 600"));

        let other = Signer::generate();
        let public = dir.path().join("other.pub");
        fs::write(
            &public,
            format!("{}\n", B64.encode(other.public_key().as_bytes())),
        )
        .unwrap();
        let keys = trusted_keys(&[public.clone(), seed_file]).unwrap();
        assert_eq!(keys, vec![other.public_key(), seed.public_key()]);
        fs::write(&public, "not a key").unwrap();
        assert!(trusted_keys(&[public]).is_err());
    }
}
