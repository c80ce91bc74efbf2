//! # Verify: Palisade under faults, with real processes
//!
//! `palisade verify` starts its own deployment on loopback (by default one `palisade
//! serve` child process; with `--topology etcd3` three etcd members and three Palisade
//! nodes), a fault proxy per worker and node, and W worker *processes* built on
//! `palisade-client`. For `--time` seconds the workers run a workload while a nemesis,
//! on a schedule drawn from a printed `--seed`, freezes workers with SIGSTOP for longer
//! than their lease, SIGKILLs and restarts the server on the same data directory and
//! port, delays a worker's requests in the proxy so they land after a newer epoch's
//! writes, cuts its connections, and partitions it. Every worker records each call it
//! makes (invocation, completion, outcome) in the `palisade-checker` history format; the
//! harness merges the files, reads the store's final state, runs every checker, prints a
//! summary, and writes an HTML report with a timeline. The exit code is non-zero iff a
//! violation was found or the run could not be completed.
//!
//! The headline workload is Jepsen's lock test, with fencing on: acquire, fence, read a
//! set, sleep inside the critical section, write the set back plus a unique element,
//! release. Under pauses and delays two workers regularly believe they hold the lock at
//! once; fencing must make sure no acknowledged element is ever lost.
//!
//! ## Layers
//! - [`args`]: flags; [`clock`]: the one clock every process shares.
//! - [`deploy`]: the [`deploy::Deployment`] trait (the servers under test) and its
//!   implementations: embedded, etcd3, and the controls (unfenced toy store, etcd's own
//!   lock unfenced and fenced by revision).
//! - [`disk`]: the disk fault's damage step (the newest commit of the embedded store).
//! - [`proxy`]: the userspace TCP proxy that delays, drops and partitions.
//! - [`nemesis`]: the fault schedule. [`procs`]: worker processes and signals.
//! - [`worker`]: the worker process and its workloads. [`record`]: history files.
//! - `run`, `judge`, [`summary`], `report`: orchestration, verdicts and output.
//!
//! ## What a passing run proves
//! That in *this* history, with *these* faults at *these* moments, no checker found a
//! violation: epochs were unique and increased (across SIGKILL restarts), no mutation was
//! accepted below an established high-water mark, every namespace behaved as one atomic
//! fenced register, and no acknowledged lock-set element was lost. The negative control
//! (`--target unfenced-control`, the same workload and faults against a toy store that
//! ignores tokens) shows that these faults do produce lost updates when nothing checks the
//! token, so a clean Palisade run is evidence about fencing, not about gentle faults.
//!
//! ## What it does not prove (S16)
//! - Nothing about interleavings, faults or timings the run did not produce: it samples,
//!   it does not enumerate. Longer runs and more seeds sample more.
//! - Loopback only: no real network, no clock faults, no restore from backup (S11). The
//!   proxy delays and cuts TCP; it does not reorder bytes within a connection or corrupt
//!   them. The disk fault damages one place (the newest commit) of the embedded store;
//!   it is not a model of every way a disk fails. etcd3 runs three etcd members and
//!   three Palisade nodes on one machine: etcd's own correctness is taken as given.
//! - The workers are well-behaved `palisade-client` users. Forged or malformed tokens
//!   (S12, S14) are covered by the end-to-end tests, not here.
//! - The linearizability search is bounded in time; past its budget it answers
//!   "unknown", which is reported but not counted as a violation.
//! - Fencing's own limits stay visible rather than tested away: an old write that reaches
//!   the store before the new epoch does is accepted (S10), which is why the lock-set
//!   workers call the fence barrier after acquiring; equal epochs do not deduplicate
//!   retries (S9).

pub mod args;
pub mod auth;
pub mod clock;
pub mod deploy;
pub mod disk;
mod final_read;
mod judge;
pub mod lazy_fs;
pub mod nemesis;
pub mod procs;
pub mod proxy;
pub mod record;
mod report;
mod run;
pub mod summary;
pub mod worker;

pub use args::{
    FaultKind, GateLang, LockProtocol, Target, Topology, VerifyArgs, WorkerArgs, Workload,
};
pub use deploy::sqlite_store::{run_app as run_sqlite_app, SqliteAppArgs};
pub use run::run;
pub use summary::Summary;
pub use worker::run as run_worker;

/// Why a run could not be completed. Violations are not errors: see [`Outcome`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    #[error("{0}")]
    Config(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("deployment: {0}")]
    Deploy(String),
    #[error("{0}")]
    Worker(String),
    #[error("history: {0}")]
    History(#[from] palisade_checker::HistoryError),
    #[error("interrupted")]
    Interrupted,
    #[error("internal error: {0}")]
    Internal(String),
}

impl VerifyError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> VerifyError {
        VerifyError::Io {
            context: context.into(),
            source,
        }
    }
}

/// A completed run's verdict.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Violations found by all checkers together; 0 means the run passed.
    pub violations: usize,
    /// Of which lost lock-set updates.
    pub lost_updates: usize,
    pub summary: Summary,
}
