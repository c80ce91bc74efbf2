//! The issuer's signing key on disk.
//!
//! The key is created on first start as `issuer.key` in the data directory: 64 hex
//! characters of Ed25519 secret, mode 0600, written to a temporary file, fsync'd and
//! renamed, so a crash never leaves a half-written key. Losing this file means new tokens
//! get a new key id; tokens signed by the old key stop verifying (fail closed).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use palisade_token::Signer;

/// Key file name inside the data directory.
pub const KEY_FILE: &str = "issuer.key";

/// Loads the issuer key from `dir`, creating it if absent.
pub fn load_or_create(dir: &Path) -> Result<Signer, String> {
    let path = dir.join(KEY_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => parse(&path, &text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(dir, &path),
        Err(e) => Err(format!("cannot read key file {}: {e}", path.display())),
    }
}

fn parse(path: &Path, text: &str) -> Result<Signer, String> {
    let bytes =
        hex::decode(text.trim()).map_err(|_| format!("key file {} is not hex", path.display()))?;
    let secret: [u8; 32] = bytes
        .try_into()
        .map_err(|_| format!("key file {} does not hold a 32-byte key", path.display()))?;
    Ok(Signer::from_secret(secret))
}

fn create(dir: &Path, path: &PathBuf) -> Result<Signer, String> {
    let signer = Signer::generate();
    let tmp = dir.join(format!("{KEY_FILE}.tmp"));
    let err = |e: std::io::Error| format!("cannot write key file {}: {e}", path.display());
    {
        let mut options = fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&tmp).map_err(err)?;
        file.write_all(hex::encode(signer.secret()).as_bytes())
            .map_err(err)?;
        file.sync_all().map_err(err)?;
    }
    fs::rename(&tmp, path).map_err(err)?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err)?;
    Ok(signer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_with_0600_then_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path()).unwrap();
        let b = load_or_create(dir.path()).unwrap();
        assert_eq!(a.key_id(), b.key_id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(dir.path().join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn damaged_key_file_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(KEY_FILE), "zz").unwrap();
        let err = load_or_create(dir.path()).unwrap_err();
        assert!(err.contains("issuer.key"), "{err}");
    }
}
