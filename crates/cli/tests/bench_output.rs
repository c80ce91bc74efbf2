//! `palisade bench` prints its table once, on stdout; stderr only says what runs.

mod common;

use std::process::Command;

use common::{Server, BIN};

#[test]
fn the_table_is_printed_once_on_stdout() {
    let server = Server::start(&[]);
    let out = Command::new(BIN)
        .args([
            "bench",
            "--url",
            &server.url,
            "--job",
            "j2",
            "--clients",
            "2",
        ])
        .args(["--duration", "1s", "--warmup", "0s"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let header = |text: &str| {
        text.lines()
            .filter(|l| l.contains("ops/s") && l.contains("p99 ms"))
            .count()
    };
    assert_eq!(header(&stdout), 1, "stdout: {stdout}");
    assert_eq!(header(&stderr), 0, "stderr: {stderr}");
    assert!(
        stderr.contains("bench: palisade j2 with 2 clients"),
        "{stderr}"
    );
}
