//! The gate's application as a process of its own, in a [`DbProcess`]: for `sqlite-gate`
//! (where that process is the database a crash takes down), and for `--gate-lang python`
//! (the Python gate, `gate_app.py`, run by a Python interpreter).
//!
//! The process serves the store routes on a free loopback port given with `--listen`,
//! verifying tokens with the keys of the lock server given with `--lock-url`, and binds
//! its port last (after the database is set up and the keys fetched), so it is ready once
//! the port accepts connections. Its files (the SQLite file, the preflight's refusal) live
//! in a temp directory that outlives its restarts.
//!
//! - [`rust_sqlite`] starts `palisade verify-sqlite-app` (this same binary,
//!   [`super::sqlite_store::run_app`]) over `gate.sqlite3`;
//! - [`python`] starts `gate_app.py` (embedded in this binary, written into the run's
//!   folder) over `gate.sqlite3` or a PostgreSQL connection string.
//!
//! The settings that make a SQLite commit unsafe (`synchronous = OFF`, or `NORMAL` in WAL
//! mode) lose commits only when the machine goes down; SQLite `write`s every commit before
//! it returns, and the page cache outlives a killed process. So the SQLite file can be
//! kept on a lazy file system (`lazy`, for `db-power-loss`), and only there is
//! [`Synchronous::Off`] (`--unsafe-db`) a control that can fail.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use super::db_process::{files_in, Database, DbProcess, Launch, Probe};
use super::sqlite_store::Synchronous;
use crate::lazy_fs::LazyFs;
use crate::procs::free_port;
use crate::VerifyError;

/// The SQLite file, in the process's temp directory.
const SQLITE_FILE: &str = "gate.sqlite3";
/// Where the Python application writes the preflight's refusal (`--unsafe-db`).
const REFUSAL_FILE: &str = "preflight-refusal.txt";
/// The Python application, written into the run's folder at start.
const GATE_APP: &str = include_str!("gate_app.py");

/// The database a Python application writes to.
pub enum PythonDb {
    Sqlite(Synchronous),
    /// A PostgreSQL connection string; `unsafe_db`: the preflight must refuse it.
    Postgres {
        dsn: String,
        unsafe_db: bool,
    },
}

/// A started application process.
pub struct AppProcess {
    pub database: Database,
    /// What the preflight said of the database, when it refused it (`--unsafe-db`).
    pub preflight_refusal: Option<String>,
}

/// `palisade verify-sqlite-app` over a SQLite file (on a lazy file system if `lazy`);
/// its output goes to `log`.
pub async fn rust_sqlite(
    exe: &Path,
    log: &Path,
    lock_addr: SocketAddr,
    synchronous: Synchronous,
    lazy: bool,
) -> Result<AppProcess, VerifyError> {
    let dir = folder("palisade-verify-sqlite-")?;
    let (files, disk) = files_in(dir.path(), lazy)?;
    let args = vec![
        "verify-sqlite-app".into(),
        "--file".into(),
        files.join(SQLITE_FILE).into(),
        "--synchronous".into(),
        synchronous.pragma().to_lowercase().into(),
    ];
    let what = format!(
        "SQLite ({}), {SQLITE_FILE}{} held by one application process \
         (palisade verify-sqlite-app)",
        synchronous.settings(),
        on_disk(&disk)
    );
    let database = start(exe.to_owned(), args, (dir, disk), log, lock_addr, what).await?;
    Ok(AppProcess {
        database,
        preflight_refusal: None,
    })
}

/// `gate_app.py` (written to `out`) run by `python`, writing to `db`; its output goes to
/// `log`.
pub async fn python(
    python: &Path,
    out: &Path,
    log: &Path,
    db: PythonDb,
    lock_addr: SocketAddr,
    lazy: bool,
) -> Result<AppProcess, VerifyError> {
    let script = out.join("gate_app.py");
    std::fs::write(&script, GATE_APP)
        .map_err(|e| VerifyError::io(format!("cannot write {}", script.display()), e))?;
    let dir = folder("palisade-verify-app-")?;
    let refusal = dir.path().join(REFUSAL_FILE);
    let (files, disk) = files_in(dir.path(), lazy)?;
    let mut args: Vec<OsString> = vec![script.into()];
    let what = match &db {
        PythonDb::Sqlite(synchronous) => {
            args.extend(["--db".into(), "sqlite".into(), "--file".into()]);
            args.push(files.join(SQLITE_FILE).into());
            args.extend(["--synchronous".into(), synchronous.pragma().into()]);
            format!(
                "SQLite ({}), {SQLITE_FILE}{} held by one Python application process \
                 (gate_app.py)",
                synchronous.settings(),
                on_disk(&disk)
            )
        }
        PythonDb::Postgres { dsn, unsafe_db } => {
            args.extend(["--db".into(), "postgres".into(), "--dsn".into(), dsn.into()]);
            if *unsafe_db {
                args.extend([
                    "--unsafe".into(),
                    "--refusal-file".into(),
                    refusal.clone().into(),
                ]);
            }
            "the Python application (gate_app.py)".to_owned()
        }
    };
    let database = start(python.to_owned(), args, (dir, disk), log, lock_addr, what)
        .await
        .map_err(|e| match e {
            VerifyError::Io { context, source }
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                VerifyError::Deploy(format!(
                    "{context}: no {} (give an interpreter with palisade-client and psycopg \
                     installed with --python)",
                    python.display()
                ))
            }
            other => other,
        })?;
    let preflight_refusal = std::fs::read_to_string(&refusal).ok();
    if matches!(
        db,
        PythonDb::Postgres {
            unsafe_db: true,
            ..
        }
    ) && preflight_refusal.is_none()
    {
        return Err(VerifyError::Deploy(
            "the Python application wrote no preflight refusal for an unsafe database".into(),
        ));
    }
    Ok(AppProcess {
        database,
        preflight_refusal,
    })
}

/// How the description says where the file is.
fn on_disk(disk: &Option<LazyFs>) -> &'static str {
    match disk {
        Some(_) => " on a lazy file system (unsynced writes lost at a power loss)",
        None => "",
    }
}

fn folder(prefix: &str) -> Result<tempfile::TempDir, VerifyError> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| VerifyError::io("cannot create the application's folder", e))
}

/// Starts `program args --listen <free port> --lock-url <lock server>` and waits until its
/// port accepts connections.
async fn start(
    program: PathBuf,
    args: Vec<OsString>,
    (dir, disk): (tempfile::TempDir, Option<LazyFs>),
    log: &Path,
    lock_addr: SocketAddr,
    what: String,
) -> Result<Database, VerifyError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let launch: Launch = Box::new(move || {
        let mut app = Command::new(&program);
        app.args(&args)
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
    let name = "the gate's application";
    let mut process = DbProcess::start(name, dir, log, libc::SIGTERM, launch, ready).await?;
    process.keep_disk(disk);
    Ok(Database {
        process,
        addr,
        description: format!("{what} at {addr}"),
    })
}
