//! `palisade lock run LOCK -- COMMAND...`: hold a lock for as long as a command runs.
//!
//! The lease is a [`palisade_client::LeaseGuard`]: renewed every `ttl / 3` in the
//! background, and lost once the server says it expired or no renewal succeeded before
//! the renewal deadline (2/3 of the TTL after the last confirmed renewal's send, by
//! default; [`palisade_client::Deadlines`]). COMMAND runs in its own process group, so that
//! stopping it reaches the processes it started too; SIGINT, SIGTERM and SIGHUP sent to
//! `palisade` are passed on to that group.
//!
//! When the lease is lost, COMMAND gets SIGTERM at once and SIGKILL at the lease's safe
//! deadline (the TTL less the clock-drift margin after the last confirmed renewal's
//! send), or `--kill-grace-ms` after the SIGTERM if that is sooner; at once if the safe
//! deadline has passed (the server said the lease expired). So a command that ignores
//! SIGTERM is killed before the server can end the lease and grant the lock to another
//! holder, within the drift margin; tested in `crates/cli/tests/lock_run.rs` with a
//! command that ignores SIGTERM and a server stopped with SIGSTOP.
//!
//! ## What it does not do
//! Stopping the command is a courtesy, not the protection: the deadlines narrow the window
//! in which it can still act, they do not close it. Its requests already in flight, a
//! pause of this process, or clocks that drift apart faster than `--clock-drift`, can
//! still reach a resource after the lease ended. What protects the resource is the token
//! the command carries (PALISADE_TOKEN), refused by the resource once a newer holder has
//! written (S10). With `--fence` the namespace of the built-in store is fenced before the
//! command starts.

use std::ffi::OsString;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};

use crate::exit::{Exit, Failure};
use crate::lock_cmd::{lease_env, AcquireArgs};
use crate::target::Connected;

/// Flags of `palisade lock run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Lock name.
    pub lock: String,
    #[command(flatten)]
    pub acquire: AcquireArgs,
    /// After the lease is lost: at most how long COMMAND gets to exit after SIGTERM before
    /// it is sent SIGKILL (ms). SIGKILL comes sooner when the lease's safe deadline is
    /// nearer.
    #[arg(long, default_value_t = 5_000)]
    pub kill_grace_ms: u64,
    /// Fence the lock's namespace in the built-in store (the barrier) before starting
    /// COMMAND, so that no older holder's write is admitted there once it runs.
    #[arg(long)]
    pub fence: bool,
    /// The command and its arguments (after `--`).
    #[arg(
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    pub command: Vec<OsString>,
}

/// How the command ended.
enum Ending {
    Exited(ExitStatus),
    LeaseLost,
}

/// Runs the command under the lock; the exit code to end with.
pub async fn run(target: Connected, args: RunArgs) -> anyhow::Result<u8> {
    let guard = target
        .client
        .acquire(&args.lock, &args.acquire.holder(), args.acquire.options())
        .await
        .map_err(|e| target.fail(e))?;
    if args.fence {
        if let Err(e) = guard.fence().await {
            let _ = guard.release().await;
            return Err(target.fail(e).into());
        }
    }
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Failure::new(Exit::Usage, "lock run needs a command after --"))?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .envs(lease_env(guard.lease(), Some(&target.server)))
        .process_group(0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.release().await;
            // The shells' codes: 127 not found, 126 found but not runnable.
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            let message = format!("cannot run {}: {e}", program.to_string_lossy());
            return Err(Failure::with_code(code, message).into());
        }
    };
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
        .ok_or_else(|| anyhow::anyhow!("the command's process id is unknown"))?;
    let mut interrupts = signal(SignalKind::interrupt())?;
    let mut terminates = signal(SignalKind::terminate())?;
    let mut hangups = signal(SignalKind::hangup())?;
    let ending = loop {
        tokio::select! {
            status = child.wait() => break Ending::Exited(status?),
            () = guard.lost() => break Ending::LeaseLost,
            Some(()) = interrupts.recv() => pass_on(group, Signal::SIGINT),
            Some(()) = terminates.recv() => pass_on(group, Signal::SIGTERM),
            Some(()) = hangups.recv() => pass_on(group, Signal::SIGHUP),
        }
    };
    match ending {
        Ending::Exited(status) => {
            match guard.release().await {
                Ok(()) => {}
                Err(palisade_client::Error::LeaseExpired) => eprintln!(
                    "palisade: the lease on {} ran out as the command finished",
                    args.lock
                ),
                Err(e) => eprintln!(
                    "palisade: could not release the lease on {} ({}); it expires within its TTL",
                    args.lock,
                    target.fail(e)
                ),
            }
            Ok(exit_code(status))
        }
        Ending::LeaseLost => {
            // SIGTERM now (the renewal deadline, or the server's word), SIGKILL before the
            // lease can end at the server.
            let grace = guard
                .safe_for()
                .min(Duration::from_millis(args.kill_grace_ms));
            eprintln!(
                "palisade: the lease on {} was lost; stopping the command (SIGTERM, then \
                 SIGKILL after {} ms, before the lease can end)",
                args.lock,
                grace.as_millis()
            );
            pass_on(group, Signal::SIGTERM);
            if tokio::time::timeout(grace, child.wait()).await.is_err() {
                pass_on(group, Signal::SIGKILL);
                child.wait().await?;
            }
            Err(Failure::new(
                Exit::LeaseLost,
                format!(
                    "lease_expired: the lease on {} was lost while the command ran; it was \
                     stopped",
                    args.lock
                ),
            )
            .into())
        }
    }
}

/// Sends `sig` to the command's process group. A group that is already gone is fine.
fn pass_on(group: Pid, sig: Signal) {
    if let Err(e) = killpg(group, sig) {
        if e != nix::errno::Errno::ESRCH {
            eprintln!("palisade: cannot send {sig} to the command: {e}");
        }
    }
}

/// The command's status as an exit code: its own, or 128 + the signal that ended it (the
/// shells' convention).
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + (sig & 0x7f)).unwrap_or(1),
        (None, None) => 1,
    }
}
