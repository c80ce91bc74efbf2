//! The CLI in a shell pipeline: a reader that stops early (`| head -1`) ends the command
//! quietly with status 0, never a panic; and the names people type from other tools.

mod common;

use std::process::Command;

use common::BIN;

/// Runs `palisade ARGS | head -1` under `set -o pipefail`: palisade's status, and the one
/// line head printed.
fn piped_to_head(args: &str) -> (i32, String) {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("set -o pipefail; '{BIN}' {args} | head -1"))
        .output()
        .expect("bash runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    // Bash's completions are over 100 KB, more than a pipe holds (64 KiB): the closed
    // pipe is certain.
    for args in ["completions bash", "completions zsh"] {
        let (status, text) = piped_to_head(args);
        assert_eq!(status, 0, "palisade {args} | head -1: {text}");
        assert!(!text.contains("panicked"), "{text}");
        assert!(!text.trim().is_empty(), "{text}");
    }
}

#[test]
fn kv_set_is_kv_put() {
    let out = Command::new(BIN)
        .args(["kv", "set", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("fenced by a token"), "{help}");
}
