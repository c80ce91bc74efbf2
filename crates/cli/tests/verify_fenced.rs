//! `palisade verify` end to end: a short lock-set run with every fault against the real
//! server must find no violation, and must actually have injected each kind of fault.
//! (The negative control, which must find violations, is `verify_control.rs`; the two
//! are separate test binaries so they never run at the same time.)

mod common;

use common::verify::VerifyRun;

#[test]
fn lock_set_under_all_faults_has_no_violations() {
    let run = VerifyRun::start(&[
        "--time",
        "20",
        "--workload",
        "lock-set",
        "--faults",
        "all",
        "--seed",
        "7",
    ]);
    run.assert_clean_lock_set(&["pause", "kill", "delay", "drop", "partition"]);
    let report = std::fs::read_to_string(run.out.path().join("report.html")).expect("report");
    assert!(report.contains("<svg") && report.contains("no violations found"));
}
