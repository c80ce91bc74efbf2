// Renewal in the background, for a Guard's lease and a SessionGuard's session alike: the
// settings of a holder's deadlines (Deadlines, WithDeadlines), the schedule (the rules
// of the Python client's _renewal.py; the one owner of both deadlines, the guards only
// ask it) and the goroutine that follows it, with the loss it reports through a channel,
// an error and a context.
//
//   - A renewal is due every TTL/3 after the last success; a failed one is retried after
//     TTL/10 (at least 10 ms), never past the renewal deadline.
//   - With s the time the last renewal the server confirmed was sent (at first: the
//     acquisition's) and t the TTL granted with it (never more than the TTL first
//     granted): the holder is safe until s + t*(1 - ClockDrift), and the renewal
//     deadline is s + t*RenewDeadline. Counting from the send, not the answer, the client
//     believes in its lease for less time than the server grants it, never more (within
//     the clock drift allowed for).
//   - It is lost when the server answers lease_expired or session_expired to a renewal,
//     when a write through a Guard is refused as stale, or when the renewal deadline
//     passes without a success (a renewal in flight is abandoned then): the client gives
//     it up itself, as Kubernetes' leader election does at its renewDeadline. Lost is
//     final: nothing is re-acquired behind the caller's back (a new lease is a new epoch).
//   - Safe-until moves earlier, never later, when the lease or session is known to have
//     ended: the server said so (at the send of the renewal it answered), a write through
//     the guard was refused as stale, or the guard was released or its session closed (at
//     that moment). Giving up at the renewal deadline does not move it: what already runs
//     may go on until then.

package palisade

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// ErrReleased is the cause (context.Cause) of a guard's context cancelled because the
// guard was released or its session closed, rather than lost.
var ErrReleased = errors.New("palisade: released")

// The default Deadlines.
const (
	// DefaultRenewDeadline is the default renewal deadline, as a fraction of the TTL
	// (Kubernetes: 10 s of 15 s).
	DefaultRenewDeadline = 2.0 / 3.0
	// DefaultClockDrift is the default clock-rate drift allowed for between this host
	// and the server: 1 %, twenty times the 500 ppm NTP allows a disciplined clock.
	DefaultClockDrift = 0.01
)

// Deadlines is how a client derives a holder's deadlines from the TTL (WithDeadlines;
// docs/guarantees.md, "A holder's deadlines narrow the window; they do not close it").
// With s the time the last renewal the server confirmed was sent and t the TTL granted
// with it, the holder may act until s + t*(1 - ClockDrift) (SafeUntil), and the client
// gives the lease up itself if no renewal has succeeded by s + t*RenewDeadline
// (RenewDeadline).
//
// The deadlines narrow the window in which an old holder can still act; they do not
// close it. A process that pauses after it checked SafeFor, a request already on its way,
// or clocks that drift apart faster than ClockDrift can still reach a resource after the
// lease ended there: only the token, checked by the resource, refuses them.
//
// The fields are taken as given (a zero ClockDrift allows for no drift): start from
// DefaultDeadlines to change one of them.
type Deadlines struct {
	// RenewDeadline is the fraction of the TTL, after the last confirmed renewal's send,
	// at which the client gives the lease up if no renewal has succeeded since: more than
	// 1/3 (a renewal is sent every TTL/3) and at most 1 - ClockDrift.
	RenewDeadline float64
	// ClockDrift is the largest clock-rate difference allowed for between this host and
	// the server, as a fraction from 0 to 0.5 (0.01 is 1 %): the safe deadline is the TTL
	// less this share.
	ClockDrift float64
}

// DefaultDeadlines are the deadlines of a client without WithDeadlines:
// DefaultRenewDeadline and DefaultClockDrift.
func DefaultDeadlines() Deadlines {
	return Deadlines{RenewDeadline: DefaultRenewDeadline, ClockDrift: DefaultClockDrift}
}

// WithDeadlines sets how the client's leases and sessions derive their renewal deadline
// and safe deadline from the TTL (DefaultDeadlines without it). Deadlines that cannot
// hold (a RenewDeadline of 1/3 or less or above 1 - ClockDrift, a ClockDrift outside
// 0 to 0.5, NaN) are refused when the client is made, as NewClient refuses a bad URL.
func WithDeadlines(d Deadlines) Option { return func(c *Client) { c.deadlines = d } }

// check answers nil for deadlines that can hold, else the refusal (bad_request, Status 0).
func (d Deadlines) check() error {
	if !(d.ClockDrift >= 0 && d.ClockDrift <= 0.5) {
		return badRequest("Deadlines.ClockDrift %v is outside 0 to 0.5 (a fraction: 0.01 is 1 %%)", d.ClockDrift)
	}
	if !(d.RenewDeadline > 1.0/3.0 && d.RenewDeadline <= 1-d.ClockDrift) {
		return badRequest("Deadlines.RenewDeadline %v (a fraction of the TTL) must be more than 1/3, when the "+
			"first renewal is sent, and at most 1 - ClockDrift = %v", d.RenewDeadline, 1-d.ClockDrift)
	}
	return nil
}

// share is fraction of d, to the nearest nanosecond.
func share(d time.Duration, fraction float64) time.Duration {
	return time.Duration(math.Round(float64(d) * fraction))
}

// givenUpReason is why a lease or session is lost when the renewal deadline passed.
const givenUpReason = "no renewal succeeded before the renewal deadline"

// schedule says when to renew, until when the holder may act (safeUntil) and when the
// client gives up (renewBy). Times are passed in; nothing here reads the clock.
type schedule struct {
	ttl, period, retryAfter    time.Duration
	deadlines                  Deadlines
	renewBy, safeUntil, nextAt time.Time
	// over: lost, released or closed; no renewal confirmed later counts.
	over bool
}

// newSchedule is the schedule of something granted ttl by a request sent at sentAt.
func newSchedule(ttl time.Duration, d Deadlines, sentAt time.Time) schedule {
	return schedule{
		ttl:        ttl,
		period:     ttl / 3,
		retryAfter: max(ttl/10, 10*time.Millisecond),
		deadlines:  d,
		renewBy:    sentAt.Add(share(ttl, d.RenewDeadline)),
		safeUntil:  sentAt.Add(share(ttl, 1-d.ClockDrift)),
		nextAt:     sentAt.Add(ttl / 3),
	}
}

// due is when the next renewal should be sent: never past the renewal deadline.
func (s *schedule) due() time.Time {
	if s.nextAt.Before(s.renewBy) {
		return s.nextAt
	}
	return s.renewBy
}

// givenUp says whether the renewal deadline has passed at now: the client gives up.
func (s *schedule) givenUp(now time.Time) bool { return !now.Before(s.renewBy) }

// safeFor is how long from now the holder may still act: 0 once safeUntil has passed.
func (s *schedule) safeFor(now time.Time) time.Duration { return max(s.safeUntil.Sub(now), 0) }

// renewed: a renewal sent at sentAt succeeded and the server granted granted (never
// believed beyond the TTL first granted). Both deadlines count from sentAt.
func (s *schedule) renewed(sentAt time.Time, granted time.Duration) {
	if s.over {
		return
	}
	t := min(granted, s.ttl)
	if d := sentAt.Add(share(t, s.deadlines.RenewDeadline)); d.After(s.renewBy) {
		s.renewBy = d
	}
	if d := sentAt.Add(share(t, 1-s.deadlines.ClockDrift)); d.After(s.safeUntil) {
		s.safeUntil = d
	}
	s.nextAt = sentAt.Add(s.period)
}

// failed: a renewal failed in a way that leaves it possibly alive; retry soon.
func (s *schedule) failed(now time.Time) { s.nextAt = now.Add(s.retryAfter) }

// end: it is lost or stopped; no later renewal counts. endedBy is a time by which it is
// known to be over at the server (the server said so, it was released, a newer epoch
// wrote): the holder is safe no later than that. Zero endedBy (the client gave up) leaves
// safeUntil as the last confirmed renewal made it.
func (s *schedule) end(endedBy time.Time) {
	s.over = true
	if !endedBy.IsZero() && endedBy.Before(s.safeUntil) {
		s.safeUntil = endedBy
	}
}

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

// startLife starts renewing with renew (which answers the TTL the server granted)
// something granted ttl by a request sent at sentAt.
func startLife(name, code string, ttl time.Duration, d Deadlines, sentAt time.Time, renew func(context.Context) (time.Duration, error)) *life {
	ctx, cancel := context.WithCancelCause(context.Background())
	l := &life{
		name: name, code: code, renew: renew, s: newSchedule(ttl, d, sentAt),
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
		due, renewBy := l.s.due(), l.s.renewBy
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
		l.mu.Lock()
		late := l.s.givenUp(sent)
		l.mu.Unlock()
		if late {
			why := givenUpReason
			if last != nil {
				why += fmt.Sprintf(" (last failure: %v)", last)
			}
			// Given up, not known to be over: safe-until stays where it was.
			l.lose(&APIError{Code: l.code, Message: l.name + ": " + why}, time.Time{})
			return
		}
		// A renewal in flight may take until the renewal deadline, no longer.
		ctx, cancel := context.WithDeadline(l.ctx, renewBy)
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
			// Over at the server since some time before this answer: count from the send.
			l.lose(err, sent)
			return
		}
		// Anything else (the network, a 503, a timeout) leaves it possibly alive.
		last = err
		l.mu.Lock()
		l.s.failed(time.Now())
		l.mu.Unlock()
	}
}

// lose records why it was lost (the first reason stays), ends the schedule (endedBy: see
// schedule.end), closes lost and cancels the context with err as its cause.
func (l *life) lose(err error, endedBy time.Time) {
	l.mu.Lock()
	l.s.end(endedBy)
	l.mu.Unlock()
	l.loseOnce.Do(func() {
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
		// Cancelled first: whoever sees Lost closed sees the context cancelled.
		l.cancel(err)
		close(l.lost)
	})
}

// halt stops the renewals (a release or a close: over at the server from now on, so
// safe no longer) and cancels the context with ErrReleased, unless it was lost already.
func (l *life) halt() {
	l.stopOnce.Do(func() {
		l.mu.Lock()
		l.released = true
		l.s.end(time.Now())
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

// safeUntil, safeFor and renewDeadline answer the schedule's deadlines (see Guard).
func (l *life) safeUntil() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.safeUntil
}

func (l *life) safeFor() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.safeFor(time.Now())
}

func (l *life) renewDeadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.renewBy
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
	case l.s.givenUp(time.Now()):
		return &APIError{Code: l.code, Message: l.name + " is presumed lost: " + givenUpReason}
	}
	return nil
}
