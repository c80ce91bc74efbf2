//! Flags of `palisade verify` and of its hidden worker processes, and the small enums
//! they name (workload, fault kind, target).

use std::fmt;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::VerifyError;

/// What the workers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// Acquire, fence, read a set, sleep inside the critical section, write the set back
    /// plus a unique element, release (Jepsen's lock workload, with fencing on).
    LockSet,
    /// Fenced writes, deletes and plain reads of a few keys with unique values.
    Register,
    /// Acquire and release only: the issued epochs.
    Tokens,
}

impl Workload {
    pub fn as_str(self) -> &'static str {
        match self {
            Workload::LockSet => "lock-set",
            Workload::Register => "register",
            Workload::Tokens => "tokens",
        }
    }

    /// The locks (= store namespaces) the workload uses.
    pub fn locks(self) -> &'static [&'static str] {
        match self {
            Workload::LockSet => &["set"],
            Workload::Register => &["reg-0", "reg-1"],
            Workload::Tokens => &["tok-0", "tok-1"],
        }
    }
}

/// What the workers talk to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// A Palisade server started by the harness (`palisade serve`, a child process).
    Embedded,
    /// Negative control: the same routes served by a toy store that ignores tokens (the
    /// lock service is still a real Palisade server). Violations are expected.
    UnfencedControl,
}

/// One kind of fault the nemesis injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultKind {
    /// SIGSTOP a worker for longer than its lease TTL, then SIGCONT (a GC pause).
    Pause,
    /// SIGKILL the server and restart it on the same data directory and port.
    Kill,
    /// Hold a worker's outgoing bytes in the proxy, so its requests land late.
    Delay,
    /// Cut every open connection of a worker in the proxy.
    Drop,
    /// Refuse a worker's traffic in the proxy for a while.
    Partition,
}

impl FaultKind {
    pub const ALL: [FaultKind; 5] = [
        FaultKind::Pause,
        FaultKind::Kill,
        FaultKind::Delay,
        FaultKind::Drop,
        FaultKind::Partition,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Pause => "pause",
            FaultKind::Kill => "kill",
            FaultKind::Delay => "delay",
            FaultKind::Drop => "drop",
            FaultKind::Partition => "partition",
        }
    }

    /// Parses `pause,kill,...`, `all` or `none`.
    pub fn parse_list(text: &str) -> Result<Vec<FaultKind>, VerifyError> {
        let mut kinds = Vec::new();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "all" => kinds.extend(FaultKind::ALL),
                "none" => {}
                _ => match FaultKind::ALL.iter().find(|k| k.as_str() == word) {
                    Some(k) => kinds.push(*k),
                    None => {
                        return Err(VerifyError::Config(format!(
                            "unknown fault {word:?}: use pause, kill, delay, drop, partition, all or none"
                        )))
                    }
                },
            }
        }
        kinds.sort();
        kinds.dedup();
        Ok(kinds)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Flags of `palisade verify`.
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// How long the workload runs, in seconds (faults stop, then workers finish).
    #[arg(long, default_value_t = 30)]
    pub time: u64,
    /// Number of worker processes.
    #[arg(long, default_value_t = 5)]
    pub workers: u32,
    /// Seed of the fault schedule and the workers' choices (random if omitted; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Workload the workers run.
    #[arg(long, value_enum, default_value_t = Workload::LockSet)]
    pub workload: Workload,
    /// Faults to inject: a comma-separated list of pause, kill, delay, drop, partition;
    /// or `all`, or `none`.
    #[arg(long, default_value = "all")]
    pub faults: String,
    /// Deployment under test: the embedded server, or the deliberately unfenced toy
    /// store (a negative control that must show violations; lock-set only).
    #[arg(long, value_enum, default_value_t = Target::Embedded)]
    pub target: Target,
    /// Directory for the history, final state, summary, server log and HTML report.
    #[arg(long, default_value = "palisade-verify-out")]
    pub out: PathBuf,
    /// Lease TTL of the workers (ms). Pauses, delays and partitions outlast it.
    #[arg(long, default_value_t = 1000)]
    pub ttl_ms: u64,
    /// Wall-time budget of the linearizability search (seconds); past it the verdict is
    /// "unknown", never "valid".
    #[arg(long, default_value_t = 60)]
    pub check_secs: u64,
}

/// Flags of the hidden `palisade verify-worker` (started by `palisade verify`).
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Worker id (1-based); it is the `process` of every operation recorded.
    #[arg(long)]
    pub id: u64,
    /// Base URL for lock calls (the worker's proxy in front of the lock service).
    #[arg(long)]
    pub lock_url: String,
    /// Base URL for store calls (the worker's proxy in front of the store).
    #[arg(long)]
    pub store_url: String,
    #[arg(long, value_enum)]
    pub workload: Workload,
    #[arg(long)]
    pub ttl_ms: u64,
    #[arg(long)]
    pub seed: u64,
    /// File the worker appends its history lines to.
    #[arg(long)]
    pub history: PathBuf,
    /// CLOCK_MONOTONIC reading (ns) that is time 0 of the run, shared by every process.
    #[arg(long)]
    pub clock_origin_ns: u64,
    /// Start no new iteration after this time (µs since the origin).
    #[arg(long)]
    pub stop_at_us: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_lists() {
        assert_eq!(
            FaultKind::parse_list("all").unwrap(),
            FaultKind::ALL.to_vec()
        );
        assert_eq!(FaultKind::parse_list("none").unwrap(), vec![]);
        assert_eq!(
            FaultKind::parse_list("partition, pause,pause").unwrap(),
            vec![FaultKind::Pause, FaultKind::Partition]
        );
        assert!(FaultKind::parse_list("pause,gc").is_err());
    }
}
