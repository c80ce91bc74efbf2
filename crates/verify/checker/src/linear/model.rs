//! The sequential model of one namespace: a map of keys to values plus its high-water
//! mark, under the `epoch` gate policy.
//!
//! | call | allowed when | effect |
//! |---|---|---|
//! | write(k, v, e) acknowledged | e >= hw | hw := e, k := v |
//! | delete(k, e) acknowledged | e >= hw | hw := e, k := absent |
//! | fence(e) acknowledged | e >= hw | hw := e |
//! | refused `stale_token` with e | e < hw | none |
//! | read(k) returned v | k = v | none |
//! | final state (snapshot) s | state = s | none |
//!
//! Keys and values are interned to small integers so states hash quickly.

use crate::history::{Epoch, Time};

/// An interned value; [`ABSENT`] is a key with no value.
pub(crate) type Value = u32;
pub(crate) const ABSENT: Value = 0;

/// What one call asks of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Put (or, with [`ABSENT`], delete) guarded by `epoch`.
    Write {
        key: usize,
        value: Value,
        epoch: Epoch,
    },
    Fence {
        epoch: Epoch,
    },
    /// Refused by the gate: the mark must have been above `epoch`.
    Stale {
        epoch: Epoch,
    },
    Read {
        key: usize,
        value: Value,
    },
    /// The final state, read as one snapshot once everything else is over.
    Final(State),
}

/// Where a call came from, to report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// Index of the history op.
    Op(usize),
    Final,
}

/// One operation as the search sees it.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub effect: Effect,
    pub invoke: Time,
    /// `None` for an unknown outcome: it may take effect at any later instant, or never.
    pub end: Option<Time>,
    /// An unknown write of a value that no read (final reads included) ever returns.
    pub unobserved: bool,
    pub source: Source,
}

/// The namespace's state: its mark and the value of every key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct State {
    pub high_water: Epoch,
    pub values: Vec<Value>,
}

/// What [`State::step`] changed, so the search can step back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Undo {
    high_water: Epoch,
    slot: Option<(usize, Value)>,
}

impl State {
    pub(crate) fn new(keys: usize) -> State {
        State {
            high_water: 0,
            values: vec![ABSENT; keys],
        }
    }

    /// Applies `effect` if the model allows it in this state.
    pub(crate) fn step(&mut self, effect: &Effect) -> Option<Undo> {
        let undo = Undo {
            high_water: self.high_water,
            slot: None,
        };
        match *effect {
            Effect::Write { key, value, epoch } => {
                if epoch < self.high_water {
                    return None;
                }
                self.high_water = epoch;
                let old = std::mem::replace(&mut self.values[key], value);
                Some(Undo {
                    slot: Some((key, old)),
                    ..undo
                })
            }
            Effect::Fence { epoch } => {
                if epoch < self.high_water {
                    return None;
                }
                self.high_water = epoch;
                Some(undo)
            }
            Effect::Stale { epoch } => (epoch < self.high_water).then_some(undo),
            Effect::Read { key, value } => (self.values[key] == value).then_some(undo),
            Effect::Final(ref expected) => (self == expected).then_some(undo),
        }
    }

    pub(crate) fn undo(&mut self, undo: Undo) {
        self.high_water = undo.high_water;
        if let Some((key, old)) = undo.slot {
            self.values[key] = old;
        }
    }

    /// True when an unknown call, just stepped (`undo`), need never be placed here:
    /// leaving it out keeps every option open. That is so when the step changed nothing,
    /// or when it left the mark alone and only wrote a value nobody reads: until that key
    /// is overwritten no read may observe it, so every continuation of the state with the
    /// write is also a continuation of the state without it.
    pub(crate) fn pointless(&self, call: &Call, undo: &Undo) -> bool {
        let mark_kept = undo.high_water == self.high_water;
        mark_kept && (call.unobserved || undo.slot.is_none_or(|(key, old)| self.values[key] == old))
    }
}
