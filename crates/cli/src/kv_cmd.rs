//! `palisade kv ...`: read and write the fenced key-value store from a shell.
//!
//! `put` and `del` always send a fencing token (`--token` or `PALISADE_TOKEN`); there is
//! no unfenced write path, not even for maintenance (S12). Reads need no token. Results
//! are pretty JSON on stdout, except `get`, which writes the raw value so it can be
//! piped or redirected to a file unchanged.

use anyhow::Context;
use clap::{Args, Subcommand};
use palisade_client::{Client, FencedKv, WriteOptions};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::exit::{Exit, Failure};
use crate::output::print_json;
use crate::target::Connected;

/// Key-value store commands. A namespace is named after the lock that guards it.
#[derive(Debug, Subcommand)]
pub enum KvCommand {
    /// Write a value under a key, fenced by a token for the namespace's lock.
    #[command(visible_alias = "set")]
    Put {
        /// Namespace (the name of the lock that guards it).
        lock: String,
        /// Key: 1 to 1024 bytes of UTF-8, `/` allowed.
        key: String,
        /// The value; read from stdin when omitted.
        value: Option<String>,
        #[command(flatten)]
        fence: FenceArgs,
        /// Only write if the key does not exist yet (If-None-Match: *).
        #[arg(long, conflicts_with = "if_match")]
        if_absent: bool,
    },
    /// Print a key's raw value to stdout (exit code 5, not_found, if absent).
    Get {
        /// Namespace (lock name).
        lock: String,
        /// Key.
        key: String,
    },
    /// Delete a key, fenced like a put.
    Del {
        /// Namespace (lock name).
        lock: String,
        /// Key.
        key: String,
        #[command(flatten)]
        fence: FenceArgs,
    },
    /// List keys in key order (at most 10000).
    Ls {
        /// Namespace (lock name).
        lock: String,
        /// Only keys starting with this prefix.
        #[arg(long, default_value = "")]
        prefix: String,
    },
}

/// What every mutation carries: the token, and optional conditions and retry metadata.
#[derive(Debug, Args)]
pub struct FenceArgs {
    /// Fencing token from `palisade lock acquire` (required for every write: without it,
    /// missing_token, exit 4).
    #[arg(long, env = "PALISADE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Only apply if the key's current revision equals this (If-Match).
    #[arg(long)]
    if_match: Option<u64>,
    /// Makes a retry safe: repeating the same request with this key returns the first
    /// outcome instead of applying twice (fencing alone does not deduplicate).
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Fencing-Seq, required in namespaces whose policy is `sequence`.
    #[arg(long)]
    seq: Option<u64>,
}

impl FenceArgs {
    fn split(
        self,
        client: &Client,
        lock: &str,
        if_absent: bool,
    ) -> Result<(FencedKv, WriteOptions), Failure> {
        let token = self.token.ok_or_else(missing_token)?;
        let opts = WriteOptions {
            if_match: self.if_match,
            if_absent,
            idempotency_key: self.idempotency_key,
            seq: self.seq,
        };
        Ok((client.fenced_kv(lock, &token), opts))
    }
}

#[derive(Serialize)]
struct KeyList<'a> {
    lock: &'a str,
    keys: Vec<String>,
}

/// Runs one store command.
pub async fn run(target: Connected, cmd: KvCommand) -> anyhow::Result<()> {
    let client = &target.client;
    let fail = |e| target.fail(e);
    match cmd {
        KvCommand::Put {
            lock,
            key,
            value,
            fence,
            if_absent,
        } => {
            let value = match value {
                Some(v) => v.into_bytes(),
                None => read_stdin().await?,
            };
            let (kv, opts) = fence.split(client, &lock, if_absent)?;
            print_json(&kv.put_with(&key, value, &opts).await.map_err(fail)?)
        }
        KvCommand::Get { lock, key } => {
            let entry = client.kv(&lock).get(&key).await.map_err(fail)?;
            let entry = entry.ok_or_else(|| {
                Failure::new(
                    Exit::NotFound,
                    format!("not_found: no key {key:?} in {lock:?}"),
                )
            })?;
            let mut out = tokio::io::stdout();
            out.write_all(&entry.value)
                .await
                .context("cannot write to stdout")?;
            out.flush().await.context("cannot write to stdout")
        }
        KvCommand::Del { lock, key, fence } => {
            let (kv, opts) = fence.split(client, &lock, false)?;
            print_json(&kv.delete_with(&key, &opts).await.map_err(fail)?)
        }
        KvCommand::Ls { lock, prefix } => {
            let keys = client.kv(&lock).list(&prefix).await.map_err(fail)?;
            print_json(&KeyList { lock: &lock, keys })
        }
    }
}

async fn read_stdin() -> anyhow::Result<Vec<u8>> {
    let mut value = Vec::new();
    tokio::io::stdin()
        .read_to_end(&mut value)
        .await
        .context("cannot read the value from stdin")?;
    Ok(value)
}

/// A write without a token: refused here as the server would refuse it (`missing_token`,
/// exit 4), saying where a token comes from.
pub fn missing_token() -> Failure {
    Failure::new(
        Exit::TokenRefused,
        "missing_token: a write needs the lock holder's fencing token: --token TOKEN, or the \
         PALISADE_TOKEN variable (export PALISADE_TOKEN=$(palisade lock acquire LOCK \
         --format token))",
    )
}
