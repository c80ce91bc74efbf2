//! The write-ahead log: where a batch is durable before it is answered.
//!
//! ## Files
//! The log is a run of **segments** beside the database file: `<db>.wal.<base>` (the base
//! is the sequence number of the segment's first record, 20 digits), each a file of
//! `RedbOptions::segment_bytes` **zero-filled before use** (so an fdatasync flushes data only, never
//! the file's size, and so a torn write leaves zeros). A spare segment, `<db>.wal.spare`,
//! is prepared ahead, off the write path. A segment starts with a header (magic
//! `PALWAL01`, the store's id, the base sequence number, a CRC-32) in its first
//! [`HEADER_BYTES`]; records follow back to back.
//!
//! ## Records
//! One record per committed batch:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `PALR` |
//! | 4 | payload length (u32, little endian) |
//! | 8 | commit sequence number (u64, LE): the previous record's plus one |
//! | 4 | CRC-32 of the stored payload |
//! | 4 | CRC-32 of the 20 bytes above |
//! | n | payload: the batch's rows ([`super::overlay::encode`]), XORed with a keystream seeded by the sequence number |
//! | 8 | trailer `PALISEND` |
//!
//! ## Torn or damaged: telling them apart
//! A record that fails its checks is either **torn** (its write was cut by a crash before
//! its fdatasync returned, so it was never acknowledged, and neither was anything after
//! it) or **damaged** (it was complete on disk and changed later: an acknowledged commit
//! may be lost). Recovery must drop the first and must never silently drop the second.
//! The rule (etcd's): cut the record's extent at 512-byte sector boundaries; a torn write
//! leaves at least one of those pieces all zeros (the file was zero-filled, and a disk
//! writes whole sectors), while in a complete record no piece is all zeros: the first
//! piece begins with the magic, the last ends with the trailer, and every piece between
//! holds scrambled payload (which is why the payload is scrambled: a value of 512 zero
//! bytes would otherwise look torn). So: a failed record with an all-zero piece is torn,
//! and recovery ends the log there; any other failure is damage, and opening refuses.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes reserved for a segment's header; the first record starts here.
pub(super) const HEADER_BYTES: u64 = 4096;
const SEGMENT_MAGIC: &[u8; 8] = b"PALWAL01";
const RECORD_MAGIC: &[u8; 4] = b"PALR";
const TRAILER: &[u8; 8] = b"PALISEND";
/// Bytes of a record's header.
pub(super) const RECORD_HEADER: u64 = 24;
/// Bytes a record adds to its payload.
pub(super) const RECORD_OVERHEAD: u64 = RECORD_HEADER + TRAILER.len() as u64;
pub(super) const SECTOR: u64 = 512;

/// A log file as the engine uses it. [`FsLogDir`] gives real files; the tests give a disk
/// that loses what was not synced.
pub(super) trait LogFile: Send + Sync {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// fdatasync.
    fn sync_data(&self) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
}

/// The directory of one log's files.
pub(super) trait LogDir: Send + Sync {
    /// Names of this log's files (segments and the spare).
    fn list(&self) -> io::Result<Vec<String>>;
    fn open(&self, name: &str) -> io::Result<Arc<dyn LogFile>>;
    /// Creates `name` zero-filled to `bytes`, durably (file and directory entry), replacing
    /// a leftover.
    fn create_zeroed(&self, name: &str, bytes: u64) -> io::Result<Arc<dyn LogFile>>;
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes renames and removals durable.
    fn sync(&self) -> io::Result<()>;
    /// Where the files are, for messages.
    fn describe(&self, name: &str) -> String;
    /// The database file's name, which the log's file names start with.
    fn stem(&self) -> &str;
}

/// The name of the segment whose first record is `base`.
pub(super) fn segment_name(stem: &str, base: u64) -> String {
    format!("{stem}.wal.{base:020}")
}

/// The spare segment's name.
pub(super) fn spare_name(stem: &str) -> String {
    format!("{stem}.wal.spare")
}

/// A segment's header.
pub(super) fn encode_header(store_id: u128, base: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(36);
    h.extend_from_slice(SEGMENT_MAGIC);
    h.extend_from_slice(&store_id.to_le_bytes());
    h.extend_from_slice(&base.to_le_bytes());
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

/// What a segment's header says: `None` for an all-zero header (a spare never used).
pub(super) fn read_header(file: &dyn LogFile) -> Result<Option<(u128, u64)>, String> {
    let mut h = [0u8; 36];
    file.read_at(0, &mut h)
        .map_err(|e| format!("cannot read the header: {e}"))?;
    if h.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let crc = u32::from_le_bytes([h[32], h[33], h[34], h[35]]);
    if &h[..8] != SEGMENT_MAGIC || crc32fast::hash(&h[..32]) != crc {
        return Err("its header is damaged (bad magic or checksum)".to_string());
    }
    let mut id = [0u8; 16];
    id.copy_from_slice(&h[8..24]);
    let mut base = [0u8; 8];
    base.copy_from_slice(&h[24..32]);
    Ok(Some((u128::from_le_bytes(id), u64::from_le_bytes(base))))
}

/// XORs `buf` with the keystream of record `seq` (its own inverse).
fn scramble(seq: u64, buf: &mut [u8]) {
    let mut state = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        for (b, k) in chunk.iter_mut().zip(state.to_le_bytes()) {
            *b ^= k;
        }
    }
}

/// Encodes record `seq` around `payload` (which it scrambles in place).
pub(super) fn encode_record(seq: u64, payload: &mut [u8], out: &mut Vec<u8>) {
    scramble(seq, payload);
    let start = out.len();
    out.extend_from_slice(RECORD_MAGIC);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    let header_crc = crc32fast::hash(&out[start..start + 20]);
    out.extend_from_slice(&header_crc.to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(TRAILER);
}

/// How a segment's records end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Tail {
    /// Zeros after the last record (or the file is full); `end` is where the next record
    /// would have started.
    Clean { end: u64 },
    /// A record cut by a crash starts here: it and everything after it never counted.
    Torn { at: u64 },
}

/// A segment read from start to end.
#[derive(Debug)]
pub(super) struct Scanned {
    /// (sequence number, offset, length, payload), in order.
    pub records: Vec<(u64, u64, u64, Vec<u8>)>,
    pub tail: Tail,
}

/// Whether some sector-aligned piece of `bytes` (which start at file offset `at`) is all
/// zeros.
fn has_zero_piece(at: u64, bytes: &[u8]) -> bool {
    let mut start = 0usize;
    while start < bytes.len() {
        let offset = at + start as u64;
        let to_boundary = (SECTOR - offset % SECTOR) as usize;
        let end = (start + to_boundary).min(bytes.len());
        if bytes[start..end].iter().all(|&b| b == 0) {
            return true;
        }
        start = end;
    }
    false
}

/// Reads the records of a segment whose first record is `base`. `Err` names damage: a
/// record that is neither whole nor torn, or one out of sequence.
pub(super) fn scan(file: &dyn LogFile, base: u64) -> Result<Scanned, String> {
    let len = file
        .len()
        .map_err(|e| format!("cannot read its length: {e}"))?;
    let mut at = HEADER_BYTES;
    let mut expected = base;
    let mut records = Vec::new();
    let io = |e: io::Error| format!("cannot read: {e}");
    loop {
        if at + RECORD_HEADER > len {
            return Ok(Scanned {
                records,
                tail: Tail::Clean { end: at },
            });
        }
        let mut header = [0u8; RECORD_HEADER as usize];
        file.read_at(at, &mut header).map_err(io)?;
        if header.iter().all(|&b| b == 0) {
            return Ok(Scanned {
                records,
                tail: Tail::Clean { end: at },
            });
        }
        let field = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b[..r.len()].copy_from_slice(&header[r]);
            u64::from_le_bytes(b)
        };
        let header_ok =
            &header[..4] == RECORD_MAGIC && crc32fast::hash(&header[..20]) as u64 == field(20..24);
        if !header_ok {
            if has_zero_piece(at, &header) {
                return Ok(Scanned {
                    records,
                    tail: Tail::Torn { at },
                });
            }
            return Err(format!(
                "the record at byte {at} is damaged (its header does not verify, and it is not a torn write)"
            ));
        }
        let payload_len = field(4..8);
        let seq = field(8..16);
        let total = RECORD_OVERHEAD + payload_len;
        if at + total > len {
            return Err(format!(
                "the record at byte {at} (sequence {seq}) claims {payload_len} bytes, past the end of the file"
            ));
        }
        let mut rest = vec![0u8; (payload_len + TRAILER.len() as u64) as usize];
        file.read_at(at + RECORD_HEADER, &mut rest).map_err(io)?;
        let (payload, trailer) = rest.split_at_mut(payload_len as usize);
        let whole = trailer == TRAILER && crc32fast::hash(payload) as u64 == field(16..20);
        if !whole {
            let mut extent = header.to_vec();
            extent.extend_from_slice(payload);
            extent.extend_from_slice(trailer);
            if has_zero_piece(at, &extent) {
                return Ok(Scanned {
                    records,
                    tail: Tail::Torn { at },
                });
            }
            return Err(format!(
                "the record at byte {at} (sequence {seq}) is damaged (its checksum does not \
                 verify, and it is not a torn write): an acknowledged commit may be lost"
            ));
        }
        if seq != expected {
            return Err(format!(
                "the record at byte {at} has sequence {seq}, expected {expected}"
            ));
        }
        scramble(seq, payload);
        let payload = payload.to_vec();
        records.push((seq, at, total, payload));
        at += total;
        expected += 1;
    }
}

/// Real files in a directory.
pub(super) struct FsLogDir {
    pub dir: PathBuf,
    pub stem: String,
}

struct FsFile(std::fs::File);

impl LogFile for FsFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, buf, offset)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, data, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
}

impl FsLogDir {
    pub(super) fn for_db(db: &Path) -> FsLogDir {
        let dir = match db.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        let stem = db.file_name().map_or_else(
            || "palisade.redb".to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        FsLogDir { dir, stem }
    }
}

impl LogDir for FsLogDir {
    fn list(&self) -> io::Result<Vec<String>> {
        let prefix = format!("{}.wal.", self.stem);
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn LogFile>> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.dir.join(name))?;
        Ok(Arc::new(FsFile(file)))
    }

    fn create_zeroed(&self, name: &str, bytes: u64) -> io::Result<Arc<dyn LogFile>> {
        let tmp = self.dir.join(format!("{name}.tmp"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let zeros = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < bytes {
            let n = (bytes - at).min(zeros.len() as u64) as usize;
            std::os::unix::fs::FileExt::write_all_at(&file, &zeros[..n], at)?;
            at += n as u64;
        }
        file.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(name))?;
        self.sync()?;
        Ok(Arc::new(FsFile(file)))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.dir.join(from), self.dir.join(to))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        match std::fs::remove_file(self.dir.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn sync(&self) -> io::Result<()> {
        std::fs::File::open(&self.dir)?.sync_all()
    }

    fn describe(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn stem(&self) -> &str {
        &self.stem
    }
}

/// Where the newest commit of the log beside the database file `db` lies: the segment
/// file, the record's byte offset in it and its length. `None` when the log holds no
/// record (everything is in the database file). For fault injection that means to hit
/// exactly the commit a crash recovery depends on.
pub fn newest_commit(db: &Path) -> io::Result<Option<(PathBuf, u64, u64)>> {
    let dir = FsLogDir::for_db(db);
    let mut newest: Option<(u64, PathBuf, u64, u64)> = None;
    for name in dir.list()? {
        if name.ends_with(".tmp") {
            continue;
        }
        let file = dir.open(&name)?;
        let Ok(Some((_, base))) = read_header(file.as_ref()) else {
            continue;
        };
        let Ok(scanned) = scan(file.as_ref(), base) else {
            continue;
        };
        if let Some((seq, at, len, _)) = scanned.records.last() {
            if newest.as_ref().is_none_or(|n| *seq > n.0) {
                newest = Some((*seq, dir.dir.join(&name), *at, *len));
            }
        }
    }
    Ok(newest.map(|(_, path, at, len)| (path, at, len)))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A file in memory.
    #[derive(Default)]
    struct Mem(Mutex<Vec<u8>>);

    impl LogFile for Mem {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            let data = self.0.lock().unwrap();
            let at = offset as usize;
            let src = data
                .get(at..at + buf.len())
                .ok_or_else(|| io::Error::other("read past the end"))?;
            buf.copy_from_slice(src);
            Ok(())
        }
        fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
            let mut data = self.0.lock().unwrap();
            let at = offset as usize;
            data[at..at + bytes.len()].copy_from_slice(bytes);
            Ok(())
        }
        fn sync_data(&self) -> io::Result<()> {
            Ok(())
        }
        fn len(&self) -> io::Result<u64> {
            Ok(self.0.lock().unwrap().len() as u64)
        }
    }

    /// A segment of 16 KiB with records 5, 6 and 7 (the last one large, with a payload
    /// of zeros that the scrambling hides).
    fn segment() -> (Mem, Vec<(u64, u64)>) {
        let file = Mem(Mutex::new(vec![0u8; 16 * 1024]));
        file.write_at(0, &encode_header(42, 5)).unwrap();
        let mut at = HEADER_BYTES;
        let mut extents = Vec::new();
        for (seq, payload) in [(5, vec![1u8; 10]), (6, vec![2u8; 3]), (7, vec![0u8; 3000])] {
            let mut payload = payload;
            let mut out = Vec::new();
            encode_record(seq, &mut payload, &mut out);
            file.write_at(at, &out).unwrap();
            extents.push((at, out.len() as u64));
            at += out.len() as u64;
        }
        (file, extents)
    }

    #[test]
    fn records_read_back_in_order() {
        let (file, _) = segment();
        assert_eq!(read_header(&file).unwrap(), Some((42, 5)));
        let scanned = scan(&file, 5).unwrap();
        assert!(matches!(scanned.tail, Tail::Clean { .. }));
        let seqs: Vec<u64> = scanned.records.iter().map(|r| r.0).collect();
        assert_eq!(seqs, [5, 6, 7]);
        assert_eq!(scanned.records[2].3, vec![0u8; 3000]);
        assert!(scan(&file, 4).is_err(), "out of sequence");
    }

    #[test]
    fn a_torn_tail_ends_the_log_and_a_flip_is_damage() {
        // Torn: a sector of the last record never reached the disk.
        let (file, extents) = segment();
        let (at, _) = extents[2];
        let sector = (at / SECTOR + 2) * SECTOR;
        file.write_at(sector, &[0u8; SECTOR as usize]).unwrap();
        let scanned = scan(&file, 5).unwrap();
        assert_eq!(scanned.tail, Tail::Torn { at });
        assert_eq!(scanned.records.len(), 2);
        // The last record's first piece (its header) never reached the disk: the log
        // simply ends before it.
        let (file, extents) = segment();
        let (at, _) = extents[2];
        let piece = at.div_ceil(SECTOR) * SECTOR - at;
        file.write_at(at, &vec![0u8; piece as usize]).unwrap();
        let scanned = scan(&file, 5).unwrap();
        assert!(matches!(scanned.tail, Tail::Clean { .. }));
        assert_eq!(scanned.records.len(), 2);

        // A flipped byte anywhere in a record, or its header, is damage.
        for (record, offset) in [(2usize, 100u64), (2, 3), (0, 30), (1, 2), (2, 3030)] {
            let (file, extents) = segment();
            let (at, len) = extents[record];
            let target = at + offset.min(len - 1);
            let mut b = [0u8; 1];
            file.read_at(target, &mut b).unwrap();
            file.write_at(target, &[b[0] ^ 0x5a]).unwrap();
            let err = scan(&file, 5).unwrap_err();
            assert!(err.contains("damaged"), "{err}");
        }
        // A damaged segment header.
        let (file, _) = segment();
        file.write_at(9, &[0xff]).unwrap();
        assert!(read_header(&file).is_err());
    }
}
