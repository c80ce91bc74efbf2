//! The embedded issuer: the in-memory lock table plus durability and waiting (one node).
//!
//! [`palisade_core::lock_table::LockTable`] decides what happens to locks, and
//! [`crate::core::IssuerCore`] (a pure state machine around it: no clock, no I/O) decides
//! what must be durable before whom is answered. This module is the thin async shell
//! around that core: it reads the clock, feeds the core each request, each completed
//! durable write and each timer, and carries out the actions it returns (queueing lazy
//! records and durable writes with the writer, in decision order; answering requests over
//! oneshot channels; telling the observer; arming the deadline task). A durable write is
//! awaited by the request whose call decided it, in that request's own future, and its
//! outcome fed back to the core from there: the commit wakes the request's task and
//! nothing in between. Writes nobody awaits that way (decided by the deadline task, by a
//! withdrawn request, or left when a request got its answer) go to a task of their own. The core sits
//! behind a `std::sync::Mutex` that is never held across an `.await`; its actions are
//! carried out in order with the lock held, so records reach the writer and notes reach
//! the observer in decision order. A panic with the lock held stops the issuer
//! (fail-stop, see `Issuer::lock`) rather than carrying on with state in doubt.
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
//!   [`palisade_storage::LeaseRecord`]) written before [`Issuer::create_session`] answers, and every lease
//!   granted in a session is on disk before its grant is answered (the fast path of a
//!   hand-off waits for the disk too when the new holder is in a session). So a restart
//!   brings a session back with all of its leases, each honoured for a full session TTL.
//!   Renewals are not written (as for leases). When a session ends, its record's removal
//!   is queued before its leases' removals: whatever part of that reaches the disk, a
//!   restart never finds the session with only some of its leases; leases without their
//!   session are honoured for one TTL and expire. [`Issuer::close_session`] answers once
//!   all of it is on disk.
//! - "On disk" for a record queued lazily means: a later request the writer answers has
//!   committed. The writer keeps the order of what it is given, so a barrier (the
//!   removal of [`crate::core::BARRIER_ID`], a lease id no lease can have) is a barrier for everything queued before it.
//!
//! Tokens are signed with an [`ActiveSigner`], which a key rotation replaces while the
//! issuer runs. A token signed ahead for a waiter remembers the key that signed it and is
//! used only if that key is still the one signing when the waiter is granted; otherwise
//! the token is signed again, so every token answered after a rotation completed carries
//! the new key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use palisade_core::lock_table::{Grant, LeaseView, LockView, SessionView, TableConfig};
use palisade_core::Millis;
use palisade_storage::{IssuerLog, Page, Queued, StorageError};
use palisade_token::{ActiveSigner, Epoch, KeyId};
use tokio::sync::{oneshot, Notify};

use crate::core::{Action, IssuerCore, Reply, ReqId, Write, WriteId};
use crate::observe::{Census, LeaseObserver};
use crate::{
    Acquire, AcquireError, Granted, Lease, LeaseError, LockService, MayAct, SessionError,
    SessionRequest,
};

pub use crate::core::{Recovered, DEFAULT_EPOCH_BLOCK};

struct Inner {
    core: IssuerCore,
    /// Where each request still waiting for its answer gets it.
    replies: HashMap<ReqId, oneshot::Sender<Answered>>,
    next_req: ReqId,
    /// Tokens signed ahead for the waiter at the head of a lock's line. Signing takes
    /// tens of microseconds; done while the current holder works, it is off the hand-off
    /// chain of a contended lock. Used only if the grant's epoch matches and its key is
    /// still the one signing.
    presigned: HashMap<ReqId, Presigned>,
    /// Durable writes the last [`Issuer::perform`] handed to the log, in decision order,
    /// for its caller to await (see [`Issuer::answer`]) or hand to a task.
    handed: Vec<(WriteId, Queued)>,
}

/// An answer, with the token signed ahead for its request if there is one (taken in the
/// same hold of the lock as the answer, so the request needs no second one).
struct Answered {
    reply: Reply,
    ahead: Option<Presigned>,
}

/// An answer kept for the request that decided it, with the sender it would have gone
/// through (see [`Issuer::perform`]).
type Kept = (Answered, Option<oneshot::Sender<Answered>>);

/// A request fed to the core: its id, where its answer comes, and the durable writes that
/// feeding it handed to the log (see [`Issuer::answer`]).
struct Asked {
    id: ReqId,
    rx: oneshot::Receiver<Answered>,
    /// The answer, when feeding the request already decided it.
    answered: Option<Answered>,
    handed: Vec<(WriteId, Queued)>,
}

/// A token signed before its grant: for `epoch`, by key `key_id`.
struct Presigned {
    epoch: Epoch,
    key_id: KeyId,
    token: String,
}

/// The lock service. See the module docs.
pub struct Issuer {
    inner: Mutex<Inner>,
    /// Set when a panic poisoned `inner`: the issuer has stopped (fail-stop).
    stopped: AtomicBool,
    backend: Arc<dyn IssuerLog>,
    signer: ActiveSigner,
    started: Instant,
    wake: Arc<Notify>,
    /// Told of every grant, release and expiry, under the table's lock (see
    /// [`crate::observe`]). Set once, by [`Issuer::observe`].
    observer: std::sync::OnceLock<Arc<dyn LeaseObserver>>,
    recovered: Recovered,
}

/// The error of every call once the issuer has stopped.
fn stopped_error() -> StorageError {
    StorageError::Failed("the issuer stopped after an internal error; restart the server".into())
}

impl Issuer {
    /// Loads the issuer's records, honours recorded leases for a full TTL from now, and
    /// starts the deadline task.
    pub async fn start(
        backend: Arc<dyn IssuerLog>,
        signer: impl Into<ActiveSigner>,
        config: TableConfig,
    ) -> Result<Arc<Issuer>, StorageError> {
        let state = backend.load_issuer().await?;
        let (core, recovered) = IssuerCore::recover(config, 0, state);
        let issuer = Arc::new(Issuer {
            inner: Mutex::new(Inner {
                core,
                replies: HashMap::new(),
                next_req: 0,
                presigned: HashMap::new(),
                handed: Vec::new(),
            }),
            stopped: AtomicBool::new(false),
            backend,
            signer: signer.into(),
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
        if let Ok(mut inner) = self.lock() {
            if self.observer.set(observer).is_ok() {
                inner.core.observe();
            }
        }
    }

    /// Whether the issuer stopped after an internal error (see [`Issuer::lock`]): from
    /// the moment the panic poisoned its state, whether or not a call has met it since.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst) || self.inner.is_poisoned()
    }

    /// What the start found in the records.
    pub fn recovered(&self) -> Recovered {
        self.recovered
    }

    /// Live leases and waiting acquisitions.
    pub fn census(&self) -> Result<Census, StorageError> {
        let (leases, waiters) = self.lock()?.core.census();
        Ok(Census {
            leases: leases as u64,
            waiters: waiters as u64,
        })
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
            token: signer.issue_with(self.signer.nonce(), lock, epoch, holder),
        }
    }

    /// The shell's clock: milliseconds since the start. The core never reads a clock.
    fn now(&self) -> Millis {
        self.started.elapsed().as_millis() as Millis
    }

    /// The state, unless a panic poisoned it. A panic while holding this lock is a bug in
    /// the core; the state it left is in doubt, so the issuer stops (fail-stop): it says
    /// so once, answers every request still waiting with `unavailable`, and every later
    /// call fails with `storage_failed` until a restart rebuilds it from its records.
    fn lock(&self) -> Result<MutexGuard<'_, Inner>, StorageError> {
        match self.inner.lock() {
            Ok(inner) => Ok(inner),
            Err(poisoned) => {
                if !self.stopped.swap(true, Ordering::SeqCst) {
                    tracing::error!(
                        "the issuer stopped: a panic left its state in doubt; every call fails until the server restarts"
                    );
                    // Only to hang up on the waiting requests (a dropped sender answers
                    // `Closed`); nothing else of the state is used again.
                    let mut inner = poisoned.into_inner();
                    inner.replies.clear();
                    inner.presigned.clear();
                }
                Err(stopped_error())
            }
        }
    }

    /// Feeds one input to the core and carries out what it decided.
    fn call<R>(
        self: &Arc<Self>,
        input: impl FnOnce(&mut IssuerCore, Millis) -> R,
    ) -> Result<R, StorageError> {
        let now = self.now();
        let mut inner = self.lock()?;
        let result = input(&mut inner.core, now);
        self.perform(&mut inner, now, false, None);
        self.unlock(inner);
        Ok(result)
    }

    /// Feeds a request that is answered with a [`Reply`] to the core.
    fn request(
        self: &Arc<Self>,
        input: impl FnOnce(&mut IssuerCore, Millis, ReqId),
    ) -> Result<Asked, StorageError> {
        let now = self.now();
        let mut inner = self.lock()?;
        let id = inner.next_req;
        inner.next_req += 1;
        let (tx, rx) = oneshot::channel();
        inner.replies.insert(id, tx);
        input(&mut inner.core, now, id);
        // The receiver was never polled: dropping its sender wakes nobody.
        let answered = self
            .perform(&mut inner, now, false, Some(id))
            .map(|(answered, _)| answered);
        let handed = std::mem::take(&mut inner.handed);
        Ok(Asked {
            id,
            rx,
            answered,
            handed,
        })
    }

    /// Tells the core how durable write `write` went, on behalf of request `mine`: its
    /// answer, if that decided it, comes back here.
    fn written(
        self: &Arc<Self>,
        mine: ReqId,
        write: WriteId,
        result: Result<(), StorageError>,
    ) -> Option<Kept> {
        let now = self.now();
        let mut inner = self.lock().ok()?;
        inner.core.written(now, write, result);
        let answered = self.perform(&mut inner, now, false, Some(mine));
        self.unlock(inner);
        answered
    }

    /// Carries out the core's actions, in order, with its lock held: lazy records reach
    /// the writer and notes the observer in decision order.
    /// The answer to request `mine` (the caller's own), if one is decided, is given back
    /// instead of sent, with the sender it would have gone through: the caller has it at
    /// once, and drops that sender only after its receiver, so that no wake-up of its own
    /// task is scheduled while it runs.
    fn perform(
        self: &Arc<Self>,
        inner: &mut Inner,
        now: Millis,
        from_timer: bool,
        mine: Option<ReqId>,
    ) -> Option<Kept> {
        let mut kept = None;
        loop {
            let actions = inner.core.take_actions();
            if actions.is_empty() {
                return kept;
            }
            for action in actions {
                match action {
                    Action::Lazy(record) => self.backend.record_lazily(record),
                    Action::Write { id, write } => {
                        let queued = self.queue_write(write);
                        inner.handed.push((id, queued));
                    }
                    Action::Reply { to, reply } if Some(to) == mine => {
                        let ahead = inner.presigned.remove(&to);
                        let sender = inner.replies.remove(&to);
                        kept = Some((Answered { reply, ahead }, sender));
                    }
                    Action::Reply { to, reply } => {
                        let ahead = inner.presigned.remove(&to);
                        let undelivered = match inner.replies.remove(&to) {
                            Some(tx) => tx.send(Answered { reply, ahead }).err().map(|a| a.reply),
                            None => Some(reply),
                        };
                        if let Some(Reply::Acquire(Ok(grant))) = undelivered {
                            // Its request went away: nobody will use the lease.
                            inner.core.undelivered(now, &grant.lease_id);
                        }
                    }
                    Action::Note(note) => {
                        if let Some(observer) = self.observer.get() {
                            observer.lease_event(&note.event());
                        }
                    }
                    Action::SignAhead {
                        to,
                        lock,
                        epoch,
                        holder,
                    } => self.sign_ahead(to, lock, epoch, holder),
                    // The deadline task reads the core's timer after each tick itself.
                    Action::Timer { .. } if from_timer => {}
                    Action::Timer { .. } => self.wake.notify_one(),
                }
            }
        }
    }

    /// Hands a durable write to the log (in decision order: called under the lock).
    fn queue_write(&self, write: Write) -> Queued {
        match write {
            Write::Reserve {
                lock,
                reservation,
                lease,
            } => self.backend.reserve(&lock, reservation, Some(lease)),
            Write::RemoveLease(lease_id) => self.backend.remove_lease(&lease_id),
        }
    }

    /// Lets go of the lock; the durable writes the last [`Issuer::perform`] handed to the
    /// log, which nobody here awaits, go to a task of their own.
    fn unlock(self: &Arc<Self>, mut inner: MutexGuard<'_, Inner>) {
        let handed = std::mem::take(&mut inner.handed);
        drop(inner);
        self.await_elsewhere(handed);
    }

    /// Awaits durable writes nobody else awaits, on a task of their own, and tells the core
    /// how each went. Without a runtime (it is shutting down) nobody is left to tell.
    fn await_elsewhere(self: &Arc<Self>, handed: Vec<(WriteId, Queued)>) {
        if handed.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.clone();
        runtime.spawn(async move {
            for (id, queued) in handed {
                let result = queued.await;
                // A stopped issuer has nobody to tell.
                let _ = this.call(|core, now| core.written(now, id, result));
            }
        });
    }

    /// Signs, on another task, the token the waiter first in line will most likely get,
    /// so that its hand-off does not wait for the signature. Kept only while it waits.
    fn sign_ahead(self: &Arc<Self>, to: ReqId, lock: String, epoch: Epoch, holder: String) {
        let this = self.clone();
        tokio::spawn(async move {
            let ahead = this.presign(&lock, epoch, &holder);
            if let Ok(mut inner) = this.lock() {
                if inner.replies.contains_key(&to) {
                    inner.presigned.insert(to, ahead);
                }
            }
        });
    }

    /// Waits for the answer to a request; withdraws the request if the caller goes away
    /// first. Meanwhile it awaits the durable writes that feeding the request handed to the
    /// log and tells the core how each went, so that the write a request waits for (a
    /// release's removal, a grant's reservation) wakes the request's own task, not a task
    /// in between. Writes still pending when the answer comes (another request's, such as
    /// a hand-off's reservation) or when the caller goes away go to a task of their own.
    async fn answer(self: &Arc<Self>, asked: Asked) -> Option<Answered> {
        let Asked {
            id,
            mut rx,
            answered,
            handed,
        } = asked;
        let mut writes = Awaiting {
            issuer: self,
            handed,
        };
        if answered.is_some() {
            return answered;
        }
        let guard = CancelOnDrop { issuer: self, id };
        let answered = loop {
            tokio::select! {
                biased;
                answered = &mut rx => break answered.ok(),
                (write, result) = first_done(&mut writes.handed), if !writes.handed.is_empty() => {
                    if let Some((answered, sender)) = self.written(id, write, result) {
                        // Receiver first: the sender's drop then wakes nobody.
                        drop(rx);
                        drop(sender);
                        break Some(answered);
                    }
                }
            }
        };
        std::mem::forget(guard);
        // The sender is only dropped unanswered at shutdown or when the issuer stopped.
        answered
    }

    /// Acquires a lock, waiting up to `req.wait_ms` in line.
    pub async fn acquire(self: &Arc<Self>, req: Acquire) -> Result<Granted, AcquireError> {
        let asked = self.request(|core, now, id| core.acquire(now, id, req))?;
        let (grant, ahead) = match self.answer(asked).await {
            Some(Answered {
                reply: Reply::Acquire(result),
                ahead,
            }) => (result?, ahead),
            _ => return Err(AcquireError::Storage(StorageError::Closed)),
        };
        let signing = self.signer.current();
        if let Some(ahead) =
            ahead.filter(|a| a.epoch == grant.epoch && a.key_id == signing.key_id())
        {
            // Same lock, holder (same request), epoch and key: a token with the very
            // claims signing now would give.
            return Ok(Granted {
                lease: lease_of(grant),
                token: ahead.token,
            });
        }
        let token =
            signing.issue_with(self.signer.nonce(), &grant.lock, grant.epoch, &grant.holder);
        Ok(Granted {
            lease: lease_of(grant),
            token,
        })
    }

    /// Answers every waiter with `Closed` and refuses new ones (the server is stopping).
    pub fn close(self: &Arc<Self>) {
        let _ = self.call(|core, now| core.close(now));
    }

    /// Renews a lease for a full TTL from now. Not written to disk: after a restart every
    /// recorded lease gets a full TTL anyway.
    /// `may` is asked about the lease under the table's lock, in the same step.
    pub fn keepalive(
        self: &Arc<Self>,
        lease_id: &str,
        may: MayAct<'_>,
    ) -> Result<LeaseView, LeaseError> {
        self.call(|core, now| core.keepalive(now, lease_id, may))?
    }

    /// Releases a lease, if `may` lets the caller (asked in the same step); the lock
    /// passes to the first waiter. Answers after the lease record is removed from disk.
    pub async fn release(
        self: &Arc<Self>,
        lease_id: &str,
        may: MayAct<'_>,
    ) -> Result<LeaseView, LeaseError> {
        let asked = self.request(|core, now, id| core.release(now, id, lease_id, may))?;
        match self.answer(asked).await.map(|a| a.reply) {
            Some(Reply::Lease(result)) => result,
            _ => Err(StorageError::Closed.into()),
        }
    }

    /// A lock's state. A lock the table does not hold (forgotten to make room, see
    /// `--max-locks`) is read back from disk: its epoch is then the last one granted (its
    /// records were on disk before it was forgotten), never a reservation's ceiling.
    pub async fn status(self: &Arc<Self>, lock: &str) -> Result<LockView, StorageError> {
        let (mut view, known) =
            self.call(|core, now| (core.status(now, lock), core.knows(lock)))?;
        if !known {
            if let Some((epoch, reservation)) = self.backend.lock_record(lock).await? {
                view.epoch = view.epoch.max(epoch);
                view.granted_up_to = view.granted_up_to.max(epoch).max(reservation.ceiling);
            }
        }
        Ok(view)
    }

    /// One page of known locks by name: the names (and last granted epochs) come from the
    /// store's ordered index, read without the table's lock; each lock's live state is then
    /// looked up in the table, a few at a time, so that renewals and acquisitions never
    /// wait behind a listing for long.
    pub async fn list(self: &Arc<Self>, page: Page) -> Result<Vec<LockView>, StorageError> {
        /// Locks looked up per hold of the table's lock.
        const CHUNK: usize = 128;
        let known = self.backend.list_locks(page).await?;
        let mut views = Vec::with_capacity(known.len());
        for chunk in known.chunks(CHUNK) {
            self.call(|core, now| {
                for (name, durable_epoch) in chunk {
                    let mut view = core.status(now, name);
                    // A lock the table forgot is known by its durable record only.
                    view.epoch = view.epoch.max(*durable_epoch);
                    view.granted_up_to = view.granted_up_to.max(view.epoch);
                    views.push(view);
                }
            })?;
            tokio::task::yield_now().await;
        }
        Ok(views)
    }

    /// Replaces a live lease's value, if `may` lets the caller (asked in the same step);
    /// answers once the lease record carrying it is on disk.
    pub async fn proclaim(
        self: &Arc<Self>,
        lease_id: &str,
        value: Option<Vec<u8>>,
        may: MayAct<'_>,
    ) -> Result<LeaseView, LeaseError> {
        let asked = self.request(|core, now, id| core.proclaim(now, id, lease_id, value, may))?;
        match self.answer(asked).await.map(|a| a.reply) {
            Some(Reply::Lease(result)) => result,
            _ => Err(StorageError::Closed.into()),
        }
    }

    /// Creates a session; answers once its record is on disk.
    pub async fn create_session(
        self: &Arc<Self>,
        req: SessionRequest,
    ) -> Result<SessionView, SessionError> {
        let asked = self.request(|core, now, id| core.create_session(now, id, req))?;
        self.session_answer(asked).await
    }

    /// Renews a session and every lease in it. Not written to disk, like a keepalive.
    pub fn keepalive_session(
        self: &Arc<Self>,
        session_id: &str,
    ) -> Result<SessionView, SessionError> {
        self.call(|core, now| core.keepalive_session(now, session_id))?
    }

    /// A live session with its leases.
    pub fn session(
        self: &Arc<Self>,
        session_id: &str,
    ) -> Result<Option<SessionView>, StorageError> {
        self.call(|core, now| core.session(now, session_id))
    }

    /// Ends a session, releasing its leases; answers once their removal is on disk.
    pub async fn close_session(
        self: &Arc<Self>,
        session_id: &str,
    ) -> Result<SessionView, SessionError> {
        let asked = self.request(|core, now, id| core.close_session(now, id, session_id))?;
        self.session_answer(asked).await
    }

    async fn session_answer(self: &Arc<Self>, asked: Asked) -> Result<SessionView, SessionError> {
        match self.answer(asked).await.map(|a| a.reply) {
            Some(Reply::Session(result)) => result,
            _ => Err(StorageError::Closed.into()),
        }
    }
}

/// Withdraws a request whose caller went away before it was answered (its HTTP request
/// was dropped): it leaves the line, and a grant on its way to it is released.
struct CancelOnDrop<'a> {
    issuer: &'a Arc<Issuer>,
    id: ReqId,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let now = self.issuer.now();
        let Ok(mut inner) = self.issuer.lock() else {
            return;
        };
        inner.replies.remove(&self.id);
        inner.presigned.remove(&self.id);
        inner.core.cancel(now, self.id);
        self.issuer.perform(&mut inner, now, false, None);
        self.issuer.unlock(inner);
    }
}

/// The durable writes a request awaits (see [`Issuer::answer`]); those left when it stops
/// awaiting, answered or dropped, go to a task of their own.
struct Awaiting<'a> {
    issuer: &'a Arc<Issuer>,
    handed: Vec<(WriteId, Queued)>,
}

/// The first of `handed` to complete, taken out of the list.
fn first_done(
    handed: &mut Vec<(WriteId, Queued)>,
) -> impl std::future::Future<Output = (WriteId, Result<(), StorageError>)> + '_ {
    std::future::poll_fn(move |cx| {
        for i in 0..handed.len() {
            if let std::task::Poll::Ready(result) = handed[i].1.as_mut().poll(cx) {
                let (id, _) = handed.remove(i);
                return std::task::Poll::Ready((id, result));
            }
        }
        std::task::Poll::Pending
    })
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        self.issuer
            .await_elsewhere(std::mem::take(&mut self.handed));
    }
}

/// Wakes at the core's timer (or when told it moved earlier) and ticks the core: leases
/// expire, waiters time out, locks are handed over. Stops with the issuer.
async fn deadline_task(issuer: Weak<Issuer>) {
    loop {
        let Some(this) = issuer.upgrade() else { return };
        let now = this.now();
        let next = {
            let Ok(mut inner) = this.lock() else { return };
            inner.core.tick(now);
            this.perform(&mut inner, now, true, None);
            let armed = inner.core.armed();
            this.unlock(inner);
            armed
        };
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

/// The lease a grant of the table answers; its reservation stayed with the issuer.
fn lease_of(grant: Grant) -> Lease {
    Lease {
        lock: grant.lock,
        holder: grant.holder,
        epoch: grant.epoch,
        lease_id: grant.lease_id,
        ttl_ms: grant.ttl_ms,
        value: grant.value,
        lock_delay_ms: grant.lock_delay_ms,
        session: grant.session,
    }
}

/// The embedded issuer behind the [`LockService`] trait.
#[async_trait]
impl LockService for Arc<Issuer> {
    async fn acquire(&self, req: Acquire) -> Result<Granted, AcquireError> {
        Issuer::acquire(self, req).await
    }

    /// The lock table counts every lease and wait against its owner's quotas.
    fn counts_owners(&self) -> bool {
        true
    }

    async fn keepalive(&self, lease_id: &str, may: MayAct<'_>) -> Result<LeaseView, LeaseError> {
        Issuer::keepalive(self, lease_id, may)
    }

    async fn release(&self, lease_id: &str, may: MayAct<'_>) -> Result<LeaseView, LeaseError> {
        Issuer::release(self, lease_id, may).await
    }

    async fn status(&self, lock: &str) -> Result<LockView, StorageError> {
        Issuer::status(self, lock).await
    }

    async fn list(&self, page: Page) -> Result<Vec<LockView>, StorageError> {
        Issuer::list(self, page).await
    }

    async fn proclaim(
        &self,
        lease_id: &str,
        value: Option<Vec<u8>>,
        may: MayAct<'_>,
    ) -> Result<LeaseView, LeaseError> {
        Issuer::proclaim(self, lease_id, value, may).await
    }

    async fn create_session(&self, req: SessionRequest) -> Result<SessionView, SessionError> {
        Issuer::create_session(self, req).await
    }

    async fn keepalive_session(&self, session_id: &str) -> Result<SessionView, SessionError> {
        Issuer::keepalive_session(self, session_id)
    }

    async fn session(&self, session_id: &str) -> Result<Option<SessionView>, StorageError> {
        Issuer::session(self, session_id)
    }

    async fn close_session(&self, session_id: &str) -> Result<SessionView, SessionError> {
        Issuer::close_session(self, session_id).await
    }

    fn is_stopped(&self) -> bool {
        Issuer::is_stopped(self)
    }

    async fn close(&self) {
        Issuer::close(self)
    }

    fn observe(&self, observer: Arc<dyn LeaseObserver>) {
        Issuer::observe(self, observer)
    }

    async fn census(&self) -> Option<Census> {
        Issuer::census(self).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::{LeaseChange, LeaseEvent};
    use palisade_storage::redb_backend::{RedbBackend, RedbOptions};
    use palisade_token::Signer;

    /// `token` is signed by `signer`'s key and says `(lock, epoch, holder)`.
    fn assert_signed(token: &str, signer: &Signer, (lock, epoch, holder): (&str, u64, &str)) {
        let mut ring = palisade_token::KeyRing::new();
        ring.insert(signer.public_key());
        let claims = palisade_token::Verifier::new(ring, 1)
            .verify(token)
            .unwrap();
        assert_eq!(
            (claims.lock.as_str(), claims.epoch, claims.holder.as_str()),
            (lock, epoch, holder)
        );
    }

    fn req(holder: &str, wait_ms: Millis) -> Acquire {
        Acquire {
            lock: "L".into(),
            holder: holder.into(),
            ttl_ms: 60_000,
            wait_ms,
            lease_id: format!("lease-{holder}"),
            ..Default::default()
        }
    }

    /// An issuer with default settings over a fresh database in `dir`.
    async fn started(dir: &std::path::Path, signer: Signer) -> Arc<Issuer> {
        let store = RedbBackend::open(&dir.join("db.redb"), RedbOptions::default()).expect("open");
        Issuer::start(Arc::new(store), signer, TableConfig::default())
            .await
            .unwrap()
    }

    /// A contended lock's hand-offs: each waiter's token, signed ahead of its turn or
    /// not, is exactly the token for its own lock, epoch and holder.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tokens_signed_ahead_are_the_waiters_own() {
        let dir = tempfile::tempdir().unwrap();
        let signer = Signer::from_secret([7; 32]);
        let issuer = started(dir.path(), signer.clone()).await;
        let first = issuer.acquire(req("h0", 0)).await.unwrap();
        let mut waiting = Vec::new();
        for i in 1..=5 {
            let queued = issuer.clone();
            waiting.push(tokio::spawn(async move {
                queued.acquire(req(&format!("h{i}"), 10_000)).await
            }));
            // In line one after another, so that each reaches the head in turn.
            while issuer.status("L").await.unwrap().waiters < i {
                tokio::task::yield_now().await;
            }
        }
        let mut lease = first.lease.lease_id;
        let mut epochs = vec![first.lease.epoch];
        for handle in waiting {
            issuer.release(&lease, None).await.unwrap();
            let granted = handle.await.unwrap().unwrap();
            let g = &granted.lease;
            assert_signed(&granted.token, &signer, (&g.lock, g.epoch, &g.holder));
            epochs.push(g.epoch);
            lease = g.lease_id.clone();
        }
        assert_eq!(epochs, (1..=6).collect::<Vec<_>>());
        assert!(
            issuer.lock().unwrap().presigned.is_empty(),
            "nothing left behind"
        );
        assert!(
            issuer.lock().unwrap().replies.is_empty(),
            "every request answered"
        );
    }

    /// A release is answered by its own removal's commit, awaited in the release's own
    /// future; an acquisition whose caller goes away while its reservation is being
    /// written hands that write to a task, which withdraws the grant once it is durable.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_are_awaited_by_their_request_or_by_a_task_when_it_goes_away() {
        let dir = tempfile::tempdir().unwrap();
        let issuer = started(dir.path(), Signer::from_secret([7; 32])).await;
        let first = issuer.acquire(req("h0", 0)).await.unwrap();
        issuer.release(&first.lease.lease_id, None).await.unwrap();
        assert!(issuer.status("L").await.unwrap().lease.is_none());

        // A new lock needs a reservation: polled once (the write is handed to the log),
        // then dropped.
        let mut fresh = req("h1", 0);
        fresh.lock = "M".into();
        fresh.lease_id = "lease-h1-m".into();
        let acquire = issuer.acquire(fresh);
        tokio::select! {
            biased;
            _ = acquire => panic!("granted before its reservation could be durable"),
            () = std::future::ready(()) => {}
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = issuer.status("M").await.unwrap();
            if status.epoch >= 1
                && status.lease.is_none()
                && issuer.lock().unwrap().core.census().0 == 0
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the dropped grant was never withdrawn: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let again = issuer.acquire(req("h2", 0)).await.unwrap();
        assert_eq!(again.lease.epoch, 2, "the epoch after the released one");
        assert!(
            issuer.lock().unwrap().replies.is_empty(),
            "every request answered"
        );
    }

    /// A lock the table forgot to make room for another still reports the epoch it
    /// reached: the status reads it back from disk.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_forgotten_lock_reports_the_epoch_it_reached() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            RedbBackend::open(&dir.path().join("db.redb"), RedbOptions::default()).expect("open");
        let config = TableConfig {
            max_locks: 1,
            idle_grace_ms: 0,
            epoch_block: 4,
            ..TableConfig::default()
        };
        let issuer = Issuer::start(Arc::new(store), Signer::from_secret([7; 32]), config)
            .await
            .unwrap();
        for _ in 0..3 {
            let g = issuer.acquire(req("h0", 0)).await.unwrap();
            issuer.release(&g.lease.lease_id, None).await.unwrap();
        }
        assert_eq!(issuer.status("L").await.unwrap().epoch, 3);
        // "M" needs L's room: once L's idle mark is on disk, L is forgotten.
        let other = Acquire {
            lock: "M".into(),
            ..req("h1", 0)
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match issuer.acquire(other.clone()).await {
                Ok(_) => break,
                Err(AcquireError::QuotaExceeded { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("M never found room: {e:?}"),
            }
        }
        assert!(!issuer.lock().unwrap().core.knows("L"));
        let status = issuer.status("L").await.unwrap();
        // The last epoch granted (3; its reservation reaches 4), and the same epoch the
        // listing reads from disk.
        let listed = issuer.list(Page::first("L", 1)).await.unwrap();
        assert!(status.epoch == 3 && status.lease.is_none(), "{status:?}");
        assert_eq!(listed[0].epoch, 3);
        // And a lock never met is still at 0.
        assert_eq!(issuer.status("never").await.unwrap().epoch, 0);
    }

    /// A rotation while waiters hold tokens signed ahead with the old key: every grant
    /// answered after the rotation carries the new key.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tokens_signed_ahead_follow_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let old = Signer::from_secret([7; 32]);
        let new = Signer::from_secret([8; 32]);
        let issuer = started(dir.path(), old.clone()).await;
        let first = issuer.acquire(req("h0", 0)).await.unwrap();
        assert_signed(&first.token, &old, ("L", 1, "h0"));
        let queued = issuer.clone();
        let waiter = tokio::spawn(async move { queued.acquire(req("h1", 10_000)).await });
        // The waiter is first in line and its token is signed ahead, with the old key.
        let signed_ahead = || {
            issuer
                .lock()
                .unwrap()
                .presigned
                .values()
                .any(|a| a.key_id == old.key_id())
        };
        while !signed_ahead() {
            tokio::task::yield_now().await;
        }
        issuer.signer().replace(new.clone());
        issuer.release(&first.lease.lease_id, None).await.unwrap();
        let granted = waiter.await.unwrap().unwrap();
        assert_eq!(granted.lease.epoch, 2);
        assert_signed(&granted.token, &new, ("L", 2, "h1"));
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
        let issuer = started(dir.path(), Signer::from_secret([7; 32])).await;
        let heard = Arc::new(Heard::default());
        issuer.observe(heard.clone());
        let first = issuer.acquire(req("h0", 0)).await.unwrap();
        let queued = issuer.clone();
        let waiter = tokio::spawn(async move { queued.acquire(req("h1", 10_000)).await });
        while Issuer::census(&issuer).unwrap().waiters < 1 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            Issuer::census(&issuer).unwrap(),
            Census {
                leases: 1,
                waiters: 1
            }
        );
        issuer.release(&first.lease.lease_id, None).await.unwrap();
        waiter.await.unwrap().unwrap();
        let short = Acquire {
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

    /// A panic with the core's lock held stops the issuer: the request waiting in line is
    /// answered `unavailable`, and every later call fails instead of using the state the
    /// panic left behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_poisoned_lock_stops_the_issuer() {
        let dir = tempfile::tempdir().unwrap();
        let issuer = started(dir.path(), Signer::from_secret([7; 32])).await;
        let first = issuer.acquire(req("h0", 0)).await.unwrap();
        let queued = issuer.clone();
        let waiter = tokio::spawn(async move { queued.acquire(req("h1", 60_000)).await });
        while issuer.status("L").await.unwrap().waiters < 1 {
            tokio::task::yield_now().await;
        }
        assert!(!issuer.is_stopped());
        let poisoner = issuer.clone();
        let panicked = std::thread::spawn(move || {
            let _held = poisoner.inner.lock();
            panic!("a bug in the core");
        })
        .join();
        assert!(panicked.is_err());
        // Stopped from the panic on, before any call meets it (what /healthz reports).
        assert!(issuer.is_stopped());
        let stopped =
            |e: &StorageError| matches!(e, StorageError::Failed(m) if m.contains("stopped"));
        match issuer.keepalive(&first.lease.lease_id, None) {
            Err(LeaseError::Storage(e)) => assert!(stopped(&e), "{e:?}"),
            other => panic!("keepalive after the stop: {other:?}"),
        }
        assert_eq!(
            waiter.await.unwrap().unwrap_err(),
            AcquireError::Storage(StorageError::Closed)
        );
        match issuer.acquire(req("h2", 0)).await {
            Err(AcquireError::Storage(e)) => assert!(stopped(&e), "{e:?}"),
            other => panic!("acquire after the stop: {other:?}"),
        }
        match issuer.release(&first.lease.lease_id, None).await {
            Err(LeaseError::Storage(e)) => assert!(stopped(&e), "{e:?}"),
            other => panic!("release after the stop: {other:?}"),
        }
        assert!(issuer.status("L").await.is_err());
        assert!(Issuer::census(&issuer).is_err());
    }
}
