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
    let (status, summary, stdout) = (run.status, &run.summary, &run.stdout);
    assert!(status.success(), "verify failed ({status}): {stdout}");
    assert_eq!(summary["violations"], 0, "{stdout}");
    for kind in ["pause", "kill", "delay", "drop", "partition"] {
        assert!(run.faults(kind) >= 1, "no {kind} fault injected: {stdout}");
    }
    assert!(
        summary["ops_by_kind"]["add"]["ok"].as_u64().unwrap_or(0) >= 5,
        "too few acknowledged adds to mean anything: {stdout}"
    );
    for checker in ["tokens", "fencing", "lockset", "reads"] {
        assert_eq!(summary["checkers"][checker]["valid"], "valid", "{stdout}");
    }
    let report = std::fs::read_to_string(run.out.path().join("report.html")).expect("report");
    assert!(report.contains("<svg") && report.contains("no violations found"));
}
