//! Redis for the `redis-gate` target: a throwaway `redis-server` in a [`DbProcess`].
//!
//! One server on a free loopback port, its files in a temp directory, no RDB snapshots.
//! [`Durability::Safe`] is what the gate's preflight insists on: `appendonly yes` with
//! `appendfsync always`, so a script's effects are in the append-only file, fsynced,
//! before Redis answers.
//!
//! [`Durability::Unsafe`] is `appendonly no`: nothing is persisted, and a crash of the
//! server loses every mark and every value. `appendfsync everysec`, the other setting the
//! preflight refuses, loses the last second only when the machine itself goes down:
//! Redis `write`s the file before it answers, and the page cache outlives a killed
//! process, so a process crash (all this harness can inject) cannot show it.
//!
//! The binary is `redis-server` on `PATH` (Debian: redis-server).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

use super::db_process::{Database, DbProcess, Durability, Launch, Probe};
use crate::procs::free_port;
use crate::VerifyError;

/// The setting [`Durability::Unsafe`] stands for, as the report names it.
pub const UNSAFE_SETTING: &str = "appendonly no";

/// Starts `redis-server`; its output goes to `log`.
pub async fn start(log: &Path, durability: Durability) -> Result<Database, VerifyError> {
    let dir = tempfile::Builder::new()
        .prefix("palisade-verify-redis-")
        .tempdir()
        .map_err(|e| VerifyError::io("cannot create the Redis folder", e))?;
    let folder = dir.path().to_owned();
    let port = free_port()?;
    let settings: &'static [&'static str] = match durability {
        Durability::Safe => &["--appendonly", "yes", "--appendfsync", "always"],
        Durability::Unsafe => &["--appendonly", "no"],
    };
    let launch: Launch = Box::new(move || {
        let mut redis = Command::new("redis-server");
        redis
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&folder)
            .args(["--save", "", "--protected-mode", "no", "--daemonize", "no"])
            .args(settings);
        redis
    });
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let ready: Probe = Box::new(move || {
        let url = client_url(addr);
        Box::pin(async move {
            let ping = async {
                let client = redis::Client::open(url.as_str()).ok()?;
                let mut con = client.get_multiplexed_async_connection().await.ok()?;
                redis::cmd("PING")
                    .query_async::<String>(&mut con)
                    .await
                    .ok()
            };
            matches!(
                tokio::time::timeout(Duration::from_secs(2), ping).await,
                Ok(Some(pong)) if pong == "PONG"
            )
        })
    });
    let description = format!(
        "Redis at 127.0.0.1:{port}, {}",
        settings
            .chunks(2)
            .map(|pair| pair.join(" ").trim_start_matches("--").to_owned())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let process = DbProcess::start("redis-server", dir, log, libc::SIGTERM, launch, ready)
        .await
        .map_err(|e| match e {
            VerifyError::Io { context, source }
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                VerifyError::Deploy(format!(
                    "{context}: redis-server is not on PATH (Debian: redis-server; \
                     scripts/adapter-services installs it)"
                ))
            }
            other => other,
        })?;
    Ok(Database {
        process,
        addr,
        description,
    })
}

/// The URL of a client of the server reached at `addr`.
pub fn client_url(addr: SocketAddr) -> String {
    format!("redis://{addr}/")
}
