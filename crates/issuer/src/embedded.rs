//! The embedded issuer: the in-memory lock table plus durability and waiting (one node).
//!
//! [`palisade_core::lock_table::LockTable`] decides; this module makes its decisions
//! durable and delivers them. The table sits behind a `std::sync::Mutex` that is never
//! held across an `.await`: each call locks, asks the table, takes the resulting events
//! and unlocks, and only then talks to storage.
//!
//! A grant is answered only once its epoch is covered by a durable reservation (see
//! `palisade_core::lock_table`): a grant the table marks as needing one waits for
//! [`IssuerLog::reserve`] (an fsync, shared with everything else in the writer's batch);
//! a grant inside an existing reservation (the usual case for a contended lock handed
//! from holder to holder) is answered at once and its lease record is written lazily.
//! If a reservation cannot be written, the grant is withdrawn from the table and the
//! caller gets `storage_failed`; the epoch it would have had is burnt, never reused.
//!
//! Waiters (`wait_ms > 0`) park on a oneshot channel keyed by their ticket. A background
//! task wakes at the table's next deadline to expire leases, time out waiters and hand
//! locks over. If a waiter went away (its HTTP request was dropped), its ticket is
//! cancelled, and a grant that finds nobody to deliver to is released at once.
//!
//! ## Recipes: what of them is durable, and when
//! - **Lock values** live in the lease record. A value given at acquisition is on disk
//!   exactly when the lease record is (with the reservation when the grant needed one,
//!   lazily otherwise); a [`Issuer::proclaim`] answers only once the record carrying the
//!   new value is on disk. After a restart a lease comes back with the last value that
//!   reached the disk with its record, or does not come back at all (its lock then waits
//!   out its reservation, as for any lease whose record was lost).
//! - **Per-lock lock-delay** is recorded in the lease record and, where it exceeds the
//!   server's default, in the reservation's TTL (see `palisade_core::lock_table`), so a
//!   restart never shortens it.
//! - **Sessions** are recorded as a session record (a lease record with no lock, see
//!   [`LeaseRecord`]) written before [`Issuer::create_session`] answers, and every lease
//!   granted in a session is on disk before its grant is answered (the fast path of a
//!   hand-off waits for the disk too when the new holder is in a session). So a restart
//!   brings a session back with all of its leases, each honoured for a full session TTL.
//!   Renewals are not written (as for leases). When a session ends, its record's removal
//!   is queued before its leases' removals: whatever part of that reaches the disk, a
//!   restart never finds the session with only some of its leases; leases without their
//!   session are honoured for one TTL and expire. [`Issuer::close_session`] answers once
//!   all of it is on disk.
//! - "On disk" for a record queued lazily means: a later request the writer answers has
//!   committed. The writer keeps the order of what it is given, so `Issuer::flush` (the
//!   removal of a lease id no lease can have) is a barrier for everything queued before it.
//!
//! Tokens are signed with an [`ActiveSigner`], which a key rotation replaces while the
//! issuer runs. A token signed ahead for a waiter remembers the key that signed it and is
//! used only if that key is still the one signing when the waiter is granted; otherwise
//! the token is signed again, so every token answered after a rotation completed carries
//! the new key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use palisade_core::lock_table::{
    AcquireOutcome, AcquireRequest, Event, Grant, LeaseExpired, LeaseView, LockTable, LockView,
    SessionView, TableConfig, Ticket,
};
use palisade_core::Millis;
use palisade_storage::{IssuerLog, LazyRecord, LeaseRecord, StorageError};
use palisade_token::{ActiveSigner, Epoch, KeyId};
use tokio::sync::{oneshot, Notify};

use crate::observe::{Census, LeaseChange, LeaseEvent, LeaseObserver};
use crate::{AcquireError, Granted, LeaseError, LockService, SessionError, SessionRequest};

/// Epochs covered by one durable reservation when the configuration does not say.
pub const DEFAULT_EPOCH_BLOCK: u64 = 1024;

/// The lease id [`Issuer::flush`] removes: no lease has it (lease ids are the server's
/// hex strings), so removing it changes nothing on disk.
const BARRIER_ID: &str = "\u{0}barrier";

type WaitReply = oneshot::Sender<Result<Grant, AcquireError>>;

struct Inner {
    table: LockTable,
    waiters: HashMap<Ticket, WaitReply>,
    /// Tokens signed ahead for the waiter at the head of a lock's line. Signing takes
    /// tens of microseconds; done while the current holder works, it is off the hand-off
    /// chain of a contended lock. Used only if the grant's epoch matches and its key is
    /// still the one signing.
    presigned: HashMap<Ticket, Presigned>,
    /// Set by `close`: nobody waits in line any more.
    closed: bool,
}

/// A token signed before its grant: for `epoch`, by key `key_id`.
struct Presigned {
    epoch: Epoch,
    key_id: KeyId,
    token: String,
}

/// What [`Issuer::start`] found in the records: what a restart honours.
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

/// The lock service. See the module docs.
pub struct Issuer {
    inner: Mutex<Inner>,
    backend: Arc<dyn IssuerLog>,
    signer: ActiveSigner,
    started: Instant,
    wake: Arc<Notify>,
    /// Told of every grant, release and expiry, under the table's lock (see
    /// [`crate::observe`]). Set once, by [`Issuer::observe`].
    observer: std::sync::OnceLock<Arc<dyn LeaseObserver>>,
    recovered: Recovered,
}

impl Issuer {
    /// Loads the issuer's records, honours recorded leases for a full TTL from now, and
    /// starts the deadline task.
    pub async fn start(
        backend: Arc<dyn IssuerLog>,
        signer: impl Into<ActiveSigner>,
        config: TableConfig,
    ) -> Result<Arc<Issuer>, StorageError> {
        let signer = signer.into();
        let state = backend.load_issuer().await?;
        let mut config = config;
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
            0,
            sessions
                .into_iter()
                .map(|r| (r.lease_id, r.holder, r.ttl_ms)),
        );
        table.restore(0, state.epochs, leases);
        table.restore_reservations(0, state.reservations);
        let issuer = Arc::new(Issuer {
            inner: Mutex::new(Inner {
                table,
                waiters: HashMap::new(),
                presigned: HashMap::new(),
                closed: false,
            }),
            backend,
            signer,
            started: Instant::now(),
            wake: Arc::new(Notify::new()),
            observer: std::sync::OnceLock::new(),
            recovered,
        });
        tokio::spawn(deadline_task(Arc::downgrade(&issuer)));
        Ok(issuer)
    }

    /// Tells `observer` of every grant, release and expiry from now on. A second call
    /// changes nothing: the first observer stays.
    pub fn observe(&self, observer: Arc<dyn LeaseObserver>) {
        let _ = self.observer.set(observer);
    }

    /// What the start found in the records.
    pub fn recovered(&self) -> Recovered {
        self.recovered
    }

    /// Live leases and waiting acquisitions.
    pub fn census(&self) -> Census {
        let inner = self.lock();
        Census {
            leases: inner.table.live_leases() as u64,
            waiters: inner.waiters.len() as u64,
        }
    }

    /// Tells the observer (called with the table's lock held, so in decision order).
    fn note(
        &self,
        change: LeaseChange,
        lock: &str,
        holder: &str,
        epoch: Epoch,
        lease_id: &str,
        ttl_ms: Millis,
    ) {
        if let Some(observer) = self.observer.get() {
            observer.lease_event(&LeaseEvent {
                change,
                lock,
                holder,
                epoch,
                lease_id,
                ttl_ms,
            });
        }
    }

    /// Tells the observer of a lease that ended by release.
    fn note_released(&self, view: &LeaseView) {
        self.note(
            LeaseChange::Released,
            &view.lock,
            &view.holder,
            view.epoch,
            &view.lease_id,
            view.ttl_ms,
        );
    }

    /// The signer whose key signs this issuer's tokens (replace its key to rotate).
    pub fn signer(&self) -> &ActiveSigner {
        &self.signer
    }

    /// Signs ahead of a grant, remembering the key.
    fn presign(&self, lock: &str, epoch: Epoch, holder: &str) -> Presigned {
        let signer = self.signer.current();
        Presigned {
            epoch,
            key_id: signer.key_id().to_owned(),
            token: signer.issue(lock, epoch, holder),
        }
    }

    fn now(&self) -> Millis {
        self.started.elapsed().as_millis() as Millis
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock would be a bug in the pure table; the state it
        // left is still the table's own, so carry on rather than poison every request.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Acquires a lock, waiting up to `req.wait_ms` in line.
    pub async fn acquire(self: &Arc<Self>, req: AcquireRequest) -> Result<Granted, AcquireError> {
        let now = self.now();
        let req_lock = req.lock.clone();
        let (outcome, events, parked) = {
            let mut inner = self.lock();
            let outcome = inner.table.acquire(now, req);
            if let AcquireOutcome::Granted(g) = &outcome {
                self.note(
                    LeaseChange::Granted,
                    &g.lock,
                    &g.holder,
                    g.epoch,
                    &g.lease_id,
                    g.ttl_ms,
                );
            }
            let parked = match &outcome {
                AcquireOutcome::Queued(ticket) if inner.closed => {
                    inner.table.cancel(*ticket);
                    return Err(AcquireError::Storage(StorageError::Closed));
                }
                AcquireOutcome::Queued(ticket) => {
                    let (tx, rx) = oneshot::channel();
                    inner.waiters.insert(*ticket, tx);
                    Some((*ticket, rx))
                }
                _ => None,
            };
            let events = self.take_events(&mut inner);
            (outcome, events, parked)
        };
        self.handle(events);
        let grant = match outcome {
            AcquireOutcome::Granted(grant) => {
                // The new lease's deadline may be earlier than the deadline task's sleep.
                self.wake.notify_one();
                self.persist(&grant).await?;
                if grant.session.is_some() {
                    // A session's leases are on disk before they are answered.
                    self.flush().await?;
                }
                grant
            }
            AcquireOutcome::NoSession => return Err(AcquireError::NoSession),
            AcquireOutcome::Held {
                holder,
                retry_after_ms,
            } => {
                return Err(AcquireError::Held {
                    holder,
                    retry_after_ms,
                })
            }
            AcquireOutcome::QuotaExceeded { resource, limit } => {
                return Err(AcquireError::QuotaExceeded { resource, limit })
            }
            AcquireOutcome::Queued(_) => {
                self.wake.notify_one();
                let Some((ticket, rx)) = parked else {
                    unreachable!("a queued outcome always parks")
                };
                let guard = CancelOnDrop {
                    issuer: self,
                    ticket,
                };
                // First in line: sign the token we will most likely get while we wait.
                let head = self.lock().table.head_waiter(&req_lock);
                if let Some((t, holder, epoch)) = head.filter(|(t, ..)| *t == ticket) {
                    let ahead = self.presign(&req_lock, epoch, &holder);
                    self.lock().presigned.insert(t, ahead);
                }
                let result = rx.await;
                std::mem::forget(guard);
                let ahead = self.lock().presigned.remove(&ticket);
                // The sender is only dropped with an answer, or at shutdown.
                let grant = result.map_err(|_| AcquireError::Storage(StorageError::Closed))??;
                let signing = self.signer.current();
                if let Some(ahead) =
                    ahead.filter(|a| a.epoch == grant.epoch && a.key_id == signing.key_id())
                {
                    // Same lock, holder (same ticket), epoch and key: the very token
                    // `issue` would make (signatures are deterministic).
                    return Ok(Granted {
                        grant,
                        token: ahead.token,
                    });
                }
                grant
            }
        };
        let token = self.signer.issue(&grant.lock, grant.epoch, &grant.holder);
        Ok(Granted { grant, token })
    }

    /// Answers every waiter with `Closed` and refuses new ones (the server is stopping).
    pub fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        // A dropped sender answers its waiter `Closed` (see `acquire`).
        inner.waiters.clear();
        inner.presigned.clear();
    }

    /// Renews a lease for a full TTL from now. Not written to disk: after a restart every
    /// recorded lease gets a full TTL anyway.
    pub fn keepalive(self: &Arc<Self>, lease_id: &str) -> Result<LeaseView, LeaseExpired> {
        let now = self.now();
        let (result, events) = {
            let mut inner = self.lock();
            let result = inner.table.keepalive(now, lease_id);
            (result, self.take_events(&mut inner))
        };
        self.handle(events);
        result
    }

    /// Releases a lease; the lock passes to the first waiter. Answers after the lease
    /// record is removed from disk.
    pub async fn release(self: &Arc<Self>, lease_id: &str) -> Result<LeaseView, LeaseError> {
        let now = self.now();
        let (result, events) = {
            let mut inner = self.lock();
            let result = inner.table.release(now, lease_id);
            if let Ok(view) = &result {
                self.note_released(view);
            }
            (result, self.take_events(&mut inner))
        };
        if result.is_ok() {
            // Queue the removal before anything the release set off (a hand-off's lease
            // record): the writer keeps order, so whatever of the hand-off reaches the
            // disk, this removal reached it first.
            self.backend
                .record_lazily(LazyRecord::RemoveLease(lease_id.to_owned()));
        }
        self.handle(events);
        let view = result.map_err(|LeaseExpired| LeaseError::Expired)?;
        // Answer only once the removal is durable (this second removal commits after the
        // first, so waiting for it waits for both).
        self.backend.remove_lease(lease_id).await?;
        Ok(view)
    }

    /// A lock's state.
    pub fn status(self: &Arc<Self>, lock: &str) -> LockView {
        let now = self.now();
        let (view, events) = {
            let mut inner = self.lock();
            let view = inner.table.status(now, lock);
            (view, self.take_events(&mut inner))
        };
        self.handle(events);
        view
    }

    /// The live lease with this id, if any.
    pub fn lease(self: &Arc<Self>, lease_id: &str) -> Option<LeaseView> {
        let now = self.now();
        let (view, events) = {
            let mut inner = self.lock();
            let view = inner.table.lease(now, lease_id);
            (view, self.take_events(&mut inner))
        };
        self.handle(events);
        view
    }

    /// One page of known locks by name: the names (and durable epochs) come from the
    /// store's ordered index, read without the table's lock; each lock's live state is then
    /// looked up in the table, a few at a time, so that renewals and acquisitions never
    /// wait behind a listing for long.
    pub async fn list(
        self: &Arc<Self>,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<LockView>, StorageError> {
        /// Locks looked up per hold of the table's lock.
        const CHUNK: usize = 128;
        let known = self.backend.list_locks(prefix, after, limit).await?;
        let mut views = Vec::with_capacity(known.len());
        for chunk in known.chunks(CHUNK) {
            let now = self.now();
            let events = {
                let mut inner = self.lock();
                for (name, durable_epoch) in chunk {
                    let mut view = inner.table.status(now, name);
                    // A lock the table forgot is known by its durable record only.
                    view.epoch = view.epoch.max(*durable_epoch);
                    views.push(view);
                }
                self.take_events(&mut inner)
            };
            self.handle(events);
            tokio::task::yield_now().await;
        }
        Ok(views)
    }

    /// Replaces a live lease's value; answers once the lease record carrying it is on
    /// disk.
    pub async fn proclaim(
        self: &Arc<Self>,
        lease_id: &str,
        value: Option<Vec<u8>>,
    ) -> Result<LeaseView, LeaseError> {
        let now = self.now();
        let (result, events) = {
            let mut inner = self.lock();
            let result = inner.table.proclaim(now, lease_id, value);
            if let Ok(view) = &result {
                // Queued while the table is locked: a release or expiry that follows
                // queues its removal after this record, never before it.
                self.backend
                    .record_lazily(LazyRecord::Lease(record_of_view(view)));
            }
            (result, self.take_events(&mut inner))
        };
        self.handle(events);
        let view = result.map_err(|LeaseExpired| LeaseError::Expired)?;
        self.flush().await?;
        Ok(view)
    }

    /// Creates a session; answers once its record is on disk.
    pub async fn create_session(
        self: &Arc<Self>,
        req: SessionRequest,
    ) -> Result<SessionView, SessionError> {
        let now = self.now();
        let session_id = req.session_id.clone();
        let (result, events) = {
            let mut inner = self.lock();
            let result = inner.table.create_session(now, req);
            if let Ok(view) = &result {
                self.backend.record_lazily(LazyRecord::Lease(LeaseRecord {
                    lease_id: view.session_id.clone(),
                    holder: view.holder.clone(),
                    ttl_ms: view.ttl_ms,
                    session: Some(view.session_id.clone()),
                    ..LeaseRecord::default()
                }));
            }
            (result, self.take_events(&mut inner))
        };
        self.handle(events);
        let view = result.map_err(session_error)?;
        // The session's deadline may be earlier than the deadline task's sleep.
        self.wake.notify_one();
        if let Err(e) = self.flush().await {
            // Unrecorded: nobody may use it (the store has failed anyway).
            let _ = self.close_session(&session_id).await;
            return Err(e.into());
        }
        Ok(view)
    }

    /// Renews a session and every lease in it. Not written to disk, like a keepalive.
    pub fn keepalive_session(
        self: &Arc<Self>,
        session_id: &str,
    ) -> Result<SessionView, SessionError> {
        let now = self.now();
        let (result, events) = {
            let mut inner = self.lock();
            let result = inner.table.keepalive_session(now, session_id);
            (result, self.take_events(&mut inner))
        };
        self.handle(events);
        result.map_err(session_error)
    }

    /// A live session with its leases.
    pub fn session(self: &Arc<Self>, session_id: &str) -> Option<SessionView> {
        let now = self.now();
        let (view, events) = {
            let mut inner = self.lock();
            let view = inner.table.session(now, session_id);
            (view, self.take_events(&mut inner))
        };
        self.handle(events);
        view
    }

    /// Ends a session, releasing its leases; answers once their removal is on disk.
    pub async fn close_session(
        self: &Arc<Self>,
        session_id: &str,
    ) -> Result<SessionView, SessionError> {
        let now = self.now();
        let (result, events) = {
            let mut inner = self.lock();
            let result = inner.table.close_session(now, session_id);
            if let Ok(view) = &result {
                // The session's record first, then its leases' (module docs); queued
                // before anything the releases set off (a hand-off's lease record).
                self.backend
                    .record_lazily(LazyRecord::RemoveLease(session_id.to_owned()));
                for lease in &view.leases {
                    self.backend
                        .record_lazily(LazyRecord::RemoveLease(lease.lease_id.clone()));
                    self.note_released(lease);
                }
            }
            (result, self.take_events(&mut inner))
        };
        self.handle(events);
        let view = result.map_err(session_error)?;
        self.flush().await?;
        Ok(view)
    }

    /// Waits until everything queued for the writer so far is on disk: the writer keeps
    /// order, so the answer to a removal queued now comes after all of it committed.
    async fn flush(&self) -> Result<(), StorageError> {
        self.backend.remove_lease(BARRIER_ID).await
    }

    /// Durably records a grant; withdraws it from the table if that fails.
    async fn persist(self: &Arc<Self>, grant: &Grant) -> Result<(), StorageError> {
        let record = record_of(grant);
        let Some(reservation) = grant.reserve else {
            // Covered by a durable reservation: the epoch cannot be reissued and the lock
            // waits out the reservation's TTL after a crash; the lease record only lets
            // the holder keep renewing across a restart, so it need not hold us up.
            self.backend.record_lazily(LazyRecord::Lease(record));
            return Ok(());
        };
        match self
            .backend
            .reserve(&grant.lock, reservation, Some(record))
            .await
        {
            Ok(()) => {
                let now = self.now();
                let events = {
                    let mut inner = self.lock();
                    inner
                        .table
                        .confirm(now, &grant.lock, reservation, grant.generation);
                    self.take_events(&mut inner)
                };
                self.handle(events);
                Ok(())
            }
            Err(e) => {
                tracing::error!(lock = %grant.lock, epoch = grant.epoch, error = %e, "cannot record grant");
                self.withdraw(&grant.lease_id);
                Err(e)
            }
        }
    }

    /// Releases a lease nobody will use (undeliverable or unrecorded grant).
    fn withdraw(self: &Arc<Self>, lease_id: &str) {
        let now = self.now();
        let events = {
            let mut inner = self.lock();
            if let Ok(view) = inner.table.release(now, lease_id) {
                self.note_released(&view);
            }
            self.take_events(&mut inner)
        };
        self.handle(events);
        self.backend
            .record_lazily(LazyRecord::RemoveLease(lease_id.to_owned()));
    }

    /// Signs, on another task, the token of the waiter now first in line for `lock`, so that
    /// its hand-off does not wait for the signature. Kept only while that waiter waits.
    fn sign_ahead(self: &Arc<Self>, lock: &str) {
        let Some((ticket, holder, epoch)) = self.lock().table.head_waiter(lock) else {
            return;
        };
        let this = self.clone();
        let lock = lock.to_owned();
        tokio::spawn(async move {
            let ahead = this.presign(&lock, epoch, &holder);
            let mut inner = this.lock();
            if inner.waiters.contains_key(&ticket) {
                inner.presigned.insert(ticket, ahead);
            }
        });
    }

    /// Takes the table's events, queueing the lazy records they call for while the table
    /// is still locked: the writer then receives them in the table's own order, so an
    /// idle marker can never reach the disk after the reservation of a grant that came
    /// after it. What is left needs [`Issuer::handle`].
    fn take_events(&self, inner: &mut Inner) -> Vec<Event> {
        let mut events = inner.table.drain_events();
        events.retain(|event| match event {
            Event::Expired {
                lease_id,
                lock,
                epoch,
                holder,
            } => {
                tracing::debug!(%lock, epoch, %holder, "lease expired");
                self.note(LeaseChange::Expired, lock, holder, *epoch, lease_id, 0);
                // A leftover record only makes the lock wait one TTL after a restart,
                // the safe direction: no need to wait for the disk.
                self.backend
                    .record_lazily(LazyRecord::RemoveLease(lease_id.clone()));
                false
            }
            Event::Idle { lock, reservation } => {
                self.backend.record_lazily(LazyRecord::Reservation {
                    lock: lock.clone(),
                    reservation: *reservation,
                });
                false
            }
            Event::SessionExpired { session_id, .. } => {
                tracing::info!(session = %session_id, "session expired");
                // Queued before its leases' removals (the table emits it first): see the
                // module docs.
                self.backend
                    .record_lazily(LazyRecord::RemoveLease(session_id.clone()));
                false
            }
            Event::Forgotten { locks, floor } => {
                // Their records stay on disk, so a restart still knows each one's epoch;
                // in memory, a lock met again starts above `floor`.
                tracing::debug!(count = locks.len(), floor, "idle locks left memory");
                false
            }
            Event::Granted { grant, .. } => {
                self.note(
                    LeaseChange::Granted,
                    &grant.lock,
                    &grant.holder,
                    grant.epoch,
                    &grant.lease_id,
                    grant.ttl_ms,
                );
                true
            }
            Event::TimedOut { .. } | Event::SessionGone { .. } => true,
        });
        events
    }

    /// Carries out what the table decided as a side effect of a call.
    fn handle(self: &Arc<Self>, events: Vec<Event>) {
        for event in events {
            match event {
                Event::Granted { ticket, grant } => {
                    self.wake.notify_one();
                    let reply = self.lock().waiters.remove(&ticket);
                    self.sign_ahead(&grant.lock);
                    // A session's lease waits for the disk (module docs), so it takes the
                    // slow path below even when its reservation covers it.
                    if grant.reserve.is_none() && grant.session.is_none() {
                        // The hand-off fast path: nothing to wait for.
                        let lease_id = grant.lease_id.clone();
                        self.backend
                            .record_lazily(LazyRecord::Lease(record_of(&grant)));
                        let delivered = reply.is_some_and(|r| r.send(Ok(grant)).is_ok());
                        if !delivered {
                            self.withdraw(&lease_id);
                        }
                        continue;
                    }
                    let this = self.clone();
                    tokio::spawn(async move {
                        let mut persisted = this.persist(&grant).await;
                        if persisted.is_ok() && grant.session.is_some() {
                            persisted = this.flush().await;
                        }
                        let delivered = match reply {
                            Some(reply) => match &persisted {
                                Ok(()) => reply.send(Ok(grant.clone())).is_ok(),
                                Err(e) => {
                                    let _ = reply.send(Err(e.clone().into()));
                                    true
                                }
                            },
                            None => false,
                        };
                        if persisted.is_ok() && !delivered {
                            this.withdraw(&grant.lease_id);
                        }
                    });
                }
                Event::TimedOut {
                    ticket,
                    holder,
                    retry_after_ms,
                } => {
                    let reply = {
                        let mut inner = self.lock();
                        inner.presigned.remove(&ticket);
                        inner.waiters.remove(&ticket)
                    };
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(AcquireError::Held {
                            holder,
                            retry_after_ms,
                        }));
                    }
                }
                Event::SessionGone { ticket } => {
                    let reply = {
                        let mut inner = self.lock();
                        inner.presigned.remove(&ticket);
                        inner.waiters.remove(&ticket)
                    };
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(AcquireError::NoSession));
                    }
                }
                // Recorded by `take_events`.
                Event::Expired { .. }
                | Event::Idle { .. }
                | Event::Forgotten { .. }
                | Event::SessionExpired { .. } => {}
            }
        }
    }
}

/// Withdraws a waiter whose request was dropped before it was answered.
struct CancelOnDrop<'a> {
    issuer: &'a Arc<Issuer>,
    ticket: Ticket,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let mut inner = self.issuer.lock();
        inner.table.cancel(self.ticket);
        inner.waiters.remove(&self.ticket);
        inner.presigned.remove(&self.ticket);
    }
}

/// Wakes at the table's next deadline (or when told something changed) and lets the
/// table expire leases, time out waiters and hand locks over.
async fn deadline_task(issuer: Weak<Issuer>) {
    loop {
        let Some(this) = issuer.upgrade() else { return };
        let now = this.now();
        let events = {
            let mut inner = this.lock();
            inner.table.poll(now);
            this.take_events(&mut inner)
        };
        this.handle(events);
        let next = this.lock().table.next_wakeup();
        // Sleep at most a second so the task notices when the issuer is gone.
        let sleep_ms = next.map_or(1000, |t| t.saturating_sub(now).clamp(1, 1000));
        let wake = this.wake.clone();
        drop(this);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(sleep_ms)) => {}
            _ = wake.notified() => {}
        }
    }
}

/// The embedded issuer behind the [`LockService`] trait.
#[async_trait]
impl LockService for Arc<Issuer> {
    async fn acquire(&self, req: AcquireRequest) -> Result<Granted, AcquireError> {
        Issuer::acquire(self, req).await
    }

    async fn keepalive(&self, lease_id: &str) -> Result<LeaseView, LeaseError> {
        Issuer::keepalive(self, lease_id).map_err(|LeaseExpired| LeaseError::Expired)
    }

    async fn release(&self, lease_id: &str) -> Result<LeaseView, LeaseError> {
        Issuer::release(self, lease_id).await
    }

    async fn lease(&self, lease_id: &str) -> Result<Option<LeaseView>, StorageError> {
        Ok(Issuer::lease(self, lease_id))
    }

    async fn status(&self, lock: &str) -> Result<LockView, StorageError> {
        Ok(Issuer::status(self, lock))
    }

    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<LockView>, StorageError> {
        Issuer::list(self, prefix, after, limit).await
    }

    async fn proclaim(
        &self,
        lease_id: &str,
        value: Option<Vec<u8>>,
    ) -> Result<LeaseView, LeaseError> {
        Issuer::proclaim(self, lease_id, value).await
    }

    async fn create_session(&self, req: SessionRequest) -> Result<SessionView, SessionError> {
        Issuer::create_session(self, req).await
    }

    async fn keepalive_session(&self, session_id: &str) -> Result<SessionView, SessionError> {
        Issuer::keepalive_session(self, session_id)
    }

    async fn session(&self, session_id: &str) -> Result<Option<SessionView>, StorageError> {
        Ok(Issuer::session(self, session_id))
    }

    async fn close_session(&self, session_id: &str) -> Result<SessionView, SessionError> {
        Issuer::close_session(self, session_id).await
    }

    async fn close(&self) {
        Issuer::close(self)
    }

    fn observe(&self, observer: Arc<dyn LeaseObserver>) {
        Issuer::observe(self, observer)
    }

    async fn census(&self) -> Option<Census> {
        Some(Issuer::census(self))
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
mod tests {
    use super::*;
    use palisade_storage::redb_backend::{RedbBackend, RedbOptions};
    use palisade_token::Signer;

    fn req(holder: &str, wait_ms: Millis) -> AcquireRequest {
        AcquireRequest {
            lock: "L".into(),
            holder: holder.into(),
            ttl_ms: 60_000,
            wait_ms,
            lease_id: format!("lease-{holder}"),
            ..Default::default()
        }
    }

    /// A contended lock's hand-offs: each waiter's token, signed ahead of its turn or
    /// not, is exactly the token for its own lock, epoch and holder.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tokens_signed_ahead_are_the_waiters_own() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            RedbBackend::open(&dir.path().join("db.redb"), RedbOptions::default()).expect("open");
        let signer = Signer::from_secret([7; 32]);
        let issuer = Issuer::start(Arc::new(store), signer.clone(), TableConfig::default())
            .await
            .unwrap();
        let first = issuer.acquire(req("h0", 0)).await.unwrap();
        let mut waiting = Vec::new();
        for i in 1..=5 {
            let queued = issuer.clone();
            waiting.push(tokio::spawn(async move {
                queued.acquire(req(&format!("h{i}"), 10_000)).await
            }));
            // In line one after another, so that each reaches the head in turn.
            while issuer.status("L").waiters < i {
                tokio::task::yield_now().await;
            }
        }
        let mut lease = first.grant.lease_id;
        let mut epochs = vec![first.grant.epoch];
        for handle in waiting {
            issuer.release(&lease).await.unwrap();
            let granted = handle.await.unwrap().unwrap();
            let g = &granted.grant;
            assert_eq!(granted.token, signer.issue(&g.lock, g.epoch, &g.holder));
            epochs.push(g.epoch);
            lease = g.lease_id.clone();
        }
        assert_eq!(epochs, (1..=6).collect::<Vec<_>>());
        assert!(issuer.lock().presigned.is_empty(), "nothing left behind");
    }

    /// A rotation while waiters hold tokens signed ahead with the old key: every grant
    /// answered after the rotation carries the new key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tokens_signed_ahead_follow_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            RedbBackend::open(&dir.path().join("db.redb"), RedbOptions::default()).expect("open");
        let old = Signer::from_secret([7; 32]);
        let new = Signer::from_secret([8; 32]);
        let issuer = Issuer::start(Arc::new(store), old.clone(), TableConfig::default())
            .await
            .unwrap();
        let first = issuer.acquire(req("h0", 0)).await.unwrap();
        assert_eq!(first.token, old.issue("L", 1, "h0"));
        let queued = issuer.clone();
        let waiter = tokio::spawn(async move { queued.acquire(req("h1", 10_000)).await });
        // The waiter is first in line and its token is signed ahead, with the old key.
        let signed_ahead = || {
            issuer
                .lock()
                .presigned
                .values()
                .any(|a| a.key_id == old.key_id())
        };
        while !signed_ahead() {
            tokio::task::yield_now().await;
        }
        issuer.signer().replace(new.clone());
        issuer.release(&first.grant.lease_id).await.unwrap();
        let granted = waiter.await.unwrap().unwrap();
        assert_eq!(granted.grant.epoch, 2);
        assert_eq!(granted.token, new.issue("L", 2, "h1"));
    }

    /// The observer hears each change once, in the order the table decided: a release
    /// before the grant it hands to the waiter, and an expiry with its holder.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_observer_hears_changes_in_decision_order() {
        #[derive(Default)]
        struct Heard(Mutex<Vec<(LeaseChange, String, Epoch)>>);
        impl LeaseObserver for Heard {
            fn lease_event(&self, e: &LeaseEvent<'_>) {
                let mut heard = self.0.lock().unwrap();
                heard.push((e.change, e.holder.to_owned(), e.epoch));
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let store =
            RedbBackend::open(&dir.path().join("db.redb"), RedbOptions::default()).expect("open");
        let issuer = Issuer::start(
            Arc::new(store),
            Signer::from_secret([7; 32]),
            TableConfig::default(),
        )
        .await
        .unwrap();
        let heard = Arc::new(Heard::default());
        issuer.observe(heard.clone());
        let first = issuer.acquire(req("h0", 0)).await.unwrap();
        let queued = issuer.clone();
        let waiter = tokio::spawn(async move { queued.acquire(req("h1", 10_000)).await });
        while Issuer::census(&issuer).waiters < 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            Issuer::census(&issuer),
            Census {
                leases: 1,
                waiters: 1
            }
        );
        issuer.release(&first.grant.lease_id).await.unwrap();
        waiter.await.unwrap().unwrap();
        let short = AcquireRequest {
            lock: "M".into(),
            ttl_ms: 50,
            ..req("h2", 0)
        };
        issuer.acquire(short).await.unwrap();
        let expired = (LeaseChange::Expired, "h2".to_owned(), 1);
        while !heard.0.lock().unwrap().contains(&expired) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let heard = heard.0.lock().unwrap().clone();
        assert_eq!(
            heard,
            vec![
                (LeaseChange::Granted, "h0".to_owned(), 1),
                (LeaseChange::Released, "h0".to_owned(), 1),
                (LeaseChange::Granted, "h1".to_owned(), 2),
                (LeaseChange::Granted, "h2".to_owned(), 1),
                expired,
            ]
        );
    }
}
