//! The simulated Palisade node: the real lock table, the real gate and real tokens,
//! wired together the way `palisade-issuer` and the server's KV handlers wire them.
//!
//! - **Acquire**: the [`LockTable`] decides and the grant is signed with the issuer key.
//!   A grant the table marks as needing a reservation (`Grant::reserve`) is answered only
//!   once that reservation (with the lease record) is fsync'd and the table was told
//!   (`LockTable::confirm`); a grant inside a durable reservation is answered at once and
//!   its lease record written lazily. A queued waiter is answered the same way when the
//!   table hands it the lock, or refused when its wait runs out.
//! - **Keepalive** touches the table only. **Release** queues a lazy removal of the lease
//!   record *before* whatever hand-off it sets off, then answers after a second, durable
//!   removal. Expiries and idle markers are lazy records.
//! - **Fenced mutations**: missing token -> `missing_token`, token that does not verify ->
//!   `invalid_token`, token for another lock -> `wrong_lock`; otherwise the store runs the
//!   gate and the mutation in one batch and answers after fsync.
//! - **Reads** see the durable state.
//! - **Restart** rebuilds the table from the durable records with [`LockTable::restore`]
//!   (recorded leases honoured a full TTL) and [`LockTable::restore_reservations`] (locks
//!   with an active reservation wait out its TTL; epochs continue above the ceiling),
//!   exactly like the embedded issuer.
//!
//! Not modelled: the HTTP layer (routing, JSON, connection handling), the embedded
//! issuer's withdrawal of grants nobody waits for any more (the waiter here never tells
//! the node it left, so such a grant lives out its TTL: the safe direction), the token
//! verification cache's capacity, and storage I/O errors.

use std::collections::BTreeMap;

use palisade_core::lock_table::{AcquireOutcome, AcquireRequest, Event, Grant, LockTable};
use palisade_core::lock_table::{TableConfig, Ticket};
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
    table: LockTable,
    table_config: TableConfig,
    signer: Signer,
    verifier: Verifier,
    pub store: Store,
    waiters: BTreeMap<Ticket, (usize, u64)>,
    next_tick: Option<u64>,
    rng: ChaCha8Rng,
    bug: Option<Bug>,
}

fn verifier_for(signer: &Signer) -> Verifier {
    let mut keys = KeyRing::new();
    keys.insert(signer.public_key());
    Verifier::new(keys, 1024)
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
            table: LockTable::new(table_config),
            table_config,
            verifier: verifier_for(&signer),
            signer,
            store: Store::default(),
            waiters: BTreeMap::new(),
            next_tick: None,
            rng,
            bug,
        }
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
                let outcome = self.table.acquire(now, req);
                // The expiries the table settled before deciding come first.
                self.after_table_call(now, out, mon);
                match outcome {
                    AcquireOutcome::Granted(grant) => {
                        self.grant(now, grant, Some((client, req_id)), out, mon)
                    }
                    AcquireOutcome::Queued(ticket) => {
                        self.waiters.insert(ticket, (client, req_id));
                    }
                    // No quota is configured here, so a refusal is only ever `Held`.
                    // The simulation makes no sessions: `NoSession` cannot happen.
                    AcquireOutcome::Held { .. }
                    | AcquireOutcome::QuotaExceeded { .. }
                    | AcquireOutcome::NoSession => reply(out, Reply::Held),
                }
            }
            Request::Keepalive { lease_id } => match self.table.keepalive(now, &lease_id) {
                Ok(_) => reply(out, Reply::LeaseOk),
                Err(_) => reply(out, Reply::LeaseExpired),
            },
            Request::Release { lease_id } => {
                let result = self.table.release(now, &lease_id);
                if let Ok(view) = &result {
                    mon.lease_ended(&view.lock, &lease_id);
                    // Ahead of the hand-off's records, as the issuer does.
                    self.submit(now, Job::LazyRemoveLease(lease_id.clone()), None, out);
                }
                self.after_table_call(now, out, mon);
                match result {
                    Ok(view) => {
                        let answer = Answer {
                            client,
                            req_id,
                            lock: view.lock,
                            reply: Some(Reply::LeaseOk),
                        };
                        self.submit(now, Job::RemoveLease(lease_id), Some(answer), out);
                    }
                    Err(_) => reply(out, Reply::LeaseExpired),
                }
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
                    reply: None,
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
        self.after_table_call(now, out, mon);
    }

    /// Signs a grant; answers it at once if a durable reservation covers it, otherwise
    /// once its reservation is durable.
    fn grant(
        &mut self,
        now: u64,
        grant: Grant,
        to: Option<(usize, u64)>,
        out: &mut Out,
        mon: &mut Monitor,
    ) {
        mon.granted(now, &grant.lock, grant.epoch, &grant.lease_id, grant.ttl_ms);
        let token = self.signer.issue(&grant.lock, grant.epoch, &grant.holder);
        let answer = to.map(|(client, req_id)| Answer {
            client,
            req_id,
            lock: grant.lock.clone(),
            reply: Some(Reply::Granted {
                token,
                epoch: grant.epoch,
                lease_id: grant.lease_id.clone(),
            }),
        });
        let record = LeaseRecord {
            lease_id: grant.lease_id,
            lock: grant.lock.clone(),
            holder: grant.holder,
            epoch: grant.epoch,
            ttl_ms: grant.ttl_ms,
        };
        match grant.reserve {
            None => {
                self.submit(now, Job::LazyLease(record), None, out);
                if let Some(answer) = answer {
                    let reply = answer.reply.clone().unwrap_or(Reply::Held);
                    Self::answer((answer, reply), self.store.durable(), out, mon);
                }
            }
            Some(reservation) => {
                let job = Job::Reserve {
                    lock: grant.lock,
                    reservation,
                    lease: Some(record),
                    generation: grant.generation,
                };
                self.submit(now, job, answer, out);
            }
        }
    }

    fn submit(&mut self, now: u64, job: Job, answer: Option<Answer>, out: &mut Out) {
        if self.store.submit(job, answer) {
            let at = now + self.rng.gen_range(0..=1);
            out.at(at, SimEvent::CommitStart(self.incarnation));
        }
    }

    /// Carries out what the table decided as a side effect, and keeps its timer armed.
    fn after_table_call(&mut self, now: u64, out: &mut Out, mon: &mut Monitor) {
        for event in self.table.drain_events() {
            match event {
                Event::Granted { ticket, grant } => {
                    let to = self.waiters.remove(&ticket);
                    self.grant(now, grant, to, out, mon);
                }
                Event::TimedOut { ticket, .. } => {
                    if let Some((client, req_id)) = self.waiters.remove(&ticket) {
                        let body = Body::Reply(Reply::Held);
                        out.send(Node::Server, Node::Client(client), req_id, body);
                    }
                }
                Event::Expired { lease_id, lock, .. } => {
                    mon.lease_ended(&lock, &lease_id);
                    self.submit(now, Job::LazyRemoveLease(lease_id), None, out);
                }
                Event::Idle { lock, reservation } => {
                    let job = Job::LazyReservation { lock, reservation };
                    self.submit(now, job, None, out);
                }
                // No lock limit is configured here, and no session is made.
                Event::Forgotten { .. }
                | Event::SessionExpired { .. }
                | Event::SessionGone { .. } => {}
            }
        }
        if let Some(wake) = self.table.next_wakeup() {
            if self.next_tick.is_none_or(|t| wake < t) {
                self.next_tick = Some(wake);
                out.at(wake.max(now), SimEvent::Tick(self.incarnation));
            }
        }
    }

    /// The table's deadline passed.
    pub(crate) fn tick(&mut self, now: u64, out: &mut Out, mon: &mut Monitor) {
        self.next_tick = None;
        self.table.poll(now);
        self.after_table_call(now, out, mon);
    }
}
