//! When a lock may be granted, over etcd: the one rule, read from a snapshot
//! ([`LockSnapshot::blocked`]) and guarded in the grant's transaction ([`guards`]).
//!
//! A lock may be granted to a caller now when
//! - nobody holds it (no holder key),
//! - it is not in a lock-delay (no delay marker),
//! - the epoch (and the epoch floor) is the one read, so the grant's epoch is the next one,
//! - and the waiting line allows the caller: a caller outside the line only when the line
//!   is empty; a caller from the line only at its head (first come, first served across
//!   nodes: the line is ordered by its keys' create revisions).
//!
//! A snapshot says whether it may; the transaction's compares make the grant conditional
//! on all of it still being so when etcd applies it. Both are here, side by side, so that
//! what a node decides and what etcd checks cannot drift apart.

use etcd_client::{Compare, CompareOp};
use palisade_token::Epoch;

use crate::keys::{DelayRecord, HolderRecord, Keys};

/// One lock as read in one snapshot.
pub(crate) struct LockSnapshot {
    pub revision: i64,
    /// The lock's last epoch, or the epoch floor if that is higher.
    pub epoch: Epoch,
    pub epoch_rev: i64,
    /// The epoch floor's mod revision (0 if there is none).
    pub floor_rev: i64,
    pub holder: Option<HolderRecord>,
    pub waiters: usize,
    /// The waiter key with the smallest create revision, if any.
    pub first_waiter: Option<Vec<u8>>,
    /// Whether the waiter key asked about is in the line.
    pub queued: bool,
    /// The lock's lock-delay marker, if it is in a lock-delay (or held with one).
    pub delay: Option<DelayRecord>,
    /// Whether the session asked about still exists (true when none was asked about).
    pub session_alive: bool,
}

/// Who asks for the lock.
#[derive(Clone, Copy)]
pub(crate) enum Asker<'a> {
    /// A caller outside the waiting line.
    Newcomer,
    /// A caller from the line: its waiter key, and that key's create revision.
    InLine { key: &'a [u8], created: i64 },
}

/// Why a lock cannot be granted now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Blocked<'a> {
    Held(&'a HolderRecord),
    /// Nobody holds it, but its lock-delay runs.
    Delayed(&'a DelayRecord),
    /// Free, but someone in line comes first.
    LineAhead,
}

impl LockSnapshot {
    /// Why the lock cannot be granted to `asker` now, or `None` when it can.
    pub(crate) fn blocked(&self, asker: Asker<'_>) -> Option<Blocked<'_>> {
        if let Some(holder) = &self.holder {
            return Some(Blocked::Held(holder));
        }
        if let Some(delay) = &self.delay {
            return Some(Blocked::Delayed(delay));
        }
        let first = match asker {
            Asker::Newcomer => self.waiters == 0,
            Asker::InLine { key, .. } => self.first_waiter.as_deref() == Some(key),
        };
        (!first).then_some(Blocked::LineAhead)
    }
}

/// The compares that make a grant of `lock` to `asker` conditional on what
/// [`LockSnapshot::blocked`] found in `snap` still holding when etcd applies it.
pub(crate) fn guards(
    keys: &Keys,
    lock: &str,
    snap: &LockSnapshot,
    asker: Asker<'_>,
) -> Vec<Compare> {
    let mut compares = vec![
        // Nobody holds it.
        Compare::version(keys.holder(lock), CompareOp::Equal, 0),
        // Not in a lock-delay (nor held with one).
        Compare::version(keys.delay(lock), CompareOp::Equal, 0),
        // Nobody issued an epoch since the snapshot, and the epoch floor was not raised.
        Compare::mod_revision(keys.epoch(lock), CompareOp::Equal, snap.epoch_rev),
        Compare::mod_revision(keys.epoch_floor(), CompareOp::Equal, snap.floor_rev),
    ];
    let line = keys.waiters(lock);
    match asker {
        // Nobody may be waiting: a lock with a line goes to the head of the line.
        Asker::Newcomer => compares.push(Compare::version(line, CompareOp::Equal, 0).with_prefix()),
        Asker::InLine { key, created } => {
            // Still in line, and nobody in line since before us.
            compares.push(Compare::create_revision(key, CompareOp::Equal, created));
            compares.push(
                Compare::create_revision(line, CompareOp::Greater, created - 1).with_prefix(),
            );
        }
    }
    compares
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free() -> LockSnapshot {
        LockSnapshot {
            revision: 10,
            epoch: 3,
            epoch_rev: 7,
            floor_rev: 0,
            holder: None,
            waiters: 0,
            first_waiter: None,
            queued: false,
            delay: None,
            session_alive: true,
        }
    }

    fn holder() -> HolderRecord {
        HolderRecord {
            lease_id: "l1".into(),
            lock: "L".into(),
            holder: "a".into(),
            epoch: 3,
            ttl_ms: 1000,
            etcd_lease: 5,
            value: None,
            lock_delay_ms: 0,
            session: None,
            delay_lease: None,
        }
    }

    fn delay() -> DelayRecord {
        DelayRecord {
            lease_id: "l1".into(),
            lock_delay_ms: 500,
            delay_lease: 6,
        }
    }

    /// Every combination of holder, lock-delay and line, for a newcomer and for the head
    /// and the second of the line: granted exactly when free, out of its delay, and the
    /// line allows the asker; a holder reported before a delay, a delay before the line.
    #[test]
    fn the_rule_over_every_combination() {
        let (head, second) = (b"w/1".as_slice(), b"w/2".as_slice());
        for held in [false, true] {
            for delayed in [false, true] {
                for line in [0usize, 2] {
                    let snap = LockSnapshot {
                        holder: held.then(holder),
                        delay: delayed.then(delay),
                        waiters: line,
                        first_waiter: (line > 0).then(|| head.to_vec()),
                        ..free()
                    };
                    let askers = [
                        (Asker::Newcomer, line == 0),
                        (
                            Asker::InLine {
                                key: head,
                                created: 8,
                            },
                            line > 0,
                        ),
                        (
                            Asker::InLine {
                                key: second,
                                created: 9,
                            },
                            false,
                        ),
                    ];
                    for (asker, line_allows) in askers {
                        let got = snap.blocked(asker);
                        let want = if held {
                            Some(Blocked::Held(snap.holder.as_ref().unwrap()))
                        } else if delayed {
                            Some(Blocked::Delayed(snap.delay.as_ref().unwrap()))
                        } else if !line_allows {
                            Some(Blocked::LineAhead)
                        } else {
                            None
                        };
                        assert_eq!(got, want, "held {held}, delayed {delayed}, line {line}");
                    }
                }
            }
        }
    }

    /// The guards compare exactly what the rule read: the holder and the delay marker
    /// absent, the epoch and the floor at the revisions read, and the line as the asker
    /// found it.
    #[test]
    fn the_guards_follow_the_asker() {
        let keys = Keys::new("/p/").unwrap();
        let snap = free();
        let shown = |compares: Vec<Compare>| -> Vec<String> {
            compares.iter().map(|c| format!("{c:?}")).collect()
        };
        let newcomer = shown(guards(&keys, "L", &snap, Asker::Newcomer));
        let asker = Asker::InLine {
            key: b"w/1",
            created: 8,
        };
        let in_line = shown(guards(&keys, "L", &snap, asker));
        assert_eq!((newcomer.len(), in_line.len()), (5, 6));
        assert_eq!(newcomer[..4], in_line[..4], "the same lock conditions");
        assert_ne!(
            newcomer[4], in_line[4],
            "the line compared as the asker found it"
        );
        let later = LockSnapshot {
            epoch_rev: 9,
            ..free()
        };
        let moved = shown(guards(&keys, "L", &later, Asker::Newcomer));
        assert_ne!(newcomer[2], moved[2], "the epoch's revision as read");
    }
}
