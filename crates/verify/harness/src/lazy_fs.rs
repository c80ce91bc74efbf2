//! [`LazyFs`]: a FUSE file system over a folder that keeps every file's writes in memory
//! until the file is fsynced, so that the harness can take a machine down: after the
//! database's processes are SIGKILLed, [`LazyFs::lose_unsynced`] drops what no fsync
//! reached, as a power loss drops the page cache. Without it a killed process loses
//! nothing it had written (the kernel's page cache outlives it), and the settings that
//! trade fsyncs for speed (Redis `appendfsync everysec`) cannot be shown to lose anything.
//!
//! The model, stated so that a clean run is not read as more than it is:
//! - **File data is lazy.** The first write (or truncate) to a file since its last fsync
//!   copies the file into memory; writes, truncates and reads of it then go to that
//!   copy; `fsync`/`fdatasync` writes the copy to the folder and fsyncs it there. A power
//!   loss forgets every copy: each file is back to what its last fsync left.
//! - **Metadata is not.** Creating, renaming and removing files and folders go to the
//!   folder at once and survive a power loss, as on a journaled file system that commits
//!   them in order. A real disk can also lose a rename or a create that no directory
//!   fsync followed; this file system cannot show that.
//!
//! Written here, not taken: LazyFS (the tool Jepsen uses for this) is a C++ FUSE program
//! that no distribution packages; the FUSE protocol itself is the `fuser` crate's, and
//! this module is only the lazy policy over a folder, in one mutex. Mounting needs
//! `/dev/fuse` and root (or `fusermount3`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, LockOwner, MountOption, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

use crate::VerifyError;

/// Attributes and entries are never cached by the kernel: sizes change under it when
/// unsynced data is lost.
const TTL: Duration = Duration::ZERO;

/// A mounted lazy file system; dropping it unmounts it.
pub struct LazyFs {
    state: Arc<Mutex<State>>,
    mountpoint: PathBuf,
    _session: BackgroundSession,
}

impl LazyFs {
    /// Mounts a lazy view of `folder` at `mountpoint` (both existing folders).
    pub fn mount(folder: &Path, mountpoint: &Path) -> Result<LazyFs, VerifyError> {
        let state = Arc::new(Mutex::new(State::new(folder.to_owned())));
        let fs = Lazy {
            state: state.clone(),
        };
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::FSName("palisade-lazyfs".into()),
            MountOption::DefaultPermissions,
        ];
        config.acl = fuser::SessionACL::All;
        let session = fuser::spawn_mount(fs, mountpoint, &config).map_err(|e| {
            VerifyError::io(
                format!(
                    "cannot mount the lazy file system at {} (it needs /dev/fuse and root)",
                    mountpoint.display()
                ),
                e,
            )
        })?;
        Ok(LazyFs {
            state,
            mountpoint: mountpoint.to_owned(),
            _session: session,
        })
    }

    /// Where the lazy view is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// A power loss: forgets every write no fsync reached. Returns how many files had
    /// unsynced writes. Call it only while nothing runs on the file system (its
    /// processes killed and reaped).
    pub fn lose_unsynced(&self) -> usize {
        let mut state = lock(&self.state);
        let files = state.dirty.len();
        state.dirty.clear();
        files
    }
}

/// Everything the file system knows, behind one mutex.
struct State {
    folder: PathBuf,
    /// Inode (the folder's own inode numbers; 1 for the root) to the path in the folder.
    paths: HashMap<u64, PathBuf>,
    /// Unsynced content: inode to the whole file as the processes see it.
    dirty: HashMap<u64, Vec<u8>>,
    /// Open files: handle to (inode, the file in the folder).
    open: HashMap<u64, (u64, File)>,
    next_fh: u64,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    fn new(folder: PathBuf) -> State {
        State {
            paths: HashMap::from([(INodeNo::ROOT.0, folder.clone())]),
            folder,
            dirty: HashMap::new(),
            open: HashMap::new(),
            next_fh: 1,
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.paths.get(&ino.0).cloned().ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path(parent)?.join(name))
    }

    /// The inode number this file system gives `path` (whose metadata is `meta`).
    fn ino_of(&self, path: &Path, meta: &Metadata) -> u64 {
        if path == self.folder {
            INodeNo::ROOT.0
        } else {
            meta.ino()
        }
    }

    /// Looks `path` up in the folder and remembers it.
    fn enter(&mut self, path: PathBuf) -> Result<FileAttr, Errno> {
        let meta = std::fs::symlink_metadata(&path)?;
        let ino = self.ino_of(&path, &meta);
        self.paths.insert(ino, path);
        Ok(self.attr(ino, &meta))
    }

    /// The attributes of `ino`, its size from the unsynced copy if there is one.
    fn attr(&self, ino: u64, meta: &Metadata) -> FileAttr {
        let time = |secs: i64, nanos: i64| {
            let secs = u64::try_from(secs).unwrap_or(0);
            let nanos = u32::try_from(nanos).unwrap_or(0);
            UNIX_EPOCH + Duration::new(secs, nanos)
        };
        let kind = if meta.is_dir() {
            FileType::Directory
        } else if meta.file_type().is_symlink() {
            FileType::Symlink
        } else {
            FileType::RegularFile
        };
        let size = self
            .dirty
            .get(&ino)
            .map_or(meta.len(), |copy| copy.len() as u64);
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            crtime: time(meta.ctime(), meta.ctime_nsec()),
            kind,
            perm: (meta.mode() & 0o7777) as u16,
            nlink: u32::try_from(meta.nlink()).unwrap_or(u32::MAX),
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// The metadata of `ino`: by path, or for a file removed while open, by its handle.
    fn metadata(&self, ino: INodeNo) -> Result<Metadata, Errno> {
        if let Some(path) = self.paths.get(&ino.0) {
            return Ok(std::fs::symlink_metadata(path)?);
        }
        let (_, file) = self
            .open
            .values()
            .find(|(open, _)| *open == ino.0)
            .ok_or(Errno::ENOENT)?;
        Ok(file.metadata()?)
    }

    fn getattr(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let meta = self.metadata(ino)?;
        Ok(self.attr(ino.0, &meta))
    }

    /// The unsynced copy of `ino`, made from the folder's file on first use.
    fn copy(&mut self, ino: u64) -> Result<&mut Vec<u8>, Errno> {
        if !self.dirty.contains_key(&ino) {
            let content = match self.open.values().find(|(open, _)| *open == ino) {
                Some((_, file)) => read_all(file)?,
                None => std::fs::read(self.paths.get(&ino).ok_or(Errno::ENOENT)?)?,
            };
            self.dirty.insert(ino, content);
        }
        self.dirty.get_mut(&ino).ok_or(Errno::EIO)
    }

    /// Writes the unsynced copy of the file open as `fh` to the folder and fsyncs it.
    fn sync(&mut self, fh: FileHandle) -> Result<(), Errno> {
        let (ino, file) = self.open.get(&fh.0).ok_or(Errno::EBADF)?;
        if let Some(copy) = self.dirty.get(ino) {
            file.write_all_at(copy, 0)?;
            file.set_len(copy.len() as u64)?;
            file.sync_data()?;
            let ino = *ino;
            self.dirty.remove(&ino);
        } else {
            file.sync_data()?;
        }
        Ok(())
    }

    /// `ino` is no longer reachable by a path: its unsynced copy goes once no handle
    /// holds it open (as its blocks would).
    fn unlinked(&mut self, ino: u64) {
        self.paths.remove(&ino);
        if !self.open.values().any(|(open, _)| *open == ino) {
            self.dirty.remove(&ino);
        }
    }

    /// Paths under `from` move under `to` (a renamed folder).
    fn moved(&mut self, from: &Path, to: &Path) {
        for path in self.paths.values_mut() {
            if let Ok(rest) = path.strip_prefix(from) {
                *path = if rest.as_os_str().is_empty() {
                    to.to_owned()
                } else {
                    to.join(rest)
                };
            }
        }
    }

    fn open_file(&mut self, path: &Path, ino: u64, flags: OpenFlags) -> Result<u64, Errno> {
        let writable = !matches!(flags.acc_mode(), OpenAccMode::O_RDONLY);
        let file = OpenOptions::new().read(true).write(writable).open(path)?;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.open.insert(fh, (ino, file));
        Ok(fh)
    }
}

fn read_all(file: &File) -> io::Result<Vec<u8>> {
    let len = usize::try_from(file.metadata()?.len()).map_err(io::Error::other)?;
    let mut content = vec![0; len];
    file.read_exact_at(&mut content, 0)?;
    Ok(content)
}

/// The [`Filesystem`] the FUSE session calls.
struct Lazy {
    state: Arc<Mutex<State>>,
}

impl Lazy {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> Result<T, Errno>) -> Result<T, Errno> {
        f(&mut lock(&self.state))
    }
}

impl Filesystem for Lazy {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.with(|s| {
            let path = s.child(parent, name)?;
            s.enter(path)
        }) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.with(|s| s.getattr(ino)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.with(|s| {
            if let Some(mode) = mode {
                let path = s.path(ino)?;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777))?;
            }
            if let Some(size) = size {
                let len = usize::try_from(size).map_err(|_| Errno::EFBIG)?;
                s.copy(ino.0)?.resize(len, 0);
            }
            s.getattr(ino)
        }) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        match self.with(|s| {
            let path = s.child(parent, name)?;
            std::fs::create_dir(&path)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & !umask))?;
            s.enter(path)
        }) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.with(|s| {
            let path = s.child(parent, name)?;
            let ino = std::fs::symlink_metadata(&path)?.ino();
            std::fs::remove_file(&path)?;
            s.unlinked(ino);
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.with(|s| {
            let path = s.child(parent, name)?;
            let ino = std::fs::symlink_metadata(&path)?.ino();
            std::fs::remove_dir(&path)?;
            s.paths.remove(&ino);
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self.with(|s| {
            if !flags.is_empty() {
                return Err(Errno::EINVAL);
            }
            let (from, to) = (s.child(parent, name)?, s.child(newparent, newname)?);
            let replaced = std::fs::symlink_metadata(&to).ok().map(|meta| meta.ino());
            std::fs::rename(&from, &to)?;
            if let Some(ino) = replaced {
                s.unlinked(ino);
            }
            s.moved(&from, &to);
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.with(|s| {
            let path = s.path(ino)?;
            s.open_file(&path, ino.0, flags)
        }) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let state = lock(&self.state);
        if let Some(copy) = state.dirty.get(&ino.0) {
            let start = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(copy.len());
            let end = start.saturating_add(size as usize).min(copy.len());
            return reply.data(&copy[start..end]);
        }
        let Some((_, file)) = state.open.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let mut buf = vec![0; size as usize];
        let mut filled = 0;
        while filled < buf.len() {
            match file.read_at(&mut buf[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) => return reply.error(e.into()),
            }
        }
        reply.data(&buf[..filled]);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.with(|s| {
            let start = usize::try_from(offset).map_err(|_| Errno::EFBIG)?;
            let end = start.checked_add(data.len()).ok_or(Errno::EFBIG)?;
            let copy = s.copy(ino.0)?;
            if copy.len() < end {
                copy.resize(end, 0);
            }
            copy[start..end].copy_from_slice(data);
            u32::try_from(data.len()).map_err(|_| Errno::EFBIG)
        }) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut state = lock(&self.state);
        state.open.remove(&fh.0);
        if !state.paths.contains_key(&ino.0) {
            state.unlinked(ino.0);
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.with(|s| s.sync(fh)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = self.with(|s| {
            let path = s.path(ino)?;
            let mut entries = vec![
                (ino, FileType::Directory, ".".into()),
                (ino, FileType::Directory, "..".into()),
            ];
            for entry in std::fs::read_dir(&path)? {
                let entry = entry?;
                let meta = entry.metadata()?;
                let kind = if meta.is_dir() {
                    FileType::Directory
                } else {
                    FileType::RegularFile
                };
                entries.push((INodeNo(meta.ino()), kind, entry.file_name()));
            }
            Ok(entries)
        });
        match entries {
            Ok(entries) => {
                let skip = usize::try_from(offset).unwrap_or(usize::MAX);
                for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(skip) {
                    if reply.add(ino, i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Metadata is never lazy here (see the module docs).
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.with(|s| {
            let path = s.child(parent, name)?;
            let mut options = OpenOptions::new();
            options.read(true).write(true).mode(mode & !umask);
            if flags & libc::O_EXCL != 0 {
                options.create_new(true);
            } else {
                options.create(true);
            }
            drop(options.open(&path)?);
            let attr = s.enter(path.clone())?;
            let fh = s.open_file(&path, attr.ino.0, OpenFlags(flags))?;
            Ok((attr, fh))
        }) {
            Ok((attr, fh)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, SeekFrom, Write};

    use super::*;

    fn content(path: &Path) -> Vec<u8> {
        let mut out = Vec::new();
        File::open(path).unwrap().read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn writes_survive_a_power_loss_only_once_fsynced() {
        let (folder, mnt) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let fs = LazyFs::mount(folder.path(), mnt.path()).unwrap();
        let dir = fs.mountpoint().join("d");
        std::fs::create_dir(&dir).unwrap();
        let (synced, unsynced) = (dir.join("synced"), dir.join("unsynced"));

        let mut file = File::create(&synced).unwrap();
        file.write_all(b"kept").unwrap();
        file.sync_data().unwrap();
        file.write_all(b" and lost").unwrap();
        drop(file);
        std::fs::write(&unsynced, b"lost").unwrap();
        // The processes see every write; the folder only what was fsynced.
        assert_eq!(content(&synced), b"kept and lost");
        assert_eq!(content(&folder.path().join("d/synced")), b"kept");

        // A rename is metadata: it happens at once, and the data goes with the file.
        let renamed = dir.join("renamed");
        std::fs::rename(&unsynced, &renamed).unwrap();
        assert_eq!(content(&renamed), b"lost");

        assert_eq!(fs.lose_unsynced(), 2);
        assert_eq!(content(&synced), b"kept");
        assert_eq!(content(&renamed), b"");
        assert_eq!(std::fs::metadata(&renamed).unwrap().len(), 0);

        // Truncates and writes at an offset are lazy too, and fsync makes them durable.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&synced)
            .unwrap();
        file.set_len(2).unwrap();
        file.seek(SeekFrom::Start(4)).unwrap();
        file.write_all(b"!").unwrap();
        assert_eq!(content(&synced), b"ke\0\0!");
        file.sync_all().unwrap();
        drop(file);
        assert_eq!(fs.lose_unsynced(), 0);
        assert_eq!(content(&folder.path().join("d/synced")), b"ke\0\0!");
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["renamed", "synced"]);
    }
}
