//! The data directory: recognising it, claiming it, and refusing anything else.
//!
//! `--data-dir` is a path a person types, so it may well name `.`, `$HOME` or a project
//! folder. A server must never scatter its database and keys among foreign files, nor
//! change such a directory's mode. So a start first looks without touching
//! ([`inspect`]), and only then, after the port is bound, claims the directory
//! ([`DataDir::claim`]): creates it if missing, locks it, writes the marker.
//!
//! ## What is accepted
//! - A missing directory: created with mode 0700.
//! - An empty directory (a `lost+found` alone counts as empty: a fresh volume): adopted,
//!   and given mode 0700.
//! - A Palisade data directory: it holds the marker file [`MARKER_FILE`], whose `format`
//!   is one this version reads ([`FORMAT`]).
//! - A data directory of a version before the marker: no marker, but at least one file
//!   named in [`STATE_NAMES`] or starting with one of [`STATE_PREFIXES`]. It is adopted
//!   and the marker written; its mode is left as it is.
//!
//! Anything else that is not empty is refused with the names of a few of its entries,
//! and left exactly as it was: nothing is created, written or chmod'ed in it.
//!
//! ## Invariants
//! - [`inspect`] only reads. [`DataDir::claim`] writes only after it holds the lock.
//! - One server per directory: the lock is `flock(2)` on the directory itself, held for
//!   the server's lifetime and released by the kernel when the process dies (so a crash
//!   leaves no stale lock). The holder's pid is in [`PID_FILE`], for the refusal message.
//!
//! ## What it does not do
//! - It knows the storage engine's files only through the two short lists below; it does
//!   not open or check them (the engine and `crate::recovery` do).
//! - `flock` is advisory and, on some network file systems, local to one machine: two
//!   servers on two machines sharing one network directory are not caught here.
//! - No migration between marker formats: there is one format so far.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

/// The marker file that makes a directory a Palisade data directory.
pub const MARKER_FILE: &str = "palisade-data-dir.toml";

/// The marker format this version writes and reads.
pub const FORMAT: u32 = 1;

/// Holds the pid of the server that has the directory locked.
pub const PID_FILE: &str = "palisade.pid";

/// Files that only a Palisade server writes into its data directory (the database, the
/// key set, the key of versions before key sets). One of them, with no marker, is a data
/// directory of an earlier version.
pub const STATE_NAMES: &[&str] = &["palisade.redb", "signing-keys.json", "issuer.key"];

/// Name prefixes of the other files a Palisade server keeps there (the database's side
/// files, the epoch ledger and its floor).
pub const STATE_PREFIXES: &[&str] = &["palisade.redb.", "epoch-ledger"];

/// Entries a fresh volume comes with, which do not make a directory "in use".
const IGNORED: &[&str] = &["lost+found"];

/// What [`inspect`] found at the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Nothing there yet.
    Missing,
    /// An empty directory.
    Empty,
    /// A Palisade data directory with a marker of a format this version reads.
    Palisade,
    /// A data directory of an earlier version: Palisade's files, no marker.
    Legacy,
}

/// Why a path cannot be used as a data directory. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error(
        "refusing to use {path} as the data directory: it is not empty and is not a Palisade \
         data directory (it holds {examples}). Nothing was changed in it. Give --data-dir a \
         new or empty directory, e.g. --data-dir ./palisade-data"
    )]
    Foreign { path: PathBuf, examples: String },
    #[error("refusing to use {path} as the data directory: it is not a directory")]
    NotADirectory { path: PathBuf },
    #[error(
        "{path} was written by a newer palisade (data directory format {found}; this one \
         reads format {FORMAT}): run the newer version, or restore a backup made for this one"
    )]
    NewerFormat { path: PathBuf, found: u32 },
    #[error("{path}: the marker file is damaged ({reason}); it must read `format = {FORMAT}`")]
    BadMarker { path: PathBuf, reason: String },
    #[error("data directory {path} is already in use by {holder}: stop that server first, or give another --data-dir")]
    InUse { path: PathBuf, holder: String },
    #[error(
        "{path}: the witness goes beside the data directory, and this one has no parent; \
         give --witness PATH"
    )]
    NoWitnessPlace { path: PathBuf },
    #[error(
        "--witness {witness} is inside the data directory {path}: a copy of the directory put \
         back would bring its witness back too. Give a path outside it, on another volume if \
         you can"
    )]
    WitnessInside { path: PathBuf, witness: PathBuf },
    #[error("cannot use data directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DataDirError + '_ {
    move |source| DataDirError::Io {
        path: path.to_owned(),
        source,
    }
}

#[derive(serde::Deserialize)]
struct Marker {
    format: u32,
}

/// Looks at `path` without changing anything, and says whether a server may use it.
pub fn inspect(path: &Path) -> Result<Found, DataDirError> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Missing),
        Err(e) => return Err(io_err(path)(e)),
    };
    if !meta.is_dir() {
        return Err(DataDirError::NotADirectory {
            path: path.to_owned(),
        });
    }
    let mut names: Vec<OsString> = Vec::new();
    for entry in fs::read_dir(path).map_err(io_err(path))? {
        names.push(entry.map_err(io_err(path))?.file_name());
    }
    names.retain(|n| !IGNORED.iter().any(|i| n == *i));
    if names.is_empty() {
        return Ok(Found::Empty);
    }
    if names.iter().any(|n| n == MARKER_FILE) {
        let marker = path.join(MARKER_FILE);
        let text = fs::read_to_string(&marker).map_err(io_err(&marker))?;
        let bad = |reason: String| DataDirError::BadMarker {
            path: marker.clone(),
            reason,
        };
        let parsed: Marker = toml::from_str(&text).map_err(|e| bad(e.message().to_owned()))?;
        return match parsed.format {
            FORMAT => Ok(Found::Palisade),
            0 => Err(bad("format 0 does not exist".to_owned())),
            found => Err(DataDirError::NewerFormat {
                path: path.to_owned(),
                found,
            }),
        };
    }
    if names.iter().any(is_state_name) {
        return Ok(Found::Legacy);
    }
    names.sort();
    let mut examples: Vec<String> = names
        .iter()
        .take(3)
        .map(|n| format!("{:?}", n.to_string_lossy()))
        .collect();
    if names.len() > 3 {
        examples.push(format!("{} more", names.len() - 3));
    }
    Err(DataDirError::Foreign {
        path: path.to_owned(),
        examples: examples.join(", "),
    })
}

fn is_state_name(name: &OsString) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    STATE_NAMES.contains(&name) || STATE_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A data directory this process holds. Dropping it releases the lock (so does the
/// process's death).
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    _lock: nix::fcntl::Flock<fs::File>,
}

impl DataDir {
    /// Creates (if missing), locks and marks the directory [`inspect`] found. Fails with
    /// [`DataDirError::InUse`] if another process holds it. Call it after the port is
    /// bound, so a start that cannot listen writes nothing.
    pub fn claim(path: &Path, found: Found) -> Result<DataDir, DataDirError> {
        if found == Found::Missing {
            create_private(path)?;
        }
        let dir = fs::File::open(path).map_err(io_err(path))?;
        let lock = match nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                let holder = fs::read_to_string(path.join(PID_FILE))
                    .ok()
                    .and_then(|t| t.trim().parse::<u32>().ok())
                    .map_or_else(|| "another process".to_owned(), |pid| format!("pid {pid}"));
                return Err(DataDirError::InUse {
                    path: path.to_owned(),
                    holder,
                });
            }
            Err((_, errno)) => return Err(io_err(path)(errno.into())),
        };
        // Checked again under the lock: another server may have claimed the directory
        // between the look and the lock (it then holds our files, which is fine), or
        // something foreign may have appeared (then we refuse, still writing nothing).
        let found = match inspect(path)? {
            Found::Missing => {
                return Err(io_err(path)(std::io::Error::other(
                    "the directory disappeared while starting",
                )))
            }
            now => now,
        };
        if found == Found::Empty {
            set_private(path)?;
        }
        if found != Found::Palisade {
            write_atomic(
                path,
                MARKER_FILE,
                &format!(
                    "# This directory holds a Palisade server's state (database, signing keys, \
                     epoch ledger).\n# Keep other files out of it. Back it up with \
                     `palisade admin backup`.\nformat = {FORMAT}\n"
                ),
            )?;
            if found == Found::Legacy {
                tracing::info!(dir = %path.display(), "adopted a data directory of an earlier version (marker written)");
            }
        }
        warn_if_open(path);
        write_atomic(path, PID_FILE, &format!("{}\n", std::process::id()))?;
        Ok(DataDir {
            path: path.to_owned(),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        // Still locked here (the lock field is dropped after this runs), so the pid file
        // is ours to remove. After a crash it stays, naming a dead process; it is read
        // only when the lock is held by someone.
        let _ = fs::remove_file(self.path.join(PID_FILE));
    }
}

/// The state a start creates in a directory that had none, taken back if the start fails
/// before its state is whole: a first start that fails half-way (a full disk while the
/// log's segments are zero-filled, a key file that cannot be read) leaves the directory
/// as it found it, so that the next start is a first start again rather than a refusal
/// ("signing-keys.json is missing, but palisade.redb exists"). Call
/// [`FirstStart::complete`] once the database and the key set are both there; dropped
/// before that, it removes every state file ([`STATE_NAMES`], [`STATE_PREFIXES`]) that was
/// not there when it began.
#[derive(Debug)]
pub struct FirstStart {
    path: PathBuf,
    before: Vec<OsString>,
    /// The witness this start would make (none was there when it began).
    witness: Option<PathBuf>,
    complete: bool,
}

impl FirstStart {
    /// Notes the state files `path` holds now, and whether `witness` is there.
    pub fn begin(path: &Path, witness: Option<&Path>) -> Result<FirstStart, DataDirError> {
        Ok(FirstStart {
            path: path.to_owned(),
            before: state_files(path)?,
            witness: witness.filter(|w| !w.exists()).map(Path::to_path_buf),
            complete: false,
        })
    }

    /// The state is whole: nothing is taken back any more.
    pub fn complete(mut self) {
        self.complete = true;
    }
}

impl Drop for FirstStart {
    fn drop(&mut self) {
        if self.complete {
            return;
        }
        if let Some(witness) = &self.witness {
            // Nothing was issued: a witness left behind would refuse the next first start.
            let _ = fs::remove_file(witness);
        }
        let Ok(now) = state_files(&self.path) else {
            return;
        };
        let made: Vec<&OsString> = now.iter().filter(|n| !self.before.contains(n)).collect();
        for name in &made {
            if let Err(e) = fs::remove_file(self.path.join(name)) {
                tracing::warn!(file = %self.path.join(name).display(), error = %e, "cannot remove a file of a failed first start");
            }
        }
        if !made.is_empty() {
            let _ = fs::File::open(&self.path).and_then(|d| d.sync_all());
            tracing::info!(dir = %self.path.display(), files = made.len(), "the first start failed: removed the files it had made");
        }
    }
}

/// Where the embedded store keeps its witness (`palisade_storage::redb_backend::witness`):
/// a small file outside the data directory that a copy of the directory put back cannot
/// take back with it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Witness {
    /// `DATA_DIR.witness`, beside the directory in its parent: on another volume when the
    /// data directory is a volume of its own.
    #[default]
    Beside,
    At(PathBuf),
    /// None: a directory put back from an older copy is not recognised.
    Off,
}

impl Witness {
    /// The witness file for `data_dir`, or None when it is off.
    pub fn path(&self, data_dir: &Path) -> Result<Option<PathBuf>, DataDirError> {
        match self {
            Witness::Off => Ok(None),
            Witness::At(path) => {
                let inside = std::path::absolute(path)
                    .ok()
                    .zip(std::path::absolute(data_dir).ok())
                    .is_some_and(|(w, d)| w.starts_with(d));
                if inside {
                    return Err(DataDirError::WitnessInside {
                        path: data_dir.to_owned(),
                        witness: path.clone(),
                    });
                }
                Ok(Some(path.clone()))
            }
            Witness::Beside => {
                let absolute = std::path::absolute(data_dir).map_err(io_err(data_dir))?;
                let name = absolute.file_name().map(|n| n.to_os_string());
                let parent = absolute.parent().map(Path::to_path_buf);
                match (parent, name) {
                    (Some(parent), Some(mut name)) => {
                        name.push(".witness");
                        Ok(Some(parent.join(name)))
                    }
                    _ => Err(DataDirError::NoWitnessPlace {
                        path: data_dir.to_owned(),
                    }),
                }
            }
        }
    }
}

/// Names of the state files in `path`.
fn state_files(path: &Path) -> Result<Vec<OsString>, DataDirError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(path).map_err(io_err(path))? {
        let name = entry.map_err(io_err(path))?.file_name();
        if is_state_name(&name) {
            names.push(name);
        }
    }
    Ok(names)
}

fn create_private(path: &Path) -> Result<(), DataDirError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(path).map_err(io_err(path))
}

fn set_private(path: &Path) -> Result<(), DataDirError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(io_err(path))?;
    }
    let _ = path;
    Ok(())
}

/// Warns when group or others may read an existing data directory (its mode is the
/// owner's choice; it is not changed).
fn warn_if_open(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = fs::metadata(path) {
            if meta.permissions().mode() & 0o077 != 0 {
                tracing::warn!(
                    dir = %path.display(),
                    mode = format!("{:o}", meta.permissions().mode() & 0o777),
                    "the data directory holds the signing keys and may be read by others: chmod 700 it"
                );
            }
        }
    }
    let _ = path;
}

/// Writes `name` in `dir` so that a crash leaves the old file or the new one
/// ([`palisade_storage::atomic_file`]).
fn write_atomic(dir: &Path, name: &str, text: &str) -> Result<(), DataDirError> {
    palisade_storage::atomic_file::write_atomic(dir, name, text.as_bytes())
        .map_err(io_err(&dir.join(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn missing_dir_is_created_private_and_marked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        assert_eq!(inspect(&dir).unwrap(), Found::Missing);
        let held = DataDir::claim(&dir, Found::Missing).unwrap();
        assert_eq!(listing(&dir), [MARKER_FILE, PID_FILE]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700);
        }
        drop(held);
        assert_eq!(
            listing(&dir),
            [MARKER_FILE],
            "the pid file goes with the lock"
        );
        assert_eq!(inspect(&dir).unwrap(), Found::Palisade);
    }

    #[test]
    fn empty_dir_and_fresh_volume_are_adopted() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(inspect(tmp.path()).unwrap(), Found::Empty);
        fs::create_dir(tmp.path().join("lost+found")).unwrap();
        assert_eq!(inspect(tmp.path()).unwrap(), Found::Empty);
        let _held = DataDir::claim(tmp.path(), Found::Empty).unwrap();
        assert_eq!(inspect(tmp.path()).unwrap(), Found::Palisade);
    }

    #[test]
    fn foreign_dir_is_refused_and_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        for name in ["notes.txt", "Cargo.toml", "src", "z"] {
            fs::write(tmp.path().join(name), "x").unwrap();
        }
        let before = listing(tmp.path());
        let err = inspect(tmp.path()).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, DataDirError::Foreign { .. }), "{text}");
        assert!(
            text.contains("\"Cargo.toml\"") && text.contains("1 more"),
            "{text}"
        );
        assert_eq!(listing(tmp.path()), before);
    }

    #[test]
    fn files_of_earlier_versions_make_a_legacy_dir() {
        for name in [
            "palisade.redb",
            "signing-keys.json",
            "issuer.key",
            "epoch-ledger.json",
            "epoch-ledger.floor.json",
            "palisade.redb.wal.00000000000000000001",
        ] {
            let tmp = tempfile::tempdir().unwrap();
            fs::write(tmp.path().join(name), "x").unwrap();
            fs::write(tmp.path().join("stray.txt"), "x").unwrap();
            assert_eq!(inspect(tmp.path()).unwrap(), Found::Legacy, "{name}");
            let _held = DataDir::claim(tmp.path(), Found::Legacy).unwrap();
            assert_eq!(inspect(tmp.path()).unwrap(), Found::Palisade, "{name}");
            assert!(tmp.path().join(name).exists());
        }
    }

    #[test]
    fn markers_of_other_formats_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join(MARKER_FILE), "format = 2\n").unwrap();
        assert!(matches!(
            inspect(tmp.path()),
            Err(DataDirError::NewerFormat { found: 2, .. })
        ));
        fs::write(tmp.path().join(MARKER_FILE), "format = \"one\"\n").unwrap();
        assert!(matches!(
            inspect(tmp.path()),
            Err(DataDirError::BadMarker { .. })
        ));
    }

    #[test]
    fn a_file_is_not_a_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        fs::write(&file, "x").unwrap();
        assert!(matches!(
            inspect(&file),
            Err(DataDirError::NotADirectory { .. })
        ));
    }

    #[test]
    fn a_held_directory_names_its_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let _held = DataDir::claim(tmp.path(), Found::Empty).unwrap();
        let err = DataDir::claim(tmp.path(), Found::Palisade).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("in use by pid {}", std::process::id())),
            "{text}"
        );
    }

    #[test]
    fn the_witness_goes_beside_the_directory_and_never_inside_it() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        assert_eq!(
            Witness::Beside.path(&data).unwrap(),
            Some(tmp.path().join("data.witness"))
        );
        // A trailing `.` names the same directory.
        assert_eq!(
            Witness::Beside.path(&data.join(".")).unwrap(),
            Some(tmp.path().join("data.witness"))
        );
        assert_eq!(Witness::Off.path(&data).unwrap(), None);
        let elsewhere = tmp.path().join("other-volume/w");
        assert_eq!(
            Witness::At(elsewhere.clone()).path(&data).unwrap(),
            Some(elsewhere)
        );
        let inside = Witness::At(data.join("w")).path(&data).unwrap_err();
        assert!(
            matches!(inside, DataDirError::WitnessInside { .. }),
            "{inside}"
        );
        assert!(matches!(
            Witness::Beside.path(Path::new("/")),
            Err(DataDirError::NoWitnessPlace { .. })
        ));
    }
}
