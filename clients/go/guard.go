// Guards: a lease held by this process and renewed in the background (Hold), and what a
// held lease does through its client (write, fence, proclaim, check) after making sure
// it is not known or presumed lost.

package palisade

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Held is a lease this process holds: a Guard's own, or a lock in a session
// (SessionLock). Every call through it is refused before anything is sent once the lease
// is known or presumed lost, or was released: an *APIError lease_expired (or
// session_expired) with Status 0 (IsLost). Not being refused is no permission to write:
// the process can pause right after; only the resource's answer counts.
type Held struct {
	// Lease is the lease as granted: its lock, epoch, token and id.
	Lease  *Lease
	client *Client
	life   *life
	// own: a stale write ends the life itself (a Guard's lease); in a session only
	// this lock is marked.
	own  bool
	mu   sync.Mutex
	gone error
	seq  uint64
}

// NextSeq answers 1, 2, 3, ...: sequence numbers for this lease's writes to a namespace
// with the sequence policy, where (epoch, seq) must strictly increase (pass Seq(n)).
func (h *Held) NextSeq() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	return h.seq
}

// Lost is closed when the lease is lost: a renewal was refused (lease_expired), a write
// through it was refused as stale (a newer epoch exists), or no renewal succeeded before
// its renewal deadline and the client gave it up. For a lock in a session: when the
// session is lost.
func (h *Held) Lost() <-chan struct{} { return h.life.lost }

// Err is why the lease was lost (nil while it is held): the server's lease_expired or
// session_expired, the *StaleTokenError of a write, or a local lease_expired saying no
// renewal succeeded in time.
func (h *Held) Err() error { return h.life.Err() }

// Context is cancelled when the lease is lost (context.Cause is then Err) or released
// (context.Cause is ErrReleased); for a lock in a session, when the session is lost or
// closed. Give it to the work the lease guards. It does not derive from the context given
// to Hold, which bounds the acquisition only.
func (h *Held) Context() context.Context { return h.life.ctx }

func (h *Held) check() error {
	h.mu.Lock()
	gone := h.gone
	h.mu.Unlock()
	if gone != nil {
		return gone
	}
	return h.life.alive()
}

// fenced notes a stale refusal: a newer epoch exists, so this lease is over.
func (h *Held) fenced(err error) {
	var stale *StaleTokenError
	if !errors.As(err, &stale) {
		return
	}
	if h.own {
		// Over at the server since a newer epoch wrote: safe no longer from now on.
		h.life.lose(err, time.Now())
		return
	}
	h.mu.Lock()
	h.gone = &APIError{Code: "lease_expired", Message: fmt.Sprintf("lease %s on lock %q was fenced off: %v", h.Lease.LeaseID, h.Lease.Lock, err)}
	h.mu.Unlock()
}

// Put writes key in the lease's lock's namespace with its token (Client.Put).
func (h *Held) Put(ctx context.Context, key string, value []byte, opts ...WriteOption) (*Written, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	w, err := h.client.Put(ctx, h.Lease.Lock, key, value, h.Lease.Token, opts...)
	h.fenced(err)
	return w, err
}

// Delete removes key from the lease's lock's namespace with its token (Client.Delete).
func (h *Held) Delete(ctx context.Context, key string, opts ...WriteOption) (*Written, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	w, err := h.client.Delete(ctx, h.Lease.Lock, key, h.Lease.Token, opts...)
	h.fenced(err)
	return w, err
}

// Fence is the barrier on the lease's lock's namespace (Client.Fence): every older
// holder is refused from its answer on. Call it before acting.
func (h *Held) Fence(ctx context.Context, opts ...WriteOption) (*Fenced, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	f, err := h.client.Fence(ctx, h.Lease.Lock, h.Lease.Token, opts...)
	h.fenced(err)
	return f, err
}

// Proclaim replaces what the lease advertises (nil clears it); its epoch and deadline do
// not change.
func (h *Held) Proclaim(ctx context.Context, value []byte) (*Proclaimed, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	return h.client.Proclaim(ctx, h.Lease.LeaseID, value)
}

// Check is the issuer's view of the lease's token (Client.CheckToken): a snapshot.
func (h *Held) Check(ctx context.Context) (*TokenCheck, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	return h.client.CheckToken(ctx, h.Lease.Token)
}

// Guard holds a lease and renews it in the background, every third of its TTL (a failed
// renewal retried every tenth), until Release, or until it is lost (Lost is closed,
// Context cancelled). Its Held gives the Lease and the calls through it (Lost, Err,
// Context, Put, Delete, Fence, Proclaim, Check); SafeUntil, SafeFor and RenewDeadline
// say until when the holder may act and when the client gives the lease up (Deadlines).
// A guard does not stop the work it protects by itself: give that work Context, and let
// the resource's gate refuse the late writes fencing exists for.
type Guard struct {
	*Held
}

// Hold acquires lock and starts renewing it. The lease's deadlines (SafeUntil,
// RenewDeadline) count from before the acquisition was sent; one that waited in line
// longer than a third of its TTL is renewed once before Hold returns, so its deadlines
// count from that renewal.
func (c *Client) Hold(ctx context.Context, lock string, opts AcquireOptions) (*Guard, error) {
	if opts.Session != "" {
		return nil, badRequest("a lock in a session is renewed by its session: use SessionGuard.Acquire")
	}
	sent := time.Now()
	lease, err := c.Acquire(ctx, lock, opts)
	if err != nil {
		return nil, err
	}
	ttl := time.Duration(lease.TTLMs) * time.Millisecond
	if time.Since(sent) > ttl/3 {
		renewedAt := time.Now()
		info, err := c.KeepAlive(ctx, lease.LeaseID)
		if err != nil {
			return nil, err
		}
		sent, ttl = renewedAt, min(ttl, time.Duration(info.TTLMs)*time.Millisecond)
	}
	held := &Held{Lease: lease, client: c, own: true}
	id := lease.LeaseID
	held.life = startLife(fmt.Sprintf("lease %s on lock %q", id, lease.Lock), "lease_expired", ttl, c.deadlines, sent,
		func(ctx context.Context) (time.Duration, error) {
			info, err := c.KeepAlive(ctx, id)
			if err != nil {
				return 0, err
			}
			return time.Duration(info.TTLMs) * time.Millisecond, nil
		})
	return &Guard{held}, nil
}

// Release stops the renewals, cancels Context (cause ErrReleased), ends SafeUntil at once
// and releases the lease: the next in line gets the lock at once. It asks the server even
// after a loss (a lease presumed lost may still be live there); *APIError lease_expired
// when it had ended.
func (g *Guard) Release(ctx context.Context) error {
	g.life.halt()
	return g.client.Release(ctx, g.Lease.LeaseID)
}

// SafeUntil is until when the holder may act: the time the last renewal the server
// confirmed was sent (at first, the acquisition's send) plus the TTL granted with it less
// the clock-drift margin (Deadlines.ClockDrift). As long as this host's clock runs no more
// than ClockDrift slower than the server's, the lease is alive at the server until then.
// It never moves later than a confirmed renewal allows; it moves to the moment the lease
// is known to have ended when the server says so (at the send of the renewal it
// answered), a write through the guard is refused as stale, or the guard is released.
// After the client gave the lease up at RenewDeadline it still says how long what already
// runs may go on. It keeps its monotonic clock reading: compare it with time.Now().
//
// What it does not promise: the deadlines narrow the window in which an old holder can
// still act, they do not close it. A process that pauses after checking SafeFor, a
// request already on its way, or clocks that drift apart faster than ClockDrift still
// reach the resource after the lease ended; only the token, checked at the resource,
// closes the window (docs/guarantees.md).
func (g *Guard) SafeUntil() time.Time { return g.life.safeUntil() }

// SafeFor is how long from now the holder may still act (SafeUntil less now): 0 once
// SafeUntil has passed. A positive answer is no permission to write after a pause: see
// SafeUntil.
func (g *Guard) SafeFor() time.Duration { return g.life.safeFor() }

// RenewDeadline is when the client gives the lease up unless a renewal succeeds first:
// the time the last renewal the server confirmed was sent plus Deadlines.RenewDeadline of
// the TTL granted with it (2/3 by default), as Kubernetes' leader election does at its
// renewDeadline. Then Lost is closed and Context cancelled, even if a renewal request is
// still in flight (none may take longer than this), and the holder has until SafeUntil to
// stop.
func (g *Guard) RenewDeadline() time.Time { return g.life.renewDeadline() }
