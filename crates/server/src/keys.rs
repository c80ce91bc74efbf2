//! The issuer's signing key on disk.
//!
//! The key is created on first start as `issuer.key` in the data directory: 64 hex
//! characters of Ed25519 secret, mode 0600, written to a temporary file, fsync'd and
//! renamed, so a crash never leaves a half-written key. Losing this file means new tokens
//! get a new key id; tokens signed by the old key stop verifying (fail closed).
//!
//! Several nodes sharing one etcd cluster must sign with one key and trust each other's:
//! `--signing-key-file` names a key file in the same format (which must not be readable
//! by group or others), and each `--trust-key-file` adds a key to verify with, either a
//! public key in base64url (as `GET /v1/keys` shows it) or a secret key file.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use palisade_token::{KeyRing, Signer};

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

/// Loads the configured signing key, or the data directory's (created if absent).
pub fn load_configured_or_create(file: Option<&Path>, dir: &Path) -> Result<Signer, String> {
    match file {
        Some(path) => load_secret(path),
        None => load_or_create(dir),
    }
}

/// Loads a secret key file, refusing one that group or others may read: whoever reads it
/// can mint tokens for every lock.
pub fn load_secret(path: &Path) -> Result<Signer, String> {
    let text = fs::read_to_string(path)
        .map_err(|e| format!("cannot read key file {}: {e}", path.display()))?;
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
    parse(path, &text)
}

/// The keys a server verifies tokens with: its own, plus each trust file's.
pub fn trusted_ring(signer: &Signer, trust_files: &[PathBuf]) -> Result<KeyRing, String> {
    let mut ring = KeyRing::new();
    ring.insert(signer.public_key());
    for path in trust_files {
        let text = fs::read_to_string(path)
            .map_err(|e| format!("cannot read trust key file {}: {e}", path.display()))?;
        let text = text.trim();
        if text.len() == 64 {
            ring.insert(load_secret(path)?.public_key());
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
        ring.insert_bytes(&public)
            .map_err(|e| format!("trust key file {}: {e}", path.display()))?;
    }
    Ok(ring)
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

    #[cfg(unix)]
    #[test]
    fn configured_keys_and_trust_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let ours = load_or_create(dir.path()).unwrap();
        let key_file = dir.path().join(KEY_FILE);
        assert_eq!(load_secret(&key_file).unwrap().key_id(), ours.key_id());
        fs::set_permissions(&key_file, fs::Permissions::from_mode(0o640)).unwrap();
        let err = load_secret(&key_file).unwrap_err();
        assert!(err.contains("chmod 600"), "{err}");
        fs::set_permissions(&key_file, fs::Permissions::from_mode(0o600)).unwrap();

        let other = Signer::generate();
        let public = dir.path().join("other.pub");
        fs::write(
            &public,
            format!("{}\n", B64.encode(other.public_key().as_bytes())),
        )
        .unwrap();
        let third = tempfile::tempdir().unwrap();
        let third_signer = load_or_create(third.path()).unwrap();
        let ring = trusted_ring(&ours, &[public.clone(), third.path().join(KEY_FILE)]).unwrap();
        for key_id in [ours.key_id(), other.key_id(), third_signer.key_id()] {
            assert!(ring.get(key_id).is_some(), "{key_id} not trusted");
        }
        fs::write(&public, "not a key").unwrap();
        assert!(trusted_ring(&ours, &[public]).is_err());
    }

    #[test]
    fn damaged_key_file_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(KEY_FILE), "zz").unwrap();
        let err = load_or_create(dir.path()).unwrap_err();
        assert!(err.contains("issuer.key"), "{err}");
    }
}
