//! The envelope a fenced object is stored in: a one-line header, then the payload.
//!
//! ```text
//! palisade-fence/1 <lock> <epoch> <v|t>\n<payload bytes>
//! ```
//!
//! `v` marks a value, `t` a tombstone (a fenced delete: the payload is empty but the mark
//! stays). Lock names never contain spaces or newlines, so the header parses without
//! escaping and the payload is opaque bytes. Readers in other languages strip the header
//! by splitting at the first `\n`.

use bytes::{BufMut, Bytes, BytesMut};
use palisade_token::{validate_lock_name, Epoch};

use crate::error::CorruptFence;

const MAGIC: &str = "palisade-fence/1";
/// Longest possible header: magic, a 128-byte lock, a 20-digit epoch, the kind and spaces.
const MAX_HEADER: usize = MAGIC.len() + 1 + 128 + 1 + 20 + 1 + 1 + 1;

/// A decoded fenced object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The lock the object is bound to: only tokens for this lock may change it.
    pub lock: String,
    /// The largest epoch that wrote or fenced the object: its high-water mark.
    pub epoch: Epoch,
    /// The payload, or `None` for a tombstone.
    pub value: Option<Bytes>,
}

impl Envelope {
    /// The stored form: header line, then the payload.
    pub fn encode(&self) -> Bytes {
        let kind = if self.value.is_some() { 'v' } else { 't' };
        let header = format!("{MAGIC} {} {} {kind}\n", self.lock, self.epoch);
        let payload = self.value.as_deref().unwrap_or_default();
        let mut out = BytesMut::with_capacity(header.len() + payload.len());
        out.put_slice(header.as_bytes());
        out.put_slice(payload);
        out.freeze()
    }

    /// Parses a stored object. Anything not written by [`Envelope::encode`] is refused.
    pub fn decode(stored: Bytes) -> Result<Self, CorruptFence> {
        let corrupt = |why: &str| CorruptFence(format!("object envelope: {why}"));
        let head_len = stored
            .iter()
            .take(MAX_HEADER)
            .position(|&b| b == b'\n')
            .ok_or_else(|| corrupt("no palisade-fence header line"))?;
        let header =
            std::str::from_utf8(&stored[..head_len]).map_err(|_| corrupt("header is not UTF-8"))?;
        let fields: Vec<&str> = header.split(' ').collect();
        let [magic, lock, epoch, kind] = fields[..] else {
            return Err(corrupt("header does not have four fields"));
        };
        if magic != MAGIC {
            return Err(corrupt("unknown envelope version"));
        }
        validate_lock_name(lock).map_err(|_| corrupt("illegal lock name"))?;
        let epoch: Epoch = epoch
            .parse()
            .map_err(|_| corrupt("epoch is not a number"))?;
        let payload = stored.slice(head_len + 1..);
        let value = match kind {
            "v" => Some(payload),
            "t" if payload.is_empty() => None,
            _ => return Err(corrupt("unknown kind, or a tombstone with a payload")),
        };
        Ok(Envelope {
            lock: lock.to_owned(),
            epoch,
            value,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_refusals() {
        for value in [
            None,
            Some(Bytes::new()),
            Some(Bytes::from_static(b"a\nb \x00")),
        ] {
            let env = Envelope {
                lock: "orders".into(),
                epoch: u64::MAX,
                value,
            };
            assert_eq!(Envelope::decode(env.encode()).ok(), Some(env));
        }
        for bad in [
            &b""[..],
            b"plain old object",
            b"palisade-fence/2 a 1 v\n",
            b"palisade-fence/1 a/b 1 v\n",
            b"palisade-fence/1 a -1 v\n",
            b"palisade-fence/1 a 1 x\n",
            b"palisade-fence/1 a 1 t\nleftover",
            b"palisade-fence/1 a 1 v extra\n",
        ] {
            assert!(
                Envelope::decode(Bytes::from_static(bad)).is_err(),
                "{bad:?}"
            );
        }
    }
}
