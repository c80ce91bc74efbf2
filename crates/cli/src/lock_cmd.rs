//! `palisade lock ...`: acquire, renew, release and inspect locks from a shell.
//!
//! Every command prints its result as pretty JSON on stdout, so scripts can pipe it into
//! `jq`. A CLI process exits right after acquiring, so `lock acquire` gives a bare lease
//! with no background renewal: renew it with `lock keepalive` within its TTL, or it
//! expires. Pass the printed `token` to `palisade kv put --token` (or `PALISADE_TOKEN`).

use anyhow::Context;
use clap::Subcommand;
use palisade_client::{AcquireOptions, Client};
use serde::Serialize;
use std::time::Duration;

/// Lock and lease commands.
#[derive(Debug, Subcommand)]
pub enum LockCommand {
    /// Acquire a lock and print the lease (lock, holder, epoch, token, lease_id, ttl_ms).
    Acquire {
        /// Lock name: 1 to 128 of `A-Z a-z 0-9 . _ -`.
        lock: String,
        /// Who is acquiring, shown in `lock status` [default: <hostname>-<pid>].
        #[arg(long, env = "PALISADE_HOLDER")]
        holder: Option<String>,
        /// Lease length in milliseconds (50 to 3600000). Nothing renews it for you.
        #[arg(long, env = "PALISADE_TTL_MS", default_value_t = 10_000)]
        ttl_ms: u64,
        /// If the lock is held, queue for up to this many milliseconds (0: fail at once
        /// with lock_held).
        #[arg(long, default_value_t = 0)]
        wait_ms: u64,
    },
    /// Renew a lease for a full TTL from now.
    Keepalive {
        /// The lease_id printed by `lock acquire`.
        lease_id: String,
    },
    /// Release a lease; the lock passes to the next waiter at once.
    Release {
        /// The lease_id printed by `lock acquire`.
        lease_id: String,
    },
    /// Show one lock's status (epoch, holder, remaining_ms, waiters), or all locks.
    Status {
        /// Lock name; omit to list every lock.
        lock: Option<String>,
    },
}

/// Runs one lock command with `client`.
pub async fn run(client: Client, cmd: LockCommand) -> anyhow::Result<()> {
    match cmd {
        LockCommand::Acquire {
            lock,
            holder,
            ttl_ms,
            wait_ms,
        } => {
            let holder = holder.unwrap_or_else(default_holder);
            let opts = AcquireOptions {
                ttl: Duration::from_millis(ttl_ms),
                wait: (wait_ms > 0).then(|| Duration::from_millis(wait_ms)),
                ..AcquireOptions::default()
            };
            let lease = client
                .acquire_raw(&lock, &holder, opts)
                .await
                .map_err(api_error)?;
            print_json(&lease)
        }
        LockCommand::Keepalive { lease_id } => {
            print_json(&client.keepalive(&lease_id).await.map_err(api_error)?)
        }
        LockCommand::Release { lease_id } => {
            client.release(&lease_id).await.map_err(api_error)?;
            print_json(&Released {
                lease_id: &lease_id,
                released: true,
            })
        }
        LockCommand::Status { lock: Some(lock) } => {
            print_json(&client.lock_status(&lock).await.map_err(api_error)?)
        }
        LockCommand::Status { lock: None } => {
            let locks = client.locks().await.map_err(api_error)?;
            print_json(&LockList { locks })
        }
    }
}

#[derive(Serialize)]
struct Released<'a> {
    lease_id: &'a str,
    released: bool,
}

#[derive(Serialize)]
struct LockList {
    locks: Vec<palisade_client::LockStatus>,
}

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("cannot render the result as JSON")?;
    println!("{text}");
    Ok(())
}

/// Turns a client error into the one-line `<code>: <message>` that `main` prints as
/// `error: <code>: <message>` before exiting 1. Returning it (rather than printing here)
/// keeps the message to a single line.
pub(crate) fn api_error(err: palisade_client::Error) -> anyhow::Error {
    let message = match &err {
        // The generic variant's Display repeats the code; show just the server's text.
        palisade_client::Error::Api { message, .. } => message.clone(),
        other => other.to_string(),
    };
    anyhow::anyhow!("{}: {message}", err.code())
}

/// `<hostname>-<pid>`: unique enough to tell holders apart in `lock status`.
pub(crate) fn default_holder() -> String {
    format!(
        "{}-{}",
        hostname().unwrap_or_else(|| "localhost".into()),
        std::process::id()
    )
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the pointer and length describe `buf`, which outlives the call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).trim().to_owned();
    (!name.is_empty()).then_some(name)
}
