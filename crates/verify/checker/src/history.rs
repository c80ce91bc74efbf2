//! The recorded history: one [`Op`] per line of JSON, plus the [`FinalState`](crate::FinalState) read at the
//! end of a run.
//!
//! A recorder (the workload driver) writes one line per operation *after* it finished,
//! with both its invocation and completion time taken from one monotonic clock (any unit,
//! ns or µs, but the same for every line). Lines may appear in any order; checkers sort
//! what they need. Unknown fields are ignored, so recorders may add their own.
//!
//! ## Fields
//! | field | type | meaning |
//! |---|---|---|
//! | `process` | integer | worker id (default 0) |
//! | `kind` | string | `acquire`, `release`, `read`, `write`, `delete`, `fence`, `read_set`, `add`, `restart` |
//! | `lock` | string | the lock, which is also the store namespace it guards |
//! | `key` | string | store key |
//! | `value` | string | value written, value read (absent: key missing), or lock-set element |
//! | `epoch` | integer | token epoch carried by a mutation, or granted to an acquire |
//! | `invoke` | integer | clock reading when the request was sent |
//! | `complete` | integer | clock reading when the answer arrived (required for `ok`, `fail`) |
//! | `outcome` | string | `ok`, `fail` or `info` |
//! | `error` | string | API error code of a `fail` (`stale_token`, ...) |
//! | `revision` | integer | store revision an accepted mutation returned (fences: optional) |
//! | `returned_epoch` | integer | epoch the store echoed for an accepted mutation |
//!
//! Only `kind`, `invoke` and `outcome` are always required.
//!
//! ## Outcomes
//! - `ok`: the server acknowledged the operation; it took effect exactly once, somewhere
//!   between `invoke` and `complete`.
//! - `fail`: the server answered with a definite refusal (`error` holds the API code, e.g.
//!   `stale_token`); it had no effect.
//! - `info`: no answer (timeout, connection dropped, server killed). It may have taken
//!   effect at any instant after `invoke`, even after `complete`, or never. A `complete`
//!   time on an `info` line is only when the recorder gave up; checkers ignore it.
//!
//! ## Conventions
//! - The store namespace of a mutation is the lock that guards it, so `lock` names both.
//! - A read of a missing key is `ok` without `value` (a `fail` with `not_found` is read
//!   the same way).
//! - `kind: restart` lines mark a server restart at `invoke`; they carry no other data.
//! - Lock-set `add` lines carry the element in `value`; `read_set` lines carry the set as
//!   read, encoded like the stored value (see [`crate::lockset::decode_set`]).

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

/// An ownership generation, as issued by the lock service.
pub type Epoch = u64;
/// A reading of the recorder's monotonic clock.
pub type Time = u64;

/// What an operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// Acquire a lock; `epoch` is the epoch granted.
    Acquire,
    /// Release a lock.
    Release,
    /// Read `key` of namespace `lock`; `value` is what was read.
    Read,
    /// Put `value` at `key` with token `epoch`.
    Write,
    /// Delete `key` with token `epoch`.
    Delete,
    /// Barrier: establish `epoch` as the namespace's mark without writing data.
    Fence,
    /// Lock-set workload: read the set stored at `key`.
    ReadSet,
    /// Lock-set workload: write back the set plus element `value`.
    Add,
    /// Marker: the server restarted at `invoke`.
    Restart,
}

impl OpKind {
    /// Operations that pass the namespace's gate and may move its high-water mark.
    pub fn is_mutation(self) -> bool {
        matches!(
            self,
            OpKind::Write | OpKind::Delete | OpKind::Fence | OpKind::Add
        )
    }

    /// The JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Acquire => "acquire",
            OpKind::Release => "release",
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Delete => "delete",
            OpKind::Fence => "fence",
            OpKind::ReadSet => "read_set",
            OpKind::Add => "add",
            OpKind::Restart => "restart",
        }
    }
}

/// How an operation ended, as far as the client could tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    Fail,
    Info,
}

/// The error code of a write refused because its epoch is below the high-water mark.
pub const STALE_TOKEN: &str = palisade_api::ErrorCode::StaleToken.as_str();

/// One operation of the history (one JSON line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Position in the history, assigned by [`History::new`]. Written out so reports can
    /// point at operations; never read back (a line's position decides).
    #[serde(skip_deserializing)]
    pub index: usize,
    /// The worker that ran it.
    #[serde(default)]
    pub process: u64,
    pub kind: OpKind,
    /// The lock, which is also the store namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Written value, read value, or lock-set element.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Token epoch carried (mutations) or granted (acquire).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<Epoch>,
    pub invoke: Time,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete: Option<Time>,
    pub outcome: Outcome,
    /// API error code of a `fail` (e.g. `stale_token`), or a note on an `info`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Store revision returned by an accepted mutation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// Epoch the store reported back for an accepted mutation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returned_epoch: Option<Epoch>,
}

impl Op {
    /// A new operation invoked at `at`, not yet completed (`info` until told otherwise).
    pub fn new(process: u64, kind: OpKind, at: Time) -> Op {
        Op {
            index: 0,
            process,
            kind,
            lock: None,
            key: None,
            value: None,
            epoch: None,
            invoke: at,
            complete: None,
            outcome: Outcome::Info,
            error: None,
            revision: None,
            returned_epoch: None,
        }
    }
    pub fn lock(mut self, lock: &str) -> Op {
        self.lock = Some(lock.to_owned());
        self
    }
    pub fn key(mut self, key: &str) -> Op {
        self.key = Some(key.to_owned());
        self
    }
    pub fn value(mut self, value: &str) -> Op {
        self.value = Some(value.to_owned());
        self
    }
    pub fn epoch(mut self, epoch: Epoch) -> Op {
        self.epoch = Some(epoch);
        self
    }
    pub fn revision(mut self, revision: u64) -> Op {
        self.revision = Some(revision);
        self
    }
    /// Acknowledged at `at`.
    pub fn ok(mut self, at: Time) -> Op {
        self.outcome = Outcome::Ok;
        self.complete = Some(at);
        self
    }
    /// Refused at `at` with API error `code`.
    pub fn fail(mut self, at: Time, code: &str) -> Op {
        self.outcome = Outcome::Fail;
        self.complete = Some(at);
        self.error = Some(code.to_owned());
        self
    }
    /// No answer: the outcome is unknown.
    pub fn info(mut self) -> Op {
        self.outcome = Outcome::Info;
        self
    }

    /// When the operation certainly had taken effect (or certainly never would): the
    /// completion of an `ok` or `fail`. `None` for `info`, which stays open forever.
    pub fn end(&self) -> Option<Time> {
        match self.outcome {
            Outcome::Ok | Outcome::Fail => self.complete,
            Outcome::Info => None,
        }
    }

    /// True when `self` finished before `other` was invoked (real-time order).
    pub fn precedes(&self, other: &Op) -> bool {
        self.end().is_some_and(|end| end < other.invoke)
    }

    /// A refusal by the gate: the epoch was below the mark when the op was applied.
    pub fn is_stale_rejection(&self) -> bool {
        self.outcome == Outcome::Fail && self.error.as_deref() == Some(STALE_TOKEN)
    }
}

/// Why a history could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("line {line}: {source}")]
    Json {
        line: usize,
        source: serde_json::Error,
    },
    #[error("line {line}: {reason}")]
    Invalid { line: usize, reason: String },
}

/// A recorded history: operations in recording order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    ops: Vec<Op>,
}

impl History {
    /// Wraps operations, numbering them by position (`Op::index`).
    pub fn new(mut ops: Vec<Op>) -> History {
        for (i, op) in ops.iter_mut().enumerate() {
            op.index = i;
        }
        History { ops }
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Reads JSON lines (blank lines skipped) and checks each line is well formed.
    pub fn from_jsonl(reader: impl BufRead) -> Result<History, HistoryError> {
        let mut ops = Vec::new();
        for (n, line) in reader.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let op: Op = serde_json::from_str(&line).map_err(|source| HistoryError::Json {
                line: n + 1,
                source,
            })?;
            validate(&op).map_err(|reason| HistoryError::Invalid {
                line: n + 1,
                reason,
            })?;
            ops.push(op);
        }
        Ok(History::new(ops))
    }

    /// Writes one JSON object per line.
    pub fn to_jsonl(&self, mut writer: impl Write) -> Result<(), HistoryError> {
        for (n, op) in self.ops.iter().enumerate() {
            serde_json::to_writer(&mut writer, op).map_err(|source| HistoryError::Json {
                line: n + 1,
                source,
            })?;
            writer.write_all(b"\n")?;
        }
        Ok(())
    }

    /// Latest timestamp mentioned anywhere in the history.
    pub fn last_time(&self) -> Time {
        let ends = self.ops.iter().map(|op| op.complete.unwrap_or(op.invoke));
        ends.chain(self.ops.iter().map(|op| op.invoke))
            .max()
            .unwrap_or(0)
    }
}

fn validate(op: &Op) -> Result<(), String> {
    if op.outcome != Outcome::Info && op.complete.is_none() {
        return Err(format!("an `{:?}` op needs `complete`", op.outcome).to_lowercase());
    }
    if op.complete.is_some_and(|c| c < op.invoke) {
        return Err("`complete` is before `invoke`".into());
    }
    Ok(())
}
