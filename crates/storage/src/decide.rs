//! # What a fenced operation does: one pure decision, many shells
//!
//! [`decide()`] takes a [`FencedOp`] and what the backend read for it inside the transaction
//! that will write ([`Seen`]: the namespace's mark, the key, the idempotency record, the
//! namespace's usage) and says what happens: replay an earlier outcome, refuse, or commit
//! exactly the writes of a [`Commit`]. It reads no clock (the wall-clock `now` is passed
//! in) and touches no disk. The embedded engine, the etcd backend and the simulation all
//! call it, so the rule is written once; each shell only reads, then writes what it was
//! told, in the same transaction (S6).
//!
//! The checks run in this order, and the order is part of the contract:
//! 1. **Idempotency.** A live record under the request's idempotency key answers: the same
//!    fingerprint replays the first outcome (even if the gate would refuse the request
//!    today), another fingerprint is [`ApplyError::IdempotencyConflict`]. A record older
//!    than the retention ([`StoreLimits::idempotency_retention`]) counts as absent.
//! 2. **The gate** ([`admit`]) against the namespace's mark.
//! 3. **The precondition** on the key's revision ([`crate::Precondition::check`]), before
//!    "not found", as HTTP orders them.
//! 4. **Not found**: a delete of a missing key.
//! 5. **Quotas** ([`StoreLimits`]): a put that would take the namespace over its key or
//!    byte limit. A put that does not grow a resource is never refused for it, so a
//!    namespace over a lowered limit can still shrink.
//!
//! A refusal at any step writes nothing: not the mark, not the key, not an idempotency
//! record.

use palisade_api::QuotaResource;
use serde::{Deserialize, Serialize};

use palisade_core::gate::{admit, HighWater};

use crate::{Action, Applied, ApplyError, FencedOp, StoreLimits};

/// What a namespace holds, counted for its quotas: keys, and bytes of keys plus values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub keys: u64,
    pub bytes: u64,
}

impl Usage {
    /// The bytes one entry counts for: its key's length plus its value's.
    pub fn entry_bytes(key: &str, value_len: usize) -> u64 {
        (key.len() as u64).saturating_add(value_len as u64)
    }
}

/// A stored idempotency record: the first outcome of a request made with a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdemRecord {
    pub fingerprint: String,
    /// When it was written (wall clock, milliseconds since the Unix epoch).
    #[serde(default)]
    pub created_at_ms: u64,
    pub applied: Applied,
}

impl IdemRecord {
    /// Whether the retention has run out at `now_ms`.
    pub fn expired(&self, now_ms: u64, retention_ms: u64) -> bool {
        now_ms.saturating_sub(self.created_at_ms) >= retention_ms
    }
}

/// The key an operation names, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyState {
    pub revision: u64,
    /// [`Usage::entry_bytes`] of the stored entry.
    pub bytes: u64,
}

/// What the backend read for one operation, in the transaction that will write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen<'a> {
    /// The namespace's mark (or the floor that stands in for a missing one).
    pub mark: HighWater,
    /// The key of a put or delete; `None` if absent (always `None` for a fence).
    pub key: Option<KeyState>,
    /// The record under the operation's idempotency key, if it has one and one is stored.
    pub idempotency: Option<&'a IdemRecord>,
    /// The namespace's usage.
    pub usage: Usage,
}

/// The data write of a [`Commit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Store the operation's value under its key.
    Put,
    /// Remove the key.
    Delete,
    /// A fence: no data.
    Nothing,
}

/// Everything an admitted operation writes, in one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Commit {
    /// The namespace's mark after the operation.
    pub high_water: HighWater,
    /// Whether the mark differs from the one read (a backend may skip writing it).
    pub mark_changed: bool,
    pub change: Change,
    /// The namespace's usage after the operation.
    pub usage: Usage,
    pub usage_changed: bool,
    /// The creation time of an expired idempotency record that this operation's record
    /// replaces (for a backend that indexes records by time).
    pub replaces_expired: Option<u64>,
}

impl Commit {
    /// The outcome, once the shell knows the store revision of the write (for a fence:
    /// the store's current revision).
    pub fn applied(&self, op: &FencedOp, revision: u64) -> Applied {
        Applied {
            revision,
            epoch: op.epoch,
            high_water: self.high_water,
            replayed: false,
            advanced: self.mark_changed,
        }
    }

    /// The idempotency record to store with the write, if the operation carries a key.
    pub fn record(&self, op: &FencedOp, applied: Applied, now_ms: u64) -> Option<IdemRecord> {
        op.idempotency.as_ref().map(|idem| IdemRecord {
            fingerprint: idem.fingerprint.clone(),
            created_at_ms: now_ms,
            applied,
        })
    }
}

/// What happens to an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Answer with an earlier outcome; write nothing.
    Replay(Applied),
    /// Refuse; write nothing.
    Refuse(ApplyError),
    /// Write what the [`Commit`] says.
    Commit(Commit),
}

/// Decides what `op` does given what was read (`seen`), the limits, and the wall clock.
/// See the module docs for the order of the checks.
pub fn decide(op: &FencedOp, seen: &Seen<'_>, limits: &StoreLimits, now_ms: u64) -> Decision {
    let mut replaces_expired = None;
    if let (Some(wanted), Some(stored)) = (&op.idempotency, seen.idempotency) {
        if stored.expired(now_ms, limits.retention_ms()) {
            replaces_expired = Some(stored.created_at_ms);
        } else if stored.fingerprint == wanted.fingerprint {
            return Decision::Replay(Applied {
                replayed: true,
                advanced: false,
                ..stored.applied
            });
        } else {
            return Decision::Refuse(ApplyError::IdempotencyConflict);
        }
    }
    let high_water = match admit(seen.mark, op.policy, op.epoch, op.seq) {
        Ok(next) => next,
        Err(refused) => return Decision::Refuse(refused.into()),
    };
    let current = seen.key.map(|k| k.revision);
    let old = seen.key.map_or(Usage::default(), |k| Usage {
        keys: 1,
        bytes: k.bytes,
    });
    let (change, new) = match &op.action {
        Action::Put {
            key,
            value,
            precondition,
        } => {
            if let Err(refused) = precondition.check(current) {
                return Decision::Refuse(refused);
            }
            let new = Usage {
                keys: 1,
                bytes: Usage::entry_bytes(key, value.len()),
            };
            (Change::Put, new)
        }
        Action::Delete { precondition, .. } => {
            if let Err(refused) = precondition.check(current) {
                return Decision::Refuse(refused);
            }
            if current.is_none() {
                return Decision::Refuse(ApplyError::NotFound);
            }
            (Change::Delete, Usage::default())
        }
        Action::Fence => (Change::Nothing, old),
    };
    let usage = Usage {
        keys: seen
            .usage
            .keys
            .saturating_sub(old.keys)
            .saturating_add(new.keys),
        bytes: seen
            .usage
            .bytes
            .saturating_sub(old.bytes)
            .saturating_add(new.bytes),
    };
    if usage.keys > seen.usage.keys && usage.keys > limits.max_keys_per_namespace {
        return Decision::Refuse(ApplyError::QuotaExceeded {
            resource: QuotaResource::KeysPerNamespace,
            limit: limits.max_keys_per_namespace,
        });
    }
    if usage.bytes > seen.usage.bytes && usage.bytes > limits.max_bytes_per_namespace {
        return Decision::Refuse(ApplyError::QuotaExceeded {
            resource: QuotaResource::BytesPerNamespace,
            limit: limits.max_bytes_per_namespace,
        });
    }
    Decision::Commit(Commit {
        high_water,
        mark_changed: high_water != seen.mark,
        change,
        usage,
        usage_changed: usage != seen.usage,
        replaces_expired,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use palisade_core::gate::{GateError, Policy};

    use super::*;
    use crate::{Idempotency, Precondition};

    fn op(epoch: u64, action: Action) -> FencedOp {
        FencedOp {
            namespace: "ns".into(),
            epoch,
            seq: None,
            policy: Policy::Epoch,
            idempotency: None,
            action,
        }
    }

    fn put(key: &str, value: &str) -> Action {
        Action::Put {
            key: key.into(),
            value: Bytes::from(value.to_owned()),
            precondition: Precondition::None,
        }
    }

    fn limits(keys: u64, bytes: u64) -> StoreLimits {
        StoreLimits {
            max_keys_per_namespace: keys,
            max_bytes_per_namespace: bytes,
            idempotency_retention: Duration::from_millis(100),
        }
    }

    fn over_quota(resource: QuotaResource, limit: u64) -> Decision {
        Decision::Refuse(ApplyError::QuotaExceeded { resource, limit })
    }

    /// A key already stored, taking `bytes`.
    fn stored(bytes: u64) -> Option<KeyState> {
        Some(KeyState { revision: 1, bytes })
    }

    /// A write admitted at epoch 4 (the mark now 4), answered with `revision`.
    fn admitted_at_epoch_4(revision: u64) -> Applied {
        Applied {
            revision,
            epoch: 4,
            high_water: HighWater { epoch: 4, seq: 0 },
            replayed: false,
            advanced: true,
        }
    }

    fn commit(d: Decision) -> Commit {
        match d {
            Decision::Commit(c) => c,
            other => panic!("expected a commit, got {other:?}"),
        }
    }

    #[test]
    fn quotas_count_keys_and_bytes_and_let_a_namespace_shrink() {
        let l = limits(2, 10);
        let empty = Seen::default();
        // "ab" + "cdefgh" = 8 bytes: fits.
        let c = commit(decide(&op(1, put("ab", "cdefgh")), &empty, &l, 0));
        assert_eq!(c.usage, Usage { keys: 1, bytes: 8 });
        assert!(c.usage_changed && c.mark_changed);
        // 8 + 3 bytes would be 11 > 10.
        let one = Seen {
            usage: c.usage,
            ..Seen::default()
        };
        let refused = over_quota(QuotaResource::BytesPerNamespace, 10);
        assert_eq!(decide(&op(1, put("x", "yz")), &one, &l, 0), refused);
        // Overwriting the key with a smaller value shrinks it.
        let overwritten = Seen {
            key: stored(8),
            ..one
        };
        let c = commit(decide(&op(1, put("ab", "c")), &overwritten, &l, 0));
        assert_eq!(c.usage, Usage { keys: 1, bytes: 3 });
        // A third key is over the key limit, whatever its size.
        let two = Seen {
            usage: Usage { keys: 2, bytes: 2 },
            ..Seen::default()
        };
        let refused = over_quota(QuotaResource::KeysPerNamespace, 2);
        assert_eq!(decide(&op(1, put("k", "")), &two, &l, 0), refused);
        // Over a lowered limit: a put that does not grow passes, a delete always does.
        let over = Seen {
            key: stored(8),
            usage: Usage { keys: 5, bytes: 50 },
            ..Seen::default()
        };
        let c = commit(decide(&op(1, put("ab", "c")), &over, &l, 0));
        assert_eq!(c.usage, Usage { keys: 5, bytes: 45 });
        let delete = Action::Delete {
            key: "ab".into(),
            precondition: Precondition::None,
        };
        let c = commit(decide(&op(1, delete), &over, &l, 0));
        assert_eq!(
            (c.change, c.usage),
            (Change::Delete, Usage { keys: 4, bytes: 42 })
        );
        // A fence changes no usage.
        let c = commit(decide(&op(2, Action::Fence), &over, &l, 0));
        assert_eq!((c.change, c.usage_changed), (Change::Nothing, false));
    }

    #[test]
    fn checks_run_in_order() {
        let l = limits(0, 0);
        let mark = HighWater { epoch: 5, seq: 0 };
        // The gate before the quota.
        let seen = Seen {
            mark,
            ..Seen::default()
        };
        assert_eq!(
            decide(&op(4, put("k", "v")), &seen, &l, 0),
            Decision::Refuse(ApplyError::Gate(GateError::Stale {
                high_water: 5,
                epoch: 4
            }))
        );
        // The precondition before the quota.
        let conditional = Action::Put {
            key: "k".into(),
            value: Bytes::new(),
            precondition: Precondition::Revision(3),
        };
        assert_eq!(
            decide(&op(5, conditional), &seen, &l, 0),
            Decision::Refuse(ApplyError::RevisionMismatch { current: None })
        );
        // A live idempotency record before everything, even a stale epoch.
        let applied = admitted_at_epoch_4(9);
        let record = IdemRecord {
            fingerprint: "fp".into(),
            created_at_ms: 1_000,
            applied,
        };
        let with_key = |fingerprint: &str| FencedOp {
            idempotency: Some(Idempotency {
                key: "i".into(),
                fingerprint: fingerprint.into(),
            }),
            ..op(4, put("k", "v"))
        };
        let seen = Seen {
            mark,
            idempotency: Some(&record),
            ..Seen::default()
        };
        assert_eq!(
            decide(&with_key("fp"), &seen, &l, 1_099),
            Decision::Replay(Applied {
                replayed: true,
                advanced: false,
                ..applied
            })
        );
        assert_eq!(
            decide(&with_key("other"), &seen, &l, 1_099),
            Decision::Refuse(ApplyError::IdempotencyConflict)
        );
        // Expired (retention 100 ms): neither replayed nor a conflict; the request is
        // decided afresh (here the gate refuses it).
        for fingerprint in ["fp", "other"] {
            assert!(matches!(
                decide(&with_key(fingerprint), &seen, &l, 1_100),
                Decision::Refuse(ApplyError::Gate(GateError::Stale { .. }))
            ));
        }
        let fresh = Seen {
            mark: HighWater::default(),
            ..seen
        };
        let c = commit(decide(&with_key("other"), &fresh, &limits(9, 99), 1_100));
        assert_eq!(c.replaces_expired, Some(1_000));
        let applied = c.applied(&with_key("other"), 10);
        let stored = c.record(&with_key("other"), applied, 1_100).unwrap();
        assert_eq!((stored.created_at_ms, stored.applied.revision), (1_100, 10));
    }

    /// A record written before fingerprints were versioned (an unprefixed digest of the
    /// request's `Debug` text) is never taken for the same request: a retry across that
    /// upgrade is refused as a conflict, neither replayed nor applied a second time.
    #[test]
    fn unversioned_record_is_a_conflict() {
        let action = put("k", "v");
        let request = FencedOp {
            idempotency: Some(Idempotency::for_request("i".into(), 4, None, &action)),
            ..op(4, action)
        };
        let old = IdemRecord {
            // What the previous encoding stored for this very request: SHA-256 of
            // "PUT\0k\0", the epoch (8 bytes), "NoneNone\0", "v"; first 16 bytes.
            fingerprint: "315962ef0b979d968d56ec5066403f91".into(),
            created_at_ms: 1_000,
            applied: admitted_at_epoch_4(1),
        };
        let seen = Seen {
            idempotency: Some(&old),
            ..Seen::default()
        };
        let l = limits(9, 99);
        assert_eq!(
            decide(&request, &seen, &l, 1_001),
            Decision::Refuse(ApplyError::IdempotencyConflict)
        );
        // Past the retention the old record no longer answers and the request is decided
        // afresh.
        let later = 1_000 + l.retention_ms();
        assert!(matches!(
            decide(&request, &seen, &l, later),
            Decision::Commit(_)
        ));
    }
}
