//! Every kind of violation a checker can report, with the operations that show it.

use std::fmt;

use serde::Serialize;

use crate::final_state::NamespaceState;
use crate::history::{Epoch, Op};

/// One observed breach of a guarantee. Each variant carries the operations involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Violation {
    /// Two successful acquisitions of one lock were granted the same epoch (S4).
    #[error("lock {lock}: epoch {epoch} granted twice ({restarts_between} restart(s) between): {first} / {second}")]
    ReusedEpoch {
        lock: String,
        epoch: Epoch,
        first: Op,
        second: Op,
        restarts_between: usize,
    },
    /// `earlier` was granted before `later` was even asked for, yet its epoch is larger
    /// (S4). `restarts_between` counts server restarts in between.
    #[error("lock {lock}: epoch went backwards ({restarts_between} restart(s) between): {earlier} then {later}")]
    EpochNotIncreasing {
        lock: String,
        earlier: Op,
        later: Op,
        restarts_between: usize,
    },
    /// A mutation was accepted without a token epoch (S12).
    #[error("mutation accepted without a token: {op}")]
    Unfenced { op: Op },
    /// The store acknowledged a mutation with another epoch than the token carried.
    #[error("store acknowledged epoch {:?} for a token of epoch {:?}: {op}", .op.returned_epoch, .op.epoch)]
    EpochMismatch { op: Op },
    /// Two different mutations were acknowledged with the same store revision.
    #[error("revision {revision} returned to two mutations: {first} / {second}")]
    DuplicateRevision {
        revision: u64,
        first: Op,
        second: Op,
    },
    /// In store-revision order the namespace accepted `after` with a smaller epoch than
    /// `before`, accepted earlier: the mark went backwards (S5).
    #[error(
        "namespace {namespace}: epoch went backwards in revision order: {before} then {after}"
    )]
    EpochRegression {
        namespace: String,
        before: Op,
        after: Op,
    },
    /// `op` was accepted although `established_by`, accepted and completed before `op`
    /// was invoked, had already raised the mark above `op`'s epoch (S5, S6).
    #[error(
        "namespace {namespace}: stale mutation accepted: {op} after {established_by} had completed"
    )]
    StaleAccepted {
        namespace: String,
        op: Op,
        established_by: Op,
    },
    /// `op` was refused as stale, but no mutation that could have been accepted before it
    /// carried a larger epoch: the mark could not have been above its epoch.
    #[error("namespace {namespace}: refused as stale though the mark could be at most {max_possible_high_water}: {op}")]
    UnjustifiedRejection {
        namespace: String,
        op: Op,
        /// The largest epoch any mutation invoked before `op` completed carried.
        max_possible_high_water: Epoch,
    },
    /// No order of the namespace's operations consistent with real time explains the
    /// results. `linearized` is the longest explainable prefix (op indices), `state` the
    /// model state after it, `stuck` the operations none of which could come next.
    #[error("namespace {namespace}: not linearizable; after {} op(s) (state {state}) none of these fits:{}", .linearized.len(), Bracketed(.stuck))]
    NotLinearizable {
        namespace: String,
        linearized: Vec<usize>,
        state: String,
        stuck: Vec<Pending>,
    },
    /// An acknowledged lock-set add whose element is missing from the final set.
    #[error(
        "lock-set {lock}/{key}: acknowledged element {element:?} missing from the final set: {op}"
    )]
    LostUpdate {
        lock: String,
        key: String,
        element: String,
        op: Op,
    },
    /// A set read missed `element`, whose add was acknowledged before the read began.
    #[error("set read missed element {element:?} acknowledged before it began: {add} then {read}")]
    SetReadMissing { element: String, add: Op, read: Op },
    /// A value was read that no write (acknowledged or unknown) ever wrote there.
    /// `read` is `None` when the value was seen in the final state.
    #[error("{lock}/{key}: {}", NeverWrittenAt(.value, .read))]
    NeverWritten {
        lock: String,
        key: String,
        value: String,
        read: Option<Op>,
    },
    /// A value was read before any write of it had been invoked.
    #[error("read a value before its only writes were invoked: {read}, written by {write}")]
    ReadFromFuture { read: Op, write: Op },
}

/// An operation the linearizability search could not place next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pending {
    Op(Op),
    /// The namespace's recorded final state, checked as one snapshot after everything.
    Final(NamespaceState),
}

impl fmt::Display for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pending::Op(op) => write!(f, "{op}"),
            Pending::Final(state) => {
                write!(f, "final state: high-water {}", state.high_water)?;
                for (key, value) in &state.values {
                    write!(f, ", {key}={value:?}")?;
                }
                Ok(())
            }
        }
    }
}

/// The operations none of which could come next, each as ` [op]`.
struct Bracketed<'a>(&'a [Pending]);

impl fmt::Display for Bracketed<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|p| write!(f, " [{p}]"))
    }
}

/// Where a never-written value was seen: by a read, or in the final state.
struct NeverWrittenAt<'a>(&'a str, &'a Option<Op>);

impl fmt::Display for NeverWrittenAt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            Some(read) => write!(f, "read {:?}, never written: {read}", self.0),
            None => write!(f, "final state holds {:?}, never written", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::OpKind;

    fn op(index: usize, epoch: Option<Epoch>) -> Op {
        let mut op = Op::new(1, OpKind::Acquire, 5);
        op.index = index;
        op.lock = Some("l".into());
        op.epoch = epoch;
        op
    }

    fn all() -> Vec<Violation> {
        let mut mismatched = op(4, Some(3));
        mismatched.returned_epoch = Some(2);
        let state = NamespaceState {
            high_water: 7,
            values: [("k".to_owned(), "v".to_owned())].into_iter().collect(),
        };
        vec![
            Violation::ReusedEpoch {
                lock: "l".into(),
                epoch: 3,
                first: op(1, Some(3)),
                second: op(2, Some(3)),
                restarts_between: 1,
            },
            Violation::EpochNotIncreasing {
                lock: "l".into(),
                earlier: op(1, Some(4)),
                later: op(2, Some(3)),
                restarts_between: 0,
            },
            Violation::Unfenced { op: op(3, None) },
            Violation::EpochMismatch { op: mismatched },
            Violation::DuplicateRevision {
                revision: 9,
                first: op(1, None),
                second: op(2, None),
            },
            Violation::EpochRegression {
                namespace: "n".into(),
                before: op(1, Some(4)),
                after: op(2, Some(3)),
            },
            Violation::StaleAccepted {
                namespace: "n".into(),
                op: op(2, Some(3)),
                established_by: op(1, Some(4)),
            },
            Violation::UnjustifiedRejection {
                namespace: "n".into(),
                op: op(2, Some(3)),
                max_possible_high_water: 2,
            },
            Violation::NotLinearizable {
                namespace: "n".into(),
                linearized: vec![0, 1],
                state: "s".into(),
                stuck: vec![Pending::Op(op(2, None)), Pending::Final(state)],
            },
            Violation::NotLinearizable {
                namespace: "n".into(),
                linearized: vec![],
                state: "s".into(),
                stuck: vec![],
            },
            Violation::LostUpdate {
                lock: "l".into(),
                key: "k".into(),
                element: "e".into(),
                op: op(1, None),
            },
            Violation::SetReadMissing {
                element: "e".into(),
                add: op(1, None),
                read: op(2, None),
            },
            Violation::NeverWritten {
                lock: "l".into(),
                key: "k".into(),
                value: "v".into(),
                read: Some(op(2, None)),
            },
            Violation::NeverWritten {
                lock: "l".into(),
                key: "k".into(),
                value: "v".into(),
                read: None,
            },
            Violation::ReadFromFuture {
                read: op(2, None),
                write: op(3, None),
            },
        ]
    }

    /// The messages reports and logs show, one per variant (kept word for word when the
    /// formatting moved to `#[error]` attributes).
    #[test]
    fn messages() {
        let expected = [
            "lock l: epoch 3 granted twice (1 restart(s) between): #1 p1 acquire l e3 [5..] info / #2 p1 acquire l e3 [5..] info",
            "lock l: epoch went backwards (0 restart(s) between): #1 p1 acquire l e4 [5..] info then #2 p1 acquire l e3 [5..] info",
            "mutation accepted without a token: #3 p1 acquire l [5..] info",
            "store acknowledged epoch Some(2) for a token of epoch Some(3): #4 p1 acquire l e3 [5..] info",
            "revision 9 returned to two mutations: #1 p1 acquire l [5..] info / #2 p1 acquire l [5..] info",
            "namespace n: epoch went backwards in revision order: #1 p1 acquire l e4 [5..] info then #2 p1 acquire l e3 [5..] info",
            "namespace n: stale mutation accepted: #2 p1 acquire l e3 [5..] info after #1 p1 acquire l e4 [5..] info had completed",
            "namespace n: refused as stale though the mark could be at most 2: #2 p1 acquire l e3 [5..] info",
            "namespace n: not linearizable; after 2 op(s) (state s) none of these fits: [#2 p1 acquire l [5..] info] [final state: high-water 7, k=\"v\"]",
            "namespace n: not linearizable; after 0 op(s) (state s) none of these fits:",
            "lock-set l/k: acknowledged element \"e\" missing from the final set: #1 p1 acquire l [5..] info",
            "set read missed element \"e\" acknowledged before it began: #1 p1 acquire l [5..] info then #2 p1 acquire l [5..] info",
            "l/k: read \"v\", never written: #2 p1 acquire l [5..] info",
            "l/k: final state holds \"v\", never written",
            "read a value before its only writes were invoked: #2 p1 acquire l [5..] info, written by #3 p1 acquire l [5..] info",
        ];
        let got: Vec<String> = all().iter().map(ToString::to_string).collect();
        assert_eq!(got, expected);
    }
}
