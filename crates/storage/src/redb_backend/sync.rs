//! Making a batch durable and answering it: [`complete`] (fdatasync the log, publish the
//! rows to readers, answer, in that order), and the [`Handoff`] that decides which thread
//! runs it.
//!
//! Once the holder of the writer's seat (`seat.rs`: the writer thread, or a request that
//! found the log idle) has appended a batch's record it either completes the batch itself
//! or hands it to the syncer thread:
//! - **itself**, when the syncer is idle with nothing handed over and no other request is
//!   waiting to be written: a lone write then crosses no thread between its append and
//!   its answer. It decides while it holds the seat and completes after leaving it, so
//!   that the next batch is appended meanwhile and handed to the syncer (pipelined);
//! - **to the syncer** otherwise, so that under load the writer computes and appends the
//!   next batch while the previous one's fdatasync runs (pipelined group commit).
//!
//! Groups are completed one at a time and in the order of their records, which is what
//! keeps a reader from seeing a newer row replaced by an older one: whichever thread
//! completes holds the hand-off's `busy` mark, flights are handed over in the order of
//! their records (by the seat's holder, while it holds the seat), the syncer takes them
//! only in that order, and a holder completes its own only when nothing was handed over
//! before it and nobody is completing.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Instant;

use super::schema::Fault;
use super::wal::LogFile;
use super::writer::{finish_checkpoint, freeze, maybe_checkpoint, Chore, Engine, Flight};

/// What [`Handoff::hand`] did with a flight.
pub(super) enum Handed {
    /// The syncer completes it.
    Queued,
    /// The caller completes it, with [`Handoff::complete_mine`].
    Mine(Flight),
}

/// The flights between the writer and the syncer, and who is completing one.
pub(super) struct Handoff {
    queue: Mutex<Queue>,
    /// The syncer waits on it for flights (or the close).
    ready: Condvar,
    /// When the last checkpoint started (either thread may start one).
    last_checkpoint: Mutex<Instant>,
}

struct Queue {
    flights: Vec<Flight>,
    /// A thread is completing a group.
    busy: bool,
    /// The writer is gone: the syncer completes what is queued and stops.
    closed: bool,
    /// The syncer thread is gone: nobody would complete a queued flight.
    gone: bool,
    /// How many requests somebody waited for the recent groups held, on average, in
    /// sixteenths (a moving average: each group weighs a quarter). Above one means writes
    /// arrive concurrently (load), see [`Handoff::is_idle`].
    group_size: usize,
}

/// One request per group, in [`Queue::group_size`]'s sixteenths.
const ONE: usize = 16;

impl Handoff {
    pub(super) fn new() -> Self {
        Self {
            queue: Mutex::new(Queue {
                flights: Vec::new(),
                busy: false,
                closed: false,
                gone: false,
                group_size: ONE,
            }),
            ready: Condvar::new(),
            last_checkpoint: Mutex::new(Instant::now()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The side of the seat's holder (`seat.rs`), called while it holds the seat, so that
    /// flights are handed on in the order of their records: when `alone` (nothing else
    /// waits to be written) and the syncer is idle with nothing queued, gives `flight`
    /// back marked for this thread to complete ([`Handoff::complete_mine`], after leaving
    /// the seat); queues it for the syncer otherwise. Fails when the syncer thread is gone.
    pub(super) fn hand(&self, flight: Flight, alone: bool) -> Result<Handed, Flight> {
        let mut queue = self.lock();
        if queue.gone {
            return Err(flight);
        }
        if !(alone && !queue.busy && queue.flights.is_empty()) {
            queue.flights.push(flight);
            drop(queue);
            self.ready.notify_one();
            return Ok(Handed::Queued);
        }
        queue.busy = true;
        Ok(Handed::Mine(flight))
    }

    /// Completes a flight [`Handoff::hand`] gave back; flights handed to the syncer
    /// meanwhile wait for it. If it unwinds, the store is latched failed before the mark
    /// is let go, so that the syncer fails what waits instead of publishing past a group
    /// that never was.
    pub(super) fn complete_mine(&self, engine: &Engine, flight: Flight, chores: &Sender<Chore>) {
        struct Done<'a> {
            handoff: &'a Handoff,
            engine: &'a Engine,
            /// The group's waited requests, once they are answered.
            ops: usize,
        }
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.engine
                        .state
                        .latch(Fault("completing a commit panicked".into()));
                }
                self.handoff.done(self.ops);
            }
        }
        let ops = flight.ops;
        let mut done = Done {
            handoff: self,
            engine,
            ops: 0,
        };
        complete(engine, vec![flight], chores, &self.last_checkpoint);
        done.ops = ops;
    }

    /// Nobody is completing a group, nothing is handed over, and the recent groups held
    /// about one write each: writes come one at a time. Groups of several mean concurrent
    /// writers, whose next batch is better appended by the writer while the syncer
    /// fdatasyncs (`seat.rs`); under load an odd group of one does not change that.
    pub(super) fn is_idle(&self) -> bool {
        let queue = self.lock();
        !queue.busy && queue.flights.is_empty() && queue.group_size <= ONE + ONE / 4
    }

    /// The writer is done: the syncer completes what is queued, then stops.
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_one();
    }

    /// The syncer's side: every flight queued so far, oldest first, once some are (and
    /// nobody is completing); `None` once the writer closed and nothing is left.
    fn take(&self) -> Option<Vec<Flight>> {
        let mut queue = self.lock();
        loop {
            if !queue.busy && !queue.flights.is_empty() {
                queue.busy = true;
                return Some(std::mem::take(&mut queue.flights));
            }
            if queue.closed && queue.flights.is_empty() && !queue.busy {
                return None;
            }
            queue = self
                .ready
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// A group of `ops` waited requests is completed.
    fn done(&self, ops: usize) {
        let mut queue = self.lock();
        queue.busy = false;
        queue.group_size = (queue.group_size * 3 + ops.saturating_mul(ONE)) / 4;
        let waiting = !queue.flights.is_empty();
        drop(queue);
        if waiting {
            // Handed over while this group was completed elsewhere.
            self.ready.notify_one();
        }
    }
}

/// The syncer thread: completes what the writer hands over, in order, until the writer
/// closes. If it unwinds, the flights left are failed and the writer is told.
pub(super) fn sync_loop(engine: &Engine, handoff: &Handoff, chores: &Sender<Chore>) {
    struct Gone<'a>(&'a Engine, &'a Handoff);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            let flights = {
                let mut queue = self.1.lock();
                queue.gone = true;
                std::mem::take(&mut queue.flights)
            };
            if !flights.is_empty() || std::thread::panicking() {
                let err = self
                    .0
                    .state
                    .latch(Fault("the syncer thread is gone".into()));
                for answer in flights.into_iter().flat_map(|f| f.answers) {
                    answer.fail(err.clone());
                }
            }
        }
    }
    let _gone = Gone(engine, handoff);
    while let Some(group) = handoff.take() {
        let ops = group.iter().map(|f| f.ops).sum();
        complete(engine, group, chores, &handoff.last_checkpoint);
        handoff.done(ops);
    }
    // The writer is done and every answer sent: checkpoint what is left, synchronously
    // in the checkpointer (it stops when this sender goes).
    if engine.state.is_failed() {
        return;
    }
    {
        let (running, done) = &engine.checkpointing;
        let mut running = running.lock().unwrap_or_else(PoisonError::into_inner);
        while *running {
            running = done.wait(running).unwrap_or_else(PoisonError::into_inner);
        }
        *running = true;
    }
    match freeze(engine) {
        Some((seq, rows)) => drop(chores.send(Chore::Checkpoint { seq, rows })),
        None => finish_checkpoint(engine),
    }
}

/// Makes `group` durable and answers it: one fdatasync per log file its records went to,
/// then the rows published to readers, then the answers, in order; then a checkpoint if
/// one is due. A failed fdatasync latches the store and fails every answer of the group
/// (none of them is known to be durable). Never answers before the fdatasync that makes
/// the answer true.
pub(super) fn complete(
    engine: &Engine,
    mut group: Vec<Flight>,
    chores: &Sender<Chore>,
    last_checkpoint: &Mutex<Instant>,
) {
    if engine.state.is_failed() {
        let err = engine.state.refusal();
        for answer in group.into_iter().flat_map(|f| f.answers) {
            answer.fail(err.clone());
        }
        return;
    }
    // One fdatasync per file written (a roll makes it two, once per segment).
    let sync_started = Instant::now();
    let mut synced: Vec<Arc<dyn LogFile>> = Vec::new();
    let mut fault = None;
    for (_, file, _) in group.iter().filter_map(|f| f.record.as_ref()) {
        if synced.iter().any(|s| Arc::ptr_eq(s, file)) {
            continue;
        }
        if let Err(e) = file.sync_data() {
            fault = Some(Fault(format!("cannot fdatasync the log: {e}")));
            break;
        }
        synced.push(Arc::clone(file));
    }
    if let Some(fault) = fault {
        let err = engine.state.latch(fault);
        for answer in group.into_iter().flat_map(|f| f.answers) {
            answer.fail(err.clone());
        }
        return;
    }
    let requests: usize = group.iter().map(|f| f.answers.len()).sum();
    engine
        .config
        .commit_hook
        .committed(requests, sync_started.elapsed());
    wait_for_room(engine);
    let mut durable = None;
    {
        let mut published = engine
            .layers
            .published
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        for flight in &mut group {
            let Some((seq, _, rows)) = flight.record.as_mut() else {
                continue;
            };
            // The flight holds the only reference: move the rows, do not copy them.
            let rows = std::mem::take(rows);
            match Arc::try_unwrap(rows) {
                Ok(rows) => published.extend(rows),
                Err(rows) => published.extend(rows.iter().map(|(k, v)| (k.clone(), v.clone()))),
            }
            durable = Some(*seq);
        }
    }
    if let Some(seq) = durable {
        engine.state.set_durable_seq(seq);
    }
    for flight in group {
        engine.state.record_commit(flight.ops, flight.max_epoch);
        for answer in flight.answers {
            answer.send();
        }
    }
    let mut last = last_checkpoint
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    maybe_checkpoint(engine, chores, &mut last);
}

/// Backpressure: while a checkpoint runs and rows have piled up far past the trigger,
/// wait for it (answers wait with it), so memory stays bounded.
fn wait_for_room(engine: &Engine) {
    let (running, done) = &engine.checkpointing;
    let mut running = running.lock().unwrap_or_else(PoisonError::into_inner);
    while *running && engine.layers.published_len() > 2 * engine.config.checkpoint_rows {
        running = done.wait(running).unwrap_or_else(PoisonError::into_inner);
    }
}
