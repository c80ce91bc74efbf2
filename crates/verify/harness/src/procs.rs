//! Worker processes: starting them, signalling them, and collecting them at the end.
//!
//! Every child is spawned with `kill_on_drop`, so an early return (an error, Ctrl-C)
//! kills whatever is still running, including a worker frozen by SIGSTOP (SIGKILL works
//! on stopped processes).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::VerifyError;

/// Sends `sig` to `child` by pid.
pub fn signal(child: &Child, sig: libc::c_int) -> Result<(), VerifyError> {
    let pid = child
        .id()
        .ok_or_else(|| VerifyError::Internal("the process has already exited".into()))?;
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| VerifyError::Internal(format!("pid {pid} out of range")))?;
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child, which
    // has not been reaped (tokio reaps only after `wait`), so it cannot have been reused.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(VerifyError::io(
            format!("kill({pid}, {sig}) failed"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// A free loopback port, found by binding port 0. Another process could take it before
/// it is used; for servers that must know their port before they start (etcd), that small
/// window is accepted.
pub fn free_port() -> Result<u16, VerifyError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| VerifyError::io("cannot find a free loopback port", e))
}

/// A listener on a free loopback port, and its address (for a service the harness runs
/// in its own process: a proxy, a gate's store). `what` names it in the error.
pub async fn loopback_listener(
    what: &str,
) -> Result<(tokio::net::TcpListener, std::net::SocketAddr), VerifyError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| VerifyError::io(format!("cannot bind {what}"), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| VerifyError::io(format!("cannot read the port of {what}"), e))?;
    Ok((listener, addr))
}

/// What a worker needs to know, besides its id.
pub struct WorkerSpec<'a> {
    pub exe: &'a Path,
    pub workload: &'a str,
    pub lock_protocol: &'a str,
    pub ttl_ms: u64,
    pub seed: u64,
    pub clock_origin_ns: u64,
    pub stop_at_us: u64,
    pub history_dir: &'a Path,
    /// Bearer keys of the workers (worker `i` gets `keys[i - 1]`), with `--auth`.
    pub keys: Option<&'a [String]>,
}

/// One running worker.
pub struct WorkerProc {
    pub id: u64,
    pub child: Child,
    pub history: PathBuf,
    pub paused: bool,
}

impl WorkerProc {
    /// Starts `exe verify-worker` for worker `id`, talking to its proxy URLs.
    pub fn spawn(
        spec: &WorkerSpec<'_>,
        id: u64,
        lock_urls: &[String],
        store_urls: &[String],
    ) -> Result<WorkerProc, VerifyError> {
        let history = spec.history_dir.join(format!("w{id}.jsonl"));
        let log_path = spec.history_dir.join(format!("w{id}.log"));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| VerifyError::io(format!("cannot create {}", log_path.display()), e))?;
        let mut command = Command::new(spec.exe);
        command.env_remove(crate::auth::KEY_ENV);
        if let Some(key) = spec.keys.and_then(|k| k.get(id.saturating_sub(1) as usize)) {
            command.env(crate::auth::KEY_ENV, key);
        }
        let child = command
            .arg("verify-worker")
            .args(["--id", &id.to_string()])
            .args(["--lock-urls", &lock_urls.join(",")])
            .args(["--store-urls", &store_urls.join(",")])
            .args(["--lock-protocol", spec.lock_protocol])
            .args(["--workload", spec.workload])
            .args(["--ttl-ms", &spec.ttl_ms.to_string()])
            .args(["--seed", &spec.seed.wrapping_add(id).to_string()])
            .arg("--history")
            .arg(&history)
            .args(["--clock-origin-ns", &spec.clock_origin_ns.to_string()])
            .args(["--stop-at-us", &spec.stop_at_us.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| VerifyError::io(format!("cannot start worker {id}"), e))?;
        Ok(WorkerProc {
            id,
            child,
            history,
            paused: false,
        })
    }

    pub fn stop(&mut self) -> Result<(), VerifyError> {
        signal(&self.child, libc::SIGSTOP)?;
        self.paused = true;
        Ok(())
    }

    pub fn resume(&mut self) -> Result<(), VerifyError> {
        signal(&self.child, libc::SIGCONT)?;
        self.paused = false;
        Ok(())
    }
}

/// How the workers ended.
#[derive(Debug, Default)]
pub struct Reaped {
    /// Workers that exited with a failure of their own (e.g. could not write history).
    pub failed: Vec<(u64, String)>,
    /// Workers still running at the deadline, killed.
    pub killed: Vec<u64>,
}

/// Waits until every worker has exited or `within` has passed, then kills the rest.
pub async fn reap(workers: &mut [WorkerProc], within: Duration) -> Reaped {
    let deadline = Instant::now() + within;
    let mut out = Reaped::default();
    for w in workers.iter_mut() {
        if w.paused {
            let _ = w.resume();
        }
        match tokio::time::timeout_at(deadline, w.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => out.failed.push((w.id, status.to_string())),
            Ok(Err(e)) => out.failed.push((w.id, e.to_string())),
            Err(_) => {
                let _ = w.child.kill().await;
                out.killed.push(w.id);
            }
        }
    }
    out
}
