//! `palisade verify --auth`: the deployment runs with an auth file, one principal per
//! worker (every verb on every lock) and one admin for the harness's own reads. Each
//! worker authenticates with its own key, so every check of the auth layer is on the
//! path under test: a worker's leases are its own, and its writes must carry its own
//! tokens (identity, permission and ownership, S14).

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::VerifyError;

/// The environment variable a worker reads its bearer key from.
pub const KEY_ENV: &str = "PALISADE_KEY";

/// An auth file and the keys of its principals.
#[derive(Debug, Clone)]
pub struct AuthSetup {
    pub file: PathBuf,
    /// The harness's own key (principal `verify`, an admin).
    pub admin_key: String,
    /// Worker `i` (1-based) uses `worker_keys[i - 1]` (principal `w<i>`).
    pub worker_keys: Vec<String>,
}

fn new_key() -> String {
    format!("pal_{}", B64.encode(rand::random::<[u8; 32]>()))
}

fn digest(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl AuthSetup {
    /// Writes `auth.toml` into `dir` for `workers` workers.
    pub fn write(dir: &Path, workers: u32) -> Result<AuthSetup, VerifyError> {
        let admin_key = new_key();
        let worker_keys: Vec<String> = (0..workers).map(|_| new_key()).collect();
        let mut text = format!(
            "[[principal]]\nname = \"verify\"\nkey_sha256 = \"{}\"\nadmin = true\n\n",
            digest(&admin_key)
        );
        for (i, key) in worker_keys.iter().enumerate() {
            text.push_str(&format!(
                "[[principal]]\nname = \"w{}\"\nkey_sha256 = \"{}\"\n\
                 [[principal.grant]]\nlocks = \"*\"\nallow = [\"acquire\", \"read\", \"write\", \"check\"]\n\n",
                i + 1,
                digest(key)
            ));
        }
        let file = dir.join("auth.toml");
        std::fs::write(&file, text)
            .map_err(|e| VerifyError::io(format!("cannot write {}", file.display()), e))?;
        Ok(AuthSetup {
            file,
            admin_key,
            worker_keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fresh_and_digests_are_sha256_of_the_key_text() {
        assert_ne!(new_key(), new_key());
        assert_eq!(
            digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let dir = tempfile::tempdir().unwrap();
        let setup = AuthSetup::write(dir.path(), 3).unwrap();
        let text = std::fs::read_to_string(&setup.file).unwrap();
        assert_eq!(setup.worker_keys.len(), 3);
        for key in setup.worker_keys.iter().chain([&setup.admin_key]) {
            assert!(text.contains(&digest(key)));
            assert!(!text.contains(key.as_str()), "the file holds digests only");
        }
    }
}
