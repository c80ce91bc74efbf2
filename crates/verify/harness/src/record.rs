//! Recording: each worker writes its own history file; the harness merges them.
//!
//! A worker writes a line *before* every request (the operation as `info`: invoked, no
//! answer yet) and a second line with the same `seq` once the answer is in. The merge
//! keeps the last line per (process, seq). So a worker killed or stuck mid-request still
//! leaves its operation in the history as `info`, which the checkers read as "may or may
//! not have happened": an operation that reached the server is never missing from the
//! record, which would make correct runs look wrong.
//!
//! Each line is one `write` of a whole line to an unbuffered file, so a line is on disk
//! (in the page cache) before the request it describes is sent.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use palisade_checker::{History, Op, OpKind};
use serde::{Deserialize, Serialize};

use crate::clock::RunClock;
use crate::worker::CallError;
use crate::VerifyError;

/// One line of a worker's file: an [`Op`] plus the worker's own sequence number.
#[derive(Serialize, Deserialize)]
struct Line {
    seq: u64,
    #[serde(flatten)]
    op: Op,
}

/// An operation that has been invoked and recorded as `info`, awaiting its answer.
pub struct InFlight {
    seq: u64,
    /// The operation; fill in what the answer says (epoch, revision, value) before
    /// completing it.
    pub op: Op,
}

/// A worker's history file.
pub struct Recorder {
    file: File,
    path: PathBuf,
    process: u64,
    clock: RunClock,
    next_seq: u64,
}

impl Recorder {
    pub fn create(path: &Path, process: u64, clock: RunClock) -> Result<Recorder, VerifyError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| VerifyError::io(format!("cannot open {}", path.display()), e))?;
        Ok(Recorder {
            file,
            path: path.to_owned(),
            process,
            clock,
            next_seq: 0,
        })
    }

    pub fn clock(&self) -> RunClock {
        self.clock
    }

    /// Records the invocation of `kind` now; `fill` sets lock, key, value, epoch.
    pub fn invoke(
        &mut self,
        kind: OpKind,
        fill: impl FnOnce(Op) -> Op,
    ) -> Result<InFlight, VerifyError> {
        let op = fill(Op::new(self.process, kind, self.clock.now_us()));
        let flight = InFlight {
            seq: self.next_seq,
            op,
        };
        self.next_seq += 1;
        self.write(flight.seq, &flight.op)?;
        Ok(flight)
    }

    /// Acknowledged now.
    pub fn ok(&mut self, flight: InFlight) -> Result<(), VerifyError> {
        let op = flight.op.ok(self.clock.now_us());
        self.write(flight.seq, &op)
    }

    /// Definitely refused now with API error `code`.
    pub fn fail(&mut self, flight: InFlight, code: &str) -> Result<(), VerifyError> {
        let op = flight.op.fail(self.clock.now_us(), code);
        self.write(flight.seq, &op)
    }

    /// No usable answer: the outcome stays unknown. `note` says why.
    pub fn info(&mut self, flight: InFlight, note: &str) -> Result<(), VerifyError> {
        let mut op = flight.op.info();
        op.complete = Some(self.clock.now_us().max(op.invoke));
        op.error = Some(note.to_owned());
        self.write(flight.seq, &op)
    }

    /// Completes `flight` from a failed call: a definite refusal is `fail`; anything that
    /// may have taken effect unanswered is `info`: no answer (transport), an answer that
    /// cannot be read, a 5xx (a 503 `storage_failed` while etcd has no quorum says
    /// nothing about whether an earlier commit landed), or any refusal that followed an
    /// unanswered attempt on another node.
    pub(crate) fn error(&mut self, flight: InFlight, err: &CallError) -> Result<(), VerifyError> {
        if err.earlier_unanswered {
            let note = format!("{} (after an unanswered attempt)", err.code());
            self.info(flight, &note)
        } else if is_uncertain(&err.error) {
            self.info(flight, err.code())
        } else {
            self.fail(flight, err.code())
        }
    }

    fn write(&mut self, seq: u64, op: &Op) -> Result<(), VerifyError> {
        let mut text = serde_json::to_string(&Line {
            seq,
            op: op.clone(),
        })
        .map_err(|e| VerifyError::Internal(format!("cannot encode an op: {e}")))?;
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .map_err(|e| VerifyError::io(format!("cannot write {}", self.path.display()), e))
    }
}

/// True when a failed call may still have taken effect.
pub fn is_uncertain(err: &palisade_client::Error) -> bool {
    crate::worker::unanswered(err)
}

/// What merging found besides the operations.
#[derive(Debug, Default)]
pub struct MergeNotes {
    /// Lines that could not be parsed (a worker killed in the middle of a write).
    pub unreadable_lines: usize,
}

/// Reads every worker file, keeps the last line per (process, seq), adds `extra`
/// (restart markers), and orders everything by invocation time.
pub fn merge(files: &[PathBuf], extra: Vec<Op>) -> Result<(History, MergeNotes), VerifyError> {
    let mut latest: BTreeMap<(u64, u64), Op> = BTreeMap::new();
    let mut notes = MergeNotes::default();
    for path in files {
        let file = match File::open(path) {
            Ok(f) => f,
            // A worker that never started wrote nothing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(VerifyError::io(
                    format!("cannot read {}", path.display()),
                    e,
                ))
            }
        };
        for line in BufReader::new(file).lines() {
            let line =
                line.map_err(|e| VerifyError::io(format!("cannot read {}", path.display()), e))?;
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Line>(&line) {
                Ok(l) => {
                    latest.insert((l.op.process, l.seq), l.op);
                }
                Err(_) => notes.unreadable_lines += 1,
            }
        }
    }
    let mut ops: Vec<Op> = latest.into_values().chain(extra).collect();
    ops.sort_by_key(|op| (op.invoke, op.process));
    Ok((History::new(ops), notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_line_replaces_the_invoke_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w1.jsonl");
        let clock = RunClock::start();
        let mut rec = Recorder::create(&path, 1, clock).unwrap();
        let a = rec.invoke(OpKind::Acquire, |op| op.lock("l")).unwrap();
        let mut b = rec
            .invoke(OpKind::Write, |op| op.lock("l").key("k"))
            .unwrap();
        b.op.epoch = Some(3);
        rec.ok(b).unwrap();
        drop(a); // never answered: stays `info`
        let restart = Op::new(0, OpKind::Restart, 0);
        let (history, notes) = merge(&[path, dir.path().join("absent")], vec![restart]).unwrap();
        assert_eq!(notes.unreadable_lines, 0);
        let kinds: Vec<_> = history
            .ops()
            .iter()
            .map(|op| (op.kind, op.outcome))
            .collect();
        use palisade_checker::Outcome::*;
        assert_eq!(
            kinds,
            vec![
                (OpKind::Restart, Info),
                (OpKind::Acquire, Info),
                (OpKind::Write, Ok)
            ]
        );
        assert_eq!(history.ops()[2].epoch, Some(3));
    }
}
