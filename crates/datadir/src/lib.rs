//! # The embedded data directory: one owner for what Palisade keeps on disk beside the database
//!
//! Everything about the data directory that is not the storage engine itself lives here,
//! below the server: the server serves HTTP over it, and the offline admin commands
//! (backup, restore, keys) use it without the server.
//!
//! - [`data_dir`]: recognising, claiming and locking the directory (its marker file);
//! - [`keys`]: the key set file, the `issuer.key` it replaces, the key files given by
//!   flags, and the offline key commands;
//! - [`recovery`]: the epoch ledger, offline backup and restore, and the start-up checks
//!   that keep epochs monotonic across them (S11); the disk side of online backups.
//!
//! The file names are here once: [`DB_FILE`], [`data_dir::MARKER_FILE`],
//! [`keys::file::KEY_SET_FILE`], [`recovery::ledger::LEDGER_FILE`]. The write-ahead log's
//! own files are the storage engine's (`palisade_storage::redb_backend`), and every
//! atomic replacement goes through `palisade_storage::atomic_file`.

pub mod data_dir;
pub mod keys;
pub mod recovery;

/// Database file name inside the data directory.
pub const DB_FILE: &str = "palisade.redb";

/// Seconds since the Unix epoch, for the times recorded in key sets, ledgers and backups.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
