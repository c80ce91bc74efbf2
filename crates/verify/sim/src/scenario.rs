//! The shape of one run, drawn from its seed: how many clients, how long leases last, how
//! hostile the network, the disk and the nemesis are.
//!
//! Seeds are spread over a few *fault profiles* rather than one average mix: a run where
//! the node crashes every few hundred milliseconds finds different bugs from one where
//! nothing crashes but clients stall for seconds, and an average of both finds fewer of
//! either.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Lock names. Register locks guard namespaces of plain keys; the set lock guards the
/// lock-set workload's namespace. Few locks, so clients contend.
pub(crate) const REGISTER_LOCKS: [&str; 2] = ["reg-a", "reg-b"];
pub(crate) const SET_LOCK: &str = "set-x";
pub(crate) const REGISTER_KEYS: [&str; 3] = ["k0", "k1", "k2"];
pub(crate) const SET_KEY: &str = "members";

/// Every lock (and so every namespace) the run uses.
pub(crate) fn all_locks() -> impl Iterator<Item = &'static str> {
    REGISTER_LOCKS.into_iter().chain([SET_LOCK])
}

/// A run's parameters. Ranges are inclusive `(low, high)` in milliseconds.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub profile: &'static str,
    pub clients: usize,
    pub ttl_ms: (u64, u64),
    /// The table's lock-delay after an expiry (0 in most runs).
    pub lock_delay_ms: u64,
    /// Epochs per durable reservation: small blocks cross ceilings often.
    pub epoch_block: u64,
    /// How long a released lock keeps its reservation active (see `TableConfig`).
    pub idle_grace_ms: u64,
    /// Longest ordinary network delay; 5% of messages get up to ten times more.
    pub max_delay_ms: u64,
    pub drop_prob: f64,
    pub hold_prob: f64,
    pub hold_ms: (u64, u64),
    /// Gap between node crashes, `None` for a node that never crashes.
    pub crash_every_ms: Option<(u64, u64)>,
    pub downtime_ms: (u64, u64),
    /// Chance that a crash happens after the fsync of the batch in flight reached the
    /// disk but before any of its answers left (durable, never acknowledged).
    pub torn_commit_prob: f64,
    pub fsync_ms: (u64, u64),
    pub slow_fsync_prob: f64,
    pub slow_fsync_ms: (u64, u64),
    pub partition_every_ms: Option<(u64, u64)>,
    pub partition_ms: (u64, u64),
    /// Stop-the-world pauses of a client at any moment.
    pub pause_every_ms: Option<(u64, u64)>,
    pub pause_ms: (u64, u64),
    /// Chance that a client stalls between checking its lease and sending (per send).
    pub gc_between_check_and_send: f64,
    /// Chance that a client never checks its lease locally before sending.
    pub sloppy_prob: f64,
    /// How long clients think between operations.
    pub think_ms: (u64, u64),
    /// How long a client waits for an answer before recording `info`.
    pub timeout_ms: u64,
}

const PROFILES: [&str; 6] = [
    "calm",
    "crashy",
    "slow-disk",
    "partitions",
    "pauses",
    "everything",
];

impl Scenario {
    pub(crate) fn draw(rng: &mut ChaCha8Rng) -> Scenario {
        let profile = PROFILES[rng.gen_range(0..PROFILES.len())];
        let on = |name: &str| profile == name || profile == "everything";
        let mut sc = Scenario {
            profile,
            clients: rng.gen_range(3..=6),
            ttl_ms: (150, rng.gen_range(200..=700)),
            epoch_block: [1, 2, 5, 1024][rng.gen_range(0..4)],
            idle_grace_ms: [0, 0, 50, 1_000][rng.gen_range(0..4)],
            lock_delay_ms: if rng.gen_bool(0.25) {
                rng.gen_range(20..=200)
            } else {
                0
            },
            max_delay_ms: rng.gen_range(1..=8),
            drop_prob: 0.005,
            hold_prob: rng.gen_range(0.0..0.03),
            hold_ms: (200, rng.gen_range(400..=2_500)),
            crash_every_ms: None,
            downtime_ms: (5, rng.gen_range(10..=800)),
            torn_commit_prob: 0.3,
            fsync_ms: (1, rng.gen_range(2..=12)),
            slow_fsync_prob: rng.gen_range(0.0..0.05),
            slow_fsync_ms: (50, 400),
            partition_every_ms: None,
            partition_ms: (50, rng.gen_range(100..=1_500)),
            pause_every_ms: None,
            pause_ms: (50, rng.gen_range(200..=1_500)),
            gc_between_check_and_send: 0.01,
            sloppy_prob: 0.3,
            think_ms: (1, rng.gen_range(5..=40)),
            timeout_ms: rng.gen_range(150..=400),
        };
        if on("crashy") {
            sc.crash_every_ms = Some((100, rng.gen_range(300..=1_500)));
        }
        if on("slow-disk") {
            // Fsyncs that outlast leases, and crashes in the middle of them.
            sc.slow_fsync_prob = rng.gen_range(0.1..0.3);
            sc.slow_fsync_ms = (100, rng.gen_range(300..=900));
            sc.crash_every_ms = Some((200, rng.gen_range(500..=2_000)));
        }
        if on("partitions") {
            sc.partition_every_ms = Some((50, rng.gen_range(200..=1_000)));
            sc.drop_prob = 0.02;
        }
        if on("pauses") {
            sc.pause_every_ms = Some((50, rng.gen_range(200..=800)));
            sc.gc_between_check_and_send = 0.05;
        }
        if profile == "calm" {
            // Still one crash now and then: a run with no restart cannot find recovery bugs.
            sc.crash_every_ms = Some((1_000, 3_000));
        }
        sc
    }
}
