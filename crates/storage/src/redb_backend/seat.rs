//! The writer's seat: the role of taking the next batch, computing its rows and appending
//! its record, held by one thread at a time, and by whichever thread needs it.
//!
//! Most of the time the writer thread holds it. But a lone fenced write, with nothing else
//! in flight, used to cross two threads: the caller woke the writer (a sleeping thread),
//! the writer appended, fdatasynced and answered, and the answer woke the caller's
//! thread. On a machine of two virtual CPUs a wake-up of a sleeping thread costs tens of
//! microseconds, as much as a third of the fdatasync itself. So a fenced write that finds
//! the log idle (nobody holds the seat, nothing queued that somebody waits for, the syncer
//! idle with nothing handed to it, no checkpoint backlog) takes the seat on its own thread
//! and runs the writer's very step there: the batch (any lazy record queued before it, then
//! itself), the append, and, being alone, the fdatasync, the publication and the answer.
//! Its answer is ready before it awaits it: no thread is woken at all. Redis does the same
//! for every command, on its one thread.
//!
//! What keeps this safe is that the step is the writer's own, on the writer's own state
//! ([`Writer`], kept here behind a mutex only one holder of the seat ever locks), and that
//! the seat is handed out by the intake under the lock that orders the requests
//! (`intake.rs`): records still reach the log strictly in the order they were submitted,
//! one batch at a time, and groups are still completed in order (`sync.rs`).
//!
//! What it costs: the caller's thread, a runtime worker, blocks for the append and the
//! fdatasync (and for a row read from the file, if the write needs one). That is the time
//! the caller waits anyway; tasks queued behind it on that worker meanwhile are taken by
//! the other workers. Under load the seat is rarely free (a batch is in flight or the
//! syncer is busy), and writes go through the writer and the syncer, pipelined, as before.
//! Only fenced writes take the seat: an issuer's record may be submitted under the issuer's
//! lock, where blocking on a disk would hold up every other lock operation.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::intake::{Closed, Intake};
use super::layers::Layers;
use super::schema::Fault;
use super::state::State;
use super::sync::{Handed, Handoff};
use super::writer::{Chore, Engine, Flight, Request, Segment, Writer, PURGE_LIMIT};

/// The seat and what its holder works with. It holds no reference to the database: the
/// engine is reached through the seat, which the writer thread empties when it stops, so
/// that a closed store lets go of its file while handles are still alive.
pub(super) struct Desk {
    handoff: Arc<Handoff>,
    state: Arc<State>,
    layers: Arc<Layers>,
    /// Published rows beyond which a holder of the seat could wait for a checkpoint.
    room: usize,
    max_batch: usize,
    /// `None` until the writer thread has started the syncer and the checkpointer, and
    /// again once it stops.
    seat: Mutex<Option<Seat>>,
}

/// The writer's state, kept between batches.
struct Seat {
    writer: Writer,
    /// The log segment being appended to (`None` until the first record).
    segment: Option<Segment>,
    /// When expired idempotency records are purged next.
    next_purge: Instant,
}

impl Desk {
    pub(super) fn new(engine: &Engine) -> Self {
        Self {
            handoff: Arc::new(Handoff::new()),
            state: Arc::clone(&engine.state),
            layers: Arc::clone(&engine.layers),
            room: engine.config.checkpoint_rows,
            max_batch: engine.config.max_batch.max(1),
            seat: Mutex::new(None),
        }
    }

    pub(super) fn handoff(&self) -> &Arc<Handoff> {
        &self.handoff
    }

    fn seat(&self) -> MutexGuard<'_, Option<Seat>> {
        self.seat.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The writer thread has started its helpers: the seat can be taken.
    pub(super) fn install(&self, writer: Writer) {
        let next_purge = Instant::now() + writer.engine().config.purge_every;
        *self.seat() = Some(Seat {
            writer,
            segment: None,
            next_purge,
        });
    }

    /// The writer thread stops: the state goes with it.
    pub(super) fn uninstall(&self) -> Option<Writer> {
        self.seat().take().map(|seat| seat.writer)
    }

    /// When the writer should wake for housekeeping even if nothing is queued.
    pub(super) fn next_purge(&self) -> Instant {
        self.seat()
            .as_ref()
            .map_or_else(Instant::now, |seat| seat.next_purge)
    }

    /// The writer's step, by the holder of the seat: writes `batch` and hands it on; then
    /// leaves the seat and, when it kept the batch to complete (nothing else waits,
    /// `sync.rs`), completes it on this thread. Every request in it is answered or
    /// failed, now or by the syncer.
    pub(super) fn step(&self, batch: Vec<Request>, intake: &Intake) {
        struct Leave<'a>(&'a Intake);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.leave_seat();
            }
        }
        let leave = Leave(intake);
        let Some((engine, flight, chores)) = self.write(batch, intake) else {
            return;
        };
        drop(leave);
        self.handoff.complete_mine(&engine, flight, &chores);
    }

    /// The part of [`Desk::step`] made in the seat: the batch's record appended, handed to
    /// the syncer or given back to complete (with what completing needs).
    fn write(
        &self,
        batch: Vec<Request>,
        intake: &Intake,
    ) -> Option<(Arc<Engine>, Flight, Sender<Chore>)> {
        let mut guard = self.seat();
        let Some(seat) = guard.as_mut() else {
            // Only the writer thread takes the seat before it is installed or after it
            // left; it never gets here.
            for request in batch {
                request.fail(crate::StorageError::Closed);
            }
            return None;
        };
        let engine = Arc::clone(seat.writer.engine());
        let purge = Instant::now() >= seat.next_purge;
        if purge {
            seat.next_purge = Instant::now() + engine.config.purge_every;
        }
        if engine.state.is_failed() {
            for request in batch {
                request.fail(engine.state.refusal());
            }
            return None;
        }
        match seat.writer.batch(batch, purge, &mut seat.segment) {
            Ok((flight, purged)) => {
                if purged == PURGE_LIMIT {
                    // More may be due: go again after the next batch.
                    seat.next_purge = Instant::now();
                }
                // Another request already waiting means load: the syncer completes this
                // batch while the next one is computed. Alone, it is completed here.
                let alone = !intake.has_waited();
                match self.handoff.hand(flight, alone) {
                    Ok(Handed::Queued) => None,
                    Ok(Handed::Mine(flight)) => {
                        Some((engine, flight, seat.writer.chores().clone()))
                    }
                    Err(flight) => {
                        let err = engine
                            .state
                            .latch(Fault("the syncer thread is gone".into()));
                        for answer in flight.answers {
                            answer.fail(err.clone());
                        }
                        None
                    }
                }
            }
            Err((fault, answers, requests)) => {
                let err = engine.state.latch(fault);
                for answer in answers {
                    answer.fail(err.clone());
                }
                for request in requests {
                    request.fail(err.clone());
                }
                None
            }
        }
    }

    /// Submits `request` (one somebody waits for); if the log is idle, takes the seat and
    /// writes it on this thread, so that its answer is ready on return. A panic on the way
    /// latches the store failed, as one on the writer thread does, and gives the seat back.
    pub(super) fn submit(&self, intake: &Intake, request: Request) -> Result<(), Closed> {
        let Some(batch) = intake.push_or_seat(request, self.max_batch, || self.idle())? else {
            return Ok(());
        };
        if catch_unwind(AssertUnwindSafe(|| self.step(batch, intake))).is_err() {
            // The seat was left on the way out; the batch's unanswered requests were
            // dropped with their reply channels: their callers see the latch.
            self.state
                .latch(Fault("a write on a request's thread panicked".into()));
        }
        Ok(())
    }

    /// Nothing is being made durable and no checkpoint backlog would make the fdatasync's
    /// holder wait (`sync.rs`, `wait_for_room`).
    pub(super) fn idle(&self) -> bool {
        self.handoff.is_idle() && self.layers.published_len() <= self.room
    }
}
