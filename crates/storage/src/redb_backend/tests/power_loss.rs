//! Power loss: a disk that keeps only what was fsync'd, plus an arbitrary part of what
//! was written after the last fsync.
//!
//! [`PowerLossDisk`] records every write since the last successful `sync_data`. At the
//! chosen sync the power goes: that sync fails (so the batch it carried was never
//! acknowledged), the disk accepts nothing more, and the surviving image is the last
//! synced image plus a pseudo-random subset of the 4 KiB pages written since (the kernel
//! flushes dirty pages in any order). The test cuts the power at every sync of a run, in
//! both commit modes, reopens the image and checks:
//! - the file opens (redb's recovery copes with any torn commit);
//! - every acknowledged grant and write is there;
//! - nothing beyond the one batch in flight at the cut appears;
//! - the store took no write after the failed sync (fail-stop), and accepts writes again
//!   once reopened.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redb::StorageBackend;

use super::{grant, lease, op, put, value, xorshift};
use crate::redb_backend::{RedbBackend, RedbOptions};
use crate::{ApplyError, FencedStore, IssuerLog, StorageError};

const PAGE: usize = 4096;

#[derive(Debug, Default)]
struct Platter {
    /// What survives a power cut for certain.
    durable: Vec<u8>,
    /// What reads see.
    view: Vec<u8>,
    /// Writes since the last sync: (offset, bytes), or a length change (offset, empty).
    unsynced: Vec<(u64, Option<Vec<u8>>)>,
    syncs: u64,
    cut_at: Option<u64>,
    dead: bool,
}

#[derive(Debug, Clone, Default)]
struct PowerLossDisk(Arc<Mutex<Platter>>);

fn dead() -> std::io::Error {
    std::io::Error::other("injected power loss: the disk is gone")
}

impl PowerLossDisk {
    fn from_image(image: Vec<u8>) -> Self {
        let disk = PowerLossDisk::default();
        disk.platter().durable = image.clone();
        disk.platter().view = image;
        disk
    }

    fn platter(&self) -> MutexGuard<'_, Platter> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Arms the cut: the `n`-th sync from now fails and kills the disk.
    fn cut_after(&self, n: u64) {
        let mut p = self.platter();
        p.cut_at = Some(p.syncs + n);
    }

    fn syncs(&self) -> u64 {
        self.platter().syncs
    }

    /// What is on the platter after the cut: the synced image plus some of the pages
    /// written since, chosen by `seed`.
    fn image_after_cut(&self, mut seed: u64) -> Vec<u8> {
        let p = self.platter();
        let mut image = p.durable.clone();
        for (offset, write) in &p.unsynced {
            let offset = *offset as usize;
            match write {
                None => image.resize(offset, 0),
                Some(bytes) => {
                    if image.len() < offset + bytes.len() {
                        image.resize(offset + bytes.len(), 0);
                    }
                    for (i, chunk) in bytes.chunks(PAGE).enumerate() {
                        if xorshift(&mut seed) & 1 == 0 {
                            let at = offset + i * PAGE;
                            image[at..at + chunk.len()].copy_from_slice(chunk);
                        }
                    }
                }
            }
        }
        image
    }
}

impl StorageBackend for PowerLossDisk {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.platter().view.len() as u64)
    }

    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, std::io::Error> {
        let p = self.platter();
        let start = offset as usize;
        p.view
            .get(start..start + len)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| std::io::Error::other("read past the end"))
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let mut p = self.platter();
        if p.dead {
            return Err(dead());
        }
        p.view.resize(len as usize, 0);
        p.unsynced.push((len, None));
        Ok(())
    }

    fn sync_data(&self, _eventual: bool) -> Result<(), std::io::Error> {
        let mut p = self.platter();
        if p.dead {
            return Err(dead());
        }
        p.syncs += 1;
        if p.cut_at == Some(p.syncs) {
            p.dead = true;
            return Err(dead());
        }
        p.durable = p.view.clone();
        p.unsynced.clear();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut p = self.platter();
        if p.dead {
            return Err(dead());
        }
        let start = offset as usize;
        if p.view.len() < start + data.len() {
            p.view.resize(start + data.len(), 0);
        }
        p.view[start..start + data.len()].copy_from_slice(data);
        p.unsynced.push((offset, Some(data.to_vec())));
        Ok(())
    }
}

const STEPS: u64 = 6;

fn options(two_phase: bool) -> RedbOptions {
    RedbOptions {
        two_phase_commit: two_phase,
        ..RedbOptions::default()
    }
}

/// Runs grants and writes until the disk dies; returns how many of each were
/// acknowledged.
async fn run_until_cut(disk: &PowerLossDisk, store: &RedbBackend) -> (u64, u64) {
    let (mut grants, mut puts) = (0, 0);
    for epoch in 1..=STEPS {
        if grant(store, lease(&format!("l{epoch}"), "a", epoch))
            .await
            .is_err()
        {
            break;
        }
        grants = epoch;
        let written = store
            .apply(op("a", epoch, put(&format!("k{epoch}"), "acked")))
            .await;
        if written.is_err() {
            break;
        }
        puts = epoch;
    }
    if disk.platter().dead {
        // Fail-stop: the store latched and refuses at once, without touching the disk.
        assert!(store.is_failed());
        let refused = store.apply(op("a", 99, put("after", "cut"))).await;
        assert!(
            matches!(refused, Err(ApplyError::Storage(StorageError::Failed(ref m))) if m.contains("earlier failure")),
            "{refused:?}"
        );
    }
    (grants, puts)
}

async fn cut_and_check(two_phase: bool, cut: u64, seed: u64) -> bool {
    let disk = PowerLossDisk::default();
    let db = redb::Builder::new()
        .create_with_backend(disk.clone())
        .expect("create");
    let store = RedbBackend::start(db, "power-loss".into(), options(two_phase)).expect("start");
    disk.cut_after(cut);
    let (grants, puts) = run_until_cut(&disk, &store).await;
    let was_cut = disk.platter().dead;
    store.close().await;
    drop(store);

    let image = disk.image_after_cut(seed);
    let db = redb::Builder::new()
        .create_with_backend(PowerLossDisk::from_image(image))
        .unwrap_or_else(|e| panic!("cut {cut} seed {seed}: reopen failed: {e}"));
    let store = RedbBackend::start(db, "after".into(), options(two_phase)).expect("restart");
    let context = format!("two_phase={two_phase} cut={cut} seed={seed}");
    let issuer = store.load_issuer().await.unwrap();
    let epoch = issuer.epochs.first().map_or(0, |(_, e)| *e);
    // The in-flight batch may or may not have made it; nothing beyond it did.
    assert!(
        epoch >= grants && epoch <= grants + 1,
        "{context}: epoch {epoch}, {grants} grants acked"
    );
    for i in 1..=STEPS {
        let present = value(&store, "a", &format!("k{i}")).await.is_some();
        if i <= puts {
            assert!(present, "{context}: acknowledged write k{i} lost");
        } else if i > puts + 1 {
            assert!(!present, "{context}: k{i} was never sent but is there");
        }
    }
    store
        .apply(op("a", STEPS + 1, put("after-restart", "ok")))
        .await
        .unwrap_or_else(|e| panic!("{context}: reopened store refuses writes: {e}"));
    store.close().await;
    was_cut
}

#[tokio::test]
async fn power_loss_at_every_sync_loses_only_unacknowledged_work() {
    for two_phase in [false, true] {
        // Count the syncs of an uninterrupted run, then cut at each of them.
        let disk = PowerLossDisk::default();
        let db = redb::Builder::new()
            .create_with_backend(disk.clone())
            .unwrap();
        let store = RedbBackend::start(db, "count".into(), options(two_phase)).unwrap();
        let before = disk.syncs();
        assert_eq!(run_until_cut(&disk, &store).await, (STEPS, STEPS));
        let total = disk.syncs() - before;
        store.close().await;
        assert!(total >= 2 * STEPS, "one sync per commit at least: {total}");

        let mut cuts = 0;
        for cut in 1..=total {
            for seed in [0x9E37_79B9_7F4A_7C15, cut * 7919 + 1] {
                cuts += u64::from(cut_and_check(two_phase, cut, seed).await);
            }
        }
        assert_eq!(cuts, 2 * total, "every planned cut happened");
    }
}
