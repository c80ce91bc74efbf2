//! `palisade fence LOCK` (the barrier) and `palisade fence status LOCK`.
//!
//! Acquiring a lock notifies no resource: an older holder's write that reaches the store
//! before the new holder's first one is still admitted (S10). The barrier closes that
//! window: it makes the namespace admit the token's epoch without writing data, so every
//! older token is refused from then on.

use clap::{Args, Subcommand};
use serde::Serialize;

use crate::exit::{Exit, Failure};
use crate::output::print_json;
use crate::target::Connected;

/// Flags of `palisade fence`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct FenceArgs {
    #[command(subcommand)]
    pub command: Option<FenceCommand>,
    /// Namespace to fence (the name of the lock that guards it).
    #[arg(required = true)]
    pub lock: Option<String>,
    /// Fencing token of the lock's current holder (as `lock acquire` prints it).
    #[arg(long, env = "PALISADE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Fencing-Seq, required in namespaces whose policy is `sequence`.
    #[arg(long)]
    pub seq: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum FenceCommand {
    /// Show a namespace's high-water mark and policy (no token needed).
    Status {
        /// Namespace (lock name).
        lock: String,
    },
}

#[derive(Serialize)]
struct Fenced<'a> {
    lock: &'a str,
    high_water: u64,
}

/// Runs `fence` or `fence status`.
pub async fn run(target: Connected, args: FenceArgs) -> anyhow::Result<()> {
    if let Some(FenceCommand::Status { lock }) = args.command {
        let status = target
            .client
            .high_water(&lock)
            .await
            .map_err(|e| target.fail(e))?;
        return print_json(&status);
    }
    let lock = args
        .lock
        .ok_or_else(|| Failure::new(Exit::Usage, "fence needs a lock name"))?;
    let token = args.token.ok_or_else(crate::kv_cmd::missing_token)?;
    let high_water = target
        .client
        .fenced_kv(&lock, &token)
        .fence_with(args.seq)
        .await
        .map_err(|e| target.fail(e))?;
    print_json(&Fenced {
        lock: &lock,
        high_water,
    })
}
