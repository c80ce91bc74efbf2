//! Redis for the `redis-gate` target: a throwaway `redis-server` in a [`DbProcess`], and
//! for `db-failover` a replica beside it.
//!
//! One server on a free loopback port, its files in a temp directory, no RDB snapshots.
//! [`Durability::Safe`] is what the gate's preflight insists on: `appendonly yes` with
//! `appendfsync always`, so a script's effects are in the append-only file, fsynced,
//! before Redis answers.
//!
//! Alone, [`Durability::Unsafe`] is `appendonly no`: nothing is persisted, and a crash of
//! the server loses every mark and every value. `appendfsync everysec`, the other setting
//! the preflight refuses, loses the last second only when the machine itself goes down:
//! Redis `write`s the file before it answers, and the page cache outlives a killed
//! process. So with its files on a lazy file system (`lazy`, for `db-power-loss`, which
//! drops what no fsync reached), [`Durability::Unsafe`] is `appendfsync everysec`.
//!
//! With a replica ([`Replication::Standby`]), every server persists as the preflight
//! insists, and [`start_replica`] starts one more with `replicaof` the primary through a
//! proxy (the replication link); [`promote`] makes it a primary (`REPLICAOF NO ONE`).
//! Redis replicates asynchronously whatever its settings: what makes a failover safe is
//! the gate, which with [`Durability::Safe`] waits for the replica after every call
//! (`RedisFence::wait_for_replicas`, Redis `WAIT`), and with [`Durability::Unsafe`] does
//! not (see [`super::redis_store`]).
//!
//! The binary is `redis-server` on `PATH` (Debian: redis-server).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

use super::db_process::{files_in, Database, DbProcess, Durability, Launch, Probe, Replication};
use crate::procs::free_port;
use crate::VerifyError;

const SAFE: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

/// Starts `redis-server`, its files on a lazy file system if `lazy`; its output goes to
/// `log`.
pub async fn start(
    log: &Path,
    durability: Durability,
    replication: Replication,
    lazy: bool,
) -> Result<Database, VerifyError> {
    let settings: &'static [&'static str] = match (durability, replication, lazy) {
        (Durability::Unsafe, Replication::None, false) => &["--appendonly", "no"],
        (Durability::Unsafe, Replication::None, true) => {
            &["--appendonly", "yes", "--appendfsync", "everysec"]
        }
        _ => SAFE,
    };
    serve(log, settings, None, "Redis", lazy).await
}

/// A replica of the primary reached at `primary` (the replication link), with the safe
/// settings; its output goes to `log`. It copies the primary's data on its own: wait for
/// it with [`await_replica`].
pub async fn start_replica(log: &Path, primary: SocketAddr) -> Result<Database, VerifyError> {
    serve(log, SAFE, Some(primary), "Redis replica", false).await
}

/// Runs `redis-server` on a free port with `settings` (a replica of `primary`, if any)
/// until it answers.
async fn serve(
    log: &Path,
    settings: &'static [&'static str],
    primary: Option<SocketAddr>,
    what: &str,
    lazy: bool,
) -> Result<Database, VerifyError> {
    let dir = tempfile::Builder::new()
        .prefix("palisade-verify-redis-")
        .tempdir()
        .map_err(|e| VerifyError::io("cannot create the Redis folder", e))?;
    let (folder, disk) = files_in(dir.path(), lazy)?;
    let port = free_port()?;
    let launch: Launch = Box::new(move || {
        let mut redis = Command::new("redis-server");
        redis
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&folder)
            .args(["--save", "", "--protected-mode", "no", "--daemonize", "no"])
            // A replica's first copy at once, not after the default 5 s wait for others.
            .args(["--repl-diskless-sync-delay", "0"])
            .args(settings);
        if let Some(primary) = primary {
            let (host, port) = (primary.ip().to_string(), primary.port().to_string());
            redis.args(["--replicaof", &host, &port]);
        }
        redis
    });
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let ready: Probe = Box::new(move || {
        Box::pin(async move {
            let ping = query::<String>(addr, redis::cmd("PING"));
            matches!(
                tokio::time::timeout(Duration::from_secs(2), ping).await,
                Ok(Ok(pong)) if pong == "PONG"
            )
        })
    });
    let description = format!(
        "{what} at 127.0.0.1:{port}, {}{}{}",
        settings
            .chunks(2)
            .map(|pair| pair.join(" ").trim_start_matches("--").to_owned())
            .collect::<Vec<_>>()
            .join(", "),
        primary.map_or(String::new(), |p| format!(", replica of {p}")),
        if lazy {
            ", its files on a lazy file system (unsynced writes lost at a power loss)"
        } else {
            ""
        }
    );
    let mut process = DbProcess::start("redis-server", dir, log, libc::SIGTERM, launch, ready)
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
    process.keep_disk(disk);
    Ok(Database {
        process,
        addr,
        description,
    })
}

/// Waits until the primary at `primary` has a replica online (its initial copy done),
/// at most `within`.
pub async fn await_replica(primary: SocketAddr, within: Duration) -> Result<(), VerifyError> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        if let Ok(text) = query::<String>(primary, info).await {
            if text
                .lines()
                .any(|line| line.starts_with("slave") && line.contains("state=online"))
            {
                return Ok(());
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(VerifyError::Deploy(format!(
                "no replica online at the Redis primary {primary} within {within:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Makes the replica at `replica` a primary (`REPLICAOF NO ONE`).
pub async fn promote(replica: SocketAddr) -> Result<(), VerifyError> {
    let mut cmd = redis::cmd("REPLICAOF");
    cmd.arg("NO").arg("ONE");
    query::<String>(replica, cmd).await.map(drop).map_err(|e| {
        VerifyError::Deploy(format!(
            "cannot promote the Redis replica at {replica}: {e}"
        ))
    })
}

/// `cmd`'s answer from the server at `addr`, on a connection of its own.
async fn query<T: redis::FromRedisValue>(addr: SocketAddr, cmd: redis::Cmd) -> Result<T, String> {
    let client = redis::Client::open(client_url(addr)).map_err(|e| e.to_string())?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    cmd.query_async(&mut con).await.map_err(|e| e.to_string())
}

/// The URL of a client of the server reached at `addr`.
pub fn client_url(addr: SocketAddr) -> String {
    format!("redis://{addr}/")
}
