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

/// Where the servers under test run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Topology {
    /// One `palisade serve` process over its own data directory.
    Embedded,
    /// Three etcd members and three stateless `palisade serve --backend etcd` nodes, all
    /// on loopback; the workers are spread over the nodes. Needs `etcd` installed and a
    /// `palisade` built with `--features etcd`.
    Etcd3,
}

impl Topology {
    pub fn as_str(self) -> &'static str {
        match self {
            Topology::Embedded => "embedded",
            Topology::Etcd3 => "etcd3",
        }
    }
}

/// What the workers talk to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// Palisade itself: its lock service and its fenced store, on the chosen topology.
    #[value(alias = "embedded")]
    Palisade,
    /// Negative control: the same routes served by a toy store that ignores tokens (the
    /// lock service is still a real Palisade server). Violations are expected.
    UnfencedControl,
    /// Negative control (etcd3): etcd's own lock (a lease plus a lock key, as etcd's
    /// `concurrency.Mutex` does) guarding a store that checks no token. Violations are
    /// expected, as Jepsen found for etcd 3.4.3.
    EtcdLock,
    /// Control (etcd3): the same etcd lock, with the lock key's revision carried as the
    /// fencing epoch and checked by the gate rule at the store. Must come out clean.
    EtcdLockFenced,
    /// The PostgreSQL gate: locks from a Palisade server, the data in a PostgreSQL the
    /// harness starts, written through `palisade_adapters::postgres` (admit and write in
    /// one transaction); faults on the database too (`db-kill`, `db-pause`).
    PostgresGate,
    /// The Redis gate: the same, with the data in a Redis the harness starts, written
    /// through `palisade_adapters::redis::RedisFence` (the admit and the write in one
    /// script).
    RedisGate,
    /// The SQLite gate: the same, with the data in a SQLite file held by an application
    /// process of its own (`palisade verify-sqlite-app`, written through
    /// `palisade_adapters::sqlite`), which the database faults kill and pause.
    SqliteGate,
}

/// The language of the gate the application of a gate target writes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GateLang {
    /// `palisade-adapters` (PostgreSQL, Redis, SQLite).
    Rust,
    /// `palisade.gates` from the Python package (PostgreSQL, SQLite), in an application
    /// process run by `--python`.
    Python,
}

impl GateLang {
    pub fn as_str(self) -> &'static str {
        match self {
            GateLang::Rust => "rust",
            GateLang::Python => "python",
        }
    }
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Palisade => "palisade",
            Target::UnfencedControl => "unfenced-control",
            Target::EtcdLock => "etcd-lock",
            Target::EtcdLockFenced => "etcd-lock-fenced",
            Target::PostgresGate => "postgres-gate",
            Target::RedisGate => "redis-gate",
            Target::SqliteGate => "sqlite-gate",
        }
    }

    /// The topology a target runs on when `--topology` is not given.
    pub fn default_topology(self) -> Topology {
        match self {
            Target::Palisade
            | Target::UnfencedControl
            | Target::PostgresGate
            | Target::RedisGate
            | Target::SqliteGate => Topology::Embedded,
            Target::EtcdLock | Target::EtcdLockFenced => Topology::Etcd3,
        }
    }

    /// The etcd-lock controls take their locks from etcd, not from Palisade.
    pub fn uses_etcd_lock(self) -> bool {
        matches!(self, Target::EtcdLock | Target::EtcdLockFenced)
    }

    /// The targets whose store is a user's database behind a gate.
    pub fn is_gate(self) -> bool {
        matches!(
            self,
            Target::PostgresGate | Target::RedisGate | Target::SqliteGate
        )
    }
}

/// How a worker takes locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LockProtocol {
    /// Palisade's lock API (`/v1/locks`, `/v1/leases`): signed tokens.
    Palisade,
    /// etcd's lock recipe over etcd's JSON gateway: the lock key's create revision is the
    /// epoch.
    Etcd,
}

/// One kind of fault the nemesis injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGSTOP a worker for longer than its lease TTL, then SIGCONT (a GC pause).
    Pause,
    /// SIGKILL the server (embedded) or one Palisade node (etcd3) and restart it on the
    /// same data directory and port.
    Kill,
    /// Hold a worker's outgoing bytes in the proxy, so its requests land late.
    Delay,
    /// Cut every open connection of a worker in the proxy.
    Drop,
    /// Refuse a worker's traffic in the proxy for a while.
    Partition,
    /// SIGKILL the etcd leader and restart it on its data directory.
    EtcdKill,
    /// SIGSTOP an etcd member (the leader, most of the time) past the election timeout.
    EtcdPause,
    /// Cut one Palisade node off from etcd (its etcd proxies refuse traffic) while the
    /// workers still reach it.
    NodePartition,
    /// SIGKILL the embedded server, damage the newest commit of its store, restart it.
    /// Never part of `all`: name it.
    Disk,
    /// SIGKILL the gate's database (every process of it: PostgreSQL's postmaster and
    /// backends, redis-server) and restart it on its files.
    DbKill,
    /// SIGSTOP every process of the gate's database, then SIGCONT.
    DbPause,
    /// Cut every open connection between the gate's application and its database.
    DbDrop,
    /// Hold the bytes the gate's application sends its database for a while.
    DbDelay,
    /// SIGKILL the gate's database and promote its streaming replica (PostgreSQL), which
    /// the application reaches from then on; a new replica is cloned from it. The run
    /// starts the replica only when this fault is asked for. Never part of `all`: name it.
    DbFailover,
    /// SIGKILL the gate's database and drop every write to its files that no fsync
    /// reached (a machine losing power), then restart it. Its files are then on a lazy
    /// file system ([`crate::lazy_fs`], FUSE), mounted only when this fault is asked
    /// for. Never part of `all`: name it.
    DbPowerLoss,
}

impl FaultKind {
    /// Every kind, in the order `--faults` lists them.
    pub const EVERY: [FaultKind; 15] = [
        FaultKind::Pause,
        FaultKind::Kill,
        FaultKind::Delay,
        FaultKind::Drop,
        FaultKind::Partition,
        FaultKind::EtcdKill,
        FaultKind::EtcdPause,
        FaultKind::NodePartition,
        FaultKind::Disk,
        FaultKind::DbKill,
        FaultKind::DbPause,
        FaultKind::DbDrop,
        FaultKind::DbDelay,
        FaultKind::DbFailover,
        FaultKind::DbPowerLoss,
    ];

    /// Faults aimed at one worker (its process or its proxy link); every deployment has
    /// them. The others act on the deployment's own processes and files.
    pub const WORKER: [FaultKind; 4] = [
        FaultKind::Pause,
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
            FaultKind::EtcdKill => "etcd-kill",
            FaultKind::EtcdPause => "etcd-pause",
            FaultKind::NodePartition => "node-partition",
            FaultKind::Disk => "disk",
            FaultKind::DbKill => "db-kill",
            FaultKind::DbPause => "db-pause",
            FaultKind::DbDrop => "db-drop",
            FaultKind::DbDelay => "db-delay",
            FaultKind::DbFailover => "db-failover",
            FaultKind::DbPowerLoss => "db-power-loss",
        }
    }

    /// Never part of `all` (see [`FaultKind::parse_list`]).
    pub fn named_only(self) -> bool {
        matches!(
            self,
            FaultKind::Disk | FaultKind::DbFailover | FaultKind::DbPowerLoss
        )
    }

    pub fn is_worker_fault(self) -> bool {
        FaultKind::WORKER.contains(&self)
    }

    /// Parses `pause,kill,...`, `all` or `none` for a deployment whose own faults are
    /// `supported`. `all` means the worker faults plus every supported one except `disk`
    /// (which finds a known weakness of today's store), `db-failover` and `db-power-loss`
    /// (which change the deployment: a replica beside the database, its files on FUSE):
    /// they must be asked for by name.
    pub fn parse_list(text: &str, supported: &[FaultKind]) -> Result<Vec<FaultKind>, VerifyError> {
        let mut kinds = Vec::new();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "all" => {
                    kinds.extend(FaultKind::WORKER);
                    kinds.extend(supported.iter().filter(|k| !k.named_only()));
                }
                "none" => {}
                _ => match FaultKind::EVERY.iter().find(|k| k.as_str() == word) {
                    Some(k) if k.is_worker_fault() || supported.contains(k) => kinds.push(*k),
                    Some(k) => {
                        return Err(VerifyError::Config(format!(
                            "fault {k} does not apply to this deployment (its own faults: {})",
                            names(supported)
                        )))
                    }
                    None => {
                        return Err(VerifyError::Config(format!(
                            "unknown fault {word:?}: use {}, all or none",
                            names(&FaultKind::EVERY)
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

fn names(kinds: &[FaultKind]) -> String {
    kinds
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
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
    /// Faults to inject: a comma-separated list of pause, kill, delay, drop, partition,
    /// etcd-kill, etcd-pause, node-partition (etcd3), disk (embedded), db-kill, db-pause,
    /// db-drop, db-delay (the gate targets), db-failover (postgres-gate, redis-gate) and
    /// db-power-loss (redis-gate, sqlite-gate); or `all` (every fault the target has, except disk,
    /// db-failover and db-power-loss), or `none`.
    #[arg(long, default_value = "all")]
    pub faults: String,
    /// Servers under test: `embedded` (one node) or `etcd3` (three etcd members, three
    /// Palisade nodes). Default: embedded, or etcd3 for the etcd-lock targets.
    #[arg(long, value_enum)]
    pub topology: Option<Topology>,
    /// What the workers use: Palisade; a database behind a Palisade gate
    /// (`postgres-gate`, `redis-gate`, `sqlite-gate`: lock-set and register workloads); or a control:
    /// `unfenced-control` (embedded; a toy store that ignores tokens), `etcd-lock` (etcd's
    /// own lock, unchecked store) or `etcd-lock-fenced` (etcd's lock, its revision checked
    /// at the store). The controls run the lock-set workload only; the unfenced ones must
    /// show violations.
    #[arg(long, value_enum, default_value_t = Target::Palisade)]
    pub target: Target,
    /// Directory for the history, final state, summary, server log and HTML report
    /// (printed at the start of the run). The default is under the system's temporary
    /// directory, so a run never leaves files in the directory it was started from.
    #[arg(long, default_value_os_t = default_out())]
    pub out: PathBuf,
    /// Lease TTL of the workers (ms). Pauses, delays and partitions outlast it.
    #[arg(long, default_value_t = 1000)]
    pub ttl_ms: u64,
    /// Wall-time budget of the linearizability search (seconds); past it the verdict is
    /// "unknown", never "valid".
    #[arg(long, default_value_t = 60)]
    pub check_secs: u64,
    /// Run the servers with an auth file: one principal per worker, each authenticating
    /// with its own key, so identity, permission and ownership checks are on the path
    /// under test (Palisade targets only).
    #[arg(long)]
    pub auth: bool,
    /// Gate targets: run the database with a setting the gate's preflight refuses
    /// (PostgreSQL: `synchronous_commit=off`, or with `db-failover` an asynchronous replica;
    /// Redis: `appendonly no`, with `db-failover` a gate that does not `WAIT` for its
    /// replica, with `db-power-loss` `appendfsync everysec`; SQLite: `synchronous=OFF`,
    /// with `db-power-loss` only, since SQLite's unsafe settings lose commits only when
    /// the machine goes down). A negative control: with `db-kill` (or `db-failover`,
    /// `db-power-loss`) among the faults, violations are expected, and the report names
    /// the setting.
    #[arg(long)]
    pub unsafe_db: bool,
    /// Gate targets: the gate the application writes through, `rust` or `python`
    /// (`palisade.gates`, for postgres-gate and sqlite-gate; the application then runs
    /// as a Python process of its own).
    #[arg(long, value_enum, default_value_t = GateLang::Rust)]
    pub gate_lang: GateLang,
    /// The Python interpreter of `--gate-lang python`, with `palisade-client` and
    /// psycopg installed (a virtualenv's `bin/python`, say).
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
}

/// Flags of the hidden `palisade verify-worker` (started by `palisade verify`).
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Worker id (1-based); it is the `process` of every operation recorded.
    #[arg(long)]
    pub id: u64,
    /// Base URLs for lock calls, comma-separated (the worker's proxies in front of each
    /// Palisade node or etcd member). The worker starts with number `(id - 1) % n` and
    /// fails over to the next on a refused connection or a 503.
    #[arg(long, value_delimiter = ',', required = true)]
    pub lock_urls: Vec<String>,
    /// Base URLs for store calls, comma-separated, tried like `--lock-urls`.
    #[arg(long, value_delimiter = ',', required = true)]
    pub store_urls: Vec<String>,
    /// How locks are taken.
    #[arg(long, value_enum, default_value_t = LockProtocol::Palisade)]
    pub lock_protocol: LockProtocol,
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

/// `--out`'s default: `palisade-verify-out` in the system's temporary directory (`$TMPDIR`,
/// else `/tmp`). Each run replaces the previous run's files there.
pub fn default_out() -> PathBuf {
    std::env::temp_dir().join("palisade-verify-out")
}

#[cfg(test)]
mod tests {
    use super::*;

    use FaultKind::*;

    #[test]
    fn fault_lists() {
        let embedded = [Kill, Disk];
        assert_eq!(
            FaultKind::parse_list("all", &embedded).unwrap(),
            vec![Pause, Kill, Delay, Drop, Partition]
        );
        assert_eq!(FaultKind::parse_list("none", &embedded).unwrap(), vec![]);
        assert_eq!(
            FaultKind::parse_list("partition, pause,pause", &embedded).unwrap(),
            vec![Pause, Partition]
        );
        assert_eq!(
            FaultKind::parse_list("disk,all", &embedded).unwrap(),
            vec![Pause, Kill, Delay, Drop, Partition, Disk]
        );
        assert!(FaultKind::parse_list("pause,gc", &embedded).is_err());
        assert!(FaultKind::parse_list("etcd-kill", &embedded).is_err());
        let etcd3 = [Kill, EtcdKill, EtcdPause, NodePartition];
        // "all": the faults every deployment has, and this deployment's own.
        let mut expected = [&FaultKind::WORKER[..], &etcd3[..]].concat();
        expected.sort();
        assert_eq!(FaultKind::parse_list("all", &etcd3).unwrap(), expected);
        assert!(FaultKind::parse_list("disk", &etcd3).is_err());
        // A replica is started only for db-failover, a lazy file system only for
        // db-power-loss: `all` never asks for either.
        let redis = [Kill, DbKill, DbFailover, DbPowerLoss];
        assert_eq!(
            FaultKind::parse_list("all", &redis).unwrap(),
            vec![Pause, Kill, Delay, Drop, Partition, DbKill]
        );
        let postgres = [Kill, DbKill, DbFailover];
        assert_eq!(
            FaultKind::parse_list("db-failover", &postgres).unwrap(),
            vec![DbFailover]
        );
    }

    #[test]
    fn names_round_trip_through_serde() {
        for kind in FaultKind::EVERY {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json, kind.as_str());
        }
    }
}
