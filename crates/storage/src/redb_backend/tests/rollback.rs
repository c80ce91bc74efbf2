//! Never roll back silently: a store whose files come back older or damaged after a crash
//! refuses to open, with a message naming the file, instead of serving a state older than
//! what it acknowledged (and admitting a stale epoch again). Where recovery cannot tell
//! damage from a torn write (zeroed sectors at the log's end), it opens with every epoch
//! and mark raised above anything the lost records could hold.
//!
//! A crash here is the files as a SIGKILL leaves them: the handle is leaked (its threads
//! idle, nothing is checkpointed or cleaned up) and the data directory is copied.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use palisade_core::gate::GateError;

use super::{op, put, test_options, value};
use crate::redb_backend::horizon::{self, HORIZON_STEP};
use crate::redb_backend::wal::FsLogDir;
use crate::redb_backend::{newest_commit, witness, RedbBackend, RedbOptions};
use crate::{ApplyError, FencedStore, IssuerLog, StorageError};

/// No background checkpoint: what is written stays in the log.
fn log_only() -> RedbOptions {
    RedbOptions {
        checkpoint_rows: 1 << 30,
        checkpoint_every: Duration::from_secs(3600),
        ..test_options()
    }
}

fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.path().join(entry.file_name())).unwrap();
    }
    to
}

/// Waits until the store is idle: its spare segment made, everything durable (and, with
/// `checkpointed`, in the database file).
async fn settle(store: &RedbBackend, dir: &Path, checkpointed: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let spare = dir.join("palisade.redb.wal.spare").exists();
        let done = !checkpointed || store.checkpoint_seq() == store.commit_seq();
        if spare && done {
            return;
        }
        assert!(Instant::now() < deadline, "the store never settled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Writes epoch 1 then epoch 2 in namespace "a", then "crashes": returns a copy of the
/// files as the crash left them.
async fn crashed_after_two_epochs(options: RedbOptions) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbBackend::open(&dir.path().join("palisade.redb"), options).unwrap();
    store.apply(op("a", 1, put("k", "one"))).await.unwrap();
    store.apply(op("a", 2, put("k", "two"))).await.unwrap();
    settle(&store, dir.path(), false).await;
    let copy = copy_dir(dir.path());
    std::mem::forget(store);
    copy
}

fn refusal(dir: &Path) -> String {
    refused(&dir.join("palisade.redb"), log_only())
}

fn refused(db: &Path, options: RedbOptions) -> String {
    match RedbBackend::open(db, options) {
        Ok(store) => panic!("opened: {:?}", store.recovery()),
        Err(StorageError::Failed(message)) => message,
        Err(other) => panic!("unexpected {other:?}"),
    }
}

fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x55;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn a_crash_keeps_every_acknowledged_commit() {
    let copy = crashed_after_two_epochs(log_only()).await;
    let store = RedbBackend::open(&copy.path().join("palisade.redb"), log_only()).unwrap();
    assert_eq!(store.recovery().replayed, 2);
    assert_eq!(store.high_water("a").await.unwrap().epoch, 2);
    assert!(store.apply(op("a", 1, put("k", "stale"))).await.is_err());
    store.close().await;
}

#[tokio::test]
async fn flipped_bytes_in_the_newest_commit_are_refused() {
    for offset in [0u64, 5, 12, 21, 30, 60] {
        let copy = crashed_after_two_epochs(log_only()).await;
        let (segment, at, len): (PathBuf, u64, u64) =
            newest_commit(&copy.path().join("palisade.redb"))
                .unwrap()
                .expect("the crash left commits in the log");
        flip(&segment, at + offset.min(len - 1));
        let message = refusal(copy.path());
        assert!(
            message.contains("damaged") && message.contains(&segment.display().to_string()),
            "offset {offset}: {message}"
        );
    }
}

/// Zeros one 512-byte sector of `path`, the one holding byte `at`.
fn zero_sector(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    let start = (at / 512 * 512) as usize;
    bytes[start..start + 512].fill(0);
    std::fs::write(path, bytes).unwrap();
}

/// Opens a copy whose log tail recovery cannot vouch for; checks that epochs 1 and
/// `fenced_out` (and so every one between: the mark is above them all) are refused in
/// namespace "a" and that a new holder above the floor is admitted. Returns the floor.
async fn reopened_above_every_old_epoch(dir: &Path, fenced_out: u64, context: &str) -> u64 {
    let store = RedbBackend::open(&dir.join("palisade.redb"), log_only())
        .unwrap_or_else(|e| panic!("{context}: {e}"));
    let floor = store
        .recovery()
        .raised_to
        .unwrap_or_else(|| panic!("{context}: not raised: {:?}", store.recovery()));
    assert!(floor > fenced_out, "{context}: floor {floor}");
    assert!(
        store.high_water("a").await.unwrap().epoch >= floor,
        "{context}"
    );
    for stale in [1, fenced_out] {
        let late = store.apply(op("a", stale, put("k", "late"))).await;
        assert!(
            matches!(late, Err(ApplyError::Gate(GateError::Stale { .. }))),
            "{context}: epoch {stale}: {late:?}"
        );
    }
    let issuer = store.load_issuer().await.unwrap();
    assert!(
        issuer.epoch_floor >= floor,
        "{context}: locks never seen start above it"
    );
    store
        .apply(op("a", floor + 1, put("k", "new holder")))
        .await
        .unwrap_or_else(|e| panic!("{context}: {e}"));
    store.close().await;
    floor
}

/// A bad sector or a lost write zeroes a sector of the newest acknowledged commit: recovery
/// cannot tell it from a write a crash tore, and drops it. Whichever sector it is, no
/// token that commit had fenced out passes again (epoch 1 here), and neither does epoch 2.
#[tokio::test]
async fn a_zeroed_sector_of_the_newest_commit_never_admits_a_fenced_out_epoch() {
    let probe = crashed_after_two_epochs(log_only()).await;
    let (_, at, len) = newest_commit(&probe.path().join("palisade.redb"))
        .unwrap()
        .unwrap();
    let mut floors = Vec::new();
    for sector in at / 512..=(at + len - 1) / 512 {
        let copy = crashed_after_two_epochs(log_only()).await;
        let (segment, again, _) = newest_commit(&copy.path().join("palisade.redb"))
            .unwrap()
            .unwrap();
        assert_eq!(again, at, "the same layout every run");
        zero_sector(&segment, sector * 512);
        let context = format!("sector {sector} of a record at {at}..{}", at + len);
        floors.push(reopened_above_every_old_epoch(copy.path(), 2, &context).await);
    }
    assert!(!floors.is_empty());
}

/// No record ends on a sector boundary (the writer pads it by a byte), so that a log that
/// ends on one can only have lost a record zeroed whole. Each value here is sized so that
/// its record would end exactly on one.
#[tokio::test]
async fn no_commit_ends_on_a_sector_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("palisade.redb");
    let store = RedbBackend::open(&db, log_only()).unwrap();
    let write = |length: u64| {
        let store = store.clone();
        let db = db.clone();
        async move {
            let value = "v".repeat(length as usize);
            store.apply(op("a", 1, put("k", &value))).await.unwrap();
            let (_, at, len) = newest_commit(&db).unwrap().unwrap();
            (at, len)
        }
    };
    write(1).await; // the namespace's first write carries more rows
                    // A record's length is a constant plus the value's, padding aside (at most one of
                    // two records is padded).
    let (_, a) = write(10).await;
    let (_, b) = write(20).await;
    let overhead = (a - 10).min(b - 20);
    let mut last = 20;
    for round in 0..20 {
        let (_, at, len) = newest_commit(&db).unwrap().unwrap();
        let end = at + len;
        let mut boundary = (end / 512 + 2) * 512;
        if boundary - end - overhead == last {
            boundary += 512; // a value of the same size writes no usage row: shorter
        }
        last = boundary - end - overhead;
        let (at, len) = write(last).await;
        assert_eq!(at + len, boundary + 1, "round {round}: padded by one byte");
    }
    assert_eq!(
        value(&store, "a", "k").await.map(|v| v.len() > 400),
        Some(true)
    );
    store.close().await;
}

/// The one place a zeroed newest commit leaves no trace but the end of the log: a segment's
/// first record starts on a sector boundary (right after the segment's header), so zeroing
/// its sector leaves a segment with no record at all. Recovery takes such a segment for
/// an ambiguous tail too (the writer starts a segment only to append a record to it).
#[tokio::test]
async fn a_first_commit_zeroed_whole_is_not_taken_for_an_empty_log() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("palisade.redb");
    let store = RedbBackend::open(&db, log_only()).unwrap();
    store.apply(op("a", 1, put("k", "one"))).await.unwrap();
    store.close().await;
    // Everything is in the database file; the next run's first commit starts a segment.
    let store = RedbBackend::open(&db, log_only()).unwrap();
    assert_eq!(newest_commit(&db).unwrap(), None);
    store.apply(op("a", 2, put("k", "two"))).await.unwrap();
    settle(&store, dir.path(), false).await;
    let copy = copy_dir(dir.path());
    std::mem::forget(store);
    let (segment, at, len) = newest_commit(&copy.path().join("palisade.redb"))
        .unwrap()
        .unwrap();
    assert!(at % 512 == 0 && len < 512, "{at} {len}");
    zero_sector(&segment, at);
    reopened_above_every_old_epoch(copy.path(), 2, "first commit zeroed").await;
}

/// The horizon moves ahead of the epochs: a commit far above the first horizon raises it
/// before it is appended, so that losing that very commit still leaves a bound above it.
#[tokio::test]
async fn the_horizon_is_raised_before_a_commit_that_would_pass_it() {
    let high = 5 * HORIZON_STEP;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("palisade.redb");
    let store = RedbBackend::open(&db, log_only()).unwrap();
    let log = FsLogDir::for_db(&db);
    assert_eq!(horizon::load(&log), horizon::Loaded::Horizon(HORIZON_STEP));
    store.apply(op("a", 1, put("k", "one"))).await.unwrap();
    store.apply(op("a", high, put("k", "high"))).await.unwrap();
    assert_eq!(
        horizon::load(&log),
        horizon::Loaded::Horizon(high + HORIZON_STEP)
    );
    settle(&store, dir.path(), false).await;
    let copy = copy_dir(dir.path());
    std::mem::forget(store);
    let (segment, at, _) = newest_commit(&copy.path().join("palisade.redb"))
        .unwrap()
        .unwrap();
    zero_sector(&segment, at + 30);
    let floor = reopened_above_every_old_epoch(copy.path(), high, "high commit zeroed").await;
    assert_eq!(floor, high + HORIZON_STEP);
}

#[tokio::test]
async fn a_flipped_segment_header_is_refused() {
    for at in [0u64, 9, 26, 33] {
        let copy = crashed_after_two_epochs(log_only()).await;
        let (segment, ..) = newest_commit(&copy.path().join("palisade.redb"))
            .unwrap()
            .unwrap();
        flip(&segment, at);
        let message = refusal(copy.path());
        assert!(message.contains("header"), "byte {at}: {message}");
    }
}

#[tokio::test]
async fn an_older_database_file_beside_a_newer_log_is_refused() {
    // Tiny segments (one record of the values below each), so that the log rolls and
    // checkpoints delete old segments.
    let options = RedbOptions {
        checkpoint_rows: 1,
        segment_bytes: 12 * 1024,
        ..test_options()
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("palisade.redb");
    let store = RedbBackend::open(&db, options.clone()).unwrap();
    store.apply(op("a", 1, put("k", "one"))).await.unwrap();
    settle(&store, dir.path(), true).await;
    let old = dir.path().join("old.copy");
    std::fs::copy(&db, &old).unwrap();
    let big = "x".repeat(6000);
    for _ in 0..4 {
        store.apply(op("a", 2, put("k", &big))).await.unwrap();
        settle(&store, dir.path(), true).await;
    }
    let copy = copy_dir(dir.path());
    std::mem::forget(store);
    std::fs::copy(
        copy.path().join("old.copy"),
        copy.path().join("palisade.redb"),
    )
    .unwrap();
    let message = refusal(copy.path());
    assert!(message.contains("older than its log"), "{message}");
}

#[tokio::test]
async fn damage_to_the_newest_checkpoint_is_refused() {
    // After a clean close everything is in the database file, and redb's commit of the
    // last checkpoint is the newest commit. redb verifies every page checksum at open.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("palisade.redb");
    let store = RedbBackend::open(&db, log_only()).unwrap();
    store.apply(op("a", 1, put("k", "one"))).await.unwrap();
    store.apply(op("a", 2, put("k", "two"))).await.unwrap();
    store.close().await;
    let bytes = std::fs::read(&db).unwrap();
    let needle = b"two";
    let at = bytes
        .windows(needle.len())
        .rposition(|w| w == needle)
        .expect("the value is on disk");
    flip(&db, at as u64);
    let message = refusal(dir.path());
    assert!(message.contains("palisade.redb"), "{message}");
}

#[tokio::test]
async fn flipped_bytes_in_the_database_header_never_serve_an_older_state() {
    // The header holds redb's two commit slots. Checkpoints commit in two phases, so a
    // damaged slot is an error (or a byte that does not matter), never a quiet fall back
    // to the commit before: epoch 1 is never admitted again.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("palisade.redb");
    for epoch in [1, 2] {
        let store = RedbBackend::open(&db, log_only()).unwrap();
        store.apply(op("a", epoch, put("k", "v"))).await.unwrap();
        store.close().await;
    }
    let original = std::fs::read(&db).unwrap();
    let (mut refused, mut served) = (0, 0);
    for at in (0..512).step_by(3) {
        let mut bytes = original.clone();
        bytes[at] ^= 0x55;
        std::fs::write(&db, &bytes).unwrap();
        match RedbBackend::open(&db, log_only()) {
            Err(_) => refused += 1,
            Ok(store) => {
                served += 1;
                let mark = store.high_water("a").await.unwrap().epoch;
                store.close().await;
                assert_eq!(mark, 2, "byte {at}: an older state was served");
            }
        }
    }
    assert!(
        refused > 0 && served > 0,
        "refused {refused}, served {served}"
    );
}

/// The whole directory put back from an older copy (a snapshot, `cp -a` and back) is
/// consistent in itself: only the witness, kept outside it, can tell. It refuses the
/// copy, whether the newer store stopped gracefully or the copy is older than the last
/// refresh before a crash; and it bounds every epoch the store ever wrote, raised before a
/// commit that would pass it.
#[tokio::test]
async fn a_directory_put_back_from_an_older_copy_is_refused_by_its_witness() {
    let outside = tempfile::tempdir().unwrap();
    let witness_path = outside.path().join("data.witness");
    let options = RedbOptions {
        witness: Some(witness_path.clone()),
        ..log_only()
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("palisade.redb");
    let store = RedbBackend::open(&db, options.clone()).unwrap();
    // A second store on the same witness is refused while the first holds it.
    let other = tempfile::tempdir().unwrap();
    let err = refused(&other.path().join("palisade.redb"), options.clone());
    assert!(err.contains("in use by another store"), "{err}");
    store.apply(op("a", 1, put("k", "one"))).await.unwrap();
    store.close().await;
    let old = copy_dir(dir.path());

    // The newer store: epoch 2 fences epoch 1 out, then a graceful stop.
    let high = 3 * HORIZON_STEP;
    let store = RedbBackend::open(&db, options.clone()).unwrap();
    store.apply(op("a", 2, put("k", "two"))).await.unwrap();
    store.apply(op("b", high, put("k", "high"))).await.unwrap();
    store.close().await;
    let witness::Found::Witness(seen) = witness::load(&witness_path) else {
        panic!("no witness written");
    };
    assert_eq!(seen.horizon, high + HORIZON_STEP, "raised with the horizon");

    // The older copy put back in place.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    for entry in std::fs::read_dir(old.path()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let err = refused(&db, options.clone());
    assert!(err.contains("older than its witness"), "{err}");
    assert!(err.contains("admin restore"), "{err}");
    // Without its witness the copy would serve, and admit the fenced-out epoch 1 again:
    // the hole the witness closes.
    let unwitnessed = RedbBackend::open(&db, log_only()).unwrap();
    assert_eq!(unwitnessed.high_water("a").await.unwrap().epoch, 1);
    unwitnessed.close().await;

    // A crash: the witness is refreshed while serving; a copy older than the refresh is
    // refused too.
    let crash_dir = tempfile::tempdir().unwrap();
    let crash_witness = outside.path().join("crash.witness");
    let options = RedbOptions {
        witness: Some(crash_witness.clone()),
        ..log_only()
    };
    let store =
        RedbBackend::open(&crash_dir.path().join("palisade.redb"), options.clone()).unwrap();
    store.apply(op("a", 1, put("k", "one"))).await.unwrap();
    settle(&store, crash_dir.path(), false).await;
    let old = copy_dir(crash_dir.path());
    store.apply(op("a", 2, put("k", "two"))).await.unwrap();
    store.refresh_witness().unwrap();
    std::mem::forget(store); // the crash: nothing more is written, the lock stays held
    let err = refused(&old.path().join("palisade.redb"), options);
    assert!(err.contains("in use"), "{err}");
    // The crashed process is gone (its lock with it): a copy of the witness stands in.
    let moved = outside.path().join("after-crash.witness");
    std::fs::copy(&crash_witness, &moved).unwrap();
    let options = RedbOptions {
        witness: Some(moved),
        ..log_only()
    };
    let err = refused(&old.path().join("palisade.redb"), options);
    assert!(err.contains("older than its witness"), "{err}");
}
