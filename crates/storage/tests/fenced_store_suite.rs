//! The behavioural suite every fenced store runs (`palisade_test_support::fenced_store`),
//! on the embedded store: a fresh file in a temp dir for each case.

use std::sync::Arc;

use palisade_storage::redb_backend::{RedbBackend, RedbOptions};
use palisade_storage::{StoreLimits, WallClock};
use palisade_test_support::fenced_store::Opened;

async fn open(limits: StoreLimits, clock: WallClock) -> Opened {
    let dir = tempfile::tempdir().expect("a temp dir");
    let options = RedbOptions {
        limits,
        clock,
        // Small log segments: each is zero-filled when made.
        segment_bytes: 256 * 1024,
        ..RedbOptions::default()
    };
    let store = RedbBackend::open(&dir.path().join("palisade.redb"), options).expect("open");
    Opened {
        nodes: vec![Arc::new(store)],
        guard: Box::new(dir),
    }
}

palisade_test_support::fenced_store_suite!(open);
