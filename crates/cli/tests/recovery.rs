//! Recovery drills with real processes (S11: recovery keeps both ends).
//!
//! - Epochs: issue epochs after a backup, restore it, restore it again, restore it over
//!   an unreadable database: every epoch acquired afterwards exceeds every epoch ever
//!   returned, and no (lock, epoch) is ever returned twice.
//! - Store: a token fenced out after the backup was taken stays refused after restoring
//!   that backup, and a lease recorded in the backup is not honoured.
//! - Log: a sector of the newest acknowledged commit zeroed after a crash (a bad sector, a
//!   lost write) never lets the token that commit fenced out pass again.

mod common;
mod offline;

use common::{code, Http, Server};
use offline::{acquire, acquire_body, assert_unique, backup, cycle, max_issued, put, restore};

/// Without the idle grace: these tests kill the server right after releasing locks and
/// take them again after the restart, which the grace would delay by one TTL (its
/// documented price after a crash).
fn start(data: &std::path::Path) -> (Server, Http) {
    let server = Server::start_in(data, 0, &["--idle-grace-ms", "0"]).expect("server starts");
    let http = Http::new(&server.url);
    (server, http)
}

/// After a restore, each lock's next epoch exceeds everything ever issued for it.
async fn acquire_above_all(http: &Http, locks: &[&str], issued: &mut Vec<(String, u64)>) {
    for lock in locks {
        let before = max_issued(issued, lock);
        let grant = acquire(http, lock, 60_000, issued).await;
        let epoch = grant["epoch"].as_u64().unwrap();
        assert!(
            epoch > before,
            "{lock}: epoch {epoch} after a restore, but {before} was issued before"
        );
        http.release(&grant).await;
    }
    assert_unique(issued);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restoring_a_backup_never_reissues_an_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("before.backup");
    let mut issued = Vec::new();

    let (mut server, http) = start(&data);
    cycle(&http, "a", 3, &mut issued).await;
    cycle(&http, "b", 2, &mut issued).await;

    // Offline only: a running server holds the file.
    let refused = backup(&data, &file);
    assert!(!refused.success, "backup ran beside a live server");
    assert!(
        refused.stderr.contains("palisade.redb") && refused.stderr.contains("stop it first"),
        "{}",
        refused.stderr
    );
    assert!(!file.exists());
    server.kill();

    let made = backup(&data, &file);
    assert!(made.success, "{}", made.stderr);
    let info = made.json();
    // Upper bounds: the issuer's reservations may cover epochs not issued yet.
    assert!(info["epoch_bound"].as_u64().unwrap() >= 3, "{info}");
    assert!(info["epoch_bounds"]["b"].as_u64().unwrap() >= 2, "{info}");
    assert!(info["backup_id"].as_str().is_some_and(|id| !id.is_empty()));
    assert!(info["created_at_unix"].as_u64().is_some());

    // Life goes on after the backup: more epochs, and a lock the backup never saw.
    let (mut server, http) = start(&data);
    cycle(&http, "a", 3, &mut issued).await;
    cycle(&http, "c", 2, &mut issued).await;
    server.kill();

    // 1. The database being replaced is readable: its epochs count.
    let first = restore(&data, &file, &[]);
    assert!(first.success, "{}", first.stderr);
    let report = first.json();
    assert_eq!(report["current"]["state"], "readable", "{report}");
    assert!(
        report["warnings"].as_array().unwrap().is_empty(),
        "{report}"
    );
    assert!(report["replaced_file"].as_str().is_some(), "{report}");
    let (mut server, http) = start(&data);
    acquire_above_all(&http, &["a", "b", "c", "d"], &mut issued).await;
    cycle(&http, "a", 2, &mut issued).await;
    server.kill();

    // 2. The same backup again: still above everything, including the first restore's.
    let second = restore(&data, &file, &[]);
    assert!(second.success, "{}", second.stderr);
    let (mut server, http) = start(&data);
    acquire_above_all(&http, &["a", "b", "c"], &mut issued).await;
    cycle(&http, "c", 2, &mut issued).await;
    server.kill();

    // 3. Over a database that cannot be read: the witness beside the data directory
    // bounds every epoch ever written, so nothing is left to assume.
    std::fs::write(
        data.join("palisade.redb"),
        b"garbage, not a database".repeat(100),
    )
    .unwrap();
    let third = restore(&data, &file, &[]);
    assert!(third.success, "{}", third.stderr);
    assert!(!third.stderr.contains("WARNING"), "{}", third.stderr);
    let report = third.json();
    assert_eq!(report["current"]["state"], "unreadable", "{report}");
    let horizon = report["witness_horizon"].as_u64().expect("witness read");
    assert!(report["floor"].as_u64().unwrap() >= horizon, "{report}");
    let (server, http) = start(&data);
    acquire_above_all(&http, &["a", "b", "c"], &mut issued).await;
    drop(server);

    // Without the witness, over a lost database, the ledger and the gap carry it, loudly;
    // a gap of zero without a floor is refused.
    std::fs::remove_file(data.join("palisade.redb")).unwrap();
    let unsafe_restore = restore(&data, &file, &["--no-witness", "--epoch-gap", "0"]);
    assert!(!unsafe_restore.success);
    assert!(
        unsafe_restore.stderr.contains("--epoch-floor"),
        "{}",
        unsafe_restore.stderr
    );
    let assumed = restore(&data, &file, &["--no-witness"]);
    assert!(assumed.success, "{}", assumed.stderr);
    assert!(assumed.stderr.contains("WARNING"), "{}", assumed.stderr);
    assert_eq!(assumed.json()["current"]["state"], "missing");
    assert!(assumed.json()["witness_horizon"].is_null());
    // With an operator's floor it goes ahead, above that floor.
    let floored = restore(&data, &file, &["--epoch-floor", "9000000000"]);
    assert!(floored.success, "{}", floored.stderr);
    assert!(floored.json()["next_epoch"].as_u64().unwrap() > 9_000_000_000);
    let (_server, http) = start(&data);
    acquire_above_all(&http, &["a"], &mut issued).await;
    assert!(max_issued(&issued, "a") > 9_000_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_fenced_out_after_the_backup_stays_fenced_after_restore() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("store.backup");
    let mut issued = Vec::new();

    // Epoch 1 writes, and still holds its lease when the backup is taken.
    let (mut server, http) = start(&data);
    let old = acquire(&http, "ns", 1_000, &mut issued).await;
    assert_eq!(put(&http, "ns", "k", &old["token"], "v1").await.0, 200);
    server.kill();
    assert!(backup(&data, &file).success);

    // After the backup, epoch 2 takes over (once the recorded lease has run out) and
    // fences epoch 1 out.
    let (mut server, http) = start(&data);
    let (status, newer) = http
        .post_json(
            "/v1/locks/ns/acquire",
            &acquire_body("worker-2", 60_000, 10_000),
        )
        .await;
    assert_eq!(status, 200, "{newer}");
    issued.push(("ns".into(), newer["epoch"].as_u64().unwrap()));
    assert_eq!(put(&http, "ns", "k", &newer["token"], "v2").await.0, 200);
    let (status, body) = put(&http, "ns", "k", &old["token"], "late").await;
    assert_eq!((status, code(&body)), (409, "stale_token"), "{body}");
    server.kill();

    // The backup's mark is 1: served as it was, it would admit epoch 1 again.
    let restored = restore(&data, &file, &[]);
    assert!(restored.success, "{}", restored.stderr);
    let floor = restored.json()["floor"].as_u64().unwrap();
    let (_server, http) = start(&data);
    assert!(http.high_water("ns").await >= floor);
    for (token, what) in [
        (&old["token"], "fenced-out epoch 1"),
        (&newer["token"], "epoch 2"),
    ] {
        let (status, body) = put(&http, "ns", "k", token, "after restore").await;
        assert_eq!(
            (status, code(&body)),
            (409, "stale_token"),
            "{what}: {body}"
        );
        let (status, body) = http
            .send(
                http.client
                    .post(format!("{}/v1/fences/ns", http.base))
                    .header("Fencing-Token", token.as_str().unwrap()),
            )
            .await;
        assert_eq!(
            (status, code(&body)),
            (409, "stale_token"),
            "{what}: {body}"
        );
    }
    assert_eq!(http.get_value("ns", "k").await.as_deref(), Some("v1"));

    // The backup's lease is not honoured: it cannot be renewed, the lock is free at once,
    // and the token of that lease is genuine but neither current nor alive.
    let lease_id = old["lease_id"].as_str().unwrap();
    let (status, body) = http.post(&format!("/v1/leases/{lease_id}/keepalive")).await;
    assert_eq!((status, code(&body)), (404, "lease_expired"), "{body}");
    let (_, check) = http
        .post_json(
            "/v1/tokens/check",
            &serde_json::json!({"token": old["token"]}),
        )
        .await;
    assert_eq!(
        (&check["genuine"], &check["current"], &check["lease_alive"]),
        (&true.into(), &false.into(), &false.into()),
        "{check}"
    );
    let fresh = acquire(&http, "ns", 60_000, &mut issued).await;
    assert!(fresh["epoch"].as_u64().unwrap() > floor);
    assert_eq!(put(&http, "ns", "k", &fresh["token"], "v3").await.0, 200);
    assert_eq!(http.get_value("ns", "k").await.as_deref(), Some("v3"));
    let (status, _) = put(&http, "ns", "k", &old["token"], "late again").await;
    assert_eq!(status, 409);
    assert_unique(&issued);
}

/// Copies the files of `from` (a data directory) into a new directory `to`.
fn copy_data(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// The red team's drill: epoch 1 writes, epoch 2 takes over and writes (acknowledged),
/// SIGKILL, then one 512-byte sector of the newest log record is zeroed, as a bad sector
/// or a lost write leaves it. Recovery cannot tell that from a torn write and drops the
/// record; whichever sector it was, neither token passes afterwards, and a new holder
/// gets an epoch above both and writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zeroed_sector_in_the_newest_commit_never_readmits_a_fenced_out_token() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut issued = Vec::new();
    let (mut server, http) = start(&data);
    let old = acquire(&http, "z", 60_000, &mut issued).await;
    assert_eq!(put(&http, "z", "k", &old["token"], "one").await.0, 200);
    http.release(&old).await;
    let newer = acquire(&http, "z", 2_000, &mut issued).await;
    assert!(newer["epoch"].as_u64() > old["epoch"].as_u64());
    assert_eq!(put(&http, "z", "k", &newer["token"], "two").await.0, 200);
    let (status, body) = put(&http, "z", "k", &old["token"], "late").await;
    assert_eq!((status, code(&body)), (409, "stale_token"), "{body}");
    server.kill();

    let db = data.join("palisade.redb");
    let (_, at, len) = palisade_storage::redb_backend::newest_commit(&db)
        .unwrap()
        .expect("the crash left the newest commits in the log");
    for sector in at / 512..=(at + len - 1) / 512 {
        let copy = dir.path().join(format!("sector-{sector}"));
        copy_data(&data, &copy);
        let (segment, ..) =
            palisade_storage::redb_backend::newest_commit(&copy.join("palisade.redb"))
                .unwrap()
                .unwrap();
        let mut bytes = std::fs::read(&segment).unwrap();
        bytes[(sector * 512) as usize..(sector * 512 + 512) as usize].fill(0);
        std::fs::write(&segment, bytes).unwrap();

        let (_server, http) = start(&copy);
        for (token, what) in [
            (&old["token"], "fenced-out epoch 1"),
            (&newer["token"], "epoch 2"),
        ] {
            let (status, body) = put(&http, "z", "k", token, "late").await;
            assert_eq!(
                (status, code(&body)),
                (409, "stale_token"),
                "sector {sector}, {what}: {body}"
            );
        }
        // Epoch 2's holder releases (its lease is known if its record was not in the
        // dropped commit) and acquires again: an epoch above every one issued before,
        // which writes. A lease lost with the commit blocks the lock for its TTL at most.
        let id = newer["lease_id"].as_str().unwrap();
        let (status, body) = http.post(&format!("/v1/leases/{id}/release")).await;
        assert!(
            status == 200 || status == 404,
            "sector {sector}: release: {body}"
        );
        let (status, next) = http
            .post_json(
                "/v1/locks/z/acquire",
                &acquire_body("worker", 60_000, 10_000),
            )
            .await;
        assert_eq!(status, 200, "sector {sector}: {next}");
        issued.push(("z".into(), next["epoch"].as_u64().unwrap()));
        assert!(
            next["epoch"].as_u64().unwrap() > newer["epoch"].as_u64().unwrap(),
            "sector {sector}: {next}"
        );
        assert_eq!(put(&http, "z", "k", &next["token"], "three").await.0, 200);
        assert_unique(&issued);
    }
}

/// The red team's variant of a rollback: the database and the epoch ledger deleted, the
/// signing keys kept. The server refuses to start over at epoch 1 under the same key, and
/// creates nothing; restoring a backup, the way out it names, continues above every epoch
/// issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_without_their_database_never_start_over_at_epoch_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("early.backup");
    let mut issued = Vec::new();
    let (mut server, http) = start(&data);
    cycle(&http, "a", 2, &mut issued).await;
    server.kill();
    let made = backup(&data, &file);
    assert!(made.success, "{}", made.stderr);
    let (mut server, http) = start(&data);
    cycle(&http, "a", 3, &mut issued).await;
    server.kill();

    for entry in std::fs::read_dir(&data).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.starts_with("palisade.redb") || name.starts_with("epoch-ledger") {
            std::fs::remove_file(data.join(&name)).unwrap();
        }
    }
    assert!(data.join("signing-keys.json").exists());
    let refused = Server::start_in(&data, 0, &["--idle-grace-ms", "0"])
        .err()
        .expect("the server refuses to start");
    assert!(
        refused.contains("signing-keys.json") && refused.contains("palisade admin restore"),
        "{refused}"
    );
    assert!(
        !data.join("palisade.redb").exists(),
        "a refused start creates no database"
    );

    let restored = restore(&data, &file, &[]);
    assert!(restored.success, "{}", restored.stderr);
    let (_server, http) = start(&data);
    acquire_above_all(&http, &["a"], &mut issued).await;
}

/// Stops `server` gracefully (SIGTERM) and waits for it to exit.
fn stop(mut server: Server) {
    server.signal(common::Signal::SIGTERM);
    let status = server
        .wait_exit(std::time::Duration::from_secs(30))
        .expect("the server stops on SIGTERM");
    assert!(status.success(), "{status:?}");
}

/// The operator's rollback, with the default `serve` (S11): a whole data directory copied
/// aside after epoch 1 and put back after epoch 2 fenced it out is consistent in itself
/// (its log, horizon and ledger all agree), and the witness kept beside it is what refuses
/// it. The recovery it names (a backup of the copy, restored) brings it back above every
/// epoch ever issued: neither token of the past passes, and no epoch is issued twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_put_back_from_a_copy_is_refused_and_never_reissues_an_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let aside = dir.path().join("snapshot");
    let mut issued = Vec::new();

    // 1. Epoch 1 writes and releases; a clean stop.
    let (server, http) = start(&data);
    let first = acquire(&http, "L", 60_000, &mut issued).await;
    assert_eq!(put(&http, "L", "k", &first["token"], "v1").await.0, 200);
    http.release(&first).await;
    stop(server);
    assert!(
        dir.path().join("data.witness").exists(),
        "the default witness"
    );
    // 2. The whole directory copied aside (what a volume snapshot is).
    copy_data(&data, &aside);
    // 3. Another holder takes epoch 2 and writes; epoch 1 is fenced out.
    let (server, http) = start(&data);
    let second = acquire(&http, "L", 60_000, &mut issued).await;
    assert!(second["epoch"].as_u64() > first["epoch"].as_u64());
    assert_eq!(put(&http, "L", "k", &second["token"], "v2").await.0, 200);
    let (status, body) = put(&http, "L", "k", &first["token"], "late").await;
    assert_eq!((status, code(&body)), (409, "stale_token"), "{body}");
    stop(server);

    // 4. The copy put back: refused, naming what it found and what to do.
    std::fs::remove_dir_all(&data).unwrap();
    copy_data(&aside, &data);
    let stderr = offline::serve_refused(&data);
    assert!(stderr.contains("older than its witness"), "{stderr}");
    assert!(
        stderr.contains("admin backup") && stderr.contains("admin restore"),
        "{stderr}"
    );

    // So is a directory wiped and started afresh: it would begin again at epoch 1.
    let wiped = dir.path().join("wiped");
    std::fs::rename(&data, &wiped).unwrap();
    let stderr = offline::serve_refused(&data);
    assert!(stderr.contains("holds no commits"), "{stderr}");
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::rename(&wiped, &data).unwrap();

    // 5. The recovery it names: the copy backed up and restored above the witness.
    let file = dir.path().join("copy.backup");
    assert!(backup(&data, &file).success);
    let restored = restore(&data, &file, &[]);
    assert!(restored.success, "{}", restored.stderr);
    let report = restored.json();
    let horizon = report["witness_horizon"]
        .as_u64()
        .expect("the witness was read");
    assert!(report["floor"].as_u64().unwrap() >= horizon, "{report}");
    let (_server, http) = start(&data);
    for (token, what) in [(&first["token"], "epoch 1"), (&second["token"], "epoch 2")] {
        let (status, body) = put(&http, "L", "k", token, "after the rollback").await;
        assert_eq!(
            (status, code(&body)),
            (409, "stale_token"),
            "{what}: {body}"
        );
    }
    acquire_above_all(&http, &["L"], &mut issued).await;
    assert!(max_issued(&issued, "L") > horizon);
}
