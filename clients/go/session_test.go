// Tests of sessions against a real server: a session guard, its loss, the raw calls.

package palisade

import (
	"context"
	"errors"
	"sort"
	"testing"
	"time"
)

// A session guard keeps every lock in it past several TTLs with one keepalive, and its
// close releases them all at once (no lock-delay), cancelling its context with
// ErrReleased.
func TestASessionHoldsManyLocksWithOneKeepalive(t *testing.T) {
	c, ctx := server(t), context.Background()
	ttl := 600 * time.Millisecond
	session, err := c.HoldSession(ctx, SessionOptions{Holder: "worker", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	a, err := session.Acquire(ctx, "a", AcquireOptions{LockDelay: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b, err := session.Acquire(ctx, "b", AcquireOptions{Value: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if a.Lease.Session != session.Session.SessionID || a.Lease.Holder != "worker" || a.Lease.TTLMs != uint64(ttl.Milliseconds()) {
		t.Fatalf("%+v", a.Lease)
	}
	if _, err := a.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(4 * ttl)
	for time.Now().Before(deadline) {
		for _, lock := range []string{"a", "b"} {
			status, err := c.LockStatus(ctx, lock)
			if err != nil || status.Holder == nil || status.Session == nil || *status.Session != session.Session.SessionID {
				t.Fatalf("%s: %+v %v", lock, status, err)
			}
		}
		time.Sleep(ttl / 4)
	}
	info, err := session.Info(ctx)
	if err != nil || len(info.Leases) != 2 {
		t.Fatalf("%+v %v", info, err)
	}
	// Renewed: both deadlines count from a keepalive's send, not from the creation.
	if ahead := time.Until(session.RenewDeadline()); ahead <= 0 || ahead > ttl*2/3 || session.SafeFor() <= ahead {
		t.Fatalf("renewal deadline in %v, safe for %v", ahead, session.SafeFor())
	}
	work := session.Context()
	closed, err := session.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var released []string
	for _, lease := range closed.Leases {
		released = append(released, lease.Lock)
	}
	sort.Strings(released)
	if len(released) != 2 || released[0] != "a" || released[1] != "b" {
		t.Fatalf("released %v", released)
	}
	if !errors.Is(context.Cause(work), ErrReleased) {
		t.Fatalf("cause %v", context.Cause(work))
	}
	if session.SafeFor() != 0 || session.SafeUntil().After(time.Now()) {
		t.Fatalf("a closed session is safe for %v", session.SafeFor())
	}
	// Free at once, though lock a chose a lock-delay: a close has none.
	for _, lock := range []string{"a", "b"} {
		if _, err := c.Acquire(ctx, lock, AcquireOptions{Holder: "next", TTL: time.Second}); err != nil {
			t.Fatalf("%s after the close: %v", lock, err)
		}
	}
	if _, err := b.Put(ctx, "k", []byte("v")); !IsLost(err) {
		t.Fatalf("a put through a closed session's lock: %#v", err)
	}
}

// A session ended behind the guard's back is lost: Lost closes, Err is the server's
// session_expired, the context is cancelled with it, the holder is safe no longer, its
// locks are free, and calls through them are refused before anything is sent.
func TestALostSessionCancelsItsContext(t *testing.T) {
	c, ctx := server(t), context.Background()
	session, err := c.HoldSession(ctx, SessionOptions{Holder: "worker", TTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	lock, err := session.Acquire(ctx, "a", AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CloseSession(ctx, session.Session.SessionID); err != nil {
		t.Fatal(err)
	}
	awaitLoss(t, session.Lost(), session.Err, "session_expired")
	if session.SafeFor() != 0 || session.SafeUntil().After(time.Now()) {
		t.Fatalf("a session over at the server is safe for %v", session.SafeFor())
	}
	if lock.Context().Err() == nil || context.Cause(lock.Context()) != session.Err() || lock.Err() != session.Err() {
		t.Fatalf("the lock's context: %v", context.Cause(lock.Context()))
	}
	var api *APIError
	if _, err := lock.Put(ctx, "k", []byte("v")); !errors.As(err, &api) || api.Code != "session_expired" || api.Status != 0 {
		t.Fatalf("%#v", err)
	}
	if _, err := session.Acquire(ctx, "b", AcquireOptions{}); !IsLost(err) {
		t.Fatalf("acquiring in a lost session: %#v", err)
	}
	status, err := c.LockStatus(ctx, "a")
	if err != nil || status.Holder != nil {
		t.Fatalf("%+v %v", status, err)
	}
}

// The raw calls: create, acquire with Session, keepalive, read, release one lock (the
// session goes on), close; a closed session answers session_expired.
func TestTheSessionCalls(t *testing.T) {
	c, ctx := server(t), context.Background()
	s, err := c.CreateSession(ctx, SessionOptions{Holder: "w", TTL: 5 * time.Second})
	if err != nil || s.SessionID == "" || s.Holder != "w" || s.TTLMs != 5000 || len(s.Leases) != 0 {
		t.Fatalf("%+v %v", s, err)
	}
	var api *APIError
	if _, err := c.Acquire(ctx, "a", AcquireOptions{Holder: "w", Session: s.SessionID, TTL: time.Second}); !errors.As(err, &api) || api.Code != "bad_request" {
		t.Fatalf("a TTL in a session: %#v", err)
	}
	a, err := c.Acquire(ctx, "a", AcquireOptions{Holder: "w", Session: s.SessionID})
	if err != nil || a.Session != s.SessionID {
		t.Fatalf("%+v %v", a, err)
	}
	b, err := c.Acquire(ctx, "b", AcquireOptions{Holder: "w", Session: s.SessionID})
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := c.KeepAliveSession(ctx, s.SessionID)
	if err != nil || len(renewed.Leases) != 2 || renewed.RemainingMs < 4000 {
		t.Fatalf("%+v %v", renewed, err)
	}
	if err := c.Release(ctx, a.LeaseID); err != nil {
		t.Fatal(err)
	}
	info, err := c.SessionInfo(ctx, s.SessionID)
	if err != nil || len(info.Leases) != 1 || info.Leases[0].LeaseID != b.LeaseID || info.Leases[0].Epoch != b.Epoch {
		t.Fatalf("%+v %v", info, err)
	}
	closed, err := c.CloseSession(ctx, s.SessionID)
	if err != nil || len(closed.Leases) != 1 || closed.Leases[0].Lock != "b" {
		t.Fatalf("%+v %v", closed, err)
	}
	if _, err := c.SessionInfo(ctx, s.SessionID); !errors.As(err, &api) || api.Code != "session_expired" || !IsLost(err) {
		t.Fatalf("a closed session: %#v", err)
	}
	if _, err := c.Acquire(ctx, "c", AcquireOptions{Holder: "w", Session: s.SessionID}); !errors.As(err, &api) || api.Code != "session_expired" {
		t.Fatalf("acquiring in a closed session: %#v", err)
	}
	if _, err := c.Hold(ctx, "c", AcquireOptions{Holder: "w", Session: s.SessionID}); !errors.As(err, &api) || api.Code != "bad_request" || api.Status != 0 {
		t.Fatalf("a guard on a session's lease: %#v", err)
	}
}
