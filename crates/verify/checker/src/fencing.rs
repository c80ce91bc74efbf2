//! Fencing safety: each namespace's accepted mutations respect the high-water rule.
//!
//! Mutations are `write`, `delete`, `fence` and lock-set `add`. Per namespace:
//! - **Revision order** (S5): ordered by the store revision they returned, accepted
//!   mutations never go back in epoch. A fence reporting revision `r` sits after the
//!   mutation of revision `r` and before `r + 1`; a fence without a revision is left to
//!   the real-time rule.
//! - **Real time** (S5, S6): no mutation is accepted with an epoch below that of an
//!   accepted mutation which *completed before it was invoked* ("stale accepted").
//! - **Rejections**: a `stale_token` refusal is justified only if some mutation with a
//!   larger epoch (acknowledged or unknown) was invoked before the refusal completed.
//! - Every accepted mutation carried an epoch (S12), the store echoed that epoch, and no
//!   store revision was handed to two different mutations.
//!
//! What it cannot see: an old-epoch write that *overlaps* the first write of a newer epoch
//! may be accepted legitimately (S10), so it is not flagged; lock acquisitions are not
//! used at all, because issuing an epoch does not tell the store (S10). Namespaces are
//! assumed to start fresh (mark 0) when the history begins. The `sequence` policy is not
//! modelled: equal epochs are always allowed (S8).

use std::collections::{BTreeMap, HashMap};

use crate::history::{Epoch, History, Op, OpKind, Outcome};
use crate::order::PrefixMax;
use crate::report::{Report, Stats};
use crate::violation::Violation;

/// Checks the high-water rule on every namespace's accepted mutations.
pub fn check(history: &History) -> Report {
    let mut stats = Stats::default();
    let mut violations = Vec::new();
    let mut by_ns: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history.ops().iter().filter(|op| op.kind.is_mutation()) {
        stats.count(op);
        match op.lock.as_deref() {
            Some(ns) => by_ns.entry(ns).or_default().push(op),
            None => stats.skipped += 1,
        }
    }
    duplicate_revisions(history, &mut violations);

    for (ns, ops) in by_ns {
        let mut accepted: Vec<(&Op, Epoch)> = Vec::new();
        for &op in ops.iter().filter(|op| op.outcome == Outcome::Ok) {
            match op.epoch {
                None => violations.push(Violation::Unfenced { op: op.clone() }),
                Some(epoch) => {
                    if op.returned_epoch.is_some_and(|r| r != epoch) {
                        violations.push(Violation::EpochMismatch { op: op.clone() });
                    }
                    accepted.push((op, epoch));
                }
            }
        }
        revision_order(ns, &accepted, &mut violations, &mut stats);
        stale_accepted(ns, &accepted, &mut violations);
        unjustified_rejections(ns, &ops, &mut violations);
    }
    Report::new(violations, stats, false)
}

fn revision_order(
    ns: &str,
    accepted: &[(&Op, Epoch)],
    violations: &mut Vec<Violation>,
    stats: &mut Stats,
) {
    let mut ordered: Vec<(u64, bool, Epoch, &Op)> = Vec::new();
    let mut unordered = 0;
    for &(op, epoch) in accepted {
        let fence = op.kind == OpKind::Fence;
        match op.revision {
            // Fences sharing a revision could have run in any order: try the kindest.
            Some(rev) => ordered.push((rev, fence, if fence { epoch } else { 0 }, op)),
            None if fence => {}
            None => unordered += 1,
        }
    }
    if unordered > 0 {
        stats.notes.push(format!(
            "{ns}: {unordered} accepted mutation(s) without a revision left out of the revision-order check"
        ));
    }
    ordered.sort_by_key(|&(rev, fence, key, op)| (rev, fence, key, op.index));
    let mut max: Option<(Epoch, &Op)> = None;
    for &(_, _, _, op) in &ordered {
        let epoch = op.epoch.unwrap_or(0);
        match max {
            Some((m, before)) if epoch < m => violations.push(Violation::EpochRegression {
                namespace: ns.to_owned(),
                before: before.clone(),
                after: op.clone(),
            }),
            Some((m, _)) if m == epoch => {}
            _ => max = Some((epoch, op)),
        }
    }
}

fn stale_accepted(ns: &str, accepted: &[(&Op, Epoch)], violations: &mut Vec<Violation>) {
    let established = PrefixMax::new(
        accepted
            .iter()
            .filter_map(|&(op, epoch)| op.end().map(|end| (end, epoch, op)))
            .collect(),
    );
    for &(op, epoch) in accepted {
        match established.before(op.invoke) {
            Some((mark, by)) if mark > epoch => violations.push(Violation::StaleAccepted {
                namespace: ns.to_owned(),
                op: op.clone(),
                established_by: by.clone(),
            }),
            _ => {}
        }
    }
}

fn unjustified_rejections(ns: &str, ops: &[&Op], violations: &mut Vec<Violation>) {
    // Anything acknowledged or unknown may have moved the mark once invoked.
    let may_count = |op: &&&Op| op.outcome != Outcome::Fail;
    let possible = PrefixMax::new(
        ops.iter()
            .filter(may_count)
            .filter_map(|&op| op.epoch.map(|e| (op.invoke, e, op)))
            .collect(),
    );
    // A mutation of unknown epoch might have raised the mark to anything.
    let blind_from = ops
        .iter()
        .filter(may_count)
        .filter(|op| op.epoch.is_none())
        .map(|op| op.invoke)
        .min();
    for &op in ops.iter().filter(|op| op.is_stale_rejection()) {
        let (Some(epoch), Some(end)) = (op.epoch, op.end()) else {
            continue;
        };
        if blind_from.is_some_and(|t| t <= end) {
            continue;
        }
        let max = possible.up_to(end).map_or(0, |(m, _)| m);
        if max <= epoch {
            violations.push(Violation::UnjustifiedRejection {
                namespace: ns.to_owned(),
                op: op.clone(),
                max_possible_high_water: max,
            });
        }
    }
}

/// Store revisions are global: two different acknowledged puts or deletes never share
/// one. Fences report the current revision and may share it; idempotent replays return
/// the first answer, so an identical mutation may repeat it.
fn duplicate_revisions(history: &History, violations: &mut Vec<Violation>) {
    let mut first_of: HashMap<u64, &Op> = HashMap::new();
    let mutations = history.ops().iter().filter(|op| {
        op.kind.is_mutation() && op.kind != OpKind::Fence && op.outcome == Outcome::Ok
    });
    for op in mutations {
        let Some(rev) = op.revision else { continue };
        match first_of.get(&rev) {
            None => {
                first_of.insert(rev, op);
            }
            Some(&first) if !same_mutation(first, op) => {
                violations.push(Violation::DuplicateRevision {
                    revision: rev,
                    first: first.clone(),
                    second: op.clone(),
                })
            }
            Some(_) => {}
        }
    }
}

fn same_mutation(a: &Op, b: &Op) -> bool {
    (a.kind, &a.lock, &a.key, &a.value, a.epoch) == (b.kind, &b.lock, &b.key, &b.value, b.epoch)
}
