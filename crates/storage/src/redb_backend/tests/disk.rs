//! A simulated machine for the engine's files: the database file (as a redb storage
//! backend) and the log directory, on one disk that can fail on demand or lose power.
//!
//! Every write since a file's last sync is kept aside. At the chosen sync (counted across
//! all files, in the order they happen) the power goes: that sync fails, the disk takes
//! nothing more, and each file's surviving image is its last synced image plus a
//! pseudo-random subset of the 4 KiB pages written since (the kernel flushes dirty pages in
//! any order; a page is written whole or not at all). Directory changes (create, rename,
//! remove) are durable at once.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redb::StorageBackend;

use super::xorshift;
use crate::redb_backend::wal::{LogDir, LogFile};

const PAGE: usize = 4096;

#[derive(Debug, Default, Clone)]
struct Platter {
    /// What survives a power cut for certain.
    durable: Vec<u8>,
    /// What reads see.
    view: Vec<u8>,
    /// Writes since the last sync: (offset, bytes), or a length change (offset, None).
    unsynced: Vec<(u64, Option<Vec<u8>>)>,
}

impl Platter {
    fn image_after_cut(&self, seed: &mut u64) -> Vec<u8> {
        let mut image = self.durable.clone();
        for (offset, write) in &self.unsynced {
            let offset = *offset as usize;
            match write {
                None => image.resize(offset, 0),
                Some(bytes) => {
                    if image.len() < offset + bytes.len() {
                        image.resize(offset + bytes.len(), 0);
                    }
                    // Pieces cut at absolute page boundaries, each kept or lost whole.
                    let mut at = offset;
                    while at < offset + bytes.len() {
                        let end = ((at / PAGE + 1) * PAGE).min(offset + bytes.len());
                        if xorshift(seed) & 1 == 0 {
                            image[at..end].copy_from_slice(&bytes[at - offset..end - offset]);
                        }
                        at = end;
                    }
                }
            }
        }
        image
    }
}

#[derive(Debug, Default)]
struct Machine {
    /// File id -> contents. Id 0 is the database file.
    files: BTreeMap<u64, Platter>,
    /// Names of the log directory -> file id.
    names: BTreeMap<String, u64>,
    next_id: u64,
    syncs: u64,
    /// The file id of every sync, in order (the last one the cut, if it came).
    synced: Vec<u64>,
    cut_at: Option<u64>,
    dead: bool,
    /// Every write and sync fails while set (and the disk is otherwise fine).
    broken: bool,
    /// How long a rename takes, and how many began.
    rename_delay: Option<std::time::Duration>,
    renames_begun: u64,
}

/// The disk. Cheap to clone; all clones are the same disk.
#[derive(Debug, Clone, Default)]
pub(crate) struct Disk(Arc<Mutex<Machine>>);

fn refused(m: &Machine) -> io::Result<()> {
    if m.dead {
        return Err(io::Error::other("injected power loss: the disk is gone"));
    }
    if m.broken {
        return Err(io::Error::other("injected I/O failure"));
    }
    Ok(())
}

impl Disk {
    fn machine(&self) -> MutexGuard<'_, Machine> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The database file on this disk.
    pub(crate) fn db_file(&self) -> DiskFile {
        self.machine().files.entry(0).or_default();
        DiskFile(self.clone(), 0)
    }

    /// The log directory on this disk.
    pub(crate) fn log_dir(&self) -> Arc<dyn LogDir> {
        Arc::new(DiskDir(self.clone()))
    }

    /// Arms the cut: the `n`-th sync from now fails and kills the disk.
    pub(crate) fn cut_after(&self, n: u64) {
        let mut m = self.machine();
        m.cut_at = Some(m.syncs + n);
    }

    pub(crate) fn syncs(&self) -> u64 {
        self.machine().syncs
    }

    pub(crate) fn dead(&self) -> bool {
        self.machine().dead
    }

    pub(crate) fn set_broken(&self, broken: bool) {
        self.machine().broken = broken;
    }

    /// Makes every rename take `delay` (before it happens), so that a test can act while
    /// one is under way.
    pub(crate) fn delay_renames(&self, delay: std::time::Duration) {
        self.machine().rename_delay = Some(delay);
    }

    pub(crate) fn renames_begun(&self) -> u64 {
        self.machine().renames_begun
    }

    /// What a failed check prints: the files synced since the disk was made, in order (id
    /// 0 is the database file), and the log directory's names with their file ids.
    pub(crate) fn trace(&self) -> String {
        let m = self.machine();
        format!("syncs by file id {:?}, names {:?}", m.synced, m.names)
    }

    /// Names in the log directory.
    pub(crate) fn names(&self) -> Vec<String> {
        self.machine().names.keys().cloned().collect()
    }

    /// A new disk holding what survives a power cut now, chosen by `seed`.
    pub(crate) fn after_cut(&self, mut seed: u64) -> Disk {
        let m = self.machine();
        let files = m
            .files
            .iter()
            .map(|(id, p)| {
                let image = p.image_after_cut(&mut seed);
                let platter = Platter {
                    durable: image.clone(),
                    view: image,
                    unsynced: Vec::new(),
                };
                (*id, platter)
            })
            .collect();
        Disk(Arc::new(Mutex::new(Machine {
            files,
            names: m.names.clone(),
            next_id: m.next_id,
            ..Machine::default()
        })))
    }

    fn read(&self, id: u64, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let m = self.machine();
        let start = offset as usize;
        m.files
            .get(&id)
            .and_then(|p| p.view.get(start..start + len))
            .map(<[u8]>::to_vec)
            .ok_or_else(|| io::Error::other("read past the end"))
    }

    fn write(&self, id: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut m = self.machine();
        refused(&m)?;
        let p = m.files.entry(id).or_default();
        let start = offset as usize;
        if p.view.len() < start + data.len() {
            p.view.resize(start + data.len(), 0);
        }
        p.view[start..start + data.len()].copy_from_slice(data);
        p.unsynced.push((offset, Some(data.to_vec())));
        Ok(())
    }

    fn set_len(&self, id: u64, len: u64) -> io::Result<()> {
        let mut m = self.machine();
        refused(&m)?;
        let p = m.files.entry(id).or_default();
        p.view.resize(len as usize, 0);
        p.unsynced.push((len, None));
        Ok(())
    }

    fn sync(&self, id: u64) -> io::Result<()> {
        let mut m = self.machine();
        refused(&m)?;
        m.syncs += 1;
        m.synced.push(id);
        if m.cut_at == Some(m.syncs) {
            m.dead = true;
            return Err(io::Error::other("injected power loss: the disk is gone"));
        }
        let p = m.files.entry(id).or_default();
        p.durable = p.view.clone();
        p.unsynced.clear();
        Ok(())
    }

    fn len(&self, id: u64) -> u64 {
        self.machine()
            .files
            .get(&id)
            .map_or(0, |p| p.view.len() as u64)
    }
}

/// One file of the disk.
#[derive(Debug)]
pub(crate) struct DiskFile(Disk, u64);

impl StorageBackend for DiskFile {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.0.len(self.1))
    }
    fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, io::Error> {
        self.0.read(self.1, offset, len)
    }
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.0.set_len(self.1, len)
    }
    fn sync_data(&self, _eventual: bool) -> Result<(), io::Error> {
        self.0.sync(self.1)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.0.write(self.1, offset, data)
    }
}

impl LogFile for DiskFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        buf.copy_from_slice(&self.0.read(self.1, offset, buf.len())?);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write(self.1, offset, data)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync(self.1)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.len(self.1))
    }
}

struct DiskDir(Disk);

impl LogDir for DiskDir {
    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self.0.names())
    }

    fn open(&self, name: &str) -> io::Result<Arc<dyn LogFile>> {
        let id = self.0.machine().names.get(name).copied();
        let id = id.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, name.to_owned()))?;
        Ok(Arc::new(DiskFile(self.0.clone(), id)))
    }

    /// Like the real one (a temporary file renamed once synced): the name appears only
    /// once the zeros are durable.
    fn create_zeroed(&self, name: &str, bytes: u64) -> io::Result<Arc<dyn LogFile>> {
        let id = {
            let mut m = self.0.machine();
            refused(&m)?;
            m.next_id += 1;
            m.next_id
        };
        self.0.write(id, 0, &vec![0u8; bytes as usize])?;
        self.0.sync(id)?;
        let mut m = self.0.machine();
        refused(&m)?;
        m.names.insert(name.to_owned(), id);
        Ok(Arc::new(DiskFile(self.0.clone(), id)))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let delay = {
            let mut m = self.0.machine();
            m.renames_begun += 1;
            m.rename_delay
        };
        if let Some(delay) = delay {
            std::thread::sleep(delay);
        }
        let mut m = self.0.machine();
        refused(&m)?;
        let id = m
            .names
            .remove(from)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, from.to_owned()))?;
        m.names.insert(to.to_owned(), id);
        Ok(())
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        let mut m = self.0.machine();
        refused(&m)?;
        if let Some(id) = m.names.remove(name) {
            m.files.remove(&id);
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        refused(&self.0.machine())
    }

    fn describe(&self, name: &str) -> String {
        format!("disk:{name}")
    }

    fn stem(&self) -> &str {
        "palisade.redb"
    }
}
