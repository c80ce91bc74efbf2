//! The shared suite against the conditional-write adapter over `object_store`'s
//! `InMemory` store (which implements real ETag preconditions), plus the cases only an
//! object store has: lock binding, tombstones, barriers, byte-identical refusals.
#![cfg(feature = "object-store")]

mod support;

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use palisade_adapters::objects::FencedObjects;
use palisade_adapters::report::ResourceKind;
use palisade_adapters::{AdmitError, GateTally, Trust};
use palisade_token::Verifier;
use support::{GateUnderTest, Issuer, Write, LOCK, OTHER_LOCK};

struct ObjectGate {
    objects: FencedObjects,
    verifier: Arc<Verifier>,
    tally: GateTally,
}

impl ObjectGate {
    /// Trusts the issuer's tokens and counts every admit in the gate's tally.
    fn trust(&self) -> Trust<'_> {
        Trust::new(&self.verifier).reporting_to(&self.tally)
    }

    fn new(issuer: &Issuer) -> Self {
        ObjectGate {
            objects: FencedObjects::new(Arc::new(InMemory::new())),
            verifier: issuer.verifier(),
            tally: GateTally::new(),
        }
    }
}

impl GateUnderTest for ObjectGate {
    const KIND: ResourceKind = ResourceKind::ObjectStore;

    fn tally(&self) -> &GateTally {
        &self.tally
    }

    async fn put(&self, write: Write<'_>) -> Result<(), AdmitError> {
        let (path, value) = (Path::from(write.key), write.value.to_owned().into());
        self.objects
            .put(self.trust(), write.token, write.lock, &path, value)
            .await
            .map(drop)
    }

    async fn read(&self, key: &str) -> Option<String> {
        let envelope = self.objects.get(&Path::from(key)).await.unwrap()?;
        Some(String::from_utf8(envelope.value?.to_vec()).unwrap())
    }

    async fn high_water(&self, lock: &str, key: &str) -> u64 {
        match self.objects.get(&Path::from(key)).await.unwrap() {
            Some(envelope) if envelope.lock == lock => envelope.epoch,
            _ => 0,
        }
    }
}

support::suite_tests!(|issuer| ObjectGate::new(issuer), racers: 100);

/// The adapter's atomic unit is one object: a refused write leaves its bytes and version
/// exactly as they were (there is no "caller's own write" to roll back).
#[tokio::test]
async fn refusal_leaves_the_object_byte_identical() {
    let issuer = Issuer::new();
    let gate = ObjectGate::new(&issuer);
    let path = Path::from("manifest");
    gate.write(&issuer.token(LOCK, 2), LOCK, "manifest", "v2")
        .await
        .unwrap();
    let before = gate.objects.store().get(&path).await.unwrap();
    let (etag, bytes) = (before.meta.e_tag.clone(), before.bytes().await.unwrap());
    for token in [
        issuer.token(LOCK, 1),
        String::new(),
        "2".to_owned(),
        issuer.token(OTHER_LOCK, 7),
    ] {
        assert!(gate.write(&token, LOCK, "manifest", "bad").await.is_err());
        let after = gate.objects.store().get(&path).await.unwrap();
        assert_eq!(after.meta.e_tag, etag);
        assert_eq!(after.bytes().await.unwrap(), bytes);
    }
}

/// An object is bound to the lock that created it: a genuine token for another lock
/// cannot take it over, whatever its epoch.
#[tokio::test]
async fn object_is_bound_to_its_lock() {
    let issuer = Issuer::new();
    let gate = ObjectGate::new(&issuer);
    gate.write(&issuer.token(LOCK, 1), LOCK, "bound", "mine")
        .await
        .unwrap();
    let takeover = gate
        .write(
            &issuer.token(OTHER_LOCK, 1_000),
            OTHER_LOCK,
            "bound",
            "theirs",
        )
        .await;
    assert!(
        matches!(&takeover, Err(AdmitError::WrongLock { expected, token_lock })
            if expected == LOCK && token_lock == OTHER_LOCK),
        "{takeover:?}"
    );
    assert_eq!(gate.read("bound").await.as_deref(), Some("mine"));
}

/// Delete keeps the mark (a tombstone), so a stale holder cannot recreate the object; a
/// barrier raises the mark without touching the payload.
#[tokio::test]
async fn tombstones_and_barriers_keep_the_mark() {
    let issuer = Issuer::new();
    let gate = ObjectGate::new(&issuer);
    let (verifier, path) = (issuer.verifier(), Path::from("doc"));
    gate.write(&issuer.token(LOCK, 1), LOCK, "doc", "v1")
        .await
        .unwrap();
    // The new holder fences the object before working: epoch 1 is refused from now on.
    let (t2, t3) = (issuer.token(LOCK, 2), issuer.token(LOCK, 3));
    let fenced = gate.objects.fence(&verifier, &t2, LOCK, &path).await;
    assert_eq!(fenced.unwrap().high_water.epoch, 2);
    assert_eq!(gate.read("doc").await.as_deref(), Some("v1"));
    assert!(gate
        .write(&issuer.token(LOCK, 1), LOCK, "doc", "late")
        .await
        .is_err());

    gate.objects
        .delete(&verifier, &t3, LOCK, &path)
        .await
        .unwrap();
    assert_eq!(gate.read("doc").await, None);
    assert_eq!(gate.high_water(LOCK, "doc").await, 3);
    let recreate = gate
        .write(&issuer.token(LOCK, 2), LOCK, "doc", "zombie")
        .await;
    assert!(matches!(
        recreate,
        Err(AdmitError::Stale {
            high_water: 3,
            epoch: 2
        })
    ));
}

/// An object written without the envelope (by a tool that bypasses the adapter) is
/// refused, not silently adopted or overwritten.
#[tokio::test]
async fn unfenced_object_is_refused() {
    let issuer = Issuer::new();
    let gate = ObjectGate::new(&issuer);
    let path = Path::from("raw");
    let raw = PutPayload::from_static(b"written directly");
    gate.objects.store().put(&path, raw).await.unwrap();
    let result = gate.write(&issuer.token(LOCK, 1), LOCK, "raw", "x").await;
    assert!(matches!(result, Err(AdmitError::Backend(_))), "{result:?}");
}
