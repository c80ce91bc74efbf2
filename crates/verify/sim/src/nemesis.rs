//! The nemesis: node crashes and restarts, client partitions, client pauses.
//!
//! Each kind of fault re-arms itself at a random gap drawn from the scenario, until the
//! workload ends. Besides those periodic crashes, a node that crashes at all is sometimes
//! crashed at the worst moment: in the middle of a slow fsync, when answers, table
//! decisions and the disk disagree the most. A crash loses every unsynced write and every unsent answer; sometimes it
//! strikes right after an fsync reached the disk but before any answer of that batch went
//! out (a torn commit: durable, never acknowledged). The node restarts after a random
//! downtime. Partitions cut one client off the node; pauses freeze one client at an
//! arbitrary point of its work, possibly for longer than its lease.
//!
//! Not modelled: a crash *during* a write that tears the file (redb's recovery is trusted
//! to roll back to the last commit), losing the disk, or clock jumps on the node.

use rand::Rng;

use crate::world::{Out, SimEvent, World};

impl World<'_> {
    /// Arms the first fault of each kind the scenario has.
    pub(crate) fn start_nemesis(&mut self) {
        if let Some(gap) = self.sc.crash_every_ms {
            let at = self.nemesis.gen_range(gap.0..=gap.1);
            self.schedule(at, SimEvent::Crash { periodic: true });
        }
        if let Some(gap) = self.sc.partition_every_ms {
            let at = self.nemesis.gen_range(gap.0..=gap.1);
            let client = self.nemesis.gen_range(0..self.clients.len());
            self.schedule(at, SimEvent::Partition(client));
        }
        if let Some(gap) = self.sc.pause_every_ms {
            let at = self.nemesis.gen_range(gap.0..=gap.1);
            let client = self.nemesis.gen_range(0..self.clients.len());
            self.schedule(at, SimEvent::Pause(client));
        }
    }

    fn active(&self) -> bool {
        self.now < self.config.workload_ms
    }

    fn rand(&mut self, range: (u64, u64)) -> u64 {
        self.nemesis.gen_range(range.0..=range.1)
    }

    /// A batch's fsync takes `fsync_ms`: if it is a slow one, maybe crash inside it.
    pub(crate) fn maybe_crash_during_fsync(&mut self, fsync_ms: u64, out: &mut Out) {
        let armed = self.sc.crash_every_ms.is_some() && self.active();
        if armed && fsync_ms >= 20 && self.nemesis.gen_bool(0.25) {
            let at = self.now + self.nemesis.gen_range(1..fsync_ms);
            out.at(at, SimEvent::Crash { periodic: false });
        }
    }

    pub(crate) fn fault(&mut self, event: SimEvent, out: &mut Out) {
        let now = self.now;
        match event {
            SimEvent::Crash { periodic } if self.active() && !self.server.up => {
                // Down already (a targeted crash came first): keep the schedule going.
                if let Some(gap) = self.sc.crash_every_ms.filter(|_| periodic) {
                    out.at(now + self.rand(gap), SimEvent::Crash { periodic });
                }
            }
            SimEvent::Crash { periodic } if self.active() => {
                let torn = self.server.store.committing()
                    && self.nemesis.gen_bool(self.sc.torn_commit_prob);
                self.stats.crashes += 1;
                self.stats.torn_commits += u64::from(torn);
                self.server.crash(now, torn, &mut self.mon);
                let down = self.rand(self.sc.downtime_ms);
                out.at(now + down, SimEvent::Restart { periodic });
            }
            SimEvent::Crash { .. } => {}
            SimEvent::Restart { periodic } => {
                self.stats.restarts += 1;
                self.rec.restart(now);
                self.server.restart(now, out, &mut self.mon);
                if let Some(gap) = self.sc.crash_every_ms.filter(|_| periodic && self.active()) {
                    let at = now + self.rand(gap);
                    out.at(at, SimEvent::Crash { periodic });
                }
            }
            SimEvent::Partition(client) if self.active() => {
                self.stats.partitions += 1;
                self.net.partition(client);
                let heal = now + self.rand(self.sc.partition_ms);
                out.at(heal, SimEvent::Heal(client));
                if let Some(gap) = self.sc.partition_every_ms {
                    let next = self.nemesis.gen_range(0..self.clients.len());
                    out.at(now + self.rand(gap), SimEvent::Partition(next));
                }
            }
            SimEvent::Partition(_) => {}
            SimEvent::Heal(client) => self.net.heal(client),
            SimEvent::Pause(client) if self.active() => {
                self.stats.pauses += 1;
                let ms = self.rand(self.sc.pause_ms);
                self.clients[client].pause(now, ms, out);
                if let Some(gap) = self.sc.pause_every_ms {
                    let next = self.nemesis.gen_range(0..self.clients.len());
                    out.at(now + self.rand(gap), SimEvent::Pause(next));
                }
            }
            SimEvent::Pause(_) => {}
            other => unreachable!("not a fault: {other:?}"),
        }
    }
}
