//! `palisade admin raise-marks`: after a PostgreSQL, Redis or SQLite database that a gate
//! protects was restored from a backup (or a Redis replica that missed the newest marks
//! was promoted), its `palisade_fence` marks are older than what it had admitted, and the
//! tokens they had fenced out would pass again (S11). This reads every lock's
//! `epoch_bound` from the issuer (no epoch above it was ever granted for the lock) and
//! raises each database's mark of that lock to at least it, creating the marks the backup
//! did not have, in one transaction per database. The holder of each lock's newest epoch
//! still writes; every older token is refused.
//!
//! The marks themselves are raised by the gates' own code (`palisade_adapters`), so the
//! tables are the ones the Rust and Python gates write.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use serde_json::json;

#[derive(Args)]
pub struct RaiseMarksArgs {
    /// The Palisade server that issues the tokens these databases check.
    #[arg(long, value_name = "URL", env = "PALISADE_SERVER")]
    server: String,
    #[command(flatten)]
    connection: crate::target::Connection,
    /// Only the locks whose names start with this.
    #[arg(long, default_value = "")]
    prefix: String,
    /// A PostgreSQL database the gate writes `palisade_fence` in (a libpq connection
    /// string or URL, without TLS). May be repeated.
    #[arg(long = "postgres", value_name = "DSN")]
    postgres: Vec<String>,
    /// A Redis the gate keeps its `palisade:fence:{LOCK}` hashes in (`redis://`). May be
    /// repeated.
    #[arg(long = "redis", value_name = "URL")]
    redis: Vec<String>,
    /// A SQLite database file with the gate's `palisade_fence` table. May be repeated.
    #[arg(long = "sqlite", value_name = "PATH")]
    sqlite: Vec<PathBuf>,
}

/// Locks read from the server per request.
const PAGE: usize = 1000;

pub async fn run(args: RaiseMarksArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !(args.postgres.is_empty() && args.redis.is_empty() && args.sqlite.is_empty()),
        "name the databases to raise: --postgres DSN, --redis URL, --sqlite PATH"
    );
    let connected = args.connection.connect(&args.server)?;
    let mut marks = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let (page, next) = connected
            .client
            .locks_page(&args.prefix, after.as_deref(), PAGE)
            .await
            .map_err(|e| connected.fail(e))?;
        for lock in page {
            // A server before `epoch_bound`: its `epoch` was already the bound.
            let bound = lock.epoch_bound.unwrap_or(lock.epoch).max(lock.epoch);
            if bound > 0 {
                marks.push((lock.lock, bound));
            }
        }
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let mut report = Vec::new();
    for dsn in &args.postgres {
        let (mut client, connection) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
            .await
            .context("cannot connect to PostgreSQL")?;
        let driver = tokio::spawn(connection);
        let raised = palisade_adapters::postgres::raise_marks(&mut client, &marks)
            .await
            .context("raising the PostgreSQL marks (nothing was changed)")?;
        drop(client);
        let _ = driver.await;
        report.push(json!({"database": "postgres", "raised": raised}));
    }
    for url in &args.redis {
        let client = redis::Client::open(url.as_str()).context("bad --redis URL")?;
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .context("cannot connect to Redis")?;
        // Unchecked: raising the marks of a Redis restored with unsafe settings is still
        // better than leaving them low (the PostgreSQL raise does the same).
        let raised = palisade_adapters::redis::RedisFence::unchecked()
            .raise_marks(&mut con, &marks)
            .await
            .context("raising the Redis marks (nothing was changed)")?;
        report.push(json!({"database": "redis", "raised": raised}));
    }
    for path in &args.sqlite {
        let (path, marks) = (path.clone(), marks.clone());
        let raised = tokio::task::spawn_blocking(move || {
            anyhow::ensure!(path.exists(), "{} does not exist", path.display());
            let mut conn = rusqlite::Connection::open(&path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            conn.busy_timeout(std::time::Duration::from_secs(30))?;
            palisade_adapters::sqlite::raise_marks(&mut conn, &marks)
                .context("raising the SQLite marks (nothing was changed)")
        })
        .await??;
        report.push(json!({"database": "sqlite", "raised": raised}));
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({"locks": marks.len(), "databases": report}))?
    );
    eprintln!(
        "raised the marks of {} locks to the issuer's bound: every token older than each \
         lock's newest epoch is refused by these databases",
        marks.len()
    );
    Ok(())
}
