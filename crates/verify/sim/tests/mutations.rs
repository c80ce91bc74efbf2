//! Mutation checks: the simulation must find each deliberately broken node quickly.
//!
//! A sweep that cannot fail proves nothing. Each test runs seeds against one broken
//! variant ([`Bug`], inside the sim crate only) until a violation of the expected kind
//! shows up, prints the seed, and fails if none shows up within its bound.

use palisade_sim::{run, Bug, Config, Outcome};

/// Runs seeds 0.. until `found` says yes; panics past `max_seeds`.
fn first_failing_seed(config: &Config, max_seeds: u64, found: impl Fn(&str) -> bool) -> Outcome {
    for seed in 0..max_seeds {
        let outcome = run(seed, config);
        if outcome.violations.iter().any(|v| found(v)) {
            println!(
                "{:?}: found at seed {seed}\n{}",
                config.bug,
                outcome.report()
            );
            return outcome;
        }
    }
    panic!(
        "{:?}: no expected violation in {max_seeds} seeds (lockset_fences: {})",
        config.bug, config.lockset_fences
    );
}

fn broken(bug: Bug) -> Config {
    Config {
        bug: Some(bug),
        ..Config::default()
    }
}

#[test]
fn a_gate_that_admits_stale_epochs_is_caught_by_the_fencing_checker() {
    let config = broken(Bug::GateAdmitsStale);
    first_failing_seed(&config, 50, |v| v.starts_with("fencing:"));
    first_failing_seed(&config, 50, |v| v.starts_with("linearizability:"));
    first_failing_seed(&config, 50, |v| v.starts_with("lockset:"));
}

#[test]
fn grants_answered_before_fsync_reuse_epochs_after_a_crash() {
    let config = broken(Bug::GrantBeforeFsync);
    // Seen at once by the simulation: the token left before the disk could honour it...
    first_failing_seed(&config, 50, |v| {
        v.contains("before the disk could honour it")
    });
    // ...and, after a crash, the restarted node had lost an epoch it had handed out...
    first_failing_seed(&config, 200, |v| {
        v.starts_with("monitor:") && v.contains("but epoch")
    });
    // ...which the client-side history shows too: the tokens checker sees the reuse.
    let outcome = first_failing_seed(&config, 200, |v| v.starts_with("tokens:"));
    assert!(outcome.stats.restarts > 0);
}

#[test]
fn writes_acknowledged_before_fsync_are_caught() {
    let config = broken(Bug::AckBeforeFsync);
    first_failing_seed(&config, 50, |v| v.starts_with("linearizability:"));
    first_failing_seed(&config, 100, |v| {
        v.starts_with("monitor:") && v.contains("was acknowledged")
    });
}

#[test]
fn a_restart_that_forgets_leases_is_caught_by_the_monitor() {
    // Fencing keeps the store safe even then, so only global knowledge sees it.
    let config = broken(Bug::ForgetLeasesOnRestart);
    first_failing_seed(&config, 100, |v| v.contains("is live"));
}

#[test]
fn the_s10_boundary_stays_visible_without_a_barrier() {
    // Not a bug in the node: a new lock-set holder that does not fence first lets an old
    // holder's late write land before its own, and an update is lost (S10).
    let config = Config {
        lockset_fences: false,
        ..Config::default()
    };
    first_failing_seed(&config, 100, |v| v.starts_with("lockset:"));
}

#[test]
fn the_correct_node_passes_the_seeds_that_catch_the_bugs() {
    // The same seeds, without the bug, pass: the failures above are the bugs' doing.
    for seed in 0..50 {
        let outcome = run(seed, &Config::default());
        assert!(outcome.passed(), "{}", outcome.report());
    }
}
