//! Running out of file descriptors: the accept loop logs it and backs off instead of
//! spinning, and serves again once descriptors are free.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::raw::{exchange, is_closed, slow_client};

#[test]
fn out_of_descriptors_is_logged_backed_off_and_recovered_from() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_palisade"));
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--header-timeout-ms",
            "1500",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        // Plain log lines, to read the counts from.
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: only setrlimit, which is async-signal-safe, runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            use nix::sys::resource::{setrlimit, Resource};
            setrlimit(Resource::RLIMIT_NOFILE, 64, 64).map_err(std::io::Error::from)
        });
    }
    let mut child = command.spawn().expect("spawn palisade");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().rsplit(':').next().unwrap().parse().unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    {
        let log = log.clone();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                log.lock().unwrap().push_str(&(line + "\n"));
            }
        });
    }
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(exchange(port, healthz).status, 200);

    // More connections than the server has descriptors for.
    let mut slow: Vec<_> = (0..100).map(|_| slow_client(port, 10)).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !log.lock().unwrap().contains("out of file descriptors") {
        assert!(
            Instant::now() < deadline,
            "no log line: {}",
            log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // The slow ones are closed after the header timeout, the waiting ones are accepted
    // (and closed in turn), and a new client is served.
    let deadline = Instant::now() + Duration::from_secs(30);
    while slow.iter_mut().map(is_closed).any(|closed| !closed) {
        assert!(Instant::now() < deadline, "slow clients still open");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(exchange(port, healthz).status, 200);

    // Backing off, not spinning: each log line counts the failures since the previous
    // one (at most a line a second); a pause of 100 ms allows about ten a second.
    let log = log.lock().unwrap().clone();
    let counts: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("out of file descriptors"))
        .filter_map(|l| {
            l.split("times=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(!counts.is_empty(), "{log}");
    assert!(
        counts.iter().all(|&n| n <= 30),
        "accept retried too often: {counts:?}\n{log}"
    );
    let _ = child.kill();
    let _ = child.wait();
}
