//! The simulated network: the messages clients and the node exchange, and what the
//! network does to them.
//!
//! Every message gets a random delay. A few are *held*: delivered hundreds of milliseconds
//! to seconds late, like a request stuck in a proxy or a retransmit queue, long after its
//! sender gave up on it. That is how old-epoch writes reach the store late. A few are
//! dropped. A partition between a client and the node drops every message sent across it
//! and every message still in flight when it would arrive, except held ones (they sit
//! outside the cut link until delivered).
//!
//! Not modelled: duplicated requests (HTTP does not duplicate a request; a client retry
//! is a new operation, and fencing does not deduplicate retries, S9), reordering beyond
//! what independent delays give, and partial connectivity between clients (clients only
//! talk to the node).

use std::collections::BTreeSet;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::scenario::Scenario;

/// One end of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Node {
    Server,
    Client(usize),
}

/// A request from a client to the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    Acquire {
        lock: String,
        lease_id: String,
        ttl_ms: u64,
        wait_ms: u64,
    },
    Keepalive {
        lease_id: String,
    },
    Release {
        lease_id: String,
    },
    /// A fenced mutation of namespace `lock`. `token: None` is a request without one.
    Mutate {
        lock: String,
        token: Option<String>,
        action: Action,
    },
    Get {
        lock: String,
        key: String,
    },
}

/// What a fenced mutation does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    Put { key: String, value: String },
    Delete { key: String },
    Fence,
}

/// The node's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Granted {
        token: String,
        epoch: u64,
        lease_id: String,
    },
    /// The lock is taken (or the wait ran out).
    Held,
    LeaseOk,
    LeaseExpired,
    Applied {
        revision: u64,
        epoch: u64,
    },
    /// A definite refusal with its API error code (`stale_token`, `invalid_token`, ...).
    Refused(&'static str),
    Value(Option<String>),
}

/// A message on the wire. `req_id` pairs a reply with its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Envelope {
    pub from: Node,
    pub to: Node,
    pub req_id: u64,
    pub body: Body,
    /// Held back by the network; partitions do not drop it.
    pub held: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Body {
    Request(Request),
    Reply(Reply),
}

/// Counts of what the network did, for coverage assertions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    pub sent: u64,
    pub dropped: u64,
    pub held: u64,
    pub cut: u64,
}

/// Link state and the delay/hold/drop dice.
pub(crate) struct Network {
    rng: ChaCha8Rng,
    /// Clients currently partitioned from the node.
    cut: BTreeSet<usize>,
    pub stats: NetStats,
}

impl Network {
    pub(crate) fn new(rng: ChaCha8Rng) -> Self {
        Network {
            rng,
            cut: BTreeSet::new(),
            stats: NetStats::default(),
        }
    }

    fn client_of(env: &Envelope) -> Option<usize> {
        match (env.from, env.to) {
            (Node::Client(c), _) | (_, Node::Client(c)) => Some(c),
            _ => None,
        }
    }

    fn is_cut(&self, env: &Envelope) -> bool {
        Self::client_of(env).is_some_and(|c| self.cut.contains(&c))
    }

    /// Decides the fate of a message sent at `now`: its delivery time, or `None` if lost.
    pub(crate) fn send(&mut self, now: u64, env: &mut Envelope, sc: &Scenario) -> Option<u64> {
        self.stats.sent += 1;
        if self.is_cut(env) {
            self.stats.cut += 1;
            return None;
        }
        if self.rng.gen_bool(sc.drop_prob) {
            self.stats.dropped += 1;
            return None;
        }
        if self.rng.gen_bool(sc.hold_prob) {
            self.stats.held += 1;
            env.held = true;
            return Some(now + self.rng.gen_range(sc.hold_ms.0..=sc.hold_ms.1));
        }
        let slow = self.rng.gen_bool(0.05);
        let max = if slow {
            sc.max_delay_ms * 10
        } else {
            sc.max_delay_ms
        };
        Some(now + self.rng.gen_range(0..=max))
    }

    /// Whether a message may arrive now (its link may have been cut meanwhile).
    pub(crate) fn arrives(&mut self, env: &Envelope) -> bool {
        if !env.held && self.is_cut(env) {
            self.stats.cut += 1;
            return false;
        }
        true
    }

    pub(crate) fn partition(&mut self, client: usize) {
        self.cut.insert(client);
    }

    pub(crate) fn heal(&mut self, client: usize) {
        self.cut.remove(&client);
    }
}
