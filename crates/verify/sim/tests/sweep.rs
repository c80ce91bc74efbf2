//! The CI sweep: thousands of seeds against the real table, gate and tokens.
//!
//! `PALISADE_SIM_SEEDS=N` sets the number of seeds, `PALISADE_SIM_FIRST_SEED=S` the first,
//! and `PALISADE_SIM_SEED=S` replays one seed and prints its trace and history (run with
//! `-- --nocapture` to see them).

use palisade_sim::{env_u64, run, sweep, Config, ENV_FIRST, ENV_SEED, ENV_SEEDS};

/// Seeds per CI run; see the crate docs for the measured time.
const DEFAULT_SEEDS: u64 = 2_000;

fn env(name: &str) -> Option<u64> {
    env_u64(name).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn sweep_finds_no_violation() {
    let config = Config::default();
    if let Some(seed) = env(ENV_SEED) {
        let outcome = run(
            seed,
            &Config {
                trace: true,
                ..config
            },
        );
        for line in &outcome.trace {
            println!("{line}");
        }
        for op in outcome.history.ops() {
            println!("{op}");
        }
        println!("final state: {:?}", outcome.final_state);
        println!("{:?}\n{:?}", outcome.scenario, outcome.stats);
        assert!(outcome.passed(), "{}", outcome.report());
        return;
    }
    let count = env(ENV_SEEDS).unwrap_or(DEFAULT_SEEDS);
    let first = env(ENV_FIRST).unwrap_or(0);
    let report = sweep(&config, first, count, false);
    println!("{}", report.summary());
    for (seed, note) in &report.undecided {
        println!("seed {seed} undecided: {note}");
    }
    let failures: Vec<String> = report.failures.iter().map(|o| o.report()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}",
        failures.len(),
        report.runs,
        failures.join("\n")
    );
    assert_eq!(report.runs, count);
    // An undecided linearizability search is not a pass; tolerate only a rare one.
    assert!(
        report.undecided.len() as u64 * 100 <= count,
        "{} undecided runs",
        report.undecided.len()
    );
    if count >= 200 {
        // A sweep that injected no faults would pass for nothing.
        let t = report.totals;
        let exercised = [
            ("crashes", t.crashes),
            ("torn commits", t.torn_commits),
            ("partitions", t.partitions),
            ("pauses", t.pauses),
            ("held messages", t.net.held),
            ("dropped messages", t.net.dropped),
            ("messages to a dead node", t.lost_to_crash),
            ("stale refusals", t.stale_refusals),
            ("late old-epoch writes admitted", t.late_admitted),
            ("unknown outcomes", t.info),
            ("grants", t.acquisitions),
        ];
        for (what, n) in exercised {
            assert!(n > 0, "the sweep produced no {what}: {}", report.summary());
        }
    }
}

#[test]
fn a_seed_replays_exactly() {
    let config = Config::default();
    for seed in [3, 17, 1234] {
        let a = run(seed, &config);
        let b = run(seed, &config);
        assert_eq!(a.history, b.history, "seed {seed}: histories differ");
        assert_eq!(a.final_state, b.final_state, "seed {seed}");
        assert_eq!(a.stats, b.stats, "seed {seed}");
        assert!(a.history.ops().len() > 50, "seed {seed}: a run does work");
    }
    let (a, b) = (run(1, &config), run(2, &config));
    assert_ne!(a.history, b.history, "different seeds, different runs");
}

#[test]
fn tracing_does_not_change_the_run() {
    let plain = run(42, &Config::default());
    let traced = run(
        42,
        &Config {
            trace: true,
            ..Config::default()
        },
    );
    assert_eq!(plain.history, traced.history);
    assert!(plain.trace.is_empty());
    assert!(traced.trace.len() > plain.history.ops().len());
}
