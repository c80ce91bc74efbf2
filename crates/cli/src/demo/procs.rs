//! Child processes of the demo: the server and the workers.
//!
//! Every child is spawned with `kill_on_drop`, so an early return (an error, Ctrl-C)
//! kills whatever is still running, including a worker frozen by SIGSTOP (SIGKILL works
//! on stopped processes). Every read from a child has a timeout, so the demo never hangs.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::timeout;

use super::event::Event;

/// How long the server may take to print its listening line.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the server gets to shut down cleanly after SIGTERM before SIGKILL.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts `exe serve` on a free port with its data in `data_dir`, its stderr in `log`,
/// and returns it with the URL it announced.
pub async fn start_server(
    exe: &Path,
    data_dir: &Path,
    log: &Path,
) -> anyhow::Result<(Child, String)> {
    let log_file =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut child = Command::new(exe)
        .arg("serve")
        .args([
            "--listen",
            "127.0.0.1:0",
            "--lock-delay-ms",
            "0",
            "--data-dir",
        ])
        .arg(data_dir)
        // A namespace policy inherited from the caller's shell would change the story.
        .env_remove("PALISADE_POLICIES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {} serve", exe.display()))?;
    let stdout = child
        .stdout
        .take()
        .context("server stdout was not captured")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = match timeout(STARTUP_TIMEOUT, lines.next_line()).await {
        Err(_) => bail!("the server did not announce its address within {STARTUP_TIMEOUT:?}"),
        Ok(Err(e)) => bail!("cannot read the server's stdout: {e}"),
        Ok(Ok(None)) => bail!("the server exited before announcing its address"),
        Ok(Ok(Some(line))) => line,
    };
    let url = palisade_api::listening::parse(&first)
        .with_context(|| format!("unexpected first line from the server: {first:?}"))?
        .to_owned();
    // Keep draining stdout so the server can never block on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, url))
}

/// Asks the server to stop (SIGTERM), then kills it if it does not within the timeout.
pub async fn stop_server(mut child: Child) {
    if signal(&child, Signal::SIGTERM).is_ok()
        && timeout(SHUTDOWN_TIMEOUT, child.wait()).await.is_ok()
    {
        return;
    }
    let _ = child.kill().await;
}

/// A running worker and the events it has printed.
pub struct Worker {
    pub name: String,
    pub child: Child,
    pub events: mpsc::Receiver<Event>,
}

/// Starts `exe demo-worker <args>`; its stdout lines arrive as [`Event`]s.
pub fn spawn_worker(exe: &Path, name: &str, args: &[String]) -> anyhow::Result<Worker> {
    let mut child = Command::new(exe)
        .arg("demo-worker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start worker {name}"))?;
    let stdout = child
        .stdout
        .take()
        .context("worker stdout was not captured")?;
    // Bounded, and generous: a worker prints a handful of lines.
    let (tx, events) = mpsc::channel(64);
    let worker = name.to_owned();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let event = serde_json::from_str(&line).unwrap_or_else(|_| {
                Event::new(&worker, None, "output", "unparsed").detail(line.clone())
            });
            if tx.send(event).await.is_err() {
                break;
            }
        }
    });
    Ok(Worker {
        name: name.to_owned(),
        child,
        events,
    })
}

impl Worker {
    /// Waits for the worker's report of `step`, passing every event read on the way to
    /// `seen` (so the timeline misses nothing).
    pub async fn expect(
        &mut self,
        step: &str,
        within: Duration,
        mut seen: impl FnMut(Event),
    ) -> anyhow::Result<Event> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Err(_) => bail!("step \"{} {step}\": no report within {within:?}", self.name),
                Ok(None) => bail!(
                    "step \"{} {step}\": worker exited without reporting it",
                    self.name
                ),
                Ok(Some(event)) => {
                    let matched = event.step == step;
                    seen(event.clone());
                    if matched {
                        return Ok(event);
                    }
                }
            }
        }
    }

    /// Reads the remaining events until the worker closes stdout, then requires a clean
    /// exit, all within `within`.
    pub async fn finish(
        mut self,
        within: Duration,
        mut seen: impl FnMut(Event),
    ) -> anyhow::Result<()> {
        let name = self.name.clone();
        let drained = timeout(within, async {
            while let Some(event) = self.events.recv().await {
                seen(event);
            }
            self.child.wait().await
        })
        .await;
        match drained {
            Err(_) => bail!("worker {name} did not exit within {within:?}"),
            Ok(Err(e)) => bail!("cannot wait for worker {name}: {e}"),
            Ok(Ok(status)) if !status.success() => bail!("worker {name} failed: {status}"),
            Ok(Ok(_)) => Ok(()),
        }
    }
}

/// Sends `sig` to `child` by pid. The pid is our own child's, not yet reaped (tokio reaps
/// only after `wait`), so it cannot have been reused.
pub fn signal(child: &Child, sig: Signal) -> anyhow::Result<()> {
    let pid = child.id().context("the process has already exited")?;
    let pid = Pid::from_raw(i32::try_from(pid).context("pid out of range")?);
    nix::sys::signal::kill(pid, sig).with_context(|| format!("kill({pid}, {sig}) failed"))
}

/// The last lines of a log file, for error reports.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
