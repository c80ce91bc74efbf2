//! How commands print results: pretty JSON on stdout, one value per command.

use anyhow::Context;
use serde::Serialize;

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("cannot render the result as JSON")?;
    println!("{text}");
    Ok(())
}
