// Sessions: one keepalive for many locks (docs/api.md, "Sessions"). The raw calls
// (create, keepalive, read, close), and a SessionGuard that renews a session in the
// background as a Guard renews a lease, with the locks acquired in it.

package palisade

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// Session is a session as the server answers it: its live leases (for a close, the ones
// the close released).
type Session struct {
	SessionID   string         `json:"session_id"`
	Holder      string         `json:"holder"`
	TTLMs       uint64         `json:"ttl_ms"`
	RemainingMs uint64         `json:"remaining_ms"`
	Leases      []SessionLease `json:"leases"`
}

// SessionLease is a lease of a session.
type SessionLease struct {
	LeaseID string `json:"lease_id"`
	Lock    string `json:"lock"`
	Epoch   uint64 `json:"epoch"`
}

// SessionOptions are the settings of a new session.
type SessionOptions struct {
	// Holder names who holds it (as for a lease; empty: <hostname>/<pid> without
	// credentials, the principal with them).
	Holder string
	// TTL is how long the session, and every lease in it, lives without a keepalive
	// (at least 50 ms).
	TTL time.Duration
}

var sessionFields = []string{"session_id", "holder", "ttl_ms", "remaining_ms", "leases"}

// sessionRoute sends method to session id's route (suffix after the id; each is safe to
// resend) and reads the session it answers.
func (c *Client) sessionRoute(ctx context.Context, method, id, suffix string) (*Session, error) {
	name, err := segment("session id", id)
	if err != nil {
		return nil, err
	}
	k, err := c.jsonCall(method, "/v1/sessions/"+name+suffix, nil, retrySafe)
	if err != nil {
		return nil, err
	}
	return into[Session](ctx, c, k, sessionFields...)
}

// CreateSession creates a session (POST /v1/sessions) without renewing it: keep it alive
// with KeepAliveSession, or use HoldSession. Like an acquisition, a creation whose answer
// was lost is not resent (it would make a second session).
func (c *Client) CreateSession(ctx context.Context, opts SessionOptions) (*Session, error) {
	if opts.TTL < 50*time.Millisecond {
		return nil, badRequest("TTL must be at least 50 ms, not %v", opts.TTL)
	}
	body := map[string]any{"ttl_ms": opts.TTL.Milliseconds()}
	if holder := c.holderFor(opts.Holder); holder != "" {
		body["holder"] = holder
	}
	k, err := c.jsonCall(http.MethodPost, "/v1/sessions", body, retryUnlessUnknown)
	if err != nil {
		return nil, err
	}
	return into[Session](ctx, c, k, sessionFields...)
}

// KeepAliveSession renews a session and every lease in it for a full TTL from now;
// *APIError session_expired once it expired or was closed.
func (c *Client) KeepAliveSession(ctx context.Context, sessionID string) (*Session, error) {
	return c.sessionRoute(ctx, http.MethodPost, sessionID, "/keepalive")
}

// SessionInfo reads a live session and its leases (GET /v1/sessions/{id}).
func (c *Client) SessionInfo(ctx context.Context, sessionID string) (*Session, error) {
	return c.sessionRoute(ctx, http.MethodGet, sessionID, "")
}

// CloseSession ends a session: every lease in it is released at once, without
// lock-delay. It answers the session with the leases it released.
func (c *Client) CloseSession(ctx context.Context, sessionID string) (*Session, error) {
	return c.sessionRoute(ctx, http.MethodPost, sessionID, "/close")
}

// SessionGuard holds a session and renews it in the background, every third of its TTL
// (the schedule of a Guard), until Close or until it is lost: the server answers
// session_expired, or no renewal succeeded before its renewal deadline and the client
// gave it up. Then every lock in it is gone at once, Lost is closed and Context
// cancelled. Its SafeUntil, SafeFor and RenewDeadline are those of every lock in it.
type SessionGuard struct {
	// Session is the session as created.
	Session *Session
	client  *Client
	life    *life
}

// HoldSession creates a session and starts renewing it.
func (c *Client) HoldSession(ctx context.Context, opts SessionOptions) (*SessionGuard, error) {
	sent := time.Now()
	s, err := c.CreateSession(ctx, opts)
	if err != nil {
		return nil, err
	}
	id := s.SessionID
	life := startLife("session "+id, "session_expired", time.Duration(s.TTLMs)*time.Millisecond, c.deadlines, sent,
		func(ctx context.Context) (time.Duration, error) {
			info, err := c.KeepAliveSession(ctx, id)
			if err != nil {
				return 0, err
			}
			return time.Duration(info.TTLMs) * time.Millisecond, nil
		})
	return &SessionGuard{Session: s, client: c, life: life}, nil
}

// Lost is closed when the session is lost, with every lock in it.
func (s *SessionGuard) Lost() <-chan struct{} { return s.life.lost }

// Err is why the session was lost (nil while it is held).
func (s *SessionGuard) Err() error { return s.life.Err() }

// Context is cancelled when the session is lost (context.Cause is then Err) or closed
// (ErrReleased).
func (s *SessionGuard) Context() context.Context { return s.life.ctx }

// SafeUntil is until when the session's holder may act, with every lock in it: the time
// the last keepalive the server confirmed was sent (at first, the creation's send) plus
// the session's TTL less the clock-drift margin (Deadlines.ClockDrift). It never moves
// later than a confirmed keepalive allows; it moves to the moment the session is known to
// have ended when the server answers session_expired (at the send of that keepalive) or
// the guard closes it. After the client gave the session up at RenewDeadline it still
// says how long what already runs may go on. It keeps its monotonic clock reading.
//
// What it does not promise: the deadlines narrow the window in which an old holder can
// still act, they do not close it (a pause after checking SafeFor, a request in flight,
// clocks drifting apart faster than ClockDrift); only the token, checked at the resource,
// closes it (docs/guarantees.md). A lock released, or fenced off, alone does not move it.
func (s *SessionGuard) SafeUntil() time.Time { return s.life.safeUntil() }

// SafeFor is how long from now the session's holder may still act: 0 once SafeUntil has
// passed.
func (s *SessionGuard) SafeFor() time.Duration { return s.life.safeFor() }

// RenewDeadline is when the client gives the session up unless a keepalive succeeds
// first: the last confirmed keepalive's send plus Deadlines.RenewDeadline of the TTL.
func (s *SessionGuard) RenewDeadline() time.Time { return s.life.renewDeadline() }

// SessionLock is a lock held in a session: renewed by the session, ended with it. Its
// Held gives the Lease and the calls through it (Put, Delete, Fence, Proclaim, Check);
// its Lost, Err and Context are the session's, and so are its deadlines (Session's
// SafeUntil, SafeFor and RenewDeadline). A stale write through it, or its Release,
// ends only this lock (calls through it are refused from then on).
type SessionLock struct {
	*Held
	Session *SessionGuard
}

// Acquire takes lock inside the session (opts.TTL and opts.Session stay zero: the
// session's apply). Without a holder and without credentials, the session's holder is
// sent.
func (s *SessionGuard) Acquire(ctx context.Context, lock string, opts AcquireOptions) (*SessionLock, error) {
	if err := s.life.alive(); err != nil {
		return nil, err
	}
	if opts.Session != "" && opts.Session != s.Session.SessionID {
		return nil, badRequest("a session guard acquires in its own session")
	}
	opts.Session = s.Session.SessionID
	if opts.Holder == "" && !s.client.authenticated() {
		opts.Holder = s.Session.Holder
	}
	lease, err := s.client.Acquire(ctx, lock, opts)
	if err != nil {
		return nil, err
	}
	return &SessionLock{Held: &Held{Lease: lease, client: s.client, life: s.life}, Session: s}, nil
}

// Info reads the session's live locks, as the server sees them now.
func (s *SessionGuard) Info(ctx context.Context) (*Session, error) {
	return s.client.SessionInfo(ctx, s.Session.SessionID)
}

// Close stops the renewals, cancels Context (cause ErrReleased), ends SafeUntil at once
// and closes the session: every lock in it is released at once (no lock-delay). It
// answers the released locks.
func (s *SessionGuard) Close(ctx context.Context) (*Session, error) {
	s.life.halt()
	return s.client.CloseSession(ctx, s.Session.SessionID)
}

// Release releases this lock alone; the session and its other locks go on. Calls
// through the lock are refused from then on.
func (l *SessionLock) Release(ctx context.Context) error {
	err := l.client.Release(ctx, l.Lease.LeaseID)
	l.mu.Lock()
	l.gone = &APIError{Code: "lease_expired", Message: fmt.Sprintf("lease %s on lock %q was released", l.Lease.LeaseID, l.Lease.Lock)}
	l.mu.Unlock()
	return err
}
