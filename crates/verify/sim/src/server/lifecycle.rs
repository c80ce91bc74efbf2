//! The node's writer and process lifecycle: batch start, fsync, crash and restart.

use palisade_core::lock_table::{Grant, LockTable};
use rand::Rng;

use super::{verifier_for, Server};
use crate::config::Bug;
use crate::monitor::Monitor;
use crate::net::{Body, Node, Reply};
use crate::scenario::Scenario;
use crate::store::{Outgoing, Records};
use crate::world::{Out, SimEvent};

impl Server {
    /// The writer takes the queue and starts the fsync; returns how long it will take.
    pub(crate) fn begin_commit(
        &mut self,
        now: u64,
        sc: &Scenario,
        out: &mut Out,
        mon: &mut Monitor,
    ) -> u64 {
        let commit = self.store.begin_commit(self.bug);
        for (lock, epoch) in &commit.admitted {
            mon.admitted(now, lock, *epoch);
        }
        for outgoing in commit.early {
            Self::answer(outgoing, self.store.durable(), out, mon);
        }
        let slow = self.rng.gen_bool(sc.slow_fsync_prob);
        let took = if slow {
            self.rng.gen_range(sc.slow_fsync_ms.0..=sc.slow_fsync_ms.1)
        } else {
            self.rng.gen_range(sc.fsync_ms.0..=sc.fsync_ms.1)
        };
        out.at(now + took, SimEvent::FsyncDone(self.incarnation));
        took
    }

    /// The fsync returned: answer the batch, start the next one if jobs are waiting.
    pub(crate) fn finish_commit(&mut self, now: u64, out: &mut Out, mon: &mut Monitor) {
        let (durable, more) = self.store.finish_commit();
        mon.durable(now, self.store.durable(), false);
        for (lock, reservation, generation) in durable.confirms {
            self.table.confirm(now, &lock, reservation, generation);
        }
        self.after_table_call(now, out, mon);
        for outgoing in durable.answers {
            Self::answer(outgoing, self.store.durable(), out, mon);
        }
        if more {
            out.at(now, SimEvent::CommitStart(self.incarnation));
        }
    }

    /// Sends an answer; `durable` is the disk as it is when the answer leaves.
    pub(super) fn answer(
        (answer, reply): Outgoing,
        durable: &Records,
        out: &mut Out,
        mon: &mut Monitor,
    ) {
        match &reply {
            Reply::Granted {
                epoch, lease_id, ..
            } => mon.token_sent(out.now, &answer.lock, *epoch, lease_id, durable),
            Reply::Applied { epoch, .. } => mon.mark_acked(&answer.lock, *epoch),
            _ => {}
        }
        let to = Node::Client(answer.client);
        out.send(Node::Server, to, answer.req_id, Body::Reply(reply));
    }

    /// The process dies: memory, queued jobs and unsent answers are gone.
    pub(crate) fn crash(&mut self, now: u64, torn: bool, mon: &mut Monitor) {
        mon.crashed(now);
        self.up = false;
        self.incarnation += 1;
        self.store.crash(torn);
        self.table = LockTable::new(self.table_config);
        self.waiters.clear();
        self.next_tick = None;
    }

    /// The process starts again from the durable records.
    pub(crate) fn restart(&mut self, now: u64, out: &mut Out, mon: &mut Monitor) {
        self.up = true;
        let records = self.store.durable().clone();
        mon.durable(now, &records, true);
        mon.restarted(now);
        let leases = records.leases.into_values().map(|r| Grant {
            lock: r.lock,
            holder: r.holder,
            epoch: r.epoch,
            lease_id: r.lease_id,
            ttl_ms: r.ttl_ms,
            reserve: None,
            generation: 0,
            ..Grant::default()
        });
        if self.bug == Some(Bug::ForgetLeasesOnRestart) {
            // Epochs only: neither lease records nor reservations are honoured.
            self.table.restore(now, records.epochs, Vec::new());
        } else {
            self.table.restore(now, records.epochs, leases);
            self.table.restore_reservations(now, records.reservations);
        }
        self.verifier = verifier_for(&self.signer);
        self.after_table_call(now, out, mon);
    }
}
