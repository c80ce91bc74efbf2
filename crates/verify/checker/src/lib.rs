//! # Checker: judging a recorded history of a Palisade run
//!
//! The verification suite runs workers against real servers while it injects faults
//! (pauses, kills, restarts, partitions) and records every operation with its invocation
//! and completion time and what came back ([`History`], one JSON line per [`Op`]), then
//! reads the store once at the end ([`FinalState`]). This crate only *judges* such a
//! record: it runs nothing, talks to no server and reads no clock except to bound its
//! own search time. It can judge any history in this format, from any implementation.
//!
//! ## The checkers and what each proves about the history
//! - [`tokens`]: per lock, granted epochs are unique and increase in real-time order of
//!   acquisition, across restarts (S1, S4, S11).
//! - [`fencing`]: per namespace, accepted mutations never go back in epoch in store
//!   revision order, none is accepted below a mark established by a mutation that
//!   completed before it was invoked, every accepted mutation carried a token, and every
//!   stale refusal was justified (S5, S6, S8, S12).
//! - [`linear`]: each namespace (its key→value map plus its mark) behaves as one atomic
//!   fenced register: some order consistent with real time explains every result,
//!   including the final state (S5, S6). Answers `Unknown` when its time budget runs out.
//! - [`lockset`]: in the mutual-exclusion workload, no acknowledged add is lost.
//! - [`reads`]: no value was read that was never written.
//!
//! ## What passing does not prove (S16)
//! A `Valid` report says only that *no violation was observed in this history*. It says
//! nothing about interleavings, faults or timings the run did not produce, and the
//! checkers see only what the recorder saw: an operation the client never heard back
//! from (`info`) is allowed to have happened or not. Fencing itself has limits the
//! checkers respect rather than test away: an old-epoch write that reaches the store
//! before the new epoch does is legitimately accepted (S10), and equal epochs say nothing
//! about retries (S9), so neither is flagged. All checkers assume every namespace starts
//! fresh (no keys, mark 0) when the history begins.
//!
//! ## Example
//! ```
//! use palisade_checker::{check_all, FinalState, History, Op, OpKind, Validity};
//! use std::time::Duration;
//!
//! let history = History::new(vec![
//!     Op::new(1, OpKind::Acquire, 0).lock("jobs").epoch(1).ok(5),
//!     Op::new(1, OpKind::Write, 10).lock("jobs").key("a").value("x").epoch(1).revision(1).ok(20),
//!     Op::new(2, OpKind::Acquire, 30).lock("jobs").epoch(2).ok(35),
//!     Op::new(2, OpKind::Write, 40).lock("jobs").key("a").value("y").epoch(2).revision(2).ok(50),
//!     // The paused first holder wakes up and is refused.
//!     Op::new(1, OpKind::Write, 60).lock("jobs").key("a").value("z").epoch(1).fail(70, "stale_token"),
//! ]);
//! let end: FinalState = serde_json::from_str(
//!     r#"{"namespaces":{"jobs":{"high_water":2,"values":{"a":"y"}}}}"#,
//! ).unwrap();
//! for (name, report) in check_all(&history, &end, Duration::from_secs(5)) {
//!     assert_eq!(report.valid, Validity::Valid, "{name}: {}", report.summary());
//! }
//! ```

pub mod fencing;
pub mod final_state;
pub mod history;
pub mod linear;
pub mod lockset;
mod order;
pub mod reads;
mod report;
pub mod tokens;
mod violation;

use std::time::Duration;

pub use final_state::{FinalState, NamespaceState};
pub use history::{Epoch, History, HistoryError, Op, OpKind, Outcome, Time, STALE_TOKEN};
pub use report::{Report, Stats, Validity};
pub use violation::{Pending, Violation};

/// Runs every checker; `budget` bounds the linearizability search.
pub fn check_all(
    history: &History,
    final_state: &FinalState,
    budget: Duration,
) -> Vec<(&'static str, Report)> {
    vec![
        ("tokens", tokens::check(history)),
        ("fencing", fencing::check(history)),
        (
            "linearizability",
            linear::check(history, final_state, budget),
        ),
        ("lockset", lockset::check(history, final_state)),
        ("reads", reads::check(history, final_state)),
    ]
}
