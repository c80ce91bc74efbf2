//! The epoch horizon: a bound, kept outside the log, on every epoch the log may hold.
//!
//! Recovery cannot always tell a record torn by a crash (never acknowledged) from an
//! acknowledged one a bad sector or a lost write zeroed afterwards (see `open.rs`,
//! "ambiguous tail"). When it drops such a record, what it held is unknown: it may have
//! raised a lock's counter or reservation, or a namespace's mark, and a token that record
//! fenced out would then pass again. The horizon makes the unknown bounded: **every epoch
//! (a counter, a ceiling, a mark) of a record appended to the log is below the horizon as
//! it was durably recorded before the append.** The writer keeps this by raising the
//! horizon to its batch's highest epoch plus [`HORIZON_STEP`], durably, before appending
//! a batch that would reach it: once per million epochs of the busiest lock, off the
//! common path. Recovery that drops an ambiguous tail then raises every counter and mark
//! to the horizon, above anything the dropped records could have held, so that every
//! token issued before is refused.
//!
//! ## The file
//! `<db>.horizon` beside the database file: 512 bytes, magic `PALHZN01`, the horizon
//! (u64, little endian), a CRC-32 of the 16 bytes before it, zeros. Replaced atomically:
//! written to `<db>.horizon.next` (created zero-filled and durable), fdatasync'd, renamed
//! over the old one, directory fsync'd. A crash in between leaves the old horizon, which
//! still bounds every record appended before the new one was durable.
//!
//! ## What it does not do
//! - It is not a witness against a rollback of the whole data directory: it lives in it
//!   (a copy of the directory carries its own older horizon).
//! - A missing or damaged file is recreated from the database when the log's tail is
//!   clean (nothing is unknown then); with an ambiguous tail the store refuses to open.

use palisade_token::Epoch;

use super::schema::Fault;
use super::wal::LogDir;

/// How far above a batch's highest epoch the writer raises the horizon when the batch
/// would pass it: the most a recovery after an ambiguous tail may have to skip.
pub(super) const HORIZON_STEP: Epoch = 1 << 20;

const MAGIC: &[u8; 8] = b"PALHZN01";
const FILE_BYTES: u64 = 512;

/// The horizon file's name for a database file named `stem`.
pub(super) fn name(stem: &str) -> String {
    format!("{stem}.horizon")
}

fn next_name(stem: &str) -> String {
    format!("{stem}.horizon.next")
}

/// What the horizon file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Loaded {
    Horizon(Epoch),
    Missing,
    /// Unreadable or failing its checks, with why.
    Damaged(String),
}

/// Reads the horizon file of `log`'s database.
pub(super) fn load(log: &dyn LogDir) -> Loaded {
    let name = name(log.stem());
    let file = match log.open(&name) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Loaded::Missing,
        Err(e) => return Loaded::Damaged(format!("cannot open it: {e}")),
    };
    let mut bytes = [0u8; 20];
    if let Err(e) = file.read_at(0, &mut bytes) {
        return Loaded::Damaged(format!("cannot read it: {e}"));
    }
    let crc = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    if &bytes[..8] != MAGIC || crc32fast::hash(&bytes[..16]) != crc {
        return Loaded::Damaged("bad magic or checksum".to_string());
    }
    let mut horizon = [0u8; 8];
    horizon.copy_from_slice(&bytes[8..16]);
    Loaded::Horizon(Epoch::from_le_bytes(horizon))
}

/// Records `horizon` durably, replacing the file atomically (see the module docs).
pub(super) fn store(log: &dyn LogDir, horizon: Epoch) -> Result<(), Fault> {
    let stem = log.stem().to_owned();
    let io = |e: std::io::Error| {
        Fault(format!(
            "cannot record the epoch horizon in {}: {e}",
            log.describe(&name(&stem))
        ))
    };
    let mut bytes = Vec::with_capacity(20);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&horizon.to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&bytes).to_le_bytes());
    let file = log
        .create_zeroed(&next_name(&stem), FILE_BYTES)
        .map_err(io)?;
    file.write_at(0, &bytes).map_err(io)?;
    file.sync_data().map_err(io)?;
    log.rename(&next_name(&stem), &name(&stem)).map_err(io)?;
    log.sync().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redb_backend::wal::FsLogDir;

    #[test]
    fn a_stored_horizon_loads_and_a_flipped_byte_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let log = FsLogDir::for_db(&dir.path().join("palisade.redb"));
        assert_eq!(load(&log), Loaded::Missing);
        store(&log, 7 << 20).unwrap();
        store(&log, 9 << 20).unwrap();
        assert_eq!(load(&log), Loaded::Horizon(9 << 20));
        let path = dir.path().join("palisade.redb.horizon");
        let mut bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), FILE_BYTES as usize);
        bytes[9] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(load(&log), Loaded::Damaged(_)));
        std::fs::write(&path, vec![0u8; 512]).unwrap();
        assert!(matches!(load(&log), Loaded::Damaged(_)));
    }
}
