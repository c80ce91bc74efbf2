//! The discrete-event loop: one virtual clock, one queue of timed events, one thread.
//!
//! Events at the same instant run in the order they were scheduled (a sequence number
//! breaks ties), and every random choice comes from a generator derived from the seed,
//! one stream per actor. So a seed fixes the whole run, down to the order of messages.
//! Actors never call each other: a handler gets an [`Out`], into which it puts messages
//! to send and timers to set, and the loop routes them (messages through the network).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::client::{Client, Ctx};
use crate::config::Config;
use crate::monitor::Monitor;
use crate::net::{Body, Envelope, Network, Node};
use crate::recorder::Recorder;
use crate::scenario::Scenario;
use crate::server::Server;
use crate::RunStats;

/// Something due at an instant of virtual time.
#[derive(Debug)]
pub(crate) enum SimEvent {
    Deliver(Envelope),
    /// The lock table's deadline, for the node incarnation that set it.
    Tick(u64),
    CommitStart(u64),
    FsyncDone(u64),
    /// A client's timer, with the generation that set it (older ones are void).
    ClientWake(usize, u64),
    ClientTimeout(usize, u64),
    /// A node crash; `periodic` ones re-arm the next after the restart.
    Crash {
        periodic: bool,
    },
    Restart {
        periodic: bool,
    },
    Partition(usize),
    Heal(usize),
    Pause(usize),
}

/// What a handler wants done: messages to send and timers to set.
pub(crate) struct Out {
    pub now: u64,
    sends: Vec<Envelope>,
    timers: Vec<(u64, SimEvent)>,
}

impl Out {
    pub(crate) fn send(&mut self, from: Node, to: Node, req_id: u64, body: Body) {
        self.sends.push(Envelope {
            from,
            to,
            req_id,
            body,
            held: false,
        });
    }

    pub(crate) fn at(&mut self, when: u64, event: SimEvent) {
        self.timers.push((when.max(self.now), event));
    }
}

struct Scheduled {
    at: u64,
    seq: u64,
    event: SimEvent,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Reversed: the heap pops the earliest first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// A seeded stream for one actor.
pub(crate) fn stream(seed: u64, actor: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(actor);
    rng
}

pub(crate) struct World<'c> {
    pub now: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled>,
    pub config: &'c Config,
    pub sc: Scenario,
    pub nemesis: ChaCha8Rng,
    pub net: Network,
    pub server: Server,
    pub clients: Vec<Client>,
    pub rec: Recorder,
    pub mon: Monitor,
    pub stats: RunStats,
    pub trace: Vec<String>,
}

impl<'c> World<'c> {
    pub(crate) fn new(seed: u64, config: &'c Config) -> World<'c> {
        let mut sc = Scenario::draw(&mut stream(seed, 0));
        if let Some(block) = config.epoch_block {
            sc.epoch_block = block.max(1);
        }
        let clients = (0..sc.clients)
            .map(|i| Client::new(i, stream(seed, 10 + i as u64), &sc))
            .collect();
        World {
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            config,
            nemesis: stream(seed, 1),
            net: Network::new(stream(seed, 2)),
            server: Server::new(stream(seed, 3), &sc, config.bug),
            clients,
            rec: Recorder::default(),
            mon: Monitor::default(),
            stats: RunStats::default(),
            trace: Vec::new(),
            sc,
        }
    }

    pub(crate) fn out(&self) -> Out {
        Out {
            now: self.now,
            sends: Vec::new(),
            timers: Vec::new(),
        }
    }

    /// Routes what a handler produced.
    pub(crate) fn apply(&mut self, out: Out) {
        for (at, event) in out.timers {
            self.schedule(at, event);
        }
        for mut env in out.sends {
            if let Some(at) = self.net.send(self.now, &mut env, &self.sc) {
                self.schedule(at, SimEvent::Deliver(env));
            }
        }
    }

    pub(crate) fn schedule(&mut self, at: u64, event: SimEvent) {
        self.seq += 1;
        let at = at.max(self.now);
        self.queue.push(Scheduled {
            at,
            seq: self.seq,
            event,
        });
    }

    /// Takes the next event due no later than `until`, advancing the clock to it.
    pub(crate) fn next(&mut self, until: u64) -> Option<SimEvent> {
        if self.queue.peek().is_none_or(|s| s.at > until) {
            return None;
        }
        let next = self.queue.pop()?;
        self.now = next.at;
        Some(next.event)
    }

    /// Drops every message still in the network.
    pub(crate) fn cut_network(&mut self) {
        let queue = std::mem::take(&mut self.queue);
        self.queue = queue
            .into_iter()
            .filter(|s| !matches!(s.event, SimEvent::Deliver(_)))
            .collect();
    }

    /// Runs one event.
    pub(crate) fn step(&mut self, event: SimEvent) {
        if self.config.trace {
            self.trace.push(format!("{:>6} {event:?}", self.now));
        }
        let mut out = self.out();
        let now = self.now;
        let inc = self.server.incarnation;
        let live = |i: u64| i == inc;
        match event {
            SimEvent::Deliver(env) => {
                if !self.net.arrives(&env) {
                    return;
                }
                match env.to {
                    Node::Server if self.server.up => {
                        self.server.handle(now, env, &mut out, &mut self.mon)
                    }
                    Node::Server => self.stats.lost_to_crash += 1,
                    Node::Client(c) => {
                        let mut ctx = self.ctx(&mut out);
                        ctx.0[c].deliver(now, env, &mut ctx.1);
                    }
                }
            }
            SimEvent::Tick(i) if live(i) && self.server.up => {
                self.server.tick(now, &mut out, &mut self.mon)
            }
            SimEvent::CommitStart(i) if live(i) && self.server.up => {
                self.stats.commits += 1;
                let fsync_ms = self
                    .server
                    .begin_commit(now, &self.sc, &mut out, &mut self.mon);
                self.maybe_crash_during_fsync(fsync_ms, &mut out);
            }
            SimEvent::FsyncDone(i) if live(i) && self.server.up => {
                self.server.finish_commit(now, &mut out, &mut self.mon)
            }
            SimEvent::Tick(_) | SimEvent::CommitStart(_) | SimEvent::FsyncDone(_) => {}
            SimEvent::ClientWake(c, gen) => {
                let mut ctx = self.ctx(&mut out);
                ctx.0[c].wake(now, gen, &mut ctx.1);
            }
            SimEvent::ClientTimeout(c, req) => {
                let mut ctx = self.ctx(&mut out);
                ctx.0[c].timeout(now, req, &mut ctx.1);
            }
            nemesis => self.fault(nemesis, &mut out),
        }
        self.apply(out);
    }

    /// The clients, and what their handlers may touch.
    fn ctx<'a>(&'a mut self, out: &'a mut Out) -> (&'a mut [Client], Ctx<'a>) {
        let ctx = Ctx {
            out,
            rec: &mut self.rec,
            mon: &mut self.mon,
            sc: &self.sc,
            lockset_fences: self.config.lockset_fences,
        };
        (&mut self.clients, ctx)
    }
}
