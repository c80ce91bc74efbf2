//! `palisade verify --target postgres-gate | redis-gate | sqlite-gate`: the gates under
//! their database's own faults (S16), beside the worker and lock-server faults.
//!
//! - With the durability settings the gate's preflight insists on, a lock-set run under
//!   every fault (`db-kill`, `db-pause`, `db-drop` and `db-delay` among them) must come out
//!   clean, with late writes refused as stale by the gate; so must a register run
//!   (PostgreSQL, SQLite). For SQLite the database process is the application holding
//!   the file: `db-kill` takes it down in the middle of its transactions.
//! - With a setting the preflight refuses (`--unsafe-db`: PostgreSQL
//!   `synchronous_commit=off`, Redis `appendonly no`), the same kind of run must lose
//!   acknowledged writes: a crash of the database takes the last commits with it, marks
//!   included. The report names the setting.
//!
//! - `db-failover`: the primary killed while its replica is cut off, the replica
//!   promoted. With a synchronous PostgreSQL replica, or a Redis gate that waits for its
//!   replica after every call (`WAIT`), the run must come out clean; with an asynchronous
//!   PostgreSQL replica, or a Redis gate that does not wait (`--unsafe-db` in that shape),
//!   it must lose acknowledged writes.
//! - `db-power-loss` (Redis): the server SIGKILLed and every write no fsync reached
//!   dropped (its files on a lazy FUSE file system). With `appendfsync always` the run
//!   must come out clean; with `everysec` (`--unsafe-db` in that shape) it must lose
//!   acknowledged writes. Needs `/dev/fuse` and root.
//!
//! Two tests (two runs, each with its own database) go at a time, as cargo runs tests on
//! a two-core machine: a run waits on lease timers and fault windows most of the time
//! (about a third of a core each). Needs PostgreSQL's server binaries and redis-server
//! (scripts/adapter-services installs them).

mod common;

use common::verify::VerifyRun;

/// Every fault of the gate targets (30 s runs see each).
const ALL_FAULTS: [&str; 9] = [
    "pause",
    "kill",
    "delay",
    "drop",
    "partition",
    "db-kill",
    "db-pause",
    "db-drop",
    "db-delay",
];

fn gate_run(target: &str, workload: &str, time: &str, extra: &[&str]) -> VerifyRun {
    let mut args = vec![
        "--target",
        target,
        "--workload",
        workload,
        "--time",
        time,
        "--seed",
        "7",
    ];
    args.extend_from_slice(extra);
    VerifyRun::start(&args)
}

/// A 30 s lock-set run on `target` under every fault: clean, each fault injected, at
/// least one late write refused by the gate.
fn clean_lock_set(target: &str) -> VerifyRun {
    let clean = gate_run(target, "lock-set", "30", &["--faults", "all"]);
    clean.assert_clean_lock_set(&ALL_FAULTS);
    let (summary, stdout) = (&clean.summary, &clean.stdout);
    assert!(
        summary["fail_codes"]["stale_token"].as_u64().unwrap_or(0) >= 1,
        "no late write was refused by the gate, so the clean run proves little: {stdout}"
    );
    assert!(!clean.report().contains("UNSAFE"));
    clean
}

/// A 20 s `workload` run on `target` under `faults` (30 s with `db-failover`, whose
/// faults take most of a run: cut-off, failover and the new replica's clone): clean, each
/// fault injected, enough acknowledged writes (register) or adds (lock-set) to mean
/// anything.
fn clean_run(target: &str, workload: &str, faults: &str) -> VerifyRun {
    let time = if faults.contains("db-failover") {
        "30"
    } else {
        "20"
    };
    let run = gate_run(target, workload, time, &["--faults", faults]);
    let (summary, stdout) = (&run.summary, &run.stdout);
    assert!(run.status.success(), "{workload} run failed: {stdout}");
    assert_eq!(summary["violations"], 0, "{stdout}");
    for fault in faults.split(',') {
        assert!(run.faults(fault) >= 1, "no {fault}: {stdout}");
    }
    let (kind, enough) = match workload {
        "register" => ("write", 5),
        _ => ("add", 3),
    };
    assert!(
        summary["ops_by_kind"][kind]["ok"].as_u64().unwrap_or(0) >= enough,
        "too few acknowledged {kind}s to mean anything: {stdout}"
    );
    run
}

/// A 20 s lock-set run on `target` with `--unsafe-db` under `faults`: violations found
/// after the database's crashes or failovers, the rerun command keeping the flag, the
/// report naming `setting`.
fn unsafe_lock_set(target: &str, faults: &str, setting: &str) -> VerifyRun {
    let unsafe_db = gate_run(
        target,
        "lock-set",
        "20",
        &["--faults", faults, "--unsafe-db"],
    );
    let (summary, stdout) = (&unsafe_db.summary, &unsafe_db.stdout);
    // Exit code 1 means "violations found"; 2 would mean the run itself failed.
    assert_eq!(unsafe_db.status.code(), Some(1), "{stdout}");
    assert!(
        summary["violations"].as_u64().unwrap_or(0) > 0,
        "{setting} lost nothing: {stdout}"
    );
    for fault in faults.split(',') {
        assert!(unsafe_db.faults(fault) >= 1, "no {fault}: {stdout}");
    }
    assert!(
        stdout.contains("--unsafe-db`"),
        "the rerun command drops the setting: {stdout}"
    );
    let report = unsafe_db.report();
    assert!(
        report.contains("UNSAFE") && report.contains(setting),
        "the report does not say what made the database unsafe"
    );
    unsafe_db
}

#[test]
fn the_postgres_gate_holds_under_database_crashes_and_pauses_unless_commits_are_async() {
    let report = clean_lock_set("postgres-gate").report();
    assert!(report.contains("through the Rust gate"), "{report}");
    assert!(
        report.contains("db-kill"),
        "the timeline shows no database fault"
    );

    clean_run(
        "postgres-gate",
        "register",
        "db-kill,db-drop,db-delay,pause",
    );

    unsafe_lock_set("postgres-gate", "db-kill,pause", "synchronous_commit");
}

#[test]
fn the_postgres_gate_survives_a_failover_only_to_a_synchronous_replica() {
    // A synchronous standby (the preflight's setting): nothing acknowledged is lost.
    let report = clean_run("postgres-gate", "lock-set", "db-failover,pause").report();
    assert!(report.contains("synchronous replica cut off"), "{report}");
    // An asynchronous one (refused by the preflight): what the primary acknowledged while
    // its replica was cut off is gone after the failover.
    unsafe_lock_set("postgres-gate", "db-failover", "synchronous_standby_names");
}

#[test]
fn the_redis_gate_holds_under_database_crashes_and_pauses_unless_nothing_is_persisted() {
    assert!(clean_lock_set("redis-gate")
        .report()
        .contains("appendfsync always"));

    let unsafe_db = unsafe_lock_set("redis-gate", "db-kill,pause", "appendonly");
    assert!(
        unsafe_db.summary["lost_updates"].as_u64().unwrap_or(0) > 0,
        "a Redis that persists nothing lost no update across its crashes: {}",
        unsafe_db.stdout
    );
}

#[test]
fn the_redis_gate_survives_a_failover_only_when_it_waits_for_its_replica() {
    let report = clean_run("redis-gate", "lock-set", "db-failover,pause").report();
    assert!(
        report.contains("replica (waited for by the gate)"),
        "{report}"
    );
    // Redis replicates asynchronously: without WAIT, what the primary acknowledged while
    // its replica was cut off is gone after the failover.
    unsafe_lock_set("redis-gate", "db-failover", "wait_for_replicas");
}

#[test]
fn the_redis_gate_survives_a_power_loss_only_with_appendfsync_always() {
    // Its files on the lazy file system: a power loss drops what no fsync reached.
    let report = clean_run("redis-gate", "lock-set", "db-power-loss,pause").report();
    assert!(report.contains("lazy file system"), "{report}");
    // appendfsync everysec: Redis answers before it fsyncs, and the last second goes.
    let unsafe_db = unsafe_lock_set("redis-gate", "db-power-loss", "appendfsync");
    assert!(
        unsafe_db.summary["lost_updates"].as_u64().unwrap_or(0) > 0,
        "everysec lost no update at a power loss: {}",
        unsafe_db.stdout
    );
}

#[test]
fn the_sqlite_gate_holds_when_the_process_holding_the_file_is_killed_and_paused() {
    let report = clean_lock_set("sqlite-gate").report();
    assert!(report.contains("synchronous=FULL"), "{report}");
    assert!(report.contains("verify-sqlite-app"), "{report}");

    clean_run("sqlite-gate", "register", "db-kill,db-pause,db-drop,pause");
}

#[test]
fn the_sqlite_gate_survives_a_power_loss_only_with_synchronous_full() {
    let report = clean_run("sqlite-gate", "lock-set", "db-power-loss,pause").report();
    assert!(report.contains("synchronous=FULL"), "{report}");
    assert!(report.contains("lazy file system"), "{report}");
    // synchronous=OFF: the commits were never fsynced, and the power loss takes them.
    unsafe_lock_set("sqlite-gate", "db-power-loss", "synchronous=OFF");
}

/// Asserts that `palisade verify ARGS` is refused before anything starts (exit code 2),
/// saying `why`.
fn refused(args: &[&str], why: &str) {
    let run = VerifyRun::attempt(args);
    assert_eq!(run.status.code(), Some(2), "{args:?}: {}", run.stdout);
    assert!(run.stderr.contains(why), "{args:?}: {}", run.stderr);
}

#[test]
fn gate_flags_are_checked_before_anything_starts() {
    refused(
        &["--target", "postgres-gate", "--workload", "tokens"],
        "lock-set and register",
    );
    refused(&["--unsafe-db"], "the gate targets only");
    // No control that could not fail: a SQLite process crash loses nothing, whatever
    // the settings; only a power loss can show synchronous=OFF.
    refused(
        &["--target", "sqlite-gate", "--unsafe-db"],
        "needs db-power-loss",
    );
    refused(
        &[
            "--target",
            "redis-gate",
            "--faults",
            "db-failover,db-power-loss",
        ],
        "do not run together",
    );
    refused(&["--gate-lang", "python"], "postgres-gate and sqlite-gate");
    refused(
        &["--target", "postgres-gate", "--faults", "disk"],
        "does not apply",
    );
}
