//! [`Client::backup_to`]: a backup of a running server (`POST /v1/admin/backup`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;

use crate::client::Client;
use crate::failover::Retry;
use crate::Error;

/// Bound on a whole backup download (the snapshot, then its bytes).
pub const BACKUP_TIMEOUT: Duration = Duration::from_secs(3600);

/// What [`Client::backup_to`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupFile {
    pub backup_id: String,
    /// No lock had an epoch above this in the backup (an upper bound: it counts the
    /// issuer's reservation ceilings).
    pub epoch_bound: u64,
    pub bytes: u64,
}

fn partial(out: &Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Config(format!("{}: {e}", path.display()))
}

impl Client {
    /// Asks the server for a consistent snapshot taken while it serves (admins only) and
    /// writes it to `out`, which must not exist: first to `<out>.partial`, fsync'd, then
    /// renamed, so that `out` is never half a backup. The file is what `palisade admin
    /// restore` reads.
    pub async fn backup_to(&self, out: &Path) -> Result<BackupFile, Error> {
        if out.exists() {
            return Err(Error::Config(format!(
                "{} already exists; refusing to overwrite",
                out.display()
            )));
        }
        let mut response = self
            .call(Retry::Safe, Method::POST, "/v1/admin/backup", |r| {
                r.timeout(BACKUP_TIMEOUT)
            })
            .await?;
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let backup_id = header(palisade_api::headers::BACKUP_ID).unwrap_or_default();
        let epoch_bound = header(palisade_api::headers::BACKUP_EPOCH_BOUND)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let tmp = partial(out);
        let mut file = std::fs::File::create(&tmp).map_err(|e| io_error(&tmp, e))?;
        let mut bytes = 0u64;
        let written = async {
            while let Some(chunk) = response.chunk().await? {
                file.write_all(&chunk).map_err(|e| io_error(&tmp, e))?;
                bytes += chunk.len() as u64;
            }
            file.sync_all().map_err(|e| io_error(&tmp, e))
        };
        if let Err(e) = written.await {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, out).map_err(|e| io_error(out, e))?;
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_error(dir, e))?;
        }
        Ok(BackupFile {
            backup_id,
            epoch_bound,
            bytes,
        })
    }
}
