//! How commands print results: pretty JSON on stdout, one value per command.

use anyhow::Context;
use serde::Serialize;

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    let mut text =
        serde_json::to_string_pretty(value).context("cannot render the result as JSON")?;
    text.push('\n');
    write_stdout(text.as_bytes())
}

/// Writes `bytes` to stdout. A reader that stopped reading (`| head -1` closed the pipe)
/// is not an error: what it wanted, it got.
pub fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("cannot write to stdout")
        }
        _ => Ok(()),
    }
}
