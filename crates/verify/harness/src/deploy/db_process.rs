//! [`DbProcess`]: a database server the harness runs for a gate target, and the faults it
//! injects into it.
//!
//! The server is started in a process group of its own, so that a fault reaches every
//! process of it at once (PostgreSQL's postmaster and backends, a forked Redis child), as
//! a machine losing power or a stopped VM would:
//! - [`DbProcess::crash`]: SIGKILL to the group; nothing is flushed, and the next start
//!   recovers from whatever the database had made durable;
//! - [`DbProcess::freeze`] / [`DbProcess::thaw`]: SIGSTOP / SIGCONT to the group;
//! - [`DbProcess::lose_power`]: SIGKILL to the group, then every write to its files that
//!   no fsync reached is dropped, when its files are on a [`LazyFs`] ([`files_in`]).
//!
//! Each kind of database (`postgres`, `redis`) says how to start its server (the command,
//! rebuilt for every start) and how to tell it takes requests (the probe); this type does
//! the rest, the same way for all of them. Its output is appended to a log in the run's
//! folder; its files live in a temp directory removed with it.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::{timeout, Instant};

use crate::lazy_fs::LazyFs;
use crate::VerifyError;

/// How long a start (crash recovery included) may take.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a clean stop may take before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds the command that starts the server (called for every start).
pub type Launch = Box<dyn Fn() -> Command + Send + Sync>;
/// True once the server answers requests.
pub type Probe = Box<dyn Fn() -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// One database server process, its folder and its log.
pub struct DbProcess {
    name: &'static str,
    /// The lazy file system its files are on, if any ([`DbProcess::keep_disk`]); unmounted
    /// before `_dir` is removed.
    disk: Option<LazyFs>,
    /// The database's files; removed when the process is dropped.
    _dir: tempfile::TempDir,
    log: PathBuf,
    launch: Launch,
    ready: Probe,
    /// The signal of a clean, fast shutdown.
    stop_signal: libc::c_int,
    child: Option<Child>,
}

impl DbProcess {
    /// Starts the server and waits until it answers.
    pub async fn start(
        name: &'static str,
        dir: tempfile::TempDir,
        log: &Path,
        stop_signal: libc::c_int,
        launch: Launch,
        ready: Probe,
    ) -> Result<DbProcess, VerifyError> {
        let mut db = DbProcess {
            name,
            disk: None,
            _dir: dir,
            log: log.to_owned(),
            launch,
            ready,
            stop_signal,
            child: None,
        };
        db.restart().await?;
        Ok(db)
    }

    /// Starts the server (if it is down) and waits until it answers. A start that exits
    /// at once is tried again until [`STARTUP_TIMEOUT`]: after a SIGKILL, the old processes
    /// may not all have exited yet (PostgreSQL refuses to start beside their shared
    /// memory; a port may still be bound).
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
        let open = |what| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .map_err(|e| {
                    VerifyError::io(format!("cannot open {} for {what}", self.log.display()), e)
                })
        };
        let child = (self.launch)()
            .stdin(Stdio::null())
            .stdout(open("stdout")?)
            .stderr(open("stderr")?)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| VerifyError::io(format!("cannot start {}", self.name), e))?;
        self.child = Some(child);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(VerifyError::Deploy(format!(
                        "{} exited with {status} at start (see {}):\n{}",
                        self.name,
                        self.log.display(),
                        super::log_tail(&self.log)
                    )));
                }
            }
            if (self.ready)().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(VerifyError::Deploy(format!(
                    "{} did not answer within {STARTUP_TIMEOUT:?} (see {})",
                    self.name,
                    self.log.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILL to every process of the server: nothing is flushed.
    pub async fn crash(&mut self) -> Result<(), VerifyError> {
        if let Some(mut child) = self.child.take() {
            signal_group(&child, libc::SIGKILL)?;
            child
                .wait()
                .await
                .map_err(|e| VerifyError::io(format!("cannot reap {}", self.name), e))?;
        }
        Ok(())
    }

    /// Keeps the lazy file system the server's files are on (see [`files_in`]), for
    /// [`DbProcess::lose_power`].
    pub fn keep_disk(&mut self, disk: Option<LazyFs>) {
        self.disk = disk;
    }

    /// [`DbProcess::crash`], then a power loss: what no fsync reached is gone. Returns how
    /// many files lost unsynced writes. An error for a server whose files are not on a
    /// [`LazyFs`]: such a fault would drop nothing.
    pub async fn lose_power(&mut self) -> Result<usize, VerifyError> {
        self.crash().await?;
        let disk = self.disk.as_ref().ok_or_else(|| {
            VerifyError::Internal(format!("{} has no lazy file system to lose", self.name))
        })?;
        Ok(disk.lose_unsynced())
    }

    /// SIGSTOP to every process of the server.
    pub fn freeze(&self) -> Result<(), VerifyError> {
        self.child
            .as_ref()
            .map_or(Ok(()), |child| signal_group(child, libc::SIGSTOP))
    }

    /// SIGCONT to every process of the server.
    pub fn thaw(&self) -> Result<(), VerifyError> {
        self.child
            .as_ref()
            .map_or(Ok(()), |child| signal_group(child, libc::SIGCONT))
    }

    /// Whatever a fault left: running and answering.
    pub async fn heal(&mut self) -> Result<(), VerifyError> {
        self.thaw()?;
        self.restart().await
    }

    /// The clean shutdown signal, then SIGKILL if it takes too long.
    pub async fn stop(&mut self) {
        let _ = self.thaw();
        let Some(mut child) = self.child.take() else {
            return;
        };
        if signal_group(&child, self.stop_signal).is_ok()
            && timeout(STOP_TIMEOUT, child.wait()).await.is_ok()
        {
            return;
        }
        let _ = signal_group(&child, libc::SIGKILL);
        let _ = child.wait().await;
    }
}

/// Dropped without [`DbProcess::stop`] (a run cut short, an error on the way): the whole
/// group goes, not only its leader (which is all `kill_on_drop` reaches), so that no
/// backend or forked child outlives the run.
impl Drop for DbProcess {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            let _ = signal_group(child, libc::SIGKILL);
        }
    }
}

fn signal_group(child: &Child, sig: libc::c_int) -> Result<(), VerifyError> {
    let pid = child
        .id()
        .ok_or_else(|| VerifyError::Internal("the database process was already reaped".into()))?;
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| VerifyError::Internal(format!("pid {pid} out of range")))?;
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

/// How a gate's database is configured: as the gate's preflight insists, or with the one
/// setting it refuses that a crash of the database process can show (the negative
/// control; each database module says which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    Safe,
    Unsafe,
}

/// Whether the run has a replica beside the primary (for `db-failover`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    None,
    /// One replica, cloned and kept through the replication link.
    Standby,
}

/// Where a database keeps its files, in its folder `dir`: `dir` itself, or with `lazy` a
/// [`LazyFs`] view of `dir/files` mounted at `dir/mnt` (for `db-power-loss`; hand it to
/// [`DbProcess::keep_disk`]).
pub fn files_in(dir: &Path, lazy: bool) -> Result<(PathBuf, Option<LazyFs>), VerifyError> {
    if !lazy {
        return Ok((dir.to_owned(), None));
    }
    let (files, mnt) = (dir.join("files"), dir.join("mnt"));
    for folder in [&files, &mnt] {
        std::fs::create_dir(folder)
            .map_err(|e| VerifyError::io(format!("cannot create {}", folder.display()), e))?;
    }
    let disk = LazyFs::mount(&files, &mnt)?;
    Ok((mnt, Some(disk)))
}

/// A started database: its process, where it listens, and how to describe it.
pub struct Database {
    pub process: DbProcess,
    pub addr: std::net::SocketAddr,
    /// One line for the summary and the report: the server, its address, its settings.
    pub description: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `pid` still runs (a zombie waiting to be reaped does not).
    fn running(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    #[tokio::test]
    async fn dropping_it_kills_every_process_of_the_group() {
        let work = tempfile::tempdir().unwrap();
        let pid_file = work.path().join("grandchild.pid");
        let written = pid_file.clone();
        // The leader starts a child of its own, as a postmaster starts its backends.
        let launch: Launch = Box::new(move || {
            let mut command = Command::new("sh");
            let script = format!("sleep 300 & echo $! > {}; wait", written.display());
            command.arg("-c").arg(script);
            command
        });
        let probed = pid_file.clone();
        let ready: Probe = Box::new(move || {
            let started = std::fs::read_to_string(&probed).is_ok_and(|s| s.ends_with('\n'));
            Box::pin(async move { started })
        });
        let log = work.path().join("sleeper.log");
        let dir = tempfile::tempdir().unwrap();
        let db = DbProcess::start("sleeper", dir, &log, libc::SIGTERM, launch, ready)
            .await
            .unwrap();
        let grandchild = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .to_owned();
        assert!(running(&grandchild));
        drop(db);
        let deadline = Instant::now() + Duration::from_secs(10);
        while running(&grandchild) {
            assert!(
                Instant::now() < deadline,
                "pid {grandchild} outlived its DbProcess"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
