//! The history of a run, in the checker's format ([`palisade_checker::Op`]).
//!
//! Times are the virtual clock in milliseconds, the one clock every client shares, so
//! real-time order between operations of different clients is exact. An operation is
//! invoked when its request leaves the client (after any pause between decision and
//! send) and completes when the client *processes* the answer (a client paused while the
//! answer arrived completes it when it resumes).

use palisade_checker::{FinalState, History, NamespaceState, Op, OpKind, Outcome};

use crate::net::Reply;
use crate::scenario::all_locks;
use crate::store::Records;

/// The process number of restart markers.
pub(crate) const NODE_PROCESS: u64 = 1_000;

#[derive(Debug, Default)]
pub(crate) struct Recorder {
    ops: Vec<Op>,
}

impl Recorder {
    /// Starts an operation; returns its handle.
    pub(crate) fn invoke(&mut self, op: Op) -> usize {
        self.ops.push(op);
        self.ops.len() - 1
    }

    /// The client gave up waiting: the outcome is unknown.
    pub(crate) fn info(&mut self, id: usize, now: u64, why: &str) {
        let op = &mut self.ops[id];
        op.outcome = Outcome::Info;
        op.complete = Some(now);
        op.error = Some(why.to_owned());
    }

    /// The client processed `reply` at `now`.
    pub(crate) fn complete(&mut self, id: usize, now: u64, reply: &Reply) {
        let op = &mut self.ops[id];
        op.complete = Some(now);
        op.outcome = Outcome::Ok;
        match reply {
            Reply::Granted { epoch, .. } => op.epoch = Some(*epoch),
            Reply::Applied { revision, epoch } => {
                op.revision = Some(*revision);
                op.returned_epoch = Some(*epoch);
            }
            Reply::Value(value) => op.value = value.clone(),
            Reply::LeaseOk => {}
            Reply::Held => Self::refuse(op, "lock_held"),
            Reply::LeaseExpired => Self::refuse(op, "lease_expired"),
            Reply::Refused(code) => Self::refuse(op, code),
        }
    }

    fn refuse(op: &mut Op, code: &str) {
        op.outcome = Outcome::Fail;
        op.error = Some(code.to_owned());
    }

    pub(crate) fn restart(&mut self, now: u64) {
        self.ops
            .push(Op::new(NODE_PROCESS, OpKind::Restart, now).ok(now));
    }

    pub(crate) fn finish(self) -> History {
        History::new(self.ops)
    }
}

/// The store as read once everything stopped: every namespace of the run, used or not.
pub(crate) fn final_state(records: &Records) -> FinalState {
    let mut end = FinalState::default();
    for lock in all_locks() {
        let state = records
            .namespaces
            .get(lock)
            .map(|ns| NamespaceState {
                high_water: ns.high_water.epoch,
                values: ns.values.clone(),
            })
            .unwrap_or_default();
        end.namespaces.insert(lock.to_owned(), state);
    }
    end
}
