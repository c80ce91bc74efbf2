//! The node's writer and process lifecycle: batch start, fsync, crash and restart.

use palisade_issuer::core::IssuerCore;
use palisade_storage::IssuerState;
use rand::Rng;

use super::{observed, verifier_for, Server};
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
        // The planted bug: the core hears its reservation is durable before the fsync.
        for id in commit.early_written {
            self.core.written(now, id, Ok(()));
        }
        self.perform(now, out, mon);
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
        for id in durable.written {
            self.core.written(now, id, Ok(()));
        }
        self.perform(now, out, mon);
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
        // Whatever the core knew and was still waiting for is gone with the process.
        self.core = IssuerCore::new(self.table_config);
        self.requests.clear();
    }

    /// The process starts again from the durable records.
    pub(crate) fn restart(&mut self, now: u64, out: &mut Out, mon: &mut Monitor) {
        self.up = true;
        let records = self.store.durable().clone();
        mon.durable(now, &records, true);
        mon.restarted(now);
        let mut state = IssuerState {
            epochs: records.epochs.into_iter().collect(),
            leases: records.leases.into_values().map(Into::into).collect(),
            reservations: records.reservations.into_iter().collect(),
            epoch_floor: 0,
        };
        if self.bug == Some(Bug::ForgetLeasesOnRestart) {
            // Epochs only: neither lease records nor reservations are honoured.
            state.leases.clear();
            state.reservations.clear();
        }
        self.core = observed(IssuerCore::recover(self.table_config, now, state).0);
        self.verifier = verifier_for(&self.signer);
        self.perform(now, out, mon);
    }
}
