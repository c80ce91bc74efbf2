//! The writer's queue: every request in the order it was submitted, where a lazy issuer
//! record waits for the next commit instead of waking the writer for a commit of its own.
//!
//! A lazy record ([`LazyRecord`](crate::LazyRecord)) is one nobody waits for: the lease
//! record of a grant inside a durable reservation, a removal after an expiry or ahead of a
//! release's own. Woken for each, the writer would append and fdatasync a record that
//! holds nothing anyone asked to be durable; a J1 cycle (acquire + release) paid two
//! commits, one of them for the acquisition's lease record. Here a lazy record waits in
//! line, in its place, and rides with the next request somebody waits for (a release's
//! removal, a fenced write, a reservation), or with a commit of its own once it has waited
//! [`RedbOptions::lazy_linger`](super::RedbOptions::lazy_linger) (10 ms by default).
//!
//! What is kept: the order. Requests are taken strictly from the front, lazy or not, so
//! the records reach the log in the order they were submitted, and a waited request's
//! commit still covers every record submitted before it (the issuer's barrier).
//! What changes: a lazy record reaches the disk up to the linger later when nothing else
//! is written; a crash in between loses it, which a lazy record may (the issuer's module
//! docs say what each loss costs: a lock that waits out its reservation or one TTL).
//!
//! Only the first lazy record of a quiet spell wakes a sleeping writer, so that it can
//! sleep until that record's linger is over; the ones after it, and every lazy record
//! while the writer works, wake nobody.
//!
//! The intake also keeps the writer's **seat** (`seat.rs`): whoever takes a batch from it
//! (the writer thread, or a request that finds the log idle) holds the seat until that
//! batch is appended and handed on, and nobody else takes a batch meanwhile. A request
//! queued while another holds the seat waits in line as usual; the writer, if it sleeps,
//! is woken when the seat is given back and there is something to take.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::writer::Request;

/// The queue between the handles and the writer thread.
pub(super) struct Intake {
    queue: Mutex<Queue>,
    /// The writer waits on it.
    ready: Condvar,
    linger: Duration,
}

struct Queue {
    requests: VecDeque<Request>,
    /// Requests in `requests` that someone waits for (not lazy).
    waited: usize,
    /// Lazy records in `requests`.
    lazies: usize,
    /// When the oldest lazy record still in `requests` was queued (or, after a batch took
    /// some, when that batch was taken).
    lazy_since: Option<Instant>,
    /// No more requests are taken: the writer finishes what is queued and stops.
    closed: bool,
    /// The writer sleeps on `ready`.
    sleeping: bool,
    /// Somebody holds the writer's seat (took a batch and has not handed it on yet). Held
    /// by the writer thread from the start until its seat is ready.
    seated: bool,
    /// The writer sleeps because the seat is taken while it has work due: giving the seat
    /// back wakes it.
    waits_for_seat: bool,
}

/// The intake takes no more requests.
#[derive(Debug)]
pub(super) struct Closed;

/// What the writer takes next.
pub(super) enum Next {
    /// Requests to write, in order (empty: only the housekeeping deadline passed).
    Batch(Vec<Request>),
    /// Closed and empty: the writer stops.
    Closed,
}

impl Intake {
    pub(super) fn new(linger: Duration) -> Self {
        Self {
            queue: Mutex::new(Queue {
                requests: VecDeque::new(),
                waited: 0,
                lazies: 0,
                lazy_since: None,
                closed: false,
                sleeping: false,
                seated: true,
                waits_for_seat: false,
            }),
            ready: Condvar::new(),
            linger,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `request` behind everything submitted before it; refuses (dropping it) once
    /// closed.
    pub(super) fn push(&self, request: Request) -> Result<(), Closed> {
        let mut queue = self.lock();
        if queue.closed {
            return Err(Closed);
        }
        let wake = enqueue(&mut queue, request);
        drop(queue);
        if wake {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Queues `request` like [`Intake::push`]; then, if nobody holds the seat, nothing
    /// else somebody waits for is queued and `idle()` (the rest of the log is idle too),
    /// takes the seat and at most `max` requests from the front (`request` among them,
    /// behind any lazy record queued before it) for the caller to write. `None`: the
    /// request waits in line for the writer.
    pub(super) fn push_or_seat(
        &self,
        request: Request,
        max: usize,
        idle: impl FnOnce() -> bool,
    ) -> Result<Option<Vec<Request>>, Closed> {
        let mut queue = self.lock();
        if queue.closed {
            return Err(Closed);
        }
        let free = !queue.seated && queue.waited == 0 && !request.is_lazy();
        if free && idle() {
            enqueue(&mut queue, request);
            queue.seated = true;
            return Ok(Some(take(&mut queue, max, Instant::now())));
        }
        let wake = enqueue(&mut queue, request);
        drop(queue);
        if wake {
            self.ready.notify_one();
        }
        Ok(None)
    }

    /// Gives the seat back after a batch was handed on; wakes the writer if it sleeps and
    /// something may be due (a request queued meanwhile, a lazy record whose linger it
    /// does not know of, the close, or work it held back for the seat).
    pub(super) fn leave_seat(&self) {
        let mut queue = self.lock();
        queue.seated = false;
        let wake = queue.sleeping
            && (queue.waits_for_seat || queue.waited > 0 || queue.lazies > 0 || queue.closed);
        drop(queue);
        if wake {
            self.ready.notify_one();
        }
    }

    /// Takes no more requests; the writer is woken to finish what is queued.
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_one();
    }

    /// Whether no more requests are taken.
    pub(super) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// The writer is going away without finishing (it could not start its threads, or it
    /// unwinds): takes no more requests and gives back every queued one, to be failed.
    pub(super) fn abandon(&self) -> Vec<Request> {
        let mut queue = self.lock();
        queue.closed = true;
        queue.waited = 0;
        queue.lazies = 0;
        queue.lazy_since = None;
        queue.requests.drain(..).collect()
    }

    /// Whether the seat is free and nothing anybody waits for is queued.
    #[cfg(test)]
    pub(super) fn seat_free(&self) -> bool {
        let queue = self.lock();
        !queue.seated && queue.waited == 0
    }

    /// Whether a request somebody waits for is queued (the writer then leaves the batch
    /// it just appended to the syncer, see `sync.rs`).
    pub(super) fn has_waited(&self) -> bool {
        self.lock().waited > 0
    }

    /// The writer's side: blocks until a request somebody waits for is queued, the oldest
    /// lazy record's linger is over, `housekeeping` is due, or the intake is closed, and
    /// the seat is free; then takes the seat and at most `max` requests from the front.
    pub(super) fn next(&self, housekeeping: Instant, max: usize) -> Next {
        let mut queue = self.lock();
        loop {
            let now = Instant::now();
            let lazy_due = queue.lazy_since.map(|t| t + self.linger);
            let work = queue.waited > 0 || lazy_due.is_some_and(|t| t <= now) || queue.closed;
            let due = work || housekeeping <= now;
            if due && !queue.seated {
                if queue.closed && queue.requests.is_empty() {
                    return Next::Closed;
                }
                queue.seated = true;
                if work {
                    return Next::Batch(take(&mut queue, max, now));
                }
                return Next::Batch(Vec::new());
            }
            queue.sleeping = true;
            queue = if due {
                // Work is due but the seat is taken: its holder wakes us when it leaves.
                queue.waits_for_seat = true;
                self.ready
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner)
            } else {
                let until = lazy_due.map_or(housekeeping, |t| t.min(housekeeping));
                self.ready
                    .wait_timeout(queue, until - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            };
            queue.sleeping = false;
            queue.waits_for_seat = false;
        }
    }
}

/// Puts `request` at the back of the queue; whether the writer should be woken for it (a
/// request somebody waits for, or the first lazy record of a quiet spell, while the writer
/// sleeps and nobody holds the seat: a holder wakes it when leaving).
fn enqueue(queue: &mut Queue, request: Request) -> bool {
    let wake = if request.is_lazy() {
        queue.lazies += 1;
        // The first of a quiet spell: a sleeping writer learns when its linger ends.
        let first = queue.lazy_since.is_none();
        if first {
            queue.lazy_since = Some(Instant::now());
        }
        first && queue.sleeping
    } else {
        queue.waited += 1;
        queue.sleeping
    };
    queue.requests.push_back(request);
    wake && !queue.seated
}

/// Takes at most `max` requests from the front of the queue.
fn take(queue: &mut Queue, max: usize, now: Instant) -> Vec<Request> {
    let count = queue.requests.len().min(max.max(1));
    let batch: Vec<Request> = queue.requests.drain(..count).collect();
    let lazies = batch.iter().filter(|r| r.is_lazy()).count();
    queue.lazies -= lazies;
    queue.waited -= batch.len() - lazies;
    queue.lazy_since = (queue.lazies > 0).then_some(now);
    batch
}
