//! The simulated Palisade node: the real issuer core, the real gate and real tokens,
//! wired together the way `palisade-issuer`'s async shell and the server's KV handlers
//! wire them.
//!
//! - **The issuer** is [`IssuerCore`] itself, the very state machine the embedded issuer
//!   runs, fed with the simulated clock: acquisitions, keepalives and releases from the
//!   network, durable writes completed by the simulated disk, and its timer. Its actions
//!   are carried out here as the shell carries them out: lazy records and durable writes
//!   go to the simulated writer (a write is reported back with `IssuerCore::written` only
//!   once its batch is fsync'd), replies go out over the network (a grant signed with the
//!   issuer key), the timer becomes a tick event, and its notes feed the monitor.
//! - **Fenced mutations**: missing token -> `missing_token`, token that does not verify ->
//!   `invalid_token`, token for another lock -> `wrong_lock`; otherwise the store runs the
//!   gate and the mutation in one batch and answers after fsync.
//! - **Reads** see the durable state.
//! - **Restart** rebuilds the core from the durable records with `IssuerCore::recover`,
//!   exactly like the embedded issuer.
//!
//! Not modelled: the HTTP layer (routing, JSON, connection handling), waiters that hang up
//! (the waiter here never tells the node it left, so its grant lives out its TTL: the
//! safe direction), sessions, values and proclamations, tokens signed ahead, the token
//! verification cache's capacity, and storage I/O errors.

use std::collections::BTreeMap;

use palisade_core::lock_table::{AcquireRequest, TableConfig};
use palisade_issuer::core::{Action, IssuerCore, Reply as CoreReply, ReqId, Write};
use palisade_issuer::LeaseChange;
use palisade_storage::LazyRecord;
use palisade_token::{KeyRing, Signer, Verifier};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::config::Bug;
use crate::monitor::Monitor;
use crate::net::{Body, Envelope, Node, Reply, Request};
use crate::scenario::Scenario;
use crate::store::{Answer, Job, LeaseRecord, Store};
use crate::world::{Out, SimEvent};

mod lifecycle;

/// The issuer key: the same on every restart (it lives in `issuer.key`).
const ISSUER_SECRET: [u8; 32] = [0x5a; 32];

pub(crate) struct Server {
    pub up: bool,
    pub incarnation: u64,
    core: IssuerCore,
    table_config: TableConfig,
    signer: Signer,
    verifier: Verifier,
    pub store: Store,
    /// Requests the core will answer later: who asked.
    requests: BTreeMap<ReqId, (usize, u64)>,
    next_req: ReqId,
    rng: ChaCha8Rng,
    bug: Option<Bug>,
}

fn verifier_for(signer: &Signer) -> Verifier {
    let mut keys = KeyRing::new();
    keys.insert(signer.public_key());
    Verifier::new(keys, 1024)
}

/// A fresh core that reports its notes (they feed the monitor).
fn observed(mut core: IssuerCore) -> IssuerCore {
    core.observe();
    core
}

impl Server {
    pub(crate) fn new(rng: ChaCha8Rng, sc: &Scenario, bug: Option<Bug>) -> Server {
        let signer = Signer::from_secret(ISSUER_SECRET);
        let table_config = TableConfig {
            lock_delay_ms: sc.lock_delay_ms,
            epoch_block: sc.epoch_block,
            idle_grace_ms: sc.idle_grace_ms,
            ..TableConfig::default()
        };
        Server {
            up: true,
            incarnation: 0,
            core: observed(IssuerCore::new(table_config)),
            table_config,
            verifier: verifier_for(&signer),
            signer,
            store: Store::default(),
            requests: BTreeMap::new(),
            next_req: 0,
            rng,
            bug,
        }
    }

    /// Names a request the core answers later.
    fn register(&mut self, client: usize, req_id: u64) -> ReqId {
        let id = self.next_req;
        self.next_req += 1;
        self.requests.insert(id, (client, req_id));
        id
    }

    /// Handles a request that reached the node.
    pub(crate) fn handle(&mut self, now: u64, env: Envelope, out: &mut Out, mon: &mut Monitor) {
        let (Node::Client(client), Body::Request(request)) = (env.from, env.body) else {
            return;
        };
        let req_id = env.req_id;
        let reply = |out: &mut Out, reply: Reply| {
            out.send(
                Node::Server,
                Node::Client(client),
                req_id,
                Body::Reply(reply),
            )
        };
        match request {
            Request::Acquire {
                lock,
                lease_id,
                ttl_ms,
                wait_ms,
            } => {
                let req = AcquireRequest {
                    lock,
                    holder: format!("client-{client}"),
                    ttl_ms,
                    wait_ms,
                    lease_id,
                    ..AcquireRequest::default()
                };
                let id = self.register(client, req_id);
                self.core.acquire(now, id, req);
            }
            Request::Keepalive { lease_id } => match self.core.keepalive(now, &lease_id, None) {
                Ok(_) => reply(out, Reply::LeaseOk),
                Err(_) => reply(out, Reply::LeaseExpired),
            },
            Request::Release { lease_id } => {
                let id = self.register(client, req_id);
                self.core.release(now, id, &lease_id, None);
            }
            Request::Mutate {
                lock,
                token,
                action,
            } => {
                let claims = match token.as_deref().map(|t| self.verifier.verify(t)) {
                    None => return reply(out, Reply::Refused("missing_token")),
                    Some(Err(_)) => return reply(out, Reply::Refused("invalid_token")),
                    Some(Ok(claims)) => claims,
                };
                if claims.lock != lock {
                    return reply(out, Reply::Refused("wrong_lock"));
                }
                let job = Job::Mutate {
                    lock: lock.clone(),
                    epoch: claims.epoch,
                    action,
                };
                let answer = Answer {
                    client,
                    req_id,
                    lock,
                };
                self.submit(now, job, Some(answer), out);
            }
            Request::Get { lock, key } => {
                let value = self
                    .store
                    .durable()
                    .namespaces
                    .get(&lock)
                    .and_then(|ns| ns.values.get(&key).cloned());
                reply(out, Reply::Value(value));
            }
        }
        self.perform(now, out, mon);
    }

    fn submit(&mut self, now: u64, job: Job, answer: Option<Answer>, out: &mut Out) {
        if self.store.submit(job, answer) {
            let at = now + self.rng.gen_range(0..=1);
            out.at(at, SimEvent::CommitStart(self.incarnation));
        }
    }

    /// Carries out the core's actions, in order, as the embedded issuer's shell does.
    fn perform(&mut self, now: u64, out: &mut Out, mon: &mut Monitor) {
        loop {
            let actions = self.core.take_actions();
            if actions.is_empty() {
                return;
            }
            for action in actions {
                match action {
                    Action::Lazy(LazyRecord::Lease(r)) => {
                        self.submit(now, Job::LazyLease(LeaseRecord::from(r)), None, out)
                    }
                    Action::Lazy(LazyRecord::RemoveLease(id)) => {
                        self.submit(now, Job::LazyRemoveLease(id), None, out)
                    }
                    Action::Lazy(LazyRecord::Reservation { lock, reservation }) => {
                        let job = Job::LazyReservation { lock, reservation };
                        self.submit(now, job, None, out)
                    }
                    Action::Write { id, write } => {
                        let job = match write {
                            Write::Reserve {
                                lock,
                                reservation,
                                lease,
                            } => Job::Reserve {
                                lock,
                                reservation,
                                lease: Some(LeaseRecord::from(lease)),
                                write: id,
                            },
                            Write::RemoveLease(lease_id) => Job::RemoveLease {
                                lease_id,
                                write: id,
                            },
                        };
                        self.submit(now, job, None, out);
                    }
                    Action::Reply { to, reply } => self.reply(to, reply, out, mon),
                    Action::Note(note) => match note.change {
                        LeaseChange::Granted => {
                            mon.granted(now, &note.lock, note.epoch, &note.lease_id, note.ttl_ms)
                        }
                        LeaseChange::Released | LeaseChange::Expired | LeaseChange::Ended => {
                            mon.lease_ended(&note.lock, &note.lease_id)
                        }
                    },
                    // Signing ahead is an optimisation of the shell: the token is the same.
                    Action::SignAhead { .. } => {}
                    Action::Timer { at } => out.at(at.max(now), SimEvent::Tick(self.incarnation)),
                }
            }
        }
    }

    /// Sends the core's answer to the client that asked; a grant goes out signed.
    fn reply(&mut self, to: ReqId, reply: CoreReply, out: &mut Out, mon: &mut Monitor) {
        let Some((client, req_id)) = self.requests.remove(&to) else {
            return;
        };
        let reply = match reply {
            CoreReply::Acquire(Ok(grant)) => {
                let token = self.signer.issue(&grant.lock, grant.epoch, &grant.holder);
                let durable = self.store.durable();
                mon.token_sent(out.now, &grant.lock, grant.epoch, &grant.lease_id, durable);
                Reply::Granted {
                    token,
                    epoch: grant.epoch,
                    lease_id: grant.lease_id,
                }
            }
            // No quota is configured here, no session is made and the disk never fails:
            // a refusal is only ever `Held`.
            CoreReply::Acquire(Err(_)) => Reply::Held,
            CoreReply::Lease(Ok(_)) => Reply::LeaseOk,
            CoreReply::Lease(Err(_)) | CoreReply::Session(_) => Reply::LeaseExpired,
        };
        out.send(
            Node::Server,
            Node::Client(client),
            req_id,
            Body::Reply(reply),
        );
    }

    /// The core's timer fired.
    pub(crate) fn tick(&mut self, now: u64, out: &mut Out, mon: &mut Monitor) {
        self.core.tick(now);
        self.perform(now, out, mon);
    }
}
