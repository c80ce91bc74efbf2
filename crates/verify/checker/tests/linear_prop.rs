//! The linearizability checker agrees with a brute-force search on small random
//! histories of one fenced namespace.
//!
//! The brute force shares no code with the checker: for every subset of the unknown
//! mutations it tries every order of the operations that respects real time, and replays
//! it on its own copy of the model.

use std::collections::BTreeMap;
use std::time::Duration;

use palisade_checker::{
    linear, FinalState, History, NamespaceState, Op, OpKind, Outcome, Validity,
};
use proptest::prelude::*;

const NS: &str = "ns";
const KEYS: [&str; 2] = ["a", "b"];

/// Random choices for one operation; how they are used depends on the generation mode.
#[derive(Debug, Clone)]
struct Raw {
    kind: u8,
    key: usize,
    value: u8,
    epoch: u64,
    invoke: u64,
    duration: u64,
    outcome: u8,
    point: u64,
    lands: bool,
}

fn raw() -> impl Strategy<Value = Raw> {
    (
        (0u8..4, 0usize..2, 0u8..4, 1u64..4),
        (0u64..20, 1u64..8, 0u8..4, 0u64..=100, any::<bool>()),
    )
        .prop_map(
            |((kind, key, value, epoch), (invoke, duration, outcome, point, lands))| Raw {
                kind,
                key,
                value,
                epoch,
                invoke,
                duration,
                outcome,
                point,
                lands,
            },
        )
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Model {
    high_water: u64,
    values: BTreeMap<String, String>,
}

impl Model {
    /// Replays `op` as taking effect now; false if its recorded result is impossible.
    fn apply(&mut self, op: &Op) -> bool {
        let epoch = op.epoch.unwrap_or(0);
        if op.outcome == Outcome::Fail {
            return epoch < self.high_water;
        }
        let key = op.key.clone().unwrap_or_default();
        match op.kind {
            OpKind::Read => self.values.get(&key) == op.value.as_ref(),
            _ if epoch < self.high_water => false,
            kind => {
                self.high_water = epoch;
                match kind {
                    OpKind::Write => {
                        self.values
                            .insert(key, op.value.clone().unwrap_or_default());
                    }
                    OpKind::Delete => {
                        self.values.remove(&key);
                    }
                    _ => {}
                }
                true
            }
        }
    }
}

fn base_op(r: &Raw) -> Op {
    let kind = [OpKind::Write, OpKind::Read, OpKind::Fence, OpKind::Delete][r.kind as usize];
    let mut op = Op::new(0, kind, r.invoke).lock(NS);
    if kind != OpKind::Fence {
        op = op.key(KEYS[r.key]);
    }
    if kind != OpKind::Read {
        op = op.epoch(r.epoch);
    }
    if kind == OpKind::Write {
        op = op.value(&format!("v{}", r.value % 3));
    }
    op
}

/// Results drawn at random: mostly impossible histories.
fn random_history(raws: &[Raw]) -> Vec<Op> {
    raws.iter()
        .map(|r| {
            let mut op = base_op(r);
            if op.kind == OpKind::Read && r.value > 0 {
                op = op.value(&format!("v{}", r.value - 1));
            }
            let end = r.invoke + r.duration;
            match r.outcome {
                0 => op.info(),
                1 if op.kind != OpKind::Read => op.fail(end, "stale_token"),
                _ => op.ok(end),
            }
        })
        .collect()
}

/// Results computed from a real execution: each op takes effect at a random instant in
/// its interval (unknown ones anywhere after invocation, or never). Returns the final
/// model state too.
fn simulated_history(raws: &[Raw]) -> (Vec<Op>, Model) {
    let mut at: Vec<(u64, usize)> = raws
        .iter()
        .enumerate()
        .map(|(i, r)| match r.outcome {
            0 => (r.invoke + r.point / 5, i),
            _ => (r.invoke + r.point * r.duration / 100, i),
        })
        .collect();
    at.sort();
    let mut model = Model::default();
    let mut ops: Vec<Option<Op>> = vec![None; raws.len()];
    for (_, i) in at {
        let r = &raws[i];
        let op = base_op(r);
        let end = r.invoke + r.duration;
        let op = if r.outcome == 0 {
            if r.lands && op.kind != OpKind::Read {
                // A stale one is refused and changes nothing.
                let _ = model.apply(&op);
            }
            op.info()
        } else if op.kind == OpKind::Read {
            let op = match model.values.get(KEYS[r.key]) {
                Some(v) => op.value(v),
                None => op,
            };
            op.ok(end)
        } else if model.apply(&op) {
            op.ok(end)
        } else {
            op.fail(end, "stale_token")
        };
        ops[i] = Some(op);
    }
    (ops.into_iter().flatten().collect(), model)
}

fn brute_force(ops: &[Op], end: Option<&Model>) -> bool {
    let definite: Vec<&Op> = ops
        .iter()
        .filter(|op| op.outcome != Outcome::Info)
        .collect();
    let optional: Vec<&Op> = ops
        .iter()
        .filter(|op| op.outcome == Outcome::Info && op.kind != OpKind::Read)
        .collect();
    (0..1u32 << optional.len()).any(|mask| {
        let mut chosen = definite.clone();
        chosen.extend(
            (0..optional.len())
                .filter(|b| mask & (1 << b) != 0)
                .map(|b| optional[b]),
        );
        let mut used = vec![false; chosen.len()];
        some_order(&chosen, &mut Vec::new(), &mut used, end)
    })
}

fn some_order(ops: &[&Op], order: &mut Vec<usize>, used: &mut [bool], end: Option<&Model>) -> bool {
    if order.len() == ops.len() {
        let mut model = Model::default();
        return order.iter().all(|&i| model.apply(ops[i])) && end.is_none_or(|e| *e == model);
    }
    for i in 0..ops.len() {
        let blocked = (0..ops.len()).any(|j| j != i && !used[j] && ops[j].precedes(ops[i]));
        if used[i] || blocked {
            continue;
        }
        used[i] = true;
        order.push(i);
        let found = some_order(ops, order, used, end);
        order.pop();
        used[i] = false;
        if found {
            return true;
        }
    }
    false
}

fn final_state(model: &Model) -> FinalState {
    let mut state = FinalState::default();
    state.namespaces.insert(
        NS.into(),
        NamespaceState {
            high_water: model.high_water,
            values: model.values.clone(),
        },
    );
    state
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn agrees_with_brute_force(
        raws in proptest::collection::vec(raw(), 1..=8),
        simulated in any::<bool>(),
        with_final in any::<bool>(),
        corrupt in proptest::option::of(0usize..8),
        random_end in (0u64..4, 0u8..4, 0u8..4),
    ) {
        let (mut ops, mut end) = simulated_history(&raws);
        if !simulated {
            ops = random_history(&raws);
            end = Model::default();
            end.high_water = random_end.0;
            for (key, v) in KEYS.iter().zip([random_end.1, random_end.2]) {
                if v > 0 {
                    end.values.insert(key.to_string(), format!("v{}", v - 1));
                }
            }
        }
        let untouched = corrupt.is_none();
        if let Some(i) = corrupt {
            let op = &mut ops[i % raws.len()];
            match (op.kind, op.outcome) {
                (OpKind::Read, Outcome::Ok) => op.value = match op.value.as_deref() {
                    Some("v0") => None,
                    _ => Some("v0".into()),
                },
                (_, Outcome::Ok) => {
                    op.outcome = Outcome::Fail;
                    op.error = Some("stale_token".into());
                }
                (_, Outcome::Fail) => {
                    op.outcome = Outcome::Ok;
                    op.error = None;
                }
                _ => {}
            }
        }
        let expected = brute_force(&ops, with_final.then_some(&end));
        if simulated && untouched {
            prop_assert!(expected, "generator made an impossible history");
        }
        let history = History::new(ops);
        let fin = if with_final { final_state(&end) } else { FinalState::default() };
        let report = linear::check(&history, &fin, Duration::from_secs(10));
        let want = if expected { Validity::Valid } else { Validity::Invalid };
        prop_assert_eq!(report.valid, want, "{}\n{:#?}", report.summary(), history.ops());
    }
}
