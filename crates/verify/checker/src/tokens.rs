//! Tokens: the epochs the lock service granted are unique and increase in real time.
//!
//! For every lock, over the `ok` acquisitions (with the epoch they were granted):
//! - no two share an epoch;
//! - if acquisition A completed before acquisition B was invoked, epoch(A) < epoch(B).
//!
//! Both hold across server restarts (S4, S11): a restart marker between two acquisitions
//! changes nothing in the rule, it is only reported so a regression after a crash is easy
//! to spot.
//!
//! Not checked: concurrent acquisitions may get their epochs in either order, and an
//! `info` acquisition (granted or not, nobody knows) constrains nothing. Gaps in the
//! sequence are allowed; a grant the client never heard of still consumes an epoch.

use std::collections::{BTreeMap, HashMap};

use crate::history::{Epoch, History, Op, OpKind, Outcome};
use crate::order::{PrefixMax, Restarts};
use crate::report::{Report, Stats};
use crate::violation::Violation;

/// Checks uniqueness and real-time monotonicity of granted epochs, per lock.
pub fn check(history: &History) -> Report {
    let restarts = Restarts::of(history.ops());
    let mut stats = Stats::default();
    let mut by_lock: BTreeMap<&str, Vec<(&Op, Epoch)>> = BTreeMap::new();
    for op in history.ops().iter().filter(|op| op.kind == OpKind::Acquire) {
        stats.count(op);
        if op.outcome != Outcome::Ok {
            continue;
        }
        match (op.lock.as_deref(), op.epoch, op.end()) {
            (Some(lock), Some(epoch), Some(_)) => {
                by_lock.entry(lock).or_default().push((op, epoch))
            }
            _ => stats.skipped += 1,
        }
    }

    let mut violations = Vec::new();
    for (lock, mut grants) in by_lock {
        grants.sort_by_key(|&(op, _)| (op.invoke, op.index));
        let mut first_of: HashMap<Epoch, &Op> = HashMap::new();
        for &(op, epoch) in &grants {
            match first_of.get(&epoch) {
                Some(&first) => violations.push(Violation::ReusedEpoch {
                    lock: lock.to_owned(),
                    epoch,
                    first: first.clone(),
                    second: op.clone(),
                    restarts_between: restarts.between(first.invoke, op.invoke),
                }),
                None => {
                    first_of.insert(epoch, op);
                }
            }
        }

        let granted = PrefixMax::new(
            grants
                .iter()
                .filter_map(|&(op, epoch)| op.end().map(|end| (end, epoch, op)))
                .collect(),
        );
        for &(later, epoch) in &grants {
            match granted.before(later.invoke) {
                // Equal epochs are already reported as reuse.
                Some((max, earlier)) if max > epoch => {
                    violations.push(Violation::EpochNotIncreasing {
                        lock: lock.to_owned(),
                        earlier: earlier.clone(),
                        later: later.clone(),
                        restarts_between: restarts
                            .between(earlier.end().unwrap_or(earlier.invoke), later.invoke),
                    })
                }
                _ => {}
            }
        }
    }
    Report::new(violations, stats, false)
}
