//! The in-memory index: every write the log holds that the checkpoint file does not yet.
//!
//! A write is one [`Row`]: a typed key of one of the file's tables and its new value, or
//! `None` for a removal (a tombstone, so that a row removed since the last checkpoint
//! hides the checkpoint's copy). Keys order exactly as redb orders the same tables (a
//! derived `Ord` over the same tuples, variant by variant), so a range of one table can be
//! read from the index and the file together and merged in key order.
//!
//! Layers, newest first: the rows of batches not yet durable (the writer's own, never
//! shown to readers), the published rows (durable since the last checkpoint began), the
//! frozen rows (being written into the file by the checkpoint), then the file. Only rows
//! written since the last checkpoint live here, so memory follows the write rate, not the
//! size of the store.

use std::collections::BTreeMap;

use bytes::Bytes;

/// A row's key: the table and the key inside it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Key {
    Epoch(String),
    Reservation(String),
    Lease(String),
    Fence(String),
    Kv(String, String),
    Meta(String),
    Idem(String, String),
    IdemExpiry(u64, String, String),
    Usage(String),
}

/// A row's value, shaped as its table's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Val {
    /// `issuer_epochs`, `meta`.
    U64(u64),
    /// `issuer_reservations`: (ceiling, max TTL, active).
    Triple(u64, u64, u64),
    /// `fences`: (epoch, seq); `ns_usage`: (keys, bytes).
    Pair(u64, u64),
    /// `issuer_leases`, `idempotency`: JSON text.
    Text(String),
    /// `kv`: (revision, epoch, value).
    Entry(u64, u64, Bytes),
    /// `idempotency_expiry`.
    Unit,
}

/// One write: a value, or `None` for a removal.
pub(super) type Row = (Key, Option<Val>);

/// Rows by key; the last write of a key wins.
pub(super) type Rows = BTreeMap<Key, Option<Val>>;

/// Whether two keys are of the same table.
pub(super) fn same_table(a: &Key, b: &Key) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

// ---- Encoding of rows in log records. ----
//
// Little-endian integers, strings and byte strings prefixed by a u32 length. Decoding
// never panics: a short or malformed payload is an error (the record's checksum passed,
// so that would be a bug or a foreign file, and recovery refuses it).

const K_EPOCH: u8 = 1;
const K_RESERVATION: u8 = 2;
const K_LEASE: u8 = 3;
const K_FENCE: u8 = 4;
const K_KV: u8 = 5;
const K_META: u8 = 6;
const K_IDEM: u8 = 7;
const K_IDEM_EXPIRY: u8 = 8;
const K_USAGE: u8 = 9;
/// One byte of padding, no row (see [`pad`]).
const K_PAD: u8 = 0xFF;

const V_NONE: u8 = 0;
const V_U64: u8 = 1;
const V_TRIPLE: u8 = 2;
const V_PAIR: u8 = 3;
const V_TEXT: u8 = 4;
const V_ENTRY: u8 = 5;
const V_UNIT: u8 = 6;

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Keys, names and values are far below 4 GiB (the server caps them).
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_name(out: &mut Vec<u8>, tag: u8, name: &str) {
    out.push(tag);
    put_bytes(out, name.as_bytes());
}

/// Appends the encoding of `rows` to `out`.
pub(super) fn encode<'a>(
    rows: impl Iterator<Item = (&'a Key, &'a Option<Val>)>,
    out: &mut Vec<u8>,
) {
    for (key, val) in rows {
        match key {
            Key::Epoch(a) => put_name(out, K_EPOCH, a),
            Key::Reservation(a) => put_name(out, K_RESERVATION, a),
            Key::Lease(a) => put_name(out, K_LEASE, a),
            Key::Fence(a) => put_name(out, K_FENCE, a),
            Key::Meta(a) => put_name(out, K_META, a),
            Key::Usage(a) => put_name(out, K_USAGE, a),
            Key::Kv(a, b) | Key::Idem(a, b) => {
                out.push(if matches!(key, Key::Kv(..)) {
                    K_KV
                } else {
                    K_IDEM
                });
                put_bytes(out, a.as_bytes());
                put_bytes(out, b.as_bytes());
            }
            Key::IdemExpiry(t, a, b) => {
                out.push(K_IDEM_EXPIRY);
                put_u64(out, *t);
                put_bytes(out, a.as_bytes());
                put_bytes(out, b.as_bytes());
            }
        }
        match val {
            None => out.push(V_NONE),
            Some(Val::U64(a)) => {
                out.push(V_U64);
                put_u64(out, *a);
            }
            Some(Val::Triple(a, b, c)) => {
                out.push(V_TRIPLE);
                for v in [a, b, c] {
                    put_u64(out, *v);
                }
            }
            Some(Val::Pair(a, b)) => {
                out.push(V_PAIR);
                put_u64(out, *a);
                put_u64(out, *b);
            }
            Some(Val::Text(t)) => put_name(out, V_TEXT, t),
            Some(Val::Entry(r, e, v)) => {
                out.push(V_ENTRY);
                put_u64(out, *r);
                put_u64(out, *e);
                put_bytes(out, v);
            }
            Some(Val::Unit) => out.push(V_UNIT),
        }
    }
}

/// A cursor over an encoded payload.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("record payload ends early".to_string());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        self.take(u32::from_le_bytes(b) as usize)
    }
    fn string(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| "a name is not UTF-8".to_string())
    }
}

/// Decodes a payload written by [`encode`].
/// Appends one byte that decodes to no row: the writer lengthens a record by it so that
/// no record ends on a sector boundary (see `open.rs`, "ambiguous tail").
pub(super) fn pad(out: &mut Vec<u8>) {
    out.push(K_PAD);
}

pub(super) fn decode(payload: &[u8]) -> Result<Vec<Row>, String> {
    let mut r = Reader(payload);
    let mut rows = Vec::new();
    while !r.0.is_empty() {
        let key = match r.u8()? {
            K_PAD => continue,
            K_EPOCH => Key::Epoch(r.string()?),
            K_RESERVATION => Key::Reservation(r.string()?),
            K_LEASE => Key::Lease(r.string()?),
            K_FENCE => Key::Fence(r.string()?),
            K_KV => Key::Kv(r.string()?, r.string()?),
            K_META => Key::Meta(r.string()?),
            K_IDEM => Key::Idem(r.string()?, r.string()?),
            K_IDEM_EXPIRY => Key::IdemExpiry(r.u64()?, r.string()?, r.string()?),
            K_USAGE => Key::Usage(r.string()?),
            other => return Err(format!("unknown table tag {other}")),
        };
        let val = match r.u8()? {
            V_NONE => None,
            V_U64 => Some(Val::U64(r.u64()?)),
            V_TRIPLE => Some(Val::Triple(r.u64()?, r.u64()?, r.u64()?)),
            V_PAIR => Some(Val::Pair(r.u64()?, r.u64()?)),
            V_TEXT => Some(Val::Text(r.string()?)),
            V_ENTRY => Some(Val::Entry(
                r.u64()?,
                r.u64()?,
                Bytes::copy_from_slice(r.bytes()?),
            )),
            V_UNIT => Some(Val::Unit),
            other => return Err(format!("unknown value tag {other}")),
        };
        rows.push((key, val));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_keys_order_as_redb_tuples() {
        let mut rows = Rows::new();
        rows.insert(Key::Epoch("a".into()), Some(Val::U64(7)));
        rows.insert(Key::Reservation("a".into()), Some(Val::Triple(1, 2, 0)));
        rows.insert(Key::Lease("id".into()), None);
        rows.insert(Key::Fence("ns".into()), Some(Val::Pair(3, 0)));
        rows.insert(
            Key::Kv("ns".into(), "k".into()),
            Some(Val::Entry(9, 3, Bytes::from_static(b"\0value"))),
        );
        rows.insert(Key::Meta("revision".into()), Some(Val::U64(9)));
        rows.insert(
            Key::Idem("ns".into(), "i".into()),
            Some(Val::Text("{}".into())),
        );
        rows.insert(Key::IdemExpiry(5, "ns".into(), "i".into()), Some(Val::Unit));
        rows.insert(Key::Usage("ns".into()), Some(Val::Pair(1, 8)));
        let mut out = Vec::new();
        encode(rows.iter(), &mut out);
        let back: Rows = decode(&out).unwrap().into_iter().collect();
        assert_eq!(back, rows);
        assert!(decode(&out[..out.len() - 1]).is_err());
        assert!(decode(&[42]).is_err());
        // (ns, key) tuples order by namespace first, as redb's tuple keys do.
        assert!(Key::Kv("a".into(), "z".into()) < Key::Kv("b".into(), "a".into()));
        assert!(Key::Kv("a".into(), "user/1".into()) < Key::Kv("a".into(), "users".into()));
    }
}
