//! Sessions: one keepalive for many leases (Chubby's sessions, the sessions of Consul and
//! of etcd's concurrency package).
//!
//! A session has a holder, a TTL and a deadline. A lease acquired in it takes the
//! session's TTL and the session's deadline; [`LockTable::keepalive_session`] moves the
//! deadline of the session and of every lease in it to `now + ttl` at once. When the
//! session's deadline passes, [`Event::SessionExpired`] comes first, then every lease in
//! it expires in the same call (an [`Event::Expired`] each, with its own lock-delay), and
//! its queued acquisitions leave their lines ([`Event::SessionGone`]).
//! [`LockTable::close_session`] releases every lease in it (no lock-delay, as for any
//! release) and takes its waiters out of line.
//!
//! ## Why the durability rules of the table hold unchanged
//! A session lease is an ordinary lease whose TTL is the session's and whose deadline is
//! never further than that TTL from `now` (creation, renewal and restore all set it to
//! `now + ttl`). So a reservation that covers the session's TTL covers the lease for as
//! long as it is renewed, exactly as for a lease renewed on its own, and the restart
//! block of a lock (its reservation's `max_ttl_ms`) still outlasts any lease of it.
//!
//! ## Why the session's end comes first
//! [`Event::SessionExpired`] is emitted before the expiries of its leases, so a caller that
//! records them in event order removes the session's record before its leases' records.
//! If only part of that reaches the disk, what a restart finds is either the whole
//! session or leases without a session: never a session that lost some of its leases
//! without saying so. A lock settled on its own after its session's deadline ends the
//! session first for the same reason.
//!
//! ## Quotas
//! A session counts as one lease against its owner's quota; each lease in it counts as
//! one more, as any lease does.

use palisade_api::QuotaResource;
use std::cmp::Reverse;
use std::collections::HashMap;

use super::{
    count, held_lease, Event, Grant, Lease, LeaseId, LeaseView, LockTable, Owner, SessionId,
    Ticket, Waiter,
};
use crate::Millis;

/// A live session.
#[derive(Debug)]
pub(super) struct Session {
    holder: String,
    pub(super) ttl_ms: Millis,
    pub(super) deadline: Millis,
    owner: Option<Box<str>>,
    /// The live leases in the session.
    pub(super) leases: Vec<LeaseId>,
    /// Its acquisitions waiting in line.
    pub(super) tickets: Vec<Ticket>,
}

/// A request to create a session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionRequest {
    /// Chosen by the caller, unique across restarts.
    pub session_id: SessionId,
    pub holder: String,
    pub ttl_ms: Millis,
    /// Whose lease quota the session counts against (None: nobody's).
    pub owner: Option<Owner>,
}

/// A session as seen from outside: its holder, TTL, time left and live leases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionView {
    pub session_id: SessionId,
    pub holder: String,
    pub ttl_ms: Millis,
    pub remaining_ms: Millis,
    /// Its live leases (for a closed session: the leases the close released).
    pub leases: Vec<LeaseView>,
}

/// Why a session call did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The session expired, was closed or never existed.
    #[error("session expired or unknown")]
    Expired,
    /// A session with this id exists already (ids are the caller's to keep unique).
    #[error("a session with this id exists")]
    Duplicate,
    /// Refused, nothing changed: `resource` (`"sessions"` or `"leases_per_principal"`)
    /// is limited to `limit`.
    #[error("quota exceeded: {resource} is limited to {limit}")]
    QuotaExceeded { resource: QuotaResource, limit: u64 },
}

impl LockTable {
    /// Creates a session whose deadline is `now + ttl_ms`.
    pub fn create_session(
        &mut self,
        now: Millis,
        req: SessionRequest,
    ) -> Result<SessionView, SessionError> {
        self.poll_sessions(now);
        if self.sessions.contains_key(&req.session_id) {
            return Err(SessionError::Duplicate);
        }
        let max = self.config.max_sessions;
        if max > 0 && self.sessions.len() >= max {
            return Err(SessionError::QuotaExceeded {
                resource: QuotaResource::Sessions,
                limit: max as u64,
            });
        }
        if let Some(o) = &req.owner {
            let held = self.owners.get(&o.name).map_or(0, |h| h.leases);
            if held >= o.max_leases {
                return Err(SessionError::QuotaExceeded {
                    resource: QuotaResource::LeasesPerPrincipal,
                    limit: o.max_leases.into(),
                });
            }
            count(&mut self.owners, &o.name, 1, 0);
        }
        let deadline = now.saturating_add(req.ttl_ms);
        let session = Session {
            holder: req.holder,
            ttl_ms: req.ttl_ms,
            deadline,
            owner: req.owner.map(|o| o.name),
            leases: Vec::new(),
            tickets: Vec::new(),
        };
        let view = self.session_view(&req.session_id, &session, now);
        self.sessions.insert(req.session_id.clone(), session);
        self.session_timers
            .push(Reverse((deadline, req.session_id)));
        Ok(view)
    }

    /// Renews a session and every lease in it for a full TTL from `now`.
    pub fn keepalive_session(
        &mut self,
        now: Millis,
        id: &str,
    ) -> Result<SessionView, SessionError> {
        self.live_session(now, id)?;
        let session = self.sessions.get_mut(id).ok_or(SessionError::Expired)?;
        let deadline = now.saturating_add(session.ttl_ms);
        session.deadline = deadline;
        for lease_id in &session.leases {
            let Some(name) = self.leases.get(lease_id) else {
                continue;
            };
            if let Some(lease) = held_lease(&mut self.locks, name, lease_id) {
                lease.deadline = deadline;
                self.timers.push(Reverse((deadline, name.clone())));
            }
        }
        self.session_timers.push(Reverse((deadline, id.to_owned())));
        self.session(now, id).ok_or(SessionError::Expired)
    }

    /// Ends a session: releases every lease in it (the locks pass to their next waiters,
    /// without lock-delay) and takes its waiters out of line ([`Event::SessionGone`]).
    /// Answers what was released.
    pub fn close_session(&mut self, now: Millis, id: &str) -> Result<SessionView, SessionError> {
        self.live_session(now, id)?;
        let session = self.sessions.remove(id).ok_or(SessionError::Expired)?;
        let mut view = self.session_view(id, &session, now);
        view.leases.clear();
        for lease_id in &session.leases {
            if let Ok(released) = self.release(now, lease_id) {
                view.leases.push(released);
            }
        }
        self.drop_session(session);
        Ok(view)
    }

    /// A live session, with its leases.
    pub fn session(&mut self, now: Millis, session_id: &str) -> Option<SessionView> {
        self.live_session(now, session_id).ok()?;
        let session = self.sessions.get(session_id)?;
        Some(self.session_view(session_id, session, now))
    }

    /// Number of live sessions.
    pub fn live_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Rebuilds sessions after a restart, each honoured for a full TTL from `now` (as
    /// leases are: the table cannot know how long it was down). Call before
    /// [`LockTable::restore`], whose leases then join their sessions. Restored sessions
    /// count against nobody's quota.
    pub fn restore_sessions(
        &mut self,
        now: Millis,
        sessions: impl IntoIterator<Item = (SessionId, String, Millis)>,
    ) {
        for (session_id, holder, ttl_ms) in sessions {
            let deadline = now.saturating_add(ttl_ms);
            self.sessions.insert(
                session_id.clone(),
                Session {
                    holder,
                    ttl_ms,
                    deadline,
                    owner: None,
                    leases: Vec::new(),
                    tickets: Vec::new(),
                },
            );
            self.session_timers.push(Reverse((deadline, session_id)));
        }
    }

    /// The session if it is live; ends it first if its deadline has passed.
    pub(super) fn live_session(
        &mut self,
        now: Millis,
        session_id: &str,
    ) -> Result<&Session, SessionError> {
        let session = self.sessions.get(session_id);
        if session.ok_or(SessionError::Expired)?.deadline <= now {
            self.expire_session(now, session_id);
            return Err(SessionError::Expired);
        }
        self.sessions.get(session_id).ok_or(SessionError::Expired)
    }

    /// Ends every session whose deadline has passed.
    pub(super) fn poll_sessions(&mut self, now: Millis) {
        while let Some(Reverse((when, _))) = self.session_timers.peek() {
            if *when > now {
                break;
            }
            if let Some(Reverse((_, id))) = self.session_timers.pop() {
                if self.sessions.get(&id).is_some_and(|s| s.deadline <= now) {
                    self.expire_session(now, &id);
                }
            }
        }
    }

    /// The session of `lock`'s lease, if that session's deadline has passed (see
    /// [`LockTable::settle`]: such a lock ends its session before anything else).
    pub(super) fn ended_session_of(&self, now: Millis, lock: &str) -> Option<SessionId> {
        let id = self.locks.get(lock)?.lease.as_ref()?.session.as_ref()?;
        let ended = self.sessions.get(id).is_some_and(|s| s.deadline <= now);
        ended.then(|| id.clone())
    }

    /// The session ran out: say so, then expire its leases and drop its waiters.
    pub(super) fn expire_session(&mut self, now: Millis, session_id: &str) {
        // Removed before its leases are settled, so that settling them sees no session.
        let Some(session) = self.sessions.remove(session_id) else {
            return;
        };
        self.events.push(Event::SessionExpired {
            session_id: session_id.to_owned(),
            holder: session.holder.clone(),
        });
        for lease_id in &session.leases {
            let Some(name) = self.leases.get(lease_id).cloned() else {
                continue;
            };
            if let Some(lease) = held_lease(&mut self.locks, &name, lease_id) {
                // Already equal (renewals move both); the session's end is what counts.
                lease.deadline = lease.deadline.min(session.deadline);
            }
            self.settle(now, &name);
        }
        self.drop_session(session);
    }

    /// Takes a session's waiters out of line and returns its own place in its owner's
    /// quota. The session is already out of the map.
    fn drop_session(&mut self, session: Session) {
        for ticket in &session.tickets {
            let Some(name) = self.waiters.remove(ticket) else {
                continue;
            };
            if let Some(lock) = self.locks.get_mut(name.as_str()) {
                let owners = &mut self.owners;
                lock.queue.retain(|w| {
                    let gone = w.ticket == *ticket;
                    if let (true, Some(owner)) = (gone, &w.owner) {
                        count(owners, owner, 0, -1);
                    }
                    !gone
                });
            }
            self.events.push(Event::SessionGone { ticket: *ticket });
        }
        if let Some(owner) = &session.owner {
            count(&mut self.owners, owner, -1, 0);
        }
    }

    fn session_view(&self, session_id: &str, session: &Session, now: Millis) -> SessionView {
        let leases = session
            .leases
            .iter()
            .filter_map(|id| {
                let name = self.leases.get(id)?;
                let lease = self.locks.get(name.as_str())?.lease.as_ref()?;
                (&lease.id == id).then(|| Self::lease_view(name, lease, now))
            })
            .collect();
        SessionView {
            session_id: session_id.to_owned(),
            holder: session.holder.clone(),
            ttl_ms: session.ttl_ms,
            remaining_ms: session.deadline.saturating_sub(now),
            leases,
        }
    }
}

/// The deadline of a lease granted now: its session's, or `now + ttl_ms`.
pub(super) fn deadline(
    sessions: &HashMap<SessionId, Session>,
    session: Option<&str>,
    now: Millis,
    ttl_ms: Millis,
) -> Millis {
    match session.and_then(|id| sessions.get(id)) {
        Some(s) => s.deadline,
        None => now.saturating_add(ttl_ms),
    }
}

/// Whether the session exists and its deadline is ahead.
pub(super) fn is_live(sessions: &HashMap<SessionId, Session>, id: &str, now: Millis) -> bool {
    sessions.get(id).is_some_and(|s| s.deadline > now)
}

/// A grant in a session joins it.
pub(super) fn adopt(sessions: &mut HashMap<SessionId, Session>, grant: &Grant) {
    if let Some(s) = grant.session.as_ref().and_then(|id| sessions.get_mut(id)) {
        s.leases.push(grant.lease_id.clone());
    }
}

/// A lease of a session ended (released or expired): it leaves the session.
pub(super) fn forget_lease(sessions: &mut HashMap<SessionId, Session>, lease: &Lease) {
    if let Some(s) = lease.session.as_ref().and_then(|id| sessions.get_mut(id)) {
        s.leases.retain(|id| id != &lease.id);
    }
}

/// A waiter of a session left the line (granted, timed out or cancelled).
pub(super) fn forget_ticket(sessions: &mut HashMap<SessionId, Session>, waiter: &Waiter) {
    if let Some(s) = waiter.session.as_ref().and_then(|id| sessions.get_mut(id)) {
        s.tickets.retain(|t| *t != waiter.ticket);
    }
}
