//! `palisade admin raise-marks` against a real server and a SQLite database a gate
//! protects (S11): the database copied while epoch 1 held its mark and put back after
//! epoch 2 fenced epoch 1 out admits epoch 1 again; the command raises the mark to the
//! issuer's bound, and epoch 1 is refused while epoch 2 still writes. The same raise for
//! PostgreSQL (`pg_dump`/`pg_restore`) and Redis (a promoted replica) is drilled in
//! `crates/adapters/tests/`.

mod common;

use std::process::Command;

use common::{sqlite_gate, Http, Server, BIN};
use palisade_adapters::AdmitError;
use palisade_client::{Client, IssuerKeys};
use serde_json::Value;

fn raise_marks(server: &Server, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(["admin", "raise-marks", "--server", &server.url])
        .args(args)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raise_marks_shuts_out_what_a_restored_database_forgot() {
    let server = Server::start(&[]);
    let http = Http::new(&server.url);
    let keys = IssuerKeys::fetch(Client::new(&server.url).unwrap(), 16)
        .await
        .unwrap();
    let verifier = keys.verifier();
    let dir = tempfile::tempdir().unwrap();
    let db = sqlite_gate::database(dir.path());

    let first = http.acquire("L", "a", 1_000).await;
    let old = first["token"].as_str().unwrap().to_owned();
    sqlite_gate::write(&db, &*verifier, &old, "one").unwrap();
    let backup = dir.path().join("app.db.backup");
    std::fs::copy(&db, &backup).unwrap();
    http.release(&first).await;
    let second = http.acquire("L", "b", 60_000).await;
    let new = second["token"].as_str().unwrap().to_owned();
    sqlite_gate::write(&db, &*verifier, &new, "two").unwrap();
    assert!(matches!(
        sqlite_gate::write(&db, &*verifier, &old, "late"),
        Err(AdmitError::Stale { .. })
    ));

    // The restore, and the hole it opens.
    std::fs::copy(&backup, &db).unwrap();
    sqlite_gate::write(&db, &*verifier, &old, "late").expect("the restored mark admits epoch 1");

    // Nothing named: refused, nothing changed.
    let refused = raise_marks(&server, &[]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--sqlite PATH"),
        "{refused:?}"
    );
    let out = raise_marks(&server, &["--sqlite", db.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["locks"], 1, "{report}");
    assert_eq!(report["databases"][0]["raised"], 1, "{report}");
    assert!(matches!(
        sqlite_gate::write(&db, &*verifier, &old, "later"),
        Err(AdmitError::Stale { .. })
    ));
    sqlite_gate::write(&db, &*verifier, &new, "two again")
        .expect("the holder of the newest epoch writes");
    // Again: nothing left to raise.
    let out = raise_marks(&server, &["--sqlite", db.to_str().unwrap()]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["databases"][0]["raised"], 0, "{report}");
    // A database that is not there is an error, not a new empty file.
    let missing = dir.path().join("missing.db");
    let out = raise_marks(&server, &["--sqlite", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(!missing.exists());
}
