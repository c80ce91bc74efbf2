//! A server never serves a data directory it cannot vouch for: a database file that is
//! garbage or cut short, a damaged key set, a database older than the epoch ledger or
//! missing beside it. Each is refused at start with an error naming the file, and the
//! process exits non-zero without listening.

mod common;
mod offline;

use std::path::Path;

use common::Server;
use offline::{cycle, restore, serve_refused};

/// A data directory with some epochs and enough data to make the file a few hundred KiB.
async fn populated(data: &Path) {
    // No idle grace: the server is killed right after the releases, and later starts
    // take these locks again at once.
    let server = Server::start_in(data, 0, &["--idle-grace-ms", "0"]).expect("server starts");
    let http = common::Http::new(&server.url);
    let mut issued = Vec::new();
    cycle(&http, "a", 2, &mut issued).await;
    let grant = http.acquire("bulk", "w", 60_000).await;
    for i in 0..100 {
        let key = format!("key-{i}");
        let (status, _) = http
            .put("bulk", &key, grant["token"].as_str(), &"x".repeat(4000))
            .await;
        assert_eq!(status, 200);
    }
    drop(server);
}

#[tokio::test]
async fn a_garbage_database_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("palisade.redb"), b"not a database ".repeat(500)).unwrap();
    let stderr = serve_refused(&data);
    assert!(stderr.contains("palisade.redb"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_database_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    populated(&data).await;
    let db = data.join("palisade.redb");
    let len = std::fs::metadata(&db).unwrap().len();
    assert!(len > 100_000, "{len}");
    for cut in [len / 2, len / 5, 100] {
        let copy = dir.path().join(format!("cut-{cut}"));
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::copy(
            data.join("signing-keys.json"),
            copy.join("signing-keys.json"),
        )
        .unwrap();
        std::fs::copy(&db, copy.join("palisade.redb")).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(copy.join("palisade.redb"))
            .unwrap()
            .set_len(cut)
            .unwrap();
        let stderr = serve_refused(&copy);
        assert!(stderr.contains("palisade.redb"), "cut at {cut}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_key_set_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    populated(&data).await;
    let key = data.join("signing-keys.json");
    let genuine = std::fs::read_to_string(&key).unwrap();
    for damaged in ["zz", "", &genuine[..genuine.len() / 2], "\u{0}\u{1}garbage"] {
        std::fs::write(&key, damaged).unwrap();
        let stderr = serve_refused(&data);
        assert!(
            stderr.contains("signing-keys.json"),
            "{damaged:?}: {stderr}"
        );
    }
    std::fs::write(&key, genuine).unwrap();
    drop(Server::start_in(&data, 0, &[]).expect("starts again with the genuine key"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_older_than_the_ledger_or_missing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    populated(&data).await;
    let old_copy = dir.path().join("old.redb");
    std::fs::copy(data.join("palisade.redb"), &old_copy).unwrap();

    let server = Server::start_in(&data, 0, &[]).expect("server starts");
    let http = common::Http::new(&server.url);
    cycle(&http, "a", 3, &mut Vec::new()).await;
    drop(server);
    // The ledger is raised at every start (and every few seconds while serving). This run
    // writes too, so that its log is still there when it is killed.
    let server = Server::start_in(&data, 0, &[]).expect("server starts");
    cycle(&common::Http::new(&server.url), "b", 1, &mut Vec::new()).await;
    drop(server);

    // Copying an old file into place (instead of `admin restore`) is caught: by the log
    // it no longer reaches (the server was killed, its log is still there) or, once the
    // log is gone, by the ledger.
    std::fs::copy(&old_copy, data.join("palisade.redb")).unwrap();
    let stderr = serve_refused(&data);
    assert!(
        stderr.contains("older than its log") && stderr.contains("admin restore"),
        "{stderr}"
    );
    for entry in std::fs::read_dir(&data).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().contains("palisade.redb.wal.") {
            std::fs::remove_file(path).unwrap();
        }
    }
    // The witness beside the directory sees it first; without one, the ledger does.
    let stderr = serve_refused(&data);
    assert!(
        stderr.contains("older than its witness") && stderr.contains("admin restore"),
        "{stderr}"
    );
    let stderr = offline::serve_refused_with(&data, &["--no-witness"]);
    assert!(
        stderr.contains("behind the epoch ledger") && stderr.contains("admin restore"),
        "{stderr}"
    );
    // So is a database file that disappeared: an empty one would start at epoch 1.
    std::fs::remove_file(data.join("palisade.redb")).unwrap();
    let stderr = serve_refused(&data);
    assert!(
        stderr.contains("palisade.redb is missing") || stderr.contains("is missing"),
        "{stderr}"
    );
    assert!(
        !data.join("palisade.redb").exists(),
        "no empty database was created"
    );
    // A plain database file is not a backup: restore refuses it and changes nothing.
    let refused = restore(&data, &old_copy, &[]);
    assert!(!refused.success);
    assert!(
        refused.stderr.contains("not a Palisade backup"),
        "{}",
        refused.stderr
    );
    assert!(
        !data.join("palisade.redb.restoring").exists(),
        "staging file left behind"
    );
    assert!(
        !data.join("palisade.redb").exists(),
        "restore changed the directory"
    );
}

#[tokio::test]
async fn restore_refuses_while_the_server_runs() {
    let server = Server::start(&[]);
    let file = server.data_dir.with_file_name("none.backup");
    let refused = restore(&server.data_dir, &file, &[]);
    assert!(!refused.success);
    assert!(
        refused.stderr.contains("stop it first"),
        "{}",
        refused.stderr
    );
    // The server is untouched and still serves.
    let http = common::Http::new(&server.url);
    http.acquire("still-here", "w", 1_000).await;
}
