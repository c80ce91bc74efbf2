//! Lock-set: the mutual-exclusion workload, where lost updates show directly.
//!
//! Each worker acquires a lock, reads a set stored at a key (`read_set`), pauses, then
//! writes back the set plus its own element (`add`, the element in `value`). If two
//! workers ever believed they held the lock at once and the store admitted both, one
//! overwrites the other's element. Checked:
//! - every *acknowledged* add has its element in the final set ([`Violation::LostUpdate`]);
//! - every acknowledged set read contains the elements of all adds acknowledged before the
//!   read was invoked ([`Violation::SetReadMissing`]).
//!
//! Not checked: unknown (`info`) and refused adds may or may not appear; elements nobody
//! added are the read checker's business. A missing lost update proves only that this run
//! lost none (S16). Missing final state for a namespace makes the verdict `Unknown`.

use std::collections::BTreeSet;

use crate::final_state::FinalState;
use crate::history::{History, Op, OpKind, Outcome};
use crate::report::{Report, Stats};
use crate::violation::Violation;

/// Decodes a stored set: a JSON array (strings kept as they are, other elements in their
/// JSON spelling), or else comma-separated elements. Empty text is the empty set.
pub fn decode_set(text: &str) -> Result<BTreeSet<String>, String> {
    let text = text.trim();
    if text.starts_with('[') {
        let items: Vec<serde_json::Value> =
            serde_json::from_str(text).map_err(|e| format!("bad set {text:?}: {e}"))?;
        return Ok(items
            .into_iter()
            .map(|v| match v {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            })
            .collect());
    }
    Ok(text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect())
}

struct Add<'a> {
    op: &'a Op,
    lock: &'a str,
    key: &'a str,
    element: &'a str,
}

/// Checks that acknowledged adds survive to the final state and to later reads.
pub fn check(history: &History, final_state: &FinalState) -> Report {
    let mut stats = Stats::default();
    let mut violations = Vec::new();
    let mut undecided = false;

    let mut adds = Vec::new();
    for op in history.ops().iter().filter(|op| op.kind == OpKind::Add) {
        stats.count(op);
        match (op.lock.as_deref(), op.key.as_deref(), op.value.as_deref()) {
            (Some(lock), Some(key), Some(element)) if op.outcome == Outcome::Ok => adds.push(Add {
                op,
                lock,
                key,
                element,
            }),
            (Some(_), Some(_), Some(_)) => {}
            _ => stats.skipped += 1,
        }
    }

    for add in &adds {
        let Some(ns) = final_state.namespaces.get(add.lock) else {
            stats
                .notes
                .push(format!("no final state for namespace {}", add.lock));
            undecided = true;
            continue;
        };
        let set = match ns.values.get(add.key).map(|v| decode_set(v)) {
            None => BTreeSet::new(),
            Some(Ok(set)) => set,
            Some(Err(e)) => {
                stats
                    .notes
                    .push(format!("final {}/{}: {e}", add.lock, add.key));
                undecided = true;
                continue;
            }
        };
        if !set.contains(add.element) {
            violations.push(Violation::LostUpdate {
                lock: add.lock.to_owned(),
                key: add.key.to_owned(),
                element: add.element.to_owned(),
                op: add.op.clone(),
            });
        }
    }

    for read in history.ops().iter().filter(|op| op.kind == OpKind::ReadSet) {
        stats.count(read);
        if read.outcome != Outcome::Ok {
            continue;
        }
        let (Some(lock), Some(key)) = (read.lock.as_deref(), read.key.as_deref()) else {
            stats.skipped += 1;
            continue;
        };
        let set = match read.value.as_deref().map(decode_set) {
            None => BTreeSet::new(),
            Some(Ok(set)) => set,
            Some(Err(e)) => {
                stats.notes.push(format!("{read}: {e}"));
                stats.skipped += 1;
                continue;
            }
        };
        let before = adds
            .iter()
            .filter(|a| a.lock == lock && a.key == key && a.op.precedes(read));
        for add in before {
            if !set.contains(add.element) {
                violations.push(Violation::SetReadMissing {
                    element: add.element.to_owned(),
                    add: add.op.clone(),
                    read: read.clone(),
                });
            }
        }
    }
    stats.notes.sort();
    stats.notes.dedup();
    Report::new(violations, stats, undecided)
}

#[cfg(test)]
mod tests {
    use super::decode_set;

    #[test]
    fn sets_decode_from_json_or_commas() {
        let set = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
        assert_eq!(decode_set(r#"["a", 2, "b"]"#), Ok(set(&["a", "2", "b"])));
        assert_eq!(decode_set(" a, b ,,c"), Ok(set(&["a", "b", "c"])));
        assert_eq!(decode_set(""), Ok(set(&[])));
        assert!(decode_set("[1, 2").is_err());
    }
}
