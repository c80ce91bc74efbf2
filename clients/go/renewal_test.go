// Tests of the renewal schedule with made-up clocks (the rules of the Python client's
// tests/test_protocol.py), of the Deadlines a client refuses, and of a life driven by a
// renewal function given here (no server): when it gives up, and where its deadlines
// stand then.

package palisade

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// t0 is the made-up clock's origin; at(ms) is ms milliseconds after it.
var t0 = time.Unix(1_000, 0)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// wantTimes fails the test unless each got equals its want.
func wantTimes(t *testing.T, what string, got, want []time.Time) {
	t.Helper()
	for i := range got {
		if !got[i].Equal(want[i]) {
			t.Fatalf("%s: got %v, want %v (from t0: %v, not %v)", what, got, want, got[i].Sub(t0), want[i].Sub(t0))
		}
	}
}

func TestRenewalsAreDueEveryThirdOfTheTTLAndMoveBothDeadlines(t *testing.T) {
	s := newSchedule(900*time.Millisecond, DefaultDeadlines(), at(0))
	// Due at TTL/3, given up at 2/3 of the TTL, safe until the TTL less 1 %.
	wantTimes(t, "at first", []time.Time{s.due(), s.renewBy, s.safeUntil}, []time.Time{at(300), at(600), at(891)})
	s.renewed(at(300), 900*time.Millisecond)
	wantTimes(t, "renewed", []time.Time{s.due(), s.renewBy, s.safeUntil}, []time.Time{at(600), at(900), at(1191)})
	if s.givenUp(at(899)) || !s.givenUp(at(900)) {
		t.Fatal("the renewal deadline is 900 ms after t0, not before or after")
	}
	if got := s.safeFor(at(1000)); got != 191*time.Millisecond {
		t.Fatalf("safe for %v at 1000 ms", got)
	}
	if got := s.safeFor(at(1200)); got != 0 {
		t.Fatalf("safe for %v after the safe deadline", got)
	}
}

func TestTheDeadlinesCountFromTheSendAndNeverTrustALongerTTL(t *testing.T) {
	s := newSchedule(900*time.Millisecond, DefaultDeadlines(), at(0))
	// Sent at 300 ms, answered whenever: a server granting more is not believed.
	s.renewed(at(300), time.Minute)
	wantTimes(t, "renewed", []time.Time{s.renewBy, s.safeUntil, s.due()}, []time.Time{at(900), at(1191), at(600)})
	// A grant shorter than the TTL counts as granted.
	s.renewed(at(600), 600*time.Millisecond)
	wantTimes(t, "a shorter grant", []time.Time{s.renewBy, s.safeUntil}, []time.Time{at(1000), at(1194)})
}

func TestFailedRenewalsRetryQuicklyUntilTheRenewalDeadline(t *testing.T) {
	s := newSchedule(1500*time.Millisecond, DefaultDeadlines(), at(0))
	s.failed(at(500))
	wantTimes(t, "a failure", []time.Time{s.due()}, []time.Time{at(650)}) // TTL/10 later
	s.failed(at(950))
	wantTimes(t, "a failure near the end", []time.Time{s.due()}, []time.Time{at(1000)}) // never past the renewal deadline
	if s.givenUp(at(999)) || !s.givenUp(at(1000)) {
		t.Fatal("given up at 1000 ms, not before or after")
	}
	// Given up, but what already runs may go on until the safe deadline.
	s.end(time.Time{})
	wantTimes(t, "given up", []time.Time{s.safeUntil}, []time.Time{at(1485)})
	// A short TTL still waits 10 ms before it retries.
	short := newSchedule(50*time.Millisecond, DefaultDeadlines(), at(0))
	short.failed(at(20))
	wantTimes(t, "a short TTL", []time.Time{short.due()}, []time.Time{at(30)})
}

func TestALeaseKnownToHaveEndedIsSafeNoLonger(t *testing.T) {
	s := newSchedule(900*time.Millisecond, DefaultDeadlines(), at(0))
	s.end(at(400)) // the server said so, to a renewal sent at 400 ms
	wantTimes(t, "ended", []time.Time{s.safeUntil}, []time.Time{at(400)})
	s.end(at(700))                           // never moves later
	s.renewed(at(500), 900*time.Millisecond) // a confirmation after the end counts for nothing
	wantTimes(t, "after the end", []time.Time{s.safeUntil, s.renewBy}, []time.Time{at(400), at(600)})
	if got := s.safeFor(at(400)); got != 0 {
		t.Fatalf("safe for %v once ended", got)
	}
}

func TestTheDeadlinesFollowTheSettingsAndRefuseWhatCannotHold(t *testing.T) {
	s := newSchedule(time.Second, Deadlines{RenewDeadline: 0.5, ClockDrift: 0.1}, at(0))
	wantTimes(t, "0.5 and 10 %", []time.Time{s.renewBy, s.safeUntil}, []time.Time{at(500), at(900)})
	if d := DefaultDeadlines(); d.RenewDeadline != 2.0/3.0 || d.ClockDrift != 0.01 {
		t.Fatalf("%+v", d)
	}
	for _, d := range []Deadlines{
		{RenewDeadline: 1.0 / 3.0, ClockDrift: 0.01}, // no renewal would ever be tried
		{RenewDeadline: 0.2},
		{RenewDeadline: 1, ClockDrift: 0.01}, // the client would give up after the safe deadline
		{RenewDeadline: 0.7, ClockDrift: 0.6},
		{RenewDeadline: 0.7, ClockDrift: -0.1},
		{RenewDeadline: math.NaN(), ClockDrift: 0.01},
		{RenewDeadline: 0.7, ClockDrift: math.NaN()},
		{}, // the zero value: no renewal deadline at all
	} {
		var api *APIError
		_, err := NewClient([]string{"http://127.0.0.1:1"}, WithDeadlines(d))
		if !errors.As(err, &api) || api.Code != "bad_request" || api.Status != 0 || !strings.Contains(api.Message, "Deadlines.") {
			t.Fatalf("%+v: %#v", d, err)
		}
		// New never fails: every call of the client answers the refusal.
		if _, err := New("http://127.0.0.1:1", WithDeadlines(d)).Acquire(context.Background(), "x", AcquireOptions{TTL: time.Second}); err == nil || err.Error() != api.Error() {
			t.Fatalf("%+v through New: %v", d, err)
		}
	}
	for _, d := range []Deadlines{DefaultDeadlines(), {RenewDeadline: 0.99, ClockDrift: 0.01}, {RenewDeadline: 0.5}, {RenewDeadline: 0.5, ClockDrift: 0.5}} {
		if _, err := NewClient([]string{"http://127.0.0.1:1"}, WithDeadlines(d)); err != nil {
			t.Fatalf("%+v: %v", d, err)
		}
	}
}

// guardOf is a Guard on a life renewed by renew (no server), granted ttl at sent.
func guardOf(ttl time.Duration, d Deadlines, sent time.Time, renew func(context.Context) (time.Duration, error)) *Guard {
	l := startLife(`lease l on lock "x"`, "lease_expired", ttl, d, sent, renew)
	return &Guard{&Held{Lease: &Lease{LeaseID: "l", Lock: "x"}, life: l, own: true}}
}

// waitLost waits (five seconds at most) for g to be lost, and answers when it saw it.
func waitLost(t *testing.T, g *Guard) time.Time {
	t.Helper()
	select {
	case <-g.Lost():
		return time.Now()
	case <-time.After(5 * time.Second):
		t.Fatal("never lost")
	}
	return time.Time{}
}

// A renewal that never answers is abandoned at the renewal deadline, and the lease given
// up then, while SafeUntil keeps the last confirmed send's TTL less the drift: what still
// runs may go on until then. Releasing the guard ends it at once.
func TestAHangingRenewalIsGivenUpAtTheRenewalDeadline(t *testing.T) {
	ttl, sent := 300*time.Millisecond, time.Now()
	g := guardOf(ttl, DefaultDeadlines(), sent, func(ctx context.Context) (time.Duration, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	})
	if !g.RenewDeadline().Equal(sent.Add(200*time.Millisecond)) || !g.SafeUntil().Equal(sent.Add(297*time.Millisecond)) {
		t.Fatalf("renewal deadline +%v, safe until +%v", g.RenewDeadline().Sub(sent), g.SafeUntil().Sub(sent))
	}
	lostAt := waitLost(t, g)
	if lostAt.Before(g.RenewDeadline()) {
		t.Fatalf("given up %v before the renewal deadline", g.RenewDeadline().Sub(lostAt))
	}
	var api *APIError
	if !errors.As(g.Err(), &api) || api.Code != "lease_expired" || api.Status != 0 ||
		!strings.Contains(api.Message, givenUpReason) || !strings.Contains(api.Message, "deadline exceeded") {
		t.Fatalf("%#v", g.Err())
	}
	// Giving up does not move the safe deadline.
	if !g.SafeUntil().Equal(sent.Add(297 * time.Millisecond)) {
		t.Fatalf("safe until +%v after giving up", g.SafeUntil().Sub(sent))
	}
	if got := g.SafeFor(); got > 97*time.Millisecond {
		t.Fatalf("safe for %v after the renewal deadline", got)
	}
	g.life.halt() // what Release does before it asks the server
	if g.SafeFor() != 0 || g.SafeUntil().After(time.Now()) {
		t.Fatalf("after the release: safe for %v, until +%v", g.SafeFor(), g.SafeUntil().Sub(sent))
	}
}

// A renewal answered lease_expired loses the lease at once, and it is safe no longer
// from that renewal's send on; confirmed renewals before it moved both deadlines.
func TestARenewalAnsweredLeaseExpiredIsSafeNoLonger(t *testing.T) {
	ttl, sent := 300*time.Millisecond, time.Now()
	renewals := 0
	g := guardOf(ttl, DefaultDeadlines(), sent, func(context.Context) (time.Duration, error) {
		renewals++ // only the renewal goroutine calls it
		if renewals == 1 {
			return ttl, nil
		}
		return 0, &APIError{Status: 404, Code: "lease_expired", Message: "gone"}
	})
	lostAt := waitLost(t, g)
	// The second renewal was sent at least two thirds of the TTL after the acquisition.
	if g.SafeFor() != 0 || g.SafeUntil().After(lostAt) || g.SafeUntil().Before(sent.Add(200*time.Millisecond)) {
		t.Fatalf("safe for %v, until +%v, lost at +%v", g.SafeFor(), g.SafeUntil().Sub(sent), lostAt.Sub(sent))
	}
	// The first renewal, sent at a third of the TTL or later, moved the renewal deadline.
	if g.RenewDeadline().Before(sent.Add(300 * time.Millisecond)) {
		t.Fatalf("renewal deadline +%v", g.RenewDeadline().Sub(sent))
	}
	if !IsLost(g.Err()) || g.Context().Err() == nil {
		t.Fatalf("%#v", g.Err())
	}
	g.life.halt()
}
