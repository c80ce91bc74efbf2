//! [`EmbeddedServer`]: one `palisade serve` child process of this same binary.
//!
//! It listens on a loopback port picked at first start and keeps that port and its data
//! directory across `kill`/`restart`, so the proxies (which relay to a fixed address) and
//! the durable state carry over exactly as they would for a crashed and restarted
//! production server. The etcd3 topology runs its nodes with the same type, with the
//! etcd backend's flags as extra arguments.
//!
//! As a [`Deployment`] it supports `kill` (SIGKILL, restart) and `disk` (SIGKILL, damage
//! the newest commit of the store with [`crate::disk`], restart).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::{timeout, Instant};

use super::{log_tail, Deployment, FaultDone, Hit};
use crate::args::FaultKind;
use crate::procs::signal;
use crate::{disk, VerifyError};

/// How long a start may take before the server announces its address.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long to keep retrying a restart on the old port (it may still be closing).
const REBIND_WINDOW: Duration = Duration::from_secs(10);
/// How long a clean stop may take before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A Palisade server process started by the harness.
pub struct EmbeddedServer {
    exe: PathBuf,
    data_dir: PathBuf,
    log: PathBuf,
    extra: Vec<OsString>,
    addr: SocketAddr,
    child: Option<Child>,
}

impl EmbeddedServer {
    /// Starts `exe serve` on a free loopback port with its data in `data_dir` and its
    /// stderr appended to `log`.
    pub async fn start(exe: &Path, data_dir: &Path, log: &Path) -> Result<Self, VerifyError> {
        Self::start_with(exe, data_dir, log, Vec::new()).await
    }

    /// [`EmbeddedServer::start`] with extra `serve` flags, kept for restarts.
    pub async fn start_with(
        exe: &Path,
        data_dir: &Path,
        log: &Path,
        extra: Vec<OsString>,
    ) -> Result<Self, VerifyError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| VerifyError::io(format!("cannot create {}", data_dir.display()), e))?;
        let mut server = EmbeddedServer {
            exe: exe.to_owned(),
            data_dir: data_dir.to_owned(),
            log: log.to_owned(),
            extra,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            child: None,
        };
        let (child, addr) = server.spawn(0).await?;
        server.addr = addr;
        server.child = Some(child);
        Ok(server)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL: nothing is flushed.
    pub async fn crash(&mut self) -> Result<(), VerifyError> {
        if let Some(mut child) = self.child.take() {
            child
                .kill()
                .await
                .map_err(|e| VerifyError::io("cannot kill the server", e))?;
        }
        Ok(())
    }

    /// Starts it again (if it is down) on the same data directory and port.
    pub async fn restart(&mut self) -> Result<(), VerifyError> {
        if self.child.is_some() {
            return Ok(());
        }
        let deadline = Instant::now() + REBIND_WINDOW;
        loop {
            match self.spawn(self.addr.port()).await {
                Ok((child, _)) => {
                    self.child = Some(child);
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// SIGTERM, then SIGKILL if it does not exit in time.
    pub async fn shut_down(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if signal(&child, libc::SIGTERM).is_ok()
            && timeout(STOP_TIMEOUT, child.wait()).await.is_ok()
        {
            return;
        }
        let _ = child.kill().await;
    }

    async fn spawn(&self, port: u16) -> Result<(Child, SocketAddr), VerifyError> {
        spawn(&self.exe, &self.data_dir, &self.log, &self.extra, port).await
    }
}

async fn spawn(
    exe: &Path,
    data_dir: &Path,
    log: &Path,
    extra: &[OsString],
    port: u16,
) -> Result<(Child, SocketAddr), VerifyError> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| VerifyError::io(format!("cannot open {}", log.display()), e))?;
    let mut child = Command::new(exe)
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}"), "--lock-delay-ms"])
        .arg("0")
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        // Inherited settings would change what is being verified.
        .env_remove("PALISADE_POLICIES")
        .env_remove("PALISADE_LOCK_DELAY_MS")
        .env_remove("PALISADE_AUTH_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| VerifyError::io(format!("cannot start {} serve", exe.display()), e))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| VerifyError::Deploy("server stdout was not captured".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let first = match timeout(STARTUP_TIMEOUT, lines.next_line()).await {
        Ok(Ok(Some(line))) => line,
        Ok(Ok(None)) | Ok(Err(_)) => {
            return Err(VerifyError::Deploy(format!(
                "the server exited before announcing its address (see {}):\n{}",
                log.display(),
                log_tail(log)
            )))
        }
        Err(_) => {
            return Err(VerifyError::Deploy(format!(
                "the server did not start within {STARTUP_TIMEOUT:?}"
            )))
        }
    };
    let addr = palisade_api::listening::parse(&first)
        .and_then(|url| url.strip_prefix("http://"))
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .ok_or_else(|| VerifyError::Deploy(format!("unexpected server output: {first:?}")))?;
    // Keep draining stdout so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, addr))
}

#[async_trait]
impl Deployment for EmbeddedServer {
    fn name(&self) -> &'static str {
        "embedded"
    }

    fn describe(&self) -> Vec<String> {
        vec![format!(
            "one palisade serve process at {} (embedded store)",
            self.addr
        )]
    }

    fn lock_addrs(&self) -> Vec<SocketAddr> {
        vec![self.addr]
    }

    fn store_addrs(&self) -> Vec<SocketAddr> {
        vec![self.addr]
    }

    fn faults(&self) -> &'static [FaultKind] {
        &[FaultKind::Kill, FaultKind::Disk]
    }

    async fn fault(&mut self, kind: FaultKind, hit: Hit) -> Result<FaultDone, VerifyError> {
        self.crash().await?;
        let damage = match kind {
            FaultKind::Kill => String::new(),
            FaultKind::Disk => format!(
                ", damaged {}",
                disk::damage_newest_commit(&self.data_dir, hit.pick)?
            ),
            other => {
                return Err(VerifyError::Internal(format!(
                    "{other} is not a fault of the embedded server"
                )))
            }
        };
        tokio::time::sleep(hit.span).await;
        self.restart().await.map_err(|e| match kind {
            FaultKind::Disk => VerifyError::Deploy(format!(
                "the server refused to start on its damaged store (the disk fault was detected): {e}"
            )),
            _ => e,
        })?;
        Ok(FaultDone {
            detail: format!(
                "SIGKILL{damage}, restarted after {} ms",
                hit.span.as_millis()
            ),
            crashed: true,
        })
    }

    async fn heal(&mut self) -> Result<(), VerifyError> {
        self.restart().await
    }

    async fn stop(&mut self) {
        self.shut_down().await;
    }
}
