//! Replacing a small file so that a crash leaves the old one or the new one, never a torn
//! one: the one implementation of "temporary file, fsync, rename, fsync the directory"
//! for the files kept beside the database (the key set, the data directory's marker, the
//! epoch ledgers of the embedded and etcd backends).
//!
//! The write-ahead log and the epoch horizon replace their files through the log's own
//! directory interface (`redb_backend::wal`), which the failure tests swap for one that
//! fails or tears writes on purpose; they do not use this.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::path::Path;

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

/// Makes the directory's entries (a file created, renamed or removed in it) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    fs::File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
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
}
