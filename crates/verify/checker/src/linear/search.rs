//! The search for a linearization (Wing & Gong, with Lowe's memoization as in Porcupine).
//!
//! A depth-first search over orders of the calls. A call may come next when no other call
//! still waiting *ended* before it was invoked: that keeps every order consistent with
//! real time. Calls with a known outcome must all be placed; unknown ones (`end: None`)
//! may be placed at any point after their invocation, or never.
//!
//! Every reached (set of placed calls, model state) pair is remembered; reaching it again
//! by another order cannot lead anywhere new, so that branch is cut. This turns a
//! factorial search into one bounded by the history's concurrency, not its length.
//!
//! An unknown call is not placed where placing it cannot help ([`State::pointless`]):
//! leaving it out keeps strictly more options open.

use std::collections::HashSet;
use std::time::Instant;

use super::model::{Call, State};
use crate::history::Time;

/// Memory the memo table may use before the search gives up.
const MEMO_BYTES: usize = 1 << 30;

/// The outcome of one search.
pub(crate) enum Verdict {
    Linearizable,
    /// No order fits. `prefix`: the longest order of calls that fits, `state`: the model
    /// state after it, `stuck`: the calls none of which could come next.
    NotLinearizable {
        prefix: Vec<usize>,
        state: State,
        stuck: Vec<usize>,
    },
    /// Time or memory ran out first.
    GaveUp(&'static str),
}

struct Frame {
    candidates: Vec<usize>,
    next: usize,
}

/// Searches `calls` (sorted by invocation) over a model of `keys` keys.
pub(crate) fn search(
    calls: &[Call],
    keys: usize,
    deadline: Instant,
    explored: &mut u64,
) -> Verdict {
    let required = calls.iter().filter(|c| c.end.is_some()).count();
    if required == 0 {
        return Verdict::Linearizable;
    }
    let words = calls.len().div_ceil(64);
    let max_states = MEMO_BYTES / (words * 8 + keys * 4 + 96);
    let mut done = vec![0u64; words];
    let mut state = State::new(keys);
    let mut placed_required = 0;
    let mut path = Vec::new();
    let mut seen: HashSet<(Box<[u64]>, State)> = HashSet::new();
    let mut frames = vec![Frame {
        candidates: candidates(calls, &done),
        next: 0,
    }];
    let mut max_depth = 0;
    let mut deepest: Option<Verdict> = None;
    let mut deepest_depth = None;

    loop {
        *explored += 1;
        if *explored & 1023 == 0 && Instant::now() >= deadline {
            return Verdict::GaveUp("time budget spent");
        }
        if seen.len() > max_states {
            return Verdict::GaveUp("memo table full");
        }
        let Some(frame) = frames.last_mut() else {
            return deepest.unwrap_or(Verdict::NotLinearizable {
                prefix: Vec::new(),
                state,
                stuck: Vec::new(),
            });
        };
        if let Some(&i) = frame.candidates.get(frame.next) {
            frame.next += 1;
            let call = &calls[i];
            let Some(undo) = state.step(&call.effect) else {
                continue;
            };
            if call.end.is_none() && state.pointless(call, &undo) {
                state.undo(undo);
                continue;
            }
            done[i / 64] |= 1 << (i % 64);
            if !seen.insert((done.clone().into_boxed_slice(), state.clone())) {
                done[i / 64] &= !(1 << (i % 64));
                state.undo(undo);
                continue;
            }
            if call.end.is_some() {
                placed_required += 1;
            }
            path.push((i, undo));
            if placed_required == required {
                return Verdict::Linearizable;
            }
            max_depth = max_depth.max(placed_required);
            frames.push(Frame {
                candidates: candidates(calls, &done),
                next: 0,
            });
        } else {
            // Exhausted: remember the dead end that explained the most, then step back.
            if placed_required == max_depth && deepest_depth != Some(max_depth) {
                deepest_depth = Some(max_depth);
                deepest = Some(Verdict::NotLinearizable {
                    prefix: path.iter().map(|&(i, _)| i).collect(),
                    state: state.clone(),
                    stuck: frame
                        .candidates
                        .iter()
                        .copied()
                        .filter(|&c| calls[c].end.is_some())
                        .collect(),
                });
            }
            frames.pop();
            if let Some((i, undo)) = path.pop() {
                done[i / 64] &= !(1 << (i % 64));
                state.undo(undo);
                if calls[i].end.is_some() {
                    placed_required -= 1;
                }
            }
        }
    }
}

/// Calls that may come next: not yet placed, and invoked no later than the earliest end
/// among the calls not yet placed. Known outcomes first, earliest end first.
fn candidates(calls: &[Call], done: &[u64]) -> Vec<usize> {
    let start = done.iter().take_while(|&&w| w == u64::MAX).count() * 64;
    let mut min_end = Time::MAX;
    let mut out = Vec::new();
    for (i, call) in calls.iter().enumerate().skip(start) {
        if done[i / 64] & (1 << (i % 64)) != 0 {
            continue;
        }
        if call.invoke > min_end {
            break;
        }
        out.push(i);
        if let Some(end) = call.end {
            min_end = min_end.min(end);
        }
    }
    out.retain(|&i| calls[i].invoke <= min_end);
    out.sort_by_key(|&i| (calls[i].end.is_none(), calls[i].end, i));
    out
}
