//! The issuer's lock table: locks, leases, lock-delay and first-come first-served waiters.
//!
//! A pure state machine. Every call takes `now` (milliseconds on the caller's monotonic
//! clock); nothing here reads a clock, sleeps or touches a disk. Timers are deadlines in
//! a heap: the caller asks [`LockTable::next_wakeup`] when to call [`LockTable::poll`].
//!
//! Calls may cause things to happen to *other* requests (a release hands the lock to the
//! first waiter, an expiry ends a lease, a waiter runs out of patience). Those are queued
//! as [`Event`]s; the caller drains them with [`LockTable::drain_events`] after every
//! call.
//!
//! ## Reservations: what must be durable before a grant is answered
//! An epoch must never be issued twice, even across a crash, and a lease that may still
//! be live must be honoured after a restart. Writing every grant to disk before answering
//! would make a contended lock's hand-off chain pay one fsync per hand-over. Instead, each
//! lock carries a [`Reservation`], the issuer's durable promise: "no epoch above `ceiling`
//! has been issued, and while `active`, a lease of up to `max_ttl_ms` may be live".
//! A grant is covered when the durable reservation is active, its ceiling is at least the
//! new epoch and its TTL at least the lease's, and no lease of the lock expired since the
//! last durable write for it; only an uncovered grant needs a durable
//! write first ([`Grant::reserve`] says which reservation to write, and the caller reports
//! success with [`LockTable::confirm`]). When a lock falls idle the table emits
//! [`Event::Idle`]; recording that lazily is safe, since a lost idle marker only makes the
//! lock wait one TTL after a restart. With [`TableConfig::idle_grace_ms`] the marker comes
//! that long after the lock fell idle, so that a lock taken again soon after its release
//! (a worker's acquire-work-release loop) is granted inside its reservation too. After a restart, every lock whose reservation is
//! active is ungrantable for its `max_ttl_ms` and its epochs continue above the ceiling
//! ([`LockTable::restore_reservations`]).
//!
//! ## Recipes: lock values, per-lock lock-delay, sessions
//! - A lease may carry a **value** (what its holder advertises, e.g. a leader's address),
//!   set at acquisition and replaced by its holder with [`LockTable::proclaim`]. The table
//!   keeps it; how large it may be is the caller's rule.
//! - Each lease carries its own **lock-delay** ([`AcquireRequest::lock_delay_ms`], the
//!   table's [`TableConfig::lock_delay_ms`] when not given), applied when *that* lease
//!   expires. A restart blocks a lock for its reservation's `max_ttl_ms` plus the default
//!   lock-delay, so a grant whose delay is longer than the default needs a reservation
//!   that covers the difference too: its `max_ttl_ms` is at least the lease's TTL plus
//!   that difference (see [`Grant::reserve`]).
//! - A **session** (module `sessions`) is one keepalive for many leases: leases acquired
//!   in it have the session's TTL and its deadline, a session keepalive renews them all,
//!   and when the session expires they all expire at that same instant (and when it is
//!   closed they are all released). Session leases are ordinary leases to everything
//!   else here: exclusivity, epochs, reservations, idle markers and lock-delay apply
//!   unchanged, because a session lease's deadline never lies further than its TTL
//!   (the session's) from the last renewal, exactly like a lease of its own.
//!
//! ## Layout
//! This file holds leases and waiters (acquire, keepalive, release, the queue, expiry);
//! `reservations` holds [`Reservation`] and the idle marks; `quotas` what each owner
//! holds and the forgetting of idle locks at `max_locks`; `sessions` the sessions.
//!
//! ## Invariants
//! - At most one live lease per lock; a lock is granted only when it has no live lease,
//!   its lock-delay has passed and no earlier waiter is queued for it.
//! - Every grant of lock `L` gets `last_epoch(L) + 1`: epochs per lock strictly increase.
//! - Waiters are served in arrival order.
//!
//! ## Not guaranteed here
//! - Durability: a grant is only a proposal until the caller has recorded it.
//! - Expiry is decided by the caller's clock. A holder whose process pauses may believe it
//!   still holds a lease this table has already expired; that is what fencing is for.

use palisade_api::QuotaResource;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use palisade_token::Epoch;

use crate::Millis;

/// Identifies a lease; chosen by the caller, unique across restarts.
pub type LeaseId = String;

/// Identifies a queued waiter.
pub type Ticket = u64;

/// Identifies a session; chosen by the caller, unique across restarts.
pub type SessionId = String;

/// Table settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableConfig {
    /// After a lease *expires* (not on release) its lock stays ungrantable this long, for
    /// resources that cannot check tokens.
    pub lock_delay_ms: Millis,
    /// How many epochs one durable reservation covers (at least 1). With 1, every grant
    /// is written to disk before it is answered.
    pub epoch_block: Epoch,
    /// How long a released lock keeps its durable reservation active before it is marked
    /// idle (0: at once). A lock acquired again within this window is granted inside the
    /// reservation, without waiting for a disk write; the price is that after a crash the
    /// locks released within the window before it wait one TTL, like the locks that were
    /// held (see the module docs).
    pub idle_grace_ms: Millis,
    /// Most locks kept at once (0: no limit). When a new lock finds the table full, the
    /// idle locks whose state is all on disk are forgotten (see [`Event::Forgotten`]);
    /// if that frees no room the acquisition is refused with
    /// [`AcquireOutcome::QuotaExceeded`] (`"locks"`).
    pub max_locks: usize,
    /// Most acquisitions waiting in one lock's line (0: no limit).
    pub max_waiters_per_lock: u32,
    /// Most sessions kept at once (0: no limit). A session is also one lease against its
    /// owner's quota.
    pub max_sessions: usize,
}

/// A request to acquire a lock: the lock table's, and every issuer's (`palisade_issuer`
/// re-exports it as `Acquire`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcquireRequest {
    pub lock: String,
    pub holder: String,
    /// The lease's TTL (ignored in a session: the lease takes the session's).
    pub ttl_ms: Millis,
    /// How long to queue if the lock is taken; 0 answers at once.
    pub wait_ms: Millis,
    /// Id for the lease, if one is granted (chosen by the caller, unique).
    pub lease_id: LeaseId,
    /// Whose quota the lease and the wait count against (None: nobody's).
    pub owner: Option<Owner>,
    /// What the holder advertises while it holds the lock (see [`LockTable::proclaim`]).
    pub value: Option<Vec<u8>>,
    /// Lock-delay after this lease expires (None: [`TableConfig::lock_delay_ms`], the
    /// issuer's default).
    pub lock_delay_ms: Option<Millis>,
    /// Acquire inside this session: the lease takes the session's TTL and deadline
    /// (`ttl_ms` is ignored) and ends with it.
    pub session: Option<SessionId>,
}

/// Who asks, with their limits: live leases and waiting acquisitions at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub name: Box<str>,
    pub max_leases: u32,
    pub max_waiters: u32,
}

/// A lease handed out by the table (not yet durable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    pub lock: String,
    pub holder: String,
    pub epoch: Epoch,
    pub lease_id: LeaseId,
    pub ttl_ms: Millis,
    /// A reservation that must be durable before this grant is answered; `None` when the
    /// lock's durable reservation already covers it.
    pub reserve: Option<Reservation>,
    /// How many times the lock had fallen idle when `reserve` was made; passed back to
    /// [`LockTable::confirm`], which ignores a reservation an idle marker came after.
    pub generation: u32,
    /// The lease's value, if it carries one.
    pub value: Option<Vec<u8>>,
    /// The lock-delay that applies if this lease expires.
    pub lock_delay_ms: Millis,
    /// The session the lease belongs to, if any.
    pub session: Option<SessionId>,
}

/// The immediate answer to an acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    Granted(Grant),
    /// Queued; the answer comes later as an [`Event`] for this ticket.
    Queued(Ticket),
    /// Taken. `holder` is None while the lock sits in its lock-delay.
    Held {
        holder: Option<String>,
        retry_after_ms: Millis,
    },
    /// Refused, nothing changed: `resource` is limited to `limit` (`"locks"`,
    /// `"waiters_per_lock"`, `"leases_per_principal"`, `"waiters_per_principal"`).
    QuotaExceeded {
        resource: QuotaResource,
        limit: u64,
    },
    /// Refused, nothing changed: the request names a session that has ended or never
    /// existed.
    NoSession,
}

/// Something that happened as a consequence of a call or of time passing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A queued waiter got the lock.
    Granted { ticket: Ticket, grant: Grant },
    /// A queued waiter's wait ran out.
    TimedOut {
        ticket: Ticket,
        holder: Option<String>,
        retry_after_ms: Millis,
    },
    /// A lease ran past its deadline without renewal.
    Expired {
        lease_id: LeaseId,
        lock: String,
        epoch: Epoch,
        holder: String,
    },
    /// The lock has no lease and nobody waiting: its reservation may be recorded inactive
    /// (lazily; losing this record is safe). An inactive reservation's TTL is 0: the next
    /// lease granted decides the restart block afresh.
    Idle {
        lock: String,
        reservation: Reservation,
    },
    /// A session ran past its deadline without renewal; every lease in it has expired
    /// (an [`Event::Expired`] each, before this one).
    SessionExpired {
        session_id: SessionId,
        holder: String,
    },
    /// A queued waiter's session ended (expired or closed) before its turn came; it is out
    /// of the line.
    SessionGone { ticket: Ticket },
    /// `count` idle locks left the table to make room ([`LockTable::knows`] no longer
    /// finds them). No epoch of theirs is above `floor`, and from now on a lock the table
    /// does not know starts above `floor`. Their records may stay on disk (a restart then
    /// knows them again) or be dropped once the floor itself is durable. The event does not
    /// name them: a sweep of a full table may forget a million locks at once.
    Forgotten { count: usize, floor: Epoch },
}

/// A lease that is no longer live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("lease expired or unknown")]
pub struct LeaseExpired;

/// A live lease, as seen from outside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseView {
    pub lease_id: LeaseId,
    pub lock: String,
    pub holder: String,
    pub epoch: Epoch,
    pub ttl_ms: Millis,
    pub remaining_ms: Millis,
    /// What the holder advertises, if anything.
    pub value: Option<Vec<u8>>,
    /// The lock-delay that applies if this lease expires.
    pub lock_delay_ms: Millis,
    /// The session the lease belongs to, if any.
    pub session: Option<SessionId>,
}

/// A lock, as seen from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockView {
    pub lock: String,
    /// The live lease's epoch, or the last epoch known to have been granted (0 if none).
    /// Never a reservation's ceiling: epochs reserved but not granted are not shown.
    pub epoch: Epoch,
    /// No epoch above this was granted for the lock: `epoch`, or more where grants may
    /// have gone unrecorded (after a restart, the reservation's ceiling; after a restore,
    /// its floor). A token below it is never the lock's newest.
    pub granted_up_to: Epoch,
    /// The live lease, if any.
    pub lease: Option<LeaseView>,
    pub waiters: usize,
}

#[derive(Debug)]
struct Lease {
    id: LeaseId,
    holder: String,
    epoch: Epoch,
    ttl_ms: Millis,
    deadline: Millis,
    /// The quota it counts against.
    owner: Option<Box<str>>,
    value: Option<Vec<u8>>,
    lock_delay_ms: Millis,
    session: Option<SessionId>,
}

#[derive(Debug)]
struct Waiter {
    ticket: Ticket,
    lease_id: LeaseId,
    holder: String,
    ttl_ms: Millis,
    give_up_at: Millis,
    owner: Option<Box<str>>,
    value: Option<Vec<u8>>,
    lock_delay_ms: Millis,
    session: Option<SessionId>,
}

#[derive(Debug)]
struct Lock {
    /// What the next grant counts from: the last epoch granted, or above it after a
    /// restart (the reservation's ceiling) or a restore (the floor).
    last_epoch: Epoch,
    /// The last epoch known to have been granted: what the lock reports as its epoch
    /// (0 if none is known).
    granted: Epoch,
    /// Boxed: most of a million locks have no lease, and an inline one would make every
    /// entry of the table several times larger.
    lease: Option<Box<Lease>>,
    delay_until: Millis,
    queue: Queue,
    /// What is known to be durable.
    durable: Reservation,
    /// A lease of this lock expired since the last durable write for it. The next grant
    /// must be written before it is answered: the expired holder's lease record is only
    /// removed lazily, and a crash that lost both that removal and an unrecorded next
    /// grant would bring the expired lease back as the live one.
    expired_unsynced: bool,
    /// When the lock last fell idle with an active reservation (see
    /// [`TableConfig::idle_grace_ms`]); [`NOT_IDLE`] while it is in use.
    idle_since: Millis,
    /// How many idle markers the lock has had (see [`Grant::generation`]).
    generation: u32,
}

impl Default for Lock {
    fn default() -> Self {
        Lock {
            last_epoch: 0,
            granted: 0,
            lease: None,
            delay_until: 0,
            queue: Queue::default(),
            durable: Reservation::default(),
            expired_unsynced: false,
            idle_since: NOT_IDLE,
            generation: 0,
        }
    }
}

/// [`Lock::idle_since`] of a lock in use (kept out of an `Option` to keep entries small).
const NOT_IDLE: Millis = Millis::MAX;

/// A lock's waiters, boxed: most locks never have any, and an empty inline `VecDeque`
/// would add 32 bytes to each of them.
// The box is the point: `Option<Box<_>>` is one word, an empty `VecDeque` four.
#[allow(clippy::box_collection)]
#[derive(Debug, Default)]
struct Queue(Option<Box<VecDeque<Waiter>>>);

impl Queue {
    fn is_empty(&self) -> bool {
        self.0.as_ref().is_none_or(|q| q.is_empty())
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |q| q.len())
    }

    fn iter(&self) -> impl Iterator<Item = &Waiter> {
        self.0.iter().flat_map(|q| q.iter())
    }

    fn push_back(&mut self, waiter: Waiter) {
        self.0.get_or_insert_with(Box::default).push_back(waiter);
    }

    fn pop_front(&mut self) -> Option<Waiter> {
        let waiter = self.0.as_mut()?.pop_front();
        self.shrink();
        waiter
    }

    fn retain(&mut self, keep: impl FnMut(&Waiter) -> bool) {
        if let Some(q) = &mut self.0 {
            q.retain(keep);
        }
        self.shrink();
    }

    fn take(&mut self) -> VecDeque<Waiter> {
        self.0.take().map(|q| *q).unwrap_or_default()
    }

    fn from_deque(q: VecDeque<Waiter>) -> Queue {
        let mut queue = Queue((!q.is_empty()).then(|| Box::new(q)));
        queue.shrink();
        queue
    }

    fn shrink(&mut self) {
        if self.0.as_ref().is_some_and(|q| q.is_empty()) {
            self.0 = None;
        }
    }
}

/// The lock table. See the module docs.
#[derive(Debug, Default)]
pub struct LockTable {
    config: TableConfig,
    /// Keys are `Box<str>` and values boxed: with a million locks the map's slots
    /// (allocated in powers of two, at most 7/8 full) cost 24 bytes each instead of the
    /// ~110 an inline entry would.
    locks: HashMap<Box<str>, Box<Lock>>,
    /// Lease id -> lock name, for keepalive and release by id.
    leases: HashMap<LeaseId, String>,
    /// Ticket -> lock name, for cancelling a waiter.
    waiters: HashMap<Ticket, String>,
    next_ticket: Ticket,
    /// (deadline, lock): when the lock needs another look. Entries go stale when a lease
    /// is renewed or released; a stale entry only causes a harmless extra look.
    timers: BinaryHeap<Reverse<(Millis, String)>>,
    events: Vec<Event>,
    /// Epoch below which no lock starts (after a restore from backup, or once locks were
    /// forgotten).
    epoch_floor: Epoch,
    /// Live leases and waiters per owner (owners with none are not kept).
    owners: HashMap<Box<str>, Held>,
    /// No sweep for idle locks before this time (see [`LockTable::forget_idle`]).
    next_sweep_at: Millis,
    /// Live sessions (see the `sessions` module).
    sessions: HashMap<SessionId, sessions::Session>,
    /// (deadline, session): when a session needs another look; stale entries are harmless.
    session_timers: BinaryHeap<Reverse<(Millis, SessionId)>>,
}

impl LockTable {
    pub fn new(config: TableConfig) -> Self {
        LockTable {
            config,
            ..Default::default()
        }
    }

    /// Rebuilds the table after a restart. Each recorded lease is honoured for a full TTL
    /// from `now`: the table cannot know how long it was down, so it assumes the holder
    /// may still be working. When several leases are recorded for one lock, only the one
    /// with the highest epoch can still be live.
    pub fn restore(
        &mut self,
        now: Millis,
        epochs: impl IntoIterator<Item = (String, Epoch)>,
        leases: impl IntoIterator<Item = Grant>,
    ) {
        for (name, epoch) in epochs {
            let lock = lock_entry(&mut self.locks, self.epoch_floor, name);
            lock.last_epoch = lock.last_epoch.max(epoch);
            lock.granted = lock.granted.max(epoch);
        }
        for grant in leases {
            let lock = lock_entry(&mut self.locks, self.epoch_floor, grant.lock.clone());
            lock.last_epoch = lock.last_epoch.max(grant.epoch);
            lock.granted = lock.granted.max(grant.epoch);
            if lock.lease.as_ref().is_some_and(|l| l.epoch >= grant.epoch) {
                continue;
            }
            if let Some(old) = lock.lease.take() {
                self.leases.remove(&old.id);
                sessions::forget_lease(&mut self.sessions, &old);
            }
            // A lease of a restored session lives as long as the session (restored first,
            // with a full TTL from `now`); one whose session record is gone is honoured for
            // its own TTL and cannot be renewed through a session any more.
            let session = grant
                .session
                .filter(|id| self.sessions.contains_key(id.as_str()));
            let deadline = match session.as_ref().and_then(|id| self.sessions.get_mut(id)) {
                Some(s) => {
                    s.leases.push(grant.lease_id.clone());
                    s.deadline
                }
                None => now.saturating_add(grant.ttl_ms),
            };
            lock.lease = Some(Box::new(Lease {
                id: grant.lease_id.clone(),
                holder: grant.holder,
                epoch: grant.epoch,
                ttl_ms: grant.ttl_ms,
                deadline,
                // Restored leases count against nobody's quota: the records do not say
                // whose quota they were taken under.
                owner: None,
                value: grant.value,
                lock_delay_ms: grant.lock_delay_ms,
                session,
            }));
            self.leases.insert(grant.lease_id, grant.lock.clone());
            self.timers.push(Reverse((deadline, grant.lock)));
        }
    }

    /// Tries to acquire a lock; grants at once, queues (if `wait_ms > 0`) or refuses.
    pub fn acquire(&mut self, now: Millis, req: AcquireRequest) -> AcquireOutcome {
        self.settle(now, &req.lock);
        // In a session: the session's TTL, and it must be live.
        let mut ttl_ms = req.ttl_ms;
        if let Some(id) = &req.session {
            match self.live_session(now, id) {
                Ok(s) => ttl_ms = s.ttl_ms,
                Err(_) => return AcquireOutcome::NoSession,
            }
        }
        let max_locks = self.config.max_locks;
        if max_locks > 0 && self.locks.len() >= max_locks && !self.locks.contains_key(&*req.lock) {
            self.forget_idle(now);
            if self.locks.len() >= max_locks {
                return AcquireOutcome::QuotaExceeded {
                    resource: QuotaResource::Locks,
                    limit: max_locks as u64,
                };
            }
        }
        // (limits, what the owner holds now)
        let held = req.owner.as_ref().map(|o| {
            let now_held = self.owners.get(&o.name).copied().unwrap_or_default();
            ((o.max_leases, o.max_waiters), now_held)
        });
        if let Some(((max_leases, _), h)) = held {
            if h.leases >= max_leases {
                return AcquireOutcome::QuotaExceeded {
                    resource: QuotaResource::LeasesPerPrincipal,
                    limit: max_leases.into(),
                };
            }
        }
        let owner = req.owner.map(|o| o.name);
        let lock_delay_ms = req.lock_delay_ms.unwrap_or(self.config.lock_delay_ms);
        let lock = lock_entry(&mut self.locks, self.epoch_floor, req.lock.clone());
        let free = lock.lease.is_none() && lock.delay_until <= now && lock.queue.is_empty();
        if free {
            let deadline = sessions::deadline(&self.sessions, req.session.as_deref(), now, ttl_ms);
            let grant = Self::grant(
                lock,
                &self.config,
                &req.lock,
                Waiting {
                    lease_id: req.lease_id,
                    holder: req.holder,
                    ttl_ms,
                    owner,
                    deadline,
                    value: req.value,
                    lock_delay_ms,
                    session: req.session,
                },
            );
            if let Some(name) = grant_owner(lock) {
                count(&mut self.owners, name, 1, 0);
            }
            sessions::adopt(&mut self.sessions, &grant);
            self.leases.insert(grant.lease_id.clone(), req.lock.clone());
            self.timers.push(Reverse((deadline, req.lock)));
            return AcquireOutcome::Granted(grant);
        }
        if req.wait_ms == 0 {
            let (holder, retry_after_ms) = Self::busy(lock, now);
            return AcquireOutcome::Held {
                holder,
                retry_after_ms,
            };
        }
        let per_lock = self.config.max_waiters_per_lock;
        if per_lock > 0 && lock.queue.len() >= per_lock as usize {
            return AcquireOutcome::QuotaExceeded {
                resource: QuotaResource::WaitersPerLock,
                limit: per_lock.into(),
            };
        }
        if let Some(((_, max_waiters), h)) = held {
            if h.waiters >= max_waiters {
                return AcquireOutcome::QuotaExceeded {
                    resource: QuotaResource::WaitersPerPrincipal,
                    limit: max_waiters.into(),
                };
            }
        }
        if let Some(name) = &owner {
            count(&mut self.owners, name, 0, 1);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let give_up_at = now.saturating_add(req.wait_ms);
        if let Some(s) = req
            .session
            .as_ref()
            .and_then(|id| self.sessions.get_mut(id))
        {
            s.tickets.push(ticket);
        }
        lock.queue.push_back(Waiter {
            ticket,
            lease_id: req.lease_id,
            holder: req.holder,
            ttl_ms,
            give_up_at,
            owner,
            value: req.value,
            lock_delay_ms,
            session: req.session,
        });
        self.waiters.insert(ticket, req.lock.clone());
        self.timers.push(Reverse((give_up_at, req.lock)));
        AcquireOutcome::Queued(ticket)
    }

    /// Renews a lease for a full TTL from `now`. A lease in a session renews its whole
    /// session (one keepalive for all of them).
    pub fn keepalive(&mut self, now: Millis, lease_id: &str) -> Result<LeaseView, LeaseExpired> {
        let name = self.leases.get(lease_id).cloned().ok_or(LeaseExpired)?;
        self.settle(now, &name);
        let lease = held_lease(&mut self.locks, &name, lease_id).ok_or(LeaseExpired)?;
        if let Some(session) = lease.session.clone() {
            self.keepalive_session(now, &session)
                .map_err(|_| LeaseExpired)?;
            return self.lease(now, lease_id).ok_or(LeaseExpired);
        }
        lease.deadline = now.saturating_add(lease.ttl_ms);
        let deadline = lease.deadline;
        let view = Self::lease_view(&name, lease, now);
        self.timers.push(Reverse((deadline, name)));
        Ok(view)
    }

    /// Releases a live lease; the lock passes to the first waiter (no lock-delay).
    pub fn release(&mut self, now: Millis, lease_id: &str) -> Result<LeaseView, LeaseExpired> {
        let name = self.leases.get(lease_id).cloned().ok_or(LeaseExpired)?;
        self.settle(now, &name);
        let lock = self.locks.get_mut(name.as_str()).ok_or(LeaseExpired)?;
        if lock.lease.as_ref().is_none_or(|l| l.id != lease_id) {
            return Err(LeaseExpired);
        }
        let lease = lock.lease.take().ok_or(LeaseExpired)?;
        self.leases.remove(lease_id);
        sessions::forget_lease(&mut self.sessions, &lease);
        if let Some(owner) = &lease.owner {
            count(&mut self.owners, owner, -1, 0);
        }
        let view = Self::lease_view(&name, &lease, now);
        self.settle(now, &name);
        Ok(view)
    }

    /// Replaces a live lease's value (`None` clears it). Nothing else about the lease or
    /// its lock changes: not its deadline, not its epoch.
    pub fn proclaim(
        &mut self,
        now: Millis,
        lease_id: &str,
        value: Option<Vec<u8>>,
    ) -> Result<LeaseView, LeaseExpired> {
        let name = self.leases.get(lease_id).cloned().ok_or(LeaseExpired)?;
        self.settle(now, &name);
        let lease = held_lease(&mut self.locks, &name, lease_id).ok_or(LeaseExpired)?;
        lease.value = value;
        Ok(Self::lease_view(&name, lease, now))
    }

    /// The first waiter in line for `lock`, with the epoch it will get if the lock is
    /// handed to it next: (ticket, holder, epoch). A hint for work that can be done ahead
    /// of the hand-off (signing its token); the grant itself decides.
    pub fn head_waiter(&self, lock: &str) -> Option<(Ticket, String, Epoch)> {
        let l = self.locks.get(lock)?;
        let w = l.queue.iter().next()?;
        Some((w.ticket, w.holder.clone(), l.last_epoch + 1))
    }

    /// Withdraws a queued waiter (it gave up or went away). Unknown tickets are ignored.
    pub fn cancel(&mut self, ticket: Ticket) {
        if let Some(name) = self.waiters.remove(&ticket) {
            if let Some(lock) = self.locks.get_mut(name.as_str()) {
                let owners = &mut self.owners;
                let sessions = &mut self.sessions;
                lock.queue.retain(|w| {
                    let gone = w.ticket == ticket;
                    if let (true, Some(owner)) = (gone, &w.owner) {
                        count(owners, owner, 0, -1);
                    }
                    if gone {
                        sessions::forget_ticket(sessions, w);
                    }
                    !gone
                });
            }
        }
    }

    /// Processes every deadline that has passed.
    pub fn poll(&mut self, now: Millis) {
        // Sessions first: a session's leases then expire in the lock pass below, at the
        // same `now`, whichever timer comes first.
        self.poll_sessions(now);
        while let Some(Reverse((when, _))) = self.timers.peek() {
            if *when > now {
                break;
            }
            if let Some(Reverse((_, name))) = self.timers.pop() {
                self.settle(now, &name);
            }
        }
    }

    /// When [`poll`](Self::poll) next has something to do.
    pub fn next_wakeup(&self) -> Option<Millis> {
        let lock = self.timers.peek().map(|Reverse((when, _))| *when);
        let session = self.session_timers.peek().map(|Reverse((when, _))| *when);
        match (lock, session) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes the events produced since the last call.
    pub fn drain_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// A lock's state (epoch 0 and no lease for a lock never acquired).
    pub fn status(&mut self, now: Millis, name: &str) -> LockView {
        self.settle(now, name);
        match self.locks.get(name) {
            Some(lock) => Self::lock_view(name, lock, now),
            None => LockView {
                lock: name.to_owned(),
                epoch: 0,
                granted_up_to: 0,
                lease: None,
                waiters: 0,
            },
        }
    }

    /// The live lease with this id, if any.
    pub fn lease(&mut self, now: Millis, lease_id: &str) -> Option<LeaseView> {
        let name = self.leases.get(lease_id).cloned()?;
        self.settle(now, &name);
        let lock = self.locks.get(name.as_str())?;
        lock.lease
            .as_ref()
            .filter(|l| l.id == lease_id)
            .map(|l| Self::lease_view(&name, l, now))
    }

    /// Number of live leases.
    pub fn live_leases(&self) -> usize {
        self.leases.len()
    }

    /// Brings one lock up to date: expire its lease, drop waiters whose wait ran out, end
    /// its lock-delay, and hand it to the first waiter if it is free.
    fn settle(&mut self, now: Millis, name: &str) {
        // A lease whose session has run out ends with the whole session, and the
        // session's end comes first (see the `sessions` module).
        if let Some(session) = self.ended_session_of(now, name) {
            self.expire_session(now, &session);
        }
        let Some(lock) = self.locks.get_mut(name) else {
            return;
        };
        if let Some(lease) = lock.lease.take_if(|l| l.deadline <= now) {
            self.leases.remove(&lease.id);
            sessions::forget_lease(&mut self.sessions, &lease);
            if let Some(owner) = &lease.owner {
                count(&mut self.owners, owner, -1, 0);
            }
            lock.expired_unsynced = true;
            if lease.lock_delay_ms > 0 {
                // Never shorten a longer block: after a restart a restored lease can expire
                // while the lock still waits out its reservation's TTL.
                let delay_end = lease.deadline.saturating_add(lease.lock_delay_ms);
                lock.delay_until = lock.delay_until.max(delay_end);
                self.timers
                    .push(Reverse((lock.delay_until, name.to_owned())));
            }
            self.events.push(Event::Expired {
                lease_id: lease.id,
                lock: name.to_owned(),
                epoch: lease.epoch,
                holder: lease.holder,
            });
        }
        if lock.queue.iter().any(|w| w.give_up_at <= now) {
            let (holder, retry_after_ms) = Self::busy(lock, now);
            let (gone, kept): (VecDeque<Waiter>, VecDeque<Waiter>) = lock
                .queue
                .take()
                .into_iter()
                .partition(|w| w.give_up_at <= now);
            lock.queue = Queue::from_deque(kept);
            for waiter in gone {
                self.waiters.remove(&waiter.ticket);
                sessions::forget_ticket(&mut self.sessions, &waiter);
                if let Some(owner) = &waiter.owner {
                    count(&mut self.owners, owner, 0, -1);
                }
                self.events.push(Event::TimedOut {
                    ticket: waiter.ticket,
                    holder: holder.clone(),
                    retry_after_ms,
                });
            }
        }
        if lock.lease.is_none() && lock.delay_until <= now {
            while let Some(w) = lock.queue.pop_front() {
                self.waiters.remove(&w.ticket);
                let ticket = w.ticket;
                sessions::forget_ticket(&mut self.sessions, &w);
                // A waiter whose session ended (its timer not handled yet) is out of line.
                if w.session
                    .as_ref()
                    .is_some_and(|id| !sessions::is_live(&self.sessions, id, now))
                {
                    if let Some(owner) = &w.owner {
                        count(&mut self.owners, owner, 0, -1);
                    }
                    self.events.push(Event::SessionGone { ticket });
                    continue;
                }
                let deadline =
                    sessions::deadline(&self.sessions, w.session.as_deref(), now, w.ttl_ms);
                let grant = Self::grant(
                    lock,
                    &self.config,
                    name,
                    Waiting {
                        lease_id: w.lease_id,
                        holder: w.holder,
                        ttl_ms: w.ttl_ms,
                        owner: w.owner,
                        deadline,
                        value: w.value,
                        lock_delay_ms: w.lock_delay_ms,
                        session: w.session,
                    },
                );
                if let Some(owner) = grant_owner(lock) {
                    count(&mut self.owners, owner, 1, -1);
                }
                sessions::adopt(&mut self.sessions, &grant);
                self.leases.insert(grant.lease_id.clone(), name.to_owned());
                self.timers.push(Reverse((deadline, name.to_owned())));
                self.events.push(Event::Granted { ticket, grant });
                break;
            }
        }
        if lock.lease.is_none() && lock.queue.is_empty() && lock.delay_until <= now {
            self.fell_idle(now, name);
        }
    }

    fn grant(lock: &mut Lock, config: &TableConfig, name: &str, who: Waiting) -> Grant {
        let Waiting {
            lease_id,
            holder,
            ttl_ms,
            owner,
            deadline,
            value,
            lock_delay_ms,
            session,
        } = who;
        lock.last_epoch += 1;
        lock.granted = lock.last_epoch;
        lock.idle_since = NOT_IDLE;
        lock.lease = Some(Box::new(Lease {
            id: lease_id.clone(),
            holder: holder.clone(),
            epoch: lock.last_epoch,
            ttl_ms,
            deadline,
            owner,
            value: value.clone(),
            lock_delay_ms,
            session: session.clone(),
        }));
        // How long this lease may keep the lock from being granted after a restart: its
        // TTL, plus its lock-delay where that is longer than the default one a restart
        // adds anyway (see the module docs).
        let block = ttl_ms.saturating_add(lock_delay_ms.saturating_sub(config.lock_delay_ms));
        let covered = lock.durable.covers(lock.last_epoch, block) && !lock.expired_unsynced;
        // This grant's durable write comes after the expired lease's queued removal, and
        // it is answered only once that write is done.
        lock.expired_unsynced = false;
        let reserve = (!covered).then(|| Reservation {
            ceiling: lock.last_epoch + config.epoch_block.max(1) - 1,
            max_ttl_ms: block.max(lock.durable.max_ttl_ms),
            active: true,
        });
        Grant {
            lock: name.to_owned(),
            holder,
            epoch: lock.last_epoch,
            lease_id,
            ttl_ms,
            reserve,
            generation: lock.generation,
            value,
            lock_delay_ms,
            session,
        }
    }

    /// Who holds a busy lock, and a hint for when to retry.
    fn busy(lock: &Lock, now: Millis) -> (Option<String>, Millis) {
        match &lock.lease {
            Some(lease) => (
                Some(lease.holder.clone()),
                lease.deadline.saturating_sub(now),
            ),
            None => (None, lock.delay_until.saturating_sub(now)),
        }
    }

    fn lease_view(name: &str, lease: &Lease, now: Millis) -> LeaseView {
        LeaseView {
            lease_id: lease.id.clone(),
            lock: name.to_owned(),
            holder: lease.holder.clone(),
            epoch: lease.epoch,
            ttl_ms: lease.ttl_ms,
            remaining_ms: lease.deadline.saturating_sub(now),
            value: lease.value.clone(),
            lock_delay_ms: lease.lock_delay_ms,
            session: lease.session.clone(),
        }
    }

    fn lock_view(name: &str, lock: &Lock, now: Millis) -> LockView {
        LockView {
            lock: name.to_owned(),
            epoch: lock.granted,
            granted_up_to: lock.last_epoch.max(lock.granted),
            lease: lock
                .lease
                .as_ref()
                .filter(|l| l.deadline > now)
                .map(|l| Self::lease_view(name, l, now)),
            waiters: lock.queue.len(),
        }
    }
}

/// The lease or waiter being turned into a lease.
struct Waiting {
    lease_id: LeaseId,
    holder: String,
    ttl_ms: Millis,
    owner: Option<Box<str>>,
    /// Now + TTL, or its session's deadline.
    deadline: Millis,
    value: Option<Vec<u8>>,
    lock_delay_ms: Millis,
    session: Option<SessionId>,
}

/// The lease `lease_id`, if it is the one holding lock `name` (the lease index can name a
/// lease its lock no longer has until the lock is settled).
fn held_lease<'a>(
    locks: &'a mut HashMap<Box<str>, Box<Lock>>,
    name: &str,
    lease_id: &str,
) -> Option<&'a mut Lease> {
    let lease = locks.get_mut(name)?.lease.as_deref_mut()?;
    (lease.id == lease_id).then_some(lease)
}

/// A lock's state, created at the epoch floor if the table has not seen it.
fn lock_entry(locks: &mut HashMap<Box<str>, Box<Lock>>, floor: Epoch, name: String) -> &mut Lock {
    locks.entry(name.into_boxed_str()).or_insert_with(|| {
        Box::new(Lock {
            last_epoch: floor,
            ..Lock::default()
        })
    })
}

mod quotas;
mod reservations;
mod sessions;
use quotas::{count, grant_owner, Held};
pub use reservations::Reservation;
pub use sessions::{SessionError, SessionRequest, SessionView};

#[cfg(test)]
mod tests;
