//! Property test: the redb backend against a model made of a few `BTreeMap`s.
//!
//! Random steps (batches of fenced operations submitted together so the writer may group
//! them into one commit, reads, reopening the file, moving the wall clock past the
//! idempotency retention) must give the same answers as the model, and after every step the
//! whole visible state (every mark, key and listing) must match. The limits are tiny, so
//! quota refusals are common; the model counts a namespace's keys and bytes from its data
//! on every put, independently of the backend's counters.

use palisade_api::QuotaResource;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;

use palisade_core::gate::{admit, HighWater, Policy};
use palisade_core::page::Page;

use crate::redb_backend::{RedbBackend, RedbOptions};
use crate::{
    Action, Applied, ApplyError, FencedOp, FencedStore, Idempotency, Precondition, StoreLimits,
    WallClock,
};

const MAX_KEYS: u64 = 2;
const MAX_BYTES: u64 = 7;
const RETENTION_MS: u64 = 10;

const NAMESPACES: [&str; 3] = ["a", "b", "seq"];
const KEYS: [&str; 3] = ["k1", "k2", "x"];

/// The reference semantics, written as plainly as possible.
#[derive(Debug, Default)]
struct Model {
    kv: BTreeMap<(String, String), (u64, u64, Bytes)>,
    marks: BTreeMap<String, HighWater>,
    idempotency: BTreeMap<(String, String), (String, Applied, u64)>,
    revision: u64,
    now_ms: u64,
}

impl Model {
    fn apply(&mut self, op: &FencedOp) -> Result<Applied, ApplyError> {
        let ns = op.namespace.clone();
        if let Some(idem) = &op.idempotency {
            let live = self
                .idempotency
                .get(&(ns.clone(), idem.key.clone()))
                .filter(|(_, _, at)| self.now_ms - at < RETENTION_MS);
            if let Some((fingerprint, applied, _)) = live {
                return if *fingerprint == idem.fingerprint {
                    Ok(Applied {
                        replayed: true,
                        advanced: false,
                        ..*applied
                    })
                } else {
                    Err(ApplyError::IdempotencyConflict)
                };
            }
        }
        let mark = self.marks.get(&ns).copied().unwrap_or_default();
        let next = admit(mark, op.policy, op.epoch, op.seq)?;
        let revision = match &op.action {
            Action::Put {
                key,
                value,
                precondition,
            } => {
                let slot = (ns.clone(), key.clone());
                precondition.check(self.kv.get(&slot).map(|e| e.0))?;
                self.check_quota(&ns, key, value.len())?;
                self.revision += 1;
                self.kv
                    .insert(slot, (self.revision, op.epoch, value.clone()));
                self.revision
            }
            Action::Delete { key, precondition } => {
                let slot = (ns.clone(), key.clone());
                precondition.check(self.kv.get(&slot).map(|e| e.0))?;
                self.kv.remove(&slot).ok_or(ApplyError::NotFound)?;
                self.revision += 1;
                self.revision
            }
            Action::Fence => self.revision,
        };
        self.marks.insert(ns.clone(), next);
        let applied = Applied {
            revision,
            epoch: op.epoch,
            high_water: next,
            replayed: false,
            advanced: next != mark,
        };
        if let Some(idem) = &op.idempotency {
            self.idempotency.insert(
                (ns, idem.key.clone()),
                (idem.fingerprint.clone(), applied, self.now_ms),
            );
        }
        Ok(applied)
    }

    /// Refuses a put of `key` that would take `ns` over a limit it does not already exceed.
    fn check_quota(&self, ns: &str, key: &str, value_len: usize) -> Result<(), ApplyError> {
        let size = |k: &str, v: &Bytes| (k.len() + v.len()) as u64;
        let entries = || self.kv.iter().filter(|((n, _), _)| n == ns);
        let (keys, bytes) = (
            entries().count() as u64,
            entries().map(|((_, k), e)| size(k, &e.2)).sum::<u64>(),
        );
        let old = self.kv.get(&(ns.to_string(), key.to_string()));
        let new_keys = keys + u64::from(old.is_none());
        let new_bytes = bytes - old.map_or(0, |e| size(key, &e.2)) + (key.len() + value_len) as u64;
        if new_keys > keys && new_keys > MAX_KEYS {
            return Err(ApplyError::QuotaExceeded {
                resource: QuotaResource::KeysPerNamespace,
                limit: MAX_KEYS,
            });
        }
        if new_bytes > bytes && new_bytes > MAX_BYTES {
            return Err(ApplyError::QuotaExceeded {
                resource: QuotaResource::BytesPerNamespace,
                limit: MAX_BYTES,
            });
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// Submitted back to back, in this order, before any answer is awaited.
    Batch(Vec<FencedOp>),
    /// Close and open the file again.
    Reopen,
    /// Move the wall clock forward by this many milliseconds.
    Advance(u64),
}

fn precondition() -> impl Strategy<Value = Precondition> {
    prop_oneof![
        2 => Just(Precondition::None),
        1 => Just(Precondition::Absent),
        1 => (0u64..8).prop_map(Precondition::Revision),
    ]
}

fn action() -> impl Strategy<Value = Action> {
    let key = proptest::sample::select(&KEYS[..]).prop_map(str::to_string);
    prop_oneof![
        4 => (key.clone(), "[a-c]{0,3}", precondition()).prop_map(|(key, value, precondition)| {
            Action::Put { key, value: Bytes::from(value), precondition }
        }),
        2 => (key, precondition()).prop_map(|(key, precondition)| Action::Delete { key, precondition }),
        1 => Just(Action::Fence),
    ]
}

fn fenced_op() -> impl Strategy<Value = FencedOp> {
    let idempotency = proptest::option::weighted(
        0.3,
        (
            proptest::sample::select(&["i1", "i2"][..]),
            proptest::sample::select(&["f1", "f2"][..]),
        )
            .prop_map(|(key, fingerprint)| Idempotency {
                key: key.to_string(),
                fingerprint: fingerprint.to_string(),
            }),
    );
    (
        proptest::sample::select(&NAMESPACES[..]),
        1u64..5,
        proptest::option::weighted(0.9, 0u64..4),
        idempotency,
        action(),
    )
        .prop_map(|(ns, epoch, seq, idempotency, action)| FencedOp {
            namespace: ns.to_string(),
            epoch,
            seq,
            // The server fixes the policy per namespace; "seq" is the sequence one.
            policy: if ns == "seq" {
                Policy::Sequence
            } else {
                Policy::Epoch
            },
            idempotency,
            action,
        })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => proptest::collection::vec(fenced_op(), 1..6).prop_map(Step::Batch),
        1 => Just(Step::Reopen),
        2 => (1u64..12).prop_map(Step::Advance),
    ]
}

type Answer = Result<Applied, ApplyError>;

/// Polls every `apply` once, in order, so all are queued in this order before the writer
/// answers any; then collects the answers.
async fn submit_in_order(store: &RedbBackend, ops: Vec<FencedOp>) -> Vec<Answer> {
    let mut pending: Vec<Pin<Box<dyn Future<Output = Answer> + Send + '_>>> =
        ops.into_iter().map(|op| store.apply(op)).collect();
    let mut early: Vec<Option<Answer>> = Vec::new();
    std::future::poll_fn(|cx| {
        early = pending
            .iter_mut()
            .map(|f| match f.as_mut().poll(cx) {
                Poll::Ready(answer) => Some(answer),
                Poll::Pending => None,
            })
            .collect();
        Poll::Ready(())
    })
    .await;
    let mut answers = Vec::new();
    for (future, answer) in pending.into_iter().zip(early) {
        answers.push(match answer {
            Some(answer) => answer,
            None => future.await,
        });
    }
    answers
}

async fn assert_same_state(store: &RedbBackend, model: &Model) -> Result<(), TestCaseError> {
    for ns in NAMESPACES {
        let mark = model.marks.get(ns).copied().unwrap_or_default();
        prop_assert_eq!(store.high_water(ns).await?, mark);
        for key in KEYS {
            let stored = store
                .get(ns, key)
                .await?
                .map(|e| (e.revision, e.epoch, e.value));
            let expected = model.kv.get(&(ns.to_string(), key.to_string())).cloned();
            prop_assert_eq!(stored, expected, "{}/{}", ns, key);
        }
        let listed = store.list(ns, Page::first("k", 10)).await?;
        let expected: Vec<String> = model
            .kv
            .keys()
            .filter(|(n, k)| n == ns && k.starts_with('k'))
            .map(|(_, k)| k.clone())
            .collect();
        prop_assert_eq!(listed, expected);
    }
    Ok(())
}

async fn run(path: &Path, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let clock = Arc::new(AtomicU64::new(1_000));
    let now = Arc::clone(&clock);
    let options = RedbOptions {
        limits: StoreLimits {
            max_keys_per_namespace: MAX_KEYS,
            max_bytes_per_namespace: MAX_BYTES,
            idempotency_retention: Duration::from_millis(RETENTION_MS),
        },
        clock: WallClock::from_fn(move || now.load(Ordering::SeqCst)),
        ..super::test_options()
    };
    let mut store = RedbBackend::open(path, options.clone())?;
    let mut model = Model {
        now_ms: 1_000,
        ..Model::default()
    };
    for step in steps {
        match step {
            Step::Batch(ops) => {
                let expected: Vec<Answer> = ops.iter().map(|op| model.apply(op)).collect();
                let answers = submit_in_order(&store, ops.clone()).await;
                prop_assert_eq!(answers, expected, "ops {:?}", ops);
            }
            Step::Reopen => {
                store.close().await;
                store = RedbBackend::open(path, options.clone())?;
            }
            Step::Advance(ms) => {
                model.now_ms += ms;
                clock.fetch_add(ms, Ordering::SeqCst);
            }
        }
        assert_same_state(&store, &model).await?;
    }
    prop_assert!(!store.is_failed());
    store.close().await;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn behaves_like_the_model(steps in proptest::collection::vec(step(), 1..25)) {
        let dir = tempfile::tempdir()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(run(&dir.path().join("model.redb"), steps))?;
    }
}
