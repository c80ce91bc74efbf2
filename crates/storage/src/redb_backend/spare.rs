//! The spare log segment: one zero-filled file, `<db>.wal.spare`, prepared off the write
//! path (by the checkpointer thread, and at open) and made the next segment by a rename
//! when the log rolls (`wal.rs` has the files).
//!
//! ## Invariant
//! The file in the slot is the file under the name `.wal.spare`. Every step that changes
//! either holds the slot's lock from start to end: preparing (create the zero-filled file,
//! which puts it under the name, then fill the slot) and taking (empty the slot, write the
//! segment's header, rename `.wal.spare` to the segment's name).
//!
//! Without that, a preparation finishing between a take and its rename puts a new file
//! under `.wal.spare`; the rename then gives the segment's name to that new, all-zero
//! file, while the records go, fdatasynced and acknowledged, into the taken file, which
//! no longer has a name: at the next start recovery sees a spare never used where the
//! segment was, and the acknowledged commits are gone.
//!
//! ## Cost
//! A roll that comes while a spare is being prepared waits for it (a zero-fill and one
//! fdatasync), which is what creating its own segment would cost it anyway.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::wal::{self, LogDir, LogFile};

/// The slot of the prepared spare. See the module docs.
#[derive(Default)]
pub(super) struct Spare {
    slot: Mutex<Option<Arc<dyn LogFile>>>,
}

impl Spare {
    fn slot(&self) -> MutexGuard<'_, Option<Arc<dyn LogFile>>> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the spare a previous run left (unused, `bytes` long) if there is one;
    /// otherwise prepares one.
    pub(super) fn adopt(&self, log: &dyn LogDir, bytes: u64) -> std::io::Result<()> {
        let name = wal::spare_name(log.stem());
        let mut slot = self.slot();
        if slot.is_none() && log.list()?.contains(&name) {
            if let Ok(file) = log.open(&name) {
                let unused = matches!(wal::read_header(file.as_ref()), Ok(None));
                if unused && file.len().ok() == Some(bytes) {
                    *slot = Some(file);
                }
            }
        }
        Self::fill(&mut slot, log, bytes)
    }

    /// Prepares a spare of `bytes` unless one is ready.
    pub(super) fn prepare(&self, log: &dyn LogDir, bytes: u64) -> std::io::Result<()> {
        Self::fill(&mut self.slot(), log, bytes)
    }

    fn fill(
        slot: &mut Option<Arc<dyn LogFile>>,
        log: &dyn LogDir,
        bytes: u64,
    ) -> std::io::Result<()> {
        if slot.is_none() {
            *slot = Some(log.create_zeroed(&wal::spare_name(log.stem()), bytes)?);
        }
        Ok(())
    }

    /// Makes the spare the segment `name` with `header`, if one is ready: empties the slot,
    /// writes the header, renames the file. `None` when there is no spare (the caller
    /// creates the segment itself). An error leaves the slot empty.
    pub(super) fn take_as(
        &self,
        log: &dyn LogDir,
        name: &str,
        header: &[u8],
    ) -> std::io::Result<Option<Arc<dyn LogFile>>> {
        let mut slot = self.slot();
        let Some(file) = slot.take() else {
            return Ok(None);
        };
        file.write_at(0, header)?;
        log.rename(&wal::spare_name(log.stem()), name)?;
        Ok(Some(file))
    }
}
