//! Property test: the redb backend against a model made of a few `BTreeMap`s.
//!
//! Random steps (batches of fenced operations submitted together so the writer may group
//! them into one commit, reads, reopening the file) must give the same answers as the
//! model, and after every step the whole visible state (every mark, key and listing) must
//! match.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::Poll;

use bytes::Bytes;
use proptest::prelude::*;

use palisade_core::gate::{admit, HighWater, Policy};

use crate::redb_backend::{RedbBackend, RedbOptions};
use crate::{Action, Applied, ApplyError, Backend, FencedOp, Idempotency, Precondition};

const NAMESPACES: [&str; 3] = ["a", "b", "seq"];
const KEYS: [&str; 3] = ["k1", "k2", "x"];

/// The reference semantics, written as plainly as possible.
#[derive(Debug, Default)]
struct Model {
    kv: BTreeMap<(String, String), (u64, u64, Bytes)>,
    marks: BTreeMap<String, HighWater>,
    idempotency: BTreeMap<(String, String), (String, Applied)>,
    revision: u64,
}

impl Model {
    fn apply(&mut self, op: &FencedOp) -> Result<Applied, ApplyError> {
        let ns = op.namespace.clone();
        if let Some(idem) = &op.idempotency {
            if let Some((fingerprint, applied)) =
                self.idempotency.get(&(ns.clone(), idem.key.clone()))
            {
                return if *fingerprint == idem.fingerprint {
                    Ok(Applied {
                        replayed: true,
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
        };
        if let Some(idem) = &op.idempotency {
            self.idempotency
                .insert((ns, idem.key.clone()), (idem.fingerprint.clone(), applied));
        }
        Ok(applied)
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// Submitted back to back, in this order, before any answer is awaited.
    Batch(Vec<FencedOp>),
    /// Close and open the file again.
    Reopen,
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
        let listed = store.list(ns, "k", 10).await?;
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
    let mut store = RedbBackend::open(path, RedbOptions::default())?;
    let mut model = Model::default();
    for step in steps {
        match step {
            Step::Batch(ops) => {
                let expected: Vec<Answer> = ops.iter().map(|op| model.apply(op)).collect();
                let answers = submit_in_order(&store, ops.clone()).await;
                prop_assert_eq!(answers, expected, "ops {:?}", ops);
            }
            Step::Reopen => {
                store.close().await;
                store = RedbBackend::open(path, RedbOptions::default())?;
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
