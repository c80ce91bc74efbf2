//! Replacing a small file so that a crash leaves the old one or the new one, never a torn
//! one: the one implementation of "temporary file, fsync, rename, fsync the directory"
//! for the files kept beside the database (the key set, the data directory's marker, the
//! epoch ledgers of the embedded and etcd backends, the witness); and the lock file that
//! keeps one process at a time on such a file ([`lock_beside`]).
//!
//! The write-ahead log and the epoch horizon replace their files through the log's own
//! directory interface (`redb_backend::wal`), which the failure tests swap for one that
//! fails or tears writes on purpose; they do not use this.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes `bytes` as `dir/name`: into `dir/name.tmp` (a leftover from a crash is removed
/// first, so that the file is created afresh, mode 0600 on Unix, never with a leftover's
/// mode), fsync, rename over `name`, fsync of `dir`. When this returns `Ok` the new
/// contents are durable; on an error the old file, if any, is still in place.
pub fn write_atomic(dir: &Path, name: impl AsRef<OsStr>, bytes: &[u8]) -> io::Result<()> {
    let name = name.as_ref();
    let mut tmp_name = name.to_os_string();
    tmp_name.push(".tmp");
    let tmp = dir.join(tmp_name);
    match fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    {
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// [`write_atomic`] of the file at `path` (a bare name is in the current directory).
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    write_atomic(dir, name, bytes)
}

/// Reads a small versioned JSON file of the kind kept beside a store (the epoch ledgers):
/// `Ok(None)` if it does not exist; otherwise its value, or an error naming it (as `what`,
/// "epoch ledger" for example) when it cannot be read, does not parse, or says a version
/// (`version_of`) other than `expected`. A damaged file is an error, never a fresh start.
pub fn read_versioned<T: serde::de::DeserializeOwned>(
    path: &Path,
    what: &str,
    expected: u32,
    version_of: impl Fn(&T) -> u32,
) -> Result<Option<T>, String> {
    let text = match fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {what} {}: {e}", path.display())),
    };
    let value: T = serde_json::from_slice(&text)
        .map_err(|e| format!("{what} {} is damaged: {e}", path.display()))?;
    let found = version_of(&value);
    if found != expected {
        return Err(format!(
            "{what} {} has version {found}, this build reads {expected}",
            path.display()
        ));
    }
    Ok(Some(value))
}

/// Makes the directory's entries (a file created, renamed or removed in it) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    fs::File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// `FILE.lock`, held by this process until dropped: `flock(2)`, exclusive, advisory (a
/// process that does not ask is not stopped, and on some network file systems the lock
/// is local to one machine). The lock file itself is left in place.
#[derive(Debug)]
pub struct HeldLock {
    _file: nix::fcntl::Flock<fs::File>,
}

/// Why [`lock_beside`] did not take the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error("{} is held by another process", path.display())]
    Held { path: PathBuf },
    #[error("cannot open {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// Takes `path.lock` (created at mode 0600 if missing) without waiting.
pub fn lock_beside(path: &Path) -> Result<HeldLock, LockError> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let mut options = fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(&lock_path).map_err(|source| LockError::Io {
        path: lock_path.clone(),
        source,
    })?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map(|file| HeldLock { _file: file })
        .map_err(|(_, errno)| match errno {
            nix::errno::Errno::EWOULDBLOCK => LockError::Held { path: lock_path },
            other => LockError::Io {
                path: lock_path,
                source: io::Error::from(other),
            },
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary_one() {
        let dir = tempfile::tempdir().unwrap();
        write_atomic(dir.path(), "f", b"one").unwrap();
        write_atomic(dir.path(), "f", b"two").unwrap();
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"two");
        replace(&dir.path().join("f"), b"three").unwrap();
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"three");
        assert!(!dir.path().join("f.tmp").exists());
    }

    #[cfg(unix)]
    #[test]
    fn a_leftover_temporary_file_does_not_lend_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let leftover = dir.path().join("secret.tmp");
        fs::write(&leftover, b"torn").unwrap();
        fs::set_permissions(&leftover, fs::Permissions::from_mode(0o644)).unwrap();
        write_atomic(dir.path(), "secret", b"key").unwrap();
        let mode = fs::metadata(dir.path().join("secret"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(fs::read(dir.path().join("secret")).unwrap(), b"key");
    }

    #[test]
    fn a_held_lock_refuses_a_second_holder_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ledger.json");
        let held = lock_beside(&file).unwrap();
        assert!(matches!(lock_beside(&file), Err(LockError::Held { .. })));
        drop(held);
        lock_beside(&file).unwrap();
        assert!(dir.path().join("ledger.json.lock").exists());
    }
}
