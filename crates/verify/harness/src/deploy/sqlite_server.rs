//! SQLite for the `sqlite-gate` target: the application holding the file, in a
//! [`DbProcess`].
//!
//! SQLite has no server; the process that writes the file is the one a crash takes
//! down. This module starts that process: `palisade verify-sqlite-app` (this same
//! binary, [`super::sqlite_store::run_app`]) on a free loopback port, over `gate.sqlite3`
//! in a temp directory that outlives its restarts, verifying tokens with the keys of the
//! lock server at `lock_addr`. It answers once its port accepts connections (it binds only
//! after the file is open and the keys are fetched).
//!
//! There is no [`Durability::Unsafe`] for SQLite: the settings that make a SQLite commit
//! unsafe (`synchronous = OFF`, or `NORMAL` in WAL mode) lose commits only when the
//! machine goes down; SQLite `write`s every commit before it returns, and the page cache
//! outlives a killed process, so a process crash (all this harness can inject) cannot
//! show them. `--unsafe-db` is refused for this target rather than run a control that
//! could not fail.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

use super::db_process::{Database, DbProcess, Launch, Probe};
use super::sqlite_store::SETTINGS;
use crate::procs::free_port;
use crate::VerifyError;

/// The database file, in the process's temp directory.
const FILE: &str = "gate.sqlite3";

/// Starts the application process; its output goes to `log`.
pub async fn start(exe: &Path, log: &Path, lock_addr: SocketAddr) -> Result<Database, VerifyError> {
    let dir = tempfile::Builder::new()
        .prefix("palisade-verify-sqlite-")
        .tempdir()
        .map_err(|e| VerifyError::io("cannot create the SQLite folder", e))?;
    let file = dir.path().join(FILE);
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let exe = exe.to_owned();
    let launch: Launch = Box::new(move || {
        let mut app = Command::new(&exe);
        app.arg("verify-sqlite-app")
            .arg("--file")
            .arg(&file)
            .args(["--listen", &addr.to_string()])
            .args(["--lock-url", &format!("http://{lock_addr}")]);
        app
    });
    let ready: Probe = Box::new(move || {
        Box::pin(async move {
            let connect = tokio::net::TcpStream::connect(addr);
            matches!(
                tokio::time::timeout(Duration::from_secs(2), connect).await,
                Ok(Ok(_))
            )
        })
    });
    let description = format!(
        "SQLite ({SETTINGS}), {FILE} held by one application process at {addr} \
         (palisade verify-sqlite-app)"
    );
    let process = DbProcess::start(
        "the SQLite application",
        dir,
        log,
        libc::SIGTERM,
        launch,
        ready,
    )
    .await?;
    Ok(Database {
        process,
        addr,
        description,
    })
}
