//! `palisade lock run LOCK -- COMMAND` end to end: the command gets the lease in its
//! environment and can write with it, its exit status comes back, the lock is released
//! after it, and a lost lease stops it (SIGTERM at the renewal deadline, SIGKILL before the
//! lease can end at the server) with exit code 6.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{alive, poll, Server, BIN};

fn lock_run(server: &Server, args: &[&str], script: &str) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(["lock", "run", "--server", &server.url])
        .args(args)
        .args(["--", "sh", "-c", script])
        .env_remove("PALISADE_TOKEN")
        .env_remove("PALISADE_KEY");
    command
}

fn run(server: &Server, args: &[&str], script: &str) -> Output {
    lock_run(server, args, script)
        .output()
        .expect("run palisade")
}

fn palisade(server: &Server, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("PALISADE_SERVER", &server.url)
        .env_remove("PALISADE_TOKEN")
        .output()
        .expect("run palisade")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Waits until `path` holds a line, and returns it.
fn wait_for_file(path: &Path) -> String {
    poll(Duration::from_secs(20), || {
        let text = read(path);
        (!text.is_empty()).then_some(text)
    })
    .unwrap_or_else(|| panic!("{} was never written", path.display()))
}

#[test]
fn the_command_gets_the_lease_writes_with_it_and_its_status_comes_back() {
    let server = Server::start(&[]);
    // The command writes through the store with the token it was given, using the
    // palisade binary and the PALISADE_SERVER it inherited.
    let script = format!(
        "echo \"$PALISADE_LOCK $PALISADE_EPOCH $PALISADE_LEASE_ID\"; \
         {BIN} kv put \"$PALISADE_LOCK\" report done >/dev/null || exit 99; exit 7"
    );
    let out = run(&server, &["reports", "--fence"], &script);
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(fields[..2], ["reports", "1"], "{stdout}");
    assert!(!fields[2].is_empty());

    // The write landed under epoch 1, and the lock is free again.
    let value = palisade(&server, &["kv", "get", "reports", "report"]);
    assert_eq!(String::from_utf8_lossy(&value.stdout), "done");
    let status = palisade(&server, &["lock", "status", "reports"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["holder"], serde_json::Value::Null, "{status}");
    assert_eq!(status["epoch"], 1);

    // A second run gets the next epoch; a command killed by a signal gives 128 + signal.
    let out = run(&server, &["reports"], "echo $PALISADE_EPOCH; kill -KILL $$");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2");
    assert_eq!(out.status.code(), Some(128 + 9), "{out:?}");
}

#[test]
fn a_held_lock_or_a_missing_command_fails_before_anything_runs() {
    let server = Server::start(&[]);
    let held = palisade(&server, &["lock", "acquire", "busy"]);
    assert!(held.status.success());
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let out = run(&server, &["busy"], &format!("touch {}", marker.display()));
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(!marker.exists(), "the command ran without the lock");

    let out = Command::new(BIN)
        .args(["lock", "run", "--server", &server.url, "free", "--"])
        .arg(dir.path().join("no-such-program"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    // The lease was released when the command could not start.
    let status = palisade(&server, &["lock", "status", "free"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["holder"], serde_json::Value::Null, "{status}");
}

/// Starts `lock run` in the background with a command that records its lease id and pid,
/// and waits until it runs.
fn start_holder(
    server: &Server,
    dir: &Path,
    script_tail: &str,
    grace: &str,
) -> (Child, String, u32) {
    let lease_file = dir.join("lease");
    let pid_file = dir.join("pid");
    let script = format!(
        "echo $$ > {pid}.tmp && mv {pid}.tmp {pid}; echo $PALISADE_LEASE_ID > {lease}.tmp && \
         mv {lease}.tmp {lease}; {script_tail}",
        pid = pid_file.display(),
        lease = lease_file.display()
    );
    let child = lock_run(
        server,
        &["guarded", "--ttl-ms", "600", "--kill-grace-ms", grace],
        &script,
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let lease = wait_for_file(&lease_file);
    let pid = wait_for_file(&pid_file).parse().unwrap();
    (child, lease, pid)
}

#[test]
fn a_lost_lease_stops_the_command_with_sigterm() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let terminated = dir.path().join("terminated");
    let tail = format!(
        "trap 'echo yes > {}; exit 0' TERM; while :; do sleep 0.05; done",
        terminated.display()
    );
    let (child, _lease, pid) = start_holder(&server, dir.path(), &tail, "20000");
    // The server goes away: no renewal succeeds, the client gives the lease up at the
    // renewal deadline (400 ms of 600) and the command has until the safe deadline.
    drop(server);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert!(stderr.contains("was lost"), "{stderr}");
    // It was asked to stop (the trap ran), not killed; exiting 0 does not hide the loss.
    assert_eq!(read(&terminated), "yes");
    assert!(!alive(pid));
}

#[test]
fn a_lease_ended_at_the_server_stops_the_command_at_once() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let (child, lease, pid) =
        start_holder(&server, dir.path(), "trap '' TERM; exec sleep 600", "20000");
    // Someone else ends the lease: the next renewal is refused, the lock may already be
    // another holder's, so there is no grace to give.
    let out = palisade(&server, &["lock", "release", &lease]);
    assert!(out.status.success(), "{out:?}");
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert!(stderr.contains("SIGKILL after 0 ms"), "{stderr}");
    assert!(!alive(pid));
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    // The shell ignores TERM and replaces itself with sleep, which inherits that.
    let (child, _lease, pid) =
        start_holder(&server, dir.path(), "trap '' TERM; exec sleep 600", "300");
    // The server goes away: no renewal succeeds, so the lease is lost by its deadline.
    drop(server);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    assert!(!alive(pid), "the command survived");
}

/// Nanoseconds since the Unix epoch, the clock `date +%s%N` reads.
fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// The lines of `path` as numbers.
fn stamps(path: &Path) -> Vec<u128> {
    read(path)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[tokio::test]
async fn a_command_that_ignores_sigterm_is_dead_before_the_lease_can_end() {
    const TTL_MS: u64 = 1_500;
    let server = Server::start(&[]);
    let http = common::Http::new(&server.url);
    let dir = tempfile::tempdir().unwrap();
    let (writes, termed) = (dir.path().join("writes"), dir.path().join("termed"));
    // The command notes SIGTERM and goes on writing timestamps (its `sleep` dies of the
    // TERM, the loop does not). The grace of a minute would keep it alive long past the
    // lease: only the safe deadline can stop it in time. A 5 % drift margin (75 ms) so
    // that a busy test machine's scheduling delay is not taken for a late kill.
    let script = format!(
        "trap 'date +%s%N > {termed}' TERM; while :; do date +%s%N >> {writes}; sleep 0.02; done",
        termed = termed.display(),
        writes = writes.display()
    );
    let ttl = TTL_MS.to_string();
    let child = lock_run(
        &server,
        &[
            "paused",
            "--ttl-ms",
            &ttl,
            "--kill-grace-ms",
            "60000",
            "--clock-drift",
            "0.05",
        ],
        &script,
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_for_file(&writes);

    // Stop the server just after it confirmed a renewal, so that no renewal can come
    // between reading its deadline and the stop: renewals come every TTL/3 = 500 ms.
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    let lease_end_ns = loop {
        assert!(
            std::time::Instant::now() < give_up,
            "the lease was never seen just renewed"
        );
        let sent = now_ns();
        let status: serde_json::Value = http
            .client
            .get(format!("{}/v1/locks/paused", server.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let remaining = status["remaining_ms"].as_u64().unwrap_or(0);
        if remaining + 100 >= TTL_MS {
            server.signal(nix::sys::signal::Signal::SIGSTOP);
            // The server counted `remaining` from its handling, after `sent`.
            break sent + u128::from(remaining) * 1_000_000;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let stopped_ns = now_ns();

    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    server.signal(nix::sys::signal::Signal::SIGCONT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert!(stderr.contains("was lost"), "{stderr}");

    let term_ns = *stamps(&termed)
        .first()
        .expect("the command never got SIGTERM");
    let last_ns = *stamps(&writes).last().unwrap();
    // SIGTERM came after the stop (at the renewal deadline), the command went on
    // writing after it, and it was dead before the server could end the lease.
    assert!(term_ns > stopped_ns, "SIGTERM before the server stopped");
    assert!(last_ns > term_ns, "the command did not outlive its SIGTERM");
    assert!(
        last_ns < lease_end_ns,
        "the command wrote {} ms after the lease could end",
        (last_ns - lease_end_ns) / 1_000_000
    );
}

#[test]
fn deadlines_that_cannot_hold_are_refused_before_anything_runs() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    for bad in [
        ["--clock-drift", "0.9"],
        ["--renew-deadline", "0.2"],
        ["--renew-deadline", "1.0"],
    ] {
        let out = run(
            &server,
            &["deadlines", bad[0], bad[1]],
            &format!("touch {}", marker.display()),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {stderr}");
        assert!(
            stderr.contains("--renew-deadline / --clock-drift"),
            "{stderr}"
        );
        assert!(!marker.exists(), "the command ran with {bad:?}");
    }
    // Nothing was acquired either.
    let status = palisade(&server, &["lock", "status", "deadlines"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["epoch"], 0, "{status}");
}
