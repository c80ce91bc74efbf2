//! Reads of values never written: the cheapest check, and the one that catches garbage.
//!
//! Every value read (and every value in the final state) must have been written to that
//! same namespace and key by some `write` that was acknowledged or whose outcome is
//! unknown; a refused write had no effect and does not count. For lock-set keys the check
//! is per element: each element of a set read must have been added (or be part of a set
//! written by a plain `write`). A read that returns a value before any write of it was
//! even invoked is reported as a read from the future.
//!
//! Not checked here: *which* write a read may see (that is linearizability), nor values
//! present before the history began (namespaces are assumed fresh).

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::final_state::FinalState;
use crate::history::{History, Op, OpKind, Outcome};
use crate::lockset::decode_set;
use crate::report::{Report, Stats};
use crate::violation::Violation;

type Slot<'a> = (&'a str, &'a str);

/// Checks that every value read or left in the final state was written.
pub fn check(history: &History, final_state: &FinalState) -> Report {
    let mut stats = Stats::default();
    let mut violations = Vec::new();
    // (namespace, key) -> writes that may have taken effect.
    let mut writes: HashMap<Slot, Vec<&Op>> = HashMap::new();
    let mut elements: HashMap<Slot, BTreeSet<String>> = HashMap::new();
    for op in history
        .ops()
        .iter()
        .filter(|op| op.outcome != Outcome::Fail)
    {
        let (Some(lock), Some(key), Some(value)) = (&op.lock, &op.key, &op.value) else {
            continue;
        };
        let slot = (lock.as_str(), key.as_str());
        match op.kind {
            OpKind::Write => {
                writes.entry(slot).or_default().push(op);
                if let Ok(set) = decode_set(value) {
                    elements.entry(slot).or_default().extend(set);
                }
            }
            OpKind::Add => {
                elements.entry(slot).or_default().insert(value.clone());
            }
            _ => {}
        }
    }
    let set_slots: HashSet<Slot> = history
        .ops()
        .iter()
        .filter(|op| op.kind == OpKind::Add)
        .filter_map(|op| Some((op.lock.as_deref()?, op.key.as_deref()?)))
        .collect();

    for read in history.ops().iter() {
        if !matches!(read.kind, OpKind::Read | OpKind::ReadSet) {
            continue;
        }
        stats.count(read);
        if read.outcome != Outcome::Ok {
            continue;
        }
        let (Some(lock), Some(key)) = (&read.lock, &read.key) else {
            stats.skipped += 1;
            continue;
        };
        let Some(value) = &read.value else { continue };
        let slot = (lock.as_str(), key.as_str());
        if read.kind == OpKind::ReadSet || set_slots.contains(&slot) {
            match decode_set(value) {
                Ok(set) => {
                    for element in set {
                        if !elements.get(&slot).is_some_and(|e| e.contains(&element)) {
                            violations.push(never_written(slot, &element, Some(read)));
                        }
                    }
                }
                Err(e) => {
                    stats.notes.push(format!("{read}: {e}"));
                    stats.skipped += 1;
                }
            }
            continue;
        }
        let sources: Vec<&Op> = writes
            .get(&slot)
            .into_iter()
            .flatten()
            .copied()
            .filter(|w| w.value.as_ref() == Some(value))
            .collect();
        let Some(first) = sources.iter().min_by_key(|w| (w.invoke, w.index)) else {
            violations.push(never_written(slot, value, Some(read)));
            continue;
        };
        if read.end().is_some_and(|end| end < first.invoke) {
            violations.push(Violation::ReadFromFuture {
                read: read.clone(),
                write: (*first).clone(),
            });
        }
    }

    for (ns, state) in &final_state.namespaces {
        for (key, value) in &state.values {
            let slot = (ns.as_str(), key.as_str());
            let written = writes
                .get(&slot)
                .is_some_and(|ws| ws.iter().any(|w| w.value.as_ref() == Some(value)));
            if written {
                continue;
            }
            if !set_slots.contains(&slot) {
                violations.push(never_written(slot, value, None));
                continue;
            }
            match decode_set(value) {
                Ok(set) => {
                    for element in set {
                        if !elements.get(&slot).is_some_and(|e| e.contains(&element)) {
                            violations.push(never_written(slot, &element, None));
                        }
                    }
                }
                Err(e) => stats.notes.push(format!("final {ns}/{key}: {e}")),
            }
        }
    }
    Report::new(violations, stats, false)
}

fn never_written(slot: Slot, value: &str, read: Option<&Op>) -> Violation {
    Violation::NeverWritten {
        lock: slot.0.to_owned(),
        key: slot.1.to_owned(),
        value: value.to_owned(),
        read: read.cloned(),
    }
}
