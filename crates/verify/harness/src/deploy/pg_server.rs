//! PostgreSQL for the `postgres-gate` target: a throwaway cluster in a [`DbProcess`], and
//! for `db-failover` a streaming replica beside it.
//!
//! `initdb` into a temp directory under `/tmp`, then `postgres` on a free loopback port
//! (TCP only, trust authentication, the `postgres` role). PostgreSQL refuses to run as
//! root, so as root the cluster belongs to `nobody` and the server runs as `nobody`.
//!
//! Alone, [`Durability::Unsafe`] is `synchronous_commit = off`: a commit is acknowledged
//! before its WAL reaches the disk, and a crash of the server (its WAL buffers are shared
//! memory, gone with the processes) loses the last acknowledged transactions, gate marks
//! included. `wal_writer_delay` is then at its maximum (10 s), so that the window a crash
//! can fall in is wide enough for a short run to hit it.
//!
//! With a replica ([`Replication`]), [`start_replica`] clones the primary with
//! `pg_basebackup -R` through a proxy (the replication link) and starts it as a hot
//! standby; [`promote`] makes it the primary (`pg_promote()`). [`Durability::Safe`] is a
//! synchronous standby (`synchronous_standby_names = '*'`: a commit is acknowledged once
//! the replica has flushed it), [`Durability::Unsafe`] an asynchronous one (PostgreSQL's
//! default, which the gate's preflight refuses once a replica is connected): a primary
//! killed before its last commits reached the replica takes them with it, marks included.
//! Every server of a replicated run starts with the same settings, so a promoted replica
//! wants a synchronous standby of its own.
//!
//! Where the binaries are: `PALISADE_PG_BIN`, else the newest
//! `/usr/lib/postgresql/<version>/bin` (Debian's layout), else `PATH`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use super::db_process::{Database, DbProcess, Durability, Launch, Probe, Replication};
use crate::procs::free_port;
use crate::VerifyError;

/// The setting [`Durability::Unsafe`] stands for without a replica, as the report names it.
pub const UNSAFE_SETTING: &str = "synchronous_commit=off";

/// The `-c` settings of every server of the run.
fn settings(durability: Durability, replication: Replication) -> &'static [&'static str] {
    match (replication, durability) {
        (Replication::None, Durability::Safe) => &[],
        (Replication::None, Durability::Unsafe) => &[UNSAFE_SETTING, "wal_writer_delay=10s"],
        (Replication::Standby, Durability::Safe) => &["synchronous_standby_names=*"],
        (Replication::Standby, Durability::Unsafe) => &[],
    }
}

/// How to run PostgreSQL's programs here (as `nobody` when root).
#[derive(Clone)]
struct Programs {
    bin: PathBuf,
    user: Option<(u32, u32)>,
}

impl Programs {
    fn find() -> Result<Programs, VerifyError> {
        Ok(Programs {
            bin: bin_dir()?,
            user: server_user()?,
        })
    }

    /// A folder under `/tmp` the server's user owns.
    fn folder(&self, prefix: &str) -> Result<tempfile::TempDir, VerifyError> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/tmp")
            .map_err(|e| VerifyError::io("cannot create the PostgreSQL folder", e))?;
        if let Some((uid, gid)) = self.user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| VerifyError::io("cannot give the PostgreSQL folder to nobody", e))?;
        }
        Ok(dir)
    }

    fn command(&self, program: &str, folder: &Path) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command.current_dir(folder).env("LC_ALL", "C");
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        command
    }

    /// Runs `program -D <folder>/data args` to completion; its stderr in the error.
    async fn run(&self, folder: &Path, program: &str, args: &[&str]) -> Result<(), VerifyError> {
        let done = self
            .command(program, folder)
            .arg("-D")
            .arg(folder.join("data"))
            .args(args)
            .output()
            .await
            .map_err(|e| VerifyError::io(format!("cannot run {program}"), e))?;
        if !done.status.success() {
            return Err(VerifyError::Deploy(format!(
                "{program} failed: {}",
                String::from_utf8_lossy(&done.stderr).trim()
            )));
        }
        Ok(())
    }
}

/// `initdb` and a first start; the server's output goes to `log`.
pub async fn start(
    log: &Path,
    durability: Durability,
    replication: Replication,
) -> Result<Database, VerifyError> {
    let programs = Programs::find()?;
    let dir = programs.folder("palisade-verify-pg-")?;
    let init = ["-U", "postgres", "--auth=trust", "-E", "UTF8"];
    programs.run(dir.path(), "initdb", &init).await?;
    let settings = settings(durability, replication);
    serve(programs, dir, log, settings, "PostgreSQL").await
}

/// A hot standby cloned from the primary reached at `primary` (the replication link),
/// with every server's settings; its output goes to `log`. It streams from `primary`.
pub async fn start_replica(
    log: &Path,
    primary: SocketAddr,
    durability: Durability,
) -> Result<Database, VerifyError> {
    let programs = Programs::find()?;
    let dir = programs.folder("palisade-verify-pg-replica-")?;
    let (host, port) = (primary.ip().to_string(), primary.port().to_string());
    let clone = [
        "-h", &host, "-p", &port, "-U", "postgres", "-R", "-X", "stream", "-c", "fast",
    ];
    programs.run(dir.path(), "pg_basebackup", &clone).await?;
    let settings = settings(durability, Replication::Standby);
    serve(programs, dir, log, settings, "PostgreSQL hot standby").await
}

/// Runs `postgres` on `dir/data` on a free port with `settings` until it takes
/// connections.
async fn serve(
    programs: Programs,
    dir: tempfile::TempDir,
    log: &Path,
    settings: &'static [&'static str],
    what: &str,
) -> Result<Database, VerifyError> {
    let (folder, data) = (dir.path().to_owned(), dir.path().join("data"));
    let port = free_port()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let description = format!(
        "{what} at 127.0.0.1:{port}, {}",
        if settings.is_empty() {
            "default durability settings".to_owned()
        } else {
            settings.join(", ")
        }
    );
    let launch: Launch = Box::new(move || {
        let mut postgres = programs.command("postgres", &folder);
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

/// Waits until the primary at `primary` has a standby streaming from it (and, with
/// `synchronous`, counted as synchronous), at most `within`.
pub async fn await_standby(
    primary: SocketAddr,
    synchronous: bool,
    within: Duration,
) -> Result<(), VerifyError> {
    let query = if synchronous {
        "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'"
    } else {
        "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
    };
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Ok(n) = query_one::<i64>(primary, query).await {
            if n > 0 {
                return Ok(());
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(VerifyError::Deploy(format!(
                "no standby streaming from the PostgreSQL primary at {primary} within {within:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Promotes the standby at `replica` to primary (`pg_promote()`, which waits until done).
pub async fn promote(replica: SocketAddr) -> Result<(), VerifyError> {
    match query_one::<bool>(replica, "SELECT pg_promote(true, 60)").await {
        Ok(true) => Ok(()),
        Ok(false) => Err(VerifyError::Deploy(format!(
            "the standby at {replica} was not promoted within 60 s"
        ))),
        Err(e) => Err(VerifyError::Deploy(format!(
            "cannot promote the standby at {replica}: {e}"
        ))),
    }
}

/// The one value `query` answers on the server at `addr`.
async fn query_one<T>(addr: SocketAddr, query: &str) -> Result<T, String>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    let (client, connection) = tokio_postgres::connect(&client_config(addr), tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let row = client
        .query_one(query, &[])
        .await
        .map_err(|e| e.to_string())?;
    row.try_get(0).map_err(|e| e.to_string())
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
