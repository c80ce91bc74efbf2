//! `palisade token check`: ask the issuer whether a token is genuine, current and its
//! lease alive (Chubby's CheckSequencer), and `palisade keys`: the issuer's public keys.
//!
//! The check is a snapshot: the answer can be out of date when it arrives. Only a
//! resource's high-water check at the moment of the write fences (S10, S15).

use clap::Subcommand;

use crate::exit::{Exit, Failure};
use crate::output::print_json;
use crate::target::Connected;

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print the issuer's verdict on a token as JSON. Exit code 0 if it is genuine, of
    /// the lock's current epoch and its lease alive; 4 if it is not genuine or not
    /// current; 6 if it is current but its lease has ended.
    Check {
        /// The token [default: the PALISADE_TOKEN variable].
        #[arg(env = "PALISADE_TOKEN", hide_env_values = true)]
        token: String,
    },
}

/// Runs one token command.
pub async fn run(target: Connected, cmd: TokenCommand) -> anyhow::Result<()> {
    let TokenCommand::Check { token } = cmd;
    let check = target
        .client
        .check_token(&token)
        .await
        .map_err(|e| target.fail(e))?;
    print_json(&check)?;
    let lock = check.lock.as_deref().unwrap_or("?");
    if !check.genuine {
        let reason = check.reason.as_deref().unwrap_or("no reason given");
        return Err(Failure::new(
            Exit::TokenRefused,
            format!("invalid_token: the token is not genuine: {reason}"),
        )
        .into());
    }
    if check.current != Some(true) {
        return Err(Failure::new(
            Exit::TokenRefused,
            format!(
                "stale_token: the token's epoch {} is not the current epoch {} of lock {lock}",
                check.epoch.unwrap_or(0),
                check.current_epoch.unwrap_or(0)
            ),
        )
        .into());
    }
    if check.lease_alive != Some(true) {
        return Err(Failure::new(
            Exit::LeaseLost,
            format!(
                "lease_expired: the lease of this token on lock {lock} has ended; its writes \
                 are still admitted until a newer holder writes or fences (the resource's \
                 check, not the lease, is what fences): acquire again before relying on it"
            ),
        )
        .into());
    }
    Ok(())
}

/// `palisade keys`: the issuer's public keys (`GET /v1/keys`), for verifying tokens
/// offline.
pub async fn keys(target: Connected) -> anyhow::Result<()> {
    let keys = target.client.keys().await.map_err(|e| target.fail(e))?;
    print_json(&serde_json::json!({ "keys": keys }))
}
