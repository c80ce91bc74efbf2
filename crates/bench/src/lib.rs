//! # Bench: how fast is Palisade, next to what users would build instead?
//!
//! A load generator behind `palisade bench`. It runs the same jobs against Palisade and
//! against the three systems people use for the same purpose today, each made equally
//! durable (an fsync before every acknowledgement):
//!
//! | job | Palisade | Redis (AOF, `appendfsync always`) | PostgreSQL (`synchronous_commit=on`) | etcd |
//! |---|---|---|---|---|
//! | `j1` | acquire + release | Lua: `SET NX PX` + `INCR` epoch; Lua release | conditional `UPDATE ... RETURNING epoch`; release `UPDATE` | txn on the lock key's version, puts the epoch; txn release |
//! | `j2` | fenced `PUT /v1/kv` | Lua: compare high-water, set it and the value | one statement: fence `UPDATE` + value upsert | txn comparing the fence value, puts both |
//! | `plain` | (none: every write is fenced) | `SET` | upsert | put |
//! | `contended` | blocking acquire (`wait_ms`), FIFO hand-off | `SET NX` retry with a 1 ms sleep | conditional `UPDATE` retry | txn retry |
//! | `read` | `GET /v1/kv` | `GET` | `SELECT` | range get |
//! | `scale` | 1,000,000 locks, then 10,000 leases renewed every second | | | |
//!
//! Each of N clients is one task with its own persistent connection, and (except in
//! `contended`) its own locks. One *operation* is one unit of the job: for `j1` an
//! acquire **and** its release, for `contended` one attempt. Latencies go into an
//! HdrHistogram per client, merged at the end.
//!
//! ## Invariants
//! - Only operations that start after the warm-up and finish before the end of the
//!   measured window count towards throughput and latency. Errors count whenever they
//!   happen, and a run with any error makes the command fail, so an error can never hide
//!   behind a good number.
//! - Every run uses lock and key names unique to it, so runs never see each other's
//!   leases, even against a long-lived server.
//! - The bench process's own CPU use is measured and reported beside the throughput: on a
//!   small machine the load generator competes with the server, and the reader must be
//!   able to see whether it was the bottleneck.
//!
//! ## What this crate does not do
//! - It makes no claim about other machines: the numbers are only comparable within one
//!   run on one machine (the ratios are the result, not the absolute figures).
//! - It does not start or configure the servers under test; `bench/compare` does that.
//! - The peers' recipes are the natural single-node ones; none of them gives what
//!   Palisade's gate gives at the resource (a signed token checked where writes land).

mod args;
mod driver;
mod http;
mod palisade;
mod peers;
mod report;
#[cfg(feature = "peers")]
mod resp;
mod runner;
mod scale;
mod svg;
mod sys;

use std::path::PathBuf;

pub use args::{BenchArgs, Job, Target};
pub use driver::{OpError, Outcome, Plan, Worker};
pub use report::{Results, Summary};
pub use scale::ScaleReport;

/// Why a bench command failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The flags do not describe a run that can be done.
    #[error("{0}")]
    Args(String),
    /// A driver could not set up (connect, create its schema, acquire its lock).
    #[error("{target:?} setup: {message}")]
    Setup { target: Target, message: String },
    /// The target's driver was not compiled into this binary.
    #[error("the {target:?} driver is not built in; rebuild with `--features {feature}`")]
    NotBuilt {
        target: Target,
        feature: &'static str,
    },
    /// A result file could not be read or written.
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    /// The runs completed, but some operations failed (listed in the report).
    #[error("{0} operation(s) failed; see the errors column")]
    OperationsFailed(u64),
}

/// Runs `palisade bench` with these arguments: every job at every client count, then the
/// table, and the JSON and SVG files if asked for. With `--merge`, only compares result
/// files. Fails if any operation failed.
pub async fn run(args: BenchArgs) -> Result<Results, BenchError> {
    if !args.merge.is_empty() {
        let results = report::read_all(&args.merge)?;
        print!("{}", report::markdown(&results));
        if let Some(path) = &args.svg {
            let runs: Vec<Summary> = results.iter().flat_map(|r| r.runs.clone()).collect();
            write_file(path, &svg::chart(&runs))?;
        }
        return Ok(Results::default());
    }
    let results = runner::run_all(&args).await?;
    print!("{}", report::table(&results.runs));
    if let Some(scale) = &results.scale {
        print!("{scale}");
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&results).map_err(|e| BenchError::File {
            path: path.clone(),
            message: e.to_string(),
        })?;
        write_file(path, &text)?;
    }
    if let Some(path) = &args.svg {
        write_file(path, &svg::chart(&results.runs))?;
    }
    match results.error_total() {
        0 => Ok(results),
        n => Err(BenchError::OperationsFailed(n)),
    }
}

fn write_file(path: &std::path::Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(path, text).map_err(|e| BenchError::File {
        path: path.to_owned(),
        message: e.to_string(),
    })
}
