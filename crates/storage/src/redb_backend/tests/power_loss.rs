//! Power loss at every sync point: the log's fdatasyncs, the zero-filling of segments and
//! the checkpoint's commit (see [`super::disk`] for what survives a cut).
//!
//! The test cuts the power at every sync of a run (grants and writes acknowledged one at a
//! time, then a close, whose final checkpoint writes everything into the database file),
//! with four choices of surviving pages each, reopens the image and checks:
//! - the files open (a torn log tail is dropped, and every epoch and mark raised to the
//!   epoch horizon; a torn checkpoint is rolled back by redb and its rows are still in the
//!   log);
//! - every acknowledged grant and write is there;
//! - nothing beyond the one batch in flight at the cut appears;
//! - the store took no write after the failed sync (fail-stop), and accepts writes again
//!   once reopened;
//! - some cuts did tear the log's tail, so the torn-tail path was exercised.

use std::time::{Duration, Instant};

use palisade_core::lock_table::Reservation;

use super::disk::Disk;
use super::{lease, op, put, start_on, value};
use crate::redb_backend::{RedbBackend, RedbOptions};
use crate::{ApplyError, FencedStore, IssuerLog, StorageError};

const STEPS: u64 = 6;

/// Values large enough that a record spans pages, so a cut can keep one page of a record
/// and lose the next: a torn record, not just a missing one.
static ACKED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| "acked".repeat(1800));

/// No background checkpoint during the run, so that the syncs of a run come in the same
/// order every time; the close checkpoints.
fn options() -> RedbOptions {
    RedbOptions {
        segment_bytes: 256 * 1024,
        checkpoint_rows: 1 << 30,
        checkpoint_every: Duration::from_secs(3600),
        ..RedbOptions::default()
    }
}

/// Starts a store and waits until its spare segment is ready (zero-filled and synced in
/// the background), so that the syncs counted from then on are the run's own.
async fn start(disk: &Disk) -> RedbBackend {
    let store = start_on(disk, options()).expect("start");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !disk.names().iter().any(|n| n.ends_with(".spare")) {
        assert!(
            Instant::now() < deadline,
            "the spare segment never appeared"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The spare is named once synced; one more look lets the preparation finish.
    tokio::time::sleep(Duration::from_millis(5)).await;
    store
}

/// Runs grants and writes until the disk dies, then closes; returns how many of each were
/// acknowledged.
async fn run_until_cut(disk: &Disk, store: &RedbBackend) -> (u64, u64) {
    let (mut grants, mut puts) = (0, 0);
    for epoch in 1..=STEPS {
        let reservation = Reservation {
            ceiling: epoch,
            max_ttl_ms: 10_000,
            active: true,
        };
        let granted = store
            .reserve(
                "a",
                reservation,
                Some(lease(&format!("l{epoch}"), "a", epoch)),
            )
            .await;
        if granted.is_err() {
            break;
        }
        grants = epoch;
        let written = store
            .apply(op("a", epoch, put(&format!("k{epoch}"), &ACKED)))
            .await;
        if written.is_err() {
            break;
        }
        puts = epoch;
    }
    if disk.dead() {
        // Fail-stop: the store latched and refuses at once, without touching the disk.
        assert!(store.is_failed());
        let refused = store.apply(op("a", 99, put("after", "cut"))).await;
        assert!(
            matches!(refused, Err(ApplyError::Storage(StorageError::Failed(ref m))) if m.contains("earlier failure")),
            "{refused:?}"
        );
    }
    store.close().await;
    (grants, puts)
}

/// Returns (whether the cut happened, whether recovery found a torn log tail).
async fn cut_and_check(cut: u64, seed: u64) -> (bool, bool) {
    let disk = Disk::default();
    let store = start(&disk).await;
    disk.cut_after(cut);
    let (grants, puts) = run_until_cut(&disk, &store).await;
    let was_cut = disk.dead();
    drop(store);

    // Everything a failure needs to be understood, since the syncs' order depends on the
    // threads' timing: the run's syncs by file, and the names at the cut.
    let context = format!(
        "cut={cut} seed={seed} ({grants} grants, {puts} writes acked; {})",
        disk.trace()
    );
    let after = disk.after_cut(seed);
    let store =
        start_on(&after, options()).unwrap_or_else(|e| panic!("{context}: reopen failed: {e}"));
    let recovered = store.recovery();
    let torn = recovered.torn;
    let issuer = store.load_issuer().await.unwrap();
    let epoch = issuer.epochs.first().map_or(0, |(_, e)| *e);
    match recovered.raised_to {
        // The in-flight batch may or may not have made it; nothing beyond it did.
        None => assert!(
            !torn && epoch >= grants && epoch <= grants + 1,
            "{context}: epoch {epoch}, {grants} grants acked, torn {torn}"
        ),
        // An ambiguous tail: everything raised above what any record could hold.
        Some(floor) => {
            assert!(floor > STEPS, "{context}: raised to {floor} only");
            // A lock the file knows is at the floor; one it does not starts above it.
            assert!(
                epoch == floor || issuer.epochs.is_empty(),
                "{context}: {epoch}"
            );
            assert!(issuer.epoch_floor >= floor, "{context}");
            let mark = store.high_water("a").await.unwrap().epoch;
            assert!(
                mark >= floor,
                "{context}: mark {mark} below the floor {floor}"
            );
        }
    }
    for i in 1..=STEPS {
        let present = value(&store, "a", &format!("k{i}")).await.is_some();
        if i <= puts {
            assert!(present, "{context}: acknowledged write k{i} lost");
        } else if i > puts + 1 {
            assert!(!present, "{context}: k{i} was never sent but is there");
        }
    }
    let next = recovered.raised_to.unwrap_or(STEPS) + 1;
    store
        .apply(op("a", next, put("after-restart", "ok")))
        .await
        .unwrap_or_else(|e| panic!("{context}: reopened store refuses writes: {e}"));
    store.close().await;
    (was_cut, torn)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_at_every_sync_loses_only_unacknowledged_work() {
    // Count the syncs of an uninterrupted run, then cut at each of them.
    let disk = Disk::default();
    let store = start(&disk).await;
    let before = disk.syncs();
    assert_eq!(run_until_cut(&disk, &store).await, (STEPS, STEPS));
    let total = disk.syncs() - before;
    assert!(
        total > 2 * STEPS,
        "one sync per commit at least, and the checkpoint: {total}"
    );

    let (mut cuts, mut torn) = (0, 0);
    for cut in 1..=total {
        for seed in [
            0x9E37_79B9_7F4A_7C15,
            cut * 7919 + 1,
            cut * 104_729 + 3,
            !cut,
        ] {
            let (was_cut, was_torn) = cut_and_check(cut, seed).await;
            cuts += u64::from(was_cut);
            torn += u64::from(was_torn);
        }
    }
    assert_eq!(cuts, 4 * total, "every planned cut happened");
    assert!(
        torn > 0,
        "no cut tore the log's tail: the torn-tail path went untested"
    );
}
