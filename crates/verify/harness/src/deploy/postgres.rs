//! [`PgCluster`]: a throwaway PostgreSQL server, started, crashed and frozen by the harness.
//!
//! The database of the `postgres-gate` target: `initdb` into a temp directory, then the
//! `postgres` server on a free loopback port (TCP only, trust authentication, the
//! `postgres` role), its output appended to `postgres.log` in the run's folder. As root,
//! PostgreSQL refuses to run, so the cluster then belongs to `nobody` and the server runs
//! as `nobody` (the directory lives under `/tmp`, which `nobody` can reach).
//!
//! The server is started in a process group of its own, so that a fault reaches the
//! postmaster and every backend at once, as a machine losing power or a stopped VM would:
//! - [`PgCluster::crash`]: SIGKILL to the group. Nothing is flushed; the next start runs
//!   PostgreSQL's crash recovery from its WAL.
//! - [`PgCluster::freeze`] / [`PgCluster::thaw`]: SIGSTOP / SIGCONT to the group.
//!
//! Where the binaries are: `PALISADE_PG_BIN`, else the newest
//! `/usr/lib/postgresql/<version>/bin` (Debian's layout), else `PATH`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::{timeout, Instant};

use crate::procs::free_port;
use crate::VerifyError;

/// How long a start (including crash recovery) may take.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a clean stop may take before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How the cluster is configured: as the gate's preflight insists, or with the setting it
/// refuses (the negative control).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// PostgreSQL's defaults: `fsync`, `synchronous_commit` and `full_page_writes` on.
    Safe,
    /// `synchronous_commit = off`: a commit is acknowledged before its WAL reaches the
    /// disk, so a crash loses the last acknowledged transactions, gate marks included.
    /// `wal_writer_delay` is at its maximum (10 s) so that the window a crash can fall in
    /// is wide enough for a short run to hit it.
    AsyncCommit,
}

impl Durability {
    /// The `-c name=value` settings the server starts with.
    fn settings(self) -> &'static [&'static str] {
        match self {
            Durability::Safe => &[],
            Durability::AsyncCommit => &["synchronous_commit=off", "wal_writer_delay=10s"],
        }
    }

    /// What makes it unsafe, for the summary and the report (`None` when safe).
    pub fn unsafe_setting(self) -> Option<&'static str> {
        match self {
            Durability::Safe => None,
            Durability::AsyncCommit => Some("synchronous_commit=off"),
        }
    }
}

/// A PostgreSQL server process and its data directory.
pub struct PgCluster {
    bin: PathBuf,
    /// Owns the cluster's folder; removed when the cluster is dropped.
    dir: tempfile::TempDir,
    log: PathBuf,
    port: u16,
    durability: Durability,
    user: Option<(u32, u32)>,
    child: Option<Child>,
}

impl PgCluster {
    /// `initdb` and a first start; the server's output goes to `log`.
    pub async fn start(log: &Path, durability: Durability) -> Result<PgCluster, VerifyError> {
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
        let mut cluster = PgCluster {
            bin,
            dir,
            log: log.to_owned(),
            port: free_port()?,
            durability,
            user,
            child: None,
        };
        let init = cluster
            .command("initdb")
            .arg("-D")
            .arg(cluster.data())
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
        cluster.restart().await?;
        Ok(cluster)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The tokio-postgres connection string.
    pub fn config(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=2",
            self.port
        )
    }

    pub fn durability(&self) -> Durability {
        self.durability
    }

    pub fn describe(&self) -> String {
        let settings = self.durability.settings();
        format!(
            "PostgreSQL at {} ({}), {}",
            self.addr(),
            self.bin.display(),
            if settings.is_empty() {
                "default durability settings".to_owned()
            } else {
                settings.join(", ")
            }
        )
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command
            .current_dir(self.dir.path())
            .env("LC_ALL", "C")
            .stdin(Stdio::null());
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        command
    }

    /// Starts the server (if it is down) on the same data directory and port, and waits
    /// until it takes connections (crash recovery included). A start that exits at once is
    /// tried again until [`STARTUP_TIMEOUT`]: after a SIGKILL, the old backends may not all
    /// have exited yet, and PostgreSQL refuses to start beside their shared memory.
    pub async fn restart(&mut self) -> Result<(), VerifyError> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            match self.start_once(deadline).await {
                Err(_) if self.child.is_none() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                done => return done,
            }
        }
    }

    async fn start_once(&mut self, deadline: Instant) -> Result<(), VerifyError> {
        if self.child.is_some() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| VerifyError::io(format!("cannot open {}", self.log.display()), e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| VerifyError::io("cannot share the PostgreSQL log", e))?;
        let mut command = self.command("postgres");
        command
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string(), "-h", "127.0.0.1"])
            .args(["-c", "unix_socket_directories=", "-c", "max_connections=60"]);
        for setting in self.durability.settings() {
            command.args(["-c", setting]);
        }
        let child = command
            .stdout(log)
            .stderr(log2)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| VerifyError::io("cannot start postgres", e))?;
        self.child = Some(child);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(VerifyError::Deploy(format!(
                        "postgres exited with {status} at start (see {}):\n{}",
                        self.log.display(),
                        super::log_tail(&self.log)
                    )));
                }
            }
            let probe = timeout(
                Duration::from_secs(2),
                tokio_postgres::connect(&self.config(), tokio_postgres::NoTls),
            )
            .await;
            if let Ok(Ok((client, connection))) = probe {
                drop(client);
                let _ = connection.await;
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(VerifyError::Deploy(format!(
                    "postgres took no connection within {STARTUP_TIMEOUT:?} (see {})",
                    self.log.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILL to the postmaster and every backend: nothing is flushed.
    pub async fn crash(&mut self) -> Result<(), VerifyError> {
        if let Some(mut child) = self.child.take() {
            self.signal_group(&child, libc::SIGKILL)?;
            child
                .wait()
                .await
                .map_err(|e| VerifyError::io("cannot reap postgres", e))?;
        }
        Ok(())
    }

    /// SIGSTOP to every process of the server.
    pub fn freeze(&self) -> Result<(), VerifyError> {
        match &self.child {
            Some(child) => self.signal_group(child, libc::SIGSTOP),
            None => Ok(()),
        }
    }

    /// SIGCONT to every process of the server.
    pub fn thaw(&self) -> Result<(), VerifyError> {
        match &self.child {
            Some(child) => self.signal_group(child, libc::SIGCONT),
            None => Ok(()),
        }
    }

    /// Whatever a fault left: running and taking connections.
    pub async fn heal(&mut self) -> Result<(), VerifyError> {
        self.thaw()?;
        self.restart().await
    }

    /// A fast shutdown (SIGINT), then SIGKILL if it takes too long.
    pub async fn stop(&mut self) {
        let _ = self.thaw();
        let Some(mut child) = self.child.take() else {
            return;
        };
        if self.signal_group(&child, libc::SIGINT).is_ok()
            && timeout(STOP_TIMEOUT, child.wait()).await.is_ok()
        {
            return;
        }
        let _ = self.signal_group(&child, libc::SIGKILL);
        let _ = child.wait().await;
    }

    fn signal_group(&self, child: &Child, sig: libc::c_int) -> Result<(), VerifyError> {
        let pid = group_of(child)?;
        // SAFETY: kill(2) has no memory-safety preconditions. The group is the one our
        // unreaped child leads (process_group(0)), so its id cannot have been reused.
        if unsafe { libc::kill(-pid, sig) } != 0 {
            return Err(VerifyError::io(
                format!("kill(-{pid}, {sig}) failed"),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }
}

/// The process group our child leads, read before it is reaped.
fn group_of(child: &Child) -> Result<libc::pid_t, VerifyError> {
    let pid = child
        .id()
        .ok_or_else(|| VerifyError::Internal("postgres has already been reaped".into()))?;
    libc::pid_t::try_from(pid).map_err(|_| VerifyError::Internal(format!("pid {pid} out of range")))
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
