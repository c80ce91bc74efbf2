//! The shell snippets of README.md and docs/cli.md, as written, run by bash under
//! `set -e` against a real server: an acquire that fails (the lock is held) stops the
//! script before anything runs without a token.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{Server, BIN};

fn doc(path: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(path),
    )
    .unwrap()
}

/// Runs `script` with bash, `palisade` on the PATH and PALISADE_SERVER set.
fn run(server: &Server, script: &str) -> Output {
    let bin_dir = Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("PATH", path)
        .env("PALISADE_SERVER", &server.url)
        .env_remove("PALISADE_TOKEN")
        .env_remove("PALISADE_KEY")
        .output()
        .unwrap()
}

#[test]
fn the_readme_acquire_lines_stop_a_script_on_a_held_lock() {
    let readme = doc("README.md");
    // The acquire line and the export after it.
    let all: Vec<&str> = readme.lines().collect();
    let at = all
        .iter()
        .position(|l| l.starts_with("TOKEN=$(palisade lock acquire invoices"))
        .expect("the README's acquire line");
    let lines = &all[at..at + 2];
    assert!(
        lines[1].starts_with("export PALISADE_TOKEN=$TOKEN"),
        "{lines:?}"
    );
    let server = Server::start(&[]);
    let script = format!(
        "set -e\n{}\n{}\necho \"exported ${{PALISADE_TOKEN:0:5}}\"\n",
        lines[0], lines[1]
    );
    let first = run(&server, &script);
    assert!(first.status.success(), "{first:?}");
    assert_eq!(
        String::from_utf8_lossy(&first.stdout).trim(),
        "exported pal1."
    );
    // The lock is held now: the same lines stop the script with the acquire's code.
    let second = run(&server, &script);
    assert_eq!(second.status.code(), Some(3), "{second:?}");
    assert!(!String::from_utf8_lossy(&second.stdout).contains("exported"));
    assert!(String::from_utf8_lossy(&second.stderr).contains("lock_held"));
}

#[test]
fn the_cli_md_script_runs_and_stops_on_a_held_lock() {
    let page = doc("docs/cli.md");
    let start = page.find("### Locks from a script").unwrap();
    let block = &page[start..];
    let body = &block[block.find("```sh\n").unwrap() + 6..];
    let body = &body[..body.find("```").unwrap()];
    let server = Server::start(&[]);
    let done = run(&server, &format!("{body}echo done\n"));
    assert!(done.status.success(), "{done:?}");
    assert!(String::from_utf8_lossy(&done.stdout).contains("done"));
    // Held by someone else: the script stops at the acquire, before the barrier.
    let holder = Command::new(BIN)
        .args([
            "lock",
            "acquire",
            "orders",
            "--ttl-ms",
            "60000",
            "--server",
            &server.url,
        ])
        .output()
        .unwrap();
    assert!(holder.status.success(), "{holder:?}");
    let stopped = run(&server, &format!("{body}echo done\n"));
    assert_eq!(stopped.status.code(), Some(3), "{stopped:?}");
    assert!(!String::from_utf8_lossy(&stopped.stdout).contains("done"));
}
