//! `--data-dir` is safe to point anywhere: a missing directory is created (0700), an empty
//! one adopted, a Palisade one (or one of an earlier version, without the marker) opened;
//! any other is refused and left exactly as it was. Nothing is written before the port
//! is bound and the directory locked, and a second server names the first one's pid.
//! Also: `--listen` takes host names.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use common::{Server, BIN};

const MARKER: &str = "palisade-data-dir.toml";

fn serve(data_dir: &Path, listen: &str) -> Output {
    Command::new(BIN)
        .args(["serve", "--listen", listen, "--data-dir"])
        .arg(data_dir)
        .output()
        .expect("run palisade")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Names, sizes and modes of everything in `dir`, to compare before and after.
fn snapshot(dir: &Path) -> Vec<(String, u64, u32)> {
    let mut all: Vec<(String, u64, u32)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                meta.len(),
                meta.permissions().mode(),
            )
        })
        .collect();
    all.sort();
    all
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

async fn acquire_epoch(url: &str, lock: &str) -> u64 {
    common::Http::new(url).acquire(lock, "w", 1000).await["epoch"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn a_missing_directory_is_created_private_and_marked() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("deep/data");
    let server = Server::start_in(&data, 0, &[]).unwrap();
    assert_eq!(mode(&data), 0o700);
    let marker = std::fs::read_to_string(data.join(MARKER)).unwrap();
    assert!(marker.contains("format = 1"), "{marker}");
    assert_eq!(acquire_epoch(&server.url, "a").await, 1);
}

#[tokio::test]
async fn an_empty_directory_is_adopted() {
    let root = tempfile::tempdir().unwrap();
    // Inside a temp dir of its own: the witness goes beside it.
    let dir = root.path().join("empty");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = Server::start_in(&dir, 0, &[]).unwrap();
    assert_eq!(mode(&dir), 0o700);
    assert!(dir.join(MARKER).exists());
    assert_eq!(acquire_epoch(&server.url, "a").await, 1);
}

#[test]
fn a_foreign_directory_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.path().join("README.md"), "my project").unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    let before = snapshot(dir.path());
    let out = serve(dir.path(), "127.0.0.1:0");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.contains("is not empty and is not a Palisade data directory")
            && text.contains("\"README.md\"")
            && text.contains("Nothing was changed"),
        "{text}"
    );
    assert!(out.stdout.is_empty(), "it never listened");
    assert_eq!(snapshot(dir.path()), before);
    assert_eq!(mode(dir.path()), 0o755, "no chmod");
}

#[tokio::test]
async fn a_data_directory_of_an_earlier_version_is_adopted_with_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_in(&data, 0, &["--idle-grace-ms", "0"]).unwrap();
    let first = acquire_epoch(&server.url, "kept").await;
    drop(server);
    // What an earlier version left: its files, no marker, no pid file.
    std::fs::remove_file(data.join(MARKER)).unwrap();
    let _ = std::fs::remove_file(data.join("palisade.pid"));
    assert!(data.join("palisade.redb").exists());
    let server = Server::start_in(&data, 0, &["--idle-grace-ms", "0"]).unwrap();
    assert!(data.join(MARKER).exists(), "the marker is written");
    // The lease of the killed server is honoured for its TTL; a wait covers it.
    let http = common::Http::new(&server.url);
    let grant = http.acquire_waiting("kept", "w", 1000, 5000).await;
    assert!(grant["epoch"].as_u64().unwrap() > first, "{grant}");
}

#[test]
fn a_newer_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(MARKER), "format = 9\n").unwrap();
    let out = serve(dir.path(), "127.0.0.1:0");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("written by a newer palisade"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_second_server_on_the_same_directory_names_the_first() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let first = Server::start_in(&dir, 0, &[]).unwrap();
    let out = serve(&dir, "127.0.0.1:0");
    assert_eq!(out.status.code(), Some(1));
    let text = stderr(&out);
    assert!(
        text.contains(&format!("is already in use by pid {}", first.pid())),
        "{text}"
    );
    // The first one still serves.
    let status = Command::new(BIN)
        .args(["lock", "status", "--server", &first.url])
        .output()
        .unwrap();
    assert!(status.status.success());
}

#[test]
fn a_port_in_use_leaves_no_data_directory_behind() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = serve(&data, &listen);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("already in use"), "{}", stderr(&out));
    assert!(!data.exists(), "nothing written before the port was bound");
    // An existing empty directory stays empty.
    let out = serve(dir.path(), &listen);
    assert_eq!(out.status.code(), Some(1));
    assert!(snapshot(dir.path()).is_empty());
}

/// A first start that fails after it created the database (here: its `--signing-key-file`
/// cannot be read; on a full disk, the log's zero-filling) takes back what it made, so the
/// next start is a first start again instead of a refusal ("signing-keys.json is missing,
/// but palisade.redb exists").
#[tokio::test]
async fn a_failed_first_start_leaves_a_directory_that_starts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .arg("--signing-key-file")
        .arg(dir.path().join("no-such-key"))
        .output()
        .expect("run palisade");
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("no-such-key"), "{}", stderr(&out));
    let left: Vec<String> = snapshot(&data).into_iter().map(|(name, ..)| name).collect();
    assert_eq!(left, [MARKER], "only the marker stays");
    let server = Server::start_in(&data, 0, &[]).expect("the next start is a first start");
    assert_eq!(acquire_epoch(&server.url, "a").await, 1);
    assert!(data.join("signing-keys.json").exists());
}

#[tokio::test]
async fn listen_takes_a_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", "localhost:0", "--data-dir"])
        .arg(dir.path().join("data"));
    let server = palisade_test_support::ServerProcess::spawn(command).unwrap();
    let by_name = format!("http://localhost:{}", server.port);
    let out = Command::new(BIN)
        .args([
            "lock", "acquire", "named", "--format", "token", "--server", &by_name,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // A name that does not resolve is a usage error, before anything is written.
    let out = serve(&dir.path().join("other"), "no-such-host.invalid:7700");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!dir.path().join("other").exists());
}
