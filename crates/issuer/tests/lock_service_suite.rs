//! The behavioural suite every lock service runs (`palisade_test_support::lock_service`),
//! on the embedded issuer: a fresh database in a temp dir for each case.

use std::sync::Arc;

use palisade_core::lock_table::TableConfig;
use palisade_issuer::embedded::Issuer;
use palisade_storage::redb_backend::{RedbBackend, RedbOptions};
use palisade_test_support::lock_service::Started;
use palisade_token::Signer;

async fn start() -> Started {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store =
        RedbBackend::open(&dir.path().join("palisade.redb"), RedbOptions::default()).expect("open");
    let issuer = Issuer::start(Arc::new(store), Signer::generate(), TableConfig::default())
        .await
        .expect("start");
    Started {
        nodes: vec![Arc::new(issuer)],
        guard: Box::new(dir),
    }
}

palisade_test_support::lock_service_suite!(start);
