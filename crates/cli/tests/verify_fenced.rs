//! `palisade verify` end to end: a short lock-set run with every fault against the real
//! server must find no violation, and must actually have injected each kind of fault.
//! (The negative control, which must find violations, is `verify_control.rs`; the two
//! are separate test binaries so they never run at the same time.)

use std::process::Command;

use serde_json::Value;

#[test]
fn lock_set_under_all_faults_has_no_violations() {
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["verify", "--time", "20", "--workload", "lock-set"])
        .args(["--faults", "all", "--seed", "7", "--out"])
        .arg(out.path())
        .output()
        .expect("palisade verify runs");
    let (status, stdout) = (run.status, String::from_utf8_lossy(&run.stdout));
    let stderr = String::from_utf8_lossy(&run.stderr);
    let Ok(text) = std::fs::read_to_string(out.path().join("summary.json")) else {
        panic!("no summary.json ({status}):\n{stdout}\n{stderr}");
    };
    let summary: Value = serde_json::from_str(&text).expect("summary is JSON");
    assert!(status.success(), "verify failed ({status}): {stdout}");
    assert_eq!(summary["violations"], 0, "{stdout}");
    for kind in ["pause", "kill", "delay", "drop", "partition"] {
        let n = summary["faults"][kind].as_u64().unwrap_or(0);
        assert!(n >= 1, "no {kind} fault injected: {stdout}");
    }
    assert!(
        summary["ops_by_kind"]["add"]["ok"].as_u64().unwrap_or(0) >= 5,
        "too few acknowledged adds to mean anything: {stdout}"
    );
    for checker in ["tokens", "fencing", "lockset", "reads"] {
        assert_eq!(summary["checkers"][checker]["valid"], "valid", "{stdout}");
    }
    let report = std::fs::read_to_string(out.path().join("report.html")).expect("report");
    assert!(report.contains("<svg") && report.contains("no violations found"));
}
