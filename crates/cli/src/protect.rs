//! `palisade admin protect` and `unprotect`: in-database enforcement for a PostgreSQL
//! table (`palisade_adapters::postgres::protect`). With a table protected, PostgreSQL
//! itself refuses every write to it that no gate admitted a token for in the same
//! transaction, so a writer that skips the gate (a maintenance script, another service, a
//! psql session) is refused with the lock named. docs/protecting-your-database.md.

use anyhow::Context;
use clap::Args;
use serde_json::json;

#[derive(Args)]
pub struct ProtectArgs {
    /// The PostgreSQL database (a libpq connection string or URL, without TLS).
    #[arg(long = "postgres", value_name = "DSN")]
    postgres: String,
    /// The table to protect (optionally schema-qualified, as SQL names it).
    #[arg(long, value_name = "TABLE")]
    table: String,
    /// The lock whose admitted tokens open the table to writes.
    #[arg(long, value_name = "LOCK")]
    lock: String,
}

#[derive(Args)]
pub struct UnprotectArgs {
    /// The PostgreSQL database (a libpq connection string or URL, without TLS).
    #[arg(long = "postgres", value_name = "DSN")]
    postgres: String,
    /// The table whose protection to remove.
    #[arg(long, value_name = "TABLE")]
    table: String,
}

async fn connect(dsn: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(dsn, tokio_postgres::NoTls)
        .await
        .context("cannot connect to PostgreSQL")?;
    tokio::spawn(connection);
    Ok(client)
}

/// Protects the table; prints `{"table", "lock", "protected": true}`.
pub async fn protect(args: ProtectArgs) -> anyhow::Result<()> {
    let client = connect(&args.postgres).await?;
    palisade_adapters::postgres::protect(&client, &args.table, &args.lock)
        .await
        .with_context(|| format!("protecting {} (nothing was changed)", args.table))?;
    let line = json!({"table": args.table, "lock": args.lock, "protected": true});
    crate::output::write_stdout(format!("{line}\n").as_bytes())?;
    Ok(())
}

/// Removes the table's protection; prints `{"table", "protected": false}`.
pub async fn unprotect(args: UnprotectArgs) -> anyhow::Result<()> {
    let client = connect(&args.postgres).await?;
    palisade_adapters::postgres::unprotect(&client, &args.table)
        .await
        .with_context(|| format!("unprotecting {} (nothing was changed)", args.table))?;
    let line = json!({"table": args.table, "protected": false});
    crate::output::write_stdout(format!("{line}\n").as_bytes())?;
    Ok(())
}
