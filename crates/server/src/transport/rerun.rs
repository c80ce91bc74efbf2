//! A future that is polled again at once when it wakes itself while being polled, instead
//! of going back through the runtime's queue.
//!
//! hyper hands a request's body to the handler through a channel inside the same
//! connection task, and taking the body out of it wakes the sender, that is the task
//! itself, while the task is being polled. tokio treats a task woken during its own poll
//! as a yield: it goes to the back of the worker's queue, and the worker wakes a sleeping
//! sibling worker to come and steal (an eventfd write and a futex wake-up, then the sibling
//! takes the driver and the next request: about one context switch and tens of
//! microseconds per request with a body on a two-CPU machine; `bench/budget`'s `check`
//! and `write` show it, and `--worker-threads 1` removes it, having no sibling).
//!
//! [`Rerun`] gives the inner future a waker of its own: a wake that arrives while the
//! inner future is being polled is noted and the future is polled again before returning;
//! any other wake goes to the task's waker as usual. After [`MAX_RERUNS`] polls in a row
//! it yields through the runtime after all, so that a future that keeps waking itself
//! cannot keep its worker from other tasks. No library offers this for an arbitrary
//! future (tokio's own yield is what it avoids), so it is written here, with the task's
//! waker kept in `futures`' `AtomicWaker`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// Most polls in a row before a self-wake goes through the runtime.
pub(super) const MAX_RERUNS: usize = 16;

/// Wraps `F`; see the module docs.
pub(super) struct Rerun<F> {
    inner: F,
    signal: Arc<Signal>,
    /// `signal` as a waker, made once.
    waker: Waker,
}

/// The waker the inner future sees.
struct Signal {
    /// The inner future is being polled.
    polling: AtomicBool,
    /// It was woken while being polled.
    woken: AtomicBool,
    /// The task's own waker, as of the last poll.
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.polling.load(Ordering::Acquire) {
            self.woken.store(true, Ordering::Release);
            // Polled again before the poll returns: the runtime need not know. If the poll
            // is just ending, the flag is read after `polling` is cleared (see `poll`).
            if self.polling.load(Ordering::Acquire) {
                return;
            }
        }
        self.task.wake();
    }
}

impl<F> Rerun<F> {
    pub(super) fn new(inner: F) -> Self {
        let signal = Arc::new(Signal {
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(Arc::clone(&signal));
        Rerun {
            inner,
            signal,
            waker,
        }
    }

    /// The inner future, to act on it between polls.
    pub(super) fn inner_mut(&mut self) -> &mut F {
        &mut self.inner
    }
}

/// `F` is `Unpin` (a pinned reference or a box): nothing here needs pinning.
impl<F: Future + Unpin> Future for Rerun<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.signal.task.register(cx.waker());
        let signal = &this.signal;
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..MAX_RERUNS {
            signal.woken.store(false, Ordering::Release);
            signal.polling.store(true, Ordering::Release);
            let polled = Pin::new(&mut this.inner).poll(&mut inner_cx);
            signal.polling.store(false, Ordering::Release);
            if polled.is_ready() {
                return polled;
            }
            if !signal.woken.load(Ordering::Acquire) {
                return Poll::Pending;
            }
        }
        // Still waking itself: let the runtime run other tasks first.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Wakes itself during each of its first `left` polls, then is ready.
    struct SelfWaking {
        left: usize,
        polls: usize,
    }

    impl Future for SelfWaking {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.left == 0 {
                return Poll::Ready(self.polls);
            }
            self.left -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// Counts the task's wake-ups.
    #[derive(Default)]
    struct Count(std::sync::atomic::AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_wake_during_the_poll_is_a_poll_again_not_a_task_wake() {
        let count = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        let mut fut = std::pin::pin!(Rerun::new(SelfWaking { left: 3, polls: 0 }));
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(4));
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            0,
            "the task was never woken"
        );
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_to_the_runtime() {
        let count = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        let left = MAX_RERUNS + 2;
        let mut fut = std::pin::pin!(Rerun::new(SelfWaking { left, polls: 0 }));
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "one yield after the limit"
        );
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(left + 1));
    }

    #[test]
    fn a_wake_after_the_poll_reaches_the_task() {
        let count = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        // Pending without waking itself; keeps the waker it was given.
        let kept: Arc<Mutex<Option<Waker>>> = Arc::default();
        let slot = Arc::clone(&kept);
        let mut fut = std::pin::pin!(Rerun::new(std::future::poll_fn(move |cx| {
            *slot.lock().unwrap() = Some(cx.waker().clone());
            Poll::<()>::Pending
        })));
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Pending);
        kept.lock().unwrap().take().unwrap().wake();
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "a later wake reaches the task"
        );
    }
}
