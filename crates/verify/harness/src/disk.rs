//! The disk fault's damage step: corrupt the newest commit of a stopped server's store.
//!
//! The nemesis calls [`damage_newest_commit`] between a SIGKILL of the embedded server
//! and its restart, as a disk that lost or garbled the last thing written would. The
//! question it asks the store: does it notice that it came back older than what it
//! acknowledged, and refuse or raise every mark (DESIGN "Durability"), or does it serve
//! the older state as if nothing happened (which re-issues epochs and re-admits stale
//! tokens: the checkers then report it)?
//!
//! Which bytes hold "the newest commit" depends on the storage engine, so this module is
//! keyed on the files in the data directory and nothing else: [`Format::detect`] looks at
//! them, and one small function per format picks the bytes:
//!
//! - **the write-ahead log** (`palisade.redb.wal.<base>` beside `palisade.redb`): every
//!   commit since the last checkpoint is one record in it, and after a SIGKILL the newest
//!   commit is the last record of the newest segment
//!   (`palisade_storage::redb_backend::newest_commit` finds it). One bit of its payload
//!   is flipped: a record that fails its checksum without being a torn write.
//! - **redb** alone (`palisade.redb` with no log record: everything was checkpointed, or
//!   a store of a version before the log): a commit ends by writing its commit slot in
//!   the file header and making it the primary slot (bit 0 of the "god byte" at offset 9;
//!   slots of 128 bytes at offsets 64 and 192, the last 16 bytes of each an xxh3 checksum
//!   of the rest). One flipped bit in the primary slot, past its version byte, fails that
//!   checksum, and redb's recovery falls back to the other slot: the previous commit.
//!
//! A store in a format this module does not know is an error, never a silent no-op: a
//! disk fault that damaged nothing would make a clean run mean nothing. To aim the fault
//! at another engine (a write-ahead log, say), add a [`Format`] variant recognised from
//! its files and a function that flips bytes in its newest commit record.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::VerifyError;

/// The embedded store's database file.
pub const REDB_FILE: &str = "palisade.redb";
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];
const REDB_GOD_BYTE: u64 = 9;
const REDB_SLOT_0: u64 = 64;
const REDB_SLOT_SIZE: u64 = 128;

/// What was damaged, for the fault record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub file: PathBuf,
    /// Byte offset and the bit mask XORed into it.
    pub flips: Vec<(u64, u8)>,
    /// What those bytes were.
    pub what: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let flips: Vec<String> = self
            .flips
            .iter()
            .map(|(at, mask)| format!("byte {at} ^ {mask:#04x}"))
            .collect();
        let name = self.file.file_name().unwrap_or_default().to_string_lossy();
        write!(f, "{name}: {} ({})", self.what, flips.join(", "))
    }
}

/// The storage formats the damage step knows, recognised from the data directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// The newest record of the write-ahead log: (segment file, record offset, length).
    Log(PathBuf, u64, u64),
    /// redb's single file.
    Redb(PathBuf),
}

impl Format {
    /// Looks at the files in `data_dir`.
    pub fn detect(data_dir: &Path) -> Result<Format, VerifyError> {
        let redb = data_dir.join(REDB_FILE);
        let newest = palisade_storage::redb_backend::newest_commit(&redb).map_err(|e| {
            VerifyError::io(format!("cannot read the log in {}", data_dir.display()), e)
        })?;
        if let Some((segment, offset, len)) = newest {
            return Ok(Format::Log(segment, offset, len));
        }
        let mut magic = [0u8; REDB_MAGIC.len()];
        let read = std::fs::File::open(&redb).and_then(|mut f| f.read_exact(&mut magic));
        if read.is_ok() && magic == REDB_MAGIC {
            return Ok(Format::Redb(redb));
        }
        let files: Vec<String> = std::fs::read_dir(data_dir)
            .map_err(|e| VerifyError::io(format!("cannot list {}", data_dir.display()), e))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        Err(VerifyError::Config(format!(
            "the disk fault does not know the store format in {} (files: {}); see disk.rs",
            data_dir.display(),
            files.join(", ")
        )))
    }
}

/// Damages the newest commit of the store in `data_dir` (the server must be stopped).
/// `pick` chooses the bytes, so a seeded schedule damages the same place each time.
pub fn damage_newest_commit(data_dir: &Path, pick: u64) -> Result<Damage, VerifyError> {
    match Format::detect(data_dir)? {
        Format::Log(segment, offset, len) => damage_log_record(&segment, offset, len, pick),
        Format::Redb(file) => damage_redb_primary_slot(&file, pick),
    }
}

/// Bytes of a log record before its payload (magic, length, sequence number, checksums).
const LOG_RECORD_HEADER: u64 = 24;

/// Flips one bit of the payload of the log record at `offset` (`len` bytes in all).
fn damage_log_record(
    segment: &Path,
    offset: u64,
    len: u64,
    pick: u64,
) -> Result<Damage, VerifyError> {
    let payload = len.saturating_sub(LOG_RECORD_HEADER + 8);
    if payload == 0 {
        return Err(VerifyError::Config(format!(
            "the newest log record in {} has no payload to damage",
            segment.display()
        )));
    }
    let at = offset + LOG_RECORD_HEADER + pick % payload;
    let mask = 1u8 << ((pick / payload.max(1)) % 8);
    flip(segment, at, mask)?;
    Ok(Damage {
        file: segment.to_owned(),
        flips: vec![(at, mask)],
        what: format!("the newest log record (at byte {offset}, {len} bytes)"),
    })
}

/// The error of a failed damage to `file`.
fn cannot_damage(file: &Path) -> impl Fn(std::io::Error) -> VerifyError + '_ {
    move |e| VerifyError::io(format!("cannot damage {}", file.display()), e)
}

/// `file` open for reading and writing, and its byte at `at`.
fn open_at(file: &Path, at: u64) -> Result<(std::fs::File, u8), VerifyError> {
    let io = cannot_damage(file);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .map_err(&io)?;
    let mut byte = [0u8; 1];
    f.seek(SeekFrom::Start(at)).map_err(&io)?;
    f.read_exact(&mut byte).map_err(&io)?;
    Ok((f, byte[0]))
}

/// XORs `mask` into the byte at `at` and syncs the file.
fn flip(file: &Path, at: u64, mask: u8) -> Result<(), VerifyError> {
    let io = cannot_damage(file);
    let (mut f, byte) = open_at(file, at)?;
    let byte = [byte ^ mask];
    f.seek(SeekFrom::Start(at)).map_err(&io)?;
    f.write_all(&byte).map_err(&io)?;
    f.sync_all().map_err(&io)
}

/// Flips one bit in redb's primary commit slot (past the version byte, which redb reads
/// before the checksum and would refuse outright: that is not the fault under test).
fn damage_redb_primary_slot(file: &Path, pick: u64) -> Result<Damage, VerifyError> {
    let (f, god) = open_at(file, REDB_GOD_BYTE)?;
    let primary = u64::from(god & 1);
    let offset = REDB_SLOT_0 + primary * REDB_SLOT_SIZE + 1 + pick % (REDB_SLOT_SIZE - 1);
    let mask = 1u8 << ((pick / REDB_SLOT_SIZE) % 8);
    drop(f);
    flip(file, offset, mask)?;
    Ok(Damage {
        file: file.to_owned(),
        flips: vec![(offset, mask)],
        what: format!("primary commit slot {primary} (the newest commit)"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Database, TableDefinition};

    const T: TableDefinition<&str, u64> = TableDefinition::new("t");

    fn commit(db: &Database, value: u64) {
        let mut txn = db.begin_write().unwrap();
        txn.set_durability(redb::Durability::Immediate);
        txn.open_table(T).unwrap().insert("epoch", value).unwrap();
        txn.commit().unwrap();
    }

    fn read(path: &Path) -> Option<u64> {
        let db = Database::open(path).unwrap();
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(T).unwrap();
        let value = table.get("epoch").unwrap().map(|v| v.value());
        value
    }

    /// Like a SIGKILLed server: commits made, the database never closed cleanly (the
    /// file is copied while it is still open).
    fn crashed_store(dir: &Path, commits: u64) -> PathBuf {
        let live = dir.join("live.redb");
        let db = Database::create(&live).unwrap();
        for value in 1..=commits {
            commit(&db, value);
        }
        let path = dir.join(REDB_FILE);
        std::fs::copy(&live, &path).unwrap();
        drop(db);
        std::fs::remove_file(live).unwrap();
        path
    }

    #[test]
    fn a_damaged_primary_slot_loses_exactly_the_newest_commit() {
        for pick in [0, 5, 126, 127, 1000, 4095] {
            let dir = tempfile::tempdir().unwrap();
            let path = crashed_store(dir.path(), 3);
            let damage = damage_newest_commit(dir.path(), pick).unwrap();
            assert_eq!(damage.file, path);
            let (offset, _) = damage.flips[0];
            assert!((65..320).contains(&offset) && offset != 192, "{damage}");
            // Today's redb: recovery falls back to the previous commit, silently.
            assert_eq!(read(&path), Some(2), "pick {pick}: {damage}");
        }
    }

    #[test]
    fn an_undamaged_crashed_store_keeps_its_newest_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = crashed_store(dir.path(), 3);
        assert_eq!(read(&path), Some(3));
    }

    #[test]
    fn an_unknown_format_is_an_error_not_a_no_op() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("wal-000001.log"), b"records").unwrap();
        let err = damage_newest_commit(dir.path(), 1).unwrap_err().to_string();
        assert!(err.contains("wal-000001.log"), "{err}");
        std::fs::write(dir.path().join(REDB_FILE), b"not redb at all").unwrap();
        assert!(damage_newest_commit(dir.path(), 1).is_err());
    }
}
