//! One seeded run from start to verdict: workload, wind-down, final read, checkers.

use palisade_checker::{check_all, FinalState, History, OpKind, Outcome as OpOutcome, Validity};

use crate::config::Config;
use crate::net::NetStats;
use crate::recorder::final_state;
use crate::scenario::Scenario;
use crate::world::World;

/// Virtual time allowed after the workload for clients to finish and the node to settle.
/// Every client request has a timeout, so this is only a guard against a stuck run.
const WIND_DOWN_MS: u64 = 60_000;

/// Counts of what happened in a run, so tests can show the faults really happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    pub ops: u64,
    pub ok: u64,
    pub fail: u64,
    pub info: u64,
    pub stale_refusals: u64,
    /// Old-epoch mutations admitted because the store had not seen the newer epoch yet.
    pub late_admitted: u64,
    pub acquisitions: u64,
    pub commits: u64,
    pub crashes: u64,
    pub torn_commits: u64,
    pub restarts: u64,
    pub partitions: u64,
    pub pauses: u64,
    /// Messages that reached a node that was down.
    pub lost_to_crash: u64,
    pub net: NetStats,
    /// Virtual time at the final read (ms).
    pub end_ms: u64,
}

/// The verdict on one seed, with everything needed to understand it.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub seed: u64,
    /// The configuration it ran under (needed to replay it).
    pub config: Config,
    pub scenario: Scenario,
    /// Every violation found, by the checkers or the simulation's own monitor.
    pub violations: Vec<String>,
    /// Checkers that could not decide (time budget), with their notes.
    pub undecided: Vec<String>,
    pub stats: RunStats,
    pub history: History,
    pub final_state: FinalState,
    /// The event trace, when [`Config::trace`] was set.
    pub trace: Vec<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// A report for a human: what failed, and how to replay it.
    pub fn report(&self) -> String {
        let c = &self.config;
        let replay = if c.bug.is_none() && c.lockset_fences && c.epoch_block.is_none() {
            format!(
                "{}={} cargo test -p palisade-sim --test sweep -- --nocapture",
                crate::config::ENV_SEED,
                self.seed
            )
        } else {
            format!(
                "cargo run -p palisade-sim -- --seed {}{}{}{}",
                self.seed,
                c.bug.map(|b| format!(" --bug {b:?}")).unwrap_or_default(),
                if c.lockset_fences {
                    ""
                } else {
                    " --no-lockset-fence"
                },
                c.epoch_block
                    .map(|b| format!(" --epoch-block {b}"))
                    .unwrap_or_default(),
            )
        };
        let mut text = format!(
            "seed {} ({} profile, {} clients): {} violation(s)\n  replay: {replay}\n",
            self.seed,
            self.scenario.profile,
            self.scenario.clients,
            self.violations.len(),
        );
        // Every checker's verdict, then at most five lines of the monitor.
        let (monitor, checkers): (Vec<&String>, Vec<&String>) = self
            .violations
            .iter()
            .partition(|v| v.starts_with("monitor:"));
        for v in checkers.iter().chain(monitor.iter().take(5)) {
            text.push_str(&format!("  - {v}\n"));
        }
        if monitor.len() > 5 {
            text.push_str(&format!(
                "  ... and {} more from the monitor\n",
                monitor.len() - 5
            ));
        }
        text
    }
}

/// Runs seed `seed` under `config` and judges it.
pub fn run(seed: u64, config: &Config) -> Outcome {
    let mut world = World::new(seed, config);
    let mut out = world.out();
    for client in &mut world.clients {
        client.start(&mut out, &world.sc);
    }
    world.apply(out);
    world.start_nemesis();

    while let Some(event) = world.next(config.workload_ms) {
        world.step(event);
    }
    // Wind down: no new operations; wait until every client has its answer or gave up.
    for client in &mut world.clients {
        client.stopped = true;
    }
    let guard = config.workload_ms + WIND_DOWN_MS;
    while !world.clients.iter().all(|c| c.quiet()) {
        let Some(event) = world.next(guard) else {
            break;
        };
        world.step(event);
    }
    let stuck = world.clients.iter().filter(|c| !c.quiet()).count();
    if stuck > 0 {
        let msg = format!("{stuck} client(s) still busy {WIND_DOWN_MS} ms after the workload");
        world.mon.violations.push(msg);
    }
    // Whatever is still in the network never arrives; the node restarts if it is down
    // and commits what it has queued. Then the store is read once.
    world.cut_network();
    while !(world.server.up && world.server.store.idle()) {
        let Some(event) = world.next(u64::MAX) else {
            break;
        };
        world.step(event);
    }
    let end = final_state(world.server.store.durable());
    world.stats.end_ms = world.now;
    judge(seed, world, end)
}

fn judge(seed: u64, world: World<'_>, final_state: FinalState) -> Outcome {
    let budget = world.config.check_budget;
    let mut stats = world.stats;
    stats.net = world.net.stats;
    stats.late_admitted = world.mon.late_admitted;
    let history = world.rec.finish();
    for op in history.ops().iter().filter(|op| op.kind != OpKind::Restart) {
        stats.ops += 1;
        match op.outcome {
            OpOutcome::Ok => stats.ok += 1,
            OpOutcome::Fail => stats.fail += 1,
            OpOutcome::Info => stats.info += 1,
        }
        stats.stale_refusals += u64::from(op.is_stale_rejection());
        stats.acquisitions += u64::from(op.kind == OpKind::Acquire && op.outcome == OpOutcome::Ok);
    }
    let mut violations: Vec<String> = world
        .mon
        .violations
        .iter()
        .map(|v| format!("monitor: {v}"))
        .collect();
    let mut undecided = Vec::new();
    for (name, report) in check_all(&history, &final_state, budget) {
        match report.valid {
            Validity::Valid => {}
            Validity::Invalid => violations.push(format!("{name}: {}", report.summary())),
            Validity::Unknown => undecided.push(format!("{name}: {}", report.summary())),
        }
    }
    Outcome {
        seed,
        config: world.config.clone(),
        scenario: world.sc,
        violations,
        undecided,
        stats,
        history,
        final_state,
        trace: world.trace,
    }
}
