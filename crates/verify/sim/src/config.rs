//! What a run is asked to do: run length, checker budget, tracing, and the deliberately
//! broken variants used by the mutation checks.
//!
//! Everything else about a run (how many clients, how often the node crashes, how lossy
//! the network is) is drawn from the seed by [`crate::scenario`], so that one number
//! reproduces a run exactly.

use std::time::Duration;

/// A deliberately broken variant of the simulated node, for mutation checks only.
///
/// Each one breaks one promise of `docs/guarantees.md` in the simulator's model of the
/// node, never in production code. A sweep against a variant must report a violation;
/// if it does not, the simulation (or the checkers) cannot see that kind of bug.
///
/// Not every plausible slip is a bug: telling the table a reservation is durable when its
/// batch *starts* (instead of after the fsync) was tried and never observed in 20,000
/// seeds, because no grant can use a reservation before its fsync returns: the grant that
/// needed it holds the lock until its token has left (after the fsync), and a grant that
/// follows an expiry is always written first. Such an equivalent variant is not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The gate admits an epoch below the high-water mark (keeping the larger mark).
    GateAdmitsStale,
    /// The issuer answers a grant that needs a new reservation before that reservation
    /// is fsync'd: a crash then hands the same epoch out again.
    GrantBeforeFsync,
    /// The store acknowledges a mutation before its batch is fsync'd: a crash then loses
    /// an acknowledged write and can lower the mark.
    AckBeforeFsync,
    /// A restart restores epochs only, honouring neither lease records nor reservations:
    /// a lease that was live at the crash is not waited out.
    ForgetLeasesOnRestart,
}

impl Bug {
    pub const ALL: [Bug; 4] = [
        Bug::GateAdmitsStale,
        Bug::GrantBeforeFsync,
        Bug::AckBeforeFsync,
        Bug::ForgetLeasesOnRestart,
    ];
}

impl std::str::FromStr for Bug {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Bug::ALL
            .into_iter()
            .find(|b| format!("{b:?}").eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown bug {s:?} (one of {:?})", Bug::ALL))
    }
}

/// Settings of one simulated run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Virtual time during which clients start new operations (ms). After it, clients
    /// finish what they have in flight, the network is cut and the store is read.
    pub workload_ms: u64,
    /// Wall-clock budget of the linearizability search per run.
    pub check_budget: Duration,
    /// Broken variant to simulate, if any.
    pub bug: Option<Bug>,
    /// Whether lock-set holders fence before reading the set. Without the barrier, an old
    /// holder's write that lands before the new holder's first write is accepted (S10)
    /// and lost updates are expected: this switch keeps that boundary testable.
    pub lockset_fences: bool,
    /// Epochs per durable reservation; `None` lets the seed choose (1, 2, 5 or 1024).
    /// With 1, every grant waits for its own reservation write.
    pub epoch_block: Option<u64>,
    /// Keep a human-readable event trace (slow; for replaying one seed).
    pub trace: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            workload_ms: 4_000,
            check_budget: Duration::from_secs(5),
            bug: None,
            lockset_fences: true,
            epoch_block: None,
            trace: false,
        }
    }
}

/// Environment variable naming one seed to replay (with a trace).
pub const ENV_SEED: &str = "PALISADE_SIM_SEED";
/// Environment variable setting how many seeds a sweep runs.
pub const ENV_SEEDS: &str = "PALISADE_SIM_SEEDS";
/// Environment variable setting the first seed of a sweep (default 0).
pub const ENV_FIRST: &str = "PALISADE_SIM_FIRST_SEED";

/// Reads a numeric environment variable; `Err` names the variable when it does not parse.
pub fn env_u64(name: &str) -> Result<Option<u64>, String> {
    match std::env::var(name) {
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|e| format!("{name}={text:?}: {e}")),
        Err(_) => Ok(None),
    }
}
