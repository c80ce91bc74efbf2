//! [`EmbeddedServer`]: one `palisade serve` child process of this same binary.
//!
//! It listens on a loopback port picked at first start and keeps that port and its data
//! directory across `kill`/`restart`, so the proxies (which relay to a fixed address) and
//! the durable state carry over exactly as they would for a crashed and restarted
//! production server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::{timeout, Instant};

use super::Deployment;
use crate::procs::signal;
use crate::VerifyError;

/// How long a start may take before the server announces its address.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long to keep retrying a restart on the old port (it may still be closing).
const REBIND_WINDOW: Duration = Duration::from_secs(10);
/// How long a clean stop may take before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
const LISTENING_PREFIX: &str = "palisade listening on http://";

/// A Palisade server process started by the harness.
pub struct EmbeddedServer {
    exe: PathBuf,
    data_dir: PathBuf,
    log: PathBuf,
    addr: SocketAddr,
    child: Option<Child>,
}

impl EmbeddedServer {
    /// Starts `exe serve` on a free loopback port with its data in `data_dir` and its
    /// stderr appended to `log`.
    pub async fn start(exe: &Path, data_dir: &Path, log: &Path) -> Result<Self, VerifyError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| VerifyError::io(format!("cannot create {}", data_dir.display()), e))?;
        let (child, addr) = spawn(exe, data_dir, log, 0).await?;
        Ok(EmbeddedServer {
            exe: exe.to_owned(),
            data_dir: data_dir.to_owned(),
            log: log.to_owned(),
            addr,
            child: Some(child),
        })
    }
}

async fn spawn(
    exe: &Path,
    data_dir: &Path,
    log: &Path,
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
        // Inherited settings would change what is being verified.
        .env_remove("PALISADE_POLICIES")
        .env_remove("PALISADE_LOCK_DELAY_MS")
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
                "the server exited before announcing its address (see {})",
                log.display()
            )))
        }
        Err(_) => {
            return Err(VerifyError::Deploy(format!(
                "the server did not start within {STARTUP_TIMEOUT:?}"
            )))
        }
    };
    let addr = first
        .strip_prefix(LISTENING_PREFIX)
        .and_then(|a| a.trim().parse::<SocketAddr>().ok())
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

    fn lock_addr(&self) -> SocketAddr {
        self.addr
    }

    fn store_addr(&self) -> SocketAddr {
        self.addr
    }

    fn is_up(&self) -> bool {
        self.child.is_some()
    }

    async fn kill(&mut self) -> Result<(), VerifyError> {
        if let Some(mut child) = self.child.take() {
            child
                .kill()
                .await
                .map_err(|e| VerifyError::io("cannot kill the server", e))?;
        }
        Ok(())
    }

    async fn restart(&mut self) -> Result<(), VerifyError> {
        if self.child.is_some() {
            return Ok(());
        }
        let deadline = Instant::now() + REBIND_WINDOW;
        loop {
            match spawn(&self.exe, &self.data_dir, &self.log, self.addr.port()).await {
                Ok((child, _)) => {
                    self.child = Some(child);
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    async fn stop(&mut self) {
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
}
