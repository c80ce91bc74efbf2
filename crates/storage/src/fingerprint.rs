//! The fingerprint of a fenced request, stored with its idempotency record.
//!
//! A retry under the same `Idempotency-Key` replays the first outcome only if its
//! fingerprint is equal to the stored one; any other request under that key is refused
//! ([`crate::ApplyError::IdempotencyConflict`]). Records live on disk (and in etcd) for the
//! retention, so the encoding is part of the storage format: every field is written
//! explicitly as tagged, length-prefixed bytes, never through `Debug` or any other format
//! that may change between compiler or library versions.
//!
//! The digest is prefixed with the encoding's version ([`VERSION`]). A record written
//! with another encoding (an older build's fingerprints carry no prefix) never equals a
//! new fingerprint, so a retry across such an upgrade is refused as a conflict: it is
//! neither replayed with another request's outcome nor applied twice. Such records age
//! out after the retention.

use sha2::{Digest, Sha256};

use crate::{Action, Precondition};

/// Prefix naming this encoding; bump it whenever the bytes hashed change.
pub const VERSION: &str = "v1:";

/// The fingerprint of a fenced request: its action (put, delete or fence; key, value and
/// precondition), the token's epoch and the request's sequence number.
pub fn fingerprint(epoch: u64, seq: Option<u64>, action: &Action) -> String {
    let mut h = Sha256::new();
    h.update(b"palisade-fenced-request\0");
    let (tag, key, value, pre): (u8, &str, &[u8], Precondition) = match action {
        Action::Put {
            key,
            value,
            precondition,
        } => (1, key, value, *precondition),
        Action::Delete { key, precondition } => (2, key, b"", *precondition),
        Action::Fence => (3, "", b"", Precondition::None),
    };
    h.update([tag]);
    bytes(&mut h, key.as_bytes());
    h.update(epoch.to_be_bytes());
    match seq {
        None => h.update([0]),
        Some(s) => {
            h.update([1]);
            h.update(s.to_be_bytes());
        }
    }
    match pre {
        Precondition::None => h.update([0]),
        Precondition::Absent => h.update([1]),
        Precondition::Revision(r) => {
            h.update([2]);
            h.update(r.to_be_bytes());
        }
    }
    bytes(&mut h, value);
    format!("{VERSION}{}", hex::encode(&h.finalize()[..16]))
}

/// Writes a length-prefixed field, so no two field splits hash the same bytes.
fn bytes(h: &mut Sha256, field: &[u8]) {
    h.update((field.len() as u64).to_be_bytes());
    h.update(field);
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn put(key: &str, value: &str, precondition: Precondition) -> Action {
        Action::Put {
            key: key.into(),
            value: Bytes::from(value.to_owned()),
            precondition,
        }
    }

    #[test]
    fn stable_encoding() {
        // The exact value is stored on disk: a change here breaks retries across an
        // upgrade and needs a new VERSION. Computed independently from the encoding above:
        // SHA-256 of "palisade-fenced-request\0", 0x01, len 1, "k", epoch 7, 0x01, seq 3,
        // 0x02, revision 2, len 1, "v"; the first 16 bytes in hex.
        assert_eq!(
            fingerprint(7, Some(3), &put("k", "v", Precondition::Revision(2))),
            "v1:1efc5bf0c0a3965844a38bf34c824172"
        );
    }

    #[test]
    fn every_field_counts() {
        let base = fingerprint(7, None, &put("k", "v", Precondition::None));
        let variants = [
            fingerprint(8, None, &put("k", "v", Precondition::None)),
            fingerprint(7, Some(0), &put("k", "v", Precondition::None)),
            fingerprint(7, None, &put("k", "v", Precondition::Absent)),
            fingerprint(7, None, &put("k", "v", Precondition::Revision(0))),
            fingerprint(7, None, &put("k2", "v", Precondition::None)),
            fingerprint(7, None, &put("k", "v2", Precondition::None)),
            // Moving bytes between key and value changes the fingerprint.
            fingerprint(7, None, &put("kv", "", Precondition::None)),
            fingerprint(
                7,
                None,
                &Action::Delete {
                    key: "k".into(),
                    precondition: Precondition::None,
                },
            ),
            fingerprint(7, None, &Action::Fence),
        ];
        let mut all = vec![base.clone()];
        for v in variants {
            assert!(v.starts_with(VERSION));
            assert!(!all.contains(&v), "{v} collides");
            all.push(v);
        }
        assert_eq!(
            base,
            fingerprint(7, None, &put("k", "v", Precondition::None))
        );
    }
}
