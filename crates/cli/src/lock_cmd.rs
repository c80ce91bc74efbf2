//! `palisade lock ...`: acquire, renew, release and inspect locks from a shell, and run a
//! command under a lock (`lock run`, in `lock_run.rs`).
//!
//! Results are pretty JSON on stdout, except where `--format` asks for a bare token or
//! `NAME=value` lines. A CLI process exits right after acquiring, so `lock acquire` gives
//! a bare lease with no background renewal: renew it with `lock keepalive` within its
//! TTL, or it expires. `lock run` is the one command that holds a lease for as long as
//! its command runs.

use std::time::Duration;

use clap::{Subcommand, ValueEnum};
use palisade_client::{AcquireOptions, Lease};
use serde::Serialize;

use crate::lock_run::RunArgs;
use crate::output::print_json;
use crate::target::Connected;

/// Lock and lease commands.
#[derive(Debug, Subcommand)]
pub enum LockCommand {
    /// Acquire a lock and print the lease (lock, holder, epoch, token, lease_id, ttl_ms).
    Acquire {
        /// Lock name: 1 to 128 of `A-Z a-z 0-9 . _ -`.
        lock: String,
        #[command(flatten)]
        acquire: AcquireArgs,
        /// What to print: `json` (the whole lease), `token` (the token alone, for
        /// `TOKEN=$(...)`), or `env` (PALISADE_TOKEN=..., PALISADE_EPOCH=...,
        /// PALISADE_LEASE_ID=..., PALISADE_LOCK=... lines, for `export $(...)`).
        #[arg(long, value_enum, default_value_t = Format::Json)]
        format: Format,
    },
    /// Run a command while holding a lock: acquire (waiting if --wait-ms), renew the
    /// lease in the background, run COMMAND with PALISADE_TOKEN, PALISADE_EPOCH,
    /// PALISADE_LEASE_ID, PALISADE_LOCK and PALISADE_SERVER in its environment, release
    /// when it exits, and exit with its status. If the lease is lost, COMMAND is sent
    /// SIGTERM (SIGKILL after --kill-grace-ms) and the exit code is 6.
    Run(RunArgs),
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

/// How to acquire: shared by `lock acquire` and `lock run`.
#[derive(Debug, clap::Args)]
pub struct AcquireArgs {
    /// Who is acquiring, shown in `lock status` [default: <hostname>-<pid>].
    #[arg(long, env = "PALISADE_HOLDER")]
    pub holder: Option<String>,
    /// Lease length in milliseconds (50 to 3600000).
    #[arg(long, env = "PALISADE_TTL_MS", default_value_t = 10_000)]
    pub ttl_ms: u64,
    /// If the lock is held, queue for up to this many milliseconds (0: fail at once
    /// with lock_held, exit code 3).
    #[arg(long, default_value_t = 0)]
    pub wait_ms: u64,
}

impl AcquireArgs {
    pub fn holder(&self) -> String {
        self.holder.clone().unwrap_or_else(default_holder)
    }

    pub fn options(&self) -> AcquireOptions {
        AcquireOptions {
            ttl: Duration::from_millis(self.ttl_ms),
            wait: (self.wait_ms > 0).then(|| Duration::from_millis(self.wait_ms)),
            ..AcquireOptions::default()
        }
    }
}

/// Output of `lock acquire`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Json,
    Token,
    Env,
}

/// Runs one lock command; the exit code (`lock run`: its command's).
pub async fn run(target: Connected, cmd: LockCommand) -> anyhow::Result<u8> {
    let client = &target.client;
    let done = match cmd {
        LockCommand::Acquire {
            lock,
            acquire,
            format,
        } => {
            let lease = client
                .acquire_raw(&lock, &acquire.holder(), acquire.options())
                .await
                .map_err(|e| target.fail(e))?;
            match format {
                Format::Json => print_json(&lease),
                Format::Token => {
                    println!("{}", lease.token);
                    Ok(())
                }
                Format::Env => {
                    print!("{}", env_lines(&lease_env(&lease, None)));
                    Ok(())
                }
            }
        }
        LockCommand::Run(args) => return crate::lock_run::run(target, args).await,
        LockCommand::Keepalive { lease_id } => print_json(
            &client
                .keepalive(&lease_id)
                .await
                .map_err(|e| target.fail(e))?,
        ),
        LockCommand::Release { lease_id } => {
            client
                .release(&lease_id)
                .await
                .map_err(|e| target.fail(e))?;
            print_json(&Released {
                lease_id: &lease_id,
                released: true,
            })
        }
        LockCommand::Status { lock: Some(lock) } => {
            let status = client
                .lock_status(&lock)
                .await
                .map_err(|e| target.fail(e))?;
            print_json(&status)?;
            if status.epoch == 0 && status.holder.is_none() && status.waiters == 0 {
                // Never acquired (or a name mistyped): not_found, as docs/cli.md says.
                return Err(crate::exit::Failure::new(
                    crate::exit::Exit::NotFound,
                    format!("not_found: lock {lock} has never been acquired"),
                )
                .into());
            }
            Ok(())
        }
        LockCommand::Status { lock: None } => {
            let locks = client.locks().await.map_err(|e| target.fail(e))?;
            print_json(&LockList { locks })
        }
    };
    done.map(|()| 0)
}

/// The variables a lease is handed on in (`--format env`, and `lock run`'s command).
pub fn lease_env(lease: &Lease, server: Option<&str>) -> Vec<(&'static str, String)> {
    let mut vars = vec![
        ("PALISADE_TOKEN", lease.token.clone()),
        ("PALISADE_EPOCH", lease.epoch.to_string()),
        ("PALISADE_LEASE_ID", lease.lease_id.clone()),
        ("PALISADE_LOCK", lease.lock.clone()),
    ];
    if let Some(server) = server {
        vars.push(("PALISADE_SERVER", server.to_owned()));
    }
    vars
}

/// `NAME=value` lines. Tokens, epochs, lease ids and lock names contain no character a
/// shell treats specially; anything else would be single-quoted.
fn env_lines(vars: &[(&str, String)]) -> String {
    let safe = |v: &str| {
        !v.is_empty()
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-:/+=".contains(&b))
    };
    vars.iter()
        .map(|(name, value)| {
            if safe(value) {
                format!("{name}={value}\n")
            } else {
                format!("{name}='{}'\n", value.replace('\'', r"'\''"))
            }
        })
        .collect()
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

/// `<hostname>-<pid>`: unique enough to tell holders apart in `lock status`.
pub(crate) fn default_holder() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_lines_quote_only_what_needs_it() {
        let vars = [
            ("A", "pal1.abc-_.sig".to_owned()),
            ("B", "it's x".to_owned()),
            ("C", String::new()),
        ];
        assert_eq!(env_lines(&vars), "A=pal1.abc-_.sig\nB='it'\\''s x'\nC=''\n");
    }
}
