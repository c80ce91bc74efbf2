//! Running `palisade verify` from a test: the exit code, what it printed and the
//! `summary.json` it wrote, with its output directory kept alive for the report.

use std::process::{Command, ExitStatus};

use serde_json::Value;

/// One finished `palisade verify` run.
pub struct VerifyRun {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// `summary.json`, or `Null` for a run that wrote none (see [`VerifyRun::attempt`]).
    pub summary: Value,
    pub out: tempfile::TempDir,
}

impl VerifyRun {
    /// Runs `palisade verify ARGS --out <temp dir>`; panics with the output if it wrote no
    /// summary (the run could not complete).
    pub fn start(args: &[&str]) -> VerifyRun {
        let run = VerifyRun::attempt(args);
        if run.summary.is_null() {
            panic!(
                "no summary.json ({}):\n{}\n{}",
                run.status, run.stdout, run.stderr
            );
        }
        run
    }

    /// Runs `palisade verify ARGS --out <temp dir>`, whether or not it completes.
    pub fn attempt(args: &[&str]) -> VerifyRun {
        let out = tempfile::tempdir().expect("temp dir");
        let run = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .arg("verify")
            .args(args)
            .arg("--out")
            .arg(out.path())
            .output()
            .expect("palisade verify runs");
        let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
        let summary = match std::fs::read_to_string(out.path().join("summary.json")) {
            Ok(text) => serde_json::from_str(&text).expect("summary is JSON"),
            Err(_) => Value::Null,
        };
        VerifyRun {
            status: run.status,
            stdout,
            stderr,
            summary,
            out,
        }
    }

    /// How many faults of `kind` were injected.
    pub fn faults(&self, kind: &str) -> u64 {
        self.summary["faults"][kind].as_u64().unwrap_or(0)
    }

    /// Asserts a clean lock-set run: it succeeded with no violation, injected each of
    /// `faults`, acknowledged enough adds to mean anything, and every checker found it
    /// valid.
    pub fn assert_clean_lock_set(&self, faults: &[&str]) {
        let (summary, stdout) = (&self.summary, &self.stdout);
        assert!(
            self.status.success(),
            "verify failed ({}): {stdout}",
            self.status
        );
        assert_eq!(summary["violations"], 0, "{stdout}");
        for kind in faults {
            assert!(self.faults(kind) >= 1, "no {kind} fault injected: {stdout}");
        }
        assert!(
            summary["ops_by_kind"]["add"]["ok"].as_u64().unwrap_or(0) >= 5,
            "too few acknowledged adds to mean anything: {stdout}"
        );
        for checker in ["tokens", "fencing", "lockset", "reads"] {
            assert_eq!(summary["checkers"][checker]["valid"], "valid", "{stdout}");
        }
    }

    pub fn report(&self) -> String {
        std::fs::read_to_string(self.out.path().join("report.html")).expect("report.html")
    }
}
