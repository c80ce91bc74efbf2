// Leader election on one lock (docs/election.md; the semantics of the Python client's
// _election.py). The election is the lock named after it: a candidate campaigns by
// acquiring it with its value (what it advertises, its address say), waiting in the
// server's first-come first-served line; the holder leads, its lease's epoch is its term
// and its fencing token; lock status shows who leads, with which value and epoch.
// Resigning releases the lock and the next candidate in line leads at once.
//
// Winning notifies no resource: a new leader fences (Leader.Fence, or an admit through
// each gate it writes) before it acts. Observers read the lock's status again at each
// grant, release, expiry or reset on the lock's events stream, and every poll interval
// in any case (a proclaimed value is no event; a server whose stream is unavailable sends
// none); a leadership that came and went between two reads is not answered (the epochs
// show the gap).

package palisade

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"
)

// ElectionOptions are the settings of an election.
type ElectionOptions struct {
	// TTL is the leader's lease TTL (10 s when zero): a crashed leader is replaced after
	// at most one TTL (plus its lock-delay).
	TTL time.Duration
	// LockDelay is the leader's lease lock-delay (AcquireOptions.LockDelay).
	LockDelay time.Duration
	// PollInterval is how often an observer reads the status whatever the events stream
	// says (500 ms when zero).
	PollInterval time.Duration
	// NoEvents makes observers poll only, without the lock's events stream.
	NoEvents bool
}

// Election is an election on the lock Name: candidates campaign, observers watch.
type Election struct {
	Name   string
	client *Client
	opts   ElectionOptions
}

// Election is the election on lock name.
func (c *Client) Election(name string, opts ElectionOptions) *Election {
	if opts.TTL == 0 {
		opts.TTL = 10 * time.Second
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 500 * time.Millisecond
	}
	return &Election{Name: name, client: c, opts: opts}
}

// LeaderInfo is who leads: the holder, its term (its lease's epoch, also its fencing
// token's) and what it advertises.
type LeaderInfo struct {
	Holder string
	Epoch  uint64
	Value  []byte
}

func leaderOf(status *LockStatus) *LeaderInfo {
	if status.Holder == nil {
		return nil
	}
	epoch := status.Epoch
	if status.LeaseEpoch != nil {
		epoch = *status.LeaseEpoch
	}
	return &LeaderInfo{Holder: *status.Holder, Epoch: epoch, Value: status.Value}
}

func sameLeader(a, b *LeaderInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Holder == b.Holder && a.Epoch == b.Epoch && bytes.Equal(a.Value, b.Value) && (a.Value == nil) == (b.Value == nil)
}

// Leader is this candidate leading: a Guard on the election's lock, renewed in the
// background. Its Lease's Epoch is the term and its Token the only way to write as the
// leader; Fence is the barrier on the namespace named after the election; Context is
// cancelled when leadership is lost or resigned.
type Leader struct {
	*Guard
}

// Resign steps down (releases the lock): the next candidate in line leads at once.
func (l *Leader) Resign(ctx context.Context) error { return l.Release(ctx) }

// campaignMargin: a wait in line ends this long before the campaign's deadline, so that
// the server's lock_held arrives before the context ends the request.
const campaignMargin = time.Second

// Campaign waits in line until candidate leads, advertising value, in rounds of at most
// 300 s. With a deadline on ctx, the last round ends a second before it and Campaign
// answers the *LockHeldError. Other errors are answered as they come: an acquisition
// whose answer was lost is not resent, and a ctx cancelled while waiting abandons the
// request (a lease granted at that moment ends after its TTL).
func (e *Election) Campaign(ctx context.Context, candidate string, value []byte) (*Leader, error) {
	for {
		wait := MaxWait
		deadline, bounded := ctx.Deadline()
		if bounded {
			wait = min(wait, time.Until(deadline)-campaignMargin)
			wait = max(wait, 0).Truncate(time.Millisecond)
		}
		guard, err := e.client.Hold(ctx, e.Name, AcquireOptions{
			Holder: candidate, TTL: e.opts.TTL, Wait: wait, Value: value, LockDelay: e.opts.LockDelay,
		})
		if err == nil {
			return &Leader{guard}, nil
		}
		var held *LockHeldError
		if !errors.As(err, &held) || ctx.Err() != nil || (bounded && time.Until(deadline) <= campaignMargin) {
			return nil, err
		}
	}
}

// Leader answers who leads now (nil: nobody).
func (e *Election) Leader(ctx context.Context) (*LeaderInfo, error) {
	status, err := e.client.LockStatus(ctx, e.Name)
	if err != nil {
		return nil, err
	}
	return leaderOf(status), nil
}

// Observer watches an election: Changed answers each new leadership. Use it from one
// goroutine at a time; Close it to end its events stream.
type Observer struct {
	election *Election
	wake     chan struct{}
	mu       sync.Mutex
	stream   *EventStream
	closed   bool
	seen     *LeaderInfo
	seenOnce bool
	reading  sync.WaitGroup
}

// Observe is an observer of the election's leadership changes.
func (e *Election) Observe() *Observer {
	return &Observer{election: e, wake: make(chan struct{}, 1)}
}

func (o *Observer) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// start opens the lock's events stream on a goroutine: each grant, release, expiry or
// reset on it (and each connection) makes the observer read the status at once.
func (o *Observer) start() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stream != nil || o.closed || o.election.opts.NoEvents {
		return
	}
	o.stream = o.election.client.Watch(o.election.Name)
	o.stream.onConnect = o.signal
	stream := o.stream
	o.reading.Add(1)
	go func() {
		defer o.reading.Done()
		for {
			event, err := stream.Next(context.Background())
			if err != nil {
				// Closed, or refused for good (a server without events, a key that may
				// not read the lock): the observer polls.
				return
			}
			switch event.(type) {
			case *FencedEvent, *RejectedEvent:
			default:
				o.signal()
			}
		}
	}()
}

// Streaming says whether the events stream is open now (false while the observer only
// polls).
func (o *Observer) Streaming() bool {
	o.mu.Lock()
	stream := o.stream
	o.mu.Unlock()
	return stream != nil && stream.Streaming()
}

// Changed answers the leadership now at the first call (nil: nobody leads); after that,
// it waits until the leadership differs from what it answered last (another leader,
// epoch or value, or nobody) and answers it. A status read's error is answered; the
// stream's are not (the observer polls until it is back).
func (o *Observer) Changed(ctx context.Context) (*LeaderInfo, error) {
	o.start()
	for {
		// Drained before the read: anything the stream reports after it wakes us.
		select {
		case <-o.wake:
		default:
		}
		now, err := o.election.Leader(ctx)
		if err != nil {
			return nil, err
		}
		if !o.seenOnce || !sameLeader(now, o.seen) {
			o.seen, o.seenOnce = now, true
			return now, nil
		}
		timer := time.NewTimer(o.election.opts.PollInterval)
		select {
		case <-o.wake:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
		timer.Stop()
	}
}

// Close ends the events stream (its goroutine ends with it).
func (o *Observer) Close() error {
	o.mu.Lock()
	o.closed = true
	stream := o.stream
	o.mu.Unlock()
	if stream != nil {
		stream.Close()
	}
	o.reading.Wait()
	return nil
}
