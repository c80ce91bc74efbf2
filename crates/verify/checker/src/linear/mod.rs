//! Linearizability of the fenced store, one namespace at a time.
//!
//! ## The model, and why per namespace
//! The register is a whole **namespace**: its key→value map plus its high-water mark
//! `hw`, under the default `epoch` gate policy:
//!
//! | operation | allowed when | effect |
//! |---|---|---|
//! | write(k, v, e) acknowledged | e >= hw | hw := e, k := v |
//! | delete(k, e) acknowledged | e >= hw | hw := e, k := absent |
//! | fence(e) acknowledged | e >= hw | hw := e |
//! | refused `stale_token` with epoch e | e < hw | none |
//! | read(k) returned v (or absent) | k = v | none |
//! | final state s (one snapshot) | map and hw equal s | none |
//!
//! The mark is shared by every key of the namespace: a write to key `b` with epoch 5
//! makes a later epoch-4 write to key `a` fail. Checking per key would either miss that
//! coupling (and flag correct stale rejections as wrong), or need a relaxed rule ("a
//! rejection is fine if some larger epoch may have landed on another key") that can no
//! longer tell a wrong rejection from a right one and lets a per-key order disagree with
//! the namespace's single order of marks. So the unit is the namespace, which is exact: a
//! history passes if and only if one order of the namespace's operations, consistent with
//! real time, explains every result.
//!
//! Splitting by namespace is sound (P-compositionality, Herlihy & Wing's locality):
//! namespaces share no state, so the whole store is linearizable exactly when each
//! namespace is. Lock acquisitions are not part of the model: issuing an epoch does not
//! touch the store (S10).
//!
//! ## Operations
//! - `ok` writes, deletes, fences and reads must take effect once, between invocation and
//!   completion. A `stale_token` refusal must find the mark above its epoch at some
//!   instant in its interval. Other refusals had no effect and assert nothing.
//! - `info` mutations may take effect at any instant after invocation, or never. `info`
//!   reads assert nothing and are dropped.
//! - The [`FinalState`], when recorded for the namespace, is one snapshot read after
//!   everything else: every key (those it lacks must be absent) and the mark. A lost
//!   acknowledged write shows up there. It must be read once every worker has stopped: an
//!   unknown write that lands after the snapshot would be a false alarm.
//!
//! ## Limits
//! Namespaces holding lock-set operations (`read_set`, `add`) are skipped: an add's
//! stored value is not recorded. Conditional writes are checked as plain writes (the
//! precondition is not modelled), the `sequence` policy is not modelled, and namespaces
//! are assumed to start empty with mark 0. The search is exponential in the number of
//! overlapping operations; past its time budget it answers `Unknown`.

mod model;
mod search;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use palisade_api::ErrorCode;

use model::{Call, Effect, Source, State, Value, ABSENT};
use search::Verdict;

use crate::final_state::{FinalState, NamespaceState};
use crate::history::{History, Op, OpKind, Outcome};
use crate::report::{Report, Stats};
use crate::violation::{Pending, Violation};

/// Checks each namespace for linearizability within `budget` of wall time in all.
pub fn check(history: &History, final_state: &FinalState, budget: Duration) -> Report {
    let deadline = Instant::now() + budget;
    let mut stats = Stats::default();
    let mut violations = Vec::new();
    let mut undecided = false;

    let mut by_ns: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history.ops() {
        if matches!(op.kind, OpKind::Acquire | OpKind::Release | OpKind::Restart) {
            continue;
        }
        match op.lock.as_deref() {
            Some(ns) => by_ns.entry(ns).or_default().push(op),
            None => stats.skipped += 1,
        }
    }
    let after_all = history.last_time().saturating_add(1);

    for (ns, ops) in by_ns {
        if ops
            .iter()
            .any(|op| matches!(op.kind, OpKind::ReadSet | OpKind::Add))
        {
            stats
                .notes
                .push(format!("{ns}: lock-set namespace, not checked here"));
            continue;
        }
        let mut namespace = Namespace::default();
        for op in &ops {
            stats.count(op);
            if !namespace.add(op) {
                stats.skipped += 1;
            }
        }
        if let Some(end_state) = final_state.namespaces.get(ns) {
            namespace.add_final(end_state, after_all);
        }
        namespace.mark_unobserved();
        namespace.calls.sort_by_key(|c| (c.invoke, c.end));
        let verdict = search::search(
            &namespace.calls,
            namespace.keys.len(),
            deadline,
            &mut stats.explored,
        );
        match verdict {
            Verdict::Linearizable => {}
            Verdict::GaveUp(why) => {
                stats.notes.push(format!("{ns}: undecided ({why})"));
                undecided = true;
            }
            Verdict::NotLinearizable {
                prefix,
                state,
                stuck,
            } => violations.push(namespace.violation(ns, history, &prefix, &state, &stuck)),
        }
    }
    Report::new(violations, stats, undecided)
}

/// One namespace's calls, with keys and values interned.
#[derive(Default)]
struct Namespace {
    calls: Vec<Call>,
    keys: Vec<String>,
    key_ids: HashMap<String, usize>,
    /// Index 0 is [`ABSENT`].
    values: Vec<String>,
    value_ids: HashMap<String, Value>,
    end_state: Option<NamespaceState>,
}

impl Namespace {
    fn key(&mut self, key: &str) -> usize {
        if let Some(&id) = self.key_ids.get(key) {
            return id;
        }
        self.keys.push(key.to_owned());
        self.key_ids.insert(key.to_owned(), self.keys.len() - 1);
        self.keys.len() - 1
    }

    fn value(&mut self, value: Option<&str>) -> Value {
        let Some(value) = value else { return ABSENT };
        if self.values.is_empty() {
            self.values.push(String::new());
        }
        if let Some(&id) = self.value_ids.get(value) {
            return id;
        }
        self.values.push(value.to_owned());
        let id = (self.values.len() - 1) as Value;
        self.value_ids.insert(value.to_owned(), id);
        id
    }

    /// Turns `op` into a call. False when the op lacks data the model needs.
    fn add(&mut self, op: &Op) -> bool {
        let definite = op.outcome != Outcome::Info;
        let effect = match (op.kind, op.outcome) {
            (OpKind::Read, Outcome::Info) => return true,
            (OpKind::Read, Outcome::Fail)
                if op.error.as_deref() != Some(ErrorCode::NotFound.as_str()) =>
            {
                return true
            }
            (OpKind::Read, _) => {
                let Some(key) = op.key.as_deref() else {
                    return false;
                };
                let ok = op.outcome == Outcome::Ok;
                Effect::Read {
                    key: self.key(key),
                    value: self.value(op.value.as_deref().filter(|_| ok)),
                }
            }
            (_, Outcome::Fail) if !op.is_stale_rejection() => return true,
            (_, Outcome::Fail) => match op.epoch {
                Some(epoch) => Effect::Stale { epoch },
                None => return false,
            },
            (OpKind::Fence, _) => match op.epoch {
                Some(epoch) => Effect::Fence { epoch },
                None => return false,
            },
            (OpKind::Write | OpKind::Delete, _) => {
                let value = if op.kind == OpKind::Write {
                    match op.value.as_deref() {
                        Some(v) => self.value(Some(v)),
                        None => return false,
                    }
                } else {
                    ABSENT
                };
                let (Some(key), Some(epoch)) = (op.key.as_deref(), op.epoch) else {
                    return false;
                };
                Effect::Write {
                    key: self.key(key),
                    value,
                    epoch,
                }
            }
            _ => return true,
        };
        self.calls.push(Call {
            effect,
            invoke: op.invoke,
            end: if definite { op.end() } else { None },
            unobserved: false,
            source: Source::Op(op.index),
        });
        true
    }

    /// The final state as one snapshot call after everything else. Keys the history
    /// touched but the final state lacks must be absent.
    fn add_final(&mut self, end_state: &NamespaceState, at: u64) {
        for key in end_state.values.keys() {
            self.key(key);
        }
        let mut expected = State::new(self.keys.len());
        expected.high_water = end_state.high_water;
        for (key, value) in end_state.values.iter() {
            let (key, value) = (self.key(key), self.value(Some(value)));
            expected.values[key] = value;
        }
        self.calls.push(Call {
            effect: Effect::Final(expected),
            invoke: at,
            end: Some(at.saturating_add(1)),
            unobserved: false,
            source: Source::Final,
        });
        self.end_state = Some(end_state.clone());
    }

    /// Flags unknown writes whose value no read returns (see `State::pointless`).
    fn mark_unobserved(&mut self) {
        let observed: HashSet<(usize, Value)> = self
            .calls
            .iter()
            .flat_map(|c| match &c.effect {
                Effect::Read { key, value } => vec![(*key, *value)],
                Effect::Final(state) => state.values.iter().copied().enumerate().collect(),
                _ => Vec::new(),
            })
            .collect();
        for call in self.calls.iter_mut().filter(|c| c.end.is_none()) {
            if let Effect::Write { key, value, .. } = call.effect {
                call.unobserved = !observed.contains(&(key, value));
            }
        }
    }

    fn violation(
        &self,
        ns: &str,
        history: &History,
        prefix: &[usize],
        state: &State,
        stuck: &[usize],
    ) -> Violation {
        let linearized = prefix
            .iter()
            .filter_map(|&c| match self.calls[c].source {
                Source::Op(i) => Some(i),
                _ => None,
            })
            .collect();
        let stuck = stuck
            .iter()
            .map(|&c| match self.calls[c].source {
                Source::Op(i) => Pending::Op(history.ops()[i].clone()),
                Source::Final => Pending::Final(self.end_state.clone().unwrap_or_default()),
            })
            .collect();
        let mut shown = format!("high-water {}", state.high_water);
        for (key, &value) in self.keys.iter().zip(&state.values) {
            match self.shown(value) {
                Some(v) => shown.push_str(&format!(", {key}={v:?}")),
                None => shown.push_str(&format!(", {key} absent")),
            }
        }
        Violation::NotLinearizable {
            namespace: ns.to_owned(),
            linearized,
            state: shown,
            stuck,
        }
    }

    fn shown(&self, value: Value) -> Option<String> {
        (value != ABSENT).then(|| self.values[value as usize].clone())
    }
}
