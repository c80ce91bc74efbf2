//! A simulated client: one request at a time, a lease it believes it holds, and pauses.
//!
//! A client acquires a lock, works under it (see [`crate::workload`]) and releases it.
//! It measures its lease on its own clock, which may run slow or fast against the node's.
//! A careful client stops using a lease it believes expired; a *sloppy* one keeps sending
//! with its token until the store refuses it, like a process that never looks at the
//! clock. A client can stall at any moment (a stop-the-world pause), and sometimes right
//! between checking its lease and sending (the check-then-act gap fencing exists for):
//! the request then goes out after the pause with whatever token it had.
//!
//! While paused, a client neither sends nor processes answers (they wait in its inbox)
//! and its timeouts fire only when it resumes. A request without an answer before its
//! timeout is recorded `info`; the client then abandons its lease without releasing it,
//! since it can no longer tell which of its writes landed (and equal epochs do not order
//! them, S9).

use palisade_checker::Op;
use palisade_token::Signer;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::monitor::Monitor;
use crate::net::{Body, Envelope, Node, Request};
use crate::recorder::Recorder;
use crate::scenario::Scenario;
use crate::world::{Out, SimEvent};

/// A lease the client believes it holds.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub lock: String,
    pub lease_id: String,
    pub token: String,
    pub epoch: u64,
    pub ttl_ms: u64,
    /// When the client's own clock says the lease is over (node time).
    pub believed_until: u64,
    pub fenced: bool,
    /// Whether this session fences before its first write (decided at the grant).
    pub fence_first: bool,
    pub ops_left: u32,
    /// The set read in the lock-set workload, waiting for its add.
    pub set: Option<std::collections::BTreeSet<String>>,
}

/// What the client expects from an answer, and what it does with it.
#[derive(Debug, Clone)]
pub(crate) enum Expect {
    Acquire {
        lock: String,
        ttl_ms: u64,
    },
    Keepalive,
    Release,
    Mutation,
    Fence,
    Read,
    ReadSet,
    Add,
    /// A request with a bad token: only a refusal is acceptable.
    BadToken(String),
}

/// A decided request, with the history entry it opens.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub request: Request,
    pub op: Option<Op>,
    pub expect: Expect,
}

struct Waiting {
    req_id: u64,
    op: Option<usize>,
    expect: Expect,
    sent_at: u64,
}

pub(crate) struct Client {
    pub id: usize,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) sloppy: bool,
    /// Client clock ticks per node millisecond, in thousandths.
    pub(crate) clock_permille: u64,
    pub(crate) lease: Option<Held>,
    pub(crate) forger: Signer,
    pub(crate) counter: u64,
    waiting: Option<Waiting>,
    prepared: Option<Plan>,
    paused_until: u64,
    inbox: Vec<Envelope>,
    wake_gen: u64,
    pub stopped: bool,
}

impl Client {
    pub(crate) fn new(id: usize, mut rng: ChaCha8Rng, sc: &Scenario) -> Client {
        let sloppy = rng.gen_bool(sc.sloppy_prob);
        let clock_permille = rng.gen_range(800..=1_250);
        let mut secret = [0u8; 32];
        rng.fill(&mut secret);
        Client {
            id,
            rng,
            sloppy,
            clock_permille,
            lease: None,
            forger: Signer::from_secret(secret),
            counter: 0,
            waiting: None,
            prepared: None,
            paused_until: 0,
            inbox: Vec::new(),
            wake_gen: 0,
            stopped: false,
        }
    }

    fn schedule_wake(&mut self, at: u64, out: &mut Out) {
        self.wake_gen += 1;
        out.at(at, SimEvent::ClientWake(self.id, self.wake_gen));
    }

    pub(crate) fn start(&mut self, out: &mut Out, sc: &Scenario) {
        let at = self.rng.gen_range(0..=sc.think_ms.1);
        self.schedule_wake(at, out);
    }

    /// A stop-the-world pause of `ms` starting now.
    pub(crate) fn pause(&mut self, now: u64, ms: u64, out: &mut Out) {
        self.paused_until = self.paused_until.max(now + ms);
        self.schedule_wake(self.paused_until, out);
    }

    /// The client's timer (think time over, or pause over).
    pub(crate) fn wake(&mut self, now: u64, gen: u64, ctx: &mut Ctx<'_>) {
        if gen != self.wake_gen || now < self.paused_until {
            return;
        }
        for env in std::mem::take(&mut self.inbox) {
            self.on_reply(now, env, ctx);
        }
        if self.waiting.is_some() {
            return;
        }
        if let Some(plan) = self.prepared.take() {
            if !self.stopped {
                self.send(now, plan, ctx);
            }
            return;
        }
        if self.stopped {
            return;
        }
        let plan = self.plan(now, ctx.sc, ctx.lockset_fences);
        if self.rng.gen_bool(ctx.sc.gc_between_check_and_send) {
            self.prepared = Some(plan);
            let ms = self.rng.gen_range(ctx.sc.pause_ms.0..=ctx.sc.pause_ms.1);
            self.pause(now, ms, ctx.out);
            return;
        }
        self.send(now, plan, ctx);
    }

    fn send(&mut self, now: u64, plan: Plan, ctx: &mut Ctx<'_>) {
        self.counter += 1;
        let req_id = self.counter;
        let op = plan.op.map(|op| {
            let mut op = op;
            op.invoke = now;
            ctx.rec.invoke(op)
        });
        let timeout = match &plan.request {
            Request::Acquire { wait_ms, .. } => wait_ms + ctx.sc.timeout_ms,
            _ => ctx.sc.timeout_ms,
        };
        ctx.out
            .at(now + timeout, SimEvent::ClientTimeout(self.id, req_id));
        ctx.out.send(
            Node::Client(self.id),
            Node::Server,
            req_id,
            Body::Request(plan.request),
        );
        self.waiting = Some(Waiting {
            req_id,
            op,
            expect: plan.expect,
            sent_at: now,
        });
    }

    /// A message for this client arrived.
    pub(crate) fn deliver(&mut self, now: u64, env: Envelope, ctx: &mut Ctx<'_>) {
        if now < self.paused_until {
            self.inbox.push(env);
            return;
        }
        self.on_reply(now, env, ctx);
    }

    fn on_reply(&mut self, now: u64, env: Envelope, ctx: &mut Ctx<'_>) {
        let Body::Reply(reply) = env.body else { return };
        // An answer to a request the client already gave up on goes unread.
        if self.waiting.as_ref().is_none_or(|w| w.req_id != env.req_id) {
            return;
        }
        let Some(w) = self.waiting.take() else { return };
        if let Some(op) = w.op {
            ctx.rec.complete(op, now, &reply);
        }
        self.absorb(now, w.sent_at, w.expect, reply, ctx.mon);
        let think = self.rng.gen_range(ctx.sc.think_ms.0..=ctx.sc.think_ms.1);
        self.schedule_wake(now + think, ctx.out);
    }

    /// The client's own clock: how far into the future (node time) `ms` of it reaches.
    pub(crate) fn local_span(&self, ms: u64) -> u64 {
        ms * 1_000 / self.clock_permille
    }

    /// The client's timeout for request `req_id`.
    pub(crate) fn timeout(&mut self, now: u64, req_id: u64, ctx: &mut Ctx<'_>) {
        if now < self.paused_until {
            ctx.out
                .at(self.paused_until, SimEvent::ClientTimeout(self.id, req_id));
            return;
        }
        if self.waiting.as_ref().is_none_or(|w| w.req_id != req_id) {
            return;
        }
        if let Some(Waiting { op: Some(op), .. }) = self.waiting.take() {
            ctx.rec.info(op, now, "timeout");
        }
        self.lease = None;
        let think = self.rng.gen_range(ctx.sc.think_ms.0..=ctx.sc.think_ms.1);
        self.schedule_wake(now + think, ctx.out);
    }

    /// Whether the client has nothing in flight and nothing decided but unsent.
    pub(crate) fn quiet(&self) -> bool {
        self.waiting.is_none() && self.prepared.is_none()
    }
}

/// What a client handler may touch besides the client.
pub(crate) struct Ctx<'a> {
    pub out: &'a mut Out,
    pub rec: &'a mut Recorder,
    pub mon: &'a mut Monitor,
    pub sc: &'a Scenario,
    pub lockset_fences: bool,
}

/// Sets are stored as sorted, comma-separated elements (what `decode_set` reads).
pub(crate) fn decode_set(text: &str) -> std::collections::BTreeSet<String> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}
