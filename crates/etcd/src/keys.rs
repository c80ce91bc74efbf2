//! The key layout in etcd, and the encodings of the values.
//!
//! Every key starts with the configured prefix `P` (default `/palisade/`):
//!
//! | key | value | lifetime |
//! |---|---|---|
//! | `P epoch/<lock>` | last epoch issued, decimal | forever (epochs never go back) |
//! | `P holder/<lock>` | JSON [`HolderRecord`] | attached to the holder's etcd lease |
//! | `P lease/<lease id>` | the same JSON record, found by lease id | attached to the same lease |
//! | `P wait/<lock>/<lease id>` | holder name | attached to a short waiter lease |
//! | `P delay/<lock>` | JSON [`DelayRecord`] | attached to the holder's *delay lease*: outlives the holder's lease by its lock-delay (see `crate::recipes`) |
//! | `P session/<session id>` | JSON [`SessionRecord`] | attached to the session's etcd lease |
//! | `P slease/<session id>/<lease id>` | the lease's [`HolderRecord`], found by session | attached to the session's etcd lease |
//! | `P fence/<ns>` | JSON high-water mark | forever |
//! | `P kv/<ns>/<key>` | `0x01`, epoch (8 bytes, big endian), value | until deleted |
//! | `P idem/<ns>/<idempotency key>` | JSON [`IdemRecord`] | forever |
//! | `P keys/set` | the issuer key set (JSON, see `crate::key_set`) | forever |
//! | `P meta/epoch-floor` | epoch floor, decimal: every lock's epochs continue above it, every namespace's mark is at least it (`palisade admin etcd-raise`, see `crate::ledger`) | forever |
//!
//! Lock and namespace names match `[A-Za-z0-9._-]+`, so the `/` after them is unambiguous
//! and `P epoch/` lists locks in name order. The store revision of a value is etcd's own
//! mod revision of its key: global, strictly increasing, shared by everything one
//! transaction wrote.

use palisade_core::gate::HighWater;
use std::ops::Bound;

use etcd_client::{GetOptions, TxnOp};
use palisade_storage::{Page, StorageError};
use palisade_token::Epoch;
use serde::{Deserialize, Serialize};

use crate::error::corrupt;

/// Version byte at the start of every stored value.
const VALUE_V1: u8 = 1;

/// Builds keys under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Result<Keys, StorageError> {
        if prefix.is_empty() || !prefix.ends_with('/') {
            return Err(StorageError::Failed(format!(
                "etcd prefix {prefix:?} must be non-empty and end with '/'"
            )));
        }
        Ok(Keys {
            prefix: prefix.to_owned(),
        })
    }

    fn key(&self, parts: &[&str]) -> Vec<u8> {
        let mut key = self.prefix.clone();
        for part in parts {
            key.push_str(part);
        }
        key.into_bytes()
    }

    pub(crate) fn meta_probe(&self) -> Vec<u8> {
        self.key(&["meta/probe"])
    }
    /// The epoch floor set by `palisade admin etcd-raise` (see `crate::ledger`).
    pub(crate) fn epoch_floor(&self) -> Vec<u8> {
        self.key(&["meta/epoch-floor"])
    }
    pub(crate) fn holder_prefix(&self) -> Vec<u8> {
        self.key(&["holder/"])
    }
    pub(crate) fn waiters_prefix(&self) -> Vec<u8> {
        self.key(&["wait/"])
    }
    pub(crate) fn epoch(&self, lock: &str) -> Vec<u8> {
        self.key(&["epoch/", lock])
    }
    pub(crate) fn epoch_prefix(&self) -> Vec<u8> {
        self.key(&["epoch/"])
    }
    pub(crate) fn holder(&self, lock: &str) -> Vec<u8> {
        self.key(&["holder/", lock])
    }
    pub(crate) fn lease(&self, lease_id: &str) -> Vec<u8> {
        self.key(&["lease/", lease_id])
    }
    /// The waiting line of `lock` (a prefix; waiters order by create revision).
    pub(crate) fn waiters(&self, lock: &str) -> Vec<u8> {
        self.key(&["wait/", lock, "/"])
    }
    pub(crate) fn waiter(&self, lock: &str, lease_id: &str) -> Vec<u8> {
        self.key(&["wait/", lock, "/", lease_id])
    }
    /// The lock-delay marker of `lock` (see `crate::recipes`).
    pub(crate) fn delay(&self, lock: &str) -> Vec<u8> {
        self.key(&["delay/", lock])
    }
    pub(crate) fn session(&self, session_id: &str) -> Vec<u8> {
        self.key(&["session/", session_id])
    }
    /// The leases of a session (a prefix).
    pub(crate) fn session_leases(&self, session_id: &str) -> Vec<u8> {
        self.key(&["slease/", session_id, "/"])
    }
    pub(crate) fn session_lease(&self, session_id: &str, lease_id: &str) -> Vec<u8> {
        self.key(&["slease/", session_id, "/", lease_id])
    }
    pub(crate) fn fence(&self, namespace: &str) -> Vec<u8> {
        self.key(&["fence/", namespace])
    }
    pub(crate) fn data(&self, namespace: &str, key: &str) -> Vec<u8> {
        self.key(&["kv/", namespace, "/", key])
    }
    pub(crate) fn data_prefix(&self, namespace: &str) -> Vec<u8> {
        self.key(&["kv/", namespace, "/"])
    }
    pub(crate) fn usage(&self, namespace: &str) -> Vec<u8> {
        self.key(&["usage/", namespace])
    }
    pub(crate) fn idempotency(&self, namespace: &str, key: &str) -> Vec<u8> {
        self.key(&["idem/", namespace, "/", key])
    }
    pub(crate) fn key_set(&self) -> Vec<u8> {
        self.key(&["keys/set"])
    }
}

/// The range read of one [`Page`] of the names stored under `base` (as `base` + name):
/// from [`Page::start`] (the smallest key above `after`: `after` followed by a zero byte)
/// to the end of the prefix's range, at most `limit` keys, with `options` besides.
pub(crate) fn page_read(base: &[u8], page: &Page, options: GetOptions) -> TxnOp {
    let key = |name: &str| [base, name.as_bytes()].concat();
    let start = match page.start() {
        Bound::Excluded(after) => {
            let mut start = key(after);
            start.push(0);
            start
        }
        Bound::Included(name) => key(name),
        Bound::Unbounded => base.to_vec(),
    };
    let options = options
        .with_range(prefix_end(&key(&page.prefix)))
        .with_limit(i64::try_from(page.limit).unwrap_or(i64::MAX));
    TxnOp::get(start, Some(options))
}

/// The first key after every key that starts with `prefix` (etcd's range end for a
/// prefix): the prefix with its last byte below 0xff incremented and the rest cut off.
/// An all-0xff (or empty) prefix has no end: `[0]`, which etcd reads as "to the end".
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Who holds a lock: stored under the holder key and the lease key, both attached to the
/// etcd lease `etcd_lease`, so both vanish the moment the lease ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HolderRecord {
    pub lease_id: String,
    pub lock: String,
    pub holder: String,
    pub epoch: Epoch,
    /// The TTL etcd granted, in milliseconds (whole seconds).
    pub ttl_ms: u64,
    pub etcd_lease: i64,
    /// The value the holder advertises (standard base64), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The lock-delay that applies if the lease expires (0: none).
    #[serde(default)]
    pub lock_delay_ms: u64,
    /// The session the lease belongs to; its etcd lease is then the session's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The etcd lease the lock's [`DelayRecord`] is attached to, when the lease has a
    /// lock-delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_lease: Option<i64>,
}

/// The lock-delay marker of a lock: while it exists the lock is not granted. Written with
/// the grant of a lease that has a lock-delay, deleted with its release, and left to its
/// own etcd lease (which outlives the holder's by the lock-delay) when the lease expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DelayRecord {
    pub lease_id: String,
    pub lock_delay_ms: u64,
    pub delay_lease: i64,
}

/// A session: one etcd lease that every lease acquired in it is attached to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub session_id: String,
    pub holder: String,
    /// The TTL etcd granted, in milliseconds (whole seconds).
    pub ttl_ms: u64,
    pub etcd_lease: i64,
}

/// The first outcome of a request made with an idempotency key. Its revision is the mod
/// revision of the record itself: it was written in the same transaction as the mutation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IdemRecord {
    pub fingerprint: String,
    pub epoch: Epoch,
    pub high_water: HighWater,
    /// When it was written (wall clock, ms since the Unix epoch); absent in records of
    /// versions before idempotency retention, which never expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at_ms: Option<u64>,
}

pub(crate) fn json<T: Serialize>(value: &T) -> Vec<u8> {
    // Plain structs of strings and integers always serialise.
    serde_json::to_vec(value).unwrap_or_default()
}

pub(crate) fn from_json<T: for<'de> Deserialize<'de>>(
    key: &[u8],
    bytes: &[u8],
) -> Result<T, StorageError> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(key, e))
}

pub(crate) fn encode_epoch(epoch: Epoch) -> Vec<u8> {
    epoch.to_string().into_bytes()
}

pub(crate) fn decode_epoch(key: &[u8], bytes: &[u8]) -> Result<Epoch, StorageError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| corrupt(key, "not a decimal epoch"))
}

pub(crate) fn encode_value(epoch: Epoch, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + value.len());
    out.push(VALUE_V1);
    out.extend_from_slice(&epoch.to_be_bytes());
    out.extend_from_slice(value);
    out
}

/// Splits a stored value into (epoch, value bytes).
pub(crate) fn decode_value<'a>(
    key: &[u8],
    bytes: &'a [u8],
) -> Result<(Epoch, &'a [u8]), StorageError> {
    match bytes.split_first() {
        Some((&VALUE_V1, rest)) if rest.len() >= 8 => {
            let (epoch, value) = rest.split_at(8);
            let mut be = [0u8; 8];
            be.copy_from_slice(epoch);
            Ok((Epoch::from_be_bytes(be), value))
        }
        _ => Err(corrupt(key, "not a Palisade value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_encodings() {
        let keys = Keys::new("/p/").unwrap();
        assert_eq!(keys.data("orders", "a/b"), b"/p/kv/orders/a/b");
        assert_eq!(keys.waiter("l", "x"), b"/p/wait/l/x");
        assert!(Keys::new("/p").is_err());
        let stored = encode_value(7, b"hello");
        assert_eq!(decode_value(b"k", &stored).unwrap(), (7, &b"hello"[..]));
        assert!(decode_value(b"k", b"\x02aaaaaaaa").is_err());
        assert!(decode_value(b"k", b"").is_err());
        assert_eq!(decode_epoch(b"k", &encode_epoch(42)).unwrap(), 42);
        assert_eq!(prefix_end(b"/p/epoch/a"), b"/p/epoch/b");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert!(decode_epoch(b"k", b"-1").is_err());
    }
}
