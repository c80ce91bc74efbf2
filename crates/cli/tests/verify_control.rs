//! The negative control of `palisade verify`: the same lock-set workload and faults
//! against a toy store that ignores tokens must lose acknowledged updates. If it did not,
//! the faults would be too weak for a clean Palisade run to mean anything.

mod common;

use common::verify::VerifyRun;

#[test]
fn unfenced_control_loses_updates() {
    let run = VerifyRun::start(&[
        "--target",
        "unfenced-control",
        "--time",
        "20",
        "--faults",
        "all",
        "--seed",
        "7",
    ]);
    let (summary, stdout) = (&run.summary, &run.stdout);
    // Exit code 1 means "violations found"; 2 would mean the run itself failed.
    assert_eq!(run.status.code(), Some(1), "{stdout}");
    assert!(
        summary["lost_updates"].as_u64().unwrap_or(0) > 0,
        "the control lost no update: {stdout}"
    );
    assert_eq!(summary["checkers"]["lockset"]["valid"], "invalid");
}
