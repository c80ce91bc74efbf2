//! What a client does next, and what it makes of the answers.
//!
//! - **Register locks** (`reg-*`): under the lease, writes unique values to a few keys,
//!   deletes now and then, reads its own namespace, renews, and releases after a few
//!   operations. Half the sessions fence first (the barrier); the other half do not, so
//!   the S10 boundary (an old write landing before the new epoch is seen) stays in play
//!   and must still be linearizable.
//! - **The set lock** (`set-x`): fence, read the set, write back the set plus one new
//!   element (`add`), repeat. Any overlap of two holders that the store let through
//!   shows up as a lost element.
//! - **Without a lease**: acquire a lock (with or without waiting in line), or read any
//!   register key unfenced.
//! - **Bad tokens**, at any time: a request without a token, a malformed one (`"2"`,
//!   `"true"`), one signed by a foreign key with a huge epoch, or a genuine token used on
//!   another lock's namespace. These must all be refused (S12, S14); they are checked by
//!   the monitor, not recorded in the history, so a forged epoch cannot skew the checkers.

use palisade_checker::{Op, OpKind};
use rand::Rng;

use crate::client::{decode_set, Client, Expect, Held, Plan};
use crate::monitor::Monitor;
use crate::net::{Action, Reply, Request};
use crate::scenario::{Scenario, REGISTER_KEYS, REGISTER_LOCKS, SET_KEY, SET_LOCK};

impl Client {
    /// Decides the next request. Checking the lease happens here, before any pause.
    pub(crate) fn plan(&mut self, now: u64, sc: &Scenario, lockset_fences: bool) -> Plan {
        if self.rng.gen_bool(0.03) {
            return self.bad_token();
        }
        let believed = self
            .lease
            .as_ref()
            .is_some_and(|h| self.sloppy || now < h.believed_until);
        if !believed {
            // The client thinks the lease is over: it walks away without releasing.
            self.lease = None;
            return self.without_lease(sc);
        }
        let Some(held) = self.lease.clone() else {
            return self.without_lease(sc);
        };
        let p = self.id as u64;
        let lock = held.lock.as_str();
        if held.ops_left == 0 {
            let op = Op::new(p, OpKind::Release, now).lock(lock);
            let request = Request::Release {
                lease_id: held.lease_id,
            };
            return plan(request, Some(op), Expect::Release);
        }
        let mutate = |action: Action| Request::Mutate {
            lock: lock.to_owned(),
            token: Some(held.token.clone()),
            action,
        };
        let fence = |op: Op| plan(mutate(Action::Fence), Some(op), Expect::Fence);
        let fence_op = Op::new(p, OpKind::Fence, now).lock(lock).epoch(held.epoch);
        if lock == SET_LOCK {
            if lockset_fences && !held.fenced {
                return fence(fence_op);
            }
            let Some(mut set) = held.set.clone() else {
                let op = Op::new(p, OpKind::ReadSet, now).lock(lock).key(SET_KEY);
                return plan(get(lock, SET_KEY), Some(op), Expect::ReadSet);
            };
            let element = format!("c{}.{}", self.id, self.counter);
            set.insert(element.clone());
            let value = set.into_iter().collect::<Vec<_>>().join(",");
            let op = Op::new(p, OpKind::Add, now)
                .lock(lock)
                .key(SET_KEY)
                .value(&element)
                .epoch(held.epoch);
            let action = Action::Put {
                key: SET_KEY.to_owned(),
                value,
            };
            return plan(mutate(action), Some(op), Expect::Add);
        }
        if held.fence_first && !held.fenced {
            return fence(fence_op);
        }
        let key = REGISTER_KEYS[self.rng.gen_range(0..REGISTER_KEYS.len())];
        match self.rng.gen_range(0..100) {
            0..=54 => {
                let value = format!("c{}-{}", self.id, self.counter);
                let op = Op::new(p, OpKind::Write, now)
                    .lock(lock)
                    .key(key)
                    .value(&value)
                    .epoch(held.epoch);
                let action = Action::Put {
                    key: key.to_owned(),
                    value,
                };
                plan(mutate(action), Some(op), Expect::Mutation)
            }
            55..=61 => {
                let op = Op::new(p, OpKind::Delete, now)
                    .lock(lock)
                    .key(key)
                    .epoch(held.epoch);
                let action = Action::Delete {
                    key: key.to_owned(),
                };
                plan(mutate(action), Some(op), Expect::Mutation)
            }
            62..=84 => {
                let op = Op::new(p, OpKind::Read, now).lock(lock).key(key);
                plan(get(lock, key), Some(op), Expect::Read)
            }
            _ => {
                let request = Request::Keepalive {
                    lease_id: held.lease_id,
                };
                plan(request, None, Expect::Keepalive)
            }
        }
    }

    /// Updates what the client believes after an answer.
    pub(crate) fn absorb(
        &mut self,
        now: u64,
        sent_at: u64,
        expect: Expect,
        reply: Reply,
        mon: &mut Monitor,
    ) {
        match (expect, reply) {
            (
                Expect::Acquire { lock, ttl_ms },
                Reply::Granted {
                    token,
                    epoch,
                    lease_id,
                },
            ) => {
                let ops_left = self.rng.gen_range(2..=8);
                let fence_first = self.rng.gen_bool(0.5);
                // A careful client keeps a tenth of the TTL as a margin.
                let believed_until = sent_at + self.local_span(ttl_ms * 9 / 10);
                self.lease = Some(Held {
                    lock,
                    lease_id,
                    token,
                    epoch,
                    ttl_ms,
                    believed_until,
                    fenced: false,
                    fence_first,
                    ops_left,
                    set: None,
                });
            }
            (Expect::BadToken(what), reply) => {
                let refused = matches!(
                    reply,
                    Reply::Refused("invalid_token" | "missing_token" | "wrong_lock")
                );
                if !refused {
                    mon.bad_token_passed(now, format!("{what} was answered {reply:?}"));
                }
            }
            (Expect::Keepalive, Reply::LeaseOk) => {
                if let Some(ttl) = self.lease.as_ref().map(|h| h.ttl_ms) {
                    let until = sent_at + self.local_span(ttl * 9 / 10);
                    self.with_lease(|h| h.believed_until = until);
                }
            }
            (Expect::Release, _) | (_, Reply::LeaseExpired | Reply::Refused("stale_token")) => {
                self.lease = None;
            }
            (Expect::Fence, Reply::Applied { .. }) => self.with_lease(|h| h.fenced = true),
            (Expect::ReadSet, Reply::Value(value)) => {
                let set = value.as_deref().map(decode_set).unwrap_or_default();
                self.with_lease(|h| h.set = Some(set));
            }
            (Expect::Mutation | Expect::Add, _) => self.with_lease(|h| {
                h.ops_left = h.ops_left.saturating_sub(1);
                h.set = None;
            }),
            _ => {}
        }
    }

    fn with_lease(&mut self, f: impl FnOnce(&mut Held)) {
        if let Some(held) = &mut self.lease {
            f(held);
        }
    }

    fn without_lease(&mut self, sc: &Scenario) -> Plan {
        let p = self.id as u64;
        if self.rng.gen_bool(0.25) {
            let lock = REGISTER_LOCKS[self.rng.gen_range(0..REGISTER_LOCKS.len())];
            let key = REGISTER_KEYS[self.rng.gen_range(0..REGISTER_KEYS.len())];
            let op = Op::new(p, OpKind::Read, 0).lock(lock).key(key);
            return plan(get(lock, key), Some(op), Expect::Read);
        }
        let lock = match self.rng.gen_range(0..3) {
            0 => SET_LOCK,
            i => REGISTER_LOCKS[i - 1],
        };
        let wait_ms = if self.rng.gen_bool(0.5) {
            0
        } else {
            self.rng.gen_range(50..=1_000)
        };
        let ttl_ms = self.rng.gen_range(sc.ttl_ms.0..=sc.ttl_ms.1);
        // Unique across restarts, as the lock table requires.
        let lease_id = format!("c{}-l{}", self.id, self.counter);
        let op = Op::new(p, OpKind::Acquire, 0).lock(lock);
        let request = Request::Acquire {
            lock: lock.to_owned(),
            lease_id,
            ttl_ms,
            wait_ms,
        };
        let expect = Expect::Acquire {
            lock: lock.to_owned(),
            ttl_ms,
        };
        plan(request, Some(op), expect)
    }

    fn bad_token(&mut self) -> Plan {
        let target = REGISTER_LOCKS[self.rng.gen_range(0..REGISTER_LOCKS.len())];
        let genuine_elsewhere = self
            .lease
            .as_ref()
            .filter(|h| h.lock != target)
            .map(|h| h.token.clone());
        let (token, what) = match (self.rng.gen_range(0..4), genuine_elsewhere) {
            (0, _) => (None, "a write without a token".to_owned()),
            (1, _) => {
                let text = ["2", "true", "pal1.e30.AAAA", ""][self.rng.gen_range(0..4)];
                (
                    Some(text.to_owned()),
                    format!("a write with token {text:?}"),
                )
            }
            (2, Some(token)) => (Some(token), "a genuine token on another lock".to_owned()),
            _ => {
                let token = self.forger.issue(target, 1 << 40, "forger");
                (Some(token), "a token signed by a foreign key".to_owned())
            }
        };
        let request = Request::Mutate {
            lock: target.to_owned(),
            token,
            action: Action::Put {
                key: REGISTER_KEYS[0].to_owned(),
                value: format!("forged-{}-{}", self.id, self.counter),
            },
        };
        plan(
            request,
            None,
            Expect::BadToken(format!("{what} ({target})")),
        )
    }
}

fn get(lock: &str, key: &str) -> Request {
    Request::Get {
        lock: lock.to_owned(),
        key: key.to_owned(),
    }
}

fn plan(request: Request, op: Option<Op>, expect: Expect) -> Plan {
    Plan {
        request,
        op,
        expect,
    }
}
