// Renewal in the background, for a Guard's lease and a SessionGuard's session alike: the
// schedule (the rules of the Python client's _renewal.py) and the goroutine that follows
// it, with the loss it reports through a channel, an error and a context.
//
//   - A renewal is due every TTL/3 after the last success; a failed one is retried after
//     TTL/10 (at least 10 ms) until the deadline.
//   - The local deadline is the time the last successful renewal was sent plus the TTL:
//     counting from the send, not the answer, the client believes in its lease for less
//     time than the server grants it, never more.
//   - It is lost when the server answers lease_expired or session_expired, or when the
//     deadline passes without a success (a renewal in flight is abandoned then). Lost is
//     final: nothing is re-acquired behind the caller's back (a new lease is a new epoch).

package palisade

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrReleased is the cause (context.Cause) of a guard's context cancelled because the
// guard was released or its session closed, rather than lost.
var ErrReleased = errors.New("palisade: released")

// schedule says when to renew and until when the lease (or session) is believed alive.
type schedule struct {
	ttl, period, retryAfter time.Duration
	deadline, nextAt        time.Time
}

func newSchedule(ttl time.Duration, sentAt time.Time) schedule {
	return schedule{
		ttl:        ttl,
		period:     ttl / 3,
		retryAfter: max(ttl/10, 10*time.Millisecond),
		deadline:   sentAt.Add(ttl),
		nextAt:     sentAt.Add(ttl / 3),
	}
}

// due is when the next renewal should be sent.
func (s *schedule) due() time.Time {
	if s.nextAt.Before(s.deadline) {
		return s.nextAt
	}
	return s.deadline
}

// renewed: a renewal sent at sentAt succeeded and the server granted granted.
func (s *schedule) renewed(sentAt time.Time, granted time.Duration) {
	if d := sentAt.Add(min(granted, s.ttl)); d.After(s.deadline) {
		s.deadline = d
	}
	s.nextAt = sentAt.Add(s.period)
}

// failed: a renewal failed in a way that leaves it possibly alive; retry soon.
func (s *schedule) failed(now time.Time) { s.nextAt = now.Add(s.retryAfter) }

// life is one lease or session kept alive in the background.
type life struct {
	name  string // "lease <id> on lock "x"", "session <id>"
	code  string // lease_expired or session_expired
	renew func(ctx context.Context) (time.Duration, error)

	mu       sync.Mutex
	s        schedule
	err      error // why it was lost
	released bool

	lost     chan struct{}
	ctx      context.Context
	cancel   context.CancelCauseFunc
	stopOnce sync.Once
	loseOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// startLife starts renewing with renew (which answers the TTL the server granted).
func startLife(name, code string, ttl time.Duration, sentAt time.Time, renew func(context.Context) (time.Duration, error)) *life {
	ctx, cancel := context.WithCancelCause(context.Background())
	l := &life{
		name: name, code: code, renew: renew, s: newSchedule(ttl, sentAt),
		lost: make(chan struct{}), ctx: ctx, cancel: cancel,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go l.run()
	return l
}

func (l *life) run() {
	defer close(l.done)
	var last error
	for {
		l.mu.Lock()
		due, deadline := l.s.due(), l.s.deadline
		l.mu.Unlock()
		timer := time.NewTimer(time.Until(due))
		select {
		case <-l.stop:
			timer.Stop()
			return
		case <-l.lost: // lost through a stale write (Guard)
			timer.Stop()
			return
		case <-timer.C:
		}
		sent := time.Now()
		if !sent.Before(deadline) {
			why := "no renewal succeeded before its deadline"
			if last != nil {
				why += fmt.Sprintf(" (last failure: %v)", last)
			}
			l.lose(&APIError{Code: l.code, Message: l.name + ": " + why})
			return
		}
		ctx, cancel := context.WithDeadline(l.ctx, deadline)
		granted, err := l.renew(ctx)
		cancel()
		select {
		case <-l.stop:
			return
		case <-l.lost:
			return
		default:
		}
		if err == nil {
			l.mu.Lock()
			l.s.renewed(sent, granted)
			l.mu.Unlock()
			continue
		}
		if IsLost(err) {
			l.lose(err)
			return
		}
		// Anything else (the network, a 503, a timeout) leaves it possibly alive.
		last = err
		l.mu.Lock()
		l.s.failed(time.Now())
		l.mu.Unlock()
	}
}

// lose records why it was lost (the first reason stays), closes lost and cancels the
// context with err as its cause.
func (l *life) lose(err error) {
	l.loseOnce.Do(func() {
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
		// Cancelled first: whoever sees Lost closed sees the context cancelled.
		l.cancel(err)
		close(l.lost)
	})
}

// halt stops the renewals (a release or a close) and cancels the context with
// ErrReleased, unless it was lost already.
func (l *life) halt() {
	l.stopOnce.Do(func() {
		l.mu.Lock()
		l.released = true
		l.mu.Unlock()
		close(l.stop)
		l.cancel(ErrReleased)
	})
	<-l.done
}

// Err is why it was lost (nil while it is held).
func (l *life) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// alive answers nil while calls through it may be sent, else the local refusal.
func (l *life) alive() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.err != nil:
		return &APIError{Code: l.code, Message: fmt.Sprintf("%s is lost: %v", l.name, l.err)}
	case l.released:
		return &APIError{Code: l.code, Message: l.name + " was released"}
	case !time.Now().Before(l.s.deadline):
		return &APIError{Code: l.code, Message: l.name + " is presumed lost: no renewal succeeded before its deadline"}
	}
	return nil
}
