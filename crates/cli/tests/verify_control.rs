//! The negative control of `palisade verify`: the same lock-set workload and faults
//! against a toy store that ignores tokens must lose acknowledged updates. If it did not,
//! the faults would be too weak for a clean Palisade run to mean anything.

use std::process::Command;

use serde_json::Value;

#[test]
fn unfenced_control_loses_updates() {
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["verify", "--target", "unfenced-control", "--time", "20"])
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
    // Exit code 1 means "violations found"; 2 would mean the run itself failed.
    assert_eq!(status.code(), Some(1), "{stdout}");
    assert!(
        summary["lost_updates"].as_u64().unwrap_or(0) > 0,
        "the control lost no update: {stdout}"
    );
    assert_eq!(summary["checkers"]["lockset"]["valid"], "invalid");
}
