//! PostgreSQL for the `postgres-gate` target: a throwaway cluster in a [`DbProcess`].
//!
//! `initdb` into a temp directory under `/tmp`, then `postgres` on a free loopback port
//! (TCP only, trust authentication, the `postgres` role). PostgreSQL refuses to run as
//! root, so as root the cluster belongs to `nobody` and the server runs as `nobody`.
//!
//! [`Durability::Unsafe`] is `synchronous_commit = off`: a commit is acknowledged before
//! its WAL reaches the disk, and a crash of the server (its WAL buffers are shared memory,
//! gone with the processes) loses the last acknowledged transactions, gate marks
//! included. `wal_writer_delay` is then at its maximum (10 s), so that the window a crash
//! can fall in is wide enough for a short run to hit it.
//!
//! Where the binaries are: `PALISADE_PG_BIN`, else the newest
//! `/usr/lib/postgresql/<version>/bin` (Debian's layout), else `PATH`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use super::db_process::{Database, DbProcess, Durability, Launch, Probe};
use crate::procs::free_port;
use crate::VerifyError;

/// The setting [`Durability::Unsafe`] stands for, as the report names it.
pub const UNSAFE_SETTING: &str = "synchronous_commit=off";

/// `initdb` and a first start; the server's output goes to `log`.
pub async fn start(log: &Path, durability: Durability) -> Result<Database, VerifyError> {
    let bin = bin_dir()?;
    let user = server_user()?;
    let dir = tempfile::Builder::new()
        .prefix("palisade-verify-pg-")
        .tempdir_in("/tmp")
        .map_err(|e| VerifyError::io("cannot create the PostgreSQL folder", e))?;
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
            .map_err(|e| VerifyError::io("cannot give the PostgreSQL folder to nobody", e))?;
    }
    let (folder, data) = (dir.path().to_owned(), dir.path().join("data"));
    let command = move |program: &str| {
        let mut command = Command::new(bin.join(program));
        command.current_dir(&folder).env("LC_ALL", "C");
        if let Some((uid, gid)) = user {
            command.uid(uid).gid(gid);
        }
        command
    };
    let init = command("initdb")
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "--auth=trust", "-E", "UTF8"])
        .output()
        .await
        .map_err(|e| VerifyError::io("cannot run initdb", e))?;
    if !init.status.success() {
        return Err(VerifyError::Deploy(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&init.stderr).trim()
        )));
    }

    let port = free_port()?;
    let settings: &[&str] = match durability {
        Durability::Safe => &[],
        Durability::Unsafe => &[UNSAFE_SETTING, "wal_writer_delay=10s"],
    };
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let description = format!(
        "PostgreSQL at 127.0.0.1:{port}, {}",
        if settings.is_empty() {
            "default durability settings".to_owned()
        } else {
            settings.join(", ")
        }
    );
    let launch: Launch = Box::new(move || {
        let mut postgres = command("postgres");
        postgres
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-h", "127.0.0.1"])
            .args(["-c", "unix_socket_directories=", "-c", "max_connections=60"]);
        for setting in settings {
            postgres.args(["-c", setting]);
        }
        postgres
    });
    let ready: Probe = Box::new(move || {
        let url = client_config(addr);
        Box::pin(async move {
            let connect = tokio_postgres::connect(&url, tokio_postgres::NoTls);
            match tokio::time::timeout(Duration::from_secs(2), connect).await {
                Ok(Ok((client, connection))) => {
                    drop(client);
                    let _ = connection.await;
                    true
                }
                _ => false,
            }
        })
    });
    // SIGINT is PostgreSQL's fast shutdown.
    let process = DbProcess::start("postgres", dir, log, libc::SIGINT, launch, ready).await?;
    Ok(Database {
        process,
        addr,
        description,
    })
}

/// The tokio-postgres configuration of a client of the cluster reached at `addr`.
pub fn client_config(addr: SocketAddr) -> String {
    format!(
        "host={} port={} user=postgres dbname=postgres connect_timeout=2",
        addr.ip(),
        addr.port()
    )
}

/// Where `initdb` and `postgres` are.
fn bin_dir() -> Result<PathBuf, VerifyError> {
    if let Some(dir) = std::env::var_os("PALISADE_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    let on_path = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).find(|dir| dir.join("initdb").is_file()));
    on_path.ok_or_else(|| {
        VerifyError::Deploy(
            "PostgreSQL's server binaries (initdb, postgres) were not found: install them \
             (Debian: postgresql) or set PALISADE_PG_BIN"
                .into(),
        )
    })
}

/// PostgreSQL refuses to run as root: as root, the cluster runs as `nobody`.
fn server_user() -> Result<Option<(u32, u32)>, VerifyError> {
    // SAFETY: geteuid has no preconditions; getpwnam returns null or a pointer to a static
    // record that is copied from at once, on this thread.
    unsafe {
        if libc::geteuid() != 0 {
            return Ok(None);
        }
        let pw = libc::getpwnam(c"nobody".as_ptr());
        if pw.is_null() {
            return Err(VerifyError::Deploy(
                "running as root needs a `nobody` user for PostgreSQL".into(),
            ));
        }
        Ok(Some(((*pw).pw_uid, (*pw).pw_gid)))
    }
}
