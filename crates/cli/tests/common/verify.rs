//! Running `palisade verify` from a test: the exit code, what it printed and the
//! `summary.json` it wrote, with its output directory kept alive for the report.

use std::process::{Command, ExitStatus};

use serde_json::Value;

/// One finished `palisade verify` run.
pub struct VerifyRun {
    pub status: ExitStatus,
    pub stdout: String,
    pub summary: Value,
    pub out: tempfile::TempDir,
}

impl VerifyRun {
    /// Runs `palisade verify ARGS --out <temp dir>`; panics with the output if it wrote no
    /// summary (the run could not complete).
    pub fn start(args: &[&str]) -> VerifyRun {
        let out = tempfile::tempdir().expect("temp dir");
        let run = Command::new(env!("CARGO_BIN_EXE_palisade"))
            .arg("verify")
            .args(args)
            .arg("--out")
            .arg(out.path())
            .output()
            .expect("palisade verify runs");
        let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&run.stderr);
        let Ok(text) = std::fs::read_to_string(out.path().join("summary.json")) else {
            panic!("no summary.json ({}):\n{stdout}\n{stderr}", run.status);
        };
        let summary = serde_json::from_str(&text).expect("summary is JSON");
        VerifyRun {
            status: run.status,
            stdout,
            summary,
            out,
        }
    }

    /// How many faults of `kind` were injected.
    pub fn faults(&self, kind: &str) -> u64 {
        self.summary["faults"][kind].as_u64().unwrap_or(0)
    }

    pub fn report(&self) -> String {
        std::fs::read_to_string(self.out.path().join("report.html")).expect("report.html")
    }
}
