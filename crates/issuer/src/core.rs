//! The issuer's decisions, as a pure state machine.
//!
//! [`IssuerCore`] is everything the embedded issuer decides, with none of what it does:
//! no clock (every input carries `now`), no I/O, no tasks, no channels. Each input
//! (an acquisition, a renewal, a release, a proclamation, a session call, a durable write
//! that completed or failed, the timer firing, a grant that could not be delivered) leaves
//! [`Action`]s behind, taken with [`IssuerCore::take_actions`] and carried out in order by
//! whoever drives the core:
//!
//! - [`Action::Lazy`]: queue a record for the next commit, nobody waits for it;
//! - [`Action::Write`]: a durable write; its outcome comes back as
//!   [`IssuerCore::written`];
//! - [`Action::Reply`]: answer a request (an acquisition, release, proclamation or
//!   session call that had to wait for the disk, or for its turn in line);
//! - [`Action::Note`]: tell the observer of a grant, release or expiry;
//! - [`Action::SignAhead`]: the waiter first in line will most likely get this epoch;
//!   its token may be signed now;
//! - [`Action::Timer`]: call [`IssuerCore::tick`] at this time (earlier is harmless).
//!
//! The async shell ([`crate::embedded`]) feeds it from requests, the backend's writes and
//! a deadline task, and reads the clock; `palisade-sim` feeds it from a simulated network,
//! disk and clock, so the simulation runs this very code.
//!
//! Which grants wait for the disk, and in what order records are queued, is described in
//! [`crate::embedded`]'s module docs; this module is where it is decided.

use std::collections::HashMap;

use palisade_core::lock_table::{
    AcquireOutcome, AcquireRequest, Event, Grant, LeaseView, LockTable, LockView, Reservation,
    SessionRequest, SessionView, TableConfig, Ticket,
};
use palisade_core::Millis;
use palisade_storage::{IssuerState, LazyRecord, LeaseRecord, StorageError};
use palisade_token::Epoch;

use crate::observe::{LeaseChange, LeaseEvent};
use crate::{AcquireError, LeaseError, MayAct, SessionError};

/// Epochs covered by one durable reservation when the configuration does not say.
pub const DEFAULT_EPOCH_BLOCK: u64 = 1024;

/// The lease id a barrier removes: no lease has it (lease ids are the server's hex
/// strings), so removing it changes nothing on disk. The writer keeps order, so its
/// completion means everything queued before it is on disk.
pub const BARRIER_ID: &str = "\u{0}barrier";

/// Names a request whose answer may come later, chosen by the caller (unique among the
/// requests not yet answered).
pub type ReqId = u64;

/// Names a durable write the core asked for, chosen by the core.
pub type WriteId = u64;

/// A durable write: answered ([`IssuerCore::written`]) once on disk, or failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// `IssuerLog::reserve`: a lock's reservation with the lease record of the grant that
    /// needed it.
    Reserve {
        lock: String,
        reservation: Reservation,
        lease: LeaseRecord,
    },
    /// `IssuerLog::remove_lease`: removes a lease record; with [`BARRIER_ID`], a barrier
    /// for everything queued before it.
    RemoveLease(String),
}

/// An answer to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Acquire(Result<Grant, AcquireError>),
    Lease(Result<LeaseView, LeaseError>),
    Session(Result<SessionView, SessionError>),
}

/// A change of a lease, for the observer (an owned [`LeaseEvent`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub change: LeaseChange,
    pub lock: String,
    pub holder: String,
    pub epoch: Epoch,
    pub lease_id: String,
    pub ttl_ms: Millis,
}

impl Note {
    pub fn event(&self) -> LeaseEvent<'_> {
        LeaseEvent {
            change: self.change,
            lock: &self.lock,
            holder: &self.holder,
            epoch: self.epoch,
            lease_id: &self.lease_id,
            ttl_ms: self.ttl_ms,
        }
    }
}

/// Something the core decided; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Lazy(LazyRecord),
    Write {
        id: WriteId,
        write: Write,
    },
    Reply {
        to: ReqId,
        reply: Reply,
    },
    Note(Note),
    SignAhead {
        to: ReqId,
        lock: String,
        epoch: Epoch,
        holder: String,
    },
    Timer {
        at: Millis,
    },
}

/// What [`IssuerCore::recover`] found in the records: what a restart honours.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Lease records honoured for a full TTL from the start.
    pub leases: usize,
    /// Locks whose active reservation keeps them ungrantable for a while after the start
    /// (a lease granted under it may still be live).
    pub blocked_locks: usize,
    /// How long the longest of those blocks lasts from the start.
    pub blocked_for_ms: Millis,
    /// Locks with a record (an epoch counter or a reservation).
    pub locks: usize,
    /// The highest epoch ceiling recorded: no lock continues below its own, none above
    /// this was ever issued.
    pub max_ceiling: Epoch,
    /// Locks without a record start above this (set by a restore from backup).
    pub epoch_floor: Epoch,
}

/// What a durable write in flight is for.
#[derive(Debug)]
enum Pending {
    /// A grant's reservation (then, in a session, a barrier), then its answer.
    GrantReserve { grant: Grant, to: Option<ReqId> },
    /// A session lease's barrier, then its answer.
    GrantFlush { grant: Grant, to: Option<ReqId> },
    /// A release, answered once its removal is on disk.
    Lease { to: ReqId, view: LeaseView },
    /// A new session, answered once its record is on disk (closed again if that fails).
    CreateSession { to: ReqId, view: SessionView },
    /// A closed session, answered once its removals are on disk.
    Session { to: ReqId, view: SessionView },
}

/// The issuer's state and decisions. See the module docs.
#[derive(Debug)]
pub struct IssuerCore {
    table: LockTable,
    /// Requests waiting in line, by ticket, and the other way round.
    waiting: HashMap<Ticket, ReqId>,
    tickets: HashMap<ReqId, Ticket>,
    writes: HashMap<WriteId, Pending>,
    /// Grants handed to waiters that had left, withdrawn at the end of the input.
    orphans: Vec<String>,
    next_write: WriteId,
    /// Set by `close`: nobody waits in line any more.
    closed: bool,
    /// Whether to emit [`Action::Note`]s.
    observed: bool,
    /// The earliest [`Action::Timer`] asked for and not yet fired.
    armed: Option<Millis>,
    actions: Vec<Action>,
}

impl IssuerCore {
    /// An issuer with no records.
    pub fn new(config: TableConfig) -> IssuerCore {
        IssuerCore::recover(config, 0, IssuerState::default()).0
    }

    /// Rebuilds the issuer from its records at `now`: recorded leases are honoured for a
    /// full TTL, sessions come back with their leases, locks with an active reservation
    /// wait it out, and epochs continue above every record.
    pub fn recover(
        mut config: TableConfig,
        now: Millis,
        state: IssuerState,
    ) -> (IssuerCore, Recovered) {
        if config.epoch_block == 0 {
            config.epoch_block = DEFAULT_EPOCH_BLOCK;
        }
        let mut table = LockTable::new(config);
        let (sessions, leases): (Vec<LeaseRecord>, Vec<LeaseRecord>) =
            state.leases.into_iter().partition(LeaseRecord::is_session);
        let default_delay = config.lock_delay_ms;
        let active = state.reservations.iter().filter(|(_, r)| r.active);
        let recovered = Recovered {
            leases: leases.len(),
            blocked_locks: active.clone().count(),
            // A lease that chose its own lock-delay keeps its lock that much longer.
            blocked_for_ms: active
                .map(|(_, r)| r.max_ttl_ms.saturating_add(default_delay))
                .chain(leases.iter().map(|r| {
                    r.ttl_ms
                        .saturating_add(r.lock_delay_ms.unwrap_or(default_delay))
                }))
                .max()
                .unwrap_or(0),
            locks: state.epochs.len().max(state.reservations.len()),
            max_ceiling: state
                .epochs
                .iter()
                .map(|(_, e)| *e)
                .chain(state.reservations.iter().map(|(_, r)| r.ceiling))
                .max()
                .unwrap_or(0),
            epoch_floor: state.epoch_floor,
        };
        let leases = leases.into_iter().map(|r| Grant {
            value: r.value.as_deref().and_then(crate::value::decode),
            lock_delay_ms: r.lock_delay_ms.unwrap_or(default_delay),
            session: r.session,
            lock: r.lock,
            holder: r.holder,
            epoch: r.epoch,
            lease_id: r.lease_id,
            ttl_ms: r.ttl_ms,
            reserve: None,
            generation: 0,
        });
        table.set_epoch_floor(state.epoch_floor);
        // Sessions first: their leases join them.
        table.restore_sessions(
            now,
            sessions
                .into_iter()
                .map(|r| (r.lease_id, r.holder, r.ttl_ms)),
        );
        table.restore(now, state.epochs, leases);
        table.restore_reservations(now, state.reservations);
        let mut core = IssuerCore {
            table,
            orphans: Vec::new(),
            waiting: HashMap::new(),
            tickets: HashMap::new(),
            writes: HashMap::new(),
            next_write: 0,
            closed: false,
            observed: false,
            armed: None,
            actions: Vec::new(),
        };
        core.settle(now);
        (core, recovered)
    }

    /// Emit [`Action::Note`]s from now on (there is an observer).
    pub fn observe(&mut self) {
        self.observed = true;
    }

    /// Takes the actions decided so far, in the order they must be carried out.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// Live leases and requests waiting in line.
    pub fn census(&self) -> (usize, usize) {
        (self.table.live_leases(), self.waiting.len())
    }

    /// Durable writes asked for and not answered yet.
    pub fn writes_in_flight(&self) -> usize {
        self.writes.len()
    }

    /// When [`IssuerCore::tick`] is next due, if ever.
    pub fn armed(&self) -> Option<Millis> {
        self.armed
    }

    /// Acquires a lock for request `to`, which is answered with [`Reply::Acquire`]: at
    /// once, once its grant is durable, or when its wait in line ends.
    pub fn acquire(&mut self, now: Millis, to: ReqId, req: AcquireRequest) {
        let lock = req.lock.clone();
        let outcome = self.table.acquire(now, req);
        // What the table settled before deciding comes first.
        self.drain();
        let refused = match outcome {
            AcquireOutcome::Granted(grant) => {
                self.grant(grant, Some(to));
                None
            }
            AcquireOutcome::NoSession => Some(AcquireError::NoSession),
            AcquireOutcome::Held {
                holder,
                retry_after_ms,
            } => Some(AcquireError::Held {
                holder,
                retry_after_ms,
            }),
            AcquireOutcome::QuotaExceeded { resource, limit } => {
                Some(AcquireError::QuotaExceeded { resource, limit })
            }
            AcquireOutcome::Queued(ticket) if self.closed => {
                self.table.cancel(ticket);
                Some(AcquireError::Storage(StorageError::Closed))
            }
            AcquireOutcome::Queued(ticket) => {
                self.waiting.insert(ticket, to);
                self.tickets.insert(to, ticket);
                self.sign_ahead(&lock);
                None
            }
        };
        if let Some(e) = refused {
            self.reply(to, Reply::Acquire(Err(e)));
        }
        self.settle(now);
    }

    /// Request `to` is not waiting for its answer any more: it leaves the line, and a
    /// grant on its way to it is withdrawn once durable.
    pub fn cancel(&mut self, now: Millis, to: ReqId) {
        if let Some(ticket) = self.tickets.remove(&to) {
            self.waiting.remove(&ticket);
            self.table.cancel(ticket);
        }
        for pending in self.writes.values_mut() {
            if let Pending::GrantReserve { to: t, .. } | Pending::GrantFlush { to: t, .. } = pending
            {
                if *t == Some(to) {
                    *t = None;
                }
            }
        }
        self.settle(now);
    }

    /// A grant answered with [`Reply::Acquire`] found nobody to take it: it is released.
    pub fn undelivered(&mut self, now: Millis, lease_id: &str) {
        self.withdraw(now, lease_id);
        self.settle(now);
    }

    /// Answers every request waiting in line with [`StorageError::Closed`] and refuses new
    /// ones (the server is stopping). Locks held stay held.
    pub fn close(&mut self, now: Millis) {
        self.closed = true;
        let mut waiting: Vec<(Ticket, ReqId)> = self.waiting.drain().collect();
        waiting.sort_unstable_by_key(|(_, to)| *to);
        for (ticket, to) in waiting {
            self.tickets.remove(&to);
            self.table.cancel(ticket);
            self.reply(to, Reply::Acquire(Err(StorageError::Closed.into())));
        }
        self.settle(now);
    }

    /// Renews a lease for a full TTL from `now`. Not written to disk: after a restart
    /// every recorded lease gets a full TTL anyway.
    pub fn keepalive(
        &mut self,
        now: Millis,
        lease_id: &str,
        may: MayAct<'_>,
    ) -> Result<LeaseView, LeaseError> {
        let result = match self.refusal(now, lease_id, may) {
            Some(refused) => Err(refused),
            None => self
                .table
                .keepalive(now, lease_id)
                .map_err(|_| LeaseError::Expired),
        };
        self.settle(now);
        result
    }

    /// Why the caller may not act on lease `lease_id`, if it may not: the lease is not
    /// live, or `may` says no to its lock and holder. Changes nothing but settling the
    /// lease's lock, as any look at it does.
    fn refusal(&mut self, now: Millis, lease_id: &str, may: MayAct<'_>) -> Option<LeaseError> {
        let may = may?;
        match self.table.lease(now, lease_id) {
            None => Some(LeaseError::Expired),
            Some(lease) if !may.may_act(&lease.lock, &lease.holder) => {
                Some(LeaseError::NotYours(Box::new(lease)))
            }
            Some(_) => None,
        }
    }

    /// Answers request `to` with the [`refusal`](Self::refusal) of lease `lease_id`, if
    /// there is one; `true` when it did (the call then changes nothing more).
    fn refused(&mut self, now: Millis, to: ReqId, lease_id: &str, may: MayAct<'_>) -> bool {
        let Some(refused) = self.refusal(now, lease_id, may) else {
            return false;
        };
        self.drain();
        self.reply(to, Reply::Lease(Err(refused)));
        self.settle(now);
        true
    }

    /// Releases a lease for request `to`; the lock passes to the first waiter. Answered
    /// with [`Reply::Lease`] once the lease record's removal is on disk.
    pub fn release(&mut self, now: Millis, to: ReqId, lease_id: &str, may: MayAct<'_>) {
        if self.refused(now, to, lease_id, may) {
            return;
        }
        match self.table.release(now, lease_id) {
            Ok(view) => {
                self.note_view(LeaseChange::Released, &view);
                // Queued before anything the release set off (a hand-off's lease record):
                // the writer keeps order, so whatever of the hand-off reaches the disk,
                // this removal reached it first.
                self.lazy(LazyRecord::RemoveLease(lease_id.to_owned()));
                self.drain();
                // Answered once a second removal commits: it commits after the first.
                self.write(
                    Write::RemoveLease(lease_id.to_owned()),
                    Pending::Lease { to, view },
                );
            }
            Err(_) => {
                self.drain();
                self.reply(to, Reply::Lease(Err(LeaseError::Expired)));
            }
        }
        self.settle(now);
    }

    /// Replaces a live lease's value for request `to`; answered with [`Reply::Lease`]
    /// once the lease record carrying it is on disk.
    pub fn proclaim(
        &mut self,
        now: Millis,
        to: ReqId,
        lease_id: &str,
        value: Option<Vec<u8>>,
        may: MayAct<'_>,
    ) {
        if self.refused(now, to, lease_id, may) {
            return;
        }
        match self.table.proclaim(now, lease_id, value) {
            Ok(view) => {
                // Queued in decision order: a release or expiry that follows queues its
                // removal after this record, never before it.
                self.lazy(LazyRecord::Lease(record_of_view(&view)));
                self.drain();
                self.barrier(Pending::Lease { to, view });
            }
            Err(_) => {
                self.drain();
                self.reply(to, Reply::Lease(Err(LeaseError::Expired)));
            }
        }
        self.settle(now);
    }

    /// Creates a session for request `to`; answered with [`Reply::Session`] once its
    /// record is on disk.
    pub fn create_session(&mut self, now: Millis, to: ReqId, req: SessionRequest) {
        match self.table.create_session(now, req) {
            Ok(view) => {
                self.lazy(LazyRecord::Lease(LeaseRecord {
                    lease_id: view.session_id.clone(),
                    holder: view.holder.clone(),
                    ttl_ms: view.ttl_ms,
                    session: Some(view.session_id.clone()),
                    ..LeaseRecord::default()
                }));
                self.drain();
                self.barrier(Pending::CreateSession { to, view });
            }
            Err(e) => {
                self.drain();
                self.reply(to, Reply::Session(Err(session_error(e))));
            }
        }
        self.settle(now);
    }

    /// Renews a session and every lease in it. Not written to disk, like a keepalive.
    pub fn keepalive_session(
        &mut self,
        now: Millis,
        session_id: &str,
    ) -> Result<SessionView, SessionError> {
        let result = self.table.keepalive_session(now, session_id);
        self.settle(now);
        result.map_err(session_error)
    }

    /// Ends a session for request `to`, releasing its leases; answered with
    /// [`Reply::Session`] once their removal is on disk.
    pub fn close_session(&mut self, now: Millis, to: ReqId, session_id: &str) {
        match self.end_session(now, session_id) {
            Ok(view) => self.barrier(Pending::Session { to, view }),
            Err(e) => self.reply(to, Reply::Session(Err(session_error(e)))),
        }
        self.settle(now);
    }

    /// A lock's state.
    pub fn status(&mut self, now: Millis, lock: &str) -> LockView {
        let view = self.table.status(now, lock);
        self.settle(now);
        view
    }

    /// Whether the table holds `lock` now (not: never met, or forgotten to make room).
    pub fn knows(&self, lock: &str) -> bool {
        self.table.knows(lock)
    }

    /// A live session with its leases.
    pub fn session(&mut self, now: Millis, session_id: &str) -> Option<SessionView> {
        let view = self.table.session(now, session_id);
        self.settle(now);
        view
    }

    /// The timer fired: expire leases, time out waiters, hand locks over.
    pub fn tick(&mut self, now: Millis) {
        self.armed = None;
        self.table.poll(now);
        self.settle(now);
    }

    /// A durable write the core asked for completed (`Ok`: it is on disk).
    pub fn written(&mut self, now: Millis, id: WriteId, result: Result<(), StorageError>) {
        let Some(pending) = self.writes.remove(&id) else {
            return;
        };
        match (pending, result) {
            (Pending::GrantReserve { grant, to }, Ok(())) => {
                if let Some(reservation) = grant.reserve {
                    self.table
                        .confirm(now, &grant.lock, reservation, grant.generation);
                    self.drain();
                }
                if grant.session.is_some() {
                    // A session's leases are on disk before they are answered.
                    self.barrier(Pending::GrantFlush { grant, to });
                } else {
                    self.deliver(now, grant, to);
                }
            }
            (Pending::GrantReserve { grant, to }, Err(e)) => {
                tracing::error!(lock = %grant.lock, epoch = grant.epoch, error = %e, "cannot record grant");
                // Withdrawn; the epoch it had is burnt, never reused.
                self.withdraw(now, &grant.lease_id);
                if let Some(to) = to {
                    self.reply(to, Reply::Acquire(Err(e.into())));
                }
            }
            (Pending::GrantFlush { grant, to }, Ok(())) => self.deliver(now, grant, to),
            (Pending::GrantFlush { to, .. }, Err(e)) => {
                if let Some(to) = to {
                    self.reply(to, Reply::Acquire(Err(e.into())));
                }
            }
            (Pending::Lease { to, view }, result) => {
                let reply = result.map(|()| view).map_err(LeaseError::from);
                self.reply(to, Reply::Lease(reply));
            }
            (Pending::Session { to, view }, result) => {
                let reply = result.map(|()| view).map_err(SessionError::from);
                self.reply(to, Reply::Session(reply));
            }
            (Pending::CreateSession { to, view }, Ok(())) => {
                self.reply(to, Reply::Session(Ok(view)))
            }
            (Pending::CreateSession { to, view }, Err(e)) => {
                // Unrecorded: nobody may use it (the store has failed anyway).
                let _ = self.end_session(now, &view.session_id);
                self.reply(to, Reply::Session(Err(e.into())));
            }
        }
        self.settle(now);
    }

    /// Ends a session in the table and queues its removals: the session's record first,
    /// then its leases' (see [`crate::embedded`]), before anything the releases set off.
    fn end_session(
        &mut self,
        now: Millis,
        session_id: &str,
    ) -> Result<SessionView, palisade_core::lock_table::SessionError> {
        let result = self.table.close_session(now, session_id);
        if let Ok(view) = &result {
            self.lazy(LazyRecord::RemoveLease(session_id.to_owned()));
            for lease in &view.leases {
                self.lazy(LazyRecord::RemoveLease(lease.lease_id.clone()));
                self.note_view(LeaseChange::Released, lease);
            }
        }
        self.drain();
        result
    }

    /// Makes a grant durable as it needs, then answers `to` (or withdraws it if nobody
    /// waits for it).
    fn grant(&mut self, grant: Grant, to: Option<ReqId>) {
        self.note(
            LeaseChange::Granted,
            &grant.lock,
            &grant.holder,
            grant.epoch,
            &grant.lease_id,
            grant.ttl_ms,
        );
        match grant.reserve {
            Some(reservation) => {
                let write = Write::Reserve {
                    lock: grant.lock.clone(),
                    reservation,
                    lease: record_of(&grant),
                };
                self.write(write, Pending::GrantReserve { grant, to });
            }
            None => {
                // Covered by a durable reservation: the epoch cannot be reissued and the
                // lock waits out the reservation's TTL after a crash; the lease record only
                // lets the holder keep renewing across a restart, so it need not hold us up.
                self.lazy(LazyRecord::Lease(record_of(&grant)));
                if grant.session.is_some() {
                    // A session's lease waits for the disk (module docs).
                    self.barrier(Pending::GrantFlush { grant, to });
                } else {
                    match to {
                        Some(to) => self.reply(to, Reply::Acquire(Ok(grant))),
                        None => self.withdraw_later(grant.lease_id),
                    }
                }
            }
        }
    }

    /// Answers a durable grant, or releases it if nobody waits for it any more.
    fn deliver(&mut self, now: Millis, grant: Grant, to: Option<ReqId>) {
        match to {
            Some(to) => self.reply(to, Reply::Acquire(Ok(grant))),
            None => self.withdraw(now, &grant.lease_id),
        }
    }

    /// Releases a lease nobody will use (undeliverable or unrecorded grant).
    fn withdraw(&mut self, now: Millis, lease_id: &str) {
        if let Ok(view) = self.table.release(now, lease_id) {
            self.note_view(LeaseChange::Released, &view);
        }
        self.lazy(LazyRecord::RemoveLease(lease_id.to_owned()));
        self.drain();
    }

    /// A grant handed to a waiter that already left, found while draining events: it is
    /// withdrawn by [`IssuerCore::settle`] (the table must not be re-entered mid-drain).
    fn withdraw_later(&mut self, lease_id: String) {
        self.orphans.push(lease_id);
    }

    /// Carries out what the table decided as a side effect of a call, in its order.
    fn drain(&mut self) {
        for event in self.table.drain_events() {
            match event {
                Event::Granted { ticket, grant } => {
                    let to = self.waiting.remove(&ticket);
                    if let Some(to) = to {
                        self.tickets.remove(&to);
                    }
                    self.sign_ahead(&grant.lock);
                    self.grant(grant, to);
                }
                Event::TimedOut {
                    ticket,
                    holder,
                    retry_after_ms,
                } => {
                    if let Some(to) = self.waiting.remove(&ticket) {
                        self.tickets.remove(&to);
                        let e = AcquireError::Held {
                            holder,
                            retry_after_ms,
                        };
                        self.reply(to, Reply::Acquire(Err(e)));
                    }
                }
                Event::SessionGone { ticket } => {
                    if let Some(to) = self.waiting.remove(&ticket) {
                        self.tickets.remove(&to);
                        self.reply(to, Reply::Acquire(Err(AcquireError::NoSession)));
                    }
                }
                Event::Expired {
                    lease_id,
                    lock,
                    epoch,
                    holder,
                } => {
                    tracing::debug!(%lock, epoch, %holder, "lease expired");
                    self.note(LeaseChange::Expired, &lock, &holder, epoch, &lease_id, 0);
                    // A leftover record only makes the lock wait one TTL after a restart,
                    // the safe direction: no need to wait for the disk.
                    self.lazy(LazyRecord::RemoveLease(lease_id));
                }
                Event::Idle { lock, reservation } => {
                    self.lazy(LazyRecord::Reservation { lock, reservation });
                }
                Event::SessionExpired { session_id, .. } => {
                    tracing::info!(session = %session_id, "session expired");
                    // Queued before its leases' removals (the table emits it first).
                    self.lazy(LazyRecord::RemoveLease(session_id));
                }
                Event::Forgotten { count, floor } => {
                    // Their records stay on disk, so a restart still knows each one's
                    // epoch; in memory, a lock met again starts above `floor`.
                    tracing::debug!(count, floor, "idle locks left memory");
                }
            }
        }
    }

    /// Ends every input: withdraws grants nobody waits for, drains the table, and asks
    /// for the timer if the table's next deadline is earlier than the one asked for.
    fn settle(&mut self, now: Millis) {
        self.drain();
        while let Some(lease_id) = self.orphans.pop() {
            self.withdraw(now, &lease_id);
        }
        if let Some(at) = self.table.next_wakeup() {
            if self.armed.is_none_or(|t| at < t) {
                self.armed = Some(at);
                self.actions.push(Action::Timer { at });
            }
        }
    }

    /// The waiter now first in line for `lock` will most likely get its next epoch.
    fn sign_ahead(&mut self, lock: &str) {
        let Some((ticket, holder, epoch)) = self.table.head_waiter(lock) else {
            return;
        };
        if let Some(&to) = self.waiting.get(&ticket) {
            self.actions.push(Action::SignAhead {
                to,
                lock: lock.to_owned(),
                epoch,
                holder,
            });
        }
    }

    fn lazy(&mut self, record: LazyRecord) {
        self.actions.push(Action::Lazy(record));
    }

    fn write(&mut self, write: Write, pending: Pending) {
        let id = self.next_write;
        self.next_write += 1;
        self.writes.insert(id, pending);
        self.actions.push(Action::Write { id, write });
    }

    /// Waits until everything queued so far is on disk, then completes `pending`.
    fn barrier(&mut self, pending: Pending) {
        self.write(Write::RemoveLease(BARRIER_ID.to_owned()), pending);
    }

    fn reply(&mut self, to: ReqId, reply: Reply) {
        self.actions.push(Action::Reply { to, reply });
    }

    fn note(
        &mut self,
        change: LeaseChange,
        lock: &str,
        holder: &str,
        epoch: Epoch,
        lease_id: &str,
        ttl_ms: Millis,
    ) {
        if self.observed {
            self.actions.push(Action::Note(Note {
                change,
                lock: lock.to_owned(),
                holder: holder.to_owned(),
                epoch,
                lease_id: lease_id.to_owned(),
                ttl_ms,
            }));
        }
    }

    fn note_view(&mut self, change: LeaseChange, view: &LeaseView) {
        self.note(
            change,
            &view.lock,
            &view.holder,
            view.epoch,
            &view.lease_id,
            view.ttl_ms,
        );
    }
}

/// The record of a grant, as the store keeps it.
fn record_of(grant: &Grant) -> LeaseRecord {
    LeaseRecord {
        lease_id: grant.lease_id.clone(),
        lock: grant.lock.clone(),
        holder: grant.holder.clone(),
        epoch: grant.epoch,
        ttl_ms: grant.ttl_ms,
        value: grant.value.as_deref().map(crate::value::encode),
        lock_delay_ms: Some(grant.lock_delay_ms),
        session: grant.session.clone(),
    }
}

/// The record of a live lease, as the store keeps it.
fn record_of_view(view: &LeaseView) -> LeaseRecord {
    LeaseRecord {
        lease_id: view.lease_id.clone(),
        lock: view.lock.clone(),
        holder: view.holder.clone(),
        epoch: view.epoch,
        ttl_ms: view.ttl_ms,
        value: view.value.as_deref().map(crate::value::encode),
        lock_delay_ms: Some(view.lock_delay_ms),
        session: view.session.clone(),
    }
}

fn session_error(e: palisade_core::lock_table::SessionError) -> SessionError {
    use palisade_core::lock_table::SessionError as Table;
    match e {
        Table::Expired => SessionError::Expired,
        // Ids are 128 random bits chosen by the server: a clash is a broken invariant
        // upstream, refused without changing anything.
        Table::Duplicate => {
            SessionError::Storage(StorageError::Failed("session id already in use".to_owned()))
        }
        Table::QuotaExceeded { resource, limit } => SessionError::QuotaExceeded { resource, limit },
    }
}

#[cfg(test)]
mod tests;
