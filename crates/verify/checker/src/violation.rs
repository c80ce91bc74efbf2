//! Every kind of violation a checker can report, with the operations that show it.

use std::fmt;

use serde::Serialize;

use crate::final_state::NamespaceState;
use crate::history::{Epoch, Op};

/// One observed breach of a guarantee. Each variant carries the operations involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Violation {
    /// Two successful acquisitions of one lock were granted the same epoch (S4).
    ReusedEpoch {
        lock: String,
        epoch: Epoch,
        first: Op,
        second: Op,
        restarts_between: usize,
    },
    /// `earlier` was granted before `later` was even asked for, yet its epoch is larger
    /// (S4). `restarts_between` counts server restarts in between.
    EpochNotIncreasing {
        lock: String,
        earlier: Op,
        later: Op,
        restarts_between: usize,
    },
    /// A mutation was accepted without a token epoch (S12).
    Unfenced { op: Op },
    /// The store acknowledged a mutation with another epoch than the token carried.
    EpochMismatch { op: Op },
    /// Two different mutations were acknowledged with the same store revision.
    DuplicateRevision {
        revision: u64,
        first: Op,
        second: Op,
    },
    /// In store-revision order the namespace accepted `after` with a smaller epoch than
    /// `before`, accepted earlier: the mark went backwards (S5).
    EpochRegression {
        namespace: String,
        before: Op,
        after: Op,
    },
    /// `op` was accepted although `established_by`, accepted and completed before `op`
    /// was invoked, had already raised the mark above `op`'s epoch (S5, S6).
    StaleAccepted {
        namespace: String,
        op: Op,
        established_by: Op,
    },
    /// `op` was refused as stale, but no mutation that could have been accepted before it
    /// carried a larger epoch: the mark could not have been above its epoch.
    UnjustifiedRejection {
        namespace: String,
        op: Op,
        /// The largest epoch any mutation invoked before `op` completed carried.
        max_possible_high_water: Epoch,
    },
    /// No order of the namespace's operations consistent with real time explains the
    /// results. `linearized` is the longest explainable prefix (op indices), `state` the
    /// model state after it, `stuck` the operations none of which could come next.
    NotLinearizable {
        namespace: String,
        linearized: Vec<usize>,
        state: String,
        stuck: Vec<Pending>,
    },
    /// An acknowledged lock-set add whose element is missing from the final set.
    LostUpdate {
        lock: String,
        key: String,
        element: String,
        op: Op,
    },
    /// A set read missed `element`, whose add was acknowledged before the read began.
    SetReadMissing { element: String, add: Op, read: Op },
    /// A value was read that no write (acknowledged or unknown) ever wrote there.
    /// `read` is `None` when the value was seen in the final state.
    NeverWritten {
        lock: String,
        key: String,
        value: String,
        read: Option<Op>,
    },
    /// A value was read before any write of it had been invoked.
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

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::ReusedEpoch {
                lock,
                epoch,
                first,
                second,
                restarts_between,
            } => write!(
                f,
                "lock {lock}: epoch {epoch} granted twice ({restarts_between} restart(s) between): {first} / {second}"
            ),
            Violation::EpochNotIncreasing {
                lock,
                earlier,
                later,
                restarts_between,
            } => write!(
                f,
                "lock {lock}: epoch went backwards ({restarts_between} restart(s) between): {earlier} then {later}"
            ),
            Violation::Unfenced { op } => write!(f, "mutation accepted without a token: {op}"),
            Violation::EpochMismatch { op } => write!(
                f,
                "store acknowledged epoch {:?} for a token of epoch {:?}: {op}",
                op.returned_epoch, op.epoch
            ),
            Violation::DuplicateRevision {
                revision,
                first,
                second,
            } => write!(f, "revision {revision} returned to two mutations: {first} / {second}"),
            Violation::EpochRegression {
                namespace,
                before,
                after,
            } => write!(
                f,
                "namespace {namespace}: epoch went backwards in revision order: {before} then {after}"
            ),
            Violation::StaleAccepted {
                namespace,
                op,
                established_by,
            } => write!(
                f,
                "namespace {namespace}: stale mutation accepted: {op} after {established_by} had completed"
            ),
            Violation::UnjustifiedRejection {
                namespace,
                op,
                max_possible_high_water,
            } => write!(
                f,
                "namespace {namespace}: refused as stale though the mark could be at most {max_possible_high_water}: {op}"
            ),
            Violation::NotLinearizable {
                namespace,
                linearized,
                state,
                stuck,
            } => {
                write!(
                    f,
                    "namespace {namespace}: not linearizable; after {} op(s) (state {state}) none of these fits:",
                    linearized.len()
                )?;
                for p in stuck {
                    write!(f, " [{p}]")?;
                }
                Ok(())
            }
            Violation::LostUpdate {
                lock,
                key,
                element,
                op,
            } => write!(
                f,
                "lock-set {lock}/{key}: acknowledged element {element:?} missing from the final set: {op}"
            ),
            Violation::SetReadMissing { element, add, read } => write!(
                f,
                "set read missed element {element:?} acknowledged before it began: {add} then {read}"
            ),
            Violation::NeverWritten {
                lock,
                key,
                value,
                read: Some(read),
            } => write!(f, "{lock}/{key}: read {value:?}, never written: {read}"),
            Violation::NeverWritten {
                lock,
                key,
                value,
                read: None,
            } => write!(f, "{lock}/{key}: final state holds {value:?}, never written"),
            Violation::ReadFromFuture { read, write } => write!(
                f,
                "read a value before its only writes were invoked: {read}, written by {write}"
            ),
        }
    }
}
